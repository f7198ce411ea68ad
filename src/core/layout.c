/*
 * layout.c - the owned layout handle and the conversions between BSR and the
 * dense 0/1 block mask and FlexAttention's padded form.
 *
 * An owned layout is one struct plus two arrays (row offsets over all slices,
 * then the column indices). Every function checks all its arguments before
 * allocating or writing, so a failure leaves *out and output buffers as they
 * were. Every layout handed out has passed sk_layout_check (sk_layout_finish).
 */
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "core/internal.h"
#include "core/layout.h"

/* ---------------------------------------------------------------------------
 * Internal helpers (no SK_ENTER)
 * ------------------------------------------------------------------------- */

struct sk_layout_s *sk_layout_alloc(const sk_grid *grid, int32_t total_rows, int64_t nnz) {
    if (total_rows < 0 || nnz < 0 || nnz > INT32_MAX) return NULL;
    struct sk_layout_s *layout = (struct sk_layout_s *)malloc(sizeof *layout);
    if (layout == NULL) return NULL;
    layout->bsr.grid = *grid;
    layout->bsr.nnz = (int32_t)nnz;
    layout->bsr.row_offsets = (int32_t *)malloc(((size_t)total_rows + 1) * sizeof(int32_t));
    /* At least one element, so that an empty layout still has a non-NULL array. */
    layout->bsr.col_indices = (int32_t *)malloc((nnz > 0 ? (size_t)nnz : 1) * sizeof(int32_t));
    if (layout->bsr.row_offsets == NULL || layout->bsr.col_indices == NULL) {
        sk_layout_free(layout);
        return NULL;
    }
    return layout;
}

sk_status sk_layout_check_nnz(int64_t nnz, const char *what) {
    if (nnz < 0 || nnz > INT32_MAX)
        return sk_error(SK_STATUS_BAD_LAYOUT_OVERFLOW,
                        "%s: nnz = %lld blocks, more than INT32_MAX = %d (a layout's nnz, "
                        "row_offsets and col_indices are int32)",
                        what, (long long)nnz, INT32_MAX);
    return SK_STATUS_SUCCESS;
}

void sk_layout_free(struct sk_layout_s *layout) {
    if (layout == NULL) return;
    free(layout->bsr.row_offsets);
    free(layout->bsr.col_indices);
    free(layout);
}

sk_status sk_layout_finish(struct sk_layout_s *layout, sk_layout_t *out) {
    if (sk_layout_check(&layout->bsr) != SK_STATUS_SUCCESS) {
        /* A bug in a builder: keep the check's text in the message. */
        char why[256];
        strncpy(why, sk_last_error(), sizeof why - 1);
        why[sizeof why - 1] = '\0';
        sk_layout_free(layout);
        return sk_error(SK_STATUS_INTERNAL_ERROR, "the built layout fails its check (%s)", why);
    }
    *out = layout;
    return SK_STATUS_SUCCESS;
}

/* Sizes of a checked grid: slices * row_blocks fits int32 after
 * sk_grid_check; the dense block count need not (< 2^62: int64). */
typedef struct grid_sizes {
    int32_t row_blocks, col_blocks, slices;
    int32_t total_rows; /* slices * row_blocks */
    int64_t dense;      /* total_rows * col_blocks */
} grid_sizes;

static sk_status grid_sizes_get(const sk_grid *grid, grid_sizes *gs) {
    SK_TRY(sk_grid_check(grid, &gs->row_blocks, &gs->col_blocks, &gs->slices));
    gs->total_rows = gs->slices * gs->row_blocks;
    gs->dense = (int64_t)gs->total_rows * gs->col_blocks;
    return SK_STATUS_SUCCESS;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* ---------------------------------------------------------------------------
 * Handle
 * ------------------------------------------------------------------------- */

/* Returns no status, so it leaves the last-error text alone. */
void sk_layout_destroy(sk_layout_t layout) {
    sk_layout_free(layout);
}

sk_status sk_layout_view(sk_layout_t layout, sk_bsr *view) {
    SK_ENTER("sk_layout_view");
    SK_CHECK_NOT_NULL(layout);
    SK_CHECK_NOT_NULL(view);
    *view = layout->bsr;
    return SK_STATUS_SUCCESS;
}

sk_status sk_layout_create_from_bsr(sk_layout_t *out, const sk_bsr *layout) {
    SK_ENTER("sk_layout_create_from_bsr");
    SK_CHECK_NOT_NULL(out);
    SK_CHECK_NOT_NULL(layout);
    SK_TRY(sk_layout_check(layout));
    grid_sizes gs;
    SK_TRY(grid_sizes_get(&layout->grid, &gs));

    struct sk_layout_s *copy = sk_layout_alloc(&layout->grid, gs.total_rows, layout->nnz);
    if (copy == NULL)
        return sk_error(SK_STATUS_ALLOC_FAILED, "no memory for a copy of %d rows and nnz = %d",
                        (int)gs.total_rows, (int)layout->nnz);
    memcpy(copy->bsr.row_offsets, layout->row_offsets,
           ((size_t)gs.total_rows + 1) * sizeof(int32_t));
    if (layout->nnz > 0)
        memcpy(copy->bsr.col_indices, layout->col_indices, (size_t)layout->nnz * sizeof(int32_t));
    return sk_layout_finish(copy, out);
}

/* ---------------------------------------------------------------------------
 * Dense 0/1 block mask
 * ------------------------------------------------------------------------- */

sk_status sk_layout_create_from_mask(sk_layout_t *out, const sk_grid *grid, const uint8_t *mask) {
    SK_ENTER("sk_layout_create_from_mask");
    SK_CHECK_NOT_NULL(out);
    SK_CHECK_NOT_NULL(grid);
    SK_CHECK_NOT_NULL(mask);
    grid_sizes gs;
    SK_TRY(grid_sizes_get(grid, &gs));

    int64_t nnz = 0;
    for (int64_t e = 0; e < gs.dense; ++e) nnz += mask[e] != 0;
    SK_TRY(sk_layout_check_nnz(nnz, "mask selects too many blocks"));

    struct sk_layout_s *layout = sk_layout_alloc(grid, gs.total_rows, nnz);
    if (layout == NULL)
        return sk_error(SK_STATUS_ALLOC_FAILED, "no memory for %d rows and nnz = %lld",
                        (int)gs.total_rows, (long long)nnz);
    int32_t *off = layout->bsr.row_offsets, *idx = layout->bsr.col_indices;
    int32_t n = 0;
    off[0] = 0;
    for (int32_t g = 0; g < gs.total_rows; ++g) {
        const uint8_t *row = mask + (int64_t)g * gs.col_blocks;
        for (int32_t j = 0; j < gs.col_blocks; ++j)
            if (row[j] != 0) idx[n++] = j;
        off[g + 1] = n;
    }
    return sk_layout_finish(layout, out);
}

sk_status sk_layout_to_mask(const sk_bsr *layout, uint8_t *mask, size_t mask_bytes) {
    SK_ENTER("sk_layout_to_mask");
    SK_CHECK_NOT_NULL(layout);
    SK_CHECK_NOT_NULL(mask);
    SK_TRY(sk_layout_check(layout));
    grid_sizes gs;
    SK_TRY(grid_sizes_get(&layout->grid, &gs));
    if ((uint64_t)mask_bytes < (uint64_t)gs.dense)
        return sk_error(SK_STATUS_BAD_PARAM_SHAPE,
                        "mask_bytes = %llu is less than the %lld bytes of the mask (%d slices x "
                        "%d row blocks x %d col blocks)",
                        (unsigned long long)mask_bytes, (long long)gs.dense, (int)gs.slices,
                        (int)gs.row_blocks, (int)gs.col_blocks);
    /* The aliasing rule: the mask is written, the layout read. */
    sk_buffer buffers[3] = {{"mask", mask, gs.dense, 1}};
    sk_layout_array_buffers(buffers + 1, "layout->row_offsets", "layout->col_indices",
                            layout->row_offsets, gs.total_rows, layout->col_indices, layout->nnz,
                            0);
    SK_TRY(sk_check_no_alias(buffers, 3));

    memset(mask, 0, (size_t)gs.dense);
    const int32_t *off = layout->row_offsets, *idx = layout->col_indices;
    for (int32_t g = 0; g < gs.total_rows; ++g) {
        uint8_t *row = mask + (int64_t)g * gs.col_blocks;
        for (int32_t e = off[g]; e < off[g + 1]; ++e) row[idx[e]] = 1;
    }
    return SK_STATUS_SUCCESS;
}

/* ---------------------------------------------------------------------------
 * FlexAttention's padded form (BlockMask kv_num_blocks / kv_indices)
 * ------------------------------------------------------------------------- */

sk_status sk_layout_create_from_flex(sk_layout_t *out, const sk_grid *grid, const int32_t *counts,
                                     const int32_t *indices, int32_t row_width) {
    SK_ENTER("sk_layout_create_from_flex");
    SK_CHECK_NOT_NULL(out);
    SK_CHECK_NOT_NULL(grid);
    SK_CHECK_NOT_NULL(counts);
    SK_CHECK_NOT_NULL(indices);
    SK_TRY(sk_check_alignment(counts, NULL, 4, 4, 0, "counts"));
    SK_TRY(sk_check_alignment(indices, NULL, 4, 4, 0, "indices"));
    grid_sizes gs;
    SK_TRY(grid_sizes_get(grid, &gs));
    if (row_width < 1)
        return sk_error(SK_STATUS_BAD_PARAM_SHAPE, "row_width = %d must be >= 1", (int)row_width);

    /* Counts first: they fix nnz, which must fit int32 (the dense count
     * need not), checked before any index is read. */
    int64_t nnz = 0;
    for (int32_t g = 0; g < gs.total_rows; ++g) {
        if (counts[g] < 0 || counts[g] > gs.col_blocks || counts[g] > row_width)
            return sk_error(SK_STATUS_BAD_LAYOUT_COUNT,
                            "counts[%d] = %d (slice %d, row block %d) is outside [0, %d] "
                            "(col_blocks = %d, row_width = %d)",
                            (int)g, (int)counts[g], (int)(g / gs.row_blocks),
                            (int)(g % gs.row_blocks),
                            (int)(gs.col_blocks < row_width ? gs.col_blocks : row_width),
                            (int)gs.col_blocks, (int)row_width);
        nnz += counts[g];
    }
    SK_TRY(sk_layout_check_nnz(nnz, "counts sum to too many blocks"));

    struct sk_layout_s *layout = sk_layout_alloc(grid, gs.total_rows, nnz);
    if (layout == NULL)
        return sk_error(SK_STATUS_ALLOC_FAILED, "no memory for %d rows and nnz = %lld",
                        (int)gs.total_rows, (long long)nnz);
    int32_t *off = layout->bsr.row_offsets, *idx = layout->bsr.col_indices;
    int32_t n = 0;
    off[0] = 0;
    for (int32_t g = 0; g < gs.total_rows; ++g) {
        const int32_t *src = indices + (int64_t)g * row_width;
        for (int32_t e = 0; e < counts[g]; ++e) {
            if (src[e] < 0 || src[e] >= gs.col_blocks) {
                sk_layout_free(layout);
                return sk_error(SK_STATUS_BAD_LAYOUT_INDEX_RANGE,
                                "indices[%lld] = %d (slice %d, row block %d, entry %d) is outside "
                                "[0, %d)",
                                (long long)((int64_t)g * row_width + e), (int)src[e],
                                (int)(g / gs.row_blocks), (int)(g % gs.row_blocks), (int)e,
                                (int)gs.col_blocks);
            }
            idx[n + e] = src[e];
        }
        qsort(idx + n, (size_t)counts[g], sizeof(int32_t), cmp_i32);
        for (int32_t e = 1; e < counts[g]; ++e) {
            if (idx[n + e] == idx[n + e - 1]) {
                int32_t repeated = idx[n + e];
                sk_layout_free(layout);
                return sk_error(SK_STATUS_BAD_LAYOUT_DUPLICATE,
                                "indices of slice %d, row block %d (counts[%d] = %d) list block "
                                "%d more than once",
                                (int)(g / gs.row_blocks), (int)(g % gs.row_blocks), (int)g,
                                (int)counts[g], (int)repeated);
            }
        }
        n += counts[g];
        off[g + 1] = n;
    }
    return sk_layout_finish(layout, out);
}

sk_status sk_layout_to_flex(const sk_bsr *layout, int32_t *counts, size_t counts_len,
                            int32_t *indices, size_t indices_len) {
    SK_ENTER("sk_layout_to_flex");
    SK_CHECK_NOT_NULL(layout);
    SK_CHECK_NOT_NULL(counts);
    SK_CHECK_NOT_NULL(indices);
    SK_TRY(sk_layout_check(layout));
    SK_TRY(sk_check_alignment(counts, NULL, 4, 4, 0, "counts"));
    SK_TRY(sk_check_alignment(indices, NULL, 4, 4, 0, "indices"));
    grid_sizes gs;
    SK_TRY(grid_sizes_get(&layout->grid, &gs));
    if ((uint64_t)counts_len < (uint64_t)gs.total_rows)
        return sk_error(SK_STATUS_BAD_PARAM_SHAPE,
                        "counts_len = %llu is less than the %d rows (%d slices x %d row blocks)",
                        (unsigned long long)counts_len, (int)gs.total_rows, (int)gs.slices,
                        (int)gs.row_blocks);
    if ((uint64_t)indices_len < (uint64_t)gs.dense)
        return sk_error(SK_STATUS_BAD_PARAM_SHAPE,
                        "indices_len = %llu is less than the %lld entries (%d rows x %d col "
                        "blocks)",
                        (unsigned long long)indices_len, (long long)gs.dense, (int)gs.total_rows,
                        (int)gs.col_blocks);
    /* The aliasing rule: counts and indices are written, the layout read.
     * Both spans fit int64: dense < 2^62 blocks (sk_grid_check), x 4 bytes. */
    sk_buffer buffers[4] = {{"counts", counts, (int64_t)gs.total_rows * 4, 1},
                            {"indices", indices, gs.dense * 4, 1}};
    sk_layout_array_buffers(buffers + 2, "layout->row_offsets", "layout->col_indices",
                            layout->row_offsets, gs.total_rows, layout->col_indices, layout->nnz,
                            0);
    SK_TRY(sk_check_no_alias(buffers, 4));

    const int32_t *off = layout->row_offsets, *idx = layout->col_indices;
    for (int32_t g = 0; g < gs.total_rows; ++g) {
        int32_t *dst = indices + (int64_t)g * gs.col_blocks;
        int32_t n = off[g + 1] - off[g];
        counts[g] = n;
        /* Selected blocks in increasing order, then the others in increasing
         * order: torch's stable descending sort of the 0/1 row. */
        if (n > 0) memcpy(dst, idx + off[g], (size_t)n * sizeof(int32_t));
        int32_t next = off[g], w = n;
        for (int32_t j = 0; j < gs.col_blocks; ++j) {
            if (next < off[g + 1] && idx[next] == j)
                ++next;
            else
                dst[w++] = j;
        }
    }
    return SK_STATUS_SUCCESS;
}
