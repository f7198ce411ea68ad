/*
 * dots.h - the fp32 dot products of the CPU attention references (forward,
 * attention_ref.c; backward, attention_bwd_ref.c). One definition, so the
 * backward recomputes the forward's scores with exactly its summation order.
 */
#ifndef SK_CPU_DOTS_H
#define SK_CPU_DOTS_H

#include <stdint.h>

/* out[kk] = sum_x a[x] * t[x * ldt + kk] for kk < n, in fp32, each sum in
 * order of x; the inner loop runs over contiguous keys (t is transposed). */
static inline void sk_cpu_dots_f32(float *out, const float *a, const float *t, int64_t ldt,
                                   int64_t dim, int64_t n) {
    for (int64_t kk = 0; kk < n; ++kk) out[kk] = 0.0f;
    for (int64_t x = 0; x < dim; ++x) {
        const float ax = a[x];
        const float *tx = t + x * ldt;
#pragma omp simd
        for (int64_t kk = 0; kk < n; ++kk) out[kk] += ax * tx[kk];
    }
}

#endif /* SK_CPU_DOTS_H */
