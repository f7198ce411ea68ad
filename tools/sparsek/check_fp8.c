/*
 * check_fp8.c - the FP8 (--dtype e4m3) part of `sparsek run`'s check: a
 * head's inputs quantized on the host as the run quantized them, and the
 * tolerance of each checked row.
 *
 * The reference (check.c) is the fp64 attention on the dequantized inputs,
 * descale x value(code): what the library's FP8 attention is defined to
 * compute (sparsek.h, sk_attention_desc). An FP8 kernel differs from it by
 * more than rounding noise, by design: it rounds each weight P to e4m3
 * before P V (relative error up to 2^-4 per weight), and the FP8 tensor
 * cores truncate their score sums (docs/perf/fp8.md, "Accumulation
 * precision"). A fixed tolerance would either fail a correct kernel on rows
 * with large weights or pass a wrong one on the rest, so the rule is the
 * GPU tests' (tests/gpu/test_attention_fp8_gpu.c, docs/perf/fp8.md
 * "Tests"): a naive FP8 attention of the same row, with P rounded to e4m3
 * (once on the exact scores, once on scores summed as the tensor cores sum
 * them), is the yardstick of what FP8 costs on that row; the kernel may
 * deviate by twice the yardstick, plus O's own rounding (bf16: 2^-8 |ref|,
 * doubled) and fp32 accumulation-order terms 2^-13 (smag vmax + vmax), where
 * smag is the row's largest scaled sum |q k| and vmax its largest |v|. LSE:
 * its yardstick is the tensor-core scores' LSE (P's rounding leaves the row
 * sums, taken before rounding, alone), with 2^-13 smag + 2^-23 (|lse| + 1).
 * test_check.c shows this rule failing corrupted outputs.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "cli.h"
#include "fp8_mma_model.h"
#include "host_data.h"

#define FP8_U_ACC 0x1p-13 /* fp32 accumulation order, relative */
#define FP8_U_OUT 0x1p-8  /* O in bf16 */
#define FP8_ATOL  1e-5

/* OCP e4m3fn: bias 7, subnormals below 2^-6, S.1111.111 NaN, no inf. */
static double e4m3_value(uint8_t c) {
    const int e = (c >> 3) & 15, m = c & 7;
    if (e == 15 && m == 7) return NAN;
    const double v = e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10);
    return c & 0x80 ? -v : v;
}

/* 0 <= x <= 448 to the nearest e4m3 value, ties to even (nearbyint in the
 * default rounding mode): the weights P in [0, 1] of the yardstick. */
static double e4m3_round(double x) {
    if (x == 0.0) return 0.0;
    int e;
    (void)frexp(x, &e); /* x in [2^(e-1), 2^e) */
    const int exp = e - 1 < -6 ? -6 : e - 1; /* subnormals share 2^-6's spacing */
    const double step = ldexp(1.0, exp - 3);
    return nearbyint(x / step) * step;
}

void fp8_quantize_head(const workload *w, float *vals, int64_t rows, uint8_t *codes,
                       float *descale) {
    const int64_t n = rows * w->dim;
    uint16_t *x = xmalloc((size_t)n * sizeof(uint16_t), "the check's bf16 head");
    for (int64_t i = 0; i < n; ++i) x[i] = host_f32_to_bf16(vals[i]);
    sk_quantize_desc d;
    check_sk(sk_quantize_desc_init(&d, sizeof d), "sk_quantize_desc_init");
    d.backend = SK_BACKEND_CPU;
    d.dtype = SK_DTYPE_BF16;
    d.batch = 1;
    d.seq = rows;
    d.heads = 1;
    d.head_dim = w->dim;
    check_sk(sk_quantize_e4m3(&d, x, codes, descale, NULL, 0, NULL), "sk_quantize_e4m3 (check)");
    for (int64_t i = 0; i < n; ++i) vals[i] = *descale * (float)e4m3_value(codes[i]); /* fp32 */
    free(x);
}

/* The naive FP8 row on scores s[0 .. n) (p = exp(s - max) rounded to e4m3
 * before P V, the row sum from the unrounded p): o8[D]; returns its LSE. */
static double naive_fp8_row(const workload *w, const head_inputs *in, const int64_t *keys,
                            const double *s, int64_t n, double *o8) {
    double m = -INFINITY, l = 0.0;
    for (int64_t j = 0; j < n; ++j) m = fmax(m, s[j]);
    for (int64_t d = 0; d < w->dim; ++d) o8[d] = 0.0;
    for (int64_t j = 0; j < n; ++j) {
        const double p = exp(s[j] - m), p8 = e4m3_round(p);
        l += p;
        for (int64_t d = 0; d < w->dim; ++d) o8[d] += p8 * (double)in->v[keys[j] * w->dim + d];
    }
    for (int64_t d = 0; d < w->dim; ++d) o8[d] /= l;
    return m + log(l);
}

void fp8_row_tolerance(const workload *w, const head_inputs *in, int64_t i, const int64_t *keys,
                       const double *scores, int64_t n, const double *o_ref, double lse_ref,
                       double *work, double *o_abs, double *o_rel, double *lse_tol) {
    const int64_t dim = w->dim;
    const double scale = 1.0 / sqrt((double)dim);
    const float *q = in->q + i * dim;
    const uint8_t *q8 = in->q8 + i * dim;
    double *s8 = work, *o8 = work + n, *qa = work + n + dim, *kb = work + n + 2 * dim;
    double smag = 0.0, vmax = 0.0;
    const double fold = scale * (double)in->qd * (double)in->kd; /* descales x scale */
    for (int64_t d = 0; d < dim; ++d) qa[d] = e4m3_value(q8[d]);
    for (int64_t j = 0; j < n; ++j) {
        const int64_t k = keys[j];
        double mag = 0.0;
        for (int64_t d = 0; d < dim; ++d) {
            mag += fabs((double)q[d] * (double)in->k[k * dim + d]);
            vmax = fmax(vmax, fabs((double)in->v[k * dim + d]));
            kb[d] = e4m3_value(in->k8[k * dim + d]);
        }
        smag = fmax(smag, scale * mag);
        s8[j] = fold * sk_fp8_mma_sum(qa, kb, dim, SK_FP8_MMA_FRAC);
    }
    double yard = 0.0, lse_yard = 0.0;
    if (n > 0) {
        (void)naive_fp8_row(w, in, keys, scores, n, o8); /* P rounding alone */
        for (int64_t d = 0; d < dim; ++d) yard = fmax(yard, fabs(o8[d] - o_ref[d]));
        lse_yard = fabs(naive_fp8_row(w, in, keys, s8, n, o8) - lse_ref); /* and the MMA sums */
        for (int64_t d = 0; d < dim; ++d) yard = fmax(yard, fabs(o8[d] - o_ref[d]));
    }
    *o_abs = 2.0 * (yard + FP8_U_ACC * (smag * vmax + vmax)) + FP8_ATOL;
    *o_rel = 2.0 * FP8_U_OUT;
    *lse_tol = isinf(lse_ref) ? 0.0
                              : 2.0 * (lse_yard + FP8_U_ACC * smag +
                                       0x1p-23 * (fabs(lse_ref) + 1.0)) +
                                    FP8_ATOL;
}
