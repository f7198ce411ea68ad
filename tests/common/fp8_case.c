/*
 * fp8_case.c - seeded FP8 attention cases, their fp64 reference, the naive
 * FP8 yardstick and the comparison (see fp8_case.h).
 */
#include "common/fp8_case.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/key_shape.h"
#include "common/naive_ref.h"
#include "core/fp8_vt.h"
#include "common/test_util.h"
#include "fp8_mma_model.h" /* tools/common: the model the CLI check shares */

#define F8_U_ACC 0x1p-13
#define F8_ATOL 1e-5
#define F8_NAN_CODE 0x7F
/* The CPU reference accumulates in fp32 / fp64: 2^-13 -> 2^-20. */
#define F8_TIGHT 0x1p-7
/* The modelled FP8 wgmma sum: tools/common/fp8_mma_model.h (shared with
 * the CLI's check), 13 fraction bits below each k32 step's largest exponent. */
#define F8_MMA_FRAC SK_FP8_MMA_FRAC

static void strides_of(int64_t s, int64_t h, int64_t d, int padded, tu_rng *rng, int64_t st[3]) {
    const int64_t pad = padded ? 16 : 0;
    st[2] = d + pad * tu_rng_range(rng, 0, 1);
    st[1] = h * st[2] + pad * tu_rng_range(rng, 0, 2);
    st[0] = (s + (padded ? 2 : 0)) * st[1] + pad * tu_rng_range(rng, 0, 1);
}

static int64_t span_of(int64_t b, const int64_t st[3], int64_t s, int64_t h, int64_t d) {
    return (b - 1) * st[0] + (s - 1) * st[1] + (h - 1) * st[2] + d + 64; /* + slack */
}

static int32_t slice_of(const f8_inst *x, int64_t b, int64_t h) {
    return (int32_t)((x->c.layout_batch == 1 ? 0 : b) * x->c.layout_heads + h / x->head_div);
}

/* Quantize one tensor [B, S, H, D] with per-(b, h) amax scales (descale
 * may be NULL: scale 1). vals: packed [B, S, H, D] floats. */
static void quantize(uint8_t *dst, const int64_t st[3], const float *vals, int64_t B, int64_t S,
                     int64_t H, int64_t D, float *descale) {
    for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h) {
            float amax = 0.0f;
            for (int64_t s = 0; s < S; ++s)
                for (int64_t d = 0; d < D; ++d)
                    amax = fmaxf(amax, fabsf(vals[((b * S + s) * H + h) * D + d]));
            const int scaled = descale != NULL && amax > 0.0f;
            const float inv = scaled ? 448.0f / amax : 1.0f;
            if (descale != NULL) descale[b * H + h] = scaled ? amax / 448.0f : 1.0f;
            for (int64_t s = 0; s < S; ++s)
                for (int64_t d = 0; d < D; ++d)
                    dst[b * st[0] + s * st[1] + h * st[2] + d] =
                        tu_f32_to_e4m3(vals[((b * S + s) * H + h) * D + d] * inv);
        }
}

/* e4m3 decode by table (filled by f8_inst_create): the references decode
 * ~10^9 codes per GPU suite run, and tu_e4m3_to_f32 calls ldexp. */
static float e4m3_table[256];

static void fill_e4m3_table(void) {
    for (int i = 0; i < 256; ++i) e4m3_table[i] = tu_e4m3_to_f32((uint8_t)i);
}

/* descale x decode, the definition in sparsek.h (the product in fp32). */
static double deq(const uint8_t *t, const int64_t st[3], const float *descale, int64_t H,
                  int64_t b, int64_t s, int64_t h, int64_t d) {
    const float f = descale != NULL ? descale[b * H + h] : 1.0f;
    return (double)(f * e4m3_table[t[b * st[0] + s * st[1] + h * st[2] + d]]);
}

static int admitted(const f8_inst *x, int64_t b, int64_t h, int64_t q, int64_t k) {
    const f8_case *c = &x->c;
    if (!x->mask[((int64_t)slice_of(x, b, h) * x->rb + q / c->block_q) * x->cb + k / c->block_k])
        return 0;
    return !c->causal || k <= q + (c->seq_k - c->seq_q);
}

static double descale_of(const float *descale, int64_t H, int64_t b, int64_t h) {
    return descale != NULL ? (double)descale[b * H + h] : 1.0;
}

/* The naive FP8 attention row (b, h, q): scores Q8 K8 summed as mma_sum
 * does with `frac` bits, times the descales and the scale (x gain), each
 * weight p = exp(s - max) rounded to e4m3 before P V (the row sum from the
 * unrounded p), LSE = max + log(sum). drop_last skips the row's last
 * admitted key (a deliberate defect for the tests of the rule). o: D
 * outputs; returns the LSE (-inf for a row without keys, o = 0).
 * work: 2 Sk + 2 D doubles. */
static double naive_fp8_row(const f8_inst *x, int64_t b, int64_t h, int64_t q, int frac,
                            double gain, int drop_last, double *o, double *work) {
    const f8_case *c = &x->c;
    const int64_t D = c->head_dim, hk = h / x->group;
    const double scale = c->scale != 0.0f ? c->scale : 1.0 / sqrt((double)D);
    const double f = scale * gain * descale_of(x->q_descale, c->heads_q, b, h) *
                     descale_of(x->k_descale, c->heads_kv, b, hk);
    double *s = work, *p8 = work + c->seq_k, *qc = p8 + c->seq_k, *kc = qc + D;
    for (int64_t d = 0; d < D; ++d)
        qc[d] = e4m3_table[x->q8[b * x->qs[0] + q * x->qs[1] + h * x->qs[2] + d]];
    int64_t last = -1;
    for (int64_t k = 0; k < c->seq_k; ++k)
        if (admitted(x, b, h, q, k)) last = k;
    double m = -INFINITY, l = 0.0;
    for (int64_t k = 0; k < c->seq_k; ++k) {
        s[k] = NAN;
        if (!admitted(x, b, h, q, k) || (drop_last && k == last)) continue;
        for (int64_t d = 0; d < D; ++d)
            kc[d] = e4m3_table[x->k8[b * x->ks[0] + k * x->ks[1] + hk * x->ks[2] + d]];
        s[k] = f * sk_fp8_mma_sum(qc, kc, D, frac);
        m = fmax(m, s[k]);
    }
    for (int64_t d = 0; d < D; ++d) o[d] = 0.0;
    if (m == -INFINITY) return -INFINITY;
    for (int64_t k = 0; k < c->seq_k; ++k) {
        if (isnan(s[k])) continue;
        const double p = exp(s[k] - m);
        p8[k] = (double)tu_e4m3_to_f32(tu_f32_to_e4m3((float)p));
        l += p;
    }
    for (int64_t d = 0; d < D; ++d) {
        double acc = 0.0;
        for (int64_t k = 0; k < c->seq_k; ++k)
            if (!isnan(s[k])) acc += p8[k] * deq(x->v8, x->vs, x->v_descale, c->heads_kv, b, k, hk, d);
        o[d] = acc / l;
    }
    return m + log(l);
}

/* Reference, yardsticks and tolerances of row (b, h, q). */
static void reference_row(f8_inst *x, int64_t b, int64_t h, int64_t q, double *s, double *qrow) {
    const f8_case *c = &x->c;
    const int64_t D = c->head_dim, hk = h / x->group, row = (b * c->heads_q + h) * c->seq_q + q;
    const double scale = c->scale != 0.0f ? c->scale : 1.0 / sqrt((double)D);
    for (int64_t d = 0; d < D; ++d)
        qrow[d] = deq(x->q8, x->qs, x->q_descale, c->heads_q, b, q, h, d);
    double m = -INFINITY, smag = 0.0, vmax = 0.0;
    for (int64_t k = 0; k < c->seq_k; ++k) {
        s[k] = NAN;
        if (!admitted(x, b, h, q, k)) continue;
        double dot = 0.0, mag = 0.0;
        for (int64_t d = 0; d < D; ++d) {
            const double kv = deq(x->k8, x->ks, x->k_descale, c->heads_kv, b, k, hk, d);
            dot += qrow[d] * kv;
            mag += fabs(qrow[d] * kv);
            vmax = fmax(vmax, fabs(deq(x->v8, x->vs, x->v_descale, c->heads_kv, b, k, hk, d)));
        }
        s[k] = scale * dot;
        smag = fmax(smag, fabs(scale) * mag);
        m = fmax(m, s[k]);
    }
    double *o = x->ref_o + ((b * c->seq_q + q) * c->heads_q + h) * D;
    double l = 0.0, yard = 0.0;
    for (int64_t d = 0; d < D; ++d) o[d] = 0.0;
    if (m > -INFINITY) {
        /* s[k] becomes p_k, s[Sk + k] its e4m3 rounding (NaN: not admitted). */
        double *p8 = s + c->seq_k;
        for (int64_t k = 0; k < c->seq_k; ++k) {
            if (isnan(s[k])) continue;
            s[k] = exp(s[k] - m);
            p8[k] = (double)tu_e4m3_to_f32(tu_f32_to_e4m3((float)s[k]));
            l += s[k];
        }
        for (int64_t d = 0; d < D; ++d) {
            double acc = 0.0, acc8 = 0.0;
            for (int64_t k = 0; k < c->seq_k; ++k) {
                if (isnan(s[k])) continue;
                const double v = deq(x->v8, x->vs, x->v_descale, c->heads_kv, b, k, hk, d);
                acc += s[k] * v;
                acc8 += p8[k] * v;
            }
            o[d] = acc / l;
            yard = fmax(yard, fabs(acc8 / l - o[d]));
        }
    }
    x->ref_lse[row] = m > -INFINITY ? m + log(l) : -INFINITY;
    /* The second yardstick: the naive FP8 row with the tensor cores' score
     * accumulation too (scratch after s's 2 Sk doubles). */
    double *o8 = s + 2 * c->seq_k;
    const double lse8 = naive_fp8_row(x, b, h, q, F8_MMA_FRAC, 1.0, 0, o8, o8 + D);
    for (int64_t d = 0; d < D && m > -INFINITY; ++d) yard = fmax(yard, fabs(o8[d] - o[d]));
    x->yard[row] = yard;
    x->lse_yard[row] = m > -INFINITY ? fabs(lse8 - x->ref_lse[row]) : 0.0;
    x->row_tol[row] = F8_U_ACC * (smag * vmax + vmax);
    x->lse_tol[row] = 2.0 * (F8_U_ACC * smag + 0x1p-23 * (fabs(x->ref_lse[row]) + 1.0)) + F8_ATOL;
}

static void make_mask(f8_inst *x, tu_rng *rng) {
    const f8_case *c = &x->c;
    for (int64_t g = 0; g < x->slices * x->rb; ++g) {
        const int empty = c->empty_rows && g % 3 == 1;
        for (int64_t j = 0; j < x->cb; ++j)
            x->mask[g * x->cb + j] = !empty && tu_rng_uniform(rng) < c->density;
    }
}

/* K/V blocks of KV head (b, hk) that no query head of the group selects:
 * NaN codes (the kernel must not read them). */
static void poison_unselected(f8_inst *x) {
    const f8_case *c = &x->c;
    for (int64_t b = 0; b < c->batch; ++b)
        for (int64_t hk = 0; hk < c->heads_kv; ++hk)
            for (int64_t j = 0; j < x->cb; ++j) {
                int used = 0;
                for (int64_t h = hk * x->group; h < (hk + 1) * x->group && !used; ++h)
                    for (int64_t i = 0; i < x->rb && !used; ++i)
                        used = x->mask[((int64_t)slice_of(x, b, h) * x->rb + i) * x->cb + j];
                if (used) continue;
                for (int64_t k = j * c->block_k; k < (j + 1) * c->block_k && k < c->seq_k; ++k)
                    for (int64_t d = 0; d < c->head_dim; ++d) {
                        x->k8[b * x->ks[0] + k * x->ks[1] + hk * x->ks[2] + d] = F8_NAN_CODE;
                        x->v8[b * x->vs[0] + k * x->vs[1] + hk * x->vs[2] + d] = F8_NAN_CODE;
                    }
            }
}

static float *random_values(tu_rng *rng, int64_t n, float amp) {
    float *v = (float *)malloc((size_t)n * sizeof(float));
    if (v != NULL)
        for (int64_t i = 0; i < n; ++i) v[i] = (float)tu_rng_normal(rng) * amp;
    return v;
}

/* Packed [B, S, H, D] real values reshaped by c->k_shape (key_shape.h). */
static void shape_values(float *v, const f8_case *c, int64_t B, int64_t S, int64_t H, int is_k) {
    const int64_t D = c->head_dim;
    const double scale = c->scale != 0.0f ? c->scale : 1.0 / sqrt((double)D);
    int64_t i = 0;
    for (int64_t b = 0; b < B; ++b)
        for (int64_t s = 0; s < S; ++s)
            for (int64_t h = 0; h < H; ++h)
                for (int64_t d = 0; d < D; ++d, ++i)
                    v[i] = (float)tu_key_shape((tu_shape)c->k_shape, c->k_shape_arg, scale, is_k,
                                               s, S, d, v[i]);
}

int f8_inst_create(f8_inst *x, const f8_case *c) {
    memset(x, 0, sizeof *x);
    x->c = *c;
    fill_e4m3_table();
    const int64_t B = c->batch, Sq = c->seq_q, Sk = c->seq_k, Hq = c->heads_q, Hk = c->heads_kv,
                  D = c->head_dim;
    const float amp = c->amp != 0.0f ? c->amp : 1.0f;
    tu_rng rng;
    tu_rng_seed(&rng, c->seed);
    x->group = Hq / Hk;
    x->rb = (Sq + c->block_q - 1) / c->block_q;
    x->cb = (Sk + c->block_k - 1) / c->block_k;
    x->head_div = c->layout_heads == 1 ? (int32_t)Hq : c->layout_heads == Hq ? 1 : (int32_t)x->group;
    x->slices = (int64_t)c->layout_batch * c->layout_heads;
    strides_of(Sq, Hq, D, c->padded, &rng, x->qs);
    strides_of(Sk, Hk, D, c->padded, &rng, x->ks);
    strides_of(Sk, Hk, D, c->padded, &rng, x->vs);
    strides_of(Sq, Hq, D, c->padded, &rng, x->os);
    x->q_alloc = span_of(B, x->qs, Sq, Hq, D);
    x->k_alloc = span_of(B, x->ks, Sk, Hk, D);
    x->v_alloc = span_of(B, x->vs, Sk, Hk, D);
    x->o_alloc = span_of(B, x->os, Sq, Hq, D);
    x->q8 = (uint8_t *)malloc((size_t)x->q_alloc);
    x->k8 = (uint8_t *)malloc((size_t)x->k_alloc);
    x->v8 = (uint8_t *)malloc((size_t)x->v_alloc);
    x->mask = (uint8_t *)calloc((size_t)(x->slices * x->rb * x->cb), 1);
    const size_t rows = (size_t)(B * Hq * Sq);
    x->ref_o = (double *)malloc((size_t)(B * Sq * Hq * D) * sizeof(double));
    x->ref_lse = (double *)malloc(rows * sizeof(double));
    x->yard = (double *)malloc(rows * sizeof(double));
    x->row_tol = (double *)malloc(rows * sizeof(double));
    x->lse_tol = (double *)malloc(rows * sizeof(double));
    x->lse_yard = (double *)malloc(rows * sizeof(double));
    if (c->with_descale) {
        x->q_descale = (float *)malloc((size_t)(B * Hq) * sizeof(float));
        x->k_descale = (float *)malloc((size_t)(B * Hk) * sizeof(float));
        x->v_descale = (float *)malloc((size_t)(B * Hk) * sizeof(float));
    }
    float *qv = random_values(&rng, B * Sq * Hq * D, amp);
    float *kv = random_values(&rng, B * Sk * Hk * D, amp);
    float *vv = random_values(&rng, B * Sk * Hk * D, amp);
    double *s = (double *)malloc((size_t)(4 * Sk + 4 * D) * sizeof(double));
    double *qrow = (double *)malloc((size_t)D * sizeof(double));
    int ok = x->q8 && x->k8 && x->v8 && x->mask && x->ref_o && x->ref_lse && x->yard &&
             x->row_tol && x->lse_tol && x->lse_yard && qv && kv && vv && s && qrow &&
             (!c->with_descale || (x->q_descale && x->k_descale && x->v_descale));
    if (ok) {
        memset(x->q8, F8_NAN_CODE, (size_t)x->q_alloc);
        memset(x->k8, F8_NAN_CODE, (size_t)x->k_alloc);
        memset(x->v8, F8_NAN_CODE, (size_t)x->v_alloc);
        if (c->k_shape != TU_SHAPE_NONE) {
            shape_values(qv, c, B, Sq, Hq, 0);
            shape_values(kv, c, B, Sk, Hk, 1);
        }
        quantize(x->q8, x->qs, qv, B, Sq, Hq, D, x->q_descale);
        quantize(x->k8, x->ks, kv, B, Sk, Hk, D, x->k_descale);
        quantize(x->v8, x->vs, vv, B, Sk, Hk, D, x->v_descale);
        make_mask(x, &rng);
        poison_unselected(x);
        const sk_grid grid = tu_grid(Sq, Sk, c->block_q, c->block_k, c->layout_batch,
                                     c->layout_heads);
        ok = nr_bsr_from_mask(&x->layout, &grid, x->mask) == 0;
    }
    if (ok)
        for (int64_t b = 0; b < B; ++b)
            for (int64_t h = 0; h < Hq; ++h)
                for (int64_t q = 0; q < Sq; ++q) reference_row(x, b, h, q, s, qrow);
    free(qv);
    free(kv);
    free(vv);
    free(s);
    free(qrow);
    if (!ok) f8_inst_destroy(x);
    return ok ? 0 : -1;
}

void f8_inst_destroy(f8_inst *x) {
    free(x->q8);
    free(x->k8);
    free(x->v8);
    free(x->q_descale);
    free(x->k_descale);
    free(x->v_descale);
    free(x->mask);
    nr_bsr_free(&x->layout);
    free(x->ref_o);
    free(x->ref_lse);
    free(x->yard);
    free(x->row_tol);
    free(x->lse_tol);
    free(x->lse_yard);
    memset(x, 0, sizeof *x);
}

void f8_case_describe(const f8_case *c, char *buf, size_t len) {
    snprintf(buf, len,
             "fp8->%s B%lld Sq%lld Sk%lld Hq%lld Hkv%lld D%lld blocks %dx%d%s layout %dx%d "
             "density %.2f%s%s%s%s amp %g shape %d:%g seed 0x%llx",
             c->out_dtype == SK_DTYPE_F16 ? "f16" : "bf16", (long long)c->batch,
             (long long)c->seq_q, (long long)c->seq_k, (long long)c->heads_q,
             (long long)c->heads_kv, (long long)c->head_dim, (int)c->block_q, (int)c->block_k,
             c->causal ? " causal" : "", (int)c->layout_batch, (int)c->layout_heads, c->density,
             c->empty_rows ? " empty-rows" : "", c->padded ? " padded" : "",
             c->with_descale ? " descales" : "", c->with_lse ? " lse" : "", (double)c->amp,
             c->k_shape, (double)c->k_shape_arg, (unsigned long long)c->seed);
}

void f8_inst_desc(const f8_inst *x, sk_backend backend, sk_attention_desc *d, const float *qd,
                  const float *kd, const float *vd) {
    const f8_case *c = &x->c;
    sk_attention_desc_init(d, sizeof *d);
    d->backend = backend;
    d->dtype = SK_DTYPE_E4M3;
    d->out_dtype = c->out_dtype;
    d->batch = c->batch;
    d->seq_q = c->seq_q;
    d->seq_k = c->seq_k;
    d->heads_q = c->heads_q;
    d->heads_kv = c->heads_kv;
    d->head_dim = c->head_dim;
    d->scale = c->scale;
    d->mask = c->causal ? SK_MASK_CAUSAL : SK_MASK_NONE;
    memcpy(d->q_strides, x->qs, sizeof x->qs);
    memcpy(d->k_strides, x->ks, sizeof x->ks);
    memcpy(d->v_strides, x->vs, sizeof x->vs);
    memcpy(d->o_strides, x->os, sizeof x->os);
    d->q_descale = qd;
    d->k_descale = kd;
    d->v_descale = vd;
}

static int in_tensor(const f8_inst *x, int64_t i) {
    const f8_case *c = &x->c;
    /* Element i of O's allocation is logical when it decodes to in-range
     * indices. Strides are nested ([B, S, H, D] order, each >= the inner
     * extent), so division peels them. */
    const int64_t b = i / x->os[0], r0 = i % x->os[0];
    const int64_t s = r0 / x->os[1], r1 = r0 % x->os[1];
    const int64_t h = r1 / x->os[2], d = r1 % x->os[2];
    return b < c->batch && s < c->seq_q && h < c->heads_q && d < c->head_dim;
}

int64_t f8_inst_compare(const f8_inst *x, const void *o, const float *lse, const char *what,
                        int tight, int max_print) {
    const f8_case *c = &x->c;
    const int64_t D = c->head_dim;
    const double u = tu_unit_roundoff(c->out_dtype);
    int64_t bad = 0, printed = 0;
    char desc[320];
    f8_case_describe(c, desc, sizeof desc);
    for (int64_t b = 0; b < c->batch; ++b)
        for (int64_t q = 0; q < c->seq_q; ++q)
            for (int64_t h = 0; h < c->heads_q; ++h) {
                const int64_t row = (b * c->heads_q + h) * c->seq_q + q;
                for (int64_t d = 0; d < D; ++d) {
                    const double r = x->ref_o[((b * c->seq_q + q) * c->heads_q + h) * D + d];
                    const double g = tu_load(o, c->out_dtype,
                                             b * x->os[0] + q * x->os[1] + h * x->os[2] + d);
                    const double tol =
                        tight ? 2.0 * (u * fabs(r) + x->row_tol[row] * F8_TIGHT) + F8_ATOL
                              : 2.0 * (x->yard[row] + u * fabs(r) + x->row_tol[row]) + F8_ATOL;
                    if (!(fabs(g - r) <= tol)) {
                        if (printed++ < max_print)
                            printf("    %s: O[b=%lld, q=%lld, h=%lld, d=%lld] = %.6g, reference "
                                   "%.6g, |err| %.3g > tol %.3g (yardstick %.3g)\n      %s\n",
                                   what, (long long)b, (long long)q, (long long)h, (long long)d,
                                   g, r, fabs(g - r), tol, x->yard[row], desc);
                        ++bad;
                    }
                }
                if (lse != NULL) {
                    const double r = x->ref_lse[row], g = lse[row];
                    const double tol = tight ? x->lse_tol[row] * F8_TIGHT
                                             : x->lse_tol[row] + 2.0 * x->lse_yard[row];
                    const int ok = isinf(r) ? (isinf(g) && g < 0) : fabs(g - r) <= tol;
                    if (!ok) {
                        if (printed++ < max_print)
                            printf("    %s: LSE[b=%lld, h=%lld, q=%lld] = %.8g, reference %.8g "
                                   "(tol %.3g, yardstick %.3g)\n      %s\n",
                                   what, (long long)b, (long long)h, (long long)q, g, r,
                                   tol, x->lse_yard[row], desc);
                        ++bad;
                    }
                }
            }
    /* O's padding keeps the caller's 0xFFFF fill. */
    const uint16_t *o16 = (const uint16_t *)o;
    for (int64_t i = 0; i < x->o_alloc; ++i)
        if (!in_tensor(x, i) && o16[i] != 0xFFFFu) {
            if (printed++ < max_print)
                printf("    %s: O padding element %lld was written (0x%04x)\n      %s\n", what,
                       (long long)i, o16[i], desc);
            ++bad;
        }
    if (bad > max_print && max_print > 0) printf("    %s: %lld bad elements in all\n", what, (long long)bad);
    return bad;
}

int f8_inst_model(const f8_inst *x, f8_model which, void *o, float *lse) {
    const f8_case *c = &x->c;
    const int64_t D = c->head_dim;
    double *work = (double *)malloc((size_t)(2 * c->seq_k + 3 * D) * sizeof(double));
    if (work == NULL) return -1;
    double *orow = work + 2 * c->seq_k + 2 * D;
    const int frac = which == F8_MODEL_ACC10 ? 10 : F8_MMA_FRAC;
    const double gain = which == F8_MODEL_GAIN ? 1.0 + 0x1p-8 : 1.0;
    memset(o, 0xFF, (size_t)x->o_alloc * 2);
    for (int64_t b = 0; b < c->batch; ++b)
        for (int64_t h = 0; h < c->heads_q; ++h)
            for (int64_t q = 0; q < c->seq_q; ++q) {
                const double l = naive_fp8_row(x, b, h, q, frac, gain,
                                               which == F8_MODEL_DROP_KEY, orow, work);
                if (lse != NULL) lse[(b * c->heads_q + h) * c->seq_q + q] = (float)l;
                for (int64_t d = 0; d < D; ++d)
                    tu_store(o, c->out_dtype, b * x->os[0] + q * x->os[1] + h * x->os[2] + d,
                             (float)orow[d]);
            }
    free(work);
    return 0;
}

double f8_inst_yard_total(const f8_inst *x) {
    double t = 0.0;
    for (int64_t r = 0; r < x->c.batch * x->c.heads_q * x->c.seq_q; ++r) t += x->yard[r];
    return t;
}

void f8_quantize_desc(sk_quantize_desc *q, sk_backend backend, sk_dtype dtype, int64_t B,
                      int64_t S, int64_t H, int64_t D, const int64_t *st) {
    sk_quantize_desc_init(q, sizeof *q);
    q->backend = backend;
    q->dtype = dtype;
    q->batch = B;
    q->seq = S;
    q->heads = H;
    q->head_dim = D;
    if (st != NULL) memcpy(q->x_strides, st, sizeof q->x_strides);
}

uint8_t *f8_inst_vt(const f8_inst *x, uint8_t near, uint8_t far, int64_t *bytes) {
    const f8_case *c = &x->c;
    const int64_t pad = sk_vt_seq_pad(c->seq_k), near_end = (c->seq_k + 31) / 32 * 32;
    *bytes = c->batch * c->heads_kv * c->head_dim * pad;
    uint8_t *vt = (uint8_t *)malloc((size_t)*bytes);
    if (vt == NULL) return NULL;
    for (int64_t b = 0; b < c->batch; ++b)
        for (int64_t h = 0; h < c->heads_kv; ++h)
            for (int64_t d = 0; d < c->head_dim; ++d) {
                uint8_t *row = vt + ((b * c->heads_kv + h) * c->head_dim + d) * pad;
                for (int64_t s = 0; s < pad; ++s)
                    row[sk_vt_col(s)] =
                        s < c->seq_k
                            ? x->v8[b * x->vs[0] + s * x->vs[1] + h * x->vs[2] + d]
                            : (s < near_end ? near : far);
            }
    return vt;
}

void f8_case_cpu_variant(f8_case *c, tu_rng *rng, int v) {
    memset(c, 0, sizeof *c);
    c->seed = tu_rng_next(rng);
    c->batch = tu_rng_range(rng, 1, 2);
    c->heads_kv = tu_rng_range(rng, 1, 2);
    c->heads_q = c->heads_kv * (v % 3 == 0 ? 1 : v % 3 == 1 ? 2 : 4);
    c->head_dim = v % 2 ? 64 : 128;
    c->block_q = v % 4 < 2 ? 64 : 128;
    c->block_k = v % 8 < 4 ? 64 : 128;
    c->seq_q = tu_rng_range(rng, 1, 200);
    c->seq_k = v % 5 == 0 ? c->seq_q : tu_rng_range(rng, 1, 260);
    c->causal = v % 2;
    c->scale = v % 6 == 5 ? -0.09f : 0.0f;
    c->layout_batch = tu_rng_range(rng, 0, 1) ? (int32_t)c->batch : 1;
    c->layout_heads = v % 3 == 0 ? 1 : v % 3 == 1 ? (int32_t)c->heads_kv : (int32_t)c->heads_q;
    c->density = v % 4 == 0 ? 1.0 : 0.6;
    c->empty_rows = v % 5 == 2;
    c->padded = v % 3 == 2;
    c->with_lse = v % 7 != 3;
    c->with_descale = v % 4 != 1;
    c->out_dtype = v % 2 ? SK_DTYPE_F16 : SK_DTYPE_BF16;
    c->amp = c->with_descale ? 2.0f : 0.5f;
}
