/*
 * layout.h - internal layout checks and the owned-layout handle, shared by
 * the layout code and the entry points that take layouts. These do not call
 * SK_ENTER, so messages keep the name of the public entry point in progress.
 */
#ifndef SK_CORE_LAYOUT_H
#define SK_CORE_LAYOUT_H

#include "sparsek.h"

/* Grid checks of sk_grid_blocks; outputs may be NULL. */
sk_status sk_grid_check(const sk_grid *grid, int32_t *row_blocks, int32_t *col_blocks,
                        int32_t *slices);

/* Full host-layout check of sk_layout_validate. */
sk_status sk_layout_check(const sk_bsr *layout);
/* Its steps after the grid: arrays present and aligned, nnz, offsets,
 * count and every row's indices, for a grid of `slices` x `row_blocks`
 * rows (fits int32) and `col_blocks` columns checked by the caller (the
 * decode layouts' own grid rule, layout_decode.c). */
sk_status sk_layout_check_arrays(const sk_bsr *layout, int32_t slices, int32_t row_blocks,
                                 int32_t col_blocks);

/* The owned layout behind sk_layout_t: one allocation per array. */
struct sk_layout_s {
    sk_bsr bsr; /* arrays owned by the handle */
};

/* Allocate an owned layout over `grid` (already checked by sk_grid_check)
 * with `total_rows` = slices * row_blocks rows and room for `nnz` indices
 * (0 <= nnz <= INT32_MAX); bsr.grid and bsr.nnz are set, the arrays are
 * uninitialised. NULL when an allocation fails (nothing is recorded). */
struct sk_layout_s *sk_layout_alloc(const sk_grid *grid, int32_t total_rows, int64_t nnz);

/* The block count `nnz` a builder or conversion is about to allocate
 * (`what` names where it comes from, e.g. "the mask's non-zero bytes"):
 * SK_STATUS_BAD_LAYOUT_OVERFLOW unless 0 <= nnz <= INT32_MAX, as
 * sk_bsr.nnz, row_offsets and col_indices are int32. The grid check no
 * longer bounds the dense block count, so every maker checks its own. */
sk_status sk_layout_check_nnz(int64_t nnz, const char *what);

/* Free an owned layout (NULL is a no-op); no SK_ENTER, unlike sk_layout_destroy. */
void sk_layout_free(struct sk_layout_s *layout);

/* Hand a freshly built layout to the caller: check it completely (an
 * internal self-check) and store it in *out, or free it and return
 * SK_STATUS_INTERNAL_ERROR, leaving *out untouched. */
sk_status sk_layout_finish(struct sk_layout_s *layout, sk_layout_t *out);

/* The pattern builders' work (layout_build.c), for the fixed-batch and the
 * varlen builders (layout_varlen.c). */
typedef enum sk_layout_kind {
    SK_LAYOUT_DENSE,
    SK_LAYOUT_CAUSAL,
    SK_LAYOUT_WINDOW,       /* a = left, b = right tokens, each >= 0 */
    SK_LAYOUT_SINKS_WINDOW, /* a = sink tokens >= 0, b = window tokens >= 1 */
    SK_LAYOUT_RANDOM        /* k >= 0 blocks per row, seed, causal */
} sk_layout_kind;

typedef struct sk_layout_params {
    sk_layout_kind kind;
    int64_t a, b;
    int32_t k;
    uint64_t seed;
    int causal;
} sk_layout_params;

/* Build a layout over `grid` (checked by sk_grid_check here) whose every
 * slice is `count` segments one after another: segment s is a grid of
 * segs[s].rows query tokens by segs[s].cols keys (either may be 0: a varlen
 * sequence with no query, or with no key) in the layout's block sizes,
 * owning ceil(rows / block_rows) consecutive rows; its rows follow the
 * pattern over its own tokens (bottom-right alignment within the segment),
 * the rows past the last segment are empty. A fixed-batch layout is one
 * segment: its grid. Checks prm's values (messages name them: "left",
 * "k", ...) first; random rows draw from the stream of their global row
 * (slice * row_blocks + row). */
sk_status sk_layout_build(sk_layout_t *out, const sk_grid *grid, const sk_grid *segs,
                          int32_t count, const sk_layout_params *prm);

/* Varlen layouts (layout_varlen.c). The lengths in cu (host, [batch + 1],
 * side 'q' or 'k' for the messages: "cu_seqlens_q[3] ..."): 0 first,
 * non-decreasing, last == total when total >= 0, each length <= max_len
 * when max_len >= 0; SK_STATUS_BAD_PARAM_SHAPE naming the entry. */
sk_status sk_varlen_check_seqlens(const int32_t *cu, int32_t batch, int64_t total, int64_t max_len,
                                  char side);
/* The block rows the sequences need: the sum of ceil(len_q / block_rows). */
int64_t sk_varlen_rows_needed(const int32_t *cu_q, int32_t batch, int32_t block_rows);
/* A layout that passed sk_layout_check, with a batch-1 grid, against
 * checked lengths: enough rows per slice, and every index of a sequence's
 * rows below its key block count. Sequence b has len_k = k_end[b] -
 * k_start[b] keys (k_start NULL: 0): cu_seqlens_k + 1 and cu_seqlens_k for
 * varlen, seq_lens_k and NULL for paged. */
sk_status sk_varlen_check_layout(const sk_bsr *layout, int32_t batch, const int32_t *cu_q,
                                 const int32_t *k_end, const int32_t *k_start);

/* The causal count of query row block `row` of `grid`: key blocks
 * 0 .. n-1 hold at least one pair k <= q + Sk - Sq; n may be 0. */
int32_t sk_layout_causal_blocks(const sk_grid *grid, int32_t row);

/* The diagonal key block of query row block `row`: the block holding the
 * position p = q + Sk - Sq of the row's last valid query, clamped to
 * [0, col_blocks - 1]. */
int32_t sk_layout_diagonal_block(const sk_grid *grid, int32_t row);

#endif /* SK_CORE_LAYOUT_H */
