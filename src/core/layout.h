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

/* The owned layout behind sk_layout_t: one allocation per array. */
struct sk_layout_s {
    sk_bsr bsr; /* arrays owned by the handle */
};

/* Allocate an owned layout over `grid` (already checked by sk_grid_check)
 * with `total_rows` = slices * row_blocks rows and room for `nnz` indices
 * (0 <= nnz <= INT32_MAX); bsr.grid and bsr.nnz are set, the arrays are
 * uninitialised. NULL when an allocation fails (nothing is recorded). */
struct sk_layout_s *sk_layout_alloc(const sk_grid *grid, int32_t total_rows, int64_t nnz);

/* Free an owned layout (NULL is a no-op); no SK_ENTER, unlike sk_layout_destroy. */
void sk_layout_free(struct sk_layout_s *layout);

/* Hand a freshly built layout to the caller: check it completely (an
 * internal self-check) and store it in *out, or free it and return
 * SK_STATUS_INTERNAL_ERROR, leaving *out untouched. */
sk_status sk_layout_finish(struct sk_layout_s *layout, sk_layout_t *out);

/* The causal count of query row block `row` of `grid`: key blocks
 * 0 .. n-1 hold at least one pair k <= q + Sk - Sq; n may be 0. */
int32_t sk_layout_causal_blocks(const sk_grid *grid, int32_t row);

/* The diagonal key block of query row block `row`: the block holding the
 * position p = q + Sk - Sq of the row's last valid query, clamped to
 * [0, col_blocks - 1]. */
int32_t sk_layout_diagonal_block(const sk_grid *grid, int32_t row);

#endif /* SK_CORE_LAYOUT_H */
