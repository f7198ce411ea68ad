/*
 * score_sm90.cu - the Hopper block scoring of the top-k selection for
 * head_dim > 128 (score_rows_sm90.cu takes the rest):
 * scores[slice, i, j] = scale * sum_d A[i, d] * pooled_k[j, d] on the tensor
 * cores (wgmma), with fp32 accuracy through the 3xTF32 split.
 *
 * Why 3xTF32: the scores are fp32 dot products of fp32 block means, and the
 * selection compares them, so a plain TF32 product (10 mantissa bits) would
 * reorder close blocks. Each operand x is split into big = tf32(x) and
 * small = tf32(x - big); big * big + big * small + small * big carries
 * about 22 bits (the dropped small * small term is below 2^-22 |x y|),
 * within the tests' tolerance for an fp32 dot product. It is not the
 * portable kernel's fmaf chain bit for bit: the tensor cores sum in their
 * own order. The layout is still exact for the scores computed (the
 * selection runs on them), and two runs are identical.
 *
 * One CTA per 128 x 128 tile (the portable kernel's grid, kernels.cuh),
 * 256 threads = two warpgroups of 64 rows each; two CTAs per SM, so one
 * CTA's loads and splits overlap the other's wgmma. D in chunks of 32
 * (one 128-byte swizzle row of fp32; a last short chunk is zero-padded):
 *   1. every thread loads 4 float4 of the A rows and 4 of the K rows
 *      (issued before waiting for the previous chunk's wgmma);
 *   2. splits them and stores big and small into four 128B-swizzled
 *      K-major panels (A big, A small, K big, K small; 16 KB each);
 *   3. each warpgroup issues 4 K steps x 3 wgmma m64n128k8 (small terms
 *      first) into its 64 x 128 fp32 accumulator.
 * The epilogue scales and writes the tile with streaming stores, as the
 * portable kernel does (the selection reads the scores once). A score that
 * comes out inf or NaN (an operand entry not finite: the big * small terms
 * may hold inf * 0) is recomputed by topk_nonfinite_score, the fp32 value.
 */
#include <cuda_runtime.h>
#include <float.h>
#include <stdint.h>

#include "cuda/common/cuda_check.cuh"
#include "cuda/common/hopper.cuh"
#include "cuda/topk/kernels.cuh"

enum {
    S90_THREADS = 256,             /* two warpgroups */
    S90_KC = 32,                   /* D per chunk: 128 bytes of fp32 */
    S90_ROW_BYTES = S90_KC * 4,    /* one panel row */
    S90_PANEL = SC_TM * S90_ROW_BYTES, /* 16 KB: 128 rows x 32 fp32 */
    S90_ATOM = 1024,               /* 8 rows x 128 B: the 128B-swizzle period */
    S90_LOADS = SC_TM * (S90_KC / 4) / S90_THREADS, /* float4 per thread per operand */
    S90_STAGE = 2 * S90_LOADS * S90_THREADS * 16, /* raw fp32 of one chunk (cp.async) */
    S90_SMEM = 4 * S90_PANEL + S90_STAGE + S90_ATOM /* + slack to align the panels to the atom */
};

/* big = tf32(x), small = tf32(x - big); small = 0 when x is not finite
 * (inf - inf would make a NaN where the fp32 product gives +-inf). */
static __device__ __forceinline__ void split_tf32(float x, uint32_t *big, uint32_t *small) {
    const uint32_t b = sk_cvt_rna_tf32(x);
    const float rest = fabsf(x) <= 3.402823466e38f ? x - __uint_as_float(b) : 0.f;
    *big = b;
    *small = sk_cvt_rna_tf32(rest);
}

/* Split a float4 and store both halves at byte offset `off` of the big and
 * small panels. */
static __device__ __forceinline__ void store_split(char *big_panel, char *small_panel, uint32_t off,
                                                   float4 v) {
    uint4 b, s;
    split_tf32(v.x, &b.x, &s.x);
    split_tf32(v.y, &b.y, &s.y);
    split_tf32(v.z, &b.z, &s.z);
    split_tf32(v.w, &b.w, &s.w);
    *(uint4 *)(big_panel + off) = b;
    *(uint4 *)(small_panel + off) = s;
}

__global__ void __launch_bounds__(S90_THREADS, 2)
    sk_topk_score_sm90_kernel(const __grid_constant__ score_params sp) {
    static_assert(S90_THREADS == TBL_THREADS, "the first CTA fills the row table");
    static_assert(SC_TM == 128 && SC_TN == 128 && S90_LOADS == 4,
                  "two warpgroups of 64 rows, m64n128 wgmma, 4 float4 per thread per operand");
    pdl_enter();
    const sk_topk_problem *p = &sp.p;
    score_tile t;
    if (!score_tile_begin(&sp, &t)) return;
    const int32_t slice = t.slice, b = t.b, hk = t.hk, i0 = t.i0, j0 = t.j0;
    const int32_t rb = p->row_blocks, cb = p->col_blocks, dim = (int32_t)p->head_dim;

    extern __shared__ __align__(16) char smem_raw[];
    char *const base = smem_raw + ((S90_ATOM - (__cvta_generic_to_shared(smem_raw) & (S90_ATOM - 1))) &
                                   (S90_ATOM - 1));
    char *const a_big = base, *const a_small = base + S90_PANEL;
    char *const k_big = base + 2 * S90_PANEL, *const k_small = base + 3 * S90_PANEL;

    const int32_t tid = (int32_t)threadIdx.x;
    /* Loader: rows tid / 8 + 32 r (r < 4), 16-byte chunk tid % 8 of the 32-float chunk. */
    const int32_t lrow = tid >> 3, lc16 = tid & 7;
    const uint32_t soff = sk_sw128_offset(lrow, lc16); /* + r * 32 rows = r * 4 atoms */
    const float *a_rows = sp.a + (int64_t)slice * sp.a_slice_stride;
    const float *k_rows = sp.pooled_k + ((int64_t)b * p->heads_kv + hk) * cb * dim;

    /* Descriptors: this warpgroup's 64 rows of A, all 128 rows of K. */
    const int32_t wg = tid >> 7;
    const uint32_t s_base = (uint32_t)__cvta_generic_to_shared(base);
    const uint64_t d_ab = sk_wgmma_desc_sw128(s_base + wg * 64 * S90_ROW_BYTES, 16, S90_ATOM);
    const uint64_t d_as = d_ab + (S90_PANEL >> 4);
    const uint64_t d_kb = sk_wgmma_desc_sw128(s_base + 2 * S90_PANEL, 16, S90_ATOM);
    const uint64_t d_ks = d_kb + (S90_PANEL >> 4);

    /* Staging: this thread's 2 x S90_LOADS raw float4 of a chunk, at
     * raw[(operand * S90_LOADS + r) * S90_THREADS + tid]; only the thread
     * that copied a slot reads it, so no barrier guards the staging. */
    float4 *const raw = (float4 *)(base + 4 * S90_PANEL);
    const uint32_t raw_s = (uint32_t)__cvta_generic_to_shared(raw + tid);
    const int32_t a_last = rb - 1 - i0, k_last = cb - 1 - j0; /* rows past them read the last */
    auto stage = [&](int32_t d0) {
        /* dim is a multiple of 8: a float4 is all inside D or all past it (zero-filled) */
        const uint32_t bytes = d0 + lc16 * 4 < dim ? 16u : 0u;
#pragma unroll
        for (int r = 0; r < S90_LOADS; ++r) {
            const int32_t ar = min(lrow + 32 * r, a_last), kr = min(lrow + 32 * r, k_last);
            const float *as = a_rows + (int64_t)(i0 + ar) * dim + (bytes ? d0 + lc16 * 4 : 0);
            const float *ks = k_rows + (int64_t)(j0 + kr) * dim + (bytes ? d0 + lc16 * 4 : 0);
            sk_cp_async_16(raw_s + r * S90_THREADS * 16, as, bytes);
            sk_cp_async_16(raw_s + (S90_LOADS + r) * S90_THREADS * 16, ks, bytes);
        }
        sk_cp_async_commit();
    };

    float acc[64];
#pragma unroll
    for (int e = 0; e < 64; ++e) acc[e] = 0.f;

    stage(0);
    for (int32_t d0 = 0; d0 < dim; d0 += S90_KC) {
        sk_cp_async_wait<0>(); /* this thread's staged chunk has landed */
        if (d0 > 0) sk_wgmma_wait<0>(); /* this warpgroup no longer reads the panels */
        __syncthreads();                /* nor does the other */
#pragma unroll
        for (int r = 0; r < S90_LOADS; ++r) {
            store_split(a_big, a_small, soff + r * 4 * S90_ATOM, raw[r * S90_THREADS + tid]);
            store_split(k_big, k_small, soff + r * 4 * S90_ATOM,
                        raw[(S90_LOADS + r) * S90_THREADS + tid]);
        }
        sk_fence_proxy_async_smem(); /* the generic stores before wgmma's reads */
        __syncthreads();
        /* The next chunk lands while this one's wgmma run (after the barrier,
         * so the staging reads above are complete before it is rewritten). */
        if (d0 + S90_KC < dim) stage(d0 + S90_KC);
        sk_wgmma_fence();
#pragma unroll
        for (int s = 0; s < S90_KC / 8; ++s) {
            const uint64_t step = (uint64_t)((s * 32) >> 4); /* 8 tf32 = 32 B inside the atom row */
            sk_wgmma_m64n128k8_ss_tf32(acc, d_as + step, d_kb + step);
            sk_wgmma_m64n128k8_ss_tf32(acc, d_ab + step, d_ks + step);
            sk_wgmma_m64n128k8_ss_tf32(acc, d_ab + step, d_kb + step);
        }
        sk_wgmma_commit();
    }
    sk_wgmma_wait<0>();

    /* acc[4 n + e]: row 16 w + lane / 4 (+ 8 for e >= 2), column 8 n + 2 (lane % 4) + e % 2,
     * w = the warp in its warpgroup. */
    const float scale = p->scale;
    const int32_t lane = tid & 31, w = (tid >> 5) & 3;
    const int32_t col0 = j0 + 2 * (lane & 3);
    const int even = (cb & 1) == 0;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int32_t i = i0 + wg * 64 + w * 16 + (lane >> 2) + half * 8;
        if (i >= rb) continue;
        float *out = sp.scores + ((int64_t)slice * rb + i) * cb;
#pragma unroll
        for (int n = 0; n < 16; ++n) {
            const int32_t j = col0 + 8 * n;
            float d0 = acc[4 * n + 2 * half], d1 = acc[4 * n + 2 * half + 1];
            /* inf or NaN: the fp32 value (the big * small terms may hold inf * 0) */
            if (!(fabsf(d0) <= FLT_MAX) && j < cb) d0 = topk_nonfinite_score(p, slice, i, j);
            if (!(fabsf(d1) <= FLT_MAX) && j + 1 < cb) d1 = topk_nonfinite_score(p, slice, i, j + 1);
            const float v0 = scale * d0, v1 = scale * d1;
            if (even && j < cb) {
                __stcs((float2 *)(out + j), make_float2(v0, v1));
            } else {
                if (j < cb) __stcs(out + j, v0);
                if (j + 1 < cb) __stcs(out + j + 1, v1);
            }
        }
    }
}

sk_status sk_topk_score_sm90(const score_params *sp, cudaStream_t stream) {
    SK_CUDA_TRY(cudaFuncSetAttribute(sk_topk_score_sm90_kernel,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, S90_SMEM),
                "cudaFuncSetAttribute");
    launch_cfg l;
    return sk_cuda_status(cudaLaunchKernelEx(launch_config(&l, (unsigned)sp->tiles + 1, S90_THREADS,
                                                           S90_SMEM, stream, 1),
                                             sk_topk_score_sm90_kernel, *sp),
                          "Hopper scoring kernel launch");
}
