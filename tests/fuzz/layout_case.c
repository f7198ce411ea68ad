/*
 * layout_case.c - see layout_case.h.
 */
#include "layout_case.h"

void layout_case_code(fz_codec *c, layout_case *k) {
    fz_grid_code(c, &k->grid);
    fz_u8(c, &k->flags);
    fz_i32(c, &k->nnz_delta);
    fz_edits_code(c, &k->n_edits, k->edits, LC_MAX_EDITS);
    fz_u8(c, &k->dtype);
    fz_u8(c, &k->head_dim);
    fz_u8(c, &k->heads_sel);
    fz_u8(c, &k->batch_sel);
    fz_u8(c, &k->magnitude);
    fz_f32(c, &k->scale);
    fz_u64(c, &k->data_seed);
    fz_i64(c, &k->win_left);
    fz_i64(c, &k->win_right);
    fz_i64(c, &k->sink_tokens);
    fz_i64(c, &k->window_tokens);
    fz_i32(c, &k->stride);
    fz_i32(c, &k->local_blocks);
    fz_i32(c, &k->rand_k);
    fz_i32(c, &k->topk_k);
    fz_i32(c, &k->topk_sink);
    fz_i32(c, &k->topk_local);
    fz_u8(c, &k->causal_bits);
    fz_u64(c, &k->builder_seed);
    fz_tail(c, &k->mask, &k->mask_len);
}

int layout_case_mask_bit(const layout_case *k, int64_t bit) {
    if (k->mask_len == 0) return 0;
    const uint8_t byte = k->mask[(uint64_t)(bit >> 3) % k->mask_len];
    return (byte >> (bit & 7)) & 1;
}
