/*
 * fwd_sm90.cu - the Hopper block-sparse attention forward: TMA, wgmma,
 * warp specialisation, a persistent grid.
 *
 * Algorithm. A CTA of 384 threads (one per SM) runs tiles taken from the
 * plan's schedule (tile = tile_order[atomicAdd(tile_counter, 1)], longest
 * rows first). A tile is 128 query rows of one (batch, query head) and the
 * key blocks of one layout row, each 128 keys wide, or 64 (block_k = 64:
 * the _k64 kernels, the same code with the key block width BN = 64 a
 * compile-time parameter: K / V boxes of 64 rows, S = Q K^T as m64n64k16,
 * P V with k = 64, masks per 64 keys, and twice the K / V stages of half
 * the size, so the bytes in flight stay those of BN = 128). With block_q
 * = 64 a tile is two query blocks 2i, 2i + 1 (the same 128 rows), each
 * consumer warpgroup computing only its own row's blocks out of the union
 * the producer streams (the _pair kernels; fwd_sm90_pair.cuh and
 * fwd_sm90_common.cuh, "Pairs").
 *   - Warpgroup 0 is the producer; it gives registers away (setmaxnreg).
 *     Its warp 1 (the scheduler) takes tiles from the schedule and decodes
 *     them (clamped block range) up to kSchedSlots ahead. Its warp 0 reads
 *     each row's column indices 32 at a time and one elected thread issues
 *     every TMA load: Q (one buffer at D = 128, loaded once both consumers'
 *     last S GEMMs of the previous tile are done; two at D = 64, so the
 *     next tile's Q loads while this tile runs), then K_0, K_1, V_0, K_2,
 *     V_1, ... into two pipelines (K and V: 2 stages each at D = 128, 3 at
 *     D = 64), each stage with a "full" mbarrier (expect_tx = block bytes)
 *     and an "empty" one (arrivals from both consumer warpgroups). The TMA
 *     row coordinate of block c is c * 128; rows past Sq or Sk are
 *     zero-filled. Each K stage carries its block index and whether another
 *     block follows, so the consumers read no layout memory.
 *   - Warpgroups 1 and 2 are consumers of 64 query rows each. Step j issues
 *     S_j = Q K_j^T (wgmma, both operands in shared memory) and
 *     O += P_{j-1} V_{j-1} (wgmma, P from registers), then runs the online
 *     softmax of S_j while the P V GEMM is in flight (FA3's intra-warpgroup
 *     overlap). The two consumers take turns issuing their GEMMs (named
 *     barriers kBarTurn0/1): one warpgroup's softmax overlaps the other's
 *     GEMMs (ping-pong). At D = 128, O is rescaled for the previous block's
 *     max between the two GEMM issues, off the softmax's critical path.
 *   - Softmax is in fp32 and base 2: p = 2^(s * scale * log2(e) - m'), with
 *     the row max m' pre-scaled: one FFMA and one MUFU.EX2 per score. Row
 *     sums stay per thread until the epilogue.
 *   - Epilogue: O / rowsum, converted and written with stmatrix into a
 *     swizzled shared tile of the warpgroup's own, then one thread stores it
 *     with TMA (rows past Sq are clipped by TMA). LSE (natural log) is stored
 *     by the threads holding the rows, bounds-checked.
 *
 * Invariants.
 *   - Producer and consumers walk the same block sequence: positions
 *     [start, end) of the layout row, with the offsets clamped to [0, nnz]
 *     and made non-decreasing, skipping any index outside [0, col_blocks)
 *     and, when causal, any block no query row of the tile can see
 *     (sk90_block_visible). The producer alone reads the layout and hands
 *     the sequence over with the tiles and K stages, so every mbarrier sees
 *     matching arrivals and phases for any layout content; a tile with no
 *     visible block loads nothing and its rows get O = 0, LSE = -inf.
 *   - Rows every key of which is masked keep m = -inf; the exponent then
 *     subtracts 0 instead of -inf, so p = 0, the row sum stays 0, O = 0 and
 *     LSE = -inf, without NaN.
 *   - The masks (causal, key tail) run only on blocks that need them.
 *   - Every issue of a consumer's GEMMs is bracketed by
 *     bar.sync(own turn) / bar.arrive(other's turn). Both consumers issue the
 *     same number of times (same tiles, same blocks), so the turns alternate
 *     strictly; consumer 1 opens with one arrival and consumer 0 closes
 *     with one extra sync, which leaves no barrier half-arrived at exit.
 *   - wgmma sequences are never issued under run-time conditions (ptxas
 *     would serialize them): the first S, the steady steps and the last P V
 *     of a tile are written out.
 *   - Shared memory: kQBufs Q tiles 128 x D, kKStages K and kVStages V
 *     blocks 128 x D, O 128 x D, all in 128B-swizzled 64-column slabs (the
 *     TMA box layout), 1024-B aligned; at D = 128, 1 + 2 + 2 + 1 tiles of
 *     32 KB: 193 KB with the barriers and the alignment slack (227 KB
 *     allowed, static_assert in fwd_sm90_common.cuh).
 *
 * Files: fwd_sm90_common.cuh holds the shapes, the shared layout, the
 * parameters and the helpers (the FP8 kernel, fwd_sm90_fp8.cu, and the
 * varlen / paged kernel, fwd_sm90_varlen.cu, share them);
 * fwd_sm90_body.cuh the kernel body (shared with the varlen / paged
 * kernel, a compile-time mode of the same code); fwd_sm90_producer.cuh and
 * fwd_sm90_consumer.cuh the warpgroups' code; this one the fixed kernel
 * and its host side.
 */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cuda/attention/kernels.h"
#include "cuda/common/cuda_check.cuh"
#include "cuda/common/hopper.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/tensor_map.h"

#include "cuda/attention/fwd_sm90_common.cuh"
#include "cuda/attention/fwd_sm90_body.cuh"

/* The varlen mode's parameters, never read by the fixed kernel. */
static __constant__ sk90_vparams sk90_no_vparams;

template <sk_dtype DT, int HD>
__global__ void __launch_bounds__(kThreads, 1) sk_attention_sm90_kernel(const __grid_constant__ sk90_params p) {
    sk90_kernel_body<DT, HD, kSk90Fixed>(p, sk90_no_vparams);
}

/* The carry-in variant (p->lse_carry): a separate instantiation, so the
 * fixed kernel's code is unchanged. */
template <sk_dtype DT, int HD>
__global__ void __launch_bounds__(kThreads, 1)
    sk_attention_sm90_carry_kernel(const __grid_constant__ sk90_params p,
                                   const __grid_constant__ sk90_vparams v) {
    sk90_kernel_body<DT, HD, kSk90Fixed, true>(p, v);
}

/* Layouts with block_k = 64 (issue 28): the same body with blocks of 64
 * keys (K / V boxes of 64 rows, S as m64n64, P V with k = 64, twice the
 * stages of half the size). Kernels of their own, so that the names and
 * the code of the 128-key kernels above stay as they were. */
template <sk_dtype DT, int HD>
__global__ void __launch_bounds__(kThreads, 1) sk_attention_sm90_k64_kernel(const __grid_constant__ sk90_params p) {
    sk90_kernel_body<DT, HD, kSk90Fixed, false, 64>(p, sk90_no_vparams);
}

template <sk_dtype DT, int HD>
__global__ void __launch_bounds__(kThreads, 1)
    sk_attention_sm90_carry_k64_kernel(const __grid_constant__ sk90_params p,
                                       const __grid_constant__ sk90_vparams v) {
    sk90_kernel_body<DT, HD, kSk90Fixed, true, 64>(p, v);
}

/* Layouts with block_q = 64 (issue 28): a tile is two consecutive 64-row
 * query blocks of one (batch, head), warpgroup h computing block 2i + h
 * over the blocks its row selected (fwd_sm90_pair.cuh); keys in blocks
 * of BN = 128 or 64. No carry-in and no parts (supports()). */
template <sk_dtype DT, int HD, int BN>
__global__ void __launch_bounds__(kThreads, 1) sk_attention_sm90_pair_kernel(const __grid_constant__ sk90_params p) {
    sk90_kernel_body<DT, HD, kSk90Fixed, false, BN, true>(p, sk90_no_vparams);
}

/* ---------------------------------------------------------------------------
 * Host side
 * ------------------------------------------------------------------------- */

int sk_attention_sm90_supports(const sk_attention_problem *p) {
    if (p->dtype != SK_DTYPE_F16 && p->dtype != SK_DTYPE_BF16) return 0;
    if (p->head_dim != 64 && p->head_dim != 128) return 0;
    if (!sk90_blocks_ok(p)) return 0;
    if (!sk90_limits_ok(p, 2, 2)) return 0;
    /* Let the driver judge the geometry, with a placeholder 1024-B aligned address. */
    sk90_params prm;
    const void *dummy = (const void *)(uintptr_t)(1u << 20);
    return sk90_encode_all(&prm, p, dummy, dummy, dummy, dummy) == CUDA_SUCCESS;
}

/* BN: keys per block (the kernel of that block width). */
template <sk_dtype DT, int HD, int BN>
static sk_status sk90_launch(const sk90_params &prm, int grid, cudaStream_t stream) {
    using L = sk90_layout<HD, kSk90Fixed, BN>;
    void (*kernel)(const sk90_params) =
        BN == 64 ? sk_attention_sm90_k64_kernel<DT, HD> : sk_attention_sm90_kernel<DT, HD>;
    SK_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)L::kDynamicBytes),
                "cudaFuncSetAttribute");
    kernel<<<grid, kThreads, L::kDynamicBytes, stream>>>(prm);
    return sk_cuda_status(cudaGetLastError(), "sm90 attention kernel launch");
}

template <sk_dtype DT, int HD, int BN>
static sk_status sk90_launch_carry(const sk90_params &prm, const sk90_vparams &v, int grid,
                                   cudaStream_t stream) {
    using L = sk90_layout<HD, kSk90Fixed, BN>;
    void (*kernel)(const sk90_params, const sk90_vparams) =
        BN == 64 ? sk_attention_sm90_carry_k64_kernel<DT, HD>
                 : sk_attention_sm90_carry_kernel<DT, HD>;
    SK_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)L::kDynamicBytes),
                "cudaFuncSetAttribute");
    kernel<<<grid, kThreads, L::kDynamicBytes, stream>>>(prm, v);
    return sk_cuda_status(cudaGetLastError(), "sm90 attention kernel launch (carry-in)");
}

/* Pairs of 64-row query blocks: their kernel, with the scheduler slots'
 * extension (the layout's varlen part, kVDynamicBytes). */
template <sk_dtype DT, int HD, int BN>
static sk_status sk90_launch_pair(const sk90_params &prm, int grid, cudaStream_t stream) {
    using L = sk90_layout<HD, kSk90Fixed, BN>;
    SK_CUDA_TRY(cudaFuncSetAttribute(sk_attention_sm90_pair_kernel<DT, HD, BN>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)L::kVDynamicBytes),
                "cudaFuncSetAttribute");
    sk_attention_sm90_pair_kernel<DT, HD, BN><<<grid, kThreads, L::kVDynamicBytes, stream>>>(prm);
    return sk_cuda_status(cudaGetLastError(), "sm90 attention kernel launch (block_q 64)");
}

template <int BN>
static sk_status sk90_dispatch_pair(const sk_attention_problem *p, const sk90_params &prm,
                                    int grid, cudaStream_t stream) {
    const bool bf16 = p->dtype == SK_DTYPE_BF16;
    if (p->head_dim == 128)
        return bf16 ? sk90_launch_pair<SK_DTYPE_BF16, 128, BN>(prm, grid, stream)
                    : sk90_launch_pair<SK_DTYPE_F16, 128, BN>(prm, grid, stream);
    return bf16 ? sk90_launch_pair<SK_DTYPE_BF16, 64, BN>(prm, grid, stream)
                : sk90_launch_pair<SK_DTYPE_F16, 64, BN>(prm, grid, stream);
}

/* The kernel for the dtype, head dim and key block width (carry-in or not). */
template <int BN>
static sk_status sk90_dispatch(const sk_attention_problem *p, const sk90_params &prm,
                               const sk90_vparams *carry, int grid, cudaStream_t stream) {
    const bool bf16 = p->dtype == SK_DTYPE_BF16;
    if (carry != NULL) {
        if (p->head_dim == 128)
            return bf16 ? sk90_launch_carry<SK_DTYPE_BF16, 128, BN>(prm, *carry, grid, stream)
                        : sk90_launch_carry<SK_DTYPE_F16, 128, BN>(prm, *carry, grid, stream);
        return bf16 ? sk90_launch_carry<SK_DTYPE_BF16, 64, BN>(prm, *carry, grid, stream)
                    : sk90_launch_carry<SK_DTYPE_F16, 64, BN>(prm, *carry, grid, stream);
    }
    if (p->head_dim == 128)
        return bf16 ? sk90_launch<SK_DTYPE_BF16, 128, BN>(prm, grid, stream)
                    : sk90_launch<SK_DTYPE_F16, 128, BN>(prm, grid, stream);
    return bf16 ? sk90_launch<SK_DTYPE_BF16, 64, BN>(prm, grid, stream)
                : sk90_launch<SK_DTYPE_F16, 64, BN>(prm, grid, stream);
}

static sk_status sk90_dispatch_carry(const sk_attention_problem *p, const sk90_params &prm,
                                     int grid, cudaStream_t stream) {
    sk90_vparams v;
    memset(&v, 0, sizeof v);
    v.o = p->o;
    v.o_batch_stride = p->o_stride[0];
    v.o_token_stride = p->o_stride[1];
    v.o_head_stride = p->o_stride[2];
    v.lse_carry = p->lse_carry;
    return p->block_k == 64 ? sk90_dispatch<64>(p, prm, &v, grid, stream)
                            : sk90_dispatch<kBlockN>(p, prm, &v, grid, stream);
}

sk_status sk_attention_sm90_launch(const sk_attention_problem *p, const sk_attention_schedule *s,
                                   cudaStream_t stream) {
    if (!sk_attention_sm90_supports(p))
        return sk_error(SK_STATUS_NOT_SUPPORTED,
                        "the Hopper kernel does not cover this problem (dtype, head_dim = %lld, "
                        "blocks %d x %d, strides)",
                        (long long)p->head_dim, (int)p->block_q, (int)p->block_k);
    sk90_params prm;
    memset(&prm, 0, sizeof prm);
    const CUresult r = sk90_encode_all(&prm, p, p->q, p->k, p->v, p->o);
    if (r != CUDA_SUCCESS)
        return sk_error(SK_STATUS_EXECUTION_FAILED, "cuTensorMapEncodeTiled failed (CUresult %d)",
                        (int)r);
    int grid = 0;
    SK_TRY(sk90_fill_params(&prm, p, s, &grid));
    if (grid <= 0) return SK_STATUS_SUCCESS;
    if (p->lse_carry != NULL) return sk90_dispatch_carry(p, prm, grid, stream);
    if (p->block_q == 64)
        return p->block_k == 64 ? sk90_dispatch_pair<64>(p, prm, grid, stream)
                                : sk90_dispatch_pair<kBlockN>(p, prm, grid, stream);
    return p->block_k == 64 ? sk90_dispatch<64>(p, prm, NULL, grid, stream)
                            : sk90_dispatch<kBlockN>(p, prm, NULL, grid, stream);
}
