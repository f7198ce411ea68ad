/*
 * host_data.h - host-side data of the programs built on the public API (the
 * CLI in tools/sparsek/, the benchmark programs in bench/): fp16 / bf16
 * conversions and a counter-based random generator. Header only (static
 * inline, C99), so that each program takes what it uses and needs no extra
 * object file.
 *
 * Conversions round to nearest even; NaN stays NaN, overflow becomes inf.
 * They are independent of the library's own (src/cpu/half.c), which a
 * program must not reach: they are what a user of the API would write.
 *
 * The generator: every value is a pure function of (seed, stream, counter),
 * so a program can regenerate any element later (the CLI's check rebuilds
 * the rows it checks instead of keeping host copies of GPU tensors), and
 * values do not depend on the number of threads that fill a tensor.
 */
#ifndef SK_HOST_DATA_H
#define SK_HOST_DATA_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "sparsek.h"

#define HOST_DATA_PI 3.14159265358979323846

/* ---- fp16 / bf16 <-> fp32 ---------------------------------------------- */

static inline uint16_t host_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);  /* NaN */
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520: inf */
    if (ax < 0x38800000u) { /* below 2^-14: a half subnormal (or zero) */
        float af;
        memcpy(&af, &ax, 4);
        return (uint16_t)(sign | (uint16_t)lrintf(af * 16777216.0f)); /* units of 2^-24 */
    }
    /* Re-bias the exponent (127 -> 15), round the 13 dropped bits to even. */
    ax += 0xc8000fffu + ((ax >> 13) & 1u);
    return (uint16_t)(sign | (ax >> 13));
}

static inline float host_f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    uint32_t x;
    if (e == 0) {
        const float f = ldexpf((float)m, -24);
        return sign ? -f : f;
    }
    if (e == 31)
        x = sign | 0x7f800000u | (m << 13);
    else
        x = sign | ((e + 112u) << 23) | (m << 13);
    float f;
    memcpy(&f, &x, 4);
    return f;
}

static inline uint16_t host_f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

static inline float host_bf16_to_f32(uint16_t h) {
    const uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* Bytes per element of an f16, bf16 or f32 tensor. */
static inline size_t host_dtype_size(sk_dtype dtype) {
    return dtype == SK_DTYPE_F32 ? 4 : 2;
}

static inline const char *host_dtype_name(sk_dtype dtype) {
    return dtype == SK_DTYPE_F16 ? "f16" : dtype == SK_DTYPE_BF16 ? "bf16" : "f32";
}

/* Element i of a packed f16 / bf16 / f32 buffer, written or read as fp32. */
static inline void host_store(void *buf, sk_dtype dtype, int64_t i, float value) {
    if (dtype == SK_DTYPE_F32)
        ((float *)buf)[i] = value;
    else if (dtype == SK_DTYPE_F16)
        ((uint16_t *)buf)[i] = host_f32_to_f16(value);
    else
        ((uint16_t *)buf)[i] = host_f32_to_bf16(value);
}

static inline float host_load(const void *buf, sk_dtype dtype, int64_t i) {
    if (dtype == SK_DTYPE_F32) return ((const float *)buf)[i];
    if (dtype == SK_DTYPE_F16) return host_f16_to_f32(((const uint16_t *)buf)[i]);
    return host_bf16_to_f32(((const uint16_t *)buf)[i]);
}

/* fp32 rounded to the dtype and back: the value a tensor of that dtype holds. */
static inline float host_round(sk_dtype dtype, float value) {
    if (dtype == SK_DTYPE_F16) return host_f16_to_f32(host_f32_to_f16(value));
    if (dtype == SK_DTYPE_BF16) return host_bf16_to_f32(host_f32_to_bf16(value));
    return value;
}

/* ---- counter-based random numbers: value = f(seed, stream, counter) ----- */

/* The splitmix64 output function: a bijection of 64-bit words. */
static inline uint64_t host_mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Distinct (stream < 16, counter < 2^60) pairs give distinct words for a seed. */
static inline uint64_t host_rng_word(uint64_t seed, unsigned stream, uint64_t counter) {
    return host_mix64(host_mix64(seed) ^ ((uint64_t)stream << 60) ^ counter);
}

/* Uniform in [-1, 1), a multiple of 2^-23 (exact in fp32). */
static inline float host_rng_uniform(uint64_t seed, unsigned stream, uint64_t counter) {
    return (float)(host_rng_word(seed, stream, counter) >> 40) * (1.0f / 8388608.0f) - 1.0f;
}

/* Box-Muller on the two 32-bit halves of one word: two N(0, 1) samples. */
static inline void host_rng_normal_pair(uint64_t seed, unsigned stream, uint64_t pair, double *z0,
                                        double *z1) {
    const uint64_t x = host_rng_word(seed, stream, pair);
    const double u1 = ((double)(x >> 32) + 0.5) * (1.0 / 4294967296.0);
    const double u2 = ((double)(x & 0xffffffffu) + 0.5) * (1.0 / 4294967296.0);
    const double r = sqrt(-2.0 * log(u1)), t = 2.0 * HOST_DATA_PI * u2;
    *z0 = r * cos(t);
    *z1 = r * sin(t);
}

/* Element idx of an N(0, 1) tensor: elements 2p and 2p + 1 share pair p. */
static inline float host_rng_normal(uint64_t seed, unsigned stream, uint64_t idx) {
    double z0, z1;
    host_rng_normal_pair(seed, stream, idx >> 1, &z0, &z1);
    return (float)((idx & 1) ? z1 : z0);
}

/* Fills n elements of a packed tensor with host_rng_normal, in parallel
 * (where OpenMP is on); element i is host_rng_normal(seed, stream, i). */
static inline void host_fill_normal(void *buf, sk_dtype dtype, int64_t n, uint64_t seed,
                                    unsigned stream) {
    const int64_t pairs = (n + 1) / 2;
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < pairs; ++p) {
        double z0, z1;
        host_rng_normal_pair(seed, stream, (uint64_t)p, &z0, &z1);
        host_store(buf, dtype, 2 * p, (float)z0);
        if (2 * p + 1 < n) host_store(buf, dtype, 2 * p + 1, (float)z1);
    }
}

#endif /* SK_HOST_DATA_H */
