/*
 * topk_varlen_ref.c - the CPU reference of the top-k selection on varlen
 * and paged inputs (declared in cpu_backend.h). Each sequence is the fixed
 * selection of topk_ref.c on its own tokens (B = 1, Sq = len_q, Sk =
 * len_k), so its rows are those of sk_pool_select_topk on the sequence
 * alone by construction; paged keys are first gathered from their pages
 * into one packed [len_k, Hkv, D] copy of the same dtype (the pooling then
 * reads the same values in the same order: the same means bit for bit).
 *
 * The rows are collected per layout row (counts and a [rows, row_cap]
 * scratch, as the CUDA path does), and the output is written only once
 * every sequence is done: a failed allocation leaves it untouched.
 */
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "core/internal.h"
#include "cpu/cpu_backend.h"

/* Host scratch of one call. */
typedef struct tv_scratch {
    int32_t *counts;  /* [slices * R] */
    int32_t *entries; /* [slices * R, row_cap] */
    int32_t *offsets; /* one sequence's fixed layout: [slices * rb + 1] */
    int32_t *cols;    /* [slices * rb * row_cap] */
    char *keys;       /* paged: one sequence's gathered keys */
} tv_scratch;

static void scratch_free(tv_scratch *s) {
    free(s->counts);
    free(s->entries);
    free(s->offsets);
    free(s->cols);
    free(s->keys);
}

static sk_status scratch_alloc(const sk_topk_varlen_problem *p, tv_scratch *s) {
    memset(s, 0, sizeof *s);
    const int64_t rows = (int64_t)p->slices * p->rows;
    const int64_t rb_max = sk_ceil_div_i64(p->max_seqlen_q, p->t.block_q);
    const int64_t seq_rows = (int64_t)p->slices * (rb_max < p->rows ? rb_max : p->rows);
    s->counts = (int32_t *)calloc((size_t)rows, sizeof(int32_t));
    s->entries = (int32_t *)malloc((size_t)(rows * p->row_cap + 1) * sizeof(int32_t));
    s->offsets = (int32_t *)malloc((size_t)(seq_rows + 1) * sizeof(int32_t));
    s->cols = (int32_t *)malloc((size_t)(seq_rows * p->row_cap + 1) * sizeof(int32_t));
    const int64_t key_bytes = p->paged ? p->max_seqlen_k * p->t.heads_kv * p->t.head_dim *
                                             (int64_t)sk_dtype_size(p->t.dtype)
                                       : 0;
    if (p->paged) s->keys = (char *)malloc((size_t)key_bytes);
    if (s->counts == NULL || s->entries == NULL || s->offsets == NULL || s->cols == NULL ||
        (p->paged && s->keys == NULL)) {
        scratch_free(s);
        return sk_error(SK_STATUS_ALLOC_FAILED,
                        "no host memory for the varlen top-k scratch (%lld layout rows of %d "
                        "entries, %lld bytes of gathered keys)",
                        (long long)rows, (int)p->row_cap, (long long)key_bytes);
    }
    return SK_STATUS_SUCCESS;
}

/* Sequence b's keys from its pages into dst, packed [len_k, Hkv, D]. */
static void gather_keys(const sk_topk_varlen_problem *p, int32_t b, int32_t len_k, char *dst) {
    const size_t es = sk_dtype_size(p->t.dtype);
    const int64_t hkv = p->t.heads_kv, dim = p->t.head_dim;
    const int32_t *row = p->page_table + (int64_t)b * p->page_table_stride;
    const char *cache = (const char *)p->k;
    for (int32_t t = 0; t < len_k; ++t) {
        const int64_t page = row[t / p->page_size], slot = t % p->page_size;
        for (int64_t h = 0; h < hkv; ++h) {
            const int64_t src =
                page * p->t.k_stride[0] + slot * p->t.k_stride[1] + h * p->t.k_stride[2];
            memcpy(dst + (size_t)(((int64_t)t * hkv + h) * dim) * es, cache + (size_t)src * es,
                   (size_t)dim * es);
        }
    }
}

/* The fixed selection of sequence b (len_q, len_k > 0), its rows into the
 * per-layout-row scratch from row `row_start` of each slice on. */
static sk_status select_sequence(const sk_topk_varlen_problem *p, int32_t b, int32_t len_q,
                                 int32_t len_k, int32_t row_start, tv_scratch *s) {
    const size_t es = sk_dtype_size(p->t.dtype);
    sk_topk_problem t = p->t;
    t.seq_q = len_q;
    t.seq_k = len_k;
    t.row_blocks = (int32_t)sk_ceil_div_i64(len_q, t.block_q);
    t.col_blocks = (int32_t)sk_ceil_div_i64(len_k, t.block_k);
    t.total_rows = t.slices * t.row_blocks;
    t.q = (const char *)p->q + (size_t)((int64_t)p->cu_seqlens_q[b] * t.q_stride[1]) * es;
    if (p->paged) {
        gather_keys(p, b, len_k, s->keys);
        t.k_in = s->keys;
        t.k_stride[0] = 0;
        t.k_stride[1] = t.heads_kv * t.head_dim;
        t.k_stride[2] = t.head_dim;
    } else {
        t.k_in = (const char *)p->k + (size_t)((int64_t)p->cu_seqlens_k[b] * t.k_stride[1]) * es;
    }
    t.row_offsets = s->offsets;
    t.col_indices = s->cols;
    SK_TRY(sk_cpu_topk_pool_select(&t));
    for (int32_t sl = 0; sl < t.slices; ++sl)
        for (int32_t i = 0; i < t.row_blocks; ++i) {
            const int32_t g = sl * t.row_blocks + i;
            const int32_t n = s->offsets[g + 1] - s->offsets[g]; /* <= row_cap */
            const int64_t r = (int64_t)sl * p->rows + row_start + i;
            s->counts[r] = n;
            memcpy(s->entries + r * p->row_cap, s->cols + s->offsets[g],
                   (size_t)n * sizeof(int32_t));
        }
    return SK_STATUS_SUCCESS;
}

sk_status sk_cpu_topk_varlen_select(const sk_topk_varlen_problem *p) {
    tv_scratch s;
    SK_TRY(scratch_alloc(p, &s));
    int32_t row_start = 0;
    for (int32_t b = 0; b < p->batch; ++b) {
        const int32_t len_q = p->cu_seqlens_q[b + 1] - p->cu_seqlens_q[b];
        const int32_t len_k =
            p->paged ? p->seq_lens_k[b] : p->cu_seqlens_k[b + 1] - p->cu_seqlens_k[b];
        const int32_t rb = (int32_t)sk_ceil_div_i64(len_q, p->t.block_q);
        /* Checked lengths fit R (sk_varlen_max_row_blocks' bound); a
         * sequence with no key keeps empty rows. */
        if ((int64_t)row_start + rb > p->rows) {
            scratch_free(&s);
            return sk_error(SK_STATUS_INTERNAL_ERROR, "sequence %d needs rows past R = %d",
                            (int)b, (int)p->rows);
        }
        if (len_q > 0 && len_k > 0) {
            const sk_status st = select_sequence(p, b, len_q, len_k, row_start, &s);
            if (st != SK_STATUS_SUCCESS) {
                scratch_free(&s);
                return st;
            }
        }
        row_start += rb;
    }
    const int64_t rows = (int64_t)p->slices * p->rows;
    int32_t off = 0;
    for (int64_t r = 0; r < rows; ++r) {
        p->row_offsets[r] = off;
        if (s.counts[r] > 0)
            memcpy(p->col_indices + off, s.entries + r * p->row_cap,
                   (size_t)s.counts[r] * sizeof(int32_t));
        off += s.counts[r];
    }
    p->row_offsets[rows] = off;
    scratch_free(&s);
    return SK_STATUS_SUCCESS;
}
