/*
 * layout_varlen.c - varlen layouts (sparsek.h, "Varlen batches"): the checks
 * of the length arrays and of a layout against them, the builders' grid,
 * the pattern builders (each sequence a segment of sk_layout_build), and
 * the conversions from per-sequence masks and layouts.
 *
 * A varlen layout is an ordinary sk_bsr with batch 1 whose R rows per head
 * slice are the sequences' query blocks one after another (row_start(b) =
 * the sum of ceil(len_q(c) / block_rows) over c < b), so everything here
 * walks the sequences in order with a running row. Every function checks
 * all its arguments before allocating or writing.
 */
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "core/internal.h"
#include "core/layout.h"

/* ---------------------------------------------------------------------------
 * Internal checks (no SK_ENTER)
 * ------------------------------------------------------------------------- */

sk_status sk_varlen_check_seqlens(const int32_t *cu, int32_t batch, int64_t total, int64_t max_len,
                                  char side) {
    if (cu[0] != 0)
        return sk_error(SK_STATUS_BAD_PARAM_SHAPE, "cu_seqlens_%c[0] = %d must be 0", side,
                        (int)cu[0]);
    for (int32_t b = 0; b < batch; ++b) {
        const int64_t len = (int64_t)cu[b + 1] - cu[b];
        if (len < 0)
            return sk_error(SK_STATUS_BAD_PARAM_SHAPE,
                            "cu_seqlens_%c[%d] = %d is less than cu_seqlens_%c[%d] = %d: sequence "
                            "%d would have a negative length",
                            side, (int)(b + 1), (int)cu[b + 1], side, (int)b, (int)cu[b], (int)b);
        if (max_len >= 0 && len > max_len)
            return sk_error(
                SK_STATUS_BAD_PARAM_SHAPE,
                "sequence %d has len_%c = %lld (cu_seqlens_%c[%d] - cu_seqlens_%c[%d]), "
                "above max_seqlen_%c = %lld",
                (int)b, side, (long long)len, side, (int)(b + 1), side, (int)b, side,
                (long long)max_len);
    }
    if (total >= 0 && cu[batch] != total)
        return sk_error(SK_STATUS_BAD_PARAM_SHAPE,
                        "cu_seqlens_%c[%d] = %d (the last entry) differs from total_%c = %lld",
                        side, (int)batch, (int)cu[batch], side, (long long)total);
    return SK_STATUS_SUCCESS;
}

int64_t sk_varlen_rows_needed(const int32_t *cu_q, int32_t batch, int32_t block_rows) {
    int64_t rows = 0;
    for (int32_t b = 0; b < batch; ++b)
        rows += sk_ceil_div_i64((int64_t)cu_q[b + 1] - cu_q[b], block_rows);
    return rows;
}

sk_status sk_varlen_check_layout(const sk_bsr *layout, int32_t batch, const int32_t *cu_q,
                                 const int32_t *k_end, const int32_t *k_start) {
    const sk_grid *g = &layout->grid;
    const int64_t R = sk_ceil_div_i64(g->rows, g->block_rows);
    const int64_t need = sk_varlen_rows_needed(cu_q, batch, g->block_rows);
    if (need > R)
        return sk_error(SK_STATUS_BAD_LAYOUT_MISMATCH,
                        "the layout has %lld block rows per slice, but the sequences need %lld "
                        "(the sum of ceil(len_q / %d))",
                        (long long)R, (long long)need, (int)g->block_rows);
    const int32_t *off = layout->row_offsets, *idx = layout->col_indices;
    for (int32_t s = 0; s < g->heads; ++s) {
        int64_t row = s * R;
        for (int32_t b = 0; b < batch; ++b) {
            const int64_t len_k = (int64_t)k_end[b] - (k_start != NULL ? k_start[b] : 0);
            const int64_t nbq = sk_ceil_div_i64((int64_t)cu_q[b + 1] - cu_q[b], g->block_rows);
            const int64_t nbk = sk_ceil_div_i64(len_k, g->block_cols);
            for (int64_t i = 0; i < nbq; ++i, ++row) {
                /* Rows are increasing: the last entry is the largest. */
                const int32_t e = off[row + 1] - 1;
                if (off[row + 1] > off[row] && idx[e] >= nbk)
                    return sk_error(SK_STATUS_BAD_LAYOUT_INDEX_RANGE,
                                    "layout->col_indices[%d] = %d (slice %d, sequence %d, its row "
                                    "block %lld) is outside [0, %lld): sequence %d has len_k = "
                                    "%lld",
                                    (int)e, (int)idx[e], (int)s, (int)b, (long long)i,
                                    (long long)nbk, (int)b, (long long)len_k);
            }
        }
    }
    return SK_STATUS_SUCCESS;
}

/* The checks of a varlen grid, its builders' layout grid into *lg, and (if
 * segs is not NULL) its sequences as segments of sk_layout_build in a new
 * array of B grids. */
static sk_status varlen_grid(const sk_varlen_grid *vg, sk_grid *lg, sk_grid **segs) {
    if (vg == NULL) return sk_error(SK_STATUS_BAD_PARAM_NULL_POINTER, "grid must not be NULL");
    if (vg->batch < 1)
        return sk_error(SK_STATUS_BAD_PARAM_SHAPE, "grid->batch = %d must be >= 1", (int)vg->batch);
    if (vg->cu_seqlens_q == NULL || vg->cu_seqlens_k == NULL)
        return sk_error(SK_STATUS_BAD_PARAM_NULL_POINTER,
                        "grid->cu_seqlens_q and grid->cu_seqlens_k must not be NULL");
    SK_TRY(sk_check_alignment(vg->cu_seqlens_q, NULL, 4, 4, 0, "grid->cu_seqlens_q"));
    SK_TRY(sk_check_alignment(vg->cu_seqlens_k, NULL, 4, 4, 0, "grid->cu_seqlens_k"));
    SK_TRY(sk_varlen_check_seqlens(vg->cu_seqlens_q, vg->batch, -1, -1, 'q'));
    SK_TRY(sk_varlen_check_seqlens(vg->cu_seqlens_k, vg->batch, -1, -1, 'k'));
    /* Blocks first, for their own message, before they divide anything. */
    const sk_grid probe = {1, 1, vg->block_rows, vg->block_cols, 1, vg->heads};
    SK_TRY(sk_grid_check(&probe, NULL, NULL, NULL));
    int64_t longest_k = 1;
    for (int32_t b = 0; b < vg->batch; ++b) {
        const int64_t len_k = (int64_t)vg->cu_seqlens_k[b + 1] - vg->cu_seqlens_k[b];
        if (len_k > longest_k) longest_k = len_k;
    }
    const int64_t need = sk_varlen_rows_needed(vg->cu_seqlens_q, vg->batch, vg->block_rows);
    const sk_grid grid = {(need > 0 ? need : 1) * vg->block_rows,
                          longest_k,
                          vg->block_rows,
                          vg->block_cols,
                          1,
                          vg->heads};
    SK_TRY(sk_grid_check(&grid, NULL, NULL, NULL));
    *lg = grid;
    if (segs == NULL) return SK_STATUS_SUCCESS;
    *segs = (sk_grid *)malloc((size_t)vg->batch * sizeof(sk_grid));
    if (*segs == NULL)
        return sk_error(SK_STATUS_ALLOC_FAILED, "no memory for %d sequences", (int)vg->batch);
    for (int32_t b = 0; b < vg->batch; ++b) {
        const sk_grid seg = {(int64_t)vg->cu_seqlens_q[b + 1] - vg->cu_seqlens_q[b],
                             (int64_t)vg->cu_seqlens_k[b + 1] - vg->cu_seqlens_k[b],
                             vg->block_rows,
                             vg->block_cols,
                             1,
                             1};
        (*segs)[b] = seg;
    }
    return SK_STATUS_SUCCESS;
}

/* ---------------------------------------------------------------------------
 * Grids and validation
 * ------------------------------------------------------------------------- */

sk_status sk_varlen_layout_grid(const sk_varlen_grid *grid, sk_grid *layout_grid) {
    SK_ENTER("sk_varlen_layout_grid");
    SK_CHECK_NOT_NULL(layout_grid);
    sk_grid lg;
    SK_TRY(varlen_grid(grid, &lg, NULL));
    *layout_grid = lg;
    return SK_STATUS_SUCCESS;
}

sk_status sk_varlen_max_row_blocks(int64_t batch, int64_t total_q, int64_t max_seqlen_q,
                                   int32_t block_rows, int32_t *row_blocks) {
    SK_ENTER("sk_varlen_max_row_blocks");
    SK_CHECK_NOT_NULL(row_blocks);
    if (batch < 1 || batch > INT32_MAX)
        return sk_error(SK_STATUS_BAD_PARAM_SHAPE, "batch = %lld must be in [1, %d]",
                        (long long)batch, INT32_MAX);
    if (total_q < 1 || total_q > INT32_MAX)
        return sk_error(SK_STATUS_BAD_PARAM_SHAPE, "total_q = %lld must be in [1, %d]",
                        (long long)total_q, INT32_MAX);
    if (max_seqlen_q < 1 || max_seqlen_q > INT32_MAX)
        return sk_error(SK_STATUS_BAD_PARAM_SHAPE, "max_seqlen_q = %lld must be in [1, %d]",
                        (long long)max_seqlen_q, INT32_MAX);
    if (block_rows != 64 && block_rows != 128)
        return sk_error(SK_STATUS_BAD_PARAM_VALUE, "block_rows = %d must be 64 or 128",
                        (int)block_rows);
    /* Each sequence adds ceil(len / bq) <= (len + bq - 1) / bq, at most
     * ceil(max / bq), and at most len rows: all three bounds hold. Every
     * product is below 2^31 x 2^25. */
    int64_t r = batch * sk_ceil_div_i64(max_seqlen_q, block_rows);
    const int64_t spread = (total_q + batch * (block_rows - 1)) / block_rows;
    if (spread < r) r = spread;
    if (total_q < r) r = total_q;
    *row_blocks = (int32_t)(r > 0 ? r : 1);
    return SK_STATUS_SUCCESS;
}

sk_status sk_layout_validate_varlen(const sk_bsr *layout, const sk_varlen_grid *grid) {
    SK_ENTER("sk_layout_validate_varlen");
    SK_CHECK_NOT_NULL(layout);
    sk_grid lg;
    SK_TRY(varlen_grid(grid, &lg, NULL));
    SK_TRY(sk_layout_check(layout));
    const sk_grid *g = &layout->grid;
    if (g->batch != 1 || g->heads != grid->heads || g->block_rows != grid->block_rows ||
        g->block_cols != grid->block_cols)
        return sk_error(SK_STATUS_BAD_LAYOUT_MISMATCH,
                        "layout grid has blocks %d x %d, batch %d, heads %d; a varlen layout of "
                        "this grid has blocks %d x %d, batch 1, heads %d",
                        (int)g->block_rows, (int)g->block_cols, (int)g->batch, (int)g->heads,
                        (int)grid->block_rows, (int)grid->block_cols, (int)grid->heads);
    return sk_varlen_check_layout(layout, grid->batch, grid->cu_seqlens_q, grid->cu_seqlens_k + 1,
                                  grid->cu_seqlens_k);
}

/* ---------------------------------------------------------------------------
 * Pattern builders: one segment per sequence
 * ------------------------------------------------------------------------- */

static sk_status build_varlen(sk_layout_t *out, const sk_varlen_grid *grid,
                              const sk_layout_params *prm) {
    SK_CHECK_NOT_NULL(out);
    sk_grid lg;
    sk_grid *segs = NULL;
    SK_TRY(varlen_grid(grid, &lg, &segs));
    const sk_status st = sk_layout_build(out, &lg, segs, grid->batch, prm);
    free(segs);
    return st;
}

sk_status sk_layout_create_varlen_dense(sk_layout_t *out, const sk_varlen_grid *grid) {
    SK_ENTER("sk_layout_create_varlen_dense");
    const sk_layout_params prm = {SK_LAYOUT_DENSE, 0, 0, 0, 0, 0};
    return build_varlen(out, grid, &prm);
}

sk_status sk_layout_create_varlen_causal(sk_layout_t *out, const sk_varlen_grid *grid) {
    SK_ENTER("sk_layout_create_varlen_causal");
    const sk_layout_params prm = {SK_LAYOUT_CAUSAL, 0, 0, 0, 0, 0};
    return build_varlen(out, grid, &prm);
}

sk_status sk_layout_create_varlen_window(sk_layout_t *out, const sk_varlen_grid *grid, int64_t left,
                                         int64_t right) {
    SK_ENTER("sk_layout_create_varlen_window");
    const sk_layout_params prm = {SK_LAYOUT_WINDOW, left, right, 0, 0, 0};
    return build_varlen(out, grid, &prm);
}

sk_status sk_layout_create_varlen_sinks_window(sk_layout_t *out, const sk_varlen_grid *grid,
                                               int64_t sink_tokens, int64_t window_tokens) {
    SK_ENTER("sk_layout_create_varlen_sinks_window");
    const sk_layout_params prm = {SK_LAYOUT_SINKS_WINDOW, sink_tokens, window_tokens, 0, 0, 0};
    return build_varlen(out, grid, &prm);
}

sk_status sk_layout_create_varlen_random(sk_layout_t *out, const sk_varlen_grid *grid, int32_t k,
                                         uint64_t seed, int causal) {
    SK_ENTER("sk_layout_create_varlen_random");
    const sk_layout_params prm = {SK_LAYOUT_RANDOM, 0, 0, k, seed, causal};
    return build_varlen(out, grid, &prm);
}

/* ---------------------------------------------------------------------------
 * Conversions: per-sequence masks and layouts
 * ------------------------------------------------------------------------- */

/* A sequence's block counts. */
static int64_t seq_rows(const sk_varlen_grid *vg, int32_t b) {
    return sk_ceil_div_i64((int64_t)vg->cu_seqlens_q[b + 1] - vg->cu_seqlens_q[b], vg->block_rows);
}
static int64_t seq_cols(const sk_varlen_grid *vg, int32_t b) {
    return sk_ceil_div_i64((int64_t)vg->cu_seqlens_k[b + 1] - vg->cu_seqlens_k[b], vg->block_cols);
}

/* Where a conversion's rows come from: per-sequence masks (sequence b's at
 * masks + mask_at[b]) or per-sequence layouts (NULL entries: no block). */
typedef struct row_source {
    const uint8_t *masks;
    const int64_t *mask_at;
    const sk_bsr *const *layouts;
} row_source;

/* Row i of sequence b in head slice s into dst; returns its count. */
static int32_t source_row(const row_source *src, const sk_varlen_grid *vg, int32_t s, int32_t b,
                          int64_t i, int32_t *dst) {
    const int64_t nbq = seq_rows(vg, b);
    if (src->layouts != NULL) {
        const sk_bsr *l = src->layouts[b];
        if (l == NULL) return 0;
        const int32_t *off = l->row_offsets + s * nbq + i;
        const int32_t count = off[1] - off[0];
        if (count > 0) memcpy(dst, l->col_indices + off[0], (size_t)count * sizeof(int32_t));
        return count;
    }
    const int64_t nbk = seq_cols(vg, b);
    const uint8_t *row = src->masks + src->mask_at[b] + (s * nbq + i) * nbk;
    int32_t n = 0;
    for (int64_t j = 0; j < nbk; ++j)
        if (row[j] != 0) dst[n++] = (int32_t)j;
    return n;
}

/* The layout over lg (nnz indices) whose rows are src's, in the varlen
 * order (sparsek.h); the rows past the sequences are empty. nnz (`what`
 * names its source) must fit int32: the grid check does not bound it. */
static sk_status build_from(sk_layout_t *out, const sk_varlen_grid *vg, const sk_grid *lg,
                            int64_t nnz, const char *what, const row_source *src) {
    SK_TRY(sk_layout_check_nnz(nnz, what));
    const int64_t R = sk_ceil_div_i64(lg->rows, lg->block_rows);
    const int32_t total_rows = (int32_t)(R * lg->heads); /* fits: sk_grid_check */
    struct sk_layout_s *layout = sk_layout_alloc(lg, total_rows, nnz);
    if (layout == NULL)
        return sk_error(SK_STATUS_ALLOC_FAILED, "no memory for %d rows and nnz = %lld",
                        (int)total_rows, (long long)nnz);
    int32_t *off = layout->bsr.row_offsets, *idx = layout->bsr.col_indices;
    int32_t n = 0;
    int64_t g = 0;
    off[0] = 0;
    for (int32_t s = 0; s < vg->heads; ++s) {
        for (int32_t b = 0; b < vg->batch; ++b)
            for (int64_t i = 0; i < seq_rows(vg, b); ++i, ++g) {
                n += source_row(src, vg, s, b, i, idx + n);
                off[g + 1] = n;
            }
        for (; g < (s + 1) * R; ++g) off[g + 1] = n;
    }
    return sk_layout_finish(layout, out);
}

sk_status sk_layout_create_varlen_from_masks(sk_layout_t *out, const sk_varlen_grid *grid,
                                             const uint8_t *masks, size_t mask_bytes) {
    SK_ENTER("sk_layout_create_varlen_from_masks");
    SK_CHECK_NOT_NULL(out);
    sk_grid lg;
    SK_TRY(varlen_grid(grid, &lg, NULL));
    SK_CHECK_NOT_NULL(masks);
    /* At most the dense block count of lg (< 2^62): int64. */
    int64_t need = 0;
    for (int32_t b = 0; b < grid->batch; ++b)
        need += grid->heads * seq_rows(grid, b) * seq_cols(grid, b);
    if ((uint64_t)mask_bytes < (uint64_t)need)
        return sk_error(SK_STATUS_BAD_PARAM_SHAPE,
                        "mask_bytes = %llu is less than the %lld bytes of the masks (heads = %d x "
                        "the sum of nb_q x nb_k over the sequences)",
                        (unsigned long long)mask_bytes, (long long)need, (int)grid->heads);
    int64_t *at = (int64_t *)malloc((size_t)grid->batch * sizeof(int64_t));
    if (at == NULL)
        return sk_error(SK_STATUS_ALLOC_FAILED, "no memory for %d sequences", (int)grid->batch);
    int64_t nnz = 0, bytes = 0;
    for (int32_t b = 0; b < grid->batch; ++b) {
        at[b] = bytes;
        bytes += grid->heads * seq_rows(grid, b) * seq_cols(grid, b);
    }
    for (int64_t e = 0; e < need; ++e) nnz += masks[e] != 0;
    const row_source src = {masks, at, NULL};
    const sk_status st = build_from(out, grid, &lg, nnz, "masks select too many blocks", &src);
    free(at);
    return st;
}

/* layouts[b] fits sequence b of vg exactly and is valid. */
static sk_status check_sequence_layout(const sk_varlen_grid *vg, int32_t b, const sk_bsr *l) {
    const int64_t len_q = (int64_t)vg->cu_seqlens_q[b + 1] - vg->cu_seqlens_q[b];
    const int64_t len_k = (int64_t)vg->cu_seqlens_k[b + 1] - vg->cu_seqlens_k[b];
    if (len_q == 0 || len_k == 0)
        return sk_error(SK_STATUS_BAD_LAYOUT_MISMATCH,
                        "layouts[%d] must be NULL: sequence %d has len_q = %lld and len_k = %lld",
                        (int)b, (int)b, (long long)len_q, (long long)len_k);
    const sk_grid *g = &l->grid;
    if (g->rows != len_q || g->cols != len_k || g->block_rows != vg->block_rows ||
        g->block_cols != vg->block_cols || g->batch != 1 || g->heads != vg->heads)
        return sk_error(SK_STATUS_BAD_LAYOUT_MISMATCH,
                        "layouts[%d] grid is %lld x %lld tokens, blocks %d x %d, batch %d, heads "
                        "%d; sequence %d needs %lld x %lld, blocks %d x %d, batch 1, heads %d",
                        (int)b, (long long)g->rows, (long long)g->cols, (int)g->block_rows,
                        (int)g->block_cols, (int)g->batch, (int)g->heads, (int)b, (long long)len_q,
                        (long long)len_k, (int)vg->block_rows, (int)vg->block_cols, (int)vg->heads);
    const sk_status st = sk_layout_check(l);
    if (st != SK_STATUS_SUCCESS) {
        /* Keep the check's status and text (past "sk_name: "), naming the entry. */
        char why[256];
        strncpy(why, sk_last_error(), sizeof why - 1);
        why[sizeof why - 1] = '\0';
        const char *text = strstr(why, ": ") != NULL ? strstr(why, ": ") + 2 : why;
        return sk_error(st, "layouts[%d]: %s", (int)b, text);
    }
    return SK_STATUS_SUCCESS;
}

sk_status sk_layout_create_varlen_from_layouts(sk_layout_t *out, const sk_varlen_grid *grid,
                                               const sk_bsr *const *layouts) {
    SK_ENTER("sk_layout_create_varlen_from_layouts");
    SK_CHECK_NOT_NULL(out);
    sk_grid lg;
    SK_TRY(varlen_grid(grid, &lg, NULL));
    SK_CHECK_NOT_NULL(layouts);
    int64_t nnz = 0; /* each fits int32, the sum int64 (build_from checks it) */
    for (int32_t b = 0; b < grid->batch; ++b) {
        if (layouts[b] == NULL) continue;
        SK_TRY(check_sequence_layout(grid, b, layouts[b]));
        nnz += layouts[b]->nnz;
    }

    const row_source src = {NULL, NULL, layouts};
    return build_from(out, grid, &lg, nnz, "layouts: their nnz sum to too many blocks", &src);
}
