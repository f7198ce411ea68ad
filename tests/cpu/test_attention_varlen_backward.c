/*
 * test_attention_varlen_backward.c - the varlen attention backward (CPU
 * backend) against the naive fp64 chain-rule backward (tests/common/
 * naive_bwd.c) on each sequence's unpacked copy, against central finite
 * differences of the varlen forward on a tiny case, bitwise repeatability
 * over thread counts, and every bad argument (a status, a message naming
 * the argument, nothing written; the CUDA backends: the same statuses,
 * NOT_SUPPORTED naming head_dim for a valid call the kernels do not take,
 * and the workspace's size and placement checked before any device).
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

/* The case's descriptors (CPU backend; the tests change what they test). */
static void make_descs(const vc_case *c, const vc_data *x, sk_attention_varlen_desc *desc,
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
        bwd->dout_strides[1] = bwd->dq_strides[1] = bwd->dk_strides[1] = bwd->dv_strides[1] =
            x->hs;
    }
}

static sk_status call_backward(const vc_case *c, vc_data *x, vb_bufs *t) {
    sk_attention_varlen_desc desc;
    sk_attention_varlen_backward_desc bwd;
    make_descs(c, x, &desc, &bwd);
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
    st = call_backward(&c, &x, &t);
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

/* A small F32 case, forward run, backward buffers ready: the fixture of
 * the finite-difference and bad-input tests. Lengths: q shorter than k,
 * an empty sequence, q longer than k (causal: its first rows empty). */
typedef struct vb_fix {
    vc_case c;
    vc_data x;
    vb_bufs t;
    sk_attention_varlen_desc desc;
    sk_attention_varlen_backward_desc bwd;
} vb_fix;

static int fix_make_d(vb_fix *f, sk_dtype dtype, uint64_t seed, int64_t head_dim) {
    static const int32_t lq[3] = {5, 0, 7};
    static const int32_t lk[3] = {9, 3, 4};
    memset(f, 0, sizeof *f);
    f->c = vc_base_case(dtype, 3, lq, lk);
    f->c.heads_q = 2;
    f->c.heads_kv = 1;
    f->c.head_dim = head_dim;
    f->c.causal = 1;
    f->c.with_lse = 1;
    tu_rng rng;
    tu_rng_seed(&rng, seed);
    if (!vc_make(&f->c, &rng, &f->x) || !bufs_make(&f->c, &f->x, &rng, &f->t)) return 0;
    make_descs(&f->c, &f->x, &f->desc, &f->bwd);
    return vc_call_varlen(&f->c, &f->x) == SK_STATUS_SUCCESS;
}

static int fix_make(vb_fix *f, sk_dtype dtype, uint64_t seed) {
    return fix_make_d(f, dtype, seed, 8);
}

static void fix_free(vb_fix *f) {
    bufs_free(&f->t);
    vc_data_free(&f->x);
}

/* L = sum dO * O over the valid elements, the forward run anew. */
static double loss(vb_fix *f) {
    if (vc_call_varlen(&f->c, &f->x) != SK_STATUS_SUCCESS) return NAN;
    const int64_t Hq = f->c.heads_q, D = f->c.head_dim;
    double l = 0.0;
    for (int64_t tok = 0; tok < f->x.total_q; ++tok)
        for (int64_t h = 0; h < Hq; ++h)
            for (int64_t d = 0; d < D; ++d) {
                const double w = f->t.doutd[(tok * Hq + h) * D + d];
                if (w != 0.0) l += w * tu_load(f->x.o, f->c.dtype, tok * f->x.ts_q + h * f->x.hs + d);
            }
    return l;
}

/* Central differences of L (eps 1e-2, fp32 forward) against the gradients
 * for every element of Q, K and V that some query reads. */
SK_TEST(varlen_bwd_cpu_finite_differences) {
    const uint64_t seed = case_seed(4, 0);
    vb_fix f;
    if (!fix_make(&f, SK_DTYPE_F32, seed)) {
        CHECK(0, "[seed %llu] fixture failed: %s", (unsigned long long)seed, sk_last_error());
        fix_free(&f);
        return;
    }
    const sk_status st = call_backward(&f.c, &f.x, &f.t);
    CHECK(st == SK_STATUS_SUCCESS, "[seed %llu] %s: %s", (unsigned long long)seed,
          sk_status_name(st), sk_last_error());
    void *in[3] = {f.x.q, f.x.k, f.x.v};
    const void *grad[3] = {f.t.dq, f.t.dk, f.t.dv};
    const int64_t span[3] = {f.x.q_span, f.x.k_span, f.x.k_span};
    const char *names[3] = {"dQ", "dK", "dV"};
    const float eps = 1e-2f;
    int64_t checked = 0;
    for (int i = 0; i < 3 && st == SK_STATUS_SUCCESS; ++i)
        for (int64_t e = 0; e < span[i]; ++e) {
            float *p = (float *)in[i] + e;
            if (isnan(*p)) continue; /* read by no query */
            const float keep = *p;
            *p = keep + eps;
            const double lp = loss(&f);
            *p = keep - eps;
            const double lm = loss(&f);
            *p = keep;
            const double fd = (lp - lm) / (2.0 * (double)eps);
            const double g = tu_load(grad[i], SK_DTYPE_F32, e);
            ++checked;
            CHECK(fabs(fd - g) <= 2e-3 * (1.0 + fabs(g)),
                  "[seed %llu] %s element %lld = %.7g, central difference %.7g",
                  (unsigned long long)seed, names[i], (long long)e, g, fd);
        }
    CHECK(checked > 100, "[seed %llu] only %lld elements checked", (unsigned long long)seed,
          (long long)checked);
    fix_free(&f);
}

/* The three gradients' bytes, to see that a failed call wrote nothing. */
typedef struct vb_snap {
    void *g[3];
    size_t bytes[3];
} vb_snap;

static int snap_take(const vb_fix *f, vb_snap *s) {
    const void *src[3] = {f->t.dq, f->t.dk, f->t.dv};
    const size_t es = vc_elem_size(f->c.dtype);
    s->bytes[0] = (size_t)f->x.q_span * es;
    s->bytes[1] = s->bytes[2] = (size_t)f->x.k_span * es;
    int ok = 1;
    for (int i = 0; i < 3; ++i) {
        s->g[i] = malloc(s->bytes[i]);
        if (s->g[i] == NULL) ok = 0;
        else memcpy(s->g[i], src[i], s->bytes[i]);
    }
    return ok;
}

static int snap_same(const vb_fix *f, const vb_snap *s) {
    const void *now[3] = {f->t.dq, f->t.dk, f->t.dv};
    for (int i = 0; i < 3; ++i)
        if (memcmp(now[i], s->g[i], s->bytes[i]) != 0) return 0;
    return 1;
}

/* What a bad-input case changes; the rest is the fixture's valid call. */
typedef struct vb_args {
    const sk_attention_varlen_desc *desc;
    const sk_attention_varlen_backward_desc *bwd;
    const int32_t *cu_q, *cu_k;
    const void *q, *dout;
    const float *lse;
    void *dq, *dk, *dv;
} vb_args;

static vb_args args_of(vb_fix *f) {
    const vb_args a = {&f->desc, &f->bwd, f->x.cu_q, f->x.cu_k, f->x.q, f->t.dout,
                       f->x.lse, f->t.dq, f->t.dk, f->t.dv};
    return a;
}

/* The run and the one-shot call with `a`: `want` and, for a failure, a
 * message naming `name` and nothing written. */
static void expect(vb_fix *f, const vb_snap *s, const vb_args *a, sk_status want,
                   const char *name, const char *what) {
    for (int call = 0; call < 2; ++call) {
        const sk_status st =
            call == 0 ? sk_attention_varlen_backward_run(a->desc, a->bwd, &f->x.layout, a->cu_q,
                                                         a->cu_k, a->q, f->x.k, f->x.v, f->x.o,
                                                         a->dout, a->lse, a->dq, a->dk, a->dv,
                                                         NULL, 0, NULL)
                      : sk_attention_varlen_backward(a->desc, a->bwd, &f->x.layout, a->cu_q,
                                                     a->cu_k, a->q, f->x.k, f->x.v, f->x.o,
                                                     a->dout, a->lse, a->dq, a->dk, a->dv, NULL, 0,
                                                     NULL);
        CHECK(st == want, "%s (%s): %s, want %s (%s)", what, call ? "one-shot" : "run",
              sk_status_name(st), sk_status_name(want), sk_last_error());
        if (want == SK_STATUS_SUCCESS) continue;
        CHECK(strstr(sk_last_error(), name) != NULL, "%s: message '%s' does not name %s", what,
              sk_last_error(), name);
        CHECK(snap_same(f, s), "%s (%s): an output was written", what, call ? "one-shot" : "run");
    }
}

/* Each bad argument alone, on the CPU and on every CUDA backend (the
 * core's checks come first); the valid call on CUDA, head_dim 8, which the
 * CUDA kernels do not take: NOT_SUPPORTED naming head_dim (in a build
 * without CUDA, NOT_SUPPORTED_BACKEND), nothing written; on the CPU it
 * succeeds. */
SK_TEST(varlen_bwd_bad_inputs_name_the_argument) {
    static const sk_backend backends[4] = {SK_BACKEND_CPU, SK_BACKEND_CUDA, SK_BACKEND_CUDA_SM80,
                                           SK_BACKEND_CUDA_SM90};
    static const char *const backend_names[4] = {"", "SK_BACKEND_CUDA", "SK_BACKEND_CUDA_SM80",
                                                 "SK_BACKEND_CUDA_SM90"};
    for (int bi = 0; bi < 4; ++bi) {
        vb_fix f;
        vb_snap s;
        memset(&s, 0, sizeof s);
        if (!fix_make(&f, SK_DTYPE_F16, case_seed(5, (uint64_t)bi)) || !snap_take(&f, &s)) {
            CHECK(0, "fixture failed: %s", sk_last_error());
            goto next;
        }
        f.desc.backend = backends[bi];
        sk_attention_varlen_desc d = f.desc;
        sk_attention_varlen_backward_desc b = f.bwd;
        vb_args a = args_of(&f);
        a.bwd = NULL;
        expect(&f, &s, &a, SK_STATUS_BAD_PARAM_NULL_POINTER, "bwd", "bwd NULL");
        a = args_of(&f);
        b.struct_size = 0;
        a.bwd = &b;
        expect(&f, &s, &a, SK_STATUS_BAD_PARAM_STRUCT_SIZE, "bwd", "bwd struct_size 0");
        b = f.bwd;
        b.deterministic = 2;
        expect(&f, &s, &a, SK_STATUS_BAD_PARAM_VALUE, "deterministic", "deterministic 2");
        b = f.bwd;
        b.dq_strides[0] = -(int64_t)f.c.heads_q * f.c.head_dim;
        expect(&f, &s, &a, SK_STATUS_BAD_PARAM_STRIDE, "dq", "dq token stride negative");
        b = f.bwd;
        b.dk_strides[0] = 0; /* every token on the same row */
        b.dk_strides[1] = f.c.head_dim;
        expect(&f, &s, &a, SK_STATUS_BAD_PARAM_STRIDE, "dk", "dk rows overlapping");
        a = args_of(&f);
        d.head_dim = 0;
        a.desc = &d;
        expect(&f, &s, &a, SK_STATUS_BAD_PARAM_SHAPE, "head_dim", "head_dim 0");
        d = f.desc;
        d.dtype = SK_DTYPE_E4M3;
        expect(&f, &s, &a, SK_STATUS_BAD_PARAM_DTYPE, "dtype", "dtype E4M3");
        a = args_of(&f);
        a.dout = NULL;
        expect(&f, &s, &a, SK_STATUS_BAD_PARAM_NULL_POINTER, "dout", "dout NULL");
        a = args_of(&f);
        a.lse = NULL;
        expect(&f, &s, &a, SK_STATUS_BAD_PARAM_NULL_POINTER, "lse", "lse NULL");
        a = args_of(&f);
        a.dv = NULL;
        expect(&f, &s, &a, SK_STATUS_BAD_PARAM_NULL_POINTER, "dv", "dv NULL");
        a = args_of(&f);
        a.cu_k = NULL;
        expect(&f, &s, &a, SK_STATUS_BAD_PARAM_NULL_POINTER, "cu_seqlens_k", "cu_seqlens_k NULL");
        /* Aliasing: an output over an input, and two outputs. */
        a = args_of(&f);
        a.q = f.t.dq;
        expect(&f, &s, &a, SK_STATUS_BAD_PARAM_STRIDE, "dq", "dq over q");
        a = args_of(&f);
        a.dv = f.t.dk;
        expect(&f, &s, &a, SK_STATUS_BAD_PARAM_STRIDE, "dk", "dv over dk");
        a = args_of(&f);
        a.lse = (const float *)f.t.dq;
        expect(&f, &s, &a, SK_STATUS_BAD_PARAM_STRIDE, "dq", "lse over dq");
        if (bi == 0) {
            /* Host length arrays are read on the CPU only. */
            int32_t cu[4];
            memcpy(cu, f.x.cu_q, sizeof cu);
            cu[2] = cu[3] + 1; /* decreasing */
            a = args_of(&f);
            a.cu_q = cu;
            expect(&f, &s, &a, SK_STATUS_BAD_PARAM_SHAPE, "cu_seqlens_q", "cu_seqlens_q decreasing");
            a = args_of(&f);
            expect(&f, &s, &a, SK_STATUS_SUCCESS, "", "valid call");
            size_t bytes = 1;
            const sk_status st =
                sk_attention_varlen_backward_workspace_size(&f.desc, &f.bwd, &f.x.layout, &bytes);
            CHECK(st == SK_STATUS_SUCCESS && bytes == 0, "CPU workspace: %s, %zu bytes",
                  sk_status_name(st), bytes);
        } else {
            /* sk_build_info() ends "no CUDA" in a build without CUDA. */
            const int has_cuda = strstr(sk_build_info(), "no CUDA") == NULL;
            const sk_status want = has_cuda ? SK_STATUS_NOT_SUPPORTED : SK_STATUS_NOT_SUPPORTED_BACKEND;
            const char *why = has_cuda ? "head_dim = 8" : "without CUDA";
            a = args_of(&f);
            expect(&f, &s, &a, want, why, "valid call on CUDA, head_dim 8");
            size_t bytes = 7;
            sk_status st =
                sk_attention_varlen_backward_workspace_size(&f.desc, &f.bwd, &f.x.layout, &bytes);
            CHECK(st == want && bytes == 7 && strstr(sk_last_error(), why) != NULL,
                  "%s workspace: %s, %zu bytes: %s", backend_names[bi], sk_status_name(st), bytes,
                  sk_last_error());
            st = sk_attention_varlen_backward_plan(&f.desc, &f.bwd, &f.x.layout, f.x.cu_q,
                                                   f.x.cu_k, NULL, 0, NULL);
            CHECK(st == want, "%s plan: %s", backend_names[bi], sk_status_name(st));
        }
    next:
        for (int i = 0; i < 3; ++i) free(s.g[i]);
        fix_free(&f);
    }
}

/* The CUDA backends with a call the kernels take (head_dim 64), no device
 * needed: the workspace size (> 0; in a build without CUDA,
 * NOT_SUPPORTED_BACKEND), then run, one-shot and plan with a workspace one
 * byte short (BAD_PARAM_WORKSPACE naming the size call: checked before the
 * device) and with a workspace over dq (named), nothing written. */
SK_TEST(varlen_bwd_cuda_workspace_checked_before_the_device) {
    static const sk_backend backends[3] = {SK_BACKEND_CUDA, SK_BACKEND_CUDA_SM80,
                                           SK_BACKEND_CUDA_SM90};
    const int has_cuda = strstr(sk_build_info(), "no CUDA") == NULL;
    for (int bi = 0; bi < 3; ++bi) {
        vb_fix f;
        vb_snap s;
        memset(&s, 0, sizeof s);
        if (!fix_make_d(&f, SK_DTYPE_BF16, case_seed(6, (uint64_t)bi), 64) || !snap_take(&f, &s)) {
            CHECK(0, "fixture failed: %s", sk_last_error());
            goto next;
        }
        f.desc.backend = backends[bi];
        size_t bytes = 0;
        sk_status st =
            sk_attention_varlen_backward_workspace_size(&f.desc, &f.bwd, &f.x.layout, &bytes);
        if (!has_cuda) {
            CHECK(st == SK_STATUS_NOT_SUPPORTED_BACKEND, "without CUDA: %s",
                  sk_status_name(st));
            goto next;
        }
        CHECK(st == SK_STATUS_SUCCESS && bytes > 0, "head_dim 64: %s, %zu bytes (%s)",
              sk_status_name(st), bytes, sk_last_error());
        if (st != SK_STATUS_SUCCESS) goto next;
        {
            unsigned char *ws = malloc(bytes);
            if (ws == NULL) {
                CHECK(0, "out of memory");
                goto next;
            }
            for (int call = 0; call < 3; ++call) {
                st = call == 0 ? sk_attention_varlen_backward_run(
                                     &f.desc, &f.bwd, &f.x.layout, f.x.cu_q, f.x.cu_k, f.x.q,
                                     f.x.k, f.x.v, f.x.o, f.t.dout, f.x.lse, f.t.dq, f.t.dk,
                                     f.t.dv, ws, bytes - 1, NULL)
                     : call == 1 ? sk_attention_varlen_backward(
                                       &f.desc, &f.bwd, &f.x.layout, f.x.cu_q, f.x.cu_k, f.x.q,
                                       f.x.k, f.x.v, f.x.o, f.t.dout, f.x.lse, f.t.dq, f.t.dk,
                                       f.t.dv, ws, bytes - 1, NULL)
                                 : sk_attention_varlen_backward_plan(&f.desc, &f.bwd,
                                                                     &f.x.layout, f.x.cu_q,
                                                                     f.x.cu_k, ws, bytes - 1,
                                                                     NULL);
                CHECK(st == SK_STATUS_BAD_PARAM_WORKSPACE &&
                          strstr(sk_last_error(), "sk_attention_varlen_backward_workspace_size") !=
                              NULL,
                      "call %d, workspace one byte short: %s (%s)", call, sk_status_name(st),
                      sk_last_error());
            }
            free(ws);
        }
        st = sk_attention_varlen_backward_run(&f.desc, &f.bwd, &f.x.layout, f.x.cu_q, f.x.cu_k,
                                              f.x.q, f.x.k, f.x.v, f.x.o, f.t.dout, f.x.lse,
                                              f.t.dq, f.t.dk, f.t.dv, f.t.dq, bytes, NULL);
        CHECK(st == SK_STATUS_BAD_PARAM_STRIDE && strstr(sk_last_error(), "workspace") != NULL &&
                  strstr(sk_last_error(), "dq") != NULL,
              "workspace over dq: %s (%s)", sk_status_name(st), sk_last_error());
        CHECK(snap_same(&f, &s), "%s: an output was written", "CUDA workspace checks");
    next:
        for (int i = 0; i < 3; ++i) free(s.g[i]);
        fix_free(&f);
    }
}
