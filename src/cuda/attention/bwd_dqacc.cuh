/*
 * bwd_dqacc.cuh - the element order of the fused backward's fp32 dQaccum
 * (bwd->deterministic = 0; one [sq_pad, D] block per (batch, query head)),
 * shared by its writer (bwd_sm90_dkv_dq.cuh) and its reader (the dQ
 * post-pass in bwd_sm80.cu), and the compile-time switch that picks how
 * the writer adds (docs/perf/backward.md, "Fused, measured; why slower").
 *
 * SK_BWD90_DQ_BULK (default 1; -DSK_BWD90_DQ_BULK=0 through NVCC_EXTRA for
 * the A/B):
 *   1  a block is [sq_pad / 64 tiles][D / 64 slabs][4096 floats], the 4096
 *      floats of a 64-row, 64-column tile in the order of a warpgroup's
 *      m64n64 wgmma accumulator: register pair (j, ii) of lane l in warp w
 *      at 2 (32 (2 (8 w + j) + ii) + l). A warpgroup's tile is then one
 *      contiguous 16 KB range (one bulk reduce-add from shared memory: the
 *      128-key, D = 128 form), and a warp's pair is 256 contiguous bytes
 *      (bank-conflict-free shared stores; whole lines for red.global.add).
 *   0  row-major [sq_pad][D], every form adding with red.global.add.v2
 *      (phase 1 as h-bwf built it).
 * Either way, 8 columns 8 c .. 8 c + 7 of a row are 32 contiguous bytes.
 *
 * SK_BWD90_DQ_OWN (default 0; an A/B of the split): at 128-key blocks and
 * D = 128, 1 makes each warpgroup compute its own 64 keys' dQ over all
 * columns (no barrier between the warpgroups a tile, twice the adds)
 * instead of the merged split (bwd_sm90_dkv_dq.cuh).
 */
#ifndef SK_CUDA_ATTENTION_BWD_DQACC_CUH
#define SK_CUDA_ATTENTION_BWD_DQACC_CUH

#include <stdint.h>

#ifndef SK_BWD90_DQ_BULK
#define SK_BWD90_DQ_BULK 1
#endif
#ifndef SK_BWD90_DQ_OWN
#define SK_BWD90_DQ_OWN 0
#endif

/* Float offset, inside a 64 x 64 tile of fragment order, of accumulator
 * pair (j, ii) of lane `lane` in warp `warp` (bwd_sm90_dkv.cu's register
 * map: row 16 warp + lane / 4 + 8 ii, columns 8 j + 2 (lane % 4), + 1). */
__device__ __forceinline__ int sk_bwd_dqacc_pair(int warp, int j, int ii, int lane) {
    return 2 * (32 * (2 * (8 * warp + j) + ii) + lane);
}

/* Float offset of element (row r, column c) inside its query head's block. */
template <int kD>
__device__ __forceinline__ int64_t sk_bwd_dqacc_at(int64_t r, int c) {
#if SK_BWD90_DQ_BULK
    const int rr = (int)(r % 64), cc = c % 64;
    return (r - rr) * kD + (c / 64) * 4096 +
           sk_bwd_dqacc_pair(rr / 16, cc / 8, (rr / 8) % 2, 4 * (rr % 8) + (cc % 8) / 2) + cc % 2;
#else
    return r * kD + c;
#endif
}

#endif /* SK_CUDA_ATTENTION_BWD_DQACC_CUH */
