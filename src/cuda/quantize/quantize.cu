/*
 * quantize.cu - sk_quantize_e4m3 on the GPU: bf16 / fp16 [B, S, H, D] to
 * e4m3 codes with one fp32 scale per (batch, head) (sparsek.h, "FP8
 * quantization"; the CPU twin is src/cpu/fp8.c, which gives the same bytes).
 *
 * Two kernels on the stream, after a memset of the workspace:
 *   1. amax: each CTA reduces |x| over a chunk of kChunkRows rows of one
 *      (b, h) and raises the workspace word of that (b, h) with atomicMax
 *      on the fp32 bits (non-negative floats order like their bits; fmaxf
 *      drops NaN). The maximum does not depend on the order: deterministic.
 *   2. convert: the same chunks; every thread turns the (b, h) maximum into
 *      inv = 448 / amax (one fp32 division, as the CPU) and writes 8 codes
 *      per 16-byte vector of x (x * inv rounded to fp32, then cvt RNE with
 *      saturation); the first CTA of each (b, h) writes its descale.
 * Work items are (b, h, chunk) in one grid-stride loop (the count may pass
 * the grid limit). SK_QUANT_LAYOUT_VT_FP8 replaces kernel 2 with
 * sk_quant_convert_vt_kernel (V^T in the FP8 kernel's key order).
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include "core/fp8_vt.h"
#include "cuda/backend.h"
#include "cuda/common/cuda_check.cuh"

enum { kQThreads = 256, kChunkRows = 32, kMaxGrid = 65535 * 8 };

struct sk_quant_params {
    const void *x;
    uint8_t *y;
    float *descale;
    uint32_t *amax; /* [B * H] fp32 bits, zeroed before kernel 1 */
    int64_t xs0, xs1, xs2;
    int64_t seq, heads, dim, chunks, items; /* items = B * H * chunks */
    int bf16;
};

/* Eight elements of x at element offset `off` (16-byte aligned), as fp32. */
__device__ __forceinline__ void sk_quant_load8(const sk_quant_params &p, int64_t off, float v[8]) {
    const uint4 raw = __ldg((const uint4 *)((const uint16_t *)p.x + off));
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        if (p.bf16) {
            const __nv_bfloat162 h = *(const __nv_bfloat162 *)&w[i];
            v[2 * i] = __bfloat162float(h.x);
            v[2 * i + 1] = __bfloat162float(h.y);
        } else {
            const __half2 h = *(const __half2 *)&w[i];
            v[2 * i] = __half2float(h.x);
            v[2 * i + 1] = __half2float(h.y);
        }
    }
}

/* Element offset of vector `vec` of the chunk's rows; false past S. */
__device__ __forceinline__ bool sk_quant_vector(const sk_quant_params &p, int64_t item, int64_t vec,
                                                int64_t *x_off, int64_t *y_off, int64_t *bh) {
    const int64_t per_row = p.dim / 8;
    const int64_t chunk = item % p.chunks;
    *bh = item / p.chunks;
    const int64_t b = *bh / p.heads, h = *bh % p.heads;
    const int64_t s = chunk * kChunkRows + vec / per_row;
    const int64_t d = (vec % per_row) * 8;
    if (s >= p.seq) return false;
    *x_off = b * p.xs0 + s * p.xs1 + h * p.xs2 + d;
    *y_off = ((b * p.seq + s) * p.heads + h) * p.dim + d;
    return true;
}

__global__ void __launch_bounds__(kQThreads) sk_quant_amax_kernel(const sk_quant_params p) {
    __shared__ float warp_max[kQThreads / 32];
    const int64_t vecs = (int64_t)kChunkRows * (p.dim / 8);
    for (int64_t item = blockIdx.x; item < p.items; item += gridDim.x) {
        float m = 0.0f;
        int64_t bh = 0;
        for (int64_t vec = threadIdx.x; vec < vecs; vec += kQThreads) {
            int64_t xo, yo;
            if (!sk_quant_vector(p, item, vec, &xo, &yo, &bh)) break;
            float v[8];
            sk_quant_load8(p, xo, v);
#pragma unroll
            for (int i = 0; i < 8; ++i) m = fmaxf(m, fabsf(v[i]));
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int w = 1; w < kQThreads / 32; ++w) m = fmaxf(m, warp_max[w]);
            atomicMax(p.amax + item / p.chunks, __float_as_uint(m));
        }
        __syncthreads(); /* warp_max is reused by the next item */
    }
}

/* The (b, h) scale rule, one place for both convert kernels (and the same
 * as the CPU's, byte for byte): codes are x * (448 / amax) rounded;
 * descale = amax / 448, 1 when amax is 0 or not finite. The caller that
 * owns the (b, h)'s first item writes its descale. */
__device__ __forceinline__ float sk_quant_inv_scale(const sk_quant_params &p, int64_t bh,
                                                    bool write_descale) {
    const float amax = __uint_as_float(__ldg(p.amax + bh));
    const bool scaled = amax > 0.0f && isfinite(amax);
    if (write_descale && threadIdx.x == 0) p.descale[bh] = scaled ? __fdiv_rn(amax, 448.0f) : 1.0f;
    return scaled ? __fdiv_rn(448.0f, amax) : 1.0f;
}

__global__ void __launch_bounds__(kQThreads) sk_quant_convert_kernel(const sk_quant_params p) {
    const int64_t vecs = (int64_t)kChunkRows * (p.dim / 8);
    for (int64_t item = blockIdx.x; item < p.items; item += gridDim.x) {
        const int64_t bh = item / p.chunks;
        const float inv = sk_quant_inv_scale(p, bh, item % p.chunks == 0);
        for (int64_t vec = threadIdx.x; vec < vecs; vec += kQThreads) {
            int64_t xo, yo, unused;
            if (!sk_quant_vector(p, item, vec, &xo, &yo, &unused)) break;
            float v[8];
            sk_quant_load8(p, xo, v);
            uint32_t w[2] = {0, 0};
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const float2 pair = make_float2(__fmul_rn(v[2 * i], inv), __fmul_rn(v[2 * i + 1], inv));
                /* .x becomes the low byte: element order is kept. */
                const uint32_t two =
                    (uint32_t)__nv_cvt_float2_to_fp8x2(pair, __NV_SATFINITE, __NV_E4M3);
                w[i / 2] |= two << (16 * (i % 2));
            }
            *(uint2 *)(p.y + yo) = make_uint2(w[0], w[1]);
        }
    }
}

/* SK_QUANT_LAYOUT_VT_FP8 (core/fp8_vt.h): items are (b, h, 32-key chunk)
 * over S_pad (chunks past S write zeros). In a chunk, thread v takes the
 * four keys 16 kh + 2 t + {0, 1, 8, 9} (kh = (v / 4) % 2, t = v % 4), which
 * the layout stores at columns 16 kh + 4 t .. + 3 in that order, for the 8
 * dims of one x vector (v / 8): 4 vector loads, 8 four-byte stores, one
 * per dim row. Same arithmetic per element as the rows kernel. */
__global__ void __launch_bounds__(kQThreads) sk_quant_convert_vt_kernel(const sk_quant_params p,
                                                                        int64_t vt_chunks,
                                                                        int64_t pad) {
    const int64_t vt_items = p.items / p.chunks * vt_chunks;
    for (int64_t item = blockIdx.x; item < vt_items; item += gridDim.x) {
        const int64_t bh = item / vt_chunks, chunk = item % vt_chunks;
        const int64_t b = bh / p.heads, h = bh % p.heads;
        const float inv = sk_quant_inv_scale(p, bh, chunk == 0);
        for (int64_t v = threadIdx.x; v < p.dim; v += kQThreads) {
            const int kh = (int)(v / 4) % 2, t = (int)v % 4;
            const int64_t d0 = (v / 8) * 8;
            const int64_t s0 = chunk * 32 + 16 * kh + 2 * t;
            const int64_t keys[4] = {s0, s0 + 1, s0 + 8, s0 + 9};
            uint32_t w[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                if (keys[i] >= p.seq) continue; /* padding: code 0 */
                float x[8];
                sk_quant_load8(p, b * p.xs0 + keys[i] * p.xs1 + h * p.xs2 + d0, x);
#pragma unroll
                for (int e = 0; e < 8; ++e) {
                    const uint32_t code = (uint32_t)__nv_cvt_float_to_fp8(
                        __fmul_rn(x[e], inv), __NV_SATFINITE, __NV_E4M3);
                    w[e] |= code << (8 * i);
                }
            }
            uint8_t *row = p.y + (bh * p.dim + d0) * pad + chunk * 32 + 16 * kh + 4 * t;
#pragma unroll
            for (int e = 0; e < 8; ++e) *(uint32_t *)(row + e * pad) = w[e];
        }
    }
}

static int64_t sk_quant_chunks(const sk_quantize_problem *p) {
    return (p->seq + kChunkRows - 1) / kChunkRows;
}

extern "C" sk_status sk_cuda_quantize_e4m3_workspace_size(const sk_quantize_problem *p,
                                                          size_t *bytes) {
    /* B x H < 2^31 words, rounded up to 16 bytes. */
    *bytes = (size_t)((p->batch * p->heads * 4 + 15) / 16 * 16);
    return SK_STATUS_SUCCESS;
}

extern "C" sk_status sk_cuda_quantize_e4m3(const sk_quantize_problem *p, void *workspace,
                                           size_t workspace_size, cudaStream_t stream) {
    int hopper = 0;
    SK_TRY(sk_cuda_check_arch(p->backend, &hopper));
    size_t need;
    SK_TRY(sk_cuda_quantize_e4m3_workspace_size(p, &need));
    if (workspace == NULL || workspace_size < need)
        return sk_error(SK_STATUS_BAD_PARAM_WORKSPACE,
                        "workspace (%zu bytes at %p) is smaller than the %zu bytes "
                        "sk_quantize_e4m3_workspace_size gives",
                        workspace_size, workspace, need);
    if (((uintptr_t)workspace & 15) != 0)
        return sk_error(SK_STATUS_BAD_PARAM_ALIGNMENT, "workspace %p is not 16-byte aligned",
                        workspace);
    sk_quant_params prm;
    prm.x = p->x;
    prm.y = p->y;
    prm.descale = p->descale;
    prm.amax = (uint32_t *)workspace;
    prm.xs0 = p->x_stride[0];
    prm.xs1 = p->x_stride[1];
    prm.xs2 = p->x_stride[2];
    prm.seq = p->seq;
    prm.heads = p->heads;
    prm.dim = p->head_dim;
    prm.chunks = sk_quant_chunks(p);
    prm.items = p->batch * p->heads * prm.chunks;
    prm.bf16 = p->dtype == SK_DTYPE_BF16;
    const int grid = (int)(prm.items < kMaxGrid ? prm.items : kMaxGrid);
    SK_CUDA_TRY(cudaMemsetAsync(workspace, 0, (size_t)(p->batch * p->heads * 4), stream),
                "cudaMemsetAsync (quantize amax)");
    sk_quant_amax_kernel<<<grid, kQThreads, 0, stream>>>(prm);
    SK_CUDA_TRY(cudaGetLastError(), "quantize amax kernel launch");
    if (p->layout == SK_QUANT_LAYOUT_VT_FP8) {
        const int64_t pad = sk_vt_seq_pad(p->seq), vt_chunks = pad / 32;
        const int64_t vt_items = p->batch * p->heads * vt_chunks;
        const int vt_grid = (int)(vt_items < kMaxGrid ? vt_items : kMaxGrid);
        sk_quant_convert_vt_kernel<<<vt_grid, kQThreads, 0, stream>>>(prm, vt_chunks, pad);
        return sk_cuda_status(cudaGetLastError(), "quantize convert (VT_FP8) kernel launch");
    }
    sk_quant_convert_kernel<<<grid, kQThreads, 0, stream>>>(prm);
    return sk_cuda_status(cudaGetLastError(), "quantize convert kernel launch");
}
