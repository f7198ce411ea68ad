/*
 * topk_kernel_variants.cu - a tuning experiment (not part of the library or
 * the Makefile): variants of the top-k pooling and scoring kernels side by
 * side on the issue-7 shape (H32, S128K, D128, blocks 128, causal), timed
 * with CUDA events (median of 20 after 3 warm-ups). The library ships one of
 * each (src/cuda/topk/); docs/perf/topk_log.md (step 1) records which won and why.
 *
 *   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a \
 *        -o build/topk_variants bench/topk_kernel_variants.cu
 *   build/topk_variants
 *
 * Pooling (Q only, 1 GiB bf16):  P8 (8 loads in flight, 4 CTAs/SM), P16
 * (16 in flight, 2 CTAs/SM), and a plain 16-byte read-and-sum roofline.
 * Scoring (per head 1024 x 1024 x 128, causal tiles only):  S1 SIMT fp32
 * 128x128 tiles, S2 WMMA 3xTF32 128x64 KC16, S3 WMMA 1xTF32 128x64 KC16,
 * S4 WMMA 3xTF32 128x64 KC32; each checked against S1 (max |diff| / sum|terms|).
 */
#include <cuda_runtime.h>
#include <mma.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_check.h"

enum { H = 32, S = 131072, D = 128, BS = 128, NB = S / BS };

/* ---------------- pooling ---------------- */
__device__ __forceinline__ void add8(float acc[8], uint4 v) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        acc[2 * e] += __uint_as_float(w[e] << 16);
        acc[2 * e + 1] += __uint_as_float(w[e] & 0xffff0000u);
    }
}

template <int INFLIGHT, int MINB>
__global__ void __launch_bounds__(256, MINB) pool_kernel(const uint16_t *x, float *out) {
    const int item = blockIdx.y * 256 + threadIdx.x; /* (h, chunk) */
    const int h = item / (D / 8), c = item % (D / 8);
    const int blk = blockIdx.x;
    const uint4 *src = (const uint4 *)(x + ((int64_t)blk * BS * H + h) * D + c * 8);
    const int64_t step = H * D / 8;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int t = 0; t < BS; t += INFLIGHT) {
        uint4 v[INFLIGHT];
#pragma unroll
        for (int u = 0; u < INFLIGHT; ++u) v[u] = __ldg(src + (int64_t)(t + u) * step);
#pragma unroll
        for (int u = 0; u < INFLIGHT; ++u) add8(acc, v[u]);
    }
    float4 *o = (float4 *)(out + ((int64_t)h * NB + blk) * D + c * 8);
    o[0] = make_float4(acc[0] / BS, acc[1] / BS, acc[2] / BS, acc[3] / BS);
    o[1] = make_float4(acc[4] / BS, acc[5] / BS, acc[6] / BS, acc[7] / BS);
}

__global__ void read_roofline(const uint4 *x, int64_t n, float *sink) {
    float s = 0;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        uint4 v = __ldg(x + i);
        s += __uint_as_float(v.x) + __uint_as_float(v.y) + __uint_as_float(v.z) + __uint_as_float(v.w);
    }
    if (s == 1.2345f) sink[0] = s;
}

/* ---------------- scoring: S1 SIMT ---------------- */
__global__ void __launch_bounds__(256, 1) score_simt(const float *pq, const float *pk, float *sc) {
    const int tile = blockIdx.x, tj = tile % 8, ti = (tile / 8) % 8, hh = tile / 64;
    const int i0 = ti * 128, j0 = tj * 128;
    if (j0 >= i0 + 128) return;
    __shared__ __align__(16) float As[8][132];
    __shared__ __align__(16) float Bs[8][132];
    const int tid = threadIdx.x, lr = tid >> 1, lc = (tid & 1) * 4, tx = tid % 16, ty = tid / 16;
    const float *a_src = pq + ((int64_t)hh * NB + i0 + lr) * D + lc;
    const float *b_src = pk + ((int64_t)hh * NB + j0 + lr) * D + lc;
    float acc[8][8];
#pragma unroll
    for (int r = 0; r < 8; ++r)
#pragma unroll
        for (int c = 0; c < 8; ++c) acc[r][c] = 0.f;
    float4 ra = __ldg((const float4 *)a_src), rk = __ldg((const float4 *)b_src);
    for (int k0 = 0; k0 < D; k0 += 8) {
        As[lc + 0][lr] = ra.x, As[lc + 1][lr] = ra.y, As[lc + 2][lr] = ra.z, As[lc + 3][lr] = ra.w;
        Bs[lc + 0][lr] = rk.x, Bs[lc + 1][lr] = rk.y, Bs[lc + 2][lr] = rk.z, Bs[lc + 3][lr] = rk.w;
        __syncthreads();
        if (k0 + 8 < D) {
            ra = __ldg((const float4 *)(a_src + k0 + 8));
            rk = __ldg((const float4 *)(b_src + k0 + 8));
        }
#pragma unroll
        for (int kk = 0; kk < 8; ++kk) {
            const float4 a0 = *(const float4 *)&As[kk][ty * 4], a1 = *(const float4 *)&As[kk][64 + ty * 4];
            const float4 b0 = *(const float4 *)&Bs[kk][tx * 4], b1 = *(const float4 *)&Bs[kk][64 + tx * 4];
            const float av[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
            const float bv[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
            for (int r = 0; r < 8; ++r)
#pragma unroll
                for (int c = 0; c < 8; ++c) acc[r][c] = fmaf(av[r], bv[c], acc[r][c]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int r = 0; r < 8; ++r) {
        const int i = i0 + (r < 4 ? ty * 4 + r : 64 + ty * 4 + r - 4);
        float *out = sc + ((int64_t)hh * NB + i) * NB;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int j = j0 + half * 64 + tx * 4;
            *(float4 *)(out + j) = make_float4(acc[r][half * 4], acc[r][half * 4 + 1],
                                               acc[r][half * 4 + 2], acc[r][half * 4 + 3]);
        }
    }
}

/* ---------------- scoring: WMMA ---------------- */
typedef nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 8, nvcuda::wmma::precision::tf32,
                               nvcuda::wmma::row_major> frag_a;
typedef nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 8, nvcuda::wmma::precision::tf32,
                               nvcuda::wmma::col_major> frag_b;
typedef nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 8, float> frag_c;

template <typename F> __device__ __forceinline__ void split(F &hi, F &lo) {
#pragma unroll
    for (int e = 0; e < hi.num_elements; ++e) {
        const float x = hi.x[e], h = nvcuda::wmma::__float_to_tf32(x);
        hi.x[e] = h;
        lo.x[e] = nvcuda::wmma::__float_to_tf32(x - h);
    }
}
template <typename F> __device__ __forceinline__ void round_tf32(F &f) {
#pragma unroll
    for (int e = 0; e < f.num_elements; ++e) f.x[e] = nvcuda::wmma::__float_to_tf32(f.x[e]);
}

/* 128 x 64 tiles, 8 warps of 32 x 32, KC in {16, 32}; THREE = 3xTF32. */
template <int KC, int THREE, int MINB>
__global__ void __launch_bounds__(256, MINB) score_wmma(const float *pq, const float *pk, float *sc) {
    enum { LD = KC + 4, AV = 128 * KC / 4 / 256, BV = 64 * KC / 4 / 256 };
    const int tile = blockIdx.x, tj = tile % 16, ti = (tile / 16) % 8, hh = tile / 128;
    const int i0 = ti * 128, j0 = tj * 64;
    if (j0 >= i0 + 128) return;
    __shared__ __align__(32) float smem[(128 + 64) * LD];
    float *As = smem, *Bs = smem + 128 * LD;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wm = warp >> 1, wn = warp & 1;
    const int cpr = KC / 4; /* float4 per row */
    float4 ra[AV], rk[BV];
#pragma unroll
    for (int v = 0; v < AV; ++v) {
        const int idx = tid + v * 256, row = idx / cpr, col = (idx % cpr) * 4;
        ra[v] = __ldg((const float4 *)(pq + ((int64_t)hh * NB + i0 + row) * D + col));
    }
#pragma unroll
    for (int v = 0; v < BV; ++v) {
        const int idx = tid + v * 256, row = idx / cpr, col = (idx % cpr) * 4;
        rk[v] = __ldg((const float4 *)(pk + ((int64_t)hh * NB + j0 + row) * D + col));
    }
    frag_c acc[2][2];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int ni = 0; ni < 2; ++ni) nvcuda::wmma::fill_fragment(acc[mi][ni], 0.0f);
    for (int k0 = 0; k0 < D; k0 += KC) {
#pragma unroll
        for (int v = 0; v < AV; ++v) {
            const int idx = tid + v * 256, row = idx / cpr, col = (idx % cpr) * 4;
            *(float4 *)&As[row * LD + col] = ra[v];
        }
#pragma unroll
        for (int v = 0; v < BV; ++v) {
            const int idx = tid + v * 256, row = idx / cpr, col = (idx % cpr) * 4;
            *(float4 *)&Bs[row * LD + col] = rk[v];
        }
        __syncthreads();
        if (k0 + KC < D) {
#pragma unroll
            for (int v = 0; v < AV; ++v) {
                const int idx = tid + v * 256, row = idx / cpr, col = (idx % cpr) * 4;
                ra[v] = __ldg((const float4 *)(pq + ((int64_t)hh * NB + i0 + row) * D + k0 + KC + col));
            }
#pragma unroll
            for (int v = 0; v < BV; ++v) {
                const int idx = tid + v * 256, row = idx / cpr, col = (idx % cpr) * 4;
                rk[v] = __ldg((const float4 *)(pk + ((int64_t)hh * NB + j0 + row) * D + k0 + KC + col));
            }
        }
#pragma unroll
        for (int kk = 0; kk < KC; kk += 8) {
            frag_a ah[2], al[2];
#pragma unroll
            for (int mi = 0; mi < 2; ++mi) {
                nvcuda::wmma::load_matrix_sync(ah[mi], As + (wm * 32 + mi * 16) * LD + kk, LD);
                if (THREE) split(ah[mi], al[mi]); else round_tf32(ah[mi]);
            }
#pragma unroll
            for (int ni = 0; ni < 2; ++ni) {
                frag_b bh, bl;
                nvcuda::wmma::load_matrix_sync(bh, Bs + (wn * 32 + ni * 16) * LD + kk, LD);
                if (THREE) split(bh, bl); else round_tf32(bh);
#pragma unroll
                for (int mi = 0; mi < 2; ++mi) {
                    if (THREE) {
                        nvcuda::wmma::mma_sync(acc[mi][ni], al[mi], bh, acc[mi][ni]);
                        nvcuda::wmma::mma_sync(acc[mi][ni], ah[mi], bl, acc[mi][ni]);
                    }
                    nvcuda::wmma::mma_sync(acc[mi][ni], ah[mi], bh, acc[mi][ni]);
                }
            }
        }
        __syncthreads();
    }
    float *stage = smem + warp * 16 * LD;
    const int sr = lane >> 1, scol = (lane & 1) * 8;
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int ni = 0; ni < 2; ++ni) {
            nvcuda::wmma::store_matrix_sync(stage, acc[mi][ni], LD, nvcuda::wmma::mem_row_major);
            __syncwarp();
            const int i = i0 + wm * 32 + mi * 16 + sr, j = j0 + wn * 32 + ni * 16 + scol;
            float *out = sc + ((int64_t)hh * NB + i) * NB + j;
            const float *v = stage + sr * LD + scol;
            *(float4 *)out = make_float4(v[0], v[1], v[2], v[3]);
            *(float4 *)(out + 4) = make_float4(v[4], v[5], v[6], v[7]);
            __syncwarp();
        }
}

/* ---------------- timing ---------------- */
static int cmpf(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

#define TIME(label, bytes_or_flops, unit, launch)                                                  \
    do {                                                                                           \
        cudaEvent_t e0, e1;                                                                        \
        cudaEventCreate(&e0), cudaEventCreate(&e1);                                                \
        float ms[20];                                                                              \
        for (int w = 0; w < 3; ++w) launch;                                                        \
        CUDA_OK(cudaDeviceSynchronize());                                                               \
        for (int r = 0; r < 20; ++r) {                                                             \
            cudaEventRecord(e0);                                                                   \
            launch;                                                                                \
            cudaEventRecord(e1);                                                                   \
            cudaEventSynchronize(e1);                                                              \
            cudaEventElapsedTime(&ms[r], e0, e1);                                                  \
        }                                                                                          \
        CUDA_OK(cudaGetLastError());                                                                    \
        qsort(ms, 20, sizeof(float), cmpf);                                                        \
        const double us = 500.0 * (ms[9] + ms[10]);                                                \
        printf("%-34s median %8.1f us  min %8.1f us  %8.1f %s\n", label, us, 1000.0 * ms[0],       \
               (bytes_or_flops) / (us * 1e3), unit);                                               \
    } while (0)

static double max_rel(const float *a, const float *ref, const float *pq, const float *pk) {
    /* |a - ref| / sum_d |q_d k_d| over the causal entries of head 0 and 31 */
    double worst = 0;
    for (int hh = 0; hh < H; hh += 31)
        for (int i = 0; i < NB; i += 7)
            for (int j = 0; j <= i; j += 3) {
                double s = 0;
                for (int d = 0; d < D; ++d)
                    s += fabs((double)pq[((int64_t)hh * NB + i) * D + d] * pk[((int64_t)hh * NB + j) * D + d]);
                const int64_t at = ((int64_t)hh * NB + i) * NB + j;
                const double r = fabs((double)a[at] - (double)ref[at]) / (s + 1e-30);
                if (r > worst) worst = r;
            }
    return worst;
}

int main(void) {
    cudaDeviceProp prop;
    CUDA_OK(cudaGetDeviceProperties(&prop, 0));
    printf("%s, %d SMs\n", prop.name, prop.multiProcessorCount);
    const int64_t nx = (int64_t)S * H * D;
    uint16_t *x;
    CUDA_OK(cudaMalloc(&x, nx * 2));
    {
        uint16_t *h = (uint16_t *)malloc(nx * 2);
        uint64_t s = 88172645463325252ull;
        for (int64_t i = 0; i < nx; i += 4) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            for (int e = 0; e < 4; ++e) {
                const uint16_t r = (uint16_t)(s >> (16 * e));
                h[i + e] = (uint16_t)((r & 0x807f) | 0x3f00); /* +-[0.5, 1) */
            }
        }
        CUDA_OK(cudaMemcpy(x, h, nx * 2, cudaMemcpyHostToDevice));
        free(h);
    }
    float *pooled, *sink;
    CUDA_OK(cudaMalloc(&pooled, (int64_t)H * NB * D * 4));
    CUDA_OK(cudaMalloc(&sink, 16));
    const double bytes = (double)nx * 2;
    dim3 pg(NB, H * D / 8 / 256);
    TIME("pool P8 (256 thr, 4 CTA/SM)", bytes, "GB/s", (pool_kernel<8, 4><<<pg, 256>>>(x, pooled)));
    TIME("pool P16 (256 thr, 2 CTA/SM)", bytes, "GB/s", (pool_kernel<16, 2><<<pg, 256>>>(x, pooled)));
    TIME("read roofline (16B loads)", bytes, "GB/s",
         (read_roofline<<<prop.multiProcessorCount * 8, 512>>>((const uint4 *)x, nx / 8, sink)));
    TIME("cudaMemcpy D2D 1 GiB (r+w)", 2 * bytes, "GB/s",
         CUDA_OK(cudaMemcpy(x + nx / 2, x, nx, cudaMemcpyDeviceToDevice)));

    /* scoring: random pooled values */
    const int64_t np = (int64_t)H * NB * D, ns = (int64_t)H * NB * NB;
    float *hq = (float *)malloc(np * 4), *hk = (float *)malloc(np * 4);
    uint64_t s = 12345;
    for (int64_t i = 0; i < np; ++i) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        hq[i] = (float)((double)(s >> 11) * 0x1.0p-53 - 0.5);
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        hk[i] = (float)((double)(s >> 11) * 0x1.0p-53 - 0.5);
    }
    float *pq, *pk, *sc, *sc_ref;
    CUDA_OK(cudaMalloc(&pq, np * 4));
    CUDA_OK(cudaMalloc(&pk, np * 4));
    CUDA_OK(cudaMalloc(&sc, ns * 4));
    CUDA_OK(cudaMalloc(&sc_ref, ns * 4));
    CUDA_OK(cudaMemcpy(pq, hq, np * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(pk, hk, np * 4, cudaMemcpyHostToDevice));
    const double flops = 2.0 * D * (double)H * (NB * (double)NB / 2 + NB * 64); /* causal tiles */
    TIME("score S1 SIMT fp32 128x128", flops, "GFLOP/s", (score_simt<<<H * 64, 256>>>(pq, pk, sc_ref)));
    float *a = (float *)malloc(ns * 4), *ref = (float *)malloc(ns * 4);
    CUDA_OK(cudaMemcpy(ref, sc_ref, ns * 4, cudaMemcpyDeviceToHost));
    TIME("score S2 WMMA 3xTF32 KC16", flops, "GFLOP/s", (score_wmma<16, 1, 2><<<H * 128, 256>>>(pq, pk, sc)));
    CUDA_OK(cudaMemcpy(a, sc, ns * 4, cudaMemcpyDeviceToHost));
    printf("    S2 max |diff| / sum|terms| vs S1: %.3g\n", max_rel(a, ref, hq, hk));
    TIME("score S3 WMMA 1xTF32 KC16", flops, "GFLOP/s", (score_wmma<16, 0, 2><<<H * 128, 256>>>(pq, pk, sc)));
    CUDA_OK(cudaMemcpy(a, sc, ns * 4, cudaMemcpyDeviceToHost));
    printf("    S3 max |diff| / sum|terms| vs S1: %.3g\n", max_rel(a, ref, hq, hk));
    TIME("score S4 WMMA 3xTF32 KC32", flops, "GFLOP/s", (score_wmma<32, 1, 1><<<H * 128, 256>>>(pq, pk, sc)));
    CUDA_OK(cudaMemcpy(a, sc, ns * 4, cudaMemcpyDeviceToHost));
    printf("    S4 max |diff| / sum|terms| vs S1: %.3g\n", max_rel(a, ref, hq, hk));
    TIME("score write-only roofline (memset)", (double)ns * 4 / 2, "GB/s",
         CUDA_OK(cudaMemsetAsync(sc, 0, ns * 4 / 2)));
    return 0;
}
