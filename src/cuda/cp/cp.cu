/*
 * cp.cu - the CUDA pieces of a context-parallel rank besides its attention
 * passes (src/core/cp_run_cuda.c orchestrates; docs/perf/
 * context_parallel.md): the side stream and events of a device
 * communicator, the gather / scatter of exchange units, and the LSE merge
 * of the two partial attentions.
 *
 * Every kernel here is a copy or an element-wise pass at HBM speed; their
 * bytes are the exchange's (pack, unpack) and three passes over the
 * shard's O (merge), small next to the attention.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "core/cp_plan.h"
#include "cuda/backend.h"
#include "cuda/common/cuda_check.cuh"
#include "cuda/cp/convert.cuh"

enum { kCopyThreads = 128, kMergeThreads = 256, kMaxGrid = 1 << 20 };

/* ---- side stream and events ------------------------------------------- */

struct sk_cp_streams {
    cudaStream_t side;
    cudaEvent_t fork, join;
};

extern "C" sk_status sk_cuda_cp_streams_create(void **out) {
    int device = 0, major = 0, minor = 0;
    SK_TRY(sk_cuda_current_cc(&device, &major, &minor));
    sk_cp_streams *s = (sk_cp_streams *)calloc(1, sizeof *s);
    if (s == NULL) return sk_error(SK_STATUS_ALLOC_FAILED, "the communicator's stream record");
    /* The highest priority: the exchange's kernels (packing, NCCL's) are
     * dispatched before the attention's persistent CTAs take every SM. */
    int least = 0, greatest = 0;
    cudaError_t err = cudaDeviceGetStreamPriorityRange(&least, &greatest);
    if (err == cudaSuccess)
        err = cudaStreamCreateWithPriority(&s->side, cudaStreamNonBlocking, greatest);
    if (err == cudaSuccess) err = cudaEventCreateWithFlags(&s->fork, cudaEventDisableTiming);
    if (err == cudaSuccess) err = cudaEventCreateWithFlags(&s->join, cudaEventDisableTiming);
    if (err != cudaSuccess) {
        sk_cuda_cp_streams_destroy(s);
        return sk_cuda_status(err, "the communicator's side stream and events");
    }
    *out = s;
    return SK_STATUS_SUCCESS;
}

extern "C" void sk_cuda_cp_streams_destroy(void *streams) {
    sk_cp_streams *s = (sk_cp_streams *)streams;
    if (s == NULL) return;
    if (s->join) cudaEventDestroy(s->join);
    if (s->fork) cudaEventDestroy(s->fork);
    if (s->side) cudaStreamDestroy(s->side);
    free(s);
}

extern "C" sk_status sk_cuda_cp_fork(void *streams, struct CUstream_st *stream,
                                     struct CUstream_st **side) {
    sk_cp_streams *s = (sk_cp_streams *)streams;
    SK_CUDA_TRY(cudaEventRecord(s->fork, stream), "cudaEventRecord (fork)");
    SK_CUDA_TRY(cudaStreamWaitEvent(s->side, s->fork, 0), "cudaStreamWaitEvent (fork)");
    *side = s->side;
    return SK_STATUS_SUCCESS;
}

extern "C" sk_status sk_cuda_cp_join(void *streams, struct CUstream_st *stream) {
    sk_cp_streams *s = (sk_cp_streams *)streams;
    SK_CUDA_TRY(cudaEventRecord(s->join, s->side), "cudaEventRecord (join)");
    SK_CUDA_TRY(cudaStreamWaitEvent(stream, s->join, 0), "cudaStreamWaitEvent (join)");
    return SK_STATUS_SUCCESS;
}

extern "C" sk_status sk_cuda_copy_async(void *dst, const void *src, size_t bytes,
                                        struct CUstream_st *stream) {
    if (bytes == 0) return SK_STATUS_SUCCESS;
    return sk_cuda_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream),
                          "cudaMemcpyAsync");
}

extern "C" sk_status sk_cuda_stream_sync(struct CUstream_st *stream) {
    return sk_cuda_status(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

/* ---- pack / unpack ------------------------------------------------------ */

/* One CTA per (unit, K or V): its rows, 16-byte vectors, between the
 * packed stream and the strided [B, seq, Hkv, D] side. */
__global__ void __launch_bounds__(kCopyThreads) sk_cp_copy_kernel(sk_cp_copy_problem p) {
    const int64_t u = blockIdx.x;
    const int is_v = blockIdx.y;
    const sk_cp_unit x = ((const sk_cp_unit *)p.units)[u];
    const int32_t tokens = u < p.full ? p.block : p.tail;
    /* Packed offset: the full units before u, then the tail ones. */
    const int64_t full_before = u < p.full ? u : p.full;
    const int64_t unit_bytes = 2 * (int64_t)p.block * p.row_bytes;
    int64_t packed_off = full_before * unit_bytes +
                         (u - full_before) * 2 * (int64_t)p.tail * p.row_bytes +
                         (int64_t)is_v * tokens * p.row_bytes;
    int64_t t0;
    if (p.unpack) {
        t0 = (int64_t)x.slot * p.block;
    } else {
        const int c = p.chunks > 1 && x.block >= p.chunk_block[1] ? 1 : 0;
        t0 = p.chunk_token[c] + (int64_t)(x.block - p.chunk_block[c]) * p.block;
    }
    char *side = (char *)(is_v ? p.v : p.k);
    const int32_t vecs = p.row_bytes / 16;
    const int64_t row_stride = p.heads_kv * p.row_bytes;
    const int64_t first = (((int64_t)x.batch * p.seq + t0) * p.heads_kv + x.head) * p.row_bytes;
    char *packed = (char *)p.packed + packed_off;
    for (int32_t i = threadIdx.x; i < tokens * vecs; i += kCopyThreads) {
        const int32_t t = i / vecs, w = i - t * vecs;
        uint4 *s = (uint4 *)(side + first + t * row_stride) + w;
        uint4 *q = (uint4 *)(packed + (int64_t)t * p.row_bytes) + w;
        if (p.unpack)
            *s = *q;
        else
            *q = *s;
    }
}

extern "C" sk_status sk_cuda_cp_copy_units(const sk_cp_copy_problem *p,
                                           struct CUstream_st *stream) {
    if (p->count == 0) return SK_STATUS_SUCCESS;
    const dim3 grid((unsigned)p->count, 2);
    sk_cp_copy_kernel<<<grid, kCopyThreads, 0, stream>>>(*p);
    return sk_cuda_status(cudaGetLastError(), p->unpack ? "the unpack kernel" : "the pack kernel");
}

/* ---- LSE merge ----------------------------------------------------------- */

/* One thread per 8 elements of one (b, t, h) row: consecutive threads
 * walk O in memory order (measured faster than a CTA per (b, h) and run of
 * tokens, whose coalesced LSE loads cost O rows 8 KB apart: 3.19 ms
 * against 2.55 ms for a 2 GB chunk on an H200). */
template <typename T>
__global__ void __launch_bounds__(kMergeThreads) sk_cp_merge_kernel(sk_cp_merge_problem p) {
    const int64_t vecs = p.dim / 8;
    const int64_t total = p.batch * p.tokens * p.heads * vecs;
    for (int64_t i = (int64_t)blockIdx.x * kMergeThreads + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * kMergeThreads) {
        const int64_t w = i % vecs, row = i / vecs; /* row = (b * tokens + t) * H + h */
        const int64_t h = row % p.heads, bt = row / p.heads;
        const int64_t t = bt % p.tokens, b = bt / p.tokens;
        const int64_t li = (b * p.heads + h) * p.tokens + t;
        const float la = p.lse_a[li], lb = p.lse_b[li];
        const float m = fmaxf(la, lb);
        T *o = (T *)p.o + ((b * p.o_seq + p.o_start + t) * p.heads + h) * p.dim + w * 8;
        const T *ob = (const T *)p.o_b + row * p.dim + w * 8;
        float lse;
        if (m == -INFINITY) { /* no admissible key on either side */
#pragma unroll
            for (int e = 0; e < 8; ++e) o[e] = sk_cp_from_f32<T>(0.0f);
            lse = -INFINITY;
        } else {
            const float wa = expf(la - m), wb = expf(lb - m), sum = wa + wb;
            uint4 ra = *(const uint4 *)o;
            const uint4 rb = *(const uint4 *)ob;
            T *ea = (T *)&ra;
            const T *eb = (const T *)&rb;
#pragma unroll
            for (int e = 0; e < 8; ++e)
                ea[e] = sk_cp_from_f32<T>(
                    (wa * sk_cp_to_f32<T>(ea[e]) + wb * sk_cp_to_f32<T>(eb[e])) / sum);
            *(uint4 *)o = ra;
            lse = m + logf(sum);
        }
        if (p.lse != NULL && w == 0) p.lse[(b * p.heads + h) * p.o_seq + p.o_start + t] = lse;
    }
}

/* Part a alone: o stays; lse_a is copied to lse's rows. */
__global__ void __launch_bounds__(kMergeThreads) sk_cp_lse_copy_kernel(sk_cp_merge_problem p) {
    const int64_t total = p.batch * p.heads * p.tokens;
    for (int64_t i = (int64_t)blockIdx.x * kMergeThreads + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * kMergeThreads) {
        const int64_t t = i % p.tokens, bh = i / p.tokens;
        p.lse[bh * p.o_seq + p.o_start + t] = p.lse_a[i];
    }
}

extern "C" sk_status sk_cuda_cp_merge(const sk_cp_merge_problem *p, struct CUstream_st *stream) {
    if (p->o_b == NULL) {
        if (p->lse == NULL) return SK_STATUS_SUCCESS;
        const int64_t n = p->batch * p->heads * p->tokens;
        const int64_t grid = (n + kMergeThreads - 1) / kMergeThreads;
        sk_cp_lse_copy_kernel<<<(unsigned)(grid < kMaxGrid ? grid : kMaxGrid), kMergeThreads, 0,
                                stream>>>(*p);
        return sk_cuda_status(cudaGetLastError(), "the LSE copy kernel");
    }
    const int64_t n = p->batch * p->tokens * p->heads * (p->dim / 8);
    const int64_t grid = (n + kMergeThreads - 1) / kMergeThreads;
    const unsigned g = (unsigned)(grid < kMaxGrid ? grid : kMaxGrid);
    if (p->dtype == SK_DTYPE_BF16)
        sk_cp_merge_kernel<__nv_bfloat16><<<g, kMergeThreads, 0, stream>>>(*p);
    else
        sk_cp_merge_kernel<__half><<<g, kMergeThreads, 0, stream>>>(*p);
    return sk_cuda_status(cudaGetLastError(), "the LSE merge kernel");
}
