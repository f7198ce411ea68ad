/*
 * topk_check.h - checks of the library's top-k outputs against the naive
 * selection of topk_naive.h (pooled blocks and scores under the tolerance
 * rule, layouts entry by entry) and against the host builder
 * sk_layout_create_topk; host layout buffers poisoned for those checks.
 * Each check returns its verdict and prints the first few differences
 * under a name the caller gives.
 */
#ifndef SK_TESTS_COMMON_TOPK_CHECK_H
#define SK_TESTS_COMMON_TOPK_CHECK_H

#include <stdint.h>

#include "common/topk_naive.h"
#include "sparsek.h"

/* Pooled [B, H, blocks, D] of Q (is_q) or K against the naive mean of the
 * host tensor (tk_naive_pooled): error <= 2 x that of a naive fp32 mean +
 * 1e-30. Returns the number of mismatches. */
int tk_check_pooled(const tk_problem *t, int is_q, const float *pooled, const char *name);

/* Which scores tk_check_scores_ex compares: every block; the candidates
 * only (the GPU leaves the others unwritten with causal); the blocks a row
 * may pick by score (tk_pickable). */
enum { TK_SCORES_ALL = 0, TK_SCORES_CANDIDATES = 1, TK_SCORES_PICKABLE = 2 };

/* scores [slices, rb, cb] against the naive ones from pooled pq / pk:
 * error <= factor x 2 x that of a naive fp32 dot product ((terms + 2) u
 * sum|terms|) + 1e-30 on the blocks `which` (TK_SCORES_*) names; a naive
 * score that is not finite wants the same inf or a NaN. Returns the number
 * of mismatches. tk_check_scores: every block. */
int tk_check_scores_ex(const tk_problem *t, const float *pq, const float *pk, const float *scores,
                       double factor, int which);
int tk_check_scores(const tk_problem *t, const float *pq, const float *pk, const float *scores,
                    double factor);

/* Layout (off [total_rows + 1], idx) equal, entry by entry, to
 * sk_layout_create_topk on the same scores. */
int tk_layout_equals_builder(const tk_problem *t, const float *scores, const int32_t *off,
                             const int32_t *idx, const char *name);
/* Layout equal to the naive selection (tk_naive_select_row) on `scores`,
 * written in increasing block order. */
int tk_layout_equals_naive(const tk_problem *t, const float *scores, const int32_t *off,
                           const int32_t *idx, const char *name);
/* Layout equal to the naive selection on the naive fp64 scores of pooled
 * pq / pk, except between blocks whose scores differ by no more than the
 * tolerance of tk_check_scores (factor 1) combined: per row, the forced
 * blocks, then min(k, pickable blocks with a score neither NaN nor -inf)
 * such blocks, each scoring at least as high as every one left out, up to
 * that tolerance, and below it only on an exact tie with a higher index.
 * Where no two scores of a row are that close, this is exact. */
int tk_layout_matches_naive_scores(const tk_problem *t, const float *pq, const float *pk,
                                   const int32_t *off, const int32_t *idx, const char *name);

/* Host output layout buffers for a problem, poisoned with -7 (one extra
 * index entry past the capacity, checked untouched); bsr points at them
 * with nnz -99. */
typedef struct tk_layout_buf {
    int32_t cap, rows;
    int32_t *off, *idx;
    sk_bsr bsr;
} tk_layout_buf;

/* Returns 0 when the capacity query fails or out of memory. */
int tk_layout_buf_alloc(const tk_problem *t, tk_layout_buf *l);
void tk_layout_buf_free(tk_layout_buf *l);
/* The written layout: nnz = capacity, last offset <= capacity, the slot past
 * the capacity untouched, the problem's grid, and valid as a BSR with nnz =
 * its real count. */
int tk_layout_sane(const tk_problem *t, const tk_layout_buf *l, const char *name);

#endif /* SK_TESTS_COMMON_TOPK_CHECK_H */
