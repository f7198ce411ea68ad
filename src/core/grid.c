/*
 * grid.c - checks of a layout's block grid (sizes, block sizes, int32 counts):
 * the row count (slices x row_blocks + 1 offsets) and the column block count
 * fit int32; the dense block count (their product) need not.
 */
#include "core/internal.h"
#include "core/layout.h"

sk_status sk_grid_check(const sk_grid *grid, int32_t *row_blocks, int32_t *col_blocks,
                        int32_t *slices) {
    SK_CHECK_NOT_NULL(grid);
    if (grid->rows < 1 || grid->cols < 1)
        return sk_error(SK_STATUS_BAD_PARAM_SHAPE, "grid rows = %lld and cols = %lld must be >= 1",
                        (long long)grid->rows, (long long)grid->cols);
    if (grid->block_rows != 64 && grid->block_rows != 128)
        return sk_error(SK_STATUS_BAD_PARAM_VALUE, "grid block_rows = %d must be 64 or 128",
                        (int)grid->block_rows);
    if (grid->block_cols != 64 && grid->block_cols != 128)
        return sk_error(SK_STATUS_BAD_PARAM_VALUE, "grid block_cols = %d must be 64 or 128",
                        (int)grid->block_cols);
    if (grid->batch < 1 || grid->heads < 1)
        return sk_error(SK_STATUS_BAD_PARAM_SHAPE, "grid batch = %d and heads = %d must be >= 1",
                        (int)grid->batch, (int)grid->heads);
    /* Every count goes through the checked helpers: rows or cols within a
     * block of INT64_MAX must give their true (huge) block counts, and be
     * refused, rather than wrap into small ones. */
    const int64_t rb = sk_ceil_div_i64(grid->rows, grid->block_rows);
    const int64_t cb = sk_ceil_div_i64(grid->cols, grid->block_cols);
    const int64_t ns = (int64_t)grid->batch * grid->heads; /* two int32: fits int64 */
    int64_t rows_total;
    /* row_offsets has rows_total + 1 entries: that count must fit int32. */
    if (!sk_mul_i64(ns, rb, &rows_total) || rows_total >= INT32_MAX)
        return sk_error(SK_STATUS_BAD_LAYOUT_OVERFLOW,
                        "grid has %lld slices x %lld row blocks: the row-offset array does not "
                        "fit int32 indexing",
                        (long long)ns, (long long)rb);
    /* col_indices holds block columns as int32. The dense block count
     * rows_total x cb is not bounded here (< 2^62, so it fits int64): a
     * 16M-token grid has 131072^2 blocks. What must fit int32 is checked
     * where it is made: nnz by each builder, dense conversions and the
     * top-k score matrix by their own rules (docs/perf/context_parallel.md
     * section 7). */
    if (cb > INT32_MAX)
        return sk_error(SK_STATUS_BAD_LAYOUT_OVERFLOW,
                        "grid cols = %lld make %lld column blocks of %d: the column block count "
                        "does not fit int32 (col_indices are int32)",
                        (long long)grid->cols, (long long)cb, (int)grid->block_cols);
    if (row_blocks != NULL) *row_blocks = (int32_t)rb;
    if (col_blocks != NULL) *col_blocks = (int32_t)cb;
    if (slices != NULL) *slices = (int32_t)ns;
    return SK_STATUS_SUCCESS;
}

sk_status sk_grid_blocks(const sk_grid *grid, int32_t *row_blocks, int32_t *col_blocks,
                         int32_t *slices) {
    SK_ENTER("sk_grid_blocks");
    return sk_grid_check(grid, row_blocks, col_blocks, slices);
}
