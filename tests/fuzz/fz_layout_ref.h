/*
 * fz_layout_ref.h - an independent reading of sparsek.h's layout rules,
 * written from the header alone: the grid of sk_grid_blocks, the complete
 * check of sk_layout_validate with the statuses each broken rule may give,
 * and which key blocks a layout row selects for an attention head.
 *
 * Grid (sk_grid / sk_grid_blocks): rows, cols, batch, heads >= 1; blocks 64
 * or 128; row_blocks = ceil(rows / block_rows), col_blocks likewise; and
 * the counts of the int32 arrays fit int32: slices * row_blocks + 1 and
 * col_blocks. The dense count slices * row_blocks * col_blocks need not
 * (issue 33). Computed here in exact arithmetic.
 * Layout (sk_bsr / sk_layout_validate), in the header's order: the grid,
 * the arrays (row_offsets non-NULL, col_indices non-NULL when nnz > 0,
 * nnz >= 0), the offsets (first 0, non-decreasing, last == nnz), then each
 * row's indices (in [0, col_blocks), strictly increasing).
 */
#ifndef SK_FUZZ_LAYOUT_REF_H
#define SK_FUZZ_LAYOUT_REF_H

#include <stdint.h>

#include "fz_finding.h"
#include "sparsek.h"

typedef struct fz_grid_ref {
    int ok;           /* sk_grid_blocks must succeed */
    fz_statuses fail; /* when not ok: the statuses it may return */
    int64_t row_blocks, col_blocks, slices, total_rows, dense; /* when ok */
} fz_grid_ref;

void fz_grid_ref_eval(const sk_grid *g, fz_grid_ref *r);

typedef struct fz_layout_ref {
    int ok;           /* sk_layout_validate must succeed */
    fz_statuses fail; /* when not ok: the statuses it may return */
    fz_grid_ref grid;
} fz_layout_ref;

/* The full check. Non-NULL arrays must hold the documented counts:
 * row_offsets slices * row_blocks + 1 entries (when the grid is valid),
 * col_indices max(nnz, 0); nothing past them is read. */
void fz_layout_ref_eval(const sk_bsr *l, fz_layout_ref *r);

/* The layout slice of batch b, query head h of an attention with hq query
 * and hkv KV heads (the mapping under sk_bsr in sparsek.h). */
int64_t fz_slice_of(const sk_grid *g, int64_t b, int64_t h, int64_t hq, int64_t hkv);

/* sel[j] = 1 when row block i of slice s selects key block j (j < cb); the
 * layout must be valid. */
void fz_layout_row(const sk_bsr *l, int64_t row_blocks, int64_t s, int64_t i, int64_t cb,
                   uint8_t *sel);

/* got equals want (grid, nnz, offsets over total_rows + 1, indices); a
 * difference is a finding named `what`. */
void fz_layout_require_equal(const sk_bsr *got, const sk_bsr *want, int64_t total_rows,
                             const char *what);

#endif /* SK_FUZZ_LAYOUT_REF_H */
