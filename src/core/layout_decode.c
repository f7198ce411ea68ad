/*
 * layout_decode.c - the decode layout (sparsek.h "Decode": one row per
 * sequence and KV head, key blocks of 16 .. 128 logical positions) and its
 * checks: the grid against the call, the arrays as sk_layout_validate
 * checks them (layout_validate.c's steps after its own grid rule, which
 * keeps 64 and 128 blocks for every other layout), and the indices
 * against the sequences' lengths. sk_layout_validate_decode is the public
 * check a selection's output can be held to.
 */
#include "core/check.h"
#include "core/decode.h"
#include "core/internal.h"
#include "core/layout.h"

sk_status sk_decode_layout_geometry(const sk_bsr *layout, int64_t batch, int64_t heads_kv,
                                    int64_t q_len, int64_t max_seqlen_k, int32_t *col_blocks) {
    const sk_grid *g = &layout->grid;
    if (g->batch != batch)
        return sk_error(SK_STATUS_BAD_LAYOUT_MISMATCH,
                        "layout->grid.batch = %d must be batch = %lld: a decode layout has one "
                        "slice per sequence",
                        (int)g->batch, (long long)batch);
    if (g->heads != heads_kv && g->heads != 1)
        return sk_error(SK_STATUS_BAD_LAYOUT_MISMATCH,
                        "layout->grid.heads = %d must be heads_kv = %lld (a row per KV head) or 1 "
                        "(shared by the KV heads)",
                        (int)g->heads, (long long)heads_kv);
    if (g->rows != q_len)
        return sk_error(SK_STATUS_BAD_LAYOUT_MISMATCH,
                        "layout->grid.rows = %lld must be q_len = %lld (one row block of the new "
                        "tokens)",
                        (long long)g->rows, (long long)q_len);
    if (g->block_rows != 64)
        return sk_error(SK_STATUS_BAD_PARAM_VALUE,
                        "layout->grid.block_rows = %d must be 64 in a decode layout",
                        (int)g->block_rows);
    if (g->cols != max_seqlen_k)
        return sk_error(SK_STATUS_BAD_LAYOUT_MISMATCH,
                        "layout->grid.cols = %lld must be max_seqlen_k = %lld", (long long)g->cols,
                        (long long)max_seqlen_k);
    const int32_t bk = g->block_cols;
    if (bk != 16 && bk != 32 && bk != 64 && bk != 128)
        return sk_error(SK_STATUS_BAD_PARAM_VALUE,
                        "layout->grid.block_cols = %d must be 16, 32, 64 or 128 in a decode layout",
                        (int)bk);
    /* row_offsets has slices + 1 entries, indexed by int32. */
    if ((int64_t)g->batch * g->heads >= INT32_MAX)
        return sk_error(SK_STATUS_BAD_LAYOUT_OVERFLOW,
                        "layout->grid has %d x %d slices: the row-offset array does not fit int32 "
                        "indexing",
                        (int)g->batch, (int)g->heads);
    *col_blocks = (int32_t)sk_ceil_div_i64(max_seqlen_k, bk); /* max_seqlen_k fits int32 */
    return SK_STATUS_SUCCESS;
}

sk_status sk_decode_layout_content(const sk_bsr *layout, int32_t col_blocks,
                                   const int32_t *seq_lens_k) {
    const sk_grid *g = &layout->grid;
    SK_TRY(sk_layout_check_arrays(layout, g->batch * g->heads, 1, col_blocks));
    if (seq_lens_k == NULL) return SK_STATUS_SUCCESS;
    const int32_t *off = layout->row_offsets, *idx = layout->col_indices;
    for (int32_t b = 0; b < g->batch; ++b) {
        const int64_t nb = sk_ceil_div_i64(seq_lens_k[b], g->block_cols);
        for (int32_t h = 0; h < g->heads; ++h) {
            const int32_t row = b * g->heads + h;
            /* Rows are increasing: the last entry is the largest. */
            const int32_t e = off[row + 1] - 1;
            if (off[row + 1] > off[row] && idx[e] >= nb)
                return sk_error(SK_STATUS_BAD_LAYOUT_INDEX_RANGE,
                                "layout->col_indices[%d] = %d (sequence %d, KV head slice %d) is "
                                "outside [0, %lld): sequence %d has len_k = %d keys in blocks of "
                                "%d",
                                (int)e, (int)idx[e], (int)b, (int)h, (long long)nb, (int)b,
                                (int)seq_lens_k[b], (int)g->block_cols);
        }
    }
    return SK_STATUS_SUCCESS;
}

sk_status sk_layout_validate_decode(const sk_bsr *layout, const sk_decode_desc *desc,
                                    const int32_t *seq_lens_k) {
    SK_ENTER("sk_layout_validate_decode");
    SK_CHECK_NOT_NULL(layout);
    SK_TRY(sk_decode_check_desc(desc));
    int32_t col_blocks;
    SK_TRY(sk_decode_layout_geometry(layout, desc->batch, desc->heads_kv, desc->q_len,
                                     desc->max_seqlen_k, &col_blocks));
    if (seq_lens_k != NULL) {
        SK_TRY(sk_check_alignment(seq_lens_k, NULL, 4, 4, 0, "seq_lens_k"));
        for (int64_t b = 0; b < desc->batch; ++b)
            if (seq_lens_k[b] < 0 || seq_lens_k[b] > desc->max_seqlen_k)
                return sk_error(SK_STATUS_BAD_PARAM_SHAPE,
                                "seq_lens_k[%lld] = %d is outside [0, max_seqlen_k = %lld]",
                                (long long)b, (int)seq_lens_k[b], (long long)desc->max_seqlen_k);
    }
    return sk_decode_layout_content(layout, col_blocks, seq_lens_k);
}
