/*
 * fp8_mma_model.h - the modelled sum of Hopper's FP8 tensor cores
 * (wgmma ... .f32.e4m3.e4m3), shared by the tests' FP8 yardstick
 * (tests/common/fp8_case.c) and the CLI's FP8 check
 * (tools/sparsek/check_fp8.c), so that the two tolerance rules cannot
 * drift apart.
 *
 * As two GPU runs showed it (docs/perf/fp8.md, "Accumulation precision"
 * and "The shaped-row LSE"): each k32 step aligns the carried accumulator
 * and its 32 exact products to the largest exponent E among them and
 * truncates each toward zero to a multiple of 2^(E - frac) before adding;
 * the sum is exact from there. A product's exponent is that of its factors
 * added, ea + eb, not the product's own: the product of the significands,
 * in [1, 4), is not normalised first. The accumulator's is its own. With
 * frac = 13 this reproduces the LSE the kernel returned for both cases (an
 * H200 and an H100) to fp32 rounding.
 */
#ifndef SK_FP8_MMA_MODEL_H
#define SK_FP8_MMA_MODEL_H

#include <math.h>
#include <stdint.h>

#define SK_FP8_MMA_K 32    /* products per FP8 wgmma step (k32) */
#define SK_FP8_MMA_FRAC 13 /* fraction bits kept below a step's largest exponent */

/* Exponent of a nonzero e4m3 value as its encoding holds it: floor(log2 |v|)
 * for normal numbers, -6 for the subnormals (0.mmm x 2^-6). */
static inline int sk_fp8_exponent(double v) {
    const int e = ilogb(v);
    return e < -6 ? -6 : e;
}

/* sum over i < n of a[i] b[i] (e4m3 values, GEMM order) as modelled above,
 * with `frac` fraction bits. */
static inline double sk_fp8_mma_sum(const double *a, const double *b, int64_t n, int frac) {
    double acc = 0.0;
    for (int64_t c0 = 0; c0 < n; c0 += SK_FP8_MMA_K) {
        const int64_t c1 = c0 + SK_FP8_MMA_K < n ? c0 + SK_FP8_MMA_K : n;
        int any = acc != 0.0, E = any ? ilogb(acc) : 0;
        for (int64_t i = c0; i < c1; ++i) {
            if (a[i] == 0.0 || b[i] == 0.0) continue;
            const int e = sk_fp8_exponent(a[i]) + sk_fp8_exponent(b[i]);
            E = any && E > e ? E : e;
            any = 1;
        }
        if (!any) continue;
        const double ulp = ldexp(1.0, E - frac), inv = 1.0 / ulp; /* powers of 2: exact */
        double sum = trunc(acc * inv) * ulp;
        for (int64_t i = c0; i < c1; ++i) sum += trunc(a[i] * b[i] * inv) * ulp;
        acc = sum;
    }
    return acc;
}

#endif
