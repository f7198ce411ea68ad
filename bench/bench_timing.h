/*
 * bench_timing.h - what the attention timing programs (attention_bwd_speed.c,
 * attention_fp8_speed.c) share: device inputs from a repeated pattern, and
 * the median / minimum of CUDA-event-timed calls. Include after
 * bench_check.h (CUDA_OK) and <cuda_runtime_api.h>.
 */
#ifndef SK_BENCH_TIMING_H
#define SK_BENCH_TIMING_H

#include <stdint.h>
#include <stdlib.h>

enum { BENCH_MAX_REPS = 100 };

/* n 2-byte elements at dst: the device pattern of pattern_elems from element
 * `shift` on, repeated, so that tensors filled with different shifts differ. */
static inline void bench_fill_pattern(void *dst, const void *pattern, int64_t pattern_elems,
                                      int64_t n, int64_t shift) {
    const int64_t period = pattern_elems - shift;
    for (int64_t off = 0; off < n; off += period) {
        const int64_t len = n - off < period ? n - off : period;
        CUDA_OK(cudaMemcpy((char *)dst + off * 2, (const char *)pattern + shift * 2,
                           (size_t)len * 2, cudaMemcpyDeviceToDevice));
    }
}

static inline int bench_cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* call(ctx) `warmup` times, then `reps` (1 .. BENCH_MAX_REPS) times between
 * two events on the default stream: the median and the minimum in ms. */
static inline void bench_time(void (*call)(const void *ctx), const void *ctx, int warmup, int reps,
                              float *median, float *best) {
    float ms[BENCH_MAX_REPS];
    cudaEvent_t e0, e1;
    CUDA_OK(cudaEventCreate(&e0));
    CUDA_OK(cudaEventCreate(&e1));
    for (int r = 0; r < warmup; ++r) call(ctx);
    for (int r = 0; r < reps; ++r) {
        CUDA_OK(cudaEventRecord(e0, NULL));
        call(ctx);
        CUDA_OK(cudaEventRecord(e1, NULL));
        CUDA_OK(cudaEventSynchronize(e1));
        CUDA_OK(cudaEventElapsedTime(&ms[r], e0, e1));
    }
    qsort(ms, (size_t)reps, sizeof ms[0], bench_cmp_float);
    *median = ms[reps / 2];
    *best = ms[0];
    CUDA_OK(cudaEventDestroy(e0));
    CUDA_OK(cudaEventDestroy(e1));
}

#endif /* SK_BENCH_TIMING_H */
