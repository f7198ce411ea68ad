/*
 * decode_ref.c - the CPU reference of the decode attention (sparsek.h
 * "Decode"): each sequence becomes a fixed-batch problem of its own (batch
 * 1, Sq = q_len, Sk = len_k(b), its keys read through its page table row,
 * as the paged forward's sequences), and attention_ref.c runs them all in
 * one parallel tile range, so the per-row code, its fp64 sums and its
 * determinism are the forward's.
 *
 * Sequence b's problem: Q and O from [b, 0, 0, 0] on (strides unchanged),
 * LSE from entry b x Hq x q_len of [B, Hq, q_len] (head stride q_len), and
 * one layout row per head slice: the decode layout's rows b x heads ..
 * (slice mapping unchanged: heads = Hkv or 1), or, with no layout, a row
 * {0, nb(b)} of its own over the shared indices 0 .. col_blocks - 1 of
 * SK_DECODE_DENSE_BLOCK keys. The lengths, pages and layout were checked
 * by the core, so every read stays inside the sequence's keys; an empty
 * row (or a sequence with no key) gives O = 0, LSE = -inf.
 */
#include <stdlib.h>

#include "core/decode.h"
#include "core/internal.h"
#include "cpu/cpu_backend.h"
#include "cpu/half.h"

/* The dense case's layout arrays: offsets {0, nb(b)} per sequence and the
 * indices 0 .. col_blocks - 1; NULL (both freed) when allocation fails. */
static int dense_arrays(const sk_decode_problem *dp, int32_t **offsets, int32_t **indices) {
    const sk_attention_problem *f = &dp->paged.v.flat;
    const int32_t batch = dp->paged.v.batch;
    *offsets = (int32_t *)malloc((size_t)batch * 2 * sizeof(int32_t));
    *indices = (int32_t *)malloc((size_t)f->col_blocks * sizeof(int32_t));
    if (*offsets == NULL || *indices == NULL) {
        free(*offsets);
        free(*indices);
        return 0;
    }
    for (int32_t j = 0; j < f->col_blocks; ++j) (*indices)[j] = j;
    for (int32_t b = 0; b < batch; ++b) {
        (*offsets)[2 * b] = 0;
        (*offsets)[2 * b + 1] = (int32_t)sk_ceil_div_i64(dp->paged.seq_lens_k[b], f->block_k);
    }
    return 1;
}

sk_status sk_cpu_decode_run(const sk_decode_problem *dp) {
    const sk_attention_paged_problem *pp = &dp->paged;
    const sk_attention_problem *f = &pp->v.flat;
    const int32_t count = pp->v.batch;
    sk_attention_problem *probs =
        (sk_attention_problem *)malloc((size_t)count * sizeof(sk_attention_problem));
    int64_t *tile_start = (int64_t *)malloc(((size_t)count + 1) * sizeof(int64_t));
    int32_t *dense_off = NULL, *dense_idx = NULL;
    if (probs == NULL || tile_start == NULL ||
        (dp->dense && !dense_arrays(dp, &dense_off, &dense_idx))) {
        free(probs);
        free(tile_start);
        return sk_error(SK_STATUS_ALLOC_FAILED,
                        "the CPU backend could not allocate the problems of %d sequences",
                        (int)count);
    }
    for (int32_t b = 0; b < count; ++b) {
        sk_attention_problem *s = &probs[b];
        *s = *f;
        s->batch = 1;
        s->seq_k = pp->seq_lens_k[b];
        s->page_table = pp->page_table + b * pp->page_table_stride;
        s->page_size = pp->page_size;
        s->col_blocks = (int32_t)sk_ceil_div_i64(s->seq_k, s->block_k);
        s->layout_batch = 1;
        if (dp->dense) {
            s->row_offsets = dense_off + 2 * b;
            s->col_indices = dense_idx;
        } else {
            s->row_offsets = f->row_offsets + (int64_t)b * f->layout_heads;
        }
        s->q = sk_cpu_elem(f->q, f->dtype, b * f->q_stride[0]);
        s->o = sk_cpu_elem_mut(f->o, f->dtype, b * f->o_stride[0]);
        if (f->lse != NULL) s->lse = f->lse + (int64_t)b * f->heads_q * f->seq_q;
        tile_start[b] = (int64_t)b * f->heads_q; /* one row block per head */
    }
    tile_start[count] = (int64_t)count * f->heads_q;
    const sk_status st = sk_cpu_attention_run_problems(probs, tile_start, count);
    free(probs);
    free(tile_start);
    free(dense_off);
    free(dense_idx);
    return st;
}
