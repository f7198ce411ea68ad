/*
 * test_attention_varlen_backward.c - the varlen attention backward (CPU
 * backend) against the naive fp64 chain-rule backward (tests/common/
 * naive_bwd.c) on each sequence's unpacked copy, against central finite
 * differences of the varlen forward on a tiny case, bitwise repeatability
 * over thread counts, and every bad argument (a status, a message naming
 * the argument, nothing written; the CUDA backends: the same statuses, and
 * NOT_SUPPORTED naming the backend for the valid call).
 *
 * The cases are tests/common/varlen_case.h's (lengths with empty sequences,
 * per-sequence random block masks, bottom-right causal per sequence, GQA,
 * layout slices, padded strides). The forward runs first (its O and LSE
 * feed the backward). Before the backward: dQ, dK, dV are NaN everywhere
 * (padding included: it must stay NaN), dO is NaN in the padding and on
 * every row with no admissible key (it must not leak), and K/V are NaN on
 * every key no query of the KV head attends (varlen_case.c).
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/harness.h"
#include "common/naive_bwd.h"
#include "common/test_util.h"
#include "common/varlen_case.h"
#include "sparsek.h"

/* The backward's buffers, in the forward's memory layout (x->ts_q, ts_k,
 * hs): dO and dQ as Q, dK and dV as K. */
typedef struct vb_bufs {
    void *dout, *dq, *dk, *dv;
    double *doutd; /* packed [total_q, Hq, D] fp64 copy of dO (0 where NaN) */
} vb_bufs;

static void bufs_free(vb_bufs *t) {
    free(t->dout);
    free(t->dq);
    free(t->dk);
    free(t->dv);
    free(t->doutd);
    memset(t, 0, sizeof *t);
}

/* Row (sequence b, query qq, head h) has an admissible key. */
static int row_has_key(const vc_case *c, const vc_data *x, int32_t b, int64_t h, int64_t qq) {
    for (int64_t kk = 0; kk < c->len_k[b]; ++kk)
        if (vc_allowed(c, x, b, h, qq, kk)) return 1;
    return 0;
}

/* Allocate and fill: dO random (rounded to the dtype) on rows with a key,
 * NaN elsewhere; the gradients NaN. 0 when out of memory. */
static int bufs_make(const vc_case *c, const vc_data *x, tu_rng *rng, vb_bufs *t) {
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
                if (!row_has_key(c, x, b, h, qq)) continue; /* stays NaN: must not leak */
                const int64_t tok = x->cu_q[b] + qq;
                for (int64_t d = 0; d < D; ++d) {
                    const int64_t at = tok * x->ts_q + h * x->hs + d;
                    tu_store(t->dout, c->dtype, at, (float)tu_rng_normal(rng));
                    t->doutd[(tok * Hq + h) * D + d] = tu_load(t->dout, c->dtype, at);
                }
            }
    return 1;
}

static sk_status call_backward(const vc_case *c, vc_data *x, vb_bufs *t, sk_backend backend) {
    sk_attention_varlen_desc desc;
    sk_attention_varlen_desc_init(&desc, sizeof desc);
    desc.backend = backend;
    desc.dtype = c->dtype;
    desc.batch = c->batch;
    desc.total_q = x->total_q;
    desc.total_k = x->total_k;
    vc_max_lengths(c, &desc.max_seqlen_q, &desc.max_seqlen_k);
    desc.heads_q = c->heads_q;
    desc.heads_kv = c->heads_kv;
    desc.head_dim = c->head_dim;
    desc.scale = c->scale;
    desc.mask = c->causal ? SK_MASK_CAUSAL : SK_MASK_NONE;
    sk_attention_varlen_backward_desc bwd;
    sk_attention_varlen_backward_desc_init(&bwd, sizeof bwd);
    if (c->padded) {
        desc.q_strides[0] = desc.o_strides[0] = x->ts_q;
        desc.k_strides[0] = desc.v_strides[0] = x->ts_k;
        desc.q_strides[1] = desc.k_strides[1] = desc.v_strides[1] = desc.o_strides[1] = x->hs;
        bwd.dout_strides[0] = bwd.dq_strides[0] = x->ts_q;
        bwd.dk_strides[0] = bwd.dv_strides[0] = x->ts_k;
        bwd.dout_strides[1] = bwd.dq_strides[1] = bwd.dk_strides[1] = bwd.dv_strides[1] = x->hs;
    }
    if (c->call == VC_FORWARD)
        return sk_attention_varlen_backward(&desc, &bwd, &x->layout, x->cu_q, x->cu_k, x->q, x->k,
                                            x->v, x->o, t->dout, x->lse, t->dq, t->dk, t->dv,
                                            NULL, 0, NULL);
    if (c->call == VC_PLAN_RUN) {
        const sk_status st = sk_attention_varlen_backward_plan(&desc, &bwd, &x->layout, x->cu_q,
                                                               x->cu_k, NULL, 0, NULL);
        if (st != SK_STATUS_SUCCESS) return st;
    }
    return sk_attention_varlen_backward_run(&desc, &bwd, &x->layout, x->cu_q, x->cu_k, x->q, x->k,
                                            x->v, x->o, t->dout, x->lse, t->dq, t->dk, t->dv, NULL,
                                            0, NULL);
}

/* |got - ref| within twice the naive bound plus the output rounding (the
 * fixed backward test's rule). 1 on a mismatch. */
static int mismatch(sk_dtype dt, double got, double ref, double bound) {
    const double tol = 2.0 * (tu_unit_roundoff(dt) * fabs(ref) + bound) + 0x1.0p-24;
    return !isfinite(got) || !(fabs(got - ref) <= tol);
}

/* One sequence's unpacked problem for nr_attention_backward (heads = Hq,
 * the KV heads repeated) and its comparison. Returns the mismatches. */
typedef struct seq_ref {
    double *q, *k, *v, *dout, *dq, *dk, *dv, *eq, *ek, *ev;
    uint8_t *allow;
} seq_ref;

static int64_t compare_sequence(const vc_case *c, const vc_data *x, const vb_bufs *t, int32_t b,
                                seq_ref *r, const char *label) {
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
    nr_attention_backward(1, lq, lk, Hq, D, scale, c->dtype, r->q, r->k, r->v, r->dout, r->allow,
                          r->dq, r->dk, r->dv, r->eq, r->ek, r->ev);
    int64_t bad = 0;
    for (int64_t qq = 0; qq < lq; ++qq)
        for (int64_t h = 0; h < Hq; ++h)
            for (int64_t d = 0; d < D; ++d) {
                const int64_t at = (x->cu_q[b] + qq) * x->ts_q + h * x->hs + d;
                const int64_t i = (qq * Hq + h) * D + d;
                const double got = tu_load(t->dq, c->dtype, at);
                if (mismatch(c->dtype, got, r->dq[i], r->eq[i]) && bad++ < 3)
                    CHECK(0, "%s dQ[seq %d, q %lld, h %lld, d %lld] = %.9g, reference %.9g",
                          label, (int)b, (long long)qq, (long long)h, (long long)d, got, r->dq[i]);
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
                if (mismatch(c->dtype, gk, rk, ek) && bad++ < 3)
                    CHECK(0, "%s dK[seq %d, k %lld, hk %lld, d %lld] = %.9g, reference %.9g",
                          label, (int)b, (long long)kk, (long long)hk, (long long)d, gk, rk);
                if (mismatch(c->dtype, gv, rv, ev) && bad++ < 3)
                    CHECK(0, "%s dV[seq %d, k %lld, hk %lld, d %lld] = %.9g, reference %.9g",
                          label, (int)b, (long long)kk, (long long)hk, (long long)d, gv, rv);
            }
    return bad;
}

/* Every element of buf outside the rows of `rows` tokens x heads x D
 * (token stride ts, head stride hs) is still NaN. */
static int64_t padding_written(const void *buf, sk_dtype dt, int64_t span, int64_t rows,
                               int64_t heads, int64_t D, int64_t ts, int64_t hs) {
    int64_t bad = 0;
    for (int64_t e = 0; e < span; ++e) {
        const int64_t tok = e / ts, rem = e % ts, h = rem / hs, d = rem % hs;
        const int inside = tok < rows && h < heads && d < D;
        if (!inside && !isnan(tu_load(buf, dt, e))) ++bad;
    }
    return bad;
}

/* Run one case: forward, backward, compare every sequence; copies of the
 * gradients into keep[3] when not NULL (the repeat test). 0 when all
 * matched. */
static int run_case(vc_case c, uint64_t seed, void **keep) {
    c.with_lse = 1; /* the backward needs it */
    char label[400];
    vc_label(&c, seed, label, sizeof label);
    const int before = sk_test_failures();
    tu_rng rng;
    tu_rng_seed(&rng, seed);
    vc_data x;
    vb_bufs t;
    memset(&t, 0, sizeof t);
    seq_ref r;
    memset(&r, 0, sizeof r);
    if (!vc_make(&c, &rng, &x) || !bufs_make(&c, &x, &rng, &t)) {
        CHECK(0, "%s out of memory", label);
        goto done;
    }
    sk_status st = vc_call_varlen(&c, &x);
    CHECK(st == SK_STATUS_SUCCESS, "%s forward %s: %s", label, sk_status_name(st), sk_last_error());
    if (st != SK_STATUS_SUCCESS) goto done;
    st = call_backward(&c, &x, &t, SK_BACKEND_CPU);
    CHECK(st == SK_STATUS_SUCCESS, "%s backward %s: %s", label, sk_status_name(st),
          sk_last_error());
    if (st != SK_STATUS_SUCCESS) goto done;
    int64_t lq = 1, lk = 1;
    vc_max_lengths(&c, &lq, &lk);
    const int64_t Hq = c.heads_q, D = c.head_dim;
    const size_t nq = (size_t)(lq * Hq * D), nk = (size_t)(lk * Hq * D);
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
    if (!r.q || !r.dout || !r.dq || !r.eq || !r.k || !r.v || !r.dk || !r.dv || !r.ek || !r.ev ||
        !r.allow) {
        CHECK(0, "%s out of memory", label);
        goto done;
    }
    int64_t bad = 0;
    for (int32_t b = 0; b < c.batch; ++b) bad += compare_sequence(&c, &x, &t, b, &r, label);
    const int64_t pq = padding_written(t.dq, c.dtype, x.q_span, x.total_q, Hq, D, x.ts_q, x.hs);
    const int64_t pk = padding_written(t.dk, c.dtype, x.k_span, x.total_k, c.heads_kv, D, x.ts_k,
                                       x.hs);
    const int64_t pv = padding_written(t.dv, c.dtype, x.k_span, x.total_k, c.heads_kv, D, x.ts_k,
                                       x.hs);
    CHECK(pq + pk + pv == 0, "%s padding written: dq %lld, dk %lld, dv %lld", label,
          (long long)pq, (long long)pk, (long long)pv);
    CHECK(bad == 0, "%s %lld gradient mismatches", label, (long long)bad);
    if (keep != NULL) {
        const size_t es = vc_elem_size(c.dtype);
        void *src[3] = {t.dq, t.dk, t.dv};
        const size_t bytes[3] = {(size_t)x.q_span * es, (size_t)x.k_span * es,
                                 (size_t)x.k_span * es};
        for (int i = 0; i < 3; ++i) {
            keep[i] = malloc(bytes[i]);
            if (keep[i] != NULL) memcpy(keep[i], src[i], bytes[i]);
        }
    }
done:
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
    bufs_free(&t);
    vc_data_free(&x);
    return sk_test_failures() != before;
}

static uint64_t case_seed(uint64_t test_id, uint64_t case_id) {
    tu_rng r;
    tu_rng_seed(&r, tu_base_seed() ^ (test_id * 0x100000001B3ull) ^ (case_id << 24) ^ 0xba3c);
    return tu_rng_next(&r);
}

/* Lengths around the block edges, empty sequences of every kind, q_len <
 * k_len and the reverse, causal and not, GQA 1 and 4, every dtype. */
SK_TEST(varlen_bwd_cpu_against_naive) {
    static const sk_dtype dtypes[3] = {SK_DTYPE_F16, SK_DTYPE_BF16, SK_DTYPE_F32};
    static const int32_t lq[6] = {65, 0, 3, 128, 40, 1};
    static const int32_t lk[6] = {64, 7, 0, 200, 130, 1};
    int id = 0;
    for (int di = 0; di < 3; ++di)
        for (int causal = 0; causal < 2; ++causal)
            for (int gqa = 0; gqa < 2; ++gqa) {
                vc_case c = vc_base_case(dtypes[di], 6, lq, lk);
                c.causal = causal;
                c.heads_kv = 2;
                c.heads_q = gqa ? 8 : 2;
                c.head_dim = gqa ? 64 : 24;
                c.layout_heads = gqa ? 2 : 1;
                c.density = 0.7;
                c.padded = (di + causal) % 2;
                c.call = (vc_call)(id % 3);
                run_case(c, case_seed(1, (uint64_t)id++), NULL);
            }
}

/* Random cases: every option of vc_random_case. */
SK_TEST(varlen_bwd_cpu_random_cases) {
    for (uint64_t id = 0; id < 16; ++id) {
        const uint64_t seed = case_seed(2, id);
        tu_rng rng;
        tu_rng_seed(&rng, seed ^ 0x5eed);
        const vc_case c = vc_random_case(&rng, 5, 150, 200);
        run_case(c, seed, NULL);
    }
}

/* Bitwise the same gradients with 1 and 2 threads. */
SK_TEST(varlen_bwd_cpu_repeatable_across_thread_counts) {
    static const int32_t lq[4] = {70, 0, 129, 5};
    static const int32_t lk[4] = {140, 9, 129, 0};
    vc_case c = vc_base_case(SK_DTYPE_BF16, 4, lq, lk);
    c.heads_kv = 1;
    c.heads_q = 4;
    c.head_dim = 64;
    c.causal = 1;
    c.density = 0.8;
    const uint64_t seed = case_seed(3, 0);
    void *a[3] = {NULL, NULL, NULL}, *b[3] = {NULL, NULL, NULL};
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    run_case(c, seed, a);
    omp_set_num_threads(threads > 1 ? threads : 2);
    run_case(c, seed, b);
    omp_set_num_threads(threads);
    const int64_t total_q = 70 + 129 + 5, total_k = 140 + 9 + 129;
    const size_t bytes[3] = {(size_t)(total_q * 4 * 64 * 2), (size_t)(total_k * 64 * 2),
                             (size_t)(total_k * 64 * 2)};
    for (int i = 0; i < 3; ++i) {
        CHECK(a[i] != NULL && b[i] != NULL && memcmp(a[i], b[i], bytes[i]) == 0,
              "[seed %llu] gradient %d differs between 1 and %d threads", (unsigned long long)seed,
              i, threads > 1 ? threads : 2);
        free(a[i]);
        free(b[i]);
    }
}
