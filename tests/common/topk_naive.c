/*
 * topk_naive.c - the tests' naive top-k block selection (see topk_naive.h):
 * plain loops, fp64 sums, the row rules found by trying every token
 * position instead of by formula.
 */
#include "common/topk_naive.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------
 * The problem
 * ------------------------------------------------------------------------- */

/* All-zero strides mean packed [B, S, H, D]. */
static void resolve_strides(const int64_t in[3], int64_t s, int64_t h, int64_t d, int64_t out[3]) {
    if (in[0] == 0 && in[1] == 0 && in[2] == 0) {
        out[2] = d;
        out[1] = h * d;
        out[0] = s * h * d;
    } else {
        memcpy(out, in, 3 * sizeof(int64_t));
    }
}

/* Elements from the first to one past the last of a strided tensor. */
static int64_t span_of(int64_t b, int64_t s, int64_t h, int64_t d, const int64_t st[3]) {
    return (b - 1) * st[0] + (s - 1) * st[1] + (h - 1) * st[2] + d;
}

static float random_value(tu_rng *rng, int quant) {
    if (quant) return 0.25f * (float)tu_rng_range(rng, -2, 2);
    return (float)tu_rng_normal(rng);
}

void tk_problem_init(tk_problem *t, sk_backend backend, sk_dtype dtype, int64_t b, int64_t sq,
                     int64_t sk, int64_t hq, int64_t hkv, int64_t d, int32_t bq, int32_t bk) {
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

void tk_problem_pad_strides(tk_problem *t) {
    const sk_topk_desc *d = &t->desc;
    t->desc.q_strides[2] = d->head_dim + 8;
    t->desc.q_strides[1] = d->heads_q * (d->head_dim + 8) + 16;
    t->desc.q_strides[0] = d->seq_q * t->desc.q_strides[1] + 32;
    t->desc.k_strides[2] = d->head_dim + 16;
    t->desc.k_strides[1] = d->heads_kv * (d->head_dim + 16) + 8;
    t->desc.k_strides[0] = d->seq_k * t->desc.k_strides[1] + 8;
}

int tk_problem_alloc_host(tk_problem *t, tu_rng *rng, int flags) {
    const sk_topk_desc *d = &t->desc;
    resolve_strides(d->q_strides, d->seq_q, d->heads_q, d->head_dim, t->qs);
    resolve_strides(d->k_strides, d->seq_k, d->heads_kv, d->head_dim, t->ks);
    t->q_span = span_of(d->batch, d->seq_q, d->heads_q, d->head_dim, t->qs);
    t->k_span = span_of(d->batch, d->seq_k, d->heads_kv, d->head_dim, t->ks);
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
                             random_value(rng, quant));
    for (int64_t b = 0; b < d->batch; ++b)
        for (int64_t s = 0; s < d->seq_k; ++s)
            for (int64_t h = 0; h < d->heads_kv; ++h)
                for (int64_t e = 0; e < d->head_dim; ++e) {
                    const int64_t at = b * t->ks[0] + s * t->ks[1] + h * t->ks[2] + e;
                    tu_store(t->k, d->dtype, at, random_value(rng, quant));
                    if (t->v != NULL) tu_store(t->v, d->dtype, at, (float)tu_rng_normal(rng));
                }
    return 1;
}

void tk_problem_free(tk_problem *t) {
    free(t->q);
    free(t->k);
    free(t->v);
    t->q = t->k = t->v = NULL;
}

void tk_describe(const tk_problem *t, char *buf, size_t len) {
    const sk_topk_desc *d = &t->desc;
    snprintf(buf, len,
             "B%lld Sq%lld Sk%lld Hq%lld Hkv%lld D%lld bq%d bk%d k%d sink%d local%d %s%s dtype%d",
             (long long)d->batch, (long long)d->seq_q, (long long)d->seq_k, (long long)d->heads_q,
             (long long)d->heads_kv, (long long)d->head_dim, (int)d->block_q, (int)d->block_k,
             (int)d->k, (int)d->sink_blocks, (int)d->local_blocks,
             d->mask == SK_MASK_CAUSAL ? "causal" : "full", d->per_kv_head ? " per-kv" : "",
             (int)d->dtype);
}

int32_t tk_row_blocks(const tk_problem *t) {
    return (int32_t)((t->desc.seq_q + t->desc.block_q - 1) / t->desc.block_q);
}

int32_t tk_col_blocks(const tk_problem *t) {
    return (int32_t)((t->desc.seq_k + t->desc.block_k - 1) / t->desc.block_k);
}

int32_t tk_heads(const tk_problem *t) {
    return (int32_t)(t->desc.per_kv_head ? t->desc.heads_kv : t->desc.heads_q);
}

int32_t tk_total_rows(const tk_problem *t) {
    return (int32_t)t->desc.batch * tk_heads(t) * tk_row_blocks(t);
}

int64_t tk_pooled_q_len(const tk_problem *t) {
    return t->desc.batch * t->desc.heads_q * tk_row_blocks(t) * t->desc.head_dim;
}

int64_t tk_pooled_k_len(const tk_problem *t) {
    return t->desc.batch * t->desc.heads_kv * tk_col_blocks(t) * t->desc.head_dim;
}

float tk_scale(const tk_problem *t) {
    return t->desc.scale != 0.0f ? t->desc.scale : (float)(1.0 / sqrt((double)t->desc.head_dim));
}

void tk_grid(const tk_problem *t, sk_grid *g) {
    memset(g, 0, sizeof *g);
    g->rows = t->desc.seq_q;
    g->cols = t->desc.seq_k;
    g->block_rows = t->desc.block_q;
    g->block_cols = t->desc.block_k;
    g->batch = (int32_t)t->desc.batch;
    g->heads = tk_heads(t);
}

void tk_attention_desc(const tk_problem *t, sk_attention_desc *a) {
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

int tk_random_pooled(const tk_problem *t, tu_rng *rng, int quant, float **pq, float **pk) {
    const int64_t nq = tk_pooled_q_len(t), nk = tk_pooled_k_len(t);
    *pq = (float *)malloc((size_t)nq * 4);
    *pk = (float *)malloc((size_t)nk * 4);
    if (*pq == NULL || *pk == NULL) return 0;
    for (int64_t i = 0; i < nq; ++i) (*pq)[i] = random_value(rng, quant);
    for (int64_t i = 0; i < nk; ++i) (*pk)[i] = random_value(rng, quant);
    return 1;
}

float *tk_random_scores(const tk_problem *t, tu_rng *rng, double special) {
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
 * Row rules
 * ------------------------------------------------------------------------- */

/* Block j of row i holds a causal pair: some query q of the row and key k
 * of the block (both within the sequences) with k <= q + Sk - Sq. */
static int has_causal_pair(const tk_problem *t, int32_t i, int32_t j) {
    const sk_topk_desc *d = &t->desc;
    const int64_t k_first = (int64_t)j * d->block_k;
    for (int64_t q = (int64_t)i * d->block_q; q < (int64_t)(i + 1) * d->block_q && q < d->seq_q;
         ++q)
        if (k_first <= q + d->seq_k - d->seq_q) return 1;
    return 0;
}

void tk_row_sets(const tk_problem *t, int32_t i, uint8_t *cand, uint8_t *forced) {
    const sk_topk_desc *d = &t->desc;
    const int32_t cb = tk_col_blocks(t);
    const int64_t q_last = ((int64_t)(i + 1) * d->block_q < d->seq_q ? (int64_t)(i + 1) * d->block_q
                                                                     : d->seq_q) - 1;
    const int64_t pos = q_last + d->seq_k - d->seq_q;
    int32_t diag = 0; /* the block holding pos, clamped */
    for (int32_t j = 0; j < cb; ++j)
        if ((int64_t)j * d->block_k <= pos) diag = j;
    for (int32_t j = 0; j < cb; ++j) {
        cand[j] = d->mask == SK_MASK_CAUSAL ? (uint8_t)has_causal_pair(t, i, j) : 1;
        const int sink = j < d->sink_blocks;
        const int local = j <= diag && j > diag - d->local_blocks;
        forced[j] = (uint8_t)(cand[j] && (sink || local));
    }
}

int tk_pickable(const tk_problem *t, const uint8_t *cand, const uint8_t *forced, int32_t j) {
    return t->desc.k > 0 && cand[j] && !forced[j];
}

int64_t tk_naive_capacity(const tk_problem *t) {
    const int32_t rb = tk_row_blocks(t), cb = tk_col_blocks(t);
    uint8_t *cand = (uint8_t *)malloc((size_t)cb), *forced = (uint8_t *)malloc((size_t)cb);
    if (cand == NULL || forced == NULL) {
        free(cand);
        free(forced);
        return -1;
    }
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

int tk_score_span_naive(const tk_problem *t, int32_t rows[2], int32_t cols[2]) {
    const int32_t rb = tk_row_blocks(t), cb = tk_col_blocks(t);
    rows[0] = rows[1] = cols[0] = cols[1] = 0;
    uint8_t *cand = (uint8_t *)malloc((size_t)cb), *forced = (uint8_t *)malloc((size_t)cb);
    if (cand == NULL || forced == NULL) {
        free(cand);
        free(forced);
        return 0;
    }
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

/* ---------------------------------------------------------------------------
 * Block means and scores in fp64
 * ------------------------------------------------------------------------- */

double tk_naive_pooled(const tk_problem *t, int is_q, int64_t b, int64_t h, int32_t i, int64_t e,
                       double *fp32_error) {
    const sk_topk_desc *d = &t->desc;
    const int64_t seq = is_q ? d->seq_q : d->seq_k;
    const int32_t bs = is_q ? d->block_q : d->block_k;
    const int64_t *st = is_q ? t->qs : t->ks;
    const void *x = is_q ? t->q : t->k;
    double sum = 0, abs_sum = 0;
    int64_t n = 0;
    for (int64_t s = (int64_t)i * bs; s < (int64_t)(i + 1) * bs && s < seq; ++s) {
        const double v = tu_load(x, d->dtype, b * st[0] + s * st[1] + h * st[2] + e);
        sum += v;
        abs_sum += fabs(v);
        ++n;
    }
    *fp32_error = (double)n * 0x1.0p-24 * abs_sum / (double)n;
    return sum / (double)n;
}

double tk_naive_score(const tk_problem *t, const float *pq, const float *pk, int64_t slice,
                      int64_t i, int64_t j, double *abs_sum) {
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

void tk_naive_scores(const tk_problem *t, const float *pq, const float *pk, float *scores) {
    const int64_t rb = tk_row_blocks(t), cb = tk_col_blocks(t), rows = tk_total_rows(t);
    for (int64_t g = 0; g < rows; ++g)
        for (int64_t j = 0; j < cb; ++j) {
            double a;
            scores[g * cb + j] = (float)tk_naive_score(t, pq, pk, g / rb, g % rb, j, &a);
        }
}

/* ---------------------------------------------------------------------------
 * Selection
 * ------------------------------------------------------------------------- */

void tk_naive_select_row(const tk_problem *t, const uint8_t *cand, const uint8_t *forced,
                         const double *scores, uint8_t *sel) {
    const int32_t cb = tk_col_blocks(t);
    for (int32_t j = 0; j < cb; ++j) sel[j] = forced[j];
    for (int32_t r = 0; r < t->desc.k; ++r) {
        int32_t best = -1;
        for (int32_t j = 0; j < cb; ++j) {
            if (!cand[j] || sel[j] || isnan(scores[j]) || scores[j] == -INFINITY) continue;
            if (best < 0 || scores[j] > scores[best]) best = j;
        }
        if (best < 0) break;
        sel[best] = 1;
    }
}
