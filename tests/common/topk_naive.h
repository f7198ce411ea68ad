/*
 * topk_naive.h - an independent naive top-k block selection for the tests
 * (CPU: tests/cpu/test_topk*.c, GPU: tests/gpu/test_topk_gpu.c), written
 * from the documentation of include/sparsek.h ("Dynamic top-k block
 * selection") and sharing nothing with src/:
 *   problem    a top-k descriptor with host Q, K (and V) tensors;
 *   row rules  candidate and forced blocks by brute force over token
 *              positions, the blocks a row may pick by score, the row
 *              bounds (capacity) and the score span;
 *   fp64       block means and block scores as plain fp64 loops;
 *   selection  forced blocks, then k times the best remaining candidate
 *              (repeated argmax).
 * The comparisons of library outputs with these are in topk_check.h.
 */
#ifndef SK_TESTS_COMMON_TOPK_NAIVE_H
#define SK_TESTS_COMMON_TOPK_NAIVE_H

#include <stddef.h>
#include <stdint.h>

#include "common/test_util.h"
#include "sparsek.h"

/* ---------------------------------------------------------------------------
 * The problem
 * ------------------------------------------------------------------------- */

/* Flags of tk_problem_alloc_host: also fill V; quantised Q and K values. */
enum { TK_WITH_V = 1, TK_QUANT = 2 };

/* A top-k problem with host tensors. */
typedef struct tk_problem {
    sk_topk_desc desc;
    void *q, *k, *v;        /* host, desc.dtype, strides below (v as k) */
    int64_t q_span, k_span; /* elements */
    int64_t qs[3], ks[3];   /* resolved strides */
} tk_problem;

/* desc: sk_topk_desc_init, then these fields and k = 2 (no tensors yet). */
void tk_problem_init(tk_problem *t, sk_backend backend, sk_dtype dtype, int64_t b, int64_t sq,
                     int64_t sk, int64_t hq, int64_t hkv, int64_t d, int32_t bq, int32_t bk);
/* Padded strides: head rows D + 8 apart, sequence and batch with slack
 * (all multiples of 8 elements, as the CUDA backend needs). */
void tk_problem_pad_strides(tk_problem *t);
/* Q, K (and V with TK_WITH_V) on the host: NaN everywhere, then values at
 * the logical elements (NaN left in stride padding catches a stray read).
 * Q and K: N(0, 1), or with TK_QUANT {-0.5 .. 0.5} step 0.25; V: N(0, 1).
 * Returns 0 when out of memory. */
int tk_problem_alloc_host(tk_problem *t, tu_rng *rng, int flags);
void tk_problem_free(tk_problem *t);
/* One line naming the shape and the selection options. */
void tk_describe(const tk_problem *t, char *buf, size_t len);

int32_t tk_row_blocks(const tk_problem *t);   /* ceil(Sq / block_q) */
int32_t tk_col_blocks(const tk_problem *t);   /* ceil(Sk / block_k) */
int32_t tk_heads(const tk_problem *t);        /* layout heads: Hkv with per_kv_head, else Hq */
int32_t tk_total_rows(const tk_problem *t);   /* B * heads * row blocks */
int64_t tk_pooled_q_len(const tk_problem *t); /* elements of [B, Hq, row blocks, D] */
int64_t tk_pooled_k_len(const tk_problem *t); /* elements of [B, Hkv, col blocks, D] */
float tk_scale(const tk_problem *t);          /* desc.scale, or 1/sqrt(D) when it is 0 */

/* The output layout's grid, and an attention descriptor of the same
 * problem (V with K's strides). */
void tk_grid(const tk_problem *t, sk_grid *g);
void tk_attention_desc(const tk_problem *t, sk_attention_desc *a);

/* Random pooled Q and K (fp32, fresh buffers): N(0, 1) or quantised to
 * {-0.5 .. 0.5} step 0.25 (exact products and sums: many equal scores).
 * Returns 0 when out of memory. */
int tk_random_pooled(const tk_problem *t, tu_rng *rng, int quant, float **pq, float **pk);
/* Random scores [slices, rb, cb]: quantised values (ties), with a fraction
 * `special` of NaN, -inf, +inf, -0 and +0. NULL when out of memory. */
float *tk_random_scores(const tk_problem *t, tu_rng *rng, double special);

/* ---------------------------------------------------------------------------
 * Row rules, by brute force over token positions
 * ------------------------------------------------------------------------- */

/* Query row block i: cand[j] (a candidate: any block, or with causal one
 * holding a query q of the row and a key k with k <= q + Sk - Sq) and
 * forced[j] (a candidate that is a sink, j < sink_blocks, or one of the
 * local_blocks blocks ending at the diagonal block, the one holding the
 * key position of the row's last query, clamped to the grid); cb entries
 * each. */
void tk_row_sets(const tk_problem *t, int32_t i, uint8_t *cand, uint8_t *forced);
/* Block j of a row (cand and forced from tk_row_sets) may be picked by
 * score: a candidate, not forced, and k > 0. */
int tk_pickable(const tk_problem *t, const uint8_t *cand, const uint8_t *forced, int32_t j);
/* Sum over all layout rows of forced + min(k, candidates - forced); -1
 * when out of memory. */
int64_t tk_naive_capacity(const tk_problem *t);
/* The query row blocks [rows[0], rows[1]) that hold every row with a block
 * to pick by score, and the key blocks [cols[0], cols[1]) that hold every
 * such block; [0, 0) when there are none. Returns 0 when out of memory. */
int tk_score_span_naive(const tk_problem *t, int32_t rows[2], int32_t cols[2]);

/* ---------------------------------------------------------------------------
 * Block means and scores in fp64
 * ------------------------------------------------------------------------- */

/* Mean over block i's valid tokens of element e of head h, batch b, of the
 * host Q (is_q) or K; *fp32_error: the error bound of a naive fp32 mean of
 * the same n tokens (n 2^-24 sum|x| / n). */
double tk_naive_pooled(const tk_problem *t, int is_q, int64_t b, int64_t h, int32_t i, int64_t e,
                       double *fp32_error);
/* Score of (slice, i, j) from pooled Q / K [B, H, blocks, D]: scale x the
 * dot product, summed over the slice's query heads with per_kv_head;
 * *abs_sum: the sum of |scale x term| (for a tolerance). */
double tk_naive_score(const tk_problem *t, const float *pq, const float *pk, int64_t slice,
                      int64_t i, int64_t j, double *abs_sum);
/* Every naive score, rounded to fp32, into scores [slices, rb, cb]. */
void tk_naive_scores(const tk_problem *t, const float *pq, const float *pk, float *scores);

/* ---------------------------------------------------------------------------
 * Selection
 * ------------------------------------------------------------------------- */

/* One row: sel[j] = forced[j], then k times the best remaining candidate
 * (strictly greater replaces, so ties keep the lower index; NaN and -inf
 * never picked; -0 and +0 tie). */
void tk_naive_select_row(const tk_problem *t, const uint8_t *cand, const uint8_t *forced,
                         const double *scores, uint8_t *sel);

#endif /* SK_TESTS_COMMON_TOPK_NAIVE_H */
