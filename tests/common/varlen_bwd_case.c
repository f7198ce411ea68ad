/*
 * varlen_bwd_case.c - the varlen backward tests' shared pieces
 * (varlen_bwd_case.h): dO and the gradients in the forward's layout, the
 * descriptors, the naive fp64 comparison per sequence and the padding
 * check, used by the CPU test (tests/cpu/test_attention_varlen_backward.c)
 * and the GPU test (tests/gpu/test_attention_varlen_backward_gpu.c).
 */
#include "common/varlen_bwd_case.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/harness.h"
#include "common/naive_bwd.h"

void vbc_bufs_free(vbc_bufs *t) {
    free(t->dout);
    free(t->dq);
    free(t->dk);
    free(t->dv);
    free(t->doutd);
    memset(t, 0, sizeof *t);
}

/* Row (sequence b, query qq, head h) has an admissible key. */
int vbc_row_has_key(const vc_case *c, const vc_data *x, int32_t b, int64_t h, int64_t qq) {
    for (int64_t kk = 0; kk < c->len_k[b]; ++kk)
        if (vc_allowed(c, x, b, h, qq, kk)) return 1;
    return 0;
}

/* Allocate and fill: dO random (rounded to the dtype) on rows with a key,
 * NaN elsewhere; the gradients NaN. 0 when out of memory. */
int vbc_bufs_make(const vc_case *c, const vc_data *x, tu_rng *rng, vbc_bufs *t) {
    const size_t es = vc_elem_size(c->dtype);
    const int64_t Hq = c->heads_q, D = c->head_dim;
    memset(t, 0, sizeof *t);
    t->dout = malloc((size_t)x->q_span * es);
    t->dq = malloc((size_t)x->q_span * es);
    t->dk = malloc((size_t)x->k_span * es);
    t->dv = malloc((size_t)x->k_span * es);
    t->doutd = (double *)calloc((size_t)(x->total_q * Hq * D), sizeof(double));
    if (!t->dout || !t->dq || !t->dk || !t->dv || !t->doutd) return 0;
    tu_fill_nan(t->dout, c->dtype, x->q_span);
    tu_fill_nan(t->dq, c->dtype, x->q_span);
    tu_fill_nan(t->dk, c->dtype, x->k_span);
    tu_fill_nan(t->dv, c->dtype, x->k_span);
    for (int32_t b = 0; b < c->batch; ++b)
        for (int64_t qq = 0; qq < c->len_q[b]; ++qq)
            for (int64_t h = 0; h < Hq; ++h) {
                if (!vbc_row_has_key(c, x, b, h, qq)) continue; /* stays NaN: must not leak */
                const int64_t tok = x->cu_q[b] + qq;
                for (int64_t d = 0; d < D; ++d) {
                    const int64_t at = tok * x->ts_q + h * x->hs + d;
                    tu_store(t->dout, c->dtype, at, (float)tu_rng_normal(rng));
                    t->doutd[(tok * Hq + h) * D + d] = tu_load(t->dout, c->dtype, at);
                }
            }
    return 1;
}

/* The case's descriptors (CPU backend; the tests change what they test). */
void vbc_descs(const vc_case *c, const vc_data *x, sk_attention_varlen_desc *desc,
               sk_attention_varlen_backward_desc *bwd) {
    sk_attention_varlen_desc_init(desc, sizeof *desc);
    desc->backend = SK_BACKEND_CPU;
    desc->dtype = c->dtype;
    desc->batch = c->batch;
    desc->total_q = x->total_q;
    desc->total_k = x->total_k;
    vc_max_lengths(c, &desc->max_seqlen_q, &desc->max_seqlen_k);
    desc->heads_q = c->heads_q;
    desc->heads_kv = c->heads_kv;
    desc->head_dim = c->head_dim;
    desc->scale = c->scale;
    desc->mask = c->causal ? SK_MASK_CAUSAL : SK_MASK_NONE;
    sk_attention_varlen_backward_desc_init(bwd, sizeof *bwd);
    if (c->padded) {
        desc->q_strides[0] = desc->o_strides[0] = x->ts_q;
        desc->k_strides[0] = desc->v_strides[0] = x->ts_k;
        desc->q_strides[1] = desc->k_strides[1] = desc->v_strides[1] = desc->o_strides[1] = x->hs;
        bwd->dout_strides[0] = bwd->dq_strides[0] = x->ts_q;
        bwd->dk_strides[0] = bwd->dv_strides[0] = x->ts_k;
        bwd->dout_strides[1] = bwd->dq_strides[1] = bwd->dk_strides[1] = bwd->dv_strides[1] = x->hs;
    }
}

/* |got - ref| within twice the naive bound plus the output rounding (the
 * fixed backward test's rule). 1 on a mismatch. */
int vbc_mismatch(sk_dtype dt, double got, double ref, double bound) {
    const double tol = 2.0 * (tu_unit_roundoff(dt) * fabs(ref) + bound) + 0x1.0p-24;
    return !isfinite(got) || !(fabs(got - ref) <= tol);
}

/* One sequence's unpacked problem for nr_attention_backward and its
 * comparison (varlen_bwd_case.h). */
int64_t vbc_compare_sequence(const vc_case *c, const vc_data *x, const vbc_bufs *t, int32_t b,
                             vbc_seq_ref *r, int mma, const char *label) {
    const int64_t Hq = c->heads_q, Hkv = c->heads_kv, D = c->head_dim, group = Hq / Hkv;
    const int64_t lq = c->len_q[b], lk = c->len_k[b];
    const double scale = c->scale != 0.0f ? (double)c->scale : 1.0 / sqrt((double)D);
    for (int64_t qq = 0; qq < lq; ++qq)
        for (int64_t h = 0; h < Hq; ++h)
            for (int64_t d = 0; d < D; ++d) {
                const int64_t src = ((x->cu_q[b] + qq) * Hq + h) * D + d;
                r->q[(qq * Hq + h) * D + d] = isnan(x->qd[src]) ? 0.0 : x->qd[src];
                r->dout[(qq * Hq + h) * D + d] = t->doutd[src];
            }
    for (int64_t kk = 0; kk < lk; ++kk)
        for (int64_t h = 0; h < Hq; ++h)
            for (int64_t d = 0; d < D; ++d) {
                const int64_t src = ((x->cu_k[b] + kk) * Hkv + h / group) * D + d;
                /* NaN keys are never allowed: 0 keeps the naive sums finite. */
                r->k[(kk * Hq + h) * D + d] = isnan(x->kd[src]) ? 0.0 : x->kd[src];
                r->v[(kk * Hq + h) * D + d] = isnan(x->vd[src]) ? 0.0 : x->vd[src];
            }
    for (int64_t h = 0; h < Hq; ++h)
        for (int64_t qq = 0; qq < lq; ++qq)
            for (int64_t kk = 0; kk < lk; ++kk)
                r->allow[(h * lq + qq) * lk + kk] = (uint8_t)vc_allowed(c, x, b, h, qq, kk);
    if (mma)
        nr_attention_backward_mma(1, lq, lk, Hq, D, scale, c->dtype, r->q, r->k, r->v, r->dout,
                                  r->allow, r->dq, r->dk, r->dv, r->eq, r->ek, r->ev);
    else
        nr_attention_backward(1, lq, lk, Hq, D, scale, c->dtype, r->q, r->k, r->v, r->dout,
                              r->allow, r->dq, r->dk, r->dv, r->eq, r->ek, r->ev);
    int64_t bad = 0;
    for (int64_t qq = 0; qq < lq; ++qq)
        for (int64_t h = 0; h < Hq; ++h)
            for (int64_t d = 0; d < D; ++d) {
                const int64_t at = (x->cu_q[b] + qq) * x->ts_q + h * x->hs + d;
                const int64_t i = (qq * Hq + h) * D + d;
                const double got = tu_load(t->dq, c->dtype, at);
                if (vbc_mismatch(c->dtype, got, r->dq[i], r->eq[i]) && bad++ < 3)
                    CHECK(0, "%s dQ[seq %d, q %lld, h %lld, d %lld] = %.9g, reference %.9g", label,
                          (int)b, (long long)qq, (long long)h, (long long)d, got, r->dq[i]);
            }
    for (int64_t kk = 0; kk < lk; ++kk)
        for (int64_t hk = 0; hk < Hkv; ++hk)
            for (int64_t d = 0; d < D; ++d) {
                double rk = 0.0, rv = 0.0, ek = 0.0, ev = 0.0;
                for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
                    const int64_t i = (kk * Hq + h) * D + d;
                    rk += r->dk[i];
                    rv += r->dv[i];
                    ek += r->ek[i];
                    ev += r->ev[i];
                }
                const int64_t at = (x->cu_k[b] + kk) * x->ts_k + hk * x->hs + d;
                const double gk = tu_load(t->dk, c->dtype, at), gv = tu_load(t->dv, c->dtype, at);
                if (vbc_mismatch(c->dtype, gk, rk, ek) && bad++ < 3)
                    CHECK(0, "%s dK[seq %d, k %lld, hk %lld, d %lld] = %.9g, reference %.9g", label,
                          (int)b, (long long)kk, (long long)hk, (long long)d, gk, rk);
                if (vbc_mismatch(c->dtype, gv, rv, ev) && bad++ < 3)
                    CHECK(0, "%s dV[seq %d, k %lld, hk %lld, d %lld] = %.9g, reference %.9g", label,
                          (int)b, (long long)kk, (long long)hk, (long long)d, gv, rv);
            }
    return bad;
}

/* Every element of buf outside the rows of `rows` tokens x heads x D
 * (token stride ts, head stride hs) is still NaN. */
int64_t vbc_padding_written(const void *buf, sk_dtype dt, int64_t span, int64_t rows, int64_t heads,
                            int64_t D, int64_t ts, int64_t hs) {
    int64_t bad = 0;
    for (int64_t e = 0; e < span; ++e) {
        const int64_t tok = e / ts, rem = e % ts, h = rem / hs, d = rem % hs;
        const int inside = tok < rows && h < heads && d < D;
        if (!inside && !isnan(tu_load(buf, dt, e))) ++bad;
    }
    return bad;
}

int64_t vbc_check(const vc_case *c, const vc_data *x, const vbc_bufs *t, int mma,
                  const char *label) {
    int64_t lq = 1, lk = 1;
    vc_max_lengths(c, &lq, &lk);
    const int64_t Hq = c->heads_q, D = c->head_dim;
    const size_t nq = (size_t)(lq * Hq * D), nk = (size_t)(lk * Hq * D);
    vbc_seq_ref r;
    r.q = (double *)malloc(nq * sizeof(double));
    r.dout = (double *)malloc(nq * sizeof(double));
    r.dq = (double *)malloc(nq * sizeof(double));
    r.eq = (double *)malloc(nq * sizeof(double));
    r.k = (double *)malloc(nk * sizeof(double));
    r.v = (double *)malloc(nk * sizeof(double));
    r.dk = (double *)malloc(nk * sizeof(double));
    r.dv = (double *)malloc(nk * sizeof(double));
    r.ek = (double *)malloc(nk * sizeof(double));
    r.ev = (double *)malloc(nk * sizeof(double));
    r.allow = (uint8_t *)malloc((size_t)(Hq * lq * lk));
    int64_t bad = 0;
    if (!r.q || !r.dout || !r.dq || !r.eq || !r.k || !r.v || !r.dk || !r.dv || !r.ek || !r.ev ||
        !r.allow) {
        CHECK(0, "%s out of memory", label);
        bad = 1;
    } else {
        for (int32_t b = 0; b < c->batch; ++b)
            bad += vbc_compare_sequence(c, x, t, b, &r, mma, label);
        const int64_t pq =
            vbc_padding_written(t->dq, c->dtype, x->q_span, x->total_q, Hq, D, x->ts_q, x->hs);
        const int64_t pk = vbc_padding_written(t->dk, c->dtype, x->k_span, x->total_k, c->heads_kv,
                                               D, x->ts_k, x->hs);
        const int64_t pv = vbc_padding_written(t->dv, c->dtype, x->k_span, x->total_k, c->heads_kv,
                                               D, x->ts_k, x->hs);
        CHECK(pq + pk + pv == 0, "%s padding written: dq %lld, dk %lld, dv %lld", label,
              (long long)pq, (long long)pk, (long long)pv);
        CHECK(bad == 0, "%s %lld gradient mismatches", label, (long long)bad);
        bad += pq + pk + pv;
    }
    free(r.q);
    free(r.dout);
    free(r.dq);
    free(r.eq);
    free(r.k);
    free(r.v);
    free(r.dk);
    free(r.dv);
    free(r.ek);
    free(r.ev);
    free(r.allow);
    return bad;
}
