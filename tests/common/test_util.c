/*
 * test_util.c - see test_util.h.
 */
#include "common/test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void tu_rng_seed(tu_rng *rng, uint64_t seed) { rng->state = seed; }

uint64_t tu_rng_next(tu_rng *rng) {
    uint64_t z = (rng->state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double tu_rng_uniform(tu_rng *rng) { return (double)(tu_rng_next(rng) >> 11) * 0x1.0p-53; }

double tu_rng_normal(tu_rng *rng) {
    /* Box-Muller; u1 in (0, 1] so the log is finite. */
    double u1 = 1.0 - tu_rng_uniform(rng), u2 = tu_rng_uniform(rng);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

int64_t tu_rng_range(tu_rng *rng, int64_t lo, int64_t hi) {
    return lo + (int64_t)(tu_rng_next(rng) % (uint64_t)(hi - lo + 1));
}

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t tu_f32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float tu_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t tu_f32_to_f16(float f) {
    /* Exact rounding through double: scale into the f16 grid and use rint. */
    if (isnan(f)) return 0x7e00;
    uint16_t sign = signbit(f) ? 0x8000 : 0;
    double a = fabs((double)f);
    if (a >= 65520.0) return sign | 0x7c00; /* rounds to inf */
    if (a < 0x1.0p-14) {                     /* subnormal: multiples of 2^-24 */
        double m = rint(a * 0x1.0p24);
        return sign | (uint16_t)m; /* m == 1024 becomes the smallest normal */
    }
    int e;
    double fr = frexp(a, &e);               /* a = fr * 2^e, fr in [0.5, 1) */
    double m = rint(fr * 2048.0);           /* 11 significant bits */
    if (m == 2048.0) {
        m = 1024.0;
        ++e;
    }
    int biased = e - 1 + 15;
    if (biased >= 31) return sign | 0x7c00;
    return sign | (uint16_t)(biased << 10) | (uint16_t)((int)m - 1024);
}

float tu_f16_to_f32(uint16_t h) {
    int sign = h >> 15, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    double v;
    if (exp == 0)
        v = ldexp((double)mant, -24);
    else if (exp == 31)
        v = mant ? NAN : INFINITY;
    else
        v = ldexp((double)(mant | 0x400), exp - 25);
    return (float)(sign ? -v : v);
}

void tu_store(void *buf, sk_dtype dtype, int64_t i, float value) {
    switch (dtype) {
    case SK_DTYPE_F16:
        ((uint16_t *)buf)[i] = tu_f32_to_f16(value);
        break;
    case SK_DTYPE_BF16:
        ((uint16_t *)buf)[i] = tu_f32_to_bf16(value);
        break;
    case SK_DTYPE_F32:
        ((float *)buf)[i] = value;
        break;
    case SK_DTYPE_E4M3:
        ((uint8_t *)buf)[i] = tu_f32_to_e4m3(value);
        break;
    }
}

float tu_load(const void *buf, sk_dtype dtype, int64_t i) {
    switch (dtype) {
    case SK_DTYPE_F16:
        return tu_f16_to_f32(((const uint16_t *)buf)[i]);
    case SK_DTYPE_BF16:
        return tu_bf16_to_f32(((const uint16_t *)buf)[i]);
    case SK_DTYPE_F32:
        return ((const float *)buf)[i];
    case SK_DTYPE_E4M3:
        return tu_e4m3_to_f32(((const uint8_t *)buf)[i]);
    }
    return NAN;
}

void tu_fill_nan(void *buf, sk_dtype dtype, int64_t n) {
    for (int64_t i = 0; i < n; ++i) tu_store(buf, dtype, i, NAN);
}

void tu_fill_normal(tu_rng *rng, void *buf, sk_dtype dtype, int64_t n, float scale) {
    for (int64_t i = 0; i < n; ++i) tu_store(buf, dtype, i, (float)tu_rng_normal(rng) * scale);
}

double tu_unit_roundoff(sk_dtype dtype) {
    switch (dtype) {
    case SK_DTYPE_F16:
        return 0x1.0p-11;
    case SK_DTYPE_BF16:
        return 0x1.0p-8;
    case SK_DTYPE_F32:
        return 0x1.0p-24;
    case SK_DTYPE_E4M3:
        return 0x1.0p-4;
    }
    return 1.0;
}

/* e4m3fn by its definition: (-1)^s x 2^(e-7) x (1 + m/8), subnormal
 * (e = 0) 2^-6 x m/8, S.1111.111 NaN; evaluated in double. */
float tu_e4m3_to_f32(uint8_t x) {
    const int sign = x >> 7, e = (x >> 3) & 15, m = x & 7;
    if (e == 15 && m == 7) return NAN;
    const double v = e == 0 ? ldexp(m / 8.0, -6) : ldexp(1.0 + m / 8.0, e - 7);
    return (float)(sign ? -v : v);
}

/* By search over the 127 non-negative finite codes: the nearest, ties to the
 * even code (mantissa bit 0 clear); |f| >= 448 saturates. */
uint8_t tu_f32_to_e4m3(float f) {
    const uint8_t sign = signbit(f) ? 0x80 : 0;
    if (isnan(f)) return sign | 0x7F;
    const double a = fabs((double)f);
    if (a >= 448.0) return sign | 0x7E;
    int best = 0;
    double best_err = a;
    for (int c = 1; c <= 0x7E; ++c) {
        const double err = fabs((double)tu_e4m3_to_f32((uint8_t)c) - a);
        if (err < best_err || (err == best_err && (c & 1) == 0)) {
            best = c;
            best_err = err;
        }
    }
    return sign | (uint8_t)best;
}

uint64_t tu_base_seed(void) {
    static int printed;
    const char *env = getenv("SPARSEK_TEST_SEED");
    uint64_t seed = env != NULL ? strtoull(env, NULL, 0) : 20261122ull;
    if (!printed) {
        printf("test seed %llu (set SPARSEK_TEST_SEED to change)\n", (unsigned long long)seed);
        printed = 1;
    }
    return seed;
}

sk_grid tu_grid(int64_t rows, int64_t cols, int32_t block_rows, int32_t block_cols, int32_t batch,
                int32_t heads) {
    sk_grid g;
    memset(&g, 0, sizeof g);
    g.rows = rows;
    g.cols = cols;
    g.block_rows = block_rows;
    g.block_cols = block_cols;
    g.batch = batch;
    g.heads = heads;
    return g;
}

double tu_attn_tol_o(sk_dtype dtype, double ref, double d, double smag, double vmax, double n) {
    const double u32 = tu_unit_roundoff(SK_DTYPE_F32);
    const double e =
        tu_unit_roundoff(dtype) * fabs(ref) + u32 * sqrt(d) * smag * vmax + u32 * sqrt(n) * vmax;
    return 2.0 * e + 0x1.0p-24;
}

double tu_attn_tol_lse(double ref, double d, double smag, double n) {
    const double u32 = tu_unit_roundoff(SK_DTYPE_F32);
    return 2.0 * u32 * (fabs(ref) + sqrt(d) * smag + sqrt(n)) + 0x1.0p-24;
}
