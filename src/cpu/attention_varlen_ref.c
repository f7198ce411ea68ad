/*
 * attention_varlen_ref.c - the CPU reference of the varlen and paged
 * attention forwards: each packed sequence becomes a fixed-batch problem of
 * its own (batch 1, Sq = len_q(b), Sk = len_k(b)), and attention_ref.c runs
 * them all in one parallel tile range, so the per-row code is the fixed
 * batch's, unchanged.
 *
 * Sequence b's problem: the packed Q and O from token cu_seqlens_q[b] on
 * (the token and head strides unchanged), LSE from column cu_seqlens_q[b]
 * of the [Hq, total_q] array (head stride total_q), and the layout from row
 * row_start(b) = sum_{c<b} ceil(len_q(c) / block_q) on (R rows per slice).
 * Its keys: varlen, the packed K and V from token cu_seqlens_k[b] on;
 * paged, the caches themselves read through the sequence's page table row
 * (attention_ref.c's kv_offset_of). A sequence with no query has no tiles;
 * one with no key has its rows empty (the layout check let no index
 * through), so O = 0, LSE = -inf. The lengths, page tables and the layout
 * were checked by the core before this runs, so every read stays inside
 * the sequence's own keys.
 */
#include <stdlib.h>

#include "core/internal.h"
#include "cpu/cpu_backend.h"
#include "cpu/half.h"

/* Sequence b's key count and key source (paged: NULL for varlen). */
static void sequence_keys(sk_attention_problem *s, const sk_attention_varlen_problem *p,
                          const sk_attention_paged_problem *paged, int32_t b) {
    const sk_attention_problem *f = &p->flat;
    if (paged != NULL) {
        s->seq_k = paged->seq_lens_k[b];
        s->page_table = paged->page_table + b * paged->page_table_stride;
        s->page_size = paged->page_size;
        return; /* s->k, s->v: the caches; strides over [page, slot, head] */
    }
    const int64_t k0 = p->cu_seqlens_k[b];
    s->seq_k = p->cu_seqlens_k[b + 1] - k0;
    /* Pointers move only to tokens that exist: an empty sequence at the
     * end would point past the tensor. */
    if (s->seq_k > 0) {
        s->k = sk_cpu_elem(f->k, f->dtype, k0 * f->k_stride[1]);
        s->v = sk_cpu_elem(f->v, f->dtype, k0 * f->v_stride[1]);
    }
}

/* Sequence b's problem, its layout rows from `row` on. */
static void sequence_problem(sk_attention_problem *s, const sk_attention_varlen_problem *p,
                             const sk_attention_paged_problem *paged, int32_t b, int64_t row) {
    const sk_attention_problem *f = &p->flat;
    const int64_t q0 = p->cu_seqlens_q[b];
    *s = *f;
    s->batch = 1;
    s->seq_q = p->cu_seqlens_q[b + 1] - q0;
    sequence_keys(s, p, paged, b);
    s->row_blocks = (int32_t)sk_ceil_div_i64(s->seq_q, s->block_q);
    s->col_blocks = (int32_t)sk_ceil_div_i64(s->seq_k, s->block_k);
    s->row_offsets = f->row_offsets + row;
    if (s->seq_q > 0) {
        s->q = sk_cpu_elem(f->q, f->dtype, q0 * f->q_stride[1]);
        s->o = sk_cpu_elem_mut(f->o, f->dtype, q0 * f->o_stride[1]);
        if (f->lse != NULL) s->lse = f->lse + q0;
    }
}

void sk_cpu_varlen_sequence(sk_attention_problem *s, const sk_attention_varlen_problem *p,
                            int32_t b, int64_t row) {
    sequence_problem(s, p, NULL, b, row);
}

static sk_status run_sequences(const sk_attention_varlen_problem *p,
                               const sk_attention_paged_problem *paged) {
    const int32_t count = p->batch;
    sk_attention_problem *probs =
        (sk_attention_problem *)malloc((size_t)count * sizeof(sk_attention_problem));
    int64_t *tile_start = (int64_t *)malloc(((size_t)count + 1) * sizeof(int64_t));
    if (probs == NULL || tile_start == NULL) {
        free(probs);
        free(tile_start);
        return sk_error(SK_STATUS_ALLOC_FAILED,
                        "the CPU backend could not allocate the problems of %d sequences",
                        (int)count);
    }
    int64_t row = 0, tiles = 0;
    for (int32_t b = 0; b < count; ++b) {
        sk_attention_problem *s = &probs[b];
        sequence_problem(s, p, paged, b, row);
        tile_start[b] = tiles;
        tiles += s->heads_q * s->row_blocks;
        row += s->row_blocks;
    }
    tile_start[count] = tiles;
    const sk_status st = sk_cpu_attention_run_problems(probs, tile_start, count);
    free(probs);
    free(tile_start);
    return st;
}

sk_status sk_cpu_attention_varlen_run(const sk_attention_varlen_problem *p) {
    return run_sequences(p, NULL);
}

sk_status sk_cpu_attention_paged_run(const sk_attention_paged_problem *p) {
    return run_sequences(&p->v, p);
}
