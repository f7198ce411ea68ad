/*
 * decode_select.h - the checked form of a decode selection call (summary
 * build, append, scoring + selection; sparsek.h "Decode page selection"),
 * shared by the core (src/core/decode_select.c), the CPU reference
 * (src/cpu/decode_select_ref.c) and the CUDA kernels
 * (src/cuda/decode_select/), with the per-row rules and the score
 * arithmetic that every backend must follow bit for bit.
 */
#ifndef SK_CORE_DECODE_SELECT_H
#define SK_CORE_DECODE_SELECT_H

#include <stdint.h>

#include "core/topk_rules.h"
#include "sparsek.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Lanes of the score's dot product (the order of its partial sums). */
enum { SK_DSEL_LANES = 32 };

typedef struct sk_dsel_problem {
    sk_backend backend;
    sk_dtype dtype;
    int32_t batch, q_len, heads_q, heads_kv, group; /* group = Hq / Hkv */
    int32_t head_dim;
    int64_t max_seqlen_k;
    int32_t block_k, max_blocks;      /* max_blocks = ceil(max_seqlen_k / block_k) */
    float scale;                      /* resolved */
    int32_t k, sink_blocks, recent_blocks;
    int32_t row_cap;                  /* min(k + sinks + recent, max_blocks): a row's most */
    int32_t group_blocks, top_groups; /* two levels when group_blocks > 0 */
    int32_t max_groups;               /* ceil(max_blocks / group_blocks); 0: one level */
    int32_t group_cap;                /* min(top_groups, max_groups) */
    int32_t rows;                     /* batch * heads_kv */
    int32_t capacity;                 /* rows * row_cap */
    sk_grid grid;                     /* the decode layout's */
    int64_t q_stride[3];              /* resolved, elements over [batch, token, head] */
    int64_t num_pages;
    int32_t page_size, max_pages;
    int64_t page_table_stride;        /* resolved */
    int64_t k_stride[3];              /* resolved, elements over [page, slot, head] */

    /* Set per call; NULL where the call has none. */
    const void *q, *k_cache;
    const int32_t *page_table;
    const int32_t *seq_lens;          /* build, select: len_k; append: the new lengths */
    const int32_t *old_lens;          /* append */
    const void *summary;
    void *summary_out;
    int32_t *row_offsets, *col_indices;
} sk_dsel_problem;

/* The rules of one row with n candidate blocks (sparsek.h: sinks, the
 * recent blocks ending at n - 1, then k by score), in topk_rules.h's form
 * so that sk_topk_is_forced applies: they are sk_topk_row_rules' with
 * causal for one query at key position n * block_k - 1. */
SK_TOPK_HD static inline sk_topk_row sk_dsel_row_rules(int32_t n, int32_t sink_blocks,
                                                      int32_t recent_blocks, int32_t k) {
    sk_topk_row r;
    r.n_cand = n;
    r.sink_end = sink_blocks < n ? sink_blocks : n;
    if (n > 0 && recent_blocks > 0) {
        r.local_lo = n - recent_blocks > 0 ? n - recent_blocks : 0;
        r.local_hi = n - 1;
    } else {
        r.local_lo = 0;
        r.local_hi = -1;
    }
    int32_t forced = r.sink_end;
    if (r.local_lo <= r.local_hi) {
        const int32_t lo = r.local_lo > r.sink_end ? r.local_lo : r.sink_end;
        forced += r.local_hi - lo + 1 > 0 ? r.local_hi - lo + 1 : 0;
    }
    r.forced = forced;
    const int32_t rest = n - forced;
    r.bound = forced + (k < rest ? k : rest);
    return r;
}

/* A length from device memory, clamped to [0, hi]. */
SK_TOPK_HD static inline int32_t sk_dsel_clamp_len(int32_t len, int64_t hi) {
    return len < 0 ? 0 : (len > hi ? (int32_t)hi : len);
}

/* Candidate blocks of a sequence of len keys. */
SK_TOPK_HD static inline int32_t sk_dsel_blocks(int32_t len, int32_t block_k) {
    return (int32_t)(((int64_t)len + block_k - 1) / block_k);
}

#ifdef __cplusplus
}
#endif

#endif /* SK_CORE_DECODE_SELECT_H */
