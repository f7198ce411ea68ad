/*
 * decode_case.h - seeded decode cases for the CPU and GPU tests (sparsek.h
 * "Decode"): lengths, a decode layout drawn here (never the library's
 * builders) or none (dense), Q [B, q_len, Hq, D], paged caches with the
 * pages shuffled and prefixes shared, NaN in every cache element no query
 * may read (slots past a sequence's end, unselected blocks of each KV head,
 * unused pages, stride gaps), garbage in the page table past the pages a
 * sequence uses, and the comparison of a run's O and LSE with the naive
 * fp64 reference (tests/common/naive_ref.h) on each (sequence, head,
 * token) row's keys gathered through the page table, under the tolerance
 * rule of test_util.h.
 */
#ifndef SK_TESTS_DECODE_CASE_H
#define SK_TESTS_DECODE_CASE_H

#include <stddef.h>
#include <stdint.h>

#include "common/test_util.h"
#include "sparsek.h"

enum { DC_MAXB = 16 };

typedef struct dc_case {
    sk_dtype dtype;
    int32_t batch, q_len;
    int32_t len_k[DC_MAXB];
    int64_t heads_q, heads_kv, head_dim;
    int32_t page_size;
    int32_t block_k;      /* 16 .. 128; 0: no layout (dense) */
    int32_t layout_heads; /* 1 or heads_kv */
    double density;       /* probability that a block is selected */
    int causal;
    float scale;          /* 0: 1/sqrt(D) */
    int padded;           /* strides with gaps (Q, O, caches, table rows) */
    int shuffle;          /* pages in a random order */
    int share;            /* sequence b shares its first full pages with b - 1 */
    int32_t extra_pages;  /* pages no sequence uses (NaN) */
    int32_t extra_keys;   /* max_seqlen_k - the longest len_k */
    int past_end;         /* layout indices past nb(b) (refused on the CPU) */
    int with_lse;
    int32_t num_splits;   /* desc->num_splits */
} dc_case;

typedef struct dc_data {
    int64_t max_seqlen_k, num_pages, max_pages, table_stride;
    int32_t seq_lens_k[DC_MAXB];
    int32_t *table;   /* [B, table_stride] */
    uint8_t *sel;     /* [B * layout_heads, col_blocks] selected blocks (dense: NULL) */
    int32_t col_blocks;
    sk_bsr layout;    /* host arrays; row_offsets NULL when dense */
    int64_t qs[3], cs[3]; /* Q / O strides over [b, t, h]; caches over [page, slot, head] */
    int64_t q_elems, cache_elems, lse_elems;
    void *q, *o, *k_cache, *v_cache;
    float *lse;
} dc_data;

size_t dc_elem_size(sk_dtype t);

/* Every option at random: 1 .. max_batch sequences, len_k 0 .. max_len_k
 * (now and then 0 or below q_len), q_len 1 .. 16, GQA groups 1 .. 16, D
 * 64 or 128 (odd sizes too when `cpu`: F32 and D 24 or 40), page sizes,
 * block sizes or dense, density, layout heads, causal, strides, pages,
 * LSE, splits. */
dc_case dc_random_case(tu_rng *rng, int32_t max_batch, int32_t max_len_k, int cpu);

/* A fixed case of three sequences of lens[0..2] keys: every block of
 * block_k selected per KV head, causal, shuffled pages, LSE. */
dc_case dc_gqa_case(sk_dtype dtype, int32_t q_len, int64_t heads_q, int64_t heads_kv,
                    int64_t head_dim, int32_t page_size, int32_t block_k, const int32_t lens[3]);

/* *x (zeroed first): lengths, layout, pages, tensors (O NaN), from rng.
 * 0 when out of memory (free *x with dc_data_free either way). */
int dc_make(const dc_case *c, tu_rng *rng, dc_data *x);
void dc_data_free(dc_data *x);

/* The descriptor of the case on `backend`. */
sk_decode_desc dc_desc(const dc_case *c, const dc_data *x, sk_backend backend);

/* o (Q's strides) and lse ([B, Hq, q_len]; NULL when !with_lse) against
 * the naive reference; O's stride gaps must still be NaN. Records up to 3
 * failures under `label`; returns the mismatches. *empty_rows counts rows
 * with no admissible key (may be NULL). */
int64_t dc_compare(const dc_case *c, const dc_data *x, const void *o, const float *lse,
                   const char *label, int64_t *empty_rows);

/* "[seed S: BF16 B=3 q_len=4 Hq/Hkv=8/2 D=128 page 16 block 32 ...]". */
void dc_label(const dc_case *c, uint64_t seed, char *label, size_t size);

#endif /* SK_TESTS_DECODE_CASE_H */
