/*
 * score_sm80.cu - the portable block scoring of the top-k selection (any
 * device of compute capability 8.0 or later; on a 9.0 device unless the
 * backend forces SK_BACKEND_CUDA_SM80: else score_sm90.cu or
 * score_rows_sm90.cu score), the group sums it may need, and the row table
 * that its first CTA otherwise fills:
 *   row table  (sk_layout_from_scores: its own one-CTA kernel) the rules of
 *            every row of a slice, each row's place in its slice when every
 *            row fills its bound, and the short-row flag cleared
 *            (kernels.cuh, fill_row_table). It lives beside the scoring
 *            kernel on purpose: with a second user of fill_row_table's
 *            shared array in the file, nvcc places that array as it did
 *            when all top-k kernels shared one file, and the scoring
 *            kernel's machine code is unchanged (tests/bitwise/).
 *   group sum  with per_kv_head and a group > 1 only: the fp32 sum of each
 *            group's pooled Q rows (ascending head order), the scoring's A
 *            operand (also before the Hopper scoring).
 *   score    scores[slice, i, j] = scale * sum_d A[i, d] * pooled_k[j, d],
 *            128 x 128 tiles: a plain fp32 SIMT GEMM (FMA), 8 x 8 outputs
 *            per thread, D in steps of 8 through double-buffered shared
 *            memory with a register prefetch, two CTAs per SM. With causal,
 *            tiles wholly past the candidates of their last row are skipped
 *            (those scores are never read). Streaming stores keep the
 *            operands in L2. One extra CTA (the first) fills the row table.
 *            A score that comes out inf or NaN (a pooled entry not finite)
 *            gets the fp32 value, per head and then summed over the group
 *            (topk_nonfinite_score): what the group's summed rows would
 *            lose (inf - inf).
 */
#include <cuda_runtime.h>
#include <float.h>
#include <stdint.h>

#include "cuda/common/cuda_check.cuh"
#include "cuda/topk/kernels.cuh"

enum {
    SC_KC = 8,      /* D step through shared memory */
    SC_PAD = 4,     /* keeps the float4 rows of the transposed tiles 16-byte aligned */
    SC_THREADS = 256,
    SUM_THREADS = 256
};

/* The row table alone (sk_layout_from_scores; with scoring, the scoring
 * kernel's last CTA fills it). */
__global__ void __launch_bounds__(TBL_THREADS) sk_topk_row_table_kernel(const __grid_constant__ sk_topk_problem p,
                                                                     const __grid_constant__ row_table t) {
    pdl_enter();
    fill_row_table(&p, &t);
}

/* Group sums for per_kv_head: qsum[b, hk, i, :] = sum over the group's query
 * heads h = hk * G .. hk * G + G - 1 (ascending) of pooled_q[b, h, i, :],
 * fp32; one thread per 4 values. */
__global__ void __launch_bounds__(SUM_THREADS) sk_topk_group_sum_kernel(const float *pooled_q, int32_t group,
                                                             int64_t rows_d, int64_t n4,
                                                             float *qsum) {
    pdl_enter();
    for (int64_t e = (int64_t)blockIdx.x * SUM_THREADS + threadIdx.x; e < n4;
         e += (int64_t)gridDim.x * SUM_THREADS) {
        const int64_t slice = e * 4 / rows_d, at = e * 4 - slice * rows_d;
        const float *src = pooled_q + slice * group * rows_d + at;
        float4 a = __ldg((const float4 *)src);
        for (int32_t g = 1; g < group; ++g) {
            const float4 v = __ldg((const float4 *)(src + g * rows_d));
            a.x += v.x;
            a.y += v.y;
            a.z += v.z;
            a.w += v.w;
        }
        *(float4 *)(qsum + e * 4) = a;
    }
}

/* scores = scale * A B^T per slice, fp32 FMA. 128 x 128 tile, 256 threads,
 * 8 x 8 outputs per thread (rows ty*4 + r and 64 + ty*4 + r, columns tx*4 + c
 * and 64 + tx*4 + c); D in steps of SC_KC through double-buffered shared
 * memory (transposed, so each step reads float4 rows; one barrier per step),
 * the next step prefetched into registers. Each output is one fmaf chain
 * over d = 0 .. D-1 in order, then times the scale.
 * Rows and columns past the end read the last valid row (never stored).
 * Scores are written with streaming stores: the selection reads them once,
 * while the pooled operands should stay in L2. The extra first CTA fills the
 * row table instead. */
__global__ void __launch_bounds__(SC_THREADS, 2) sk_topk_score_kernel(const __grid_constant__ score_params sp) {
    pdl_enter();
    static_assert(SC_TM == 128 && SC_TN == 128 && SC_THREADS == 256 && SC_KC == 8,
                  "thread layout: 16 x 16 threads of 8 x 8 outputs, 2 loads of 4 per step");
    static_assert(2 * 2 * SC_KC * (SC_TM + SC_PAD) * 4 <= 48 * 1024, "static shared memory budget");
    static_assert(SC_THREADS == TBL_THREADS, "the first CTA fills the row table");
    const sk_topk_problem *p = &sp.p;
    score_tile t;
    if (!score_tile_begin(&sp, &t)) return;
    const int32_t slice = t.slice, b = t.b, hk = t.hk, i0 = t.i0, j0 = t.j0;
    const int32_t rb = p->row_blocks, cb = p->col_blocks, dim = (int32_t)p->head_dim;

    __shared__ __align__(16) float As[2][SC_KC][SC_TM + SC_PAD];
    __shared__ __align__(16) float Bs[2][SC_KC][SC_TN + SC_PAD];
    const int32_t tid = (int32_t)threadIdx.x;
    const int32_t lr = tid >> 1, lc = (tid & 1) * 4; /* loader: tile row, 4 of the 8 d's */
    const int32_t tx = tid % 16, ty = tid / 16;
    const int32_t ar = i0 + lr < rb ? i0 + lr : rb - 1, br = j0 + lr < cb ? j0 + lr : cb - 1;
    const float *a_src = sp.a + (int64_t)slice * sp.a_slice_stride + (int64_t)ar * dim + lc;
    const float *b_src = sp.pooled_k + (((int64_t)b * p->heads_kv + hk) * cb + br) * dim + lc;

    float acc[8][8];
#pragma unroll
    for (int r = 0; r < 8; ++r)
#pragma unroll
        for (int c = 0; c < 8; ++c) acc[r][c] = 0.f;

    float4 ra = __ldg((const float4 *)a_src), rk = __ldg((const float4 *)b_src);
    As[0][lc + 0][lr] = ra.x;
    As[0][lc + 1][lr] = ra.y;
    As[0][lc + 2][lr] = ra.z;
    As[0][lc + 3][lr] = ra.w;
    Bs[0][lc + 0][lr] = rk.x;
    Bs[0][lc + 1][lr] = rk.y;
    Bs[0][lc + 2][lr] = rk.z;
    Bs[0][lc + 3][lr] = rk.w;
    __syncthreads();
    int buf = 0;
    for (int32_t k0 = 0; k0 < dim; k0 += SC_KC) {
        const int more = k0 + SC_KC < dim;
        if (more) {
            ra = __ldg((const float4 *)(a_src + k0 + SC_KC));
            rk = __ldg((const float4 *)(b_src + k0 + SC_KC));
        }
#pragma unroll
        for (int kk = 0; kk < SC_KC; ++kk) {
            const float4 a0 = *(const float4 *)&As[buf][kk][ty * 4];
            const float4 a1 = *(const float4 *)&As[buf][kk][64 + ty * 4];
            const float4 b0 = *(const float4 *)&Bs[buf][kk][tx * 4];
            const float4 b1 = *(const float4 *)&Bs[buf][kk][64 + tx * 4];
            const float av[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
            const float bv[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
            for (int r = 0; r < 8; ++r)
#pragma unroll
                for (int c = 0; c < 8; ++c) acc[r][c] = fmaf(av[r], bv[c], acc[r][c]);
        }
        /* The other buffer was last read in the previous step, before the
         * barrier that ended it. */
        if (more) {
            As[buf ^ 1][lc + 0][lr] = ra.x;
            As[buf ^ 1][lc + 1][lr] = ra.y;
            As[buf ^ 1][lc + 2][lr] = ra.z;
            As[buf ^ 1][lc + 3][lr] = ra.w;
            Bs[buf ^ 1][lc + 0][lr] = rk.x;
            Bs[buf ^ 1][lc + 1][lr] = rk.y;
            Bs[buf ^ 1][lc + 2][lr] = rk.z;
            Bs[buf ^ 1][lc + 3][lr] = rk.w;
        }
        __syncthreads();
        buf ^= 1;
    }

    const float scale = p->scale;
    const int vec = (cb % 4) == 0;
#pragma unroll
    for (int r = 0; r < 8; ++r) {
        const int32_t i = i0 + (r < 4 ? ty * 4 + r : 64 + ty * 4 + (r - 4));
        if (i >= rb) continue;
        float *out = sp.scores + ((int64_t)slice * rb + i) * cb;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int32_t j = j0 + half * 64 + tx * 4;
            float d[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                d[e] = acc[r][half * 4 + e];
                /* inf or NaN from a group sum: the per-head sum's value */
                if (!(fabsf(d[e]) <= FLT_MAX) && p->group > 1 && p->per_kv_head && j + e < cb)
                    d[e] = topk_nonfinite_score(p, slice, i, j + e);
            }
            const float v0 = scale * d[0], v1 = scale * d[1], v2 = scale * d[2], v3 = scale * d[3];
            if (vec && j + 3 < cb) {
                __stcs((float4 *)(out + j), make_float4(v0, v1, v2, v3));
            } else {
                if (j + 0 < cb) __stcs(out + j + 0, v0);
                if (j + 1 < cb) __stcs(out + j + 1, v1);
                if (j + 2 < cb) __stcs(out + j + 2, v2);
                if (j + 3 < cb) __stcs(out + j + 3, v3);
            }
        }
    }
}

sk_status sk_topk_launch_row_table(const sk_topk_problem *p, const row_table *table, int hopper,
                                   cudaStream_t stream) {
    launch_cfg l;
    SK_CUDA_TRY(cudaLaunchKernelEx(launch_config(&l, 1, TBL_THREADS, 0, stream, hopper),
                                   sk_topk_row_table_kernel, *p, *table),
                "row-table kernel launch");
    return SK_STATUS_SUCCESS;
}

sk_status sk_topk_launch_group_sum(const sk_topk_problem *p, float *qsum, int hopper,
                                   cudaStream_t stream) {
    const int64_t n4 = (int64_t)p->total_rows * p->head_dim / 4;
    int64_t blocks = (n4 + SUM_THREADS - 1) / SUM_THREADS;
    if (blocks > (1 << 20)) blocks = 1 << 20;
    launch_cfg l;
    SK_CUDA_TRY(cudaLaunchKernelEx(launch_config(&l, (unsigned)blocks, SUM_THREADS, 0, stream,
                                                 hopper),
                                   sk_topk_group_sum_kernel, p->pooled_q, p->group,
                                   (int64_t)p->row_blocks * p->head_dim, n4, qsum),
                "group-sum kernel launch");
    return SK_STATUS_SUCCESS;
}

sk_status sk_topk_score_sm80(const score_params *sp, cudaStream_t stream) {
    launch_cfg l;
    SK_CUDA_TRY(cudaLaunchKernelEx(launch_config(&l, (unsigned)sp->tiles + 1, SC_THREADS, 0,
                                                 stream, 0),
                                   sk_topk_score_kernel, *sp),
                "scoring kernel launch");
    return SK_STATUS_SUCCESS;
}
