/*
 * topk_varlen_case.h - seeded cases of the top-k selection on varlen and
 * paged inputs, for the CPU and GPU tests: lengths (empty sequences, tails,
 * q_len < k_len), packed Q and K rounded to the dtype (NaN in the stride
 * gaps), a paged copy of K with shuffled pages and NaN in every slot no
 * sequence uses, and the reference the selection must equal: the fixed
 * sk_pool_select_topk (CPU backend) on each sequence alone, its rows
 * placed at the sequence's varlen layout rows.
 */
#ifndef SK_TESTS_TOPK_VARLEN_CASE_H
#define SK_TESTS_TOPK_VARLEN_CASE_H

#include <stdint.h>

#include "common/test_util.h"
#include "sparsek.h"

enum { TVC_MAXB = 10 };

typedef struct tvc_case {
    sk_dtype dtype;
    int32_t batch;
    int32_t len_q[TVC_MAXB], len_k[TVC_MAXB];
    int64_t heads_q, heads_kv, head_dim;
    int32_t bq, bk;
    int32_t topk, sink_blocks, local_blocks; /* the rules (topk: desc->k) */
    int causal, per_kv_head;
    int32_t page_size;    /* the paged copy's */
    int padded;           /* Q and K token / head strides with 16-byte gaps */
    int64_t extra_q;      /* max_seqlen_q above the longest len_q (a capacity) */
    int32_t nan_seq;      /* >= 0: that sequence's first query token is NaN */

    /* Made by tvc_make. */
    int32_t cu_q[TVC_MAXB + 1], cu_k[TVC_MAXB + 1];
    int64_t total_q, total_k, max_q, max_k;
    int64_t q_strides[2], k_strides[2];
    void *q, *k;             /* packed (strided) inputs */
    int64_t q_elems, k_elems;
    int64_t num_pages;
    int32_t max_pages;
    int32_t *page_table;     /* [B, max_pages] */
    void *k_cache;           /* [num_pages, page_size, Hkv, D] packed */
    int64_t cache_elems;
} tvc_case;

/* A case with defaults (F32, one sequence: set the fields, then tvc_make). */
void tvc_init(tvc_case *c);
/* The named cases both suites run (which: 0 GQA causal with sinks + local,
 * empty sequences, tails, q < k; 1 fp16 strided per_kv_head, blocks 128 x
 * 64; 2 bf16 with NaN scores and a max_seqlen_q capacity, blocks 64 x
 * 128), and a random one (lengths up to max_len, every rule drawn; dtypes
 * F32 / F16 on the CPU, F16 / BF16 and head_dim 8 .. 128 with `gpu`). */
enum { TVC_PRESETS = 3 };
void tvc_preset(tvc_case *c, int which);
void tvc_random(tvc_case *c, tu_rng *rng, int32_t max_len, int it, int gpu);

/* Allocate and fill the tensors and the paged copy; 0 on allocation failure. */
int tvc_make(tvc_case *c, uint64_t seed);
void tvc_free(tvc_case *c);

/* The descriptor of the case (paged or not) on `backend`. */
void tvc_desc(const tvc_case *c, sk_backend backend, sk_topk_varlen_desc *d);

/* The expected layout on the host: row_offsets / col_indices (malloc'd,
 * the capacity's sizes) from the fixed CPU selection per sequence. Returns
 * 0 and names the failure in `why` (>= 200 bytes) when a call fails. */
int tvc_expected(const tvc_case *c, int32_t **row_offsets, int32_t **col_indices, char *why);

/* A host layout against the expected one: every row offset, every entry
 * up to the real count. Returns 0 and describes the first difference. */
int tvc_compare(const tvc_case *c, const int32_t *exp_off, const int32_t *exp_idx,
                const int32_t *got_off, const int32_t *got_idx, char *why);

/* The layout's rows per slice and capacity of the case. */
int32_t tvc_rows(const tvc_case *c);
int32_t tvc_capacity(const tvc_case *c);

#endif /* SK_TESTS_TOPK_VARLEN_CASE_H */
