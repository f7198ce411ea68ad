/*
 * half.h - fp16 / bf16 <-> fp32 conversions of the CPU backend, and the
 * loads and stores that turn a strided row of any sk_dtype into fp32/fp64
 * and back.
 *
 * Every narrowing conversion rounds to nearest, ties to even (RNE), and
 * handles NaN (kept quiet, sign kept), infinities, overflow (to inf, as RNE
 * does) and subnormals exactly. Widening conversions are exact.
 *
 * Storing an fp64 value to F16/BF16 goes through fp32 rounded to ODD
 * (truncate, then set the last bit if anything was cut off): fp32 has at
 * least two more significant bits than either, so the second rounding (RNE)
 * gives the same result as one direct RNE of the fp64 value, with no double
 * rounding.
 */
#ifndef SK_CPU_HALF_H
#define SK_CPU_HALF_H

#include <stdint.h>

#include "sparsek.h"

float sk_f16_to_f32(uint16_t h);
uint16_t sk_f32_to_f16(float f);
float sk_bf16_to_f32(uint16_t h);
uint16_t sk_f32_to_bf16(float f);

/* x rounded to fp32 with round-to-odd (see above). */
float sk_f64_to_f32_odd(double x);

/* dst[i] = src[i] for i < n, src holding `dtype` elements (F16, BF16, F32). */
void sk_cpu_load_f32(float *dst, const void *src, sk_dtype dtype, int64_t n);
void sk_cpu_load_f64(double *dst, const void *src, sk_dtype dtype, int64_t n);

/* One element: element `index` of a `dtype` array, widened to fp32 (exact). */
float sk_cpu_load1_f32(const void *src, sk_dtype dtype, int64_t index);
/* Store src[i] to element i of a `dtype` array, for i < n, rounded once (RNE). */
void sk_cpu_store_f64(void *dst, sk_dtype dtype, const double *src, int64_t n);
/* Store one value to element `index` of a `dtype` array, rounded once (RNE). */
void sk_cpu_store1_f64(void *dst, sk_dtype dtype, int64_t index, double value);

/* Address of element `index` of a `dtype` array. */
static inline const void *sk_cpu_elem(const void *base, sk_dtype dtype, int64_t index) {
    return (const char *)base + index * (dtype == SK_DTYPE_F32 ? 4 : 2);
}
static inline void *sk_cpu_elem_mut(void *base, sk_dtype dtype, int64_t index) {
    return (char *)base + index * (dtype == SK_DTYPE_F32 ? 4 : 2);
}

#endif /* SK_CPU_HALF_H */
