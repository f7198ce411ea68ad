/*
 * fz_attn_ref.c - see fz_attn_ref.h.
 */
#include "fz_attn_ref.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/naive_ref.h"
#include "common/test_util.h"
#include "fz_finding.h"
#include "fz_layout_ref.h"

int fz_scale_refused(float scale) {
    if (!isfinite(scale)) return 1;
    const double x = fabs((double)scale) * 1.4426950408889634; /* log2(e) */
    if (x < (double)FLT_MAX) return 0;
    return x >= 0x1.0p128 - 0x1.0p103 ? 1 : -1; /* fp32 rounds to inf from 2^128 - 2^103 */
}

void fz_attn_from_desc(fz_attn *a, const sk_attention_desc *d) {
    memset(a, 0, sizeof *a);
    a->batch = d->batch;
    a->seq_q = d->seq_q;
    a->seq_k = d->seq_k;
    a->heads_q = d->heads_q;
    a->heads_kv = d->heads_kv;
    a->head_dim = d->head_dim;
    a->scale =
        d->scale != 0.0f ? (double)d->scale : (double)(float)(1.0 / sqrt((double)d->head_dim));
    a->causal = d->mask == SK_MASK_CAUSAL;
    fz_tensor_init(&a->q, d->batch, d->seq_q, d->heads_q, d->head_dim, d->q_strides, d->dtype);
    fz_tensor_init(&a->k, d->batch, d->seq_k, d->heads_kv, d->head_dim, d->k_strides, d->dtype);
    fz_tensor_init(&a->v, d->batch, d->seq_k, d->heads_kv, d->head_dim, d->v_strides, d->dtype);
    fz_tensor_init(&a->o, d->batch, d->seq_q, d->heads_q, d->head_dim, d->o_strides, d->dtype);
}

double fz_attn_work(const fz_attn *a) {
    return (double)a->batch * (double)a->heads_q * (double)a->seq_q * (double)a->seq_k *
           (double)a->head_dim;
}

/* Rows of one (batch, KV head) in fp64: out[j * D + e]. */
static void gather(const fz_tensor *t, const void *buf, int64_t b, int64_t h, double *out) {
    for (int64_t s = 0; s < t->ext[1]; ++s)
        for (int64_t e = 0; e < t->dim; ++e)
            out[s * t->dim + e] = (double)tu_load(buf, t->dtype, fz_tensor_at(t, b, s, h, e));
}

static double norm2(const double *x, int64_t n) {
    double s = 0.0;
    for (int64_t i = 0; i < n; ++i) s += x[i] * x[i];
    return sqrt(s);
}

typedef struct row_ctx {
    const fz_attn *a;
    const double *kd, *vd;
    double *qd, *oref;
    uint8_t *allow, *sel;
    const char *api;
} row_ctx;

/* One query row; returns 0 when its magnitudes leave the compared range. */
static int check_row(row_ctx *c, int64_t b, int64_t h, int64_t i, const void *o, const float *lse) {
    const fz_attn *a = c->a;
    const int64_t D = a->head_dim, Sk = a->seq_k;
    int64_t n = 0;
    double kmax = 0.0, vmax = 0.0;
    for (int64_t j = 0; j < Sk; ++j) {
        c->allow[j] = 0;
        if (!c->sel[j]) continue;
        if (a->causal && j > i + (Sk - a->seq_q)) continue;
        c->allow[j] = 1;
        ++n;
        const double kn = norm2(c->kd + j * D, D);
        if (kn > kmax) kmax = kn;
        for (int64_t e = 0; e < D; ++e)
            if (fabs(c->vd[j * D + e]) > vmax) vmax = fabs(c->vd[j * D + e]);
    }
    const double smag = fabs(a->scale) * norm2(c->qd, D) * kmax;
    if (smag > 0x1.0p100) return 0;
    double lref;
    nr_attention_row(Sk, D, a->scale, c->qd, c->kd, D, c->vd, D, c->allow, c->oref, &lref);
    const double u32 = tu_unit_roundoff(SK_DTYPE_F32), ud = tu_unit_roundoff(a->o.dtype);
    for (int64_t e = 0; e < D; ++e) {
        const double got = (double)tu_load(o, a->o.dtype, fz_tensor_at(&a->o, b, i, h, e));
        const double ref = c->oref[e];
        const double tol = 2.0 * (ud * fabs(ref) + u32 * sqrt((double)D) * smag * vmax +
                                  u32 * sqrt((double)n) * vmax) +
                           0x1.0p-24;
        const int ok = n == 0 ? got == 0.0 : isfinite(got) && fabs(got - ref) <= tol;
        FZ_REQUIRE(ok,
                   "%s: O[b %lld, q %lld, h %lld, %lld] = %.9g, reference %.9g (tolerance %.3g, "
                   "%lld admissible keys)",
                   c->api, (long long)b, (long long)i, (long long)h, (long long)e, got, ref, tol,
                   (long long)n);
    }
    if (lse != NULL) {
        const double got = (double)lse[(b * a->heads_q + h) * a->seq_q + i];
        const double tol =
            2.0 * u32 * (fabs(lref) + sqrt((double)D) * smag + sqrt((double)n)) + 0x1.0p-24;
        const int ok = n == 0 ? got == -INFINITY : isfinite(got) && fabs(got - lref) <= tol;
        FZ_REQUIRE(ok,
                   "%s: LSE[b %lld, h %lld, q %lld] = %.9g, reference %.9g (tolerance %.3g, %lld "
                   "admissible keys)",
                   c->api, (long long)b, (long long)h, (long long)i, got, lref, tol, (long long)n);
    }
    return 1;
}

int fz_check_attention(const fz_attn *a, const sk_bsr *layout, const void *q, const void *k,
                       const void *v, const void *o, const float *lse, const char *api) {
    const int64_t D = a->head_dim, Sk = a->seq_k, group = a->heads_q / a->heads_kv;
    const int64_t bq = layout->grid.block_rows, bk = layout->grid.block_cols;
    const int64_t rb = (a->seq_q - 1) / bq + 1, cb = (Sk - 1) / bk + 1;
    row_ctx c;
    c.a = a;
    c.api = api;
    double *kd = (double *)malloc((size_t)(Sk * D) * sizeof(double));
    double *vd = (double *)malloc((size_t)(Sk * D) * sizeof(double));
    c.qd = (double *)malloc((size_t)D * sizeof(double));
    c.oref = (double *)malloc((size_t)D * sizeof(double));
    c.allow = (uint8_t *)malloc((size_t)Sk);
    c.sel = (uint8_t *)malloc((size_t)Sk);
    uint8_t *blocks = (uint8_t *)malloc((size_t)cb);
    if (!kd || !vd || !c.qd || !c.oref || !c.allow || !c.sel || !blocks)
        fz_fail("harness: out of memory");
    c.kd = kd;
    c.vd = vd;
    int compared = 1;
    for (int64_t b = 0; b < a->batch && compared; ++b)
        for (int64_t hk = 0; hk < a->heads_kv && compared; ++hk) {
            gather(&a->k, k, b, hk, kd);
            gather(&a->v, v, b, hk, vd);
            for (int64_t h = hk * group; h < (hk + 1) * group && compared; ++h) {
                const int64_t s = fz_slice_of(&layout->grid, b, h, a->heads_q, a->heads_kv);
                for (int64_t i = 0; i < a->seq_q && compared; ++i) {
                    fz_layout_row(layout, rb, s, i / bq, cb, blocks);
                    for (int64_t j = 0; j < Sk; ++j) c.sel[j] = blocks[j / bk];
                    for (int64_t e = 0; e < D; ++e)
                        c.qd[e] = (double)tu_load(q, a->q.dtype, fz_tensor_at(&a->q, b, i, h, e));
                    compared = check_row(&c, b, h, i, o, lse);
                }
            }
        }
    free(kd);
    free(vd);
    free(c.qd);
    free(c.oref);
    free(c.allow);
    free(c.sel);
    free(blocks);
    return compared;
}
