/*
 * test_util.h - helpers shared by the CPU and GPU tests: a seeded RNG, fp16
 * and bf16 conversions written independently of the library's own, NaN
 * poisoning, and the tolerance rule.
 */
#ifndef SK_TESTS_TEST_UTIL_H
#define SK_TESTS_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "sparsek.h"

/* splitmix64: a seeded, platform-independent stream. */
typedef struct tu_rng {
    uint64_t state;
} tu_rng;
void tu_rng_seed(tu_rng *rng, uint64_t seed);
uint64_t tu_rng_next(tu_rng *rng);
double tu_rng_uniform(tu_rng *rng);                  /* [0, 1) */
double tu_rng_normal(tu_rng *rng);                   /* N(0, 1) */
int64_t tu_rng_range(tu_rng *rng, int64_t lo, int64_t hi); /* [lo, hi] */

/* Round-to-nearest-even conversions (independent of src/cpu). */
uint16_t tu_f32_to_f16(float f);
float tu_f16_to_f32(uint16_t h);
uint16_t tu_f32_to_bf16(float f);
float tu_bf16_to_f32(uint16_t h);

/* e4m3fn (SK_DTYPE_E4M3), written independently of src/cpu/fp8.c: the
 * decode from the format's definition, the encode by nearest-code search
 * (ties to even, saturating to +-448, NaN to 0x7F with the sign). */
float tu_e4m3_to_f32(uint8_t x);
uint8_t tu_f32_to_e4m3(float f);

/* Store / load element i of a buffer of the given dtype as a float. */
void tu_store(void *buf, sk_dtype dtype, int64_t i, float value);
float tu_load(const void *buf, sk_dtype dtype, int64_t i);
/* Fill n elements with quiet NaN. */
void tu_fill_nan(void *buf, sk_dtype dtype, int64_t n);
/* Fill n elements with N(0, 1) * scale, rounded to the dtype. */
void tu_fill_normal(tu_rng *rng, void *buf, sk_dtype dtype, int64_t n, float scale);

/* Unit roundoff of a dtype: 2^-11 for F16, 2^-8 for BF16, 2^-24 for F32,
 * 2^-4 for E4M3. */
double tu_unit_roundoff(sk_dtype dtype);

/*
 * The attention tolerance rule (docs/DEVELOPING.md): |got - ref| <= 2 * E +
 * atol, E being the error bound of a naive implementation in the same
 * precision, i.e. one that computes in fp32 from the same dtype inputs and
 * rounds O once:
 *   E(O)   = u_dtype * |ref|                      final rounding of O
 *          + u_f32 * sqrt(D) * smag * vmax        fp32 dot products: an error
 *                                                 d in a score changes exp by
 *                                                 a factor (1 + d)
 *          + u_f32 * sqrt(n) * vmax               fp32 sums over n keys
 *   E(LSE) = u_f32 * (|ref| + sqrt(D) * smag + sqrt(n))
 * smag = |scale| * |q|_2 * max_k |k|_2 bounds |scale| * sum_d |q_d k_d| (Cauchy-
 * Schwarz), vmax = max |v|, n = the row's admissible keys; sqrt() because
 * rounding errors add up like a random walk. atol = 2^-24 covers fp16
 * subnormal outputs. d is the head dimension.
 */
double tu_attn_tol_o(sk_dtype dtype, double ref, double d, double smag, double vmax, double n);
double tu_attn_tol_lse(double ref, double d, double smag, double n);

/* A grid of rows x cols tokens in blocks of block_rows x block_cols, over
 * batch x heads slices. */
sk_grid tu_grid(int64_t rows, int64_t cols, int32_t block_rows, int32_t block_cols, int32_t batch,
                int32_t heads);

/* The seed every randomised test uses: SPARSEK_TEST_SEED from the
 * environment, else a fixed default; printed once by the runner. */
uint64_t tu_base_seed(void);

#endif /* SK_TESTS_TEST_UTIL_H */
