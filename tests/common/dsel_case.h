/*
 * dsel_case.h - one decode selection problem for the tests (CPU and GPU):
 * a paged key cache with shuffled pages, NaN in every slot and page no
 * sequence uses, random lengths, queries; and the naive references: the
 * summaries by brute force over each block's keys, the selection from fp64
 * Quest bounds computed head by head and token by token, sorted in full.
 */
#ifndef SK_TESTS_DSEL_CASE_H
#define SK_TESTS_DSEL_CASE_H

#include <stddef.h>
#include <stdint.h>

#include "common/test_util.h"
#include "sparsek.h"

typedef struct dc_case {
    sk_decode_select_desc desc;
    int32_t *lens;        /* [B] */
    int32_t *table;       /* [B, table_stride]; unused entries hold INT32_MAX (never read) */
    void *cache;          /* k_cache, cache_elems elements of desc.dtype */
    int64_t cache_elems;
    void *q;              /* q_elems elements of desc.dtype */
    int64_t q_elems;
    int quant;            /* values are small multiples of powers of two: exact fp32 sums */
} dc_case;

/* Sizes of a case; `padded` gives q and k_cache padded strides (16-byte
 * multiples). Lengths are drawn in [0, max_seqlen_k] (sequence 0 gets
 * max_seqlen_k, sequence 1 (if any) 0 when `with_empty`). Returns 0 when
 * out of memory. */
int dc_alloc(dc_case *c, tu_rng *rng, sk_backend backend, sk_dtype dtype, int32_t batch,
             int32_t q_len, int32_t hq, int32_t hkv, int32_t head_dim, int32_t block_k,
             int32_t page_size, int32_t max_seqlen_k, int padded, int quant, int with_empty);
void dc_free(dc_case *c);

/* Write random keys (quantised when c->quant) for positions from[b] ..
 * to[b] - 1 (from NULL: 0) of each sequence, through the page table. */
void dc_write_keys(dc_case *c, tu_rng *rng, const int32_t *from, const int32_t *to);
/* Set key (b, pos, h, d) to `value`. */
void dc_set_key(dc_case *c, int32_t b, int32_t pos, int32_t h, int32_t d, float value);

int32_t dc_max_blocks(const dc_case *c);
/* Groups of the two-level selection (0 when desc.group_blocks is 0). */
int32_t dc_max_groups(const dc_case *c);
int64_t dc_summary_elems(const dc_case *c);
int32_t dc_rows(const dc_case *c);

/* Brute force: summary [rows, max_blocks, 2, D] as fp32, for lengths
 * `lens` (empty blocks +inf / -inf), then the group summaries [rows,
 * max_groups, 2, D] when desc.group_blocks > 0. */
void dc_naive_summary(const dc_case *c, const int32_t *lens, float *out);

/* Naive selection from a summary (fp32 values, as dc_naive_summary gives
 * or as loaded from the library's): fp64 scores scale * sum_{t, g} sum_d
 * max(q mn, q mx), the forced blocks, the k best by a full sort (ties to
 * the lower index, NaN and -inf never); with groups, only among the blocks
 * of the top_groups best groups (scored alike). offsets [rows + 1], indices as
 * many as needed (capacity). Also returns the scores [rows, max_blocks]
 * when `scores` is not NULL (unused entries NaN). */
void dc_naive_select(const dc_case *c, const float *summary, int32_t *offsets, int32_t *indices,
                     double *scores);

/* The library's summary (desc.dtype) widened to fp32. */
void dc_summary_to_f32(const dc_case *c, const void *summary, float *out);

#endif /* SK_TESTS_DSEL_CASE_H */
