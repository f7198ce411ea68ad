/*
 * topk_check.c - the top-k output checks of topk_check.h.
 */
#include "common/topk_check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------
 * Pooled blocks and scores under the tolerance rule
 * ------------------------------------------------------------------------- */

int tk_check_pooled(const tk_problem *t, int is_q, const float *pooled, const char *name) {
    const sk_topk_desc *d = &t->desc;
    const int64_t heads = is_q ? d->heads_q : d->heads_kv;
    const int32_t nb = is_q ? tk_row_blocks(t) : tk_col_blocks(t);
    int bad = 0;
    for (int64_t b = 0; b < d->batch; ++b)
        for (int64_t h = 0; h < heads; ++h)
            for (int32_t i = 0; i < nb; ++i)
                for (int64_t e = 0; e < d->head_dim; ++e) {
                    double err32;
                    const double ref = tk_naive_pooled(t, is_q, b, h, i, e, &err32);
                    const double tol = 2.0 * err32 + 1e-30;
                    const float got = pooled[((b * heads + h) * nb + i) * d->head_dim + e];
                    if (!(fabs((double)got - ref) <= tol)) {
                        if (bad < 3)
                            printf(
                                "    %s[b%lld h%lld blk%d d%lld] = %.9g, naive %.9g (tol %.3g)\n",
                                name, (long long)b, (long long)h, (int)i, (long long)e, (double)got,
                                ref, tol);
                        ++bad;
                    }
                }
    return bad;
}

/* factor x 2 x the error bound of a naive fp32 dot product of the score's
 * terms (n + 2) u sum|terms|, + 1e-30; 0 for a score that is not finite
 * (compared exactly). */
static double score_tolerance(const tk_problem *t, double ref, double abs_sum, double factor) {
    if (!isfinite(ref)) return 0.0;
    const int64_t g = t->desc.per_kv_head ? t->desc.heads_q / t->desc.heads_kv : 1;
    const double terms = (double)(g * t->desc.head_dim + 2);
    return factor * 2.0 * terms * 0x1.0p-24 * abs_sum + 1e-30;
}

int tk_check_scores_ex(const tk_problem *t, const float *pq, const float *pk, const float *scores,
                       double factor, int which) {
    const int64_t rb = tk_row_blocks(t), cb = tk_col_blocks(t);
    const int64_t slices = t->desc.batch * tk_heads(t);
    uint8_t *cand = (uint8_t *)malloc((size_t)cb), *forced = (uint8_t *)malloc((size_t)cb);
    if (cand == NULL || forced == NULL) {
        free(cand);
        free(forced);
        return 1;
    }
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
                const double tol = score_tolerance(t, ref, a, factor);
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

int tk_check_scores(const tk_problem *t, const float *pq, const float *pk, const float *scores,
                    double factor) {
    return tk_check_scores_ex(t, pq, pk, scores, factor, TK_SCORES_ALL);
}

/* ---------------------------------------------------------------------------
 * Layouts
 * ------------------------------------------------------------------------- */

int tk_layout_equals_builder(const tk_problem *t, const float *scores, const int32_t *off,
                             const int32_t *idx, const char *name) {
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

/* The blocks of layout row g into got[cb]; 0 (printed) when its entries
 * are not increasing block indices below cb. */
static int row_blocks_of(const int32_t *off, const int32_t *idx, int32_t g, int32_t cb,
                         uint8_t *got, const char *name) {
    memset(got, 0, (size_t)cb);
    if (off[g + 1] < off[g]) {
        printf("    %s: row %d: offsets %d .. %d\n", name, (int)g, (int)off[g], (int)off[g + 1]);
        return 0;
    }
    for (int32_t e = off[g]; e < off[g + 1]; ++e) {
        if (idx[e] < 0 || idx[e] >= cb || (e > off[g] && idx[e] <= idx[e - 1])) {
            printf("    %s: row %d: entry %d is block %d (not increasing in [0, %d))\n", name,
                   (int)g, (int)(e - off[g]), (int)idx[e], (int)cb);
            return 0;
        }
        got[idx[e]] = 1;
    }
    return 1;
}

int tk_layout_equals_naive(const tk_problem *t, const float *scores, const int32_t *off,
                           const int32_t *idx, const char *name) {
    const int32_t rb = tk_row_blocks(t), cb = tk_col_blocks(t), rows = tk_total_rows(t);
    uint8_t *cand = (uint8_t *)malloc((size_t)cb), *forced = (uint8_t *)malloc((size_t)cb);
    uint8_t *sel = (uint8_t *)malloc((size_t)cb);
    double *row = (double *)malloc((size_t)cb * sizeof *row);
    int ok = cand != NULL && forced != NULL && sel != NULL && row != NULL && off[0] == 0;
    for (int32_t i = 0; i < rb && ok; ++i) {
        tk_row_sets(t, i, cand, forced);
        for (int32_t g = i; g < rows && ok; g += rb) {
            for (int32_t j = 0; j < cb; ++j) row[j] = scores[(int64_t)g * cb + j];
            tk_naive_select_row(t, cand, forced, row, sel);
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
    free(row);
    return ok;
}

/* One layout row (blocks got[]) against the naive scores ref[] and their
 * tolerances tol[] (see tk_layout_matches_naive_scores). */
static int row_matches_scores(const tk_problem *t, const uint8_t *cand, const uint8_t *forced,
                              const double *ref, const double *tol, const uint8_t *got, int32_t g,
                              const char *name) {
    const int32_t cb = tk_col_blocks(t);
    int32_t eligible = 0, picked = 0;
    for (int32_t j = 0; j < cb; ++j) {
        const int pickable = tk_pickable(t, cand, forced, j);
        const int can = pickable && !isnan(ref[j]) && ref[j] != -INFINITY;
        eligible += can;
        picked += pickable && got[j];
        if ((forced[j] && !got[j]) || (got[j] && !forced[j] && !can)) {
            printf("    %s: row %d: block %d (candidate %d, forced %d, naive score %.9g) %s\n",
                   name, (int)g, (int)j, cand[j], forced[j], ref[j],
                   got[j] ? "selected" : "left out");
            return 0;
        }
    }
    const int32_t want = t->desc.k < eligible ? t->desc.k : eligible;
    if (picked != want) {
        printf("    %s: row %d: %d blocks picked by score, naive %d\n", name, (int)g, (int)picked,
               (int)want);
        return 0;
    }
    for (int32_t p = 0; p < cb; ++p) {
        if (!got[p] || forced[p]) continue;
        for (int32_t u = 0; u < cb; ++u) {
            if (got[u] || !tk_pickable(t, cand, forced, u) || isnan(ref[u]) || ref[u] == -INFINITY)
                continue;
            const int fine = ref[p] == ref[u] ? p < u : ref[p] + tol[p] >= ref[u] - tol[u];
            if (!fine) {
                printf("    %s: row %d: picked block %d (naive %.9g) over block %d (naive %.9g), "
                       "tolerances %.3g %.3g\n",
                       name, (int)g, (int)p, ref[p], (int)u, ref[u], tol[p], tol[u]);
                return 0;
            }
        }
    }
    return 1;
}

int tk_layout_matches_naive_scores(const tk_problem *t, const float *pq, const float *pk,
                                   const int32_t *off, const int32_t *idx, const char *name) {
    const int32_t rb = tk_row_blocks(t), cb = tk_col_blocks(t), rows = tk_total_rows(t);
    uint8_t *cand = (uint8_t *)malloc((size_t)cb), *forced = (uint8_t *)malloc((size_t)cb);
    uint8_t *got = (uint8_t *)malloc((size_t)cb);
    double *ref = (double *)malloc((size_t)cb * sizeof *ref);
    double *tol = (double *)malloc((size_t)cb * sizeof *tol);
    int ok = cand != NULL && forced != NULL && got != NULL && ref != NULL && tol != NULL;
    if (ok && off[0] != 0) {
        printf("    %s: row_offsets[0] = %d\n", name, (int)off[0]);
        ok = 0;
    }
    for (int32_t i = 0; i < rb && ok; ++i) {
        tk_row_sets(t, i, cand, forced);
        for (int32_t g = i; g < rows && ok; g += rb) {
            for (int32_t j = 0; j < cb; ++j) {
                double a;
                ref[j] = tk_naive_score(t, pq, pk, g / rb, i, j, &a);
                tol[j] = score_tolerance(t, ref[j], a, 1.0);
            }
            ok = row_blocks_of(off, idx, g, cb, got, name) &&
                 row_matches_scores(t, cand, forced, ref, tol, got, g, name);
        }
    }
    free(cand);
    free(forced);
    free(got);
    free(ref);
    free(tol);
    return ok;
}

/* ---------------------------------------------------------------------------
 * Layout buffers
 * ------------------------------------------------------------------------- */

int tk_layout_buf_alloc(const tk_problem *t, tk_layout_buf *l) {
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

void tk_layout_buf_free(tk_layout_buf *l) {
    free(l->off);
    free(l->idx);
    l->off = l->idx = NULL;
}

int tk_layout_sane(const tk_problem *t, const tk_layout_buf *l, const char *name) {
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
