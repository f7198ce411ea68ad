/*
 * fz_bwd_ref.c - see fz_bwd_ref.h.
 */
#include "fz_bwd_ref.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/naive_bwd.h"
#include "common/test_util.h"
#include "fz_finding.h"
#include "fz_layout_ref.h"

void fz_bwd_from_desc(fz_bwd *p, const sk_attention_desc *d,
                      const sk_attention_backward_desc *bwd) {
    memset(p, 0, sizeof *p);
    fz_attn_from_desc(&p->a, d);
    fz_tensor_init(&p->dout, d->batch, d->seq_q, d->heads_q, d->head_dim, bwd->dout_strides,
                   d->dtype);
    fz_tensor_init(&p->dq, d->batch, d->seq_q, d->heads_q, d->head_dim, bwd->dq_strides, d->dtype);
    fz_tensor_init(&p->dk, d->batch, d->seq_k, d->heads_kv, d->head_dim, bwd->dk_strides, d->dtype);
    fz_tensor_init(&p->dv, d->batch, d->seq_k, d->heads_kv, d->head_dim, bwd->dv_strides, d->dtype);
}

/* A tensor in fp64, packed [B, S, H * rep, D]: head h of the result reads
 * head h / rep (rep > 1 repeats each KV head for the naive backward). */
static double *gather(const fz_tensor *t, const void *buf, int64_t rep) {
    const int64_t B = t->ext[0], S = t->ext[1], H = t->ext[2] * rep, D = t->dim;
    double *out = (double *)malloc((size_t)(B * S * H * D) * sizeof(double));
    if (out == NULL) fz_fail("harness: out of memory");
    for (int64_t b = 0; b < B; ++b)
        for (int64_t s = 0; s < S; ++s)
            for (int64_t h = 0; h < H; ++h)
                for (int64_t e = 0; e < D; ++e)
                    out[((b * S + s) * H + h) * D + e] =
                        (double)tu_load(buf, t->dtype, fz_tensor_at(t, b, s, h / rep, e));
    return out;
}

/* The largest row norm of a packed [rows, D] array. */
static double max_norm(const double *x, int64_t rows, int64_t D) {
    double m = 0.0;
    for (int64_t r = 0; r < rows; ++r) {
        double s = 0.0;
        for (int64_t e = 0; e < D; ++e) s += x[r * D + e] * x[r * D + e];
        if (sqrt(s) > m) m = sqrt(s);
    }
    return m;
}

/* allow[b, h, q, k] of the forward's masking. */
static uint8_t *allowed(const fz_attn *a, const sk_bsr *layout) {
    const int64_t B = a->batch, Hq = a->heads_q, Sq = a->seq_q, Sk = a->seq_k;
    const int64_t bq = layout->grid.block_rows, bk = layout->grid.block_cols;
    const int64_t rb = (Sq - 1) / bq + 1, cb = (Sk - 1) / bk + 1;
    uint8_t *allow = (uint8_t *)malloc((size_t)(B * Hq * Sq * Sk));
    uint8_t *blocks = (uint8_t *)malloc((size_t)cb);
    if (allow == NULL || blocks == NULL) fz_fail("harness: out of memory");
    for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < Hq; ++h) {
            const int64_t s = fz_slice_of(&layout->grid, b, h, Hq, a->heads_kv);
            for (int64_t i = 0; i < Sq; ++i) {
                fz_layout_row(layout, rb, s, i / bq, cb, blocks);
                uint8_t *row = allow + ((b * Hq + h) * Sq + i) * Sk;
                for (int64_t j = 0; j < Sk; ++j)
                    row[j] = blocks[j / bk] && !(a->causal && j > i + (Sk - Sq));
            }
        }
    free(blocks);
    return allow;
}

/* The gradient t (packed reference ref, bound err over [B, S, H * group,
 * D]) element by element, the group's heads summed. */
static void compare(const fz_tensor *t, const void *buf, const double *ref, const double *err,
                    int64_t group, const char *name, const char *api) {
    const int64_t B = t->ext[0], S = t->ext[1], H = t->ext[2], D = t->dim, Hr = H * group;
    const double ud = tu_unit_roundoff(t->dtype);
    for (int64_t b = 0; b < B; ++b)
        for (int64_t s = 0; s < S; ++s)
            for (int64_t h = 0; h < H; ++h)
                for (int64_t e = 0; e < D; ++e) {
                    double r = 0.0, bound = 0.0;
                    for (int64_t g = 0; g < group; ++g) {
                        const int64_t x = ((b * S + s) * Hr + h * group + g) * D + e;
                        r += ref[x];
                        bound += err[x];
                    }
                    const double got = (double)tu_load(buf, t->dtype, fz_tensor_at(t, b, s, h, e));
                    const double tol = 2.0 * (ud * fabs(r) + bound) + 0x1.0p-24;
                    FZ_REQUIRE(isfinite(got) && fabs(got - r) <= tol,
                               "%s: %s[b %lld, s %lld, h %lld, %lld] = %.9g, reference %.9g "
                               "(tolerance %.3g)",
                               api, name, (long long)b, (long long)s, (long long)h, (long long)e,
                               got, r, tol);
                }
}

int fz_check_backward(const fz_bwd *p, const sk_bsr *layout, const void *q, const void *k,
                      const void *v, const void *dout, const void *dq, const void *dk,
                      const void *dv, const char *api) {
    const fz_attn *a = &p->a;
    const int64_t B = a->batch, Sq = a->seq_q, Sk = a->seq_k, Hq = a->heads_q, D = a->head_dim;
    const int64_t group = Hq / a->heads_kv;
    double *qd = gather(&a->q, q, 1), *dod = gather(&p->dout, dout, 1);
    double *kd = gather(&a->k, k, group), *vd = gather(&a->v, v, group);
    const size_t nq = (size_t)(B * Sq * Hq * D), nk = (size_t)(B * Sk * Hq * D);
    double *w = (double *)malloc((2 * nq + 4 * nk) * sizeof(double));
    if (w == NULL) fz_fail("harness: out of memory");
    double *dqr = w, *eq = w + nq, *dkr = w + 2 * nq, *ek = dkr + nk, *dvr = ek + nk,
           *ev = dvr + nk;
    int compared = 0;
    if (fabs(a->scale) * max_norm(qd, B * Sq * Hq, D) * max_norm(kd, B * Sk * Hq, D) <= 0x1.0p100) {
        uint8_t *allow = allowed(a, layout);
        nr_attention_backward(B, Sq, Sk, Hq, D, a->scale, a->q.dtype, qd, kd, vd, dod, allow, dqr,
                              dkr, dvr, eq, ek, ev);
        free(allow);
        /* Gradients near the dtype's range may round to inf: not compared. */
        const double top = (a->q.dtype == SK_DTYPE_F16 ? 65504.0 : (double)FLT_MAX) / 4.0;
        compared = 1;
        for (size_t x = 0; x < nq && compared; ++x) compared = fabs(dqr[x]) + eq[x] < top;
        for (size_t x = 0; x < nk && compared; ++x)
            compared = (fabs(dkr[x]) + ek[x]) * (double)group < top &&
                       (fabs(dvr[x]) + ev[x]) * (double)group < top;
    }
    if (compared) {
        compare(&p->dq, dq, dqr, eq, 1, "dQ", api);
        compare(&p->dk, dk, dkr, ek, group, "dK", api);
        compare(&p->dv, dv, dvr, ev, group, "dV", api);
    }
    free(qd);
    free(dod);
    free(kd);
    free(vd);
    free(w);
    return compared;
}
