/*
 * cp_bwd.cu - the CUDA pieces of a context-parallel rank's backward besides
 * its attention-backward passes (src/core/cp_backward_cuda.c orchestrates):
 * the LSE rows of a chunk packed, the fp32 sums of the passes' partial
 * gradients with the final rounding, and the pack / add of the gradient
 * units returned to their owners.
 *
 * All are element-wise or copies at HBM speed. Sums run in a fixed order
 * (the caller's launch order; one thread per element within a launch), so
 * the run is bitwise repeatable; no atomics.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "core/cp_plan.h"
#include "cuda/backend.h"
#include "cuda/common/cuda_check.cuh"
#include "cuda/cp/convert.cuh"

enum { kThreads = 256, kUnitThreads = 128, kMaxGrid = 1 << 20 };

static unsigned grid_for(int64_t work, int threads) {
    const int64_t g = (work + threads - 1) / threads;
    return (unsigned)(g < 1 ? 1 : g < kMaxGrid ? g : kMaxGrid);
}

/* ---- LSE rows ------------------------------------------------------------ */

__global__ void __launch_bounds__(kThreads) sk_cp_rows_kernel(sk_cp_rows_problem p) {
    const int64_t total = p.rows * p.tokens;
    for (int64_t i = (int64_t)blockIdx.x * kThreads + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * kThreads) {
        const int64_t t = i % p.tokens, row = i / p.tokens;
        p.dst[row * p.dst_seq + p.dst_start + t] = p.src[row * p.src_seq + p.src_start + t];
    }
}

extern "C" sk_status sk_cuda_cp_rows(const sk_cp_rows_problem *p, struct CUstream_st *stream) {
    if (p->rows * p->tokens == 0) return SK_STATUS_SUCCESS;
    sk_cp_rows_kernel<<<grid_for(p->rows * p->tokens, kThreads), kThreads, 0, stream>>>(*p);
    return sk_cuda_status(cudaGetLastError(), "the LSE rows kernel");
}

/* ---- sums ---------------------------------------------------------------- */

/* One thread per 8 elements (16 bytes of the dtype, 32 of fp32). */
template <typename T>
__global__ void __launch_bounds__(kThreads) sk_cp_sum_kernel(sk_cp_sum_problem p) {
    const int64_t vecs = p.n / 8;
    for (int64_t i = (int64_t)blockIdx.x * kThreads + threadIdx.x; i < vecs;
         i += (int64_t)gridDim.x * kThreads) {
        float x[8];
        if (p.src32 != NULL) {
            const float4 lo = ((const float4 *)p.src32)[2 * i],
                         hi = ((const float4 *)p.src32)[2 * i + 1];
            x[0] = lo.x, x[1] = lo.y, x[2] = lo.z, x[3] = lo.w;
            x[4] = hi.x, x[5] = hi.y, x[6] = hi.z, x[7] = hi.w;
        } else {
            const uint4 ra = ((const uint4 *)p.a)[i];
            const T *ea = (const T *)&ra;
#pragma unroll
            for (int e = 0; e < 8; ++e) x[e] = sk_cp_to_f32<T>(ea[e]);
        }
        if (p.b != NULL) {
            const uint4 rb = ((const uint4 *)p.b)[i];
            const T *eb = (const T *)&rb;
#pragma unroll
            for (int e = 0; e < 8; ++e) x[e] += sk_cp_to_f32<T>(eb[e]);
        }
        if (p.out != NULL) {
            uint4 ro;
            T *eo = (T *)&ro;
#pragma unroll
            for (int e = 0; e < 8; ++e) eo[e] = sk_cp_from_f32<T>(x[e]);
            ((uint4 *)p.out)[i] = ro;
        } else {
            ((float4 *)p.dst32)[2 * i] = make_float4(x[0], x[1], x[2], x[3]);
            ((float4 *)p.dst32)[2 * i + 1] = make_float4(x[4], x[5], x[6], x[7]);
        }
    }
}

extern "C" sk_status sk_cuda_cp_sum(const sk_cp_sum_problem *p, struct CUstream_st *stream) {
    if (p->n == 0) return SK_STATUS_SUCCESS;
    const unsigned g = grid_for(p->n / 8, kThreads);
    if (p->dtype == SK_DTYPE_BF16)
        sk_cp_sum_kernel<__nv_bfloat16><<<g, kThreads, 0, stream>>>(*p);
    else
        sk_cp_sum_kernel<__half><<<g, kThreads, 0, stream>>>(*p);
    return sk_cuda_status(cudaGetLastError(), "the gradient sum kernel");
}

/* ---- gradient units ------------------------------------------------------ */

/* One CTA per (unit, dK or dV), one thread per 8 elements of its rows. */
template <typename T>
__global__ void __launch_bounds__(kUnitThreads) sk_cp_grad_kernel(sk_cp_grad_problem p) {
    const int64_t u = blockIdx.x;
    const int is_v = blockIdx.y;
    const sk_cp_unit x = ((const sk_cp_unit *)p.units)[u];
    const int32_t tokens = u < p.full ? p.block : p.tail;
    /* Packed offset in floats: the full units before u, then the tail ones
     * (as sk_cp_copy_kernel's, rows of dim floats). */
    const int64_t full_before = u < p.full ? u : p.full;
    const int64_t off = full_before * 2 * (int64_t)p.block * p.dim +
                        (u - full_before) * 2 * (int64_t)p.tail * p.dim +
                        (int64_t)is_v * tokens * p.dim;
    int64_t t0;
    if (p.add) {
        const int c = p.chunks > 1 && x.block >= p.chunk_block[1] ? 1 : 0;
        t0 = p.chunk_token[c] + (int64_t)(x.block - p.chunk_block[c]) * p.block;
    } else {
        t0 = (int64_t)x.slot * p.block;
    }
    const int64_t first = (((int64_t)x.batch * p.seq + t0) * p.heads_kv + x.head) * p.dim;
    const int64_t row_stride = p.heads_kv * p.dim;
    const int32_t vecs = p.dim / 8;
    float *packed = p.packed + off;
    for (int32_t i = threadIdx.x; i < tokens * vecs; i += kUnitThreads) {
        const int32_t t = i / vecs, w = i - t * vecs;
        const int64_t side = first + t * row_stride + w * 8;
        float4 *q = (float4 *)(packed + (int64_t)t * p.dim + w * 8);
        if (p.add) {
            float4 *acc = (float4 *)((is_v ? p.acc_v : p.acc_k) + side);
            const float4 a0 = q[0], a1 = q[1];
            float4 s0 = acc[0], s1 = acc[1];
            s0.x += a0.x, s0.y += a0.y, s0.z += a0.z, s0.w += a0.w;
            s1.x += a1.x, s1.y += a1.y, s1.z += a1.z, s1.w += a1.w;
            acc[0] = s0, acc[1] = s1;
        } else {
            float v[8];
            const T *src0 = (const T *)(is_v ? p.dv[0] : p.dk[0]);
            const T *src1 = (const T *)(is_v ? p.dv[1] : p.dk[1]);
            const uint4 r0 = *(const uint4 *)(src0 + side);
            const T *e0 = (const T *)&r0;
#pragma unroll
            for (int e = 0; e < 8; ++e) v[e] = sk_cp_to_f32<T>(e0[e]);
            if (src1 != NULL) {
                const uint4 r1 = *(const uint4 *)(src1 + side);
                const T *e1 = (const T *)&r1;
#pragma unroll
                for (int e = 0; e < 8; ++e) v[e] += sk_cp_to_f32<T>(e1[e]);
            }
            q[0] = make_float4(v[0], v[1], v[2], v[3]);
            q[1] = make_float4(v[4], v[5], v[6], v[7]);
        }
    }
}

extern "C" sk_status sk_cuda_cp_grad_units(const sk_cp_grad_problem *p,
                                           struct CUstream_st *stream) {
    if (p->count == 0) return SK_STATUS_SUCCESS;
    const dim3 grid((unsigned)p->count, 2);
    if (p->dtype == SK_DTYPE_BF16)
        sk_cp_grad_kernel<__nv_bfloat16><<<grid, kUnitThreads, 0, stream>>>(*p);
    else
        sk_cp_grad_kernel<__half><<<grid, kUnitThreads, 0, stream>>>(*p);
    return sk_cuda_status(cudaGetLastError(),
                          p->add ? "the gradient add kernel" : "the gradient pack kernel");
}

extern "C" sk_status sk_cuda_cp_zero(void *ptr, size_t bytes, struct CUstream_st *stream) {
    if (bytes == 0) return SK_STATUS_SUCCESS;
    return sk_cuda_status(cudaMemsetAsync(ptr, 0, bytes, stream), "cudaMemsetAsync (gradients)");
}
