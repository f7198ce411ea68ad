/*
 * fp8_case.h - seeded FP8 (e4m3) attention cases shared by the CPU and GPU
 * tests: inputs, layout, the fp64 reference on the dequantized inputs, the
 * naive same-precision FP8 yardstick, and the comparison.
 *
 * Inputs: Q, K, V drawn N(0, 1) x amp per element, quantized by the test's
 * own codec (tu_f32_to_e4m3) with one amax scale per (batch, head), as
 * sk_quantize_e4m3 would; the descales go to the library (with_descale) or
 * are folded away (all 1: the codes are then of the raw values, amp small
 * enough to stay in range). Everything outside the logical tensors (stride
 * padding, slack) and every key block no query head of its KV head selects
 * holds the NaN code 0x7F, so a stray read poisons the output.
 *
 * Reference: per query row, in fp64 on the dequantized values (descale x
 * decode), the admitted keys (selected block, k < Sk, causal k <= q + Sk -
 * Sq). Yardstick: the same row with each softmax weight p = exp(s - max)
 * rounded to e4m3 before P V (the row sum from the unrounded p), which is
 * what an FP8 P V GEMM does; yard[row] = max_d |O8 - O|.
 *
 * Tolerance (the rule of docs/DEVELOPING.md with this yardstick): element d
 * of a row passes when
 *   |got - ref| <= 2 x (yard[row] + u_out |ref| + u_acc (smag vmax + vmax)) + atol
 * u_out the unit roundoff of O's dtype, u_acc = 2^-13 for the FP8 tensor
 * cores' reduced-precision accumulation, smag = max over admitted keys of
 * |scale| sum_d |q_d k_d|, vmax = max |v| over them; LSE passes within
 * 2 x (lse_yard[row] + u_acc smag + 2^-23 (|lse| + 1)) + atol. NaN
 * positions must match.
 *
 * The second yardstick (FP8 accumulation): Hopper's FP8 wgmma does not sum
 * in fp32. Each k32 step aligns the accumulator and its 32 products to the
 * largest exponent E (a product's exponent taken as ea + eb, its factors'
 * exponents added) and truncates each to a multiple of 2^(E - 13) (the
 * model in fp8_case.c, which reproduces the H200's LSE failure of main
 * 333df50 and the H100's shaped-row one of bce1b87 to fp32 rounding). At
 * logits ~46 that is an LSE error ~0.04, more than 2 u_acc smag allowed. So the naive FP8 row is also computed with its
 * scores summed that way: lse_yard = |its LSE - ref|, and yard[row] is the
 * larger of the two yardsticks' O deviations. f8_inst_model gives that
 * naive kernel and broken variants of it, so a test can show that the
 * rule accepts the first and rejects the others.
 */
#ifndef SK_TESTS_FP8_CASE_H
#define SK_TESTS_FP8_CASE_H

#include <stddef.h>
#include <stdint.h>

#include "sparsek.h"

typedef struct f8_case {
    int64_t batch, seq_q, seq_k, heads_q, heads_kv, head_dim;
    int32_t block_q, block_k;
    int causal;
    float scale;          /* 0: 1/sqrt(D) */
    int32_t layout_batch; /* 1 or batch */
    int32_t layout_heads; /* 1, heads_kv or heads_q */
    double density;       /* P(block selected) */
    int empty_rows;       /* every third layout row empty */
    int padded;           /* strides padded by multiples of 16 elements */
    int with_lse;
    int with_descale;     /* per-(b, h) amax descales; 0: NULL descales */
    sk_dtype out_dtype;   /* F16 or BF16 */
    float amp;            /* input amplitude (1 if 0) */
    uint64_t seed;
    int k_shape;          /* tu_shape (common/key_shape.h) of the real Q, K values; 0: none */
    float k_shape_arg;
} f8_case;

typedef struct f8_inst {
    f8_case c;
    int64_t group, rb, cb, slices;
    int32_t head_div;
    int64_t qs[3], ks[3], vs[3], os[3];   /* element strides */
    int64_t q_alloc, k_alloc, v_alloc, o_alloc; /* elements (bytes for Q/K/V) */
    uint8_t *q8, *k8, *v8;                /* host codes */
    float *q_descale, *k_descale, *v_descale; /* host [B, H]; NULL without descales */
    uint8_t *mask;                        /* [slices, rb, cb] */
    sk_bsr layout;                        /* host */
    double *ref_o;                        /* [B, Sq, Hq, D] */
    double *ref_lse, *yard, *row_tol, *lse_tol; /* [B, Hq, Sq] */
    double *lse_yard;                     /* [B, Hq, Sq]: |LSE of the naive FP8 row - ref| */
} f8_inst;

/* 0 on success (-1: out of memory). */
int f8_inst_create(f8_inst *x, const f8_case *c);
void f8_inst_destroy(f8_inst *x);
void f8_case_describe(const f8_case *c, char *buf, size_t len);
/* A descriptor for the case; the descale pointers are the caller's (host
 * or device copies of x's, or NULL). */
void f8_inst_desc(const f8_inst *x, sk_backend backend, sk_attention_desc *d, const float *qd,
                  const float *kd, const float *vd);
/* Host outputs (o: o_alloc elements of out_dtype with x->os strides; lse
 * [B, Hq, Sq] or NULL) against the reference: prints the first max_print
 * mismatches with their indices under `what`; also that O's padding still
 * holds the 0xFFFF fill. tight: no yardstick and u_acc / 2^7 (the CPU
 * backend, which computes in fp32 / fp64). Returns the number of bad
 * elements. */
int64_t f8_inst_compare(const f8_inst *x, const void *o, const float *lse, const char *what,
                        int tight, int max_print);
/* Of every row: the largest error of the reference against the yardstick
 * (sum over rows of yard), for "the yardstick is not vacuous" checks. */
double f8_inst_yard_total(const f8_inst *x);

/* The naive FP8 attention (the yardstick's row: scores through the
 * modelled FP8 wgmma sum, P rounded to e4m3) as a kernel would return it
 * (O rounded to out_dtype with x->os strides, padding 0xFFFF; lse
 * [B, Hq, Sq] or NULL), and broken variants of it that the tolerance rule
 * must reject: ACC10 sums with 10 fraction bits instead of 13, GAIN scales
 * the logits by 1 + 2^-8 (a descale rounded to bf16), DROP_KEY skips the
 * last admitted key of every row. 0 on success, -1 out of memory. */
typedef enum f8_model { F8_MODEL_FP8 = 0, F8_MODEL_ACC10, F8_MODEL_GAIN, F8_MODEL_DROP_KEY } f8_model;
int f8_inst_model(const f8_inst *x, f8_model which, void *o, float *lse);

/* An sk_quantize_desc for x [B, S, H, D] of dtype with element strides st
 * (NULL: packed). */
void f8_quantize_desc(sk_quantize_desc *q, sk_backend backend, sk_dtype dtype, int64_t B,
                      int64_t S, int64_t H, int64_t D, const int64_t *st);

/* Variant v of the CPU tests' seeded cases (GQA 1 / 2 / 4, D 64 / 128,
 * blocks 64 / 128, tails, causal, negative scale, broadcast layouts, empty
 * rows, padded strides, LSE, descales, both O dtypes), drawn from rng. */
struct tu_rng;
void f8_case_cpu_variant(f8_case *c, struct tu_rng *rng, int v);

/* x's V codes in the pre-transposed layout (sparsek.h SK_QUANT_LAYOUT_VT_FP8,
 * [B, Hkv, D, Sk_pad], malloc'd; NULL: out of memory), *bytes its size.
 * The columns of keys past Sk up to the next multiple of 32 hold `near`
 * (the FP8 kernel reads them: 0 there, unless the reader reads nothing past
 * Sk), the further ones `far` (never read: the NaN code 0x7F). */
uint8_t *f8_inst_vt(const f8_inst *x, uint8_t near, uint8_t far, int64_t *bytes);

#endif /* SK_TESTS_FP8_CASE_H */
