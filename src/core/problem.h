/*
 * problem.h - the checked, normalised form of a call, handed to a backend.
 *
 * The core (src/core/attention.c, src/core/bsr_gemm.c, src/core/topk.c)
 * validates the public descriptor, layout and pointers, resolves defaults
 * (packed strides, the 1/sqrt(D) scale, the layout's slice mapping) and
 * fills one of these. A
 * backend may then assume every field is consistent and every size product
 * fits int64; it still must not trust the layout's array CONTENT when the
 * layout lives on the device (see "Robustness" in sparsek.h).
 */
#ifndef SK_CORE_PROBLEM_H
#define SK_CORE_PROBLEM_H

#include <stdint.h>

#include "sparsek.h"

typedef struct sk_attention_problem {
    sk_backend backend; /* CPU, or the CUDA variant asked for */
    sk_dtype dtype;
    int64_t batch, seq_q, seq_k, heads_q, heads_kv, head_dim;
    float scale;      /* resolved: never 0 unless the caller... cannot; always finite */
    int causal;       /* 1 for SK_MASK_CAUSAL */
    int64_t q_stride[3], k_stride[3], v_stride[3], o_stride[3]; /* resolved, in elements */
    int32_t group;    /* heads_q / heads_kv */

    /* Layout, with the slice mapping resolved:
     *   slice(b, h) = (layout_batch == 1 ? 0 : b) * layout_heads + h / head_div */
    int32_t block_q, block_k;       /* 64 or 128 */
    int32_t row_blocks, col_blocks; /* ceil(Sq / block_q), ceil(Sk / block_k) */
    int32_t layout_batch, layout_heads, head_div;
    int32_t nnz;
    const int32_t *row_offsets; /* [layout_batch * layout_heads * slice_rows + 1] */
    const int32_t *col_indices; /* [nnz] */
    /* Row g of slice s is row_offsets[s * slice_rows + i], and LSE[b, h, q]
     * is lse[(b * heads_q + h) * lse_head_stride + q]. Every fixed-batch
     * call has slice_rows = row_blocks and lse_head_stride = seq_q, which
     * the CUDA kernels assume; a varlen sequence's problem (the CPU
     * backend's, src/cpu/attention_varlen_ref.c) has the layout's R rows
     * per slice and the packed total_q. */
    int32_t slice_rows;
    int64_t lse_head_stride;
    /* Paged K/V (a paged call's sequence, on the CPU backend; NULL in every
     * other problem, as the CUDA kernels assume): batch 1, and key s of KV
     * head h at element page_table[s / page_size] * k_stride[0] +
     * (s % page_size) * k_stride[1] + h * k_stride[2] of k (and so for v). */
    const int32_t *page_table;
    int32_t page_size;

    const void *q, *k, *v; /* may be NULL in workspace-size / plan calls */
    void *o;
    float *lse; /* may be NULL */
    /* Carry-in (context parallel's remote pass, cp_run_cuda.c; NULL in every
     * other problem): o holds on entry a partial result over other keys
     * and lse_carry [B, Hq, Sq] its LSE; the run continues from it (O in
     * place, lse the merged one). The Hopper fixed kernel only. */
    const float *lse_carry;
    /* A part of the run (context parallel's first local pass, cp_run_cuda.c;
     * 0 in every other problem): the tiles of the plan's order from
     * tile_first on, tile_count of them (0: all), on a persistent grid
     * that leaves reserve_sms SMs free (for NCCL's kernel). The Hopper
     * fixed kernel only. */
    int64_t tile_first, tile_count;
    int32_t reserve_sms;

    /* FP8 inputs (the fixed-batch forward only; sparsek.h, sk_attention_desc):
     * O's dtype (equal to dtype unless dtype is E4M3, then F16 or BF16) and
     * the descales q [B, Hq], k and v [B, Hkv] fp32 (NULL: 1), NULL unless
     * dtype is E4M3. */
    sk_dtype out_dtype;
    const float *q_descale, *k_descale, *v_descale;
    /* V's layout (sk_v_layout): SK_V_LAYOUT_VT_FP8 (E4M3 only) is the
     * packed V^T of core/fp8_vt.h, v_stride then unused (packed rows). */
    int32_t v_layout;
} sk_attention_problem;

/* An attention backward (src/core/attention_backward.c): the forward's
 * problem (shapes, layout, scale, mask, Q/K/V/O strides and pointers, LSE)
 * plus the backward's own tensors. Here fwd.o and fwd.lse are inputs: the
 * backward reads them and never writes through them. */
typedef struct sk_attention_backward_problem {
    sk_attention_problem fwd; /* fwd.lse is never NULL here */
    int32_t deterministic;    /* 1, or 0 (CUDA on Hopper: the fused pass, dQ by fp32 atomics) */
    int64_t dout_stride[3], dq_stride[3], dk_stride[3], dv_stride[3]; /* resolved, elements */
    const void *dout;         /* dO [B, Sq, Hq, D]; NULL in workspace-size / plan calls */
    void *dq;                 /* [B, Sq, Hq, D] */
    void *dk, *dv;            /* [B, Sk, Hkv, D] */
} sk_attention_backward_problem;

/* A varlen attention (src/core/attention_varlen.c): B sequences packed
 * along the token axis. `flat` is the whole packed call as one fixed-batch
 * problem of batch 1: seq_q = total_q, seq_k = total_k, the tensors
 * [1, total, H, D] (stride[0] unused), LSE [Hq, total_q] (lse_head_stride
 * = total_q), the layout's R rows per slice (row_blocks = slice_rows = R)
 * with its slice mapping, every pointer at token 0. A backend cuts it into
 * one problem per sequence. cu_seqlens_* are host arrays on the CPU backend
 * (checked against the lengths and the layout before the backend is
 * called), device arrays on CUDA (never read on the host). */
typedef struct sk_attention_varlen_problem {
    sk_attention_problem flat;
    int32_t batch;                   /* B sequences */
    int64_t max_seqlen_q, max_seqlen_k;
    const int32_t *cu_seqlens_q;     /* [B + 1]; NULL in workspace-size calls */
    const int32_t *cu_seqlens_k;     /* [B + 1]; NULL in workspace-size calls */
} sk_attention_varlen_problem;

/* A paged attention (src/core/attention_paged.c): the varlen call's
 * packed queries, output, LSE and layout in v (v.cu_seqlens_k is NULL),
 * K and V in caches of pages: v.flat.k and v.flat.v are the caches
 * [num_pages, page_size, Hkv, D] with strides over [page, slot, head]
 * (v.flat.seq_k = num_pages x page_size), sequence b's key k in page
 * page_table[b * page_table_stride + k / page_size], slot k % page_size.
 * Host arrays on the CPU backend (checked before the backend is called),
 * device arrays on CUDA (never read on the host). */
typedef struct sk_attention_paged_problem {
    sk_attention_varlen_problem v;
    const int32_t *seq_lens_k; /* [B] len_k(b) */
    const int32_t *page_table; /* [B, max_pages], row stride page_table_stride */
    int64_t num_pages, page_table_stride;
    int32_t page_size, max_pages;
} sk_attention_paged_problem;

/* A decode call (src/core/decode.c, sparsek.h "Decode"). `paged` holds the
 * paged forward's view of it, so that the paged checks and the CPU
 * reference serve it: paged.v.flat is the fixed-batch problem (batch B,
 * seq_q = q_len, seq_k = num_pages x page_size for the size checks; Q, O
 * [B, q_len, H, D] strides; the caches' strides over [page, slot, head];
 * LSE [B, Hq, q_len]), its layout fields those of the decode layout
 * (layout_batch = B, layout_heads = 1 or Hkv, block_q 64, block_k 16 ..
 * 128, row_blocks = slice_rows = 1, col_blocks = ceil(max_seqlen_k /
 * block_k); row_offsets NULL for the dense case), paged.v.batch = B,
 * paged.v.max_seqlen_k, and the page arrays (paged.v.cu_seqlens_* NULL). */
typedef struct sk_decode_problem {
    sk_attention_paged_problem paged;
    int32_t q_len;      /* 1 .. 16 */
    int32_t dense;      /* 1: no layout, every key of the sequence */
    int32_t num_splits; /* the descriptor's: 0 = the library chooses */
} sk_decode_problem;

typedef struct sk_bsr_gemm_problem {
    sk_backend backend;
    sk_dtype ab_dtype, c_dtype;
    int64_t m, n, k;
    sk_order b_order;
    int64_t ldb, ldc; /* resolved */
    float alpha, beta;
    int32_t block_m, block_k;       /* A's block_rows, block_cols */
    int32_t row_blocks, col_blocks; /* ceil(m / block_m), ceil(k / block_k) */
    int32_t nnz;
    const int32_t *row_offsets; /* [row_blocks + 1] */
    const int32_t *col_indices; /* [nnz] */
    const void *a_values;       /* [nnz, block_m, block_k] */
    const void *b;
    void *c;
} sk_bsr_gemm_problem;

/* A top-k block selection (src/core/topk.c): its row rules are in
 * src/core/topk_rules.h. */
typedef struct sk_topk_problem {
    sk_backend backend;
    sk_dtype dtype;
    int64_t batch, seq_q, seq_k, heads_q, heads_kv, head_dim;
    int64_t q_stride[3], k_stride[3]; /* resolved element strides over [batch, seq, head] */
    int32_t group;                    /* heads_q / heads_kv */
    int32_t block_q, block_k;         /* 64 or 128 */
    int32_t row_blocks, col_blocks;   /* ceil(Sq / block_q), ceil(Sk / block_k) */
    int32_t heads;                    /* layout heads: heads_kv (per_kv_head) or heads_q */
    sk_grid grid;                     /* the output layout's grid (checked) */
    int32_t slices;                   /* batch * heads */
    int32_t total_rows;               /* slices * row_blocks */
    int32_t row_cap;                  /* the largest row bound */
    int32_t capacity;                 /* sum of the row bounds over all slices (max nnz) */
    float scale;                      /* resolved: 1/sqrt(D) when the desc says 0 */
    int32_t k, sink_blocks, local_blocks;
    int32_t causal, per_kv_head;
    int32_t score_rows[2], score_cols[2]; /* sk_topk_score_span */

    /* Set per call; NULL where the call has none. */
    const void *q, *k_in;        /* [B, Sq, Hq, D], [B, Sk, Hkv, D] */
    float *pooled_q_out;         /* [B, Hq, row_blocks, D] (sk_block_pool) */
    float *pooled_k_out;         /* [B, Hkv, col_blocks, D] */
    const float *pooled_q;       /* inputs of the scoring (sk_select_topk) */
    const float *pooled_k;
    const float *scores;         /* [slices, row_blocks, col_blocks] (sk_layout_from_scores) */
    int32_t *row_offsets;        /* [total_rows + 1] */
    int32_t *col_indices;        /* [capacity] */
} sk_topk_problem;

/* An e4m3 quantization (src/core/quantize.c; sparsek.h sk_quantize_e4m3). */
typedef struct sk_quantize_problem {
    sk_backend backend;
    sk_dtype dtype;                     /* x: F16 or BF16 */
    int64_t batch, seq, heads, head_dim; /* B x H < 2^31; CUDA: head_dim % 8 == 0 */
    int64_t x_stride[3];                /* resolved element strides over [B, S, H] */
    const void *x;                      /* NULL in workspace-size calls */
    uint8_t *y;                         /* packed [B, S, H, D] */
    float *descale;                     /* [B, H] */
    int32_t layout;                     /* sk_quant_layout: y's layout (fp8_vt.h) */
} sk_quantize_problem;

/* A top-k selection on varlen or paged inputs (src/core/topk_varlen.c;
 * sparsek.h "Top-k selection on varlen and paged inputs"). t is the
 * per-sequence template of the fixed selection: batch 1, the descriptor's
 * heads, head_dim, blocks, rules and scale, q_stride / k_stride over [0,
 * token, head] (paged: k_stride over [page, slot, head]); its seq_q, seq_k,
 * grid and capacity fields are set per sequence where used. */
typedef struct sk_topk_varlen_problem {
    sk_topk_problem t;
    int32_t batch;               /* B */
    int32_t paged;               /* != 0: K is a paged cache */
    int64_t total_q, total_k;    /* total_k: varlen only */
    int64_t max_seqlen_q, max_seqlen_k;
    int32_t rows;                /* R: layout rows per slice */
    int32_t max_kb;              /* ceil(max_seqlen_k / block_k): score columns per row */
    int32_t kb_cap;              /* key blocks of all sequences, at most (pooled K rows) */
    int32_t row_cap;             /* entries per row, at most */
    int32_t slices;              /* layout heads */
    int32_t capacity;            /* slices x rows x row_cap */
    sk_grid grid;                /* the output layout's */
    int64_t num_pages, page_table_stride;
    int32_t page_size, max_pages;
    /* Set per call. */
    const int32_t *cu_seqlens_q, *cu_seqlens_k; /* [B + 1]; cu_seqlens_k NULL when paged */
    const int32_t *seq_lens_k, *page_table;     /* paged only */
    const void *q, *k;                          /* k: packed K or the K cache */
    int32_t *row_offsets, *col_indices;
} sk_topk_varlen_problem;

/* A varlen attention backward (src/core/attention_varlen_backward.c): the
 * varlen forward's packed call in v (v.flat.o and v.flat.lse are read,
 * never written; v.flat.lse is never NULL), plus the backward's packed
 * tensors with [token, head] strides resolved as the flat problem's three
 * (stride[0] unused): dO, dQ [total_q, Hq, D], dK, dV [total_k, Hkv, D],
 * every pointer at token 0. */
typedef struct sk_attention_varlen_backward_problem {
    sk_attention_varlen_problem v;
    int32_t deterministic; /* 1, or 0 (reserved, as the fixed backward's) */
    int64_t dout_stride[3], dq_stride[3], dk_stride[3], dv_stride[3];
    const void *dout; /* NULL in workspace-size / plan calls */
    void *dq, *dk, *dv;
} sk_attention_varlen_backward_problem;

#endif /* SK_CORE_PROBLEM_H */
