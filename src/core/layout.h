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

#endif /* SK_CORE_LAYOUT_H */
