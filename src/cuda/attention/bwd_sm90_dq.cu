/*
 * bwd_sm90_dq.cu - the Hopper (sm_90a) kernel of the attention backward's
 * dQ pass (bwd_kernels.h), run after the pre-pass (lse2, Dl in the
 * workspace) and the dK/dV pass; its parts in bwd_sm90_dq_kernel.cuh.
 *
 * Algorithm. The forward's structure without the online softmax, one more
 * GEMM a chunk. A CTA of 384 threads, a persistent grid (one CTA per SM),
 * takes the plan's dQ schedule (dq_info, longest rows first) with a
 * static stride: slots blockIdx.x, + gridDim.x, ... A tile is a layout
 * row's 128 query rows of one (batch, query head).
 *   - Warpgroup 0 gives its registers away; its thread 0 walks each
 *     tile's layout row in 64-key chunks (bwd_dq_visit.cuh: the portable
 *     kernel's walk, the visiting rule of common/plan_contract.cuh) and
 *     issues the TMA loads: Q and dO (one buffer each, loaded when both
 *     consumers released the last tile's), then per chunk K and V into a
 *     ring of 4 stages, each with a full
 *     mbarrier (expect_tx) and an empty one (a release per consumer warp).
 *     Each stage carries its first key and whether another chunk of the
 *     tile follows, so the consumers read no layout memory. A tile with no
 *     chunk gets one stage with no bytes and the empty flag.
 *   - Warpgroups 1 and 2 own 64 query rows each, lse2 and Dl of their rows
 *     in registers, dQ (64 x D, fp32) in registers. Per chunk:
 *     S = Q K^T and dP = dO V^T (wgmma m64n64k16, both operands in shared
 *     memory, K-major), then dS = P (dP - Dl) with P = 2^(S s log2(e) -
 *     lse2), rounded to the dtype as the register A operand of
 *     dQ += dS K (wgmma, K read N-major as the forward's P V reads V).
 *     Three commit groups: P's exponentials run while dP does, and the
 *     dQ product stays in flight into the next chunk, whose S and dP are
 *     issued behind it (its stage is freed once it completed).
 *   - Epilogue: dQ times s, rounded, stored by the threads that hold it
 *     (4-byte stores, rows below Sq only). Every element of a tile's rows
 *     is written once, empty tiles' with 0.
 *
 * Masks and NaN (bwd_sm80.cu's rules). A pair (q, k) counts iff q < Sq,
 * k < Sk and, when causal, k <= q + Sk - Sq; uncounted entries of dS are
 * selected to 0, never multiplied. TMA zero-fills rows past Sq and Sk;
 * the K rows of keys past the tile's last visible key (causal) are zeroed
 * in shared memory before any GEMM reads the stage (such keys may be NaN:
 * dS = 0 times NaN is NaN); V there reaches only masked dP columns. A half
 * of the Q / dO rows all past Sq is not loaded (masked whatever it holds).
 *
 * Determinism: each dQ element has one owner thread that accumulates the
 * chunks in the walk's fixed order; the schedule only decides which CTA.
 *
 * Covers: F16 / BF16, head_dim 64 / 128, block_q 128, block_k 64 / 128,
 * Q, K, V, dO, dQ strides that TMA takes (16-byte multiples) and
 * sequences up to 2^30. Declines (portable pass) block_q 64 and anything
 * else; a map that the driver refuses (e.g. a misaligned pointer) also
 * declines.
 */
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cuda/attention/bwd_kernels.h"
#include "cuda/attention/bwd_params.h"
#include "cuda/attention/bwd_sm90_dq.h"
#include "cuda/common/cuda_check.cuh"
#include "cuda/common/hopper.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/tensor_map.h"

/* The forward's shared helpers: the map encoder, stride rule, pipeline
 * position, register split, sk90_pack (included, not changed). */
#include "cuda/attention/fwd_sm90_common.cuh"
#include "cuda/attention/fwd_sm90_consumer.cuh"

#include "cuda/attention/bwd_sm90_dq_kernel.cuh"

/* Launches of the kernel so far (the test query, bwd_sm90_dq.h). */
static int sk_bwd90_dq_count = 0;

extern "C" int sk_bwd90_dq_launches(void) {
    return __atomic_load_n(&sk_bwd90_dq_count, __ATOMIC_RELAXED);
}

/* Whether the kernel covers the problem (before any map is encoded). */
static bool sk_bwd90_dq_covers(const sk_attention_backward_problem *bp) {
    const sk_attention_problem *p = &bp->fwd;
    if (p->dtype != SK_DTYPE_F16 && p->dtype != SK_DTYPE_BF16) return false;
    if (p->head_dim != 64 && p->head_dim != 128) return false;
    if (p->block_q != kDqRows || (p->block_k != 64 && p->block_k != 128)) return false;
    if (p->seq_q > kSk90MaxSeq || p->seq_k > kSk90MaxSeq) return false;
    const int64_t strides[5][3] = {{p->q_stride[0], p->q_stride[1], p->q_stride[2]},
                                   {p->k_stride[0], p->k_stride[1], p->k_stride[2]},
                                   {p->v_stride[0], p->v_stride[1], p->v_stride[2]},
                                   {bp->dout_stride[0], bp->dout_stride[1], bp->dout_stride[2]},
                                   {bp->dq_stride[0], bp->dq_stride[1], bp->dq_stride[2]}};
    const int64_t seq[5] = {p->seq_q, p->seq_k, p->seq_k, p->seq_q, p->seq_q};
    const int64_t heads[5] = {p->heads_q, p->heads_kv, p->heads_kv, p->heads_q, p->heads_q};
    for (int t = 0; t < 5; ++t)
        if (!sk90_stride_ok(strides[t][0], p->batch, 2) ||
            !sk90_stride_ok(strides[t][1], seq[t], 2) ||
            !sk90_stride_ok(strides[t][2], heads[t], 2))
            return false;
    /* dQ's 4-byte stores. */
    return ((uintptr_t)bp->dq & 3u) == 0;
}

template <sk_dtype DT, int HD>
static sk_status sk_bwd90_dq_launch_typed(const sk_bwd90_dq_params &prm, int grid,
                                          cudaStream_t stream) {
    using L = sk_bwd90_dq_smem<HD>;
    SK_CUDA_TRY(cudaFuncSetAttribute(sk_bwd90_dq_kernel<DT, HD>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)L::kDynamicBytes),
                "cudaFuncSetAttribute (Hopper backward dQ)");
    sk_bwd90_dq_kernel<DT, HD><<<grid, kDqThreads, L::kDynamicBytes, stream>>>(prm);
    return sk_cuda_status(cudaGetLastError(), "Hopper backward dQ kernel launch");
}

sk_status sk_attention_bwd_sm90_dq_launch(const sk_attention_backward_problem *bp,
                                          const sk_bwd_shape *s, const struct sk_bwd_params *k,
                                          cudaStream_t stream, int *launched) {
    *launched = 0;
    if (!sk_bwd90_dq_covers(bp)) return SK_STATUS_SUCCESS;
    const sk_attention_problem *p = &bp->fwd;
    sk_bwd90_dq_params prm;
    memset(&prm, 0, sizeof prm);
    const sk_dtype dt = p->dtype;
    CUresult r =
        sk90_encode(&prm.tm_q, p, dt, 64, p->q, p->seq_q, p->heads_q, p->q_stride, kDqWgRows);
    if (r == CUDA_SUCCESS)
        r = sk90_encode(&prm.tm_do, p, dt, 64, bp->dout, p->seq_q, p->heads_q, bp->dout_stride,
                        kDqWgRows);
    if (r == CUDA_SUCCESS)
        r = sk90_encode(&prm.tm_k, p, dt, 64, p->k, p->seq_k, p->heads_kv, p->k_stride, kDqKeys);
    if (r == CUDA_SUCCESS)
        r = sk90_encode(&prm.tm_v, p, dt, 64, p->v, p->seq_k, p->heads_kv, p->v_stride, kDqKeys);
    if (r != CUDA_SUCCESS) return SK_STATUS_SUCCESS; /* the driver declines: portable pass */
    prm.p = *k;
    int grid = 0;
    SK_TRY(sk90_grid(s->dq_tiles, &grid));
    if (grid > 0) {
        const bool bf16 = dt == SK_DTYPE_BF16;
        sk_status st;
        if (p->head_dim == 128)
            st = bf16 ? sk_bwd90_dq_launch_typed<SK_DTYPE_BF16, 128>(prm, grid, stream)
                      : sk_bwd90_dq_launch_typed<SK_DTYPE_F16, 128>(prm, grid, stream);
        else
            st = bf16 ? sk_bwd90_dq_launch_typed<SK_DTYPE_BF16, 64>(prm, grid, stream)
                      : sk_bwd90_dq_launch_typed<SK_DTYPE_F16, 64>(prm, grid, stream);
        SK_TRY(st);
    }
    __atomic_fetch_add(&sk_bwd90_dq_count, 1, __ATOMIC_RELAXED);
    *launched = 1;
    return SK_STATUS_SUCCESS;
}
