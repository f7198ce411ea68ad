/*
 * api_case.c - see api_case.h.
 */
#include "api_case.h"

void api_case_code(fz_codec *c, api_case *k) {
    fz_u8(c, &k->op);
    fz_u8(c, &k->fault);
    fz_i32(c, &k->backend);
    fz_i32(c, &k->dtype);
    fz_i32(c, &k->c_dtype);
    for (int i = 0; i < 6; ++i) fz_i64(c, &k->size[i]);
    fz_f32(c, &k->scale);
    fz_f32(c, &k->beta);
    fz_i32(c, &k->mask);
    fz_i32(c, &k->topk_mask);
    for (int t = 0; t < 4; ++t)
        for (int i = 0; i < 3; ++i) fz_i64(c, &k->strides[t][i]);
    fz_i64(c, &k->grid.rows);
    fz_i64(c, &k->grid.cols);
    fz_i32(c, &k->grid.block_rows);
    fz_i32(c, &k->grid.block_cols);
    fz_i32(c, &k->grid.batch);
    fz_i32(c, &k->grid.heads);
    fz_u8(c, &k->density);
    fz_i32(c, &k->nnz_delta);
    fz_u8(c, &k->n_edits);
    if (!c->writing) k->n_edits %= API_MAX_EDITS + 1;
    for (int i = 0; i < k->n_edits; ++i) {
        fz_u8(c, &k->edits[i].kind);
        fz_u16(c, &k->edits[i].pos);
        fz_i32(c, &k->edits[i].value);
    }
    fz_i32(c, &k->block_q);
    fz_i32(c, &k->block_k);
    fz_i32(c, &k->k);
    fz_i32(c, &k->sink_blocks);
    fz_i32(c, &k->local_blocks);
    fz_i32(c, &k->per_kv_head);
    fz_u8(c, &k->attn_fault);
    fz_u8(c, &k->flags);
    fz_u8(c, &k->magnitude);
    fz_u64(c, &k->seed);
    fz_u32(c, &k->workspace_bytes);
    fz_u8(c, &k->place.mode);
    fz_u8(c, &k->place.misalign);
    fz_u8(c, &k->place.null_mask);
    for (int i = 0; i < FZ_MAX_BUFS; ++i) fz_i64(c, &k->place.at[i]);
}
