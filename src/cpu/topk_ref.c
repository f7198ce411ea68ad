/*
 * topk_ref.c - the CPU reference of the top-k block selection (declared in
 * cpu_backend.h; the rules are src/core/topk_rules.h).
 *
 * Pooling: fp64 sums of the block's valid tokens, divided by their count,
 * rounded once to fp32. Scoring: fp64 dot products (summed over the group's
 * query heads with per_kv_head), scaled, rounded once to fp32. Selection: per
 * row, the forced blocks, then the remaining candidates with a score that is
 * neither NaN nor -inf sorted by (score descending, index ascending), the
 * first k taken; the row is written in increasing block order. -0 and +0
 * compare equal, so they tie and the lower index wins.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "cpu/cpu_backend.h"
#include "cpu/half.h"

enum { POOL_CHUNK = 64 }; /* fp64 partial sums kept on the stack per pass over a block */

/* Mean of one block of one head: rows t0 .. t0 + count - 1 of a strided
 * [B, S, H, D] tensor into out[0 .. D), D in chunks of POOL_CHUNK. */
static void pool_block(const void *src, sk_dtype dtype, const int64_t stride[3], int64_t b,
                       int64_t h, int64_t t0, int64_t count, int64_t dim, float *out) {
    for (int64_t d0 = 0; d0 < dim; d0 += POOL_CHUNK) {
        const int64_t nd = dim - d0 < POOL_CHUNK ? dim - d0 : POOL_CHUNK;
        double sum[POOL_CHUNK];
        for (int64_t d = 0; d < nd; ++d) sum[d] = 0.0;
        for (int64_t t = t0; t < t0 + count; ++t) {
            const int64_t base = b * stride[0] + t * stride[1] + h * stride[2] + d0;
            for (int64_t d = 0; d < nd; ++d)
                sum[d] += (double)sk_cpu_load1_f32(src, dtype, base + d);
        }
        for (int64_t d = 0; d < nd; ++d) out[d0 + d] = (float)(sum[d] / (double)count);
    }
}

/* Pool every block of one tensor: dst [B, H, nblocks, D]. */
static void pool_tensor(const void *src, sk_dtype dtype, const int64_t stride[3], int64_t batch,
                        int64_t seq, int64_t heads, int64_t dim, int32_t block, int32_t nblocks,
                        float *dst) {
    const int64_t items = batch * heads * nblocks;
#pragma omp parallel for schedule(static)
    for (int64_t it = 0; it < items; ++it) {
        const int64_t i = it % nblocks, h = (it / nblocks) % heads, b = it / nblocks / heads;
        const int64_t t0 = i * block;
        const int64_t count = seq - t0 < block ? seq - t0 : block;
        pool_block(src, dtype, stride, b, h, t0, count, dim, dst + it * dim);
    }
}

sk_status sk_cpu_topk_pool(const sk_topk_problem *p) {
    pool_tensor(p->q, p->dtype, p->q_stride, p->batch, p->seq_q, p->heads_q, p->head_dim,
                p->block_q, p->row_blocks, p->pooled_q_out);
    pool_tensor(p->k_in, p->dtype, p->k_stride, p->batch, p->seq_k, p->heads_kv, p->head_dim,
                p->block_k, p->col_blocks, p->pooled_k_out);
    return SK_STATUS_SUCCESS;
}

void sk_cpu_topk_scores(const sk_topk_problem *p, float *scores) {
    const int64_t rb = p->row_blocks, cb = p->col_blocks, dim = p->head_dim;
    const int64_t rows = (int64_t)p->total_rows;
    const int32_t nq = p->per_kv_head ? p->group : 1; /* query heads summed per score */
#pragma omp parallel for schedule(static)
    for (int64_t g = 0; g < rows; ++g) {
        const int64_t slice = g / rb, i = g % rb;
        const int64_t b = slice / p->heads, hs = slice % p->heads;
        const int64_t h0 = p->per_kv_head ? hs * p->group : hs;    /* first query head */
        const int64_t hk = p->per_kv_head ? hs : hs / p->group;    /* key head */
        const float *kbase = p->pooled_k + (b * p->heads_kv + hk) * cb * dim;
        for (int64_t j = 0; j < cb; ++j) {
            double acc = 0.0;
            for (int32_t e = 0; e < nq; ++e) {
                const float *qrow = p->pooled_q + ((b * p->heads_q + h0 + e) * rb + i) * dim;
                const float *krow = kbase + j * dim;
                for (int64_t d = 0; d < dim; ++d) acc += (double)qrow[d] * (double)krow[d];
            }
            scores[g * cb + j] = (float)((double)p->scale * acc);
        }
    }
}

/* Score descending, then index ascending: a total order (indices differ). */
static int by_score_then_index(const void *a, const void *b) {
    const sk_topk_pair *x = (const sk_topk_pair *)a, *y = (const sk_topk_pair *)b;
    if (x->score > y->score) return -1;
    if (x->score < y->score) return 1;
    return (x->index > y->index) - (x->index < y->index);
}

static int by_index(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

int32_t sk_cpu_topk_select_row(const sk_topk_problem *p, const sk_topk_row *rule,
                               const float *row, sk_topk_pair *pairs, int32_t *out) {
    int32_t n = 0, m = 0;
    for (int32_t j = 0; j < rule->n_cand; ++j) {
        if (sk_topk_is_forced(rule, j)) {
            out[n++] = j;
        } else if (!isnan(row[j]) && row[j] != -INFINITY) {
            pairs[m].score = row[j];
            pairs[m].index = j;
            ++m;
        }
    }
    const int32_t take = p->k < m ? p->k : m;
    if (take < m) qsort(pairs, (size_t)m, sizeof *pairs, by_score_then_index);
    for (int32_t e = 0; e < take; ++e) out[n++] = pairs[e].index;
    if (n > 1) qsort(out, (size_t)n, sizeof *out, by_index); /* out may be NULL when n == 0 */
    return n;
}

sk_status sk_cpu_topk_select(const sk_topk_problem *p) {
    const int64_t cb = p->col_blocks;
    /* <= INT32_MAX: the score matrix limit of sk_topk_build_problem */
    const int64_t dense = (int64_t)p->total_rows * cb;
    float *own = NULL;
    sk_topk_pair *pairs = (sk_topk_pair *)malloc((size_t)cb * sizeof *pairs);
    if (pairs == NULL)
        return sk_error(SK_STATUS_ALLOC_FAILED, "no host memory for %lld candidates", (long long)cb);
    const float *scores = p->scores;
    if (scores == NULL) {
        own = (float *)malloc((size_t)dense * sizeof(float));
        if (own == NULL) {
            free(pairs);
            return sk_error(SK_STATUS_ALLOC_FAILED,
                            "no host memory for the %lld block scores (%d rows x %d col blocks)",
                            (long long)dense, (int)p->total_rows, (int)p->col_blocks);
        }
        sk_cpu_topk_scores(p, own);
        scores = own;
    }
    int32_t off = 0;
    for (int32_t g = 0; g < p->total_rows; ++g) {
        const sk_topk_row rule = sk_topk_row_rules(p, g % p->row_blocks);
        p->row_offsets[g] = off;
        /* With a capacity of 0, col_indices may be NULL: no row writes, and
         * NULL + 0 is itself undefined. */
        int32_t *out = p->col_indices != NULL ? p->col_indices + off : NULL;
        off += sk_cpu_topk_select_row(p, &rule, scores + (int64_t)g * cb, pairs, out);
    }
    p->row_offsets[p->total_rows] = off;
    free(own);
    free(pairs);
    return SK_STATUS_SUCCESS;
}

sk_status sk_cpu_topk_pool_select(const sk_topk_problem *p) {
    const int64_t nq = p->batch * p->heads_q * p->row_blocks * p->head_dim;
    const int64_t nk = p->batch * p->heads_kv * p->col_blocks * p->head_dim;
    float *pq = (float *)malloc((size_t)nq * sizeof(float));
    float *pk = (float *)malloc((size_t)nk * sizeof(float));
    if (pq == NULL || pk == NULL) {
        free(pq);
        free(pk);
        return sk_error(SK_STATUS_ALLOC_FAILED, "no host memory for the pooled Q and K (%lld floats)",
                        (long long)(nq + nk));
    }
    sk_topk_problem q = *p;
    q.pooled_q_out = pq;
    q.pooled_k_out = pk;
    sk_status st = sk_cpu_topk_pool(&q);
    if (st == SK_STATUS_SUCCESS) {
        q.pooled_q = pq;
        q.pooled_k = pk;
        q.scores = NULL;
        st = sk_cpu_topk_select(&q);
    }
    free(pq);
    free(pk);
    return st;
}
