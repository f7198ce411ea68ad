/*
 * naive_bwd.c - see naive_bwd.h.
 */
#include "common/naive_bwd.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/test_util.h"

/* The scratch of one row: per key s, P, dP, dS and the allowed list. */
typedef struct nb_row {
    double *s, *p, *dp, *ds, *o;
    int64_t *keys;
} nb_row;

/* The bound terms of one row (naive_bwd.h), added to eq/ek/ev. */
static void add_bounds(int64_t n, int64_t d, double scale, sk_dtype dtype, int operands,
                       const double *q, const double *k, const double *v, const double *dout,
                       int64_t row, double lse, double dl, const nb_row *w, const double *m,
                       double *eq, double *ek, double *ev) {
    const double u = 0x1.0p-24, ud = tu_unit_roundoff(dtype), sd = sqrt((double)d);
    /* P and dS rounded to the dtype as MMA operands: relative error ud,
     * plus eta (half the smallest subnormal) where they underflow. */
    const double uo = operands ? ud : 0.0;
    const double eta = !operands ? 0.0 : dtype == SK_DTYPE_F16 ? 0x1.0p-25 : 0x1.0p-134;
    double qn = 0.0, don = 0.0, kmax = 0.0, vmax = 0.0;
    for (int64_t x = 0; x < d; ++x) {
        qn += q[x] * q[x];
        don += dout[x] * dout[x];
    }
    qn = sqrt(qn), don = sqrt(don);
    for (int64_t t = 0; t < n; ++t) {
        const double *kr = k + w->keys[t] * row, *vr = v + w->keys[t] * row;
        double kk = 0.0;
        for (int64_t x = 0; x < d; ++x) {
            kk += kr[x] * kr[x];
            if (fabs(vr[x]) > vmax) vmax = fabs(vr[x]);
        }
        if (sqrt(kk) > kmax) kmax = sqrt(kk);
    }
    const double smag = fabs(scale) * qn * kmax, sn = sqrt((double)n);
    const double e_lse = u * (fabs(lse) + sd * smag + sn);
    double e_dl = 0.0, dot_abs = 0.0;
    for (int64_t x = 0; x < d; ++x) {
        const double e_o = ud * fabs(w->o[x]) + u * (sd * smag + sn) * vmax;
        e_dl += fabs(dout[x]) * e_o;
        dot_abs += fabs(dout[x] * w->o[x]);
    }
    e_dl += u * (sd + 1.0) * dot_abs;
    for (int64_t t = 0; t < n; ++t) {
        const int64_t key = w->keys[t];
        const double *kr = k + key * row, *vr = v + key * row;
        double vn = 0.0;
        for (int64_t x = 0; x < d; ++x) vn += vr[x] * vr[x];
        const double rel_p =
            e_lse + u * (sd * smag + fabs(w->s[t]) + fabs(w->s[t] - lse) + 1.0);
        const double e_ds = w->p[t] * (u * sd * don * sqrt(vn) + e_dl) +
                            (rel_p + u) * w->p[t] * fabs(w->dp[t] - dl);
        const double sm = sqrt(m[key]);
        for (int64_t x = 0; x < d; ++x) {
            eq[x] += fabs(scale) * (e_ds + (u * sn + uo) * fabs(w->ds[t]) + eta) * fabs(kr[x]);
            ek[key * row + x] +=
                fabs(scale) * (e_ds + (u * sm + uo) * fabs(w->ds[t]) + eta) * fabs(q[x]);
            ev[key * row + x] += ((rel_p + u * sm + uo) * w->p[t] + eta) * fabs(dout[x]);
        }
    }
}

static void backward(int64_t batch, int64_t sq, int64_t sk, int64_t heads, int64_t d,
                     double scale, sk_dtype dtype, int operands, const double *q, const double *k,
                     const double *v, const double *dout, const uint8_t *allow, double *dq,
                     double *dk, double *dv, double *eq, double *ek, double *ev) {
    const int64_t row = heads * d; /* elements per token */
    const size_t nk = (size_t)(sk > 0 ? sk : 1);
    const size_t q_bytes = (size_t)(batch * sq * row) * sizeof(double);
    const size_t k_bytes = (size_t)(batch * sk * row) * sizeof(double);
    memset(dq, 0, q_bytes);
    memset(dk, 0, k_bytes);
    memset(dv, 0, k_bytes);
    if (eq != NULL) {
        memset(eq, 0, q_bytes);
        memset(ek, 0, k_bytes);
        memset(ev, 0, k_bytes);
    }
    /* Each (b, h) writes only its own head's elements: one per thread. */
#pragma omp parallel
    {
        nb_row w;
        w.s = (double *)malloc(nk * sizeof(double));
        w.p = (double *)malloc(nk * sizeof(double));
        w.dp = (double *)malloc(nk * sizeof(double));
        w.ds = (double *)malloc(nk * sizeof(double));
        w.o = (double *)malloc((size_t)d * sizeof(double));
        w.keys = (int64_t *)malloc(nk * sizeof(int64_t));
        double *m = (double *)malloc(nk * sizeof(double));
        if (!w.s || !w.p || !w.dp || !w.ds || !w.o || !w.keys || !m) abort(); /* tests only */
#pragma omp for schedule(dynamic, 1)
        for (int64_t bh = 0; bh < batch * heads; ++bh) {
            const int64_t b = bh / heads, h = bh % heads;
            const uint8_t *al = allow != NULL ? allow + (b * heads + h) * sq * sk : NULL;
            const int64_t ko = b * sk * row + h * d; /* key 0 of (b, h) */
            for (int64_t j = 0; j < sk; ++j) {
                m[j] = 0.0;
                for (int64_t i = 0; i < sq; ++i) m[j] += al == NULL || al[i * sk + j];
            }
            for (int64_t i = 0; i < sq; ++i) {
                const int64_t qo = (b * sq + i) * row + h * d;
                const double *qr = q + qo, *dor = dout + qo;
                int64_t n = 0;
                for (int64_t j = 0; j < sk; ++j)
                    if (al == NULL || al[i * sk + j]) w.keys[n++] = j;
                if (n == 0) continue;
                /* The forward: softmax over the allowed keys. */
                double max = -INFINITY, sum = 0.0;
                for (int64_t t = 0; t < n; ++t) {
                    const double *kr = k + ko + w.keys[t] * row;
                    double dot = 0.0;
                    for (int64_t x = 0; x < d; ++x) dot += qr[x] * kr[x];
                    w.s[t] = scale * dot;
                    if (w.s[t] > max) max = w.s[t];
                }
                for (int64_t t = 0; t < n; ++t) sum += exp(w.s[t] - max);
                const double lse = max + log(sum);
                for (int64_t x = 0; x < d; ++x) w.o[x] = 0.0;
                /* The chain rule: dP, then dS = P (dP - sum P dP). */
                double pdp = 0.0;
                for (int64_t t = 0; t < n; ++t) {
                    const double *vr = v + ko + w.keys[t] * row;
                    w.p[t] = exp(w.s[t] - max) / sum;
                    double dot = 0.0;
                    for (int64_t x = 0; x < d; ++x) {
                        dot += dor[x] * vr[x];
                        w.o[x] += w.p[t] * vr[x];
                    }
                    w.dp[t] = dot;
                    pdp += w.p[t] * dot;
                }
                for (int64_t t = 0; t < n; ++t) {
                    const int64_t kx = ko + w.keys[t] * row;
                    w.ds[t] = w.p[t] * (w.dp[t] - pdp);
                    for (int64_t x = 0; x < d; ++x) {
                        dq[qo + x] += scale * w.ds[t] * k[kx + x];
                        dk[kx + x] += scale * w.ds[t] * qr[x];
                        dv[kx + x] += w.p[t] * dor[x];
                    }
                }
                if (eq != NULL)
                    add_bounds(n, d, scale, dtype, operands, qr, k + ko, v + ko, dor, row, lse,
                               pdp, &w, m, eq + qo, ek + ko, ev + ko);
            }
        }
        free(w.s), free(w.p), free(w.dp), free(w.ds), free(w.o), free(w.keys), free(m);
    }
}

void nr_attention_backward(int64_t batch, int64_t sq, int64_t sk, int64_t heads, int64_t d,
                           double scale, sk_dtype dtype, const double *q, const double *k,
                           const double *v, const double *dout, const uint8_t *allow, double *dq,
                           double *dk, double *dv, double *eq, double *ek, double *ev) {
    backward(batch, sq, sk, heads, d, scale, dtype, 0, q, k, v, dout, allow, dq, dk, dv, eq, ek,
             ev);
}

void nr_attention_backward_mma(int64_t batch, int64_t sq, int64_t sk, int64_t heads, int64_t d,
                               double scale, sk_dtype dtype, const double *q, const double *k,
                               const double *v, const double *dout, const uint8_t *allow,
                               double *dq, double *dk, double *dv, double *eq, double *ek,
                               double *ev) {
    backward(batch, sq, sk, heads, d, scale, dtype, 1, q, k, v, dout, allow, dq, dk, dv, eq, ek,
             ev);
}
