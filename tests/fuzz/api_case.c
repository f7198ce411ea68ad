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
    fz_grid_code(c, &k->grid);
    fz_u8(c, &k->density);
    fz_i32(c, &k->nnz_delta);
    fz_edits_code(c, &k->n_edits, k->edits, API_MAX_EDITS);
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
    /* The placement's first 8 buffers where they always were; the rest at
     * the end (api_case.h). */
    uint8_t mis[2] = {(uint8_t)(k->place.misalign & 255u), (uint8_t)(k->place.misalign >> 8)};
    uint8_t nul[2] = {(uint8_t)(k->place.null_mask & 255u), (uint8_t)(k->place.null_mask >> 8)};
    fz_u8(c, &mis[0]);
    fz_u8(c, &nul[0]);
    for (int i = 0; i < 8; ++i) fz_i64(c, &k->place.at[i]);
    fz_i32(c, &k->deterministic);
    for (int t = 0; t < 4; ++t)
        for (int i = 0; i < 3; ++i) fz_i64(c, &k->bwd_strides[t][i]);
    fz_u8(c, &k->bwd_flags);
    fz_u8(c, &mis[1]);
    fz_u8(c, &nul[1]);
    for (int i = 8; i < FZ_MAX_BUFS; ++i) fz_i64(c, &k->place.at[i]);
    k->place.misalign = (uint16_t)(mis[0] | mis[1] << 8);
    k->place.null_mask = (uint16_t)(nul[0] | nul[1] << 8);
}
