/*
 * layout_validate.c - the full check of a host BSR layout.
 *
 * Order: grid, arrays present (and 4-byte aligned), nnz, offsets (first 0, non-decreasing, each
 * within [0, nnz]), last offset == nnz, then each row's indices (in range,
 * strictly increasing; a repeat is reported as a duplicate, a decrease as
 * unsorted). Messages name the slice, row and entry.
 */
#include "core/check.h"
#include "core/internal.h"
#include "core/layout.h"

sk_status sk_layout_check(const sk_bsr *layout) {
    SK_CHECK_NOT_NULL(layout);
    int32_t row_blocks, col_blocks, slices;
    SK_TRY(sk_grid_check(&layout->grid, &row_blocks, &col_blocks, &slices));
    return sk_layout_check_arrays(layout, slices, row_blocks, col_blocks);
}

sk_status sk_layout_check_arrays(const sk_bsr *layout, int32_t slices, int32_t row_blocks,
                                 int32_t col_blocks) {
    if (layout->row_offsets == NULL)
        return sk_error(SK_STATUS_BAD_PARAM_NULL_POINTER, "layout->row_offsets must not be NULL");
    if (layout->nnz < 0)
        return sk_error(SK_STATUS_BAD_LAYOUT_COUNT, "layout->nnz = %d is negative",
                        (int)layout->nnz);
    if (layout->col_indices == NULL && layout->nnz > 0)
        return sk_error(SK_STATUS_BAD_PARAM_NULL_POINTER,
                        "layout->col_indices must not be NULL when nnz = %d > 0", (int)layout->nnz);
    /* The arrays are read as int32: a misaligned one is undefined behaviour. */
    SK_TRY(sk_check_alignment(layout->row_offsets, NULL, 4, 4, 0, "layout->row_offsets"));
    if (layout->col_indices != NULL)
        SK_TRY(sk_check_alignment(layout->col_indices, NULL, 4, 4, 0, "layout->col_indices"));

    const int32_t rows = slices * row_blocks; /* fits: checked by sk_grid_check */
    const int32_t *off = layout->row_offsets;
    if (off[0] != 0)
        return sk_error(SK_STATUS_BAD_LAYOUT_OFFSETS, "layout->row_offsets[0] = %d must be 0",
                        (int)off[0]);
    for (int32_t g = 0; g < rows; ++g) {
        if (off[g + 1] < off[g])
            return sk_error(SK_STATUS_BAD_LAYOUT_OFFSETS,
                            "layout->row_offsets decrease at row %d (slice %d, row block %d): %d "
                            "then %d",
                            (int)g, (int)(g / row_blocks), (int)(g % row_blocks), (int)off[g],
                            (int)off[g + 1]);
        if (off[g + 1] > layout->nnz)
            return sk_error(SK_STATUS_BAD_LAYOUT_COUNT,
                            "layout->row_offsets[%d] = %d exceeds nnz = %d", (int)(g + 1),
                            (int)off[g + 1], (int)layout->nnz);
    }
    if (off[rows] != layout->nnz)
        return sk_error(SK_STATUS_BAD_LAYOUT_COUNT,
                        "layout->row_offsets[%d] = %d (the total count) differs from nnz = %d",
                        (int)rows, (int)off[rows], (int)layout->nnz);

    const int32_t *idx = layout->col_indices;
    for (int32_t g = 0; g < rows; ++g) {
        for (int32_t e = off[g]; e < off[g + 1]; ++e) {
            if (idx[e] < 0 || idx[e] >= col_blocks)
                return sk_error(SK_STATUS_BAD_LAYOUT_INDEX_RANGE,
                                "layout->col_indices[%d] = %d (slice %d, row block %d) is outside "
                                "[0, %d)",
                                (int)e, (int)idx[e], (int)(g / row_blocks), (int)(g % row_blocks),
                                (int)col_blocks);
            if (e > off[g] && idx[e] == idx[e - 1])
                return sk_error(SK_STATUS_BAD_LAYOUT_DUPLICATE,
                                "layout->col_indices[%d] = %d repeats in slice %d, row block %d",
                                (int)e, (int)idx[e], (int)(g / row_blocks), (int)(g % row_blocks));
            if (e > off[g] && idx[e] < idx[e - 1])
                return sk_error(SK_STATUS_BAD_LAYOUT_UNSORTED,
                                "layout->col_indices[%d] = %d follows %d in slice %d, row block "
                                "%d: a row must be increasing",
                                (int)e, (int)idx[e], (int)idx[e - 1], (int)(g / row_blocks),
                                (int)(g % row_blocks));
        }
    }
    return SK_STATUS_SUCCESS;
}

sk_status sk_layout_validate(const sk_bsr *layout) {
    SK_ENTER("sk_layout_validate");
    return sk_layout_check(layout);
}
