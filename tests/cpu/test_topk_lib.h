/*
 * test_topk_lib.h - helpers of the top-k tests (CPU: tests/cpu/test_topk*.c,
 * GPU: tests/gpu/test_topk_gpu.c), written independently of src/: a naive
 * pooling and scoring loop in fp64, the candidate and forced blocks found by
 * brute force over token positions, and a repeated-argmax selection.
 * Header-only (static inline), so each runner compiles its own copy.
 */
#ifndef SK_TESTS_TOPK_LIB_H
#define SK_TESTS_TOPK_LIB_H

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/test_util.h"
#include "core/topk_rules.h"
#include "cpu/cpu_backend.h"
#include "harness.h"
#include "sparsek.h"

#define FLT_MAX_TEST FLT_MAX

enum { TK_WITH_V = 1, TK_QUANT = 2 };

/* A top-k problem with host tensors. */
typedef struct tk_problem {
    sk_topk_desc desc;
    void *q, *k, *v;          /* host, desc->dtype, strides below (v as k) */
    int64_t q_span, k_span;   /* elements */
    int64_t qs[3], ks[3];     /* resolved strides */
} tk_problem;

static inline void tk_resolve(const int64_t in[3], int64_t s, int64_t h, int64_t d, int64_t out[3]) {
    if (in[0] == 0 && in[1] == 0 && in[2] == 0) {
        out[2] = d;
        out[1] = h * d;
        out[0] = s * h * d;
    } else {
        memcpy(out, in, 3 * sizeof(int64_t));
    }
}

static inline void tk_problem_init(tk_problem *t, sk_backend backend, sk_dtype dtype, int64_t b,
                                   int64_t sq, int64_t sk, int64_t hq, int64_t hkv, int64_t d,
                                   int32_t bq, int32_t bk) {
    memset(t, 0, sizeof *t);
    sk_topk_desc_init(&t->desc, sizeof t->desc);
    t->desc.backend = backend;
    t->desc.dtype = dtype;
    t->desc.batch = b;
    t->desc.seq_q = sq;
    t->desc.seq_k = sk;
    t->desc.heads_q = hq;
    t->desc.heads_kv = hkv;
    t->desc.head_dim = d;
    t->desc.block_q = bq;
    t->desc.block_k = bk;
    t->desc.k = 2;
}

/* Padded strides: head rows D + 8 apart, sequence and batch with slack
 * (all multiples of 8 elements, as the CUDA backend needs). */
static inline void tk_problem_pad_strides(tk_problem *t) {
    const sk_topk_desc *d = &t->desc;
    t->desc.q_strides[2] = d->head_dim + 8;
    t->desc.q_strides[1] = d->heads_q * (d->head_dim + 8) + 16;
    t->desc.q_strides[0] = d->seq_q * t->desc.q_strides[1] + 32;
    t->desc.k_strides[2] = d->head_dim + 16;
    t->desc.k_strides[1] = d->heads_kv * (d->head_dim + 16) + 8;
    t->desc.k_strides[0] = d->seq_k * t->desc.k_strides[1] + 8;
}

static inline int64_t tk_span(int64_t b, int64_t s, int64_t h, int64_t d, const int64_t st[3]) {
    return (b - 1) * st[0] + (s - 1) * st[1] + (h - 1) * st[2] + d;
}

static inline int32_t tk_row_blocks(const tk_problem *t) {
    return (int32_t)((t->desc.seq_q + t->desc.block_q - 1) / t->desc.block_q);
}
static inline int32_t tk_col_blocks(const tk_problem *t) {
    return (int32_t)((t->desc.seq_k + t->desc.block_k - 1) / t->desc.block_k);
}
static inline int32_t tk_heads(const tk_problem *t) {
    return (int32_t)(t->desc.per_kv_head ? t->desc.heads_kv : t->desc.heads_q);
}
static inline int32_t tk_total_rows(const tk_problem *t) {
    return (int32_t)t->desc.batch * tk_heads(t) * tk_row_blocks(t);
}
static inline int64_t tk_pooled_q_len(const tk_problem *t) {
    return t->desc.batch * t->desc.heads_q * tk_row_blocks(t) * t->desc.head_dim;
}
static inline int64_t tk_pooled_k_len(const tk_problem *t) {
    return t->desc.batch * t->desc.heads_kv * tk_col_blocks(t) * t->desc.head_dim;
}
static inline float tk_scale(const tk_problem *t) {
    return t->desc.scale != 0.0f ? t->desc.scale : (float)(1.0 / sqrt((double)t->desc.head_dim));
}

static inline float tk_value(tu_rng *rng, int quant) {
    if (quant) return 0.25f * (float)tu_rng_range(rng, -2, 2);
    return (float)tu_rng_normal(rng);
}

/* Q, K (and V) on the host: NaN everywhere, then values at the logical
 * elements (NaN left in stride padding catches a stray read). */
static inline int tk_problem_alloc_host(tk_problem *t, tu_rng *rng, int flags) {
    const sk_topk_desc *d = &t->desc;
    tk_resolve(d->q_strides, d->seq_q, d->heads_q, d->head_dim, t->qs);
    tk_resolve(d->k_strides, d->seq_k, d->heads_kv, d->head_dim, t->ks);
    t->q_span = tk_span(d->batch, d->seq_q, d->heads_q, d->head_dim, t->qs);
    t->k_span = tk_span(d->batch, d->seq_k, d->heads_kv, d->head_dim, t->ks);
    const size_t es = d->dtype == SK_DTYPE_F32 ? 4 : 2;
    t->q = malloc((size_t)t->q_span * es);
    t->k = malloc((size_t)t->k_span * es);
    t->v = (flags & TK_WITH_V) ? malloc((size_t)t->k_span * es) : NULL;
    if (t->q == NULL || t->k == NULL || ((flags & TK_WITH_V) && t->v == NULL)) return 0;
    tu_fill_nan(t->q, d->dtype, t->q_span);
    tu_fill_nan(t->k, d->dtype, t->k_span);
    if (t->v != NULL) tu_fill_nan(t->v, d->dtype, t->k_span);
    const int quant = (flags & TK_QUANT) != 0;
    for (int64_t b = 0; b < d->batch; ++b)
        for (int64_t s = 0; s < d->seq_q; ++s)
            for (int64_t h = 0; h < d->heads_q; ++h)
                for (int64_t e = 0; e < d->head_dim; ++e)
                    tu_store(t->q, d->dtype, b * t->qs[0] + s * t->qs[1] + h * t->qs[2] + e,
                             tk_value(rng, quant));
    for (int64_t b = 0; b < d->batch; ++b)
        for (int64_t s = 0; s < d->seq_k; ++s)
            for (int64_t h = 0; h < d->heads_kv; ++h)
                for (int64_t e = 0; e < d->head_dim; ++e) {
                    const int64_t at = b * t->ks[0] + s * t->ks[1] + h * t->ks[2] + e;
                    tu_store(t->k, d->dtype, at, tk_value(rng, quant));
                    if (t->v != NULL) tu_store(t->v, d->dtype, at, (float)tu_rng_normal(rng));
                }
    return 1;
}

static inline void tk_problem_free(tk_problem *t) {
    free(t->q);
    free(t->k);
    free(t->v);
    t->q = t->k = t->v = NULL;
}

static inline void tk_describe(const tk_problem *t, char *buf, size_t len) {
    const sk_topk_desc *d = &t->desc;
    snprintf(buf, len,
             "B%lld Sq%lld Sk%lld Hq%lld Hkv%lld D%lld bq%d bk%d k%d sink%d local%d %s%s dtype%d",
             (long long)d->batch, (long long)d->seq_q, (long long)d->seq_k, (long long)d->heads_q,
             (long long)d->heads_kv, (long long)d->head_dim, (int)d->block_q, (int)d->block_k,
             (int)d->k, (int)d->sink_blocks, (int)d->local_blocks,
             d->mask == SK_MASK_CAUSAL ? "causal" : "full", d->per_kv_head ? " per-kv" : "",
             (int)d->dtype);
}

/* ---------------------------------------------------------------------------
 * Naive pooling and scoring (fp64)
 * ------------------------------------------------------------------------- */

/* Compares pooled [B, H, blocks, D] with a naive mean of the host tensor;
 * tolerance: 2 x the error of a naive fp32 sum (n u sum|x| / n) + 1e-30.
 * Returns the number of mismatches (the first few are printed). */
static inline int tk_check_pooled(const tk_problem *t, int is_q, const float *pooled,
                                  const char *name) {
    const sk_topk_desc *d = &t->desc;
    const int64_t heads = is_q ? d->heads_q : d->heads_kv, seq = is_q ? d->seq_q : d->seq_k;
    const int32_t bs = is_q ? d->block_q : d->block_k;
    const int32_t nb = is_q ? tk_row_blocks(t) : tk_col_blocks(t);
    const int64_t *st = is_q ? t->qs : t->ks;
    const void *x = is_q ? t->q : t->k;
    int bad = 0;
    for (int64_t b = 0; b < d->batch; ++b)
        for (int64_t h = 0; h < heads; ++h)
            for (int32_t i = 0; i < nb; ++i)
                for (int64_t e = 0; e < d->head_dim; ++e) {
                    double sum = 0, abs_sum = 0;
                    int64_t n = 0;
                    for (int64_t s = (int64_t)i * bs; s < (int64_t)(i + 1) * bs && s < seq; ++s) {
                        const double v = tu_load(x, d->dtype, b * st[0] + s * st[1] + h * st[2] + e);
                        sum += v;
                        abs_sum += fabs(v);
                        ++n;
                    }
                    const double ref = sum / (double)n;
                    const double tol = 2.0 * (double)n * 0x1.0p-24 * abs_sum / (double)n + 1e-30;
                    const float got = pooled[((b * heads + h) * nb + i) * d->head_dim + e];
                    if (!(fabs((double)got - ref) <= tol)) {
                        if (bad < 3)
                            printf("    %s[b%lld h%lld blk%d d%lld] = %.9g, naive %.9g (tol %.3g)\n",
                                   name, (long long)b, (long long)h, (int)i, (long long)e,
                                   (double)got, ref, tol);
                        ++bad;
                    }
                }
    return bad;
}

/* Random pooled Q and K (fp32): N(0, 1) or quantised to {-0.5 .. 0.5} step
 * 0.25 (exact products and sums: many equal scores). */
static inline int tk_random_pooled(const tk_problem *t, tu_rng *rng, int quant, float **pq,
                                   float **pk) {
    const int64_t nq = tk_pooled_q_len(t), nk = tk_pooled_k_len(t);
    *pq = (float *)malloc((size_t)nq * 4);
    *pk = (float *)malloc((size_t)nk * 4);
    if (*pq == NULL || *pk == NULL) return 0;
    for (int64_t i = 0; i < nq; ++i) (*pq)[i] = tk_value(rng, quant);
    for (int64_t i = 0; i < nk; ++i) (*pk)[i] = tk_value(rng, quant);
    return 1;
}

/* The validated problem as src/core/topk.c would build it (for calling the
 * CPU backend's internal functions directly). */
static inline void tk_fill_problem(const tk_problem *t, sk_topk_problem *p) {
    const sk_topk_desc *d = &t->desc;
    memset(p, 0, sizeof *p);
    p->backend = d->backend;
    p->dtype = d->dtype;
    p->batch = d->batch;
    p->seq_q = d->seq_q;
    p->seq_k = d->seq_k;
    p->heads_q = d->heads_q;
    p->heads_kv = d->heads_kv;
    p->head_dim = d->head_dim;
    p->group = (int32_t)(d->heads_q / d->heads_kv);
    p->block_q = d->block_q;
    p->block_k = d->block_k;
    p->row_blocks = tk_row_blocks(t);
    p->col_blocks = tk_col_blocks(t);
    p->heads = tk_heads(t);
    p->slices = (int32_t)d->batch * p->heads;
    p->total_rows = tk_total_rows(t);
    p->scale = tk_scale(t);
    p->k = d->k;
    p->sink_blocks = d->sink_blocks;
    p->local_blocks = d->local_blocks;
    p->causal = d->mask == SK_MASK_CAUSAL;
    p->per_kv_head = d->per_kv_head != 0;
}

/* Naive fp64 score of (slice, i, j), and the sum of |terms| (for the
 * tolerance). */
static inline double tk_naive_score(const tk_problem *t, const float *pq, const float *pk,
                                    int64_t slice, int64_t i, int64_t j, double *abs_sum) {
    const sk_topk_desc *d = &t->desc;
    const int64_t heads = tk_heads(t), rb = tk_row_blocks(t), cb = tk_col_blocks(t);
    const int64_t g = d->heads_q / d->heads_kv, b = slice / heads, hs = slice % heads;
    const int64_t h_first = d->per_kv_head ? hs * g : hs, nh = d->per_kv_head ? g : 1;
    const int64_t hk = d->per_kv_head ? hs : hs / g;
    double s = 0, a = 0;
    for (int64_t h = h_first; h < h_first + nh; ++h)
        for (int64_t e = 0; e < d->head_dim; ++e) {
            const double x = pq[((b * d->heads_q + h) * rb + i) * d->head_dim + e];
            const double y = pk[((b * d->heads_kv + hk) * cb + j) * d->head_dim + e];
            s += x * y;
            a += fabs(x * y);
        }
    const double scale = tk_scale(t);
    *abs_sum = fabs(scale) * a;
    return scale * s;
}

/* Which scores tk_check_scores_ex compares: every block; the candidates
 * only (the GPU leaves the others unwritten with causal); the blocks a row
 * may pick by score (candidates, not forced, k > 0). */
enum { TK_SCORES_ALL = 0, TK_SCORES_CANDIDATES = 1, TK_SCORES_PICKABLE = 2 };

/* scores [slices, rb, cb] against the naive ones: error <= factor x 2 x the
 * error of a naive fp32 dot product ((terms + 2) u sum|terms|) + 1e-30, on
 * the blocks `which` (TK_SCORES_*) names. Returns the mismatches. */
static inline int tk_check_scores_ex(const tk_problem *t, const float *pq, const float *pk,
                                     const float *scores, double factor, int which);

static inline int tk_check_scores(const tk_problem *t, const float *pq, const float *pk,
                                  const float *scores, double factor) {
    return tk_check_scores_ex(t, pq, pk, scores, factor, 0);
}

/* ---------------------------------------------------------------------------
 * Candidate and forced blocks by brute force over token positions
 * ------------------------------------------------------------------------- */

/* Block j of row i holds a causal pair: some query q of the row and key k
 * of the block (both within the sequences) with k <= q + Sk - Sq. */
static inline int tk_causal_pair(const tk_problem *t, int32_t i, int32_t j) {
    const sk_topk_desc *d = &t->desc;
    const int64_t k_first = (int64_t)j * d->block_k;
    for (int64_t q = (int64_t)i * d->block_q; q < (int64_t)(i + 1) * d->block_q && q < d->seq_q;
         ++q)
        if (k_first <= q + d->seq_k - d->seq_q) return 1;
    return 0;
}

/* Per row: cand[j], forced[j] (cb entries each). */
static inline void tk_row_sets(const tk_problem *t, int32_t i, uint8_t *cand, uint8_t *forced) {
    const sk_topk_desc *d = &t->desc;
    const int32_t cb = tk_col_blocks(t);
    const int64_t q_last = ((int64_t)(i + 1) * d->block_q < d->seq_q ? (int64_t)(i + 1) * d->block_q
                                                                     : d->seq_q) - 1;
    const int64_t pos = q_last + d->seq_k - d->seq_q;
    int32_t diag = 0; /* the block holding pos, clamped */
    for (int32_t j = 0; j < cb; ++j)
        if ((int64_t)j * d->block_k <= pos) diag = j;
    for (int32_t j = 0; j < cb; ++j) {
        cand[j] = d->mask == SK_MASK_CAUSAL ? (uint8_t)tk_causal_pair(t, i, j) : 1;
        const int sink = j < d->sink_blocks;
        const int local = j <= diag && j > diag - d->local_blocks;
        forced[j] = (uint8_t)(cand[j] && (sink || local));
    }
}

/* Block j of a row (cand and forced from tk_row_sets) may be picked by
 * score: a candidate, not forced, and k > 0. */
static inline int tk_pickable(const tk_problem *t, const uint8_t *cand, const uint8_t *forced,
                              int32_t j) {
    return t->desc.k > 0 && cand[j] && !forced[j];
}

static inline int64_t tk_naive_capacity(const tk_problem *t) {
    const int32_t rb = tk_row_blocks(t), cb = tk_col_blocks(t);
    uint8_t *cand = (uint8_t *)malloc((size_t)cb), *forced = (uint8_t *)malloc((size_t)cb);
    if (cand == NULL || forced == NULL) return -1;
    int64_t per_slice = 0;
    for (int32_t i = 0; i < rb; ++i) {
        tk_row_sets(t, i, cand, forced);
        int64_t nc = 0, nf = 0;
        for (int32_t j = 0; j < cb; ++j) {
            nc += cand[j];
            nf += forced[j];
        }
        per_slice += nf + (t->desc.k < nc - nf ? t->desc.k : nc - nf);
    }
    free(cand);
    free(forced);
    return per_slice * t->desc.batch * tk_heads(t);
}

/* Brute force over token positions (tk_row_sets): the query row blocks
 * [rows[0], rows[1]) that hold every row with a block to pick by score, and
 * the key blocks [cols[0], cols[1]) that hold every such block; [0, 0) when
 * there are none (what sk_topk_score_span must give). */
static inline int tk_score_span_naive(const tk_problem *t, int32_t rows[2], int32_t cols[2]) {
    const int32_t rb = tk_row_blocks(t), cb = tk_col_blocks(t);
    rows[0] = rows[1] = cols[0] = cols[1] = 0;
    uint8_t *cand = (uint8_t *)malloc((size_t)cb), *forced = (uint8_t *)malloc((size_t)cb);
    if (cand == NULL || forced == NULL) return 0;
    int any = 0;
    for (int32_t i = 0; i < rb; ++i) {
        tk_row_sets(t, i, cand, forced);
        for (int32_t j = 0; j < cb; ++j) {
            if (!tk_pickable(t, cand, forced, j)) continue;
            if (!any) rows[0] = i, cols[0] = j, cols[1] = j + 1, any = 1;
            rows[1] = i + 1;
            if (j < cols[0]) cols[0] = j;
            if (j + 1 > cols[1]) cols[1] = j + 1;
        }
    }
    free(cand);
    free(forced);
    return 1;
}

static inline int tk_check_scores_ex(const tk_problem *t, const float *pq, const float *pk,
                                     const float *scores, double factor, int which) {
    const int64_t rb = tk_row_blocks(t), cb = tk_col_blocks(t);
    const int64_t slices = t->desc.batch * tk_heads(t);
    const int64_t g = t->desc.per_kv_head ? t->desc.heads_q / t->desc.heads_kv : 1;
    const double terms = (double)(g * t->desc.head_dim + 2);
    uint8_t *cand = (uint8_t *)malloc((size_t)cb), *forced = (uint8_t *)malloc((size_t)cb);
    if (cand == NULL || forced == NULL) return 1;
    int bad = 0;
    for (int64_t i = 0; i < rb; ++i) {
        tk_row_sets(t, (int32_t)i, cand, forced);
        for (int64_t s = 0; s < slices; ++s)
            for (int64_t j = 0; j < cb; ++j) {
                if (which != TK_SCORES_ALL && !cand[j]) continue;
                if (which == TK_SCORES_PICKABLE && !tk_pickable(t, cand, forced, (int32_t)j))
                    continue;
                double a;
                const double ref = tk_naive_score(t, pq, pk, s, i, j, &a);
                const double tol = factor * 2.0 * terms * 0x1.0p-24 * a + 1e-30;
                const float got = scores[(s * rb + i) * cb + j];
                /* A reference that is not finite wants the same inf (sign
                 * included) or a NaN. */
                const int match = isfinite(ref) ? fabs((double)got - ref) <= tol
                                  : isnan(ref)  ? isnan(got)
                                                : (double)got == ref;
                if (!match) {
                    if (bad < 3)
                        printf("    score[slice %lld, %lld, %lld] = %.9g, naive %.9g (tol %.3g)\n",
                               (long long)s, (long long)i, (long long)j, (double)got, ref, tol);
                    ++bad;
                }
            }
    }
    free(cand);
    free(forced);
    return bad;
}

/* ---------------------------------------------------------------------------
 * Layout comparisons
 * ------------------------------------------------------------------------- */

static inline void tk_grid(const tk_problem *t, sk_grid *g) {
    memset(g, 0, sizeof *g);
    g->rows = t->desc.seq_q;
    g->cols = t->desc.seq_k;
    g->block_rows = t->desc.block_q;
    g->block_cols = t->desc.block_k;
    g->batch = (int32_t)t->desc.batch;
    g->heads = tk_heads(t);
}

/* Layout (off [total_rows + 1], idx) equal to sk_layout_create_topk on the
 * same scores, entry by entry. */
static inline int tk_layout_equals_builder(const tk_problem *t, const float *scores,
                                           const int32_t *off, const int32_t *idx,
                                           const char *name) {
    sk_grid grid;
    tk_grid(t, &grid);
    sk_topk_options o;
    memset(&o, 0, sizeof o);
    o.k = t->desc.k;
    o.sink_blocks = t->desc.sink_blocks;
    o.local_blocks = t->desc.local_blocks;
    o.causal = t->desc.mask == SK_MASK_CAUSAL;
    sk_layout_t built = NULL;
    sk_status st = sk_layout_create_topk(&built, &grid, scores, &o);
    if (st != SK_STATUS_SUCCESS) {
        printf("    %s: sk_layout_create_topk: %s\n", name, sk_last_error());
        return 0;
    }
    sk_bsr v;
    sk_layout_view(built, &v);
    const int32_t rows = tk_total_rows(t);
    int ok = 1;
    for (int32_t g = 0; g <= rows && ok; ++g)
        if (off[g] != v.row_offsets[g]) {
            printf("    %s: row_offsets[%d] = %d, builder %d\n", name, (int)g, (int)off[g],
                   (int)v.row_offsets[g]);
            ok = 0;
        }
    for (int32_t e = 0; ok && e < v.nnz; ++e)
        if (idx[e] != v.col_indices[e]) {
            printf("    %s: col_indices[%d] = %d, builder %d\n", name, (int)e, (int)idx[e],
                   (int)v.col_indices[e]);
            ok = 0;
        }
    sk_layout_destroy(built);
    return ok;
}

/* Layout equal to the naive rule: forced blocks, then k times the best
 * remaining candidate (strictly greater replaces, so ties keep the lower
 * index; NaN and -inf never picked), written in increasing order. */
static inline int tk_layout_equals_naive(const tk_problem *t, const float *scores,
                                         const int32_t *off, const int32_t *idx,
                                         const char *name) {
    const int32_t rb = tk_row_blocks(t), cb = tk_col_blocks(t), rows = tk_total_rows(t);
    uint8_t *cand = (uint8_t *)malloc((size_t)cb), *forced = (uint8_t *)malloc((size_t)cb);
    uint8_t *sel = (uint8_t *)malloc((size_t)cb);
    if (cand == NULL || forced == NULL || sel == NULL) return 0;
    int ok = off[0] == 0;
    for (int32_t i = 0; i < rb && ok; ++i) {
        tk_row_sets(t, i, cand, forced);
        for (int32_t g = i; g < rows && ok; g += rb) {
            const float *s = scores + (int64_t)g * cb;
            for (int32_t j = 0; j < cb; ++j) sel[j] = forced[j];
            for (int32_t r = 0; r < t->desc.k; ++r) {
                int32_t best = -1;
                for (int32_t j = 0; j < cb; ++j) {
                    if (!cand[j] || sel[j] || isnan(s[j]) || s[j] == -INFINITY) continue;
                    if (best < 0 || s[j] > s[best]) best = j;
                }
                if (best < 0) break;
                sel[best] = 1;
            }
            int32_t e = off[g];
            for (int32_t j = 0; j < cb && ok; ++j) {
                if (!sel[j]) continue;
                if (e >= off[g + 1] || idx[e] != j) {
                    printf("    %s: slice row %d: entry %d is %d, naive wants block %d\n", name,
                           (int)g, (int)(e - off[g]), e < off[g + 1] ? (int)idx[e] : -1, (int)j);
                    ok = 0;
                }
                ++e;
            }
            if (ok && e != off[g + 1]) {
                printf("    %s: row %d has %d entries, naive %d\n", name, (int)g,
                       (int)(off[g + 1] - off[g]), (int)(e - off[g]));
                ok = 0;
            }
        }
    }
    free(cand);
    free(forced);
    free(sel);
    return ok;
}

/* Random scores [slices, rb, cb]: quantised values (ties), with a fraction
 * `special` of NaN, -inf, +inf, -0 and +0. */
static inline float *tk_random_scores(const tk_problem *t, tu_rng *rng, double special) {
    const int64_t n = (int64_t)tk_total_rows(t) * tk_col_blocks(t);
    float *s = (float *)malloc((size_t)(n > 0 ? n : 1) * 4);
    if (s == NULL) return NULL;
    for (int64_t e = 0; e < n; ++e) {
        if (tu_rng_uniform(rng) < special) {
            static const float specials[5] = {NAN, -INFINITY, INFINITY, -0.0f, 0.0f};
            s[e] = specials[tu_rng_range(rng, 0, 4)];
        } else {
            s[e] = 0.5f * (float)tu_rng_range(rng, -4, 4);
        }
    }
    return s;
}

/* ---------------------------------------------------------------------------
 * CPU checks used by several tests
 * ------------------------------------------------------------------------- */

/* Output layout buffers for a problem, poisoned with -7 (one extra index
 * entry past the capacity, checked untouched). */
typedef struct tk_layout_buf {
    int32_t cap, rows;
    int32_t *off, *idx;
    sk_bsr bsr;
} tk_layout_buf;

static inline int tk_layout_buf_alloc(const tk_problem *t, tk_layout_buf *l) {
    memset(l, 0, sizeof *l);
    if (sk_topk_layout_capacity(&t->desc, NULL, &l->cap) != SK_STATUS_SUCCESS) return 0;
    l->rows = tk_total_rows(t);
    l->off = (int32_t *)malloc(((size_t)l->rows + 1) * 4);
    l->idx = (int32_t *)malloc(((size_t)l->cap + 1) * 4);
    if (l->off == NULL || l->idx == NULL) return 0;
    for (int32_t g = 0; g <= l->rows; ++g) l->off[g] = -7;
    for (int32_t e = 0; e <= l->cap; ++e) l->idx[e] = -7;
    l->bsr.row_offsets = l->off;
    l->bsr.col_indices = l->idx;
    l->bsr.nnz = -99;
    return 1;
}

static inline void tk_layout_buf_free(tk_layout_buf *l) {
    free(l->off);
    free(l->idx);
    l->off = l->idx = NULL;
}

/* The written layout: nnz = capacity, last offset <= capacity, the slot past
 * the capacity untouched, and valid as a BSR with nnz = its real count. */
static inline int tk_layout_sane(const tk_problem *t, const tk_layout_buf *l, const char *name) {
    int ok = 1;
    if (l->bsr.nnz != l->cap) {
        printf("    %s: nnz %d, capacity %d\n", name, (int)l->bsr.nnz, (int)l->cap);
        ok = 0;
    }
    if (l->idx[l->cap] != -7) {
        printf("    %s: wrote past the capacity\n", name);
        ok = 0;
    }
    if (l->off[l->rows] < 0 || l->off[l->rows] > l->cap) {
        printf("    %s: last offset %d outside [0, %d]\n", name, (int)l->off[l->rows], (int)l->cap);
        return 0;
    }
    sk_bsr v = l->bsr;
    v.nnz = l->off[l->rows];
    sk_grid g;
    tk_grid(t, &g);
    if (memcmp(&v.grid, &g, sizeof g) != 0) {
        printf("    %s: layout grid differs\n", name);
        ok = 0;
    }
    if (sk_layout_validate(&v) != SK_STATUS_SUCCESS) {
        printf("    %s: invalid layout: %s\n", name, sk_last_error());
        ok = 0;
    }
    return ok;
}

/* sk_select_topk on the CPU from pooled Q/K: scores as the naive loop, and
 * the layout as the builder and the naive selection on those scores. */
static inline int tk_check_select_cpu(const tk_problem *t, const float *pq, const float *pk,
                                      const char *name) {
    tk_layout_buf l;
    if (!tk_layout_buf_alloc(t, &l)) return 0;
    sk_status st = sk_select_topk(&t->desc, pq, pk, &l.bsr, NULL, 0, NULL);
    if (st != SK_STATUS_SUCCESS) {
        printf("    %s: %s\n", name, sk_last_error());
        tk_layout_buf_free(&l);
        return 0;
    }
    sk_topk_problem p;
    tk_fill_problem(t, &p);
    p.pooled_q = pq;
    p.pooled_k = pk;
    float *scores = (float *)malloc((size_t)l.rows * tk_col_blocks(t) * 4);
    if (scores == NULL) return 0;
    sk_cpu_topk_scores(&p, scores);
    int ok = tk_layout_sane(t, &l, name);
    ok &= tk_check_scores(t, pq, pk, scores, 1.0) == 0;
    ok &= tk_layout_equals_builder(t, scores, l.off, l.idx, name);
    ok &= tk_layout_equals_naive(t, scores, l.off, l.idx, name);
    free(scores);
    tk_layout_buf_free(&l);
    return ok;
}

static inline int tk_check_from_scores_cpu(const tk_problem *t, const float *scores,
                                           const char *name) {
    tk_layout_buf l;
    if (!tk_layout_buf_alloc(t, &l)) return 0;
    sk_status st = sk_layout_from_scores(&t->desc, scores, &l.bsr, NULL, 0, NULL);
    if (st != SK_STATUS_SUCCESS) {
        printf("    %s: %s\n", name, sk_last_error());
        tk_layout_buf_free(&l);
        return 0;
    }
    int ok = tk_layout_sane(t, &l, name);
    ok &= tk_layout_equals_builder(t, scores, l.off, l.idx, name);
    ok &= tk_layout_equals_naive(t, scores, l.off, l.idx, name);
    tk_layout_buf_free(&l);
    return ok;
}

static inline void tk_attention_desc(const tk_problem *t, sk_attention_desc *a) {
    sk_attention_desc_init(a, sizeof *a);
    a->backend = t->desc.backend;
    a->dtype = t->desc.dtype;
    a->batch = t->desc.batch;
    a->seq_q = t->desc.seq_q;
    a->seq_k = t->desc.seq_k;
    a->heads_q = t->desc.heads_q;
    a->heads_kv = t->desc.heads_kv;
    a->head_dim = t->desc.head_dim;
    a->mask = t->desc.mask;
    memcpy(a->q_strides, t->desc.q_strides, sizeof a->q_strides);
    memcpy(a->k_strides, t->desc.k_strides, sizeof a->k_strides);
    memcpy(a->v_strides, t->desc.k_strides, sizeof a->v_strides);
}

/* sk_attention_topk on the CPU equals pool + select + attention forward,
 * bitwise (O, LSE and the layout), and sk_pool_select_topk gives the same
 * layout. Needs TK_WITH_V. */
static inline int tk_check_attention_cpu(const tk_problem *t, const char *name) {
    sk_attention_desc a;
    tk_attention_desc(t, &a);
    const sk_topk_desc *d = &t->desc;
    const int64_t no = d->batch * d->seq_q * d->heads_q * d->head_dim;
    const int64_t nl = d->batch * d->heads_q * d->seq_q;
    const size_t es = d->dtype == SK_DTYPE_F32 ? 4 : 2;
    void *o1 = malloc((size_t)no * es), *o2 = malloc((size_t)no * es);
    float *l1 = (float *)malloc((size_t)nl * 4), *l2 = (float *)malloc((size_t)nl * 4);
    float *pq = (float *)malloc((size_t)tk_pooled_q_len(t) * 4);
    float *pk = (float *)malloc((size_t)tk_pooled_k_len(t) * 4);
    tk_layout_buf la, lb, lc;
    if (o1 == NULL || o2 == NULL || l1 == NULL || l2 == NULL || pq == NULL || pk == NULL ||
        !tk_layout_buf_alloc(t, &la) || !tk_layout_buf_alloc(t, &lb) ||
        !tk_layout_buf_alloc(t, &lc))
        return 0;
    tu_fill_nan(o1, d->dtype, no);
    tu_fill_nan(o2, d->dtype, no);
    tu_fill_nan(l1, SK_DTYPE_F32, nl);
    tu_fill_nan(l2, SK_DTYPE_F32, nl);
    int ok = 1;
    sk_status st = sk_attention_topk(&a, d, t->q, t->k, t->v, o1, l1, &la.bsr, NULL, 0, NULL);
    if (st != SK_STATUS_SUCCESS) {
        printf("    %s: sk_attention_topk: %s\n", name, sk_last_error());
        ok = 0;
    }
    st = sk_block_pool(d, t->q, t->k, pq, pk, NULL);
    if (st == SK_STATUS_SUCCESS) st = sk_select_topk(d, pq, pk, &lb.bsr, NULL, 0, NULL);
    sk_bsr real = lb.bsr;
    real.nnz = lb.off[lb.rows];
    if (st == SK_STATUS_SUCCESS) st = sk_attention_forward(&a, &real, t->q, t->k, t->v, o2, l2, NULL, 0, NULL);
    if (st != SK_STATUS_SUCCESS) {
        printf("    %s: steps: %s\n", name, sk_last_error());
        ok = 0;
    }
    size_t ps_bytes = 1;
    st = sk_pool_select_topk_workspace_size(d, &ps_bytes);
    if (st == SK_STATUS_SUCCESS && ps_bytes != 0) st = SK_STATUS_INTERNAL_ERROR;
    if (st == SK_STATUS_SUCCESS) st = sk_pool_select_topk(d, t->q, t->k, &lc.bsr, NULL, 0, NULL);
    if (st != SK_STATUS_SUCCESS) {
        printf("    %s: sk_pool_select_topk (workspace %zu bytes): %s\n", name, ps_bytes,
               sk_last_error());
        ok = 0;
    }
    if (ok) {
        ok &= tk_layout_sane(t, &la, name);
        ok &= memcmp(la.off, lb.off, ((size_t)la.rows + 1) * 4) == 0;
        ok &= memcmp(la.idx, lb.idx, (size_t)la.cap * 4) == 0;
        ok &= memcmp(lc.off, lb.off, ((size_t)lc.rows + 1) * 4) == 0;
        ok &= memcmp(lc.idx, lb.idx, (size_t)lc.cap * 4) == 0 && lc.bsr.nnz == lb.bsr.nnz;
        ok &= memcmp(o1, o2, (size_t)no * es) == 0;
        ok &= memcmp(l1, l2, (size_t)nl * 4) == 0;
        int64_t nan_o = 0;
        for (int64_t e = 0; e < no; ++e) nan_o += isnan(tu_load(o1, d->dtype, e));
        if (nan_o != 0) {
            printf("    %s: %lld NaN outputs\n", name, (long long)nan_o);
            ok = 0;
        }
        if (!ok) printf("    %s: sk_attention_topk differs from its steps\n", name);
    }
    free(o1);
    free(o2);
    free(l1);
    free(l2);
    free(pq);
    free(pk);
    tk_layout_buf_free(&la);
    tk_layout_buf_free(&lb);
    tk_layout_buf_free(&lc);
    return ok;
}

#endif /* SK_TESTS_TOPK_LIB_H */
