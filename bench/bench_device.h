/*
 * bench_device.h - device-side helpers of the attention timing programs
 * (attention_bwd_speed.c, varlen_speed.c, varlen_bwd_speed.c): a host
 * layout's arrays copied to the device, the finiteness spot check of an
 * output, the random input pattern on the device. Include after bench_check.h (CUDA_OK),
 * host_data.h (host_load), sparsek.h and <cuda_runtime_api.h>.
 */
#ifndef SK_BENCH_DEVICE_H
#define SK_BENCH_DEVICE_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

/* h's arrays on the device (cudaMalloc'd; free with bench_bsr_free): its
 * batch x heads x ceil(rows / block_rows) + 1 offsets and nnz indices. */
static inline sk_bsr bench_bsr_to_device(const sk_bsr *h) {
    sk_bsr d = *h;
    const int64_t rows = (int64_t)h->grid.batch * h->grid.heads *
                         ((h->grid.rows + h->grid.block_rows - 1) / h->grid.block_rows);
    CUDA_OK(cudaMalloc((void **)&d.row_offsets, (size_t)(rows + 1) * 4));
    CUDA_OK(cudaMalloc((void **)&d.col_indices, (size_t)(h->nnz > 0 ? h->nnz : 1) * 4));
    CUDA_OK(
        cudaMemcpy(d.row_offsets, h->row_offsets, (size_t)(rows + 1) * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d.col_indices, h->col_indices, (size_t)h->nnz * 4, cudaMemcpyHostToDevice));
    return d;
}

static inline void bench_bsr_free(sk_bsr *d) {
    CUDA_OK(cudaFree(d->row_offsets));
    CUDA_OK(cudaFree(d->col_indices));
}

/* Non-finite values among the first min(n, sample) 2-byte elements of a
 * device tensor of `dtype`. */
static inline int64_t bench_non_finite(const void *dev, int64_t n, int64_t sample, sk_dtype dtype) {
    const int64_t m = n < sample ? n : sample;
    uint16_t *h = (uint16_t *)malloc((size_t)m * 2);
    if (h == NULL) return m;
    CUDA_OK(cudaMemcpy(h, dev, (size_t)m * 2, cudaMemcpyDeviceToHost));
    int64_t bad = 0;
    for (int64_t i = 0; i < m; ++i) bad += !isfinite(host_load(h, dtype, i));
    free(h);
    return bad;
}

/* n normal values of dtype (seeded, host_fill_normal) in a new device
 * buffer (cudaMalloc'd); NULL when host memory runs out. */
static inline void *bench_device_pattern(sk_dtype dtype, int64_t n, uint64_t seed) {
    void *h = malloc((size_t)n * 2), *d = NULL;
    if (h == NULL) return NULL;
    host_fill_normal(h, dtype, n, seed, 1);
    CUDA_OK(cudaMalloc(&d, (size_t)n * 2));
    CUDA_OK(cudaMemcpy(d, h, (size_t)n * 2, cudaMemcpyHostToDevice));
    free(h);
    return d;
}

#endif /* SK_BENCH_DEVICE_H */
