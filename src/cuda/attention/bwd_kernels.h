/*
 * bwd_kernels.h - the interface between the CUDA attention backward's
 * dispatch (bwd.cu: workspace, plan, run) and its kernels: the transposed
 * layout built by the plan (bwd_transpose.cu) and the portable kernels of
 * the run (bwd_sm80.cu).
 *
 * Transposed layout ("T"). For the dK/dV pass each (batch, KV head, key
 * block j) needs the query blocks that select j, for every query head of
 * the KV head's group. T is a CSC of the forward's BSR laid out as a
 * layout of its own, so that the forward's schedule (common/schedule.h)
 * sorts its tiles unchanged:
 *   - T slices are (layout batch, T head); T row j of a slice is key block
 *     j; T rows are t_offsets[ts * col_blocks + j .. + 1).
 *   - When the layout has a slice per query head (layout_heads == Hq), the
 *     G = Hq / Hkv query heads of KV head hk merge into T head hk (t_heads
 *     = Hkv, t_group = G): entry value e = h_local * row_blocks + i for
 *     query head hk * G + h_local and query block i, ordered by h_local,
 *     then i. Otherwise (per KV head or broadcast layouts) T is the plain
 *     transpose of each slice (t_heads = layout_heads, t_group = 1, e = i),
 *     and every query head of the group reads the same T row.
 *   - A T row lists only the entries that the forward visits (a column
 *     index in range and, when causal, a key block with a visible key for
 *     the block's last query row: common/plan_contract.cuh), once per
 *     (query head, query block), in increasing order: deterministic, built
 *     without atomics (a thread per T row searches the layout rows).
 * The dK/dV tile (b, hk, j) reads T row j of T slice
 * (layout_batch == 1 ? 0 : b) * t_heads + (t_heads == 1 ? 0 : hk) and
 * repeats it G / t_group times: query head hk * G + r * t_group + h_local.
 */
#ifndef SK_CUDA_ATTENTION_BWD_KERNELS_H
#define SK_CUDA_ATTENTION_BWD_KERNELS_H

#include <cuda_runtime.h>

#include "core/problem.h"

enum {
    SK_BWD_TILE = 64 /* rows of a query or key tile; Dl and LSE rows are padded to it */
};

/* The derived sizes of a backward problem (bwd.cu, sk_bwd_shape_of). */
typedef struct sk_bwd_shape {
    int32_t t_heads;  /* T heads: Hkv when layout_heads == Hq, else layout_heads */
    int32_t t_group;  /* query heads merged into one T row: G or 1 */
    int32_t t_slices; /* layout_batch * t_heads */
    int32_t t_rows;   /* t_slices * col_blocks */
    int64_t sq_pad;   /* Sq rounded up to SK_BWD_TILE */
    int32_t dq_tiles, dkv_tiles; /* B * Hq * row_blocks, B * Hkv * col_blocks */
} sk_bwd_shape;

/* The workspace parts after the schedules (bwd.cu), from byte `at` of the
 * aligned base: T's offsets and entries, then lse2 and Dl of lse_rows rows
 * of sq_pad floats each; total is the whole workspace with the alignment
 * slack. SK_STATUS_BAD_PARAM_OVERFLOW when the rows overflow int64. */
typedef struct sk_bwd_tail {
    size_t t_offsets, t_entries, lse2, dl, total;
} sk_bwd_tail;
sk_status sk_bwd_workspace_tail(const sk_attention_problem *p, const sk_bwd_shape *s,
                                int64_t lse_rows, size_t at, sk_bwd_tail *t);

/* Enqueue the build of T (three kernels: count, scan, place). t_offsets
 * has t_rows + 1 entries, t_entries p->nnz (at least one). */
sk_status sk_bwd_transpose_enqueue(const sk_attention_problem *p, const sk_bwd_shape *s,
                                   int32_t *t_offsets, int32_t *t_entries, cudaStream_t stream);

/* The varlen form of T (bwd_varlen.cu's plan): T slices are the T heads
 * (the varlen layout has one batch), T row c of a slice is key column c
 * of the varlen plan's column table (cols[c] = {b, j}: sequence b's key
 * block j), its entries h_local * R + i for the query blocks i of sequence
 * b (layout row row_start[b] + i < R) whose row selects j and visits it
 * under b's own lengths (causal bottom-right per sequence). The same three
 * kernels; t_rows = t_slices * col_cap. The tables are the plan's, written
 * earlier on the same stream. */
sk_status sk_bwd_transpose_varlen_enqueue(const sk_attention_problem *p, const sk_bwd_shape *s,
                                          const int4 *seqs, const int32_t *row_start,
                                          const int2 *cols, int32_t batch, int32_t col_cap,
                                          int32_t *t_offsets,
                                          int32_t *t_entries, cudaStream_t stream);

/* What the run's kernels read from the workspace. */
typedef struct sk_bwd_plan_view {
    const int4 *dq_info;      /* [dq_tiles] dQ schedule: {tile, first entry, end, first col} */
    const int4 *dkv_info;     /* [dkv_tiles] the same over T */
    const int32_t *t_entries; /* [nnz] T entries */
    float *lse2;              /* [B * Hq, sq_pad] LSE * log2(e), written by the pre-pass */
    float *dl;                /* [B * Hq, sq_pad] Dl = rowsum(dO * O), the same */
    int hopper;               /* the run may use the Hopper kernels (bwd.cu) */
    /* Varlen mode (bwd_varlen.cu): the varlen plan's tables
     * (varlen_plan.h); seqs NULL in the fixed backward. */
    const int4 *seqs;
    const int32_t *row_start;
    const int2 *rows, *cols;
    int32_t batch, col_cap;
    /* bwd->deterministic = 0 (fixed mode only; else NULL): the fp32
     * dQaccum [B * Hq, sq_pad, D] of the fused kernels (Hopper or portable). */
    float *dqacc;
    size_t dqacc_bytes;
} sk_bwd_plan_view;

/* The portable backward (mma.sync, ldmatrix, cp.async), compute capability
 * 8.0 or later: the pre-pass, then the dK/dV and dQ kernels. check() says
 * whether it covers the problem (SK_STATUS_NOT_SUPPORTED naming the
 * argument otherwise), before anything is enqueued. */
sk_status sk_attention_bwd_sm80_check(const sk_attention_backward_problem *p);
sk_status sk_attention_bwd_sm80_launch(const sk_attention_backward_problem *p,
                                       const sk_bwd_shape *s, const sk_bwd_plan_view *v,
                                       cudaStream_t stream);

/* The Hopper backward kernels (sm_90a; bwd_sm90_dkv.cu, bwd_sm90_dq.cu),
 * each one pass of the portable sequence, run after the pre-pass when the
 * device is Hopper and the backend is not SK_BACKEND_CUDA_SM80. A kernel
 * that does not cover a problem sets *launched = 0 and returns success
 * without enqueuing anything (no error message): the portable kernel then
 * runs that pass. Same semantics, masks, NaN rules and determinism as the
 * portable pass (bwd_sm80.cu's header comment). */
struct sk_bwd_params;
sk_status sk_attention_bwd_sm90_dkv_launch(const sk_attention_backward_problem *bp,
                                           const sk_bwd_shape *s, const struct sk_bwd_params *k,
                                           cudaStream_t stream, int *launched);
sk_status sk_attention_bwd_sm90_dq_launch(const sk_attention_backward_problem *bp,
                                          const sk_bwd_shape *s, const struct sk_bwd_params *k,
                                          cudaStream_t stream, int *launched);

/* bwd->deterministic = 0 (bwd_sm90_dkv.cu, kFuse): one Hopper pass that
 * computes dK, dV and, per tile, dQ, added with fp32 atomics into dqacc
 * (zeroed here on the stream first); the run then converts dqacc (the
 * post-pass of bwd_sm80.cu) instead of running a dQ pass. Declines as
 * sk_attention_bwd_sm90_dkv_launch does (*launched = 0, nothing enqueued),
 * and when dqacc is NULL: the two-pass path runs. */
sk_status sk_attention_bwd_sm90_fused_launch(const sk_attention_backward_problem *bp,
                                             const sk_bwd_shape *s, const struct sk_bwd_params *k,
                                             float *dqacc, size_t dqacc_bytes,
                                             cudaStream_t stream, int *launched);

#endif /* SK_CUDA_ATTENTION_BWD_KERNELS_H */
