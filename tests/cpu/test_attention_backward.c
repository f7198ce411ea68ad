/*
 * test_attention_backward.c - the CPU attention backward against the naive
 * dense fp64 backward (tests/common/naive_bwd.c), under the tolerance rule.
 *
 * Every case: seeded random Q, K, V, dO rounded to the dtype; the library's
 * own CPU forward gives O and LSE (the backward's inputs, "as the forward
 * wrote them"); the reference gets the same rounded Q, K, V, dO in fp64,
 * K and V repeated per query head, and a token mask built from the test's
 * own block mask, slice mapping and causal rule (the layout is made here
 * from that block mask, never by the layout builders). Then, before the
 * backward, every input value no gradient may depend on is set to NaN:
 * stride padding, the Q, dO, O and LSE of empty rows, the K and V of keys
 * that no admissible pair of their KV head reaches; and dQ, dK, dV are
 * filled with NaN, padding included. Afterwards every element of dQ, dK,
 * dV must be within 2 x (u_dtype |ref| + E) + 2^-24 of the reference (E:
 * the bound of a same-precision naive implementation, naive_bwd.h) and
 * finite, and the padding still NaN.
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/harness.h"
#include "common/naive_bwd.h"
#include "common/naive_ref.h"
#include "common/test_util.h"
#include "sparsek.h"

typedef enum bwd_strides {
    BWD_PACKED = 0, /* every stride left 0: packed [B, S, H, D] */
    BWD_PADDED = 1, /* gaps after each row, token and batch; V, dV in [B, H, S, D] order */
    BWD_BHSD = 2    /* the memory order [B, H, S, D], given through strides */
} bwd_strides;

typedef struct bwd_case {
    sk_dtype dtype;
    int64_t batch, seq_q, seq_k, heads_q, heads_kv, head_dim;
    int32_t bq, bk;
    int causal;
    float scale;          /* 0: the default 1/sqrt(D) */
    int32_t layout_batch; /* 1 or batch */
    int32_t layout_heads; /* 1, heads_kv or heads_q */
    double density;       /* probability that a block is selected */
    int32_t per_row;      /* > 0: exactly this many blocks per row instead (clipped) */
    int trim_causal;      /* drop blocks with no causal pair */
    int empty_rows;       /* also empty every third layout row */
    bwd_strides strides;
    int use_plan_run;     /* sk_attention_backward_plan + _run instead of the one-shot */
    int deterministic;    /* the bwd field (1 default; 0: on the CPU the same results) */
} bwd_case;

/* What one run saw, so that a test can prove it was not vacuous. */
typedef struct bwd_outcome {
    int64_t empty_rows;   /* (b, h, q) rows with no admissible key */
    int64_t idle_keys;    /* (b, hk, k) keys no admissible pair reaches */
    int64_t checked;      /* gradient elements compared */
    double worst;         /* max |got - ref| / tol */
} bwd_outcome;

static bwd_case base_case(sk_dtype dtype) {
    bwd_case c;
    memset(&c, 0, sizeof c);
    c.dtype = dtype;
    c.batch = 1;
    c.seq_q = c.seq_k = 128;
    c.heads_q = c.heads_kv = 1;
    c.head_dim = 32;
    c.bq = c.bk = 64;
    c.layout_batch = c.layout_heads = 1;
    c.density = 1.0;
    c.deterministic = 1;
    return c;
}

static const sk_dtype all_dtypes[3] = {SK_DTYPE_F16, SK_DTYPE_BF16, SK_DTYPE_F32};

static uint64_t case_seed(uint64_t test, uint64_t id) {
    return tu_base_seed() * 1000003u + test * 7919u + id;
}

static const char *dtype_text(sk_dtype t) {
    return t == SK_DTYPE_F16 ? "F16" : t == SK_DTYPE_BF16 ? "BF16" : "F32";
}

static size_t elem_size(sk_dtype t) {
    return t == SK_DTYPE_F32 ? 4 : 2;
}

/* Element strides of a [B, S, H, D] tensor; `alt` picks the other padded
 * order, so that tensors of one call differ. */
static void strides_of(bwd_strides mode, int alt, int64_t s, int64_t h, int64_t d, int64_t st[3]) {
    if (mode == BWD_BHSD || (mode == BWD_PADDED && alt)) {
        const int64_t pad = mode == BWD_PADDED ? 2 : 0;
        st[1] = d + pad;
        st[2] = s * st[1] + pad;
        st[0] = h * st[2] + pad;
    } else if (mode == BWD_PADDED) {
        st[2] = d + 3;
        st[1] = h * st[2] + 5;
        st[0] = s * st[1] + 7;
    } else {
        st[2] = d;
        st[1] = h * d;
        st[0] = s * h * d;
    }
}

static int64_t at_of(const int64_t st[3], int64_t b, int64_t s, int64_t h) {
    return b * st[0] + s * st[1] + h * st[2];
}

static int64_t span_of(int64_t b, int64_t s, int64_t h, int64_t d, const int64_t st[3]) {
    return at_of(st, b - 1, s - 1, h - 1) + d;
}

/* The slice of (b, h) by the rule in sparsek.h, written out independently. */
static int64_t test_slice(const bwd_case *c, int64_t b, int64_t h) {
    int64_t hs;
    if (c->layout_heads == c->heads_q)
        hs = h;
    else if (c->layout_heads == 1)
        hs = 0;
    else
        hs = h / (c->heads_q / c->heads_kv); /* per KV head */
    return (c->layout_batch == 1 ? 0 : b) * c->layout_heads + hs;
}

/* The block mask of a case: density or per_row blocks, trims, empty rows. */
static uint8_t *make_block_mask(const bwd_case *c, tu_rng *rng, int64_t slices, int64_t rb,
                                int64_t cb) {
    uint8_t *mask = (uint8_t *)calloc((size_t)(slices * rb * cb), 1);
    if (mask == NULL) return NULL;
    for (int64_t s = 0; s < slices; ++s)
        for (int64_t i = 0; i < rb; ++i) {
            uint8_t *row = mask + (s * rb + i) * cb;
            const int64_t q_last = (i + 1) * c->bq < c->seq_q ? (i + 1) * c->bq - 1 : c->seq_q - 1;
            int64_t last = cb - 1; /* with trim_causal: the last block with a causal pair */
            if (c->trim_causal) {
                last = (q_last + c->seq_k - c->seq_q) / c->bk;
                if (q_last + c->seq_k - c->seq_q < 0) last = -1;
                if (last > cb - 1) last = cb - 1;
            }
            if (c->empty_rows && (s * rb + i) % 3 == 0) continue;
            if (c->per_row > 0) {
                const int64_t want = c->per_row < last + 1 ? c->per_row : last + 1;
                for (int64_t placed = 0; placed < want;) {
                    const int64_t j = tu_rng_range(rng, 0, last);
                    if (!row[j]) row[j] = 1, ++placed;
                }
            } else {
                for (int64_t j = 0; j <= last; ++j) row[j] = tu_rng_uniform(rng) < c->density;
            }
        }
    return mask;
}

/* All buffers of one case. */
typedef struct bwd_bufs {
    void *q, *k, *v, *o, *dout, *dq, *dk, *dv;
    float *lse;
    int64_t qs[3], ks[3], vs[3], os[3], dos[3], dqs[3], dks[3], dvs[3];
    int64_t q_span, k_span, v_span, o_span, do_span, dq_span, dk_span, dv_span;
    double *qd, *kd, *vd, *dod;               /* fp64 copies; K, V repeated per query head */
    double *dq_ref, *dk_ref, *dv_ref;         /* [B, Sq, Hq, D], [B, Sk, Hq, D] */
    double *eq, *ek, *ev;                     /* their bounds */
    uint8_t *allow;                           /* [B, Hq, Sq, Sk] */
    uint8_t *row_used;                        /* [B, Hq, Sq]: the row has an admissible key */
    uint8_t *key_used;                        /* [B, Hkv, Sk] */
} bwd_bufs;

static void bufs_free(bwd_bufs *t) {
    void *all[] = {t->q,      t->k,      t->v,      t->o,      t->dout,  t->dq,  t->dk,
                   t->dv,     t->lse,    t->qd,     t->kd,     t->vd,    t->dod, t->dq_ref,
                   t->dk_ref, t->dv_ref, t->eq,     t->ek,     t->ev,    t->allow,
                   t->row_used, t->key_used};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) free(all[i]);
}

static int bufs_alloc(const bwd_case *c, bwd_bufs *t) {
    const int64_t B = c->batch, Sq = c->seq_q, Sk = c->seq_k, Hq = c->heads_q, Hkv = c->heads_kv,
                  D = c->head_dim;
    const size_t es = elem_size(c->dtype);
    strides_of(c->strides, 0, Sq, Hq, D, t->qs);
    strides_of(c->strides, 0, Sk, Hkv, D, t->ks);
    strides_of(c->strides, 1, Sk, Hkv, D, t->vs);
    strides_of(c->strides, 1, Sq, Hq, D, t->os);
    strides_of(c->strides, 1, Sq, Hq, D, t->dos);
    strides_of(c->strides, 0, Sq, Hq, D, t->dqs);
    strides_of(c->strides, 1, Sk, Hkv, D, t->dks);
    strides_of(c->strides, 0, Sk, Hkv, D, t->dvs);
    t->q_span = span_of(B, Sq, Hq, D, t->qs), t->o_span = span_of(B, Sq, Hq, D, t->os);
    t->do_span = span_of(B, Sq, Hq, D, t->dos), t->dq_span = span_of(B, Sq, Hq, D, t->dqs);
    t->k_span = span_of(B, Sk, Hkv, D, t->ks), t->v_span = span_of(B, Sk, Hkv, D, t->vs);
    t->dk_span = span_of(B, Sk, Hkv, D, t->dks), t->dv_span = span_of(B, Sk, Hkv, D, t->dvs);
    t->q = malloc((size_t)t->q_span * es), t->k = malloc((size_t)t->k_span * es);
    t->v = malloc((size_t)t->v_span * es), t->o = malloc((size_t)t->o_span * es);
    t->dout = malloc((size_t)t->do_span * es), t->dq = malloc((size_t)t->dq_span * es);
    t->dk = malloc((size_t)t->dk_span * es), t->dv = malloc((size_t)t->dv_span * es);
    t->lse = (float *)malloc((size_t)(B * Hq * Sq) * sizeof(float));
    const size_t nq = (size_t)(B * Sq * Hq * D), nk = (size_t)(B * Sk * Hq * D);
    t->qd = (double *)malloc(nq * 8), t->dod = (double *)malloc(nq * 8);
    t->kd = (double *)malloc(nk * 8), t->vd = (double *)malloc(nk * 8);
    t->dq_ref = (double *)malloc(nq * 8), t->eq = (double *)malloc(nq * 8);
    t->dk_ref = (double *)malloc(nk * 8), t->dv_ref = (double *)malloc(nk * 8);
    t->ek = (double *)malloc(nk * 8), t->ev = (double *)malloc(nk * 8);
    t->allow = (uint8_t *)malloc((size_t)(B * Hq * Sq * Sk));
    t->row_used = (uint8_t *)calloc((size_t)(B * Hq * Sq), 1);
    t->key_used = (uint8_t *)calloc((size_t)(B * Hkv * Sk), 1);
    return t->q && t->k && t->v && t->o && t->dout && t->dq && t->dk && t->dv && t->lse && t->qd &&
           t->dod && t->kd && t->vd && t->dq_ref && t->eq && t->dk_ref && t->dv_ref && t->ek &&
           t->ev && t->allow && t->row_used && t->key_used;
}

/* Random values for one [B, S, H, D] tensor (its fp64 copy at [B, S, reps * H, D]
 * with each head repeated reps times), everything else NaN. */
static void fill_tensor(tu_rng *rng, sk_dtype dt, void *buf, int64_t span, const int64_t st[3],
                        int64_t B, int64_t S, int64_t H, int64_t D, int64_t reps, double *copy) {
    tu_fill_nan(buf, dt, span);
    for (int64_t b = 0; b < B; ++b)
        for (int64_t s = 0; s < S; ++s)
            for (int64_t h = 0; h < H; ++h)
                for (int64_t x = 0; x < D; ++x) {
                    const int64_t at = at_of(st, b, s, h) + x;
                    tu_store(buf, dt, at, (float)tu_rng_normal(rng));
                    for (int64_t r = 0; r < reps; ++r)
                        copy[((b * S + s) * H * reps + h * reps + r) * D + x] = tu_load(buf, dt, at);
                }
}

/* NaN over one [D] row of a tensor. */
static void poison_row(void *buf, sk_dtype dt, const int64_t st[3], int64_t b, int64_t s,
                       int64_t h, int64_t D) {
    tu_fill_nan((char *)buf + at_of(st, b, s, h) * (int64_t)elem_size(dt), dt, D);
}

/* Element (b, s, h, x) of a gradient against the reference; returns 1 on
 * a mismatch and raises *worst to err / tol. */
static int compare_one(sk_dtype dt, double got, double ref, double bound, double *worst) {
    const double tol = 2.0 * (tu_unit_roundoff(dt) * fabs(ref) + bound) + 0x1.0p-24;
    const double err = fabs(got - ref);
    if (!isfinite(got) || !(err <= tol)) return 1;
    if (err / tol > *worst) *worst = err / tol;
    return 0;
}

/* Every element of one output tensor: values in place, NaN in the gaps. */
typedef struct grad_view {
    const char *name;
    const void *buf;
    const int64_t *st;
    int64_t span, S, H;  /* H = the tensor's heads (Hq for dQ, Hkv for dK, dV) */
    const double *ref, *bound; /* [B, S, Hq, D]: summed over reps = Hq / H heads */
} grad_view;

static int64_t compare_grad(const bwd_case *c, const char *label, const grad_view *g,
                            bwd_outcome *out) {
    const int64_t B = c->batch, D = c->head_dim, Hq = c->heads_q, reps = Hq / g->H;
    uint8_t *used = (uint8_t *)calloc((size_t)g->span, 1);
    int64_t bad = 0;
    for (int64_t b = 0; b < B; ++b)
        for (int64_t s = 0; s < g->S; ++s)
            for (int64_t h = 0; h < g->H; ++h)
                for (int64_t x = 0; x < D; ++x) {
                    double ref = 0.0, bound = 0.0;
                    for (int64_t r = 0; r < reps; ++r) {
                        const int64_t i = ((b * g->S + s) * Hq + h * reps + r) * D + x;
                        ref += g->ref[i];
                        bound += g->bound[i];
                    }
                    const int64_t at = at_of(g->st, b, s, h) + x;
                    if (used != NULL) used[at] = 1;
                    const double got = tu_load(g->buf, c->dtype, at);
                    ++out->checked;
                    if (compare_one(c->dtype, got, ref, bound, &out->worst) && bad++ < 3)
                        CHECK(0, "%s %s[b=%lld s=%lld h=%lld x=%lld] = %.9g, reference %.9g "
                                 "(bound %.3g)",
                              label, g->name, (long long)b, (long long)s, (long long)h,
                              (long long)x, got, ref, bound);
                }
    int64_t touched = 0;
    for (int64_t at = 0; used != NULL && at < g->span; ++at)
        touched += !used[at] && !isnan(tu_load(g->buf, c->dtype, at));
    CHECK(used != NULL && touched == 0, "%s %s: %lld padding elements were written", label,
          g->name, (long long)touched);
    free(used);
    return bad + touched;
}

/* The library's forward (O and LSE for the backward), then the backward.
 * Returns the backward's status. */
static sk_status run_library(const bwd_case *c, const sk_bsr *layout, bwd_bufs *t) {
    sk_attention_desc desc;
    sk_attention_desc_init(&desc, sizeof desc);
    desc.backend = SK_BACKEND_CPU;
    desc.dtype = c->dtype;
    desc.batch = c->batch;
    desc.seq_q = c->seq_q;
    desc.seq_k = c->seq_k;
    desc.heads_q = c->heads_q;
    desc.heads_kv = c->heads_kv;
    desc.head_dim = c->head_dim;
    desc.scale = c->scale;
    desc.mask = c->causal ? SK_MASK_CAUSAL : SK_MASK_NONE;
    sk_attention_backward_desc bwd;
    sk_attention_backward_desc_init(&bwd, sizeof bwd);
    bwd.deterministic = c->deterministic;
    if (c->strides != BWD_PACKED) {
        memcpy(desc.q_strides, t->qs, sizeof t->qs);
        memcpy(desc.k_strides, t->ks, sizeof t->ks);
        memcpy(desc.v_strides, t->vs, sizeof t->vs);
        memcpy(desc.o_strides, t->os, sizeof t->os);
        memcpy(bwd.dout_strides, t->dos, sizeof t->dos);
        memcpy(bwd.dq_strides, t->dqs, sizeof t->dqs);
        memcpy(bwd.dk_strides, t->dks, sizeof t->dks);
        memcpy(bwd.dv_strides, t->dvs, sizeof t->dvs);
    }
    sk_status st = sk_attention_forward(&desc, layout, t->q, t->k, t->v, t->o, t->lse, NULL, 0, NULL);
    if (st != SK_STATUS_SUCCESS) return st;
    /* Inputs no gradient may depend on: NaN (row_used / key_used are set). */
    const int64_t D = c->head_dim;
    for (int64_t b = 0; b < c->batch; ++b) {
        for (int64_t h = 0; h < c->heads_q; ++h)
            for (int64_t s = 0; s < c->seq_q; ++s) {
                if (t->row_used[(b * c->heads_q + h) * c->seq_q + s]) continue;
                poison_row(t->q, c->dtype, t->qs, b, s, h, D);
                poison_row(t->dout, c->dtype, t->dos, b, s, h, D);
                poison_row(t->o, c->dtype, t->os, b, s, h, D);
                t->lse[(b * c->heads_q + h) * c->seq_q + s] = NAN;
            }
        for (int64_t hk = 0; hk < c->heads_kv; ++hk)
            for (int64_t s = 0; s < c->seq_k; ++s)
                if (!t->key_used[(b * c->heads_kv + hk) * c->seq_k + s]) {
                    poison_row(t->k, c->dtype, t->ks, b, s, hk, D);
                    poison_row(t->v, c->dtype, t->vs, b, s, hk, D);
                }
    }
    tu_fill_nan(t->dq, c->dtype, t->dq_span);
    tu_fill_nan(t->dk, c->dtype, t->dk_span);
    tu_fill_nan(t->dv, c->dtype, t->dv_span);
    if (c->use_plan_run) {
        st = sk_attention_backward_plan(&desc, &bwd, layout, NULL, 0, NULL);
        if (st != SK_STATUS_SUCCESS) return st;
        return sk_attention_backward_run(&desc, &bwd, layout, t->q, t->k, t->v, t->o, t->dout,
                                         t->lse, t->dq, t->dk, t->dv, NULL, 0, NULL);
    }
    return sk_attention_backward(&desc, &bwd, layout, t->q, t->k, t->v, t->o, t->dout, t->lse,
                                 t->dq, t->dk, t->dv, NULL, 0, NULL);
}

/* Run one case and compare; returns 0 when everything matched. grads, if
 * given, receives a copy of dQ, dK, dV (their spans, back to back). */
static int run_case(const bwd_case *c, uint64_t seed, bwd_outcome *outcome, void **grads) {
    char label[360];
    snprintf(label, sizeof label,
             "[seed %llu: %s B=%lld Sq=%lld Sk=%lld Hq=%lld Hkv=%lld D=%lld bq=%d bk=%d causal=%d "
             "scale=%g layout %dx%d density=%.2f per_row=%d trim=%d empty=%d strides=%d "
             "plan_run=%d det=%d]",
             (unsigned long long)seed, dtype_text(c->dtype), (long long)c->batch,
             (long long)c->seq_q, (long long)c->seq_k, (long long)c->heads_q,
             (long long)c->heads_kv, (long long)c->head_dim, (int)c->bq, (int)c->bk, c->causal,
             (double)c->scale, (int)c->layout_batch, (int)c->layout_heads, c->density,
             (int)c->per_row, c->trim_causal, c->empty_rows, (int)c->strides, c->use_plan_run,
             c->deterministic);
    const int failures_before = sk_test_failures();
    bwd_outcome out;
    memset(&out, 0, sizeof out);
    tu_rng rng;
    tu_rng_seed(&rng, seed);
    const int64_t B = c->batch, Sq = c->seq_q, Sk = c->seq_k, Hq = c->heads_q, Hkv = c->heads_kv,
                  D = c->head_dim, group = Hq / Hkv;
    const int64_t RB = (Sq + c->bq - 1) / c->bq, CB = (Sk + c->bk - 1) / c->bk;
    const int64_t slices = (int64_t)c->layout_batch * c->layout_heads;
    const double scale = c->scale != 0.0f ? (double)c->scale : 1.0 / sqrt((double)D);

    bwd_bufs t;
    memset(&t, 0, sizeof t);
    sk_bsr layout;
    memset(&layout, 0, sizeof layout);
    uint8_t *mask = make_block_mask(c, &rng, slices, RB, CB);
    uint8_t *bmask_full = (uint8_t *)malloc((size_t)(B * Hq * RB * CB));
    const sk_grid grid = tu_grid(Sq, Sk, c->bq, c->bk, c->layout_batch, c->layout_heads);
    if (mask == NULL || bmask_full == NULL || nr_bsr_from_mask(&layout, &grid, mask) != 0 ||
        !bufs_alloc(c, &t)) {
        CHECK(0, "%s out of memory", label);
        goto done;
    }
    for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < Hq; ++h)
            memcpy(bmask_full + (b * Hq + h) * RB * CB, mask + test_slice(c, b, h) * RB * CB,
                   (size_t)(RB * CB));
    nr_allow_from_blocks(t.allow, bmask_full, B, Hq, Sq, Sk, c->bq, c->bk, c->causal);
    for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < Hq; ++h)
            for (int64_t s = 0; s < Sq; ++s)
                for (int64_t j = 0; j < Sk; ++j)
                    if (t.allow[((b * Hq + h) * Sq + s) * Sk + j]) {
                        t.row_used[(b * Hq + h) * Sq + s] = 1;
                        t.key_used[(b * Hkv + h / group) * Sk + j] = 1;
                    }
    for (int64_t x = 0; x < B * Hq * Sq; ++x) out.empty_rows += !t.row_used[x];
    for (int64_t x = 0; x < B * Hkv * Sk; ++x) out.idle_keys += !t.key_used[x];

    fill_tensor(&rng, c->dtype, t.q, t.q_span, t.qs, B, Sq, Hq, D, 1, t.qd);
    fill_tensor(&rng, c->dtype, t.k, t.k_span, t.ks, B, Sk, Hkv, D, group, t.kd);
    fill_tensor(&rng, c->dtype, t.v, t.v_span, t.vs, B, Sk, Hkv, D, group, t.vd);
    fill_tensor(&rng, c->dtype, t.dout, t.do_span, t.dos, B, Sq, Hq, D, 1, t.dod);
    tu_fill_nan(t.o, c->dtype, t.o_span);

    const sk_status st = run_library(c, &layout, &t);
    if (st != SK_STATUS_SUCCESS) {
        CHECK(0, "%s %s: %s", label, sk_status_name(st), sk_last_error());
        goto done;
    }
    nr_attention_backward(B, Sq, Sk, Hq, D, scale, c->dtype, t.qd, t.kd, t.vd, t.dod, t.allow,
                          t.dq_ref, t.dk_ref, t.dv_ref, t.eq, t.ek, t.ev);
    const grad_view views[3] = {
        {"dQ", t.dq, t.dqs, t.dq_span, Sq, Hq, t.dq_ref, t.eq},
        {"dK", t.dk, t.dks, t.dk_span, Sk, Hkv, t.dk_ref, t.ek},
        {"dV", t.dv, t.dvs, t.dv_span, Sk, Hkv, t.dv_ref, t.ev}};
    for (int i = 0; i < 3; ++i) compare_grad(c, label, &views[i], &out);
    if (grads != NULL) {
        const size_t es = elem_size(c->dtype);
        const size_t a = (size_t)t.dq_span * es, b2 = (size_t)t.dk_span * es,
                     c3 = (size_t)t.dv_span * es;
        char *copy = (char *)malloc(a + b2 + c3);
        if (copy != NULL) {
            memcpy(copy, t.dq, a);
            memcpy(copy + a, t.dk, b2);
            memcpy(copy + a + b2, t.dv, c3);
        }
        *grads = copy;
    }
done:
    free(mask);
    free(bmask_full);
    nr_bsr_free(&layout);
    bufs_free(&t);
    if (getenv("SK_BWD_VERBOSE") != NULL)
        printf("    %s worst err/tol %.3g, %lld checked\n", label, out.worst, (long long)out.checked);
    if (outcome != NULL) *outcome = out;
    return sk_test_failures() != failures_before;
}

/* ---------------------------------------------------------------------------
 * The cases
 * ------------------------------------------------------------------------- */

/* Each dtype, D 64 and 128 and odd sizes, blocks 64 and 128 each way. */
SK_TEST(backward_cpu_dtypes_dims_blocks) {
    static const int64_t dims[4] = {64, 128, 5, 33};
    static const int32_t blocks[3][2] = {{64, 64}, {128, 128}, {64, 128}};
    int id = 0;
    for (int t = 0; t < 3; ++t)
        for (int di = 0; di < 4; ++di) {
            bwd_case c = base_case(all_dtypes[t]);
            c.head_dim = dims[di];
            c.bq = blocks[(t + di) % 3][0];
            c.bk = blocks[(t + di) % 3][1];
            c.seq_q = 200;
            c.seq_k = 260;
            c.heads_q = 2;
            c.density = 0.6;
            c.causal = di % 2;
            run_case(&c, case_seed(1, (uint64_t)id++), NULL, NULL);
        }
}

/* GQA 1, 4 and 8 with every layout slicing: dK, dV sum the group's heads. */
SK_TEST(backward_cpu_gqa_and_layout_slices) {
    static const int64_t groups[3] = {1, 4, 8};
    int id = 0;
    for (int gi = 0; gi < 3; ++gi)
        for (int lh = 0; lh < 3; ++lh) {
            bwd_case c = base_case(all_dtypes[id % 3]);
            c.heads_kv = 2;
            c.heads_q = 2 * groups[gi];
            c.seq_q = 150;
            c.seq_k = 190;
            c.head_dim = 16;
            c.density = 0.5;
            c.causal = lh == 1;
            c.layout_heads = (int32_t)(lh == 0 ? 1 : lh == 1 ? c.heads_kv : c.heads_q);
            run_case(&c, case_seed(2, (uint64_t)id++), NULL, NULL);
        }
}

/* Broadcast over batch, per-batch layouts, and empty layout rows. */
SK_TEST(backward_cpu_broadcast_and_empty_rows) {
    int id = 0;
    for (int lb = 0; lb < 2; ++lb)
        for (int lh = 0; lh < 3; ++lh) {
            bwd_case c = base_case(all_dtypes[id % 3]);
            c.batch = 3;
            c.heads_q = 4;
            c.heads_kv = 2;
            c.seq_q = c.seq_k = 140;
            c.head_dim = 16;
            c.density = 0.5;
            c.empty_rows = 1;
            c.layout_batch = lb ? 3 : 1;
            c.layout_heads = (int32_t)(lh == 0 ? 1 : lh == 1 ? 2 : 4);
            bwd_outcome out;
            run_case(&c, case_seed(3, (uint64_t)id++), &out, NULL);
            CHECK(out.empty_rows > 0 && out.idle_keys >= 0, "no empty rows: the case is vacuous");
        }
}

/* Causal with Sq < Sk, Sq > Sk (the first Sq - Sk rows see nothing), tails
 * on both sides, and causal-trimmed layouts. */
SK_TEST(backward_cpu_causal_and_tails) {
    static const int64_t shapes[5][2] = {{100, 300}, {300, 100}, {1, 1}, {65, 129}, {257, 63}};
    int id = 0;
    for (int si = 0; si < 5; ++si)
        for (int trim = 0; trim < 2; ++trim) {
            bwd_case c = base_case(all_dtypes[id % 3]);
            c.seq_q = shapes[si][0];
            c.seq_k = shapes[si][1];
            c.heads_q = 2;
            c.head_dim = 24;
            c.causal = 1;
            c.trim_causal = trim;
            c.bq = si % 2 ? 128 : 64;
            c.bk = si % 2 ? 64 : 128;
            bwd_outcome out;
            run_case(&c, case_seed(4, (uint64_t)id++), &out, NULL);
            if (shapes[si][0] > shapes[si][1])
                CHECK(out.empty_rows >= (shapes[si][0] - shapes[si][1]) * 2,
                      "Sq > Sk: %lld empty rows", (long long)out.empty_rows);
        }
}

/* From one block a row to dense; padded and permuted strides on every
 * tensor; plan + run; deterministic = 0 (no CPU mode of its own). */
SK_TEST(backward_cpu_densities_and_strides) {
    static const int32_t per_row[4] = {1, 2, 0, 0};
    static const double density[4] = {0.0, 0.0, 0.3, 1.0};
    int id = 0;
    for (int di = 0; di < 4; ++di)
        for (int mode = 0; mode < 3; ++mode) {
            bwd_case c = base_case(all_dtypes[(di + mode) % 3]);
            c.batch = 2;
            c.heads_q = 4;
            c.heads_kv = 2;
            c.layout_heads = 4;
            c.seq_q = 190;
            c.seq_k = 300;
            c.head_dim = 20;
            c.per_row = per_row[di];
            c.density = density[di];
            c.causal = mode == 1;
            c.strides = (bwd_strides)mode;
            c.use_plan_run = mode == 2;
            c.deterministic = di != 3;
            run_case(&c, case_seed(5, (uint64_t)id++), NULL, NULL);
        }
}

/* NaN in every input value that no gradient may read: the Q, dO, O and
 * LSE of empty rows (empty layout rows, and rows that causality empties)
 * and the K, V of keys no row reaches (one block a row of many). The case
 * must have both, or it proves nothing. */
SK_TEST(backward_cpu_nan_in_unread_inputs) {
    for (int t = 0; t < 3; ++t) {
        bwd_case c = base_case(all_dtypes[t]);
        c.seq_q = 300;
        c.seq_k = 200 + 150 * t;
        c.heads_q = 2;
        c.per_row = 1;
        c.empty_rows = 1;
        c.causal = t != 2;
        c.strides = (bwd_strides)t;
        bwd_outcome out;
        run_case(&c, case_seed(9, (uint64_t)t), &out, NULL);
        CHECK(out.empty_rows > 0 && out.idle_keys > 0,
              "%lld empty rows and %lld keys no row reaches: the case is vacuous",
              (long long)out.empty_rows, (long long)out.idle_keys);
    }
}

SK_TEST(backward_cpu_custom_scale) {
    static const float scales[3] = {0.37f, -0.5f, 2.0f};
    int id = 0;
    for (int t = 0; t < 3; ++t)
        for (int si = 0; si < 3; ++si) {
            bwd_case c = base_case(all_dtypes[t]);
            c.seq_q = 70;
            c.seq_k = 150;
            c.head_dim = 16;
            c.density = 0.8;
            c.scale = scales[si];
            run_case(&c, case_seed(6, (uint64_t)id++), NULL, NULL);
        }
}

SK_TEST(backward_cpu_random_cases) {
    tu_rng rng;
    tu_rng_seed(&rng, case_seed(7, 999));
    for (int id = 0; id < 24; ++id) {
        bwd_case c = base_case(all_dtypes[tu_rng_range(&rng, 0, 2)]);
        c.batch = tu_rng_range(&rng, 1, 2);
        c.heads_kv = tu_rng_range(&rng, 1, 2);
        c.heads_q = c.heads_kv * (int64_t)(1 << tu_rng_range(&rng, 0, 3));
        c.seq_q = tu_rng_range(&rng, 1, 260);
        c.seq_k = tu_rng_range(&rng, 1, 260);
        c.head_dim = tu_rng_range(&rng, 0, 3) == 0 ? 64 : tu_rng_range(&rng, 1, 40);
        c.bq = tu_rng_range(&rng, 0, 1) ? 128 : 64;
        c.bk = tu_rng_range(&rng, 0, 1) ? 128 : 64;
        c.causal = (int)tu_rng_range(&rng, 0, 1);
        c.trim_causal = c.causal && tu_rng_range(&rng, 0, 1);
        c.empty_rows = tu_rng_range(&rng, 0, 3) == 0;
        c.per_row = tu_rng_range(&rng, 0, 2) == 0 ? (int32_t)tu_rng_range(&rng, 1, 3) : 0;
        c.density = tu_rng_uniform(&rng);
        c.layout_batch = tu_rng_range(&rng, 0, 1) ? (int32_t)c.batch : 1;
        const int64_t lh = tu_rng_range(&rng, 0, 2);
        c.layout_heads = (int32_t)(lh == 0 ? 1 : lh == 1 ? c.heads_kv : c.heads_q);
        c.strides = (bwd_strides)tu_rng_range(&rng, 0, 2);
        c.use_plan_run = (int)tu_rng_range(&rng, 0, 1);
        c.scale = tu_rng_range(&rng, 0, 1) ? 0.0f : (float)(0.05 + tu_rng_uniform(&rng));
        run_case(&c, case_seed(7, (uint64_t)id), NULL, NULL);
    }
}

/* Bytes of dQ, dK and dV of a case, as run_case copies them. */
static size_t grad_bytes(const bwd_case *c) {
    int64_t st[3], total = 0;
    strides_of(c->strides, 0, c->seq_q, c->heads_q, c->head_dim, st);
    total += span_of(c->batch, c->seq_q, c->heads_q, c->head_dim, st);
    strides_of(c->strides, 1, c->seq_k, c->heads_kv, c->head_dim, st);
    total += span_of(c->batch, c->seq_k, c->heads_kv, c->head_dim, st);
    strides_of(c->strides, 0, c->seq_k, c->heads_kv, c->head_dim, st);
    total += span_of(c->batch, c->seq_k, c->heads_kv, c->head_dim, st);
    return (size_t)total * elem_size(c->dtype);
}

/* The gradients do not depend on the thread count: bitwise equal with 1,
 * 2 and 3 threads (and on a second run). */
SK_TEST(backward_cpu_repeatable_across_thread_counts) {
    static const int threads[4] = {1, 2, 3, 2};
    for (int t = 0; t < 2; ++t) {
        bwd_case c = base_case(t ? SK_DTYPE_F32 : SK_DTYPE_BF16);
        c.seq_q = 300;
        c.seq_k = 270;
        c.heads_q = 8;
        c.heads_kv = 2;
        c.layout_heads = 8;
        c.density = 0.5;
        c.causal = 1;
        c.strides = t ? BWD_PADDED : BWD_PACKED;
        const uint64_t seed = case_seed(8, (uint64_t)t);
        const int saved = omp_get_max_threads();
        void *g[4] = {NULL, NULL, NULL, NULL};
        int failed = 0;
        for (int r = 0; r < 4; ++r) {
            omp_set_num_threads(threads[r]);
            failed |= run_case(&c, seed, NULL, &g[r]);
        }
        omp_set_num_threads(saved);
        const size_t bytes = grad_bytes(&c);
        for (int r = 1; r < 4 && !failed; ++r)
            CHECK(g[0] != NULL && g[r] != NULL && memcmp(g[0], g[r], bytes) == 0,
                  "seed %llu: dQ, dK, dV with 1 thread differ from those with %d threads (run %d)",
                  (unsigned long long)seed, threads[r], r);
        for (int r = 0; r < 4; ++r) free(g[r]);
    }
}
