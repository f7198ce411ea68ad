/*
 * half.c - fp16 / bf16 conversions of the CPU backend (see half.h).
 *
 * Bit-level conversions on the IEEE encodings:
 *   fp32: 1 sign, 8 exponent (bias 127), 23 mantissa bits
 *   fp16: 1 sign, 5 exponent (bias 15),  10 mantissa bits
 *   bf16: the top 16 bits of an fp32
 * Rounding adds "half an ulp minus one, plus the lowest kept bit" before
 * truncating, which is round-to-nearest with ties to even.
 */
#include "cpu/half.h"

#include <math.h>
#include <string.h>

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float sk_f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (mant << 13)); /* inf, NaN */
    if (exp != 0) return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
    /* Zero or subnormal: mant * 2^-24, exact in fp32. */
    const float v = (float)mant * 0x1.0p-24f;
    return sign ? -v : v;
}

uint16_t sk_f32_to_f16(float f) {
    const uint32_t x = f32_bits(f);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    const uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) /* NaN: quiet, keep the top payload bits */
        return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
    /* 65520 = 65504 + half an ulp: from there on RNE gives inf (also inf). */
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
    if (ax >= 0x38800000u) { /* >= 2^-14: a normal fp16 */
        /* Rebias the exponent (127 -> 15) and round away the low 13 bits; a
         * carry out of the mantissa correctly bumps the exponent. */
        const uint32_t rounded = ax + 0xfffu + ((ax >> 13) & 1u);
        return (uint16_t)(sign | ((rounded - 0x38000000u) >> 13));
    }
    /* Below 2^-14: a multiple of 2^-24 (subnormal), or zero. Up to 2^-25
     * inclusive (a tie with 0, whose last bit is even) rounds to zero. */
    if (ax <= 0x33000000u) return sign;
    const uint32_t e = ax >> 23;                     /* 102 .. 112 here */
    const uint32_t m = (ax & 0x7fffffu) | 0x800000u; /* value = m * 2^(e - 150) */
    const uint32_t shift = 126u - e;                 /* value / 2^-24 = m >> shift */
    uint32_t r = m >> shift;
    const uint32_t rest = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rest > half || (rest == half && (r & 1u))) ++r; /* r == 1024 is the smallest normal */
    return (uint16_t)(sign | r);
}

float sk_bf16_to_f32(uint16_t h) {
    return bits_f32((uint32_t)h << 16);
}

uint16_t sk_f32_to_bf16(float f) {
    const uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x0040u); /* quiet NaN */
    /* Overflow of the rounding carries into the exponent and, past the
     * largest finite bf16, gives exactly inf. */
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

float sk_f64_to_f32_odd(double x) {
    const float f = (float)x; /* round to nearest */
    if (isnan(x) || (double)f == x) return f;
    uint32_t u = f32_bits(f);
    /* Rounded away from zero (possibly to inf): step back to the truncation. */
    if (fabs((double)f) > fabs(x)) u -= 1u;
    return bits_f32(u | 1u); /* inexact: make the last bit odd */
}

void sk_cpu_load_f32(float *dst, const void *src, sk_dtype dtype, int64_t n) {
    if (dtype == SK_DTYPE_F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
    } else if (dtype == SK_DTYPE_BF16) {
        const uint16_t *s = (const uint16_t *)src;
        for (int64_t i = 0; i < n; ++i) dst[i] = sk_bf16_to_f32(s[i]);
    } else {
        const uint16_t *s = (const uint16_t *)src;
        for (int64_t i = 0; i < n; ++i) dst[i] = sk_f16_to_f32(s[i]);
    }
}

void sk_cpu_load_f64(double *dst, const void *src, sk_dtype dtype, int64_t n) {
    if (dtype == SK_DTYPE_F32) {
        const float *s = (const float *)src;
        for (int64_t i = 0; i < n; ++i) dst[i] = (double)s[i];
    } else if (dtype == SK_DTYPE_BF16) {
        const uint16_t *s = (const uint16_t *)src;
        for (int64_t i = 0; i < n; ++i) dst[i] = (double)sk_bf16_to_f32(s[i]);
    } else {
        const uint16_t *s = (const uint16_t *)src;
        for (int64_t i = 0; i < n; ++i) dst[i] = (double)sk_f16_to_f32(s[i]);
    }
}

float sk_cpu_load1_f32(const void *src, sk_dtype dtype, int64_t index) {
    if (dtype == SK_DTYPE_F32) return ((const float *)src)[index];
    const uint16_t h = ((const uint16_t *)src)[index];
    return dtype == SK_DTYPE_BF16 ? sk_bf16_to_f32(h) : sk_f16_to_f32(h);
}

void sk_cpu_store1_f64(void *dst, sk_dtype dtype, int64_t index, double value) {
    if (dtype == SK_DTYPE_F32)
        ((float *)dst)[index] = (float)value;
    else if (dtype == SK_DTYPE_BF16)
        ((uint16_t *)dst)[index] = sk_f32_to_bf16(sk_f64_to_f32_odd(value));
    else
        ((uint16_t *)dst)[index] = sk_f32_to_f16(sk_f64_to_f32_odd(value));
}

void sk_cpu_store_f64(void *dst, sk_dtype dtype, const double *src, int64_t n) {
    for (int64_t i = 0; i < n; ++i) sk_cpu_store1_f64(dst, dtype, i, src[i]);
}
