/*
 * bwd.cu - the dispatch of the CUDA attention backward (the
 * sk_cuda_attention_backward_* calls of backend.h): workspace layout,
 * plan, run. Deterministic by construction: every output element is
 * written once, by the one CTA that owns it, summing in a fixed order (no
 * atomics on outputs; docs/perf/backward_sm80.md).
 *
 * Workspace (256-byte aligned parts from the rounded-up pointer; the size
 * depends on the descriptor and the layout's sizes, never on its arrays):
 *   dq schedule   the forward's longest-first order of the (batch, query
 *                 head, query block) tiles (common/schedule.h), for the dQ
 *                 kernel
 *   dkv schedule  the same sort over the transposed layout's rows: the
 *                 (batch, KV head, key block) tiles of the dK/dV kernel
 *   t_offsets     int32 [t_rows + 1]  the transposed layout T
 *   t_entries     int32 [nnz]         (bwd_kernels.h)
 *   lse2, dl      fp32 [B * Hq, sq_pad]  LSE * log2(e) and rowsum(dO * O),
 *                 written by the run's pre-pass
 *   dqacc         bwd->deterministic = 0 only: fp32 [B * Hq, sq_pad, D]
 *                 (element order: bwd_dqacc.cuh),
 *                 the fused pass's dQ sums (zeroed by the run; the
 *                 size for deterministic = 1 is unchanged)
 *
 * Plan (on the stream; no host sync, graph safe): T (bwd_transpose.cu),
 * then the two schedules. Run: checks, then pre-pass, dK/dV, dQ
 * (bwd_sm80.cu). On a Hopper device (SK_BACKEND_CUDA and _SM90) the dK/dV
 * and dQ passes run the Hopper kernels where they cover the problem
 * (bwd_kernels.h), else the portable ones; SK_BACKEND_CUDA_SM80 always runs
 * the portable kernels. SK_BACKEND_CUDA_SM90 requires compute capability
 * 9.0, so that one descriptor serves a Hopper forward and its backward.
 * With bwd->deterministic = 0 on a Hopper device the run tries the fused
 * one-pass kernel first (dK, dV and fp32 dQ adds; bwd_kernels.h), and
 * falls back to the deterministic passes where it declines: that mode is
 * then deterministic too. Without the Hopper kernels (SK_BACKEND_CUDA_SM80,
 * or not a Hopper device) deterministic = 0 runs the portable fused pass
 * (bwd_sm80_fused.cuh) into the same dqacc part.
 */
#include <stdint.h>

#include "cuda/attention/bwd_kernels.h"
#include "cuda/attention/kernels.h"
#include "cuda/backend.h"
#include "cuda/common/cuda_check.cuh"
#include "cuda/common/plan_contract.cuh"
#include "cuda/common/schedule.h"

/* Byte offsets of the workspace parts from the aligned base. */
typedef struct sk_bwd_workspace {
    sk_plan_layout dq, dkv; /* each schedule's parts, from its own start */
    size_t dq_at, dkv_at;
    sk_bwd_tail tail; /* T, lse2, Dl and the total (bwd_kernels.h) */
    size_t dqacc, dqacc_bytes; /* deterministic = 0: fp32 dQaccum (0 bytes otherwise) */
} sk_bwd_workspace;

static sk_status sk_bwd_shape_of(const sk_attention_problem *p, sk_bwd_shape *s) {
    const int merge = p->layout_heads == p->heads_q;
    s->t_heads = merge ? (int32_t)p->heads_kv : p->layout_heads;
    s->t_group = merge ? p->group : 1;
    s->t_slices = p->layout_batch * s->t_heads; /* at most the layout's slices */
    const int64_t t_rows = (int64_t)s->t_slices * p->col_blocks;
    const int64_t dq_tiles = p->batch * p->heads_q * (int64_t)p->row_blocks;
    const int64_t dkv_tiles = p->batch * p->heads_kv * (int64_t)p->col_blocks;
    s->sq_pad = sk_ceil_div_i64(p->seq_q, SK_BWD_TILE) * SK_BWD_TILE;
    const int64_t prepass = p->batch * p->heads_q * (s->sq_pad / SK_BWD_TILE);
    /* Grids of one CTA per 64-row tile; blockIdx.x is below 2^31. */
    const int64_t ctas[4] = {t_rows, dq_tiles * (p->block_q / SK_BWD_TILE),
                             dkv_tiles * (p->block_k / SK_BWD_TILE), prepass};
    static const char *const what[4] = {"layout slices * col_blocks",
                                        "batch * heads_q * row_blocks * (block_q / 64)",
                                        "batch * heads_kv * col_blocks * (block_k / 64)",
                                        "batch * heads_q * ceil(seq_q / 64)"};
    for (int i = 0; i < 4; ++i)
        if (ctas[i] > INT32_MAX)
            return sk_error(SK_STATUS_NOT_SUPPORTED,
                            "%s = %lld: the CUDA backward takes at most 2^31 - 1", what[i],
                            (long long)ctas[i]);
    s->t_rows = (int32_t)t_rows;
    s->dq_tiles = (int32_t)dq_tiles;
    s->dkv_tiles = (int32_t)dkv_tiles;
    return SK_STATUS_SUCCESS;
}

/* The schedule's view of the dK/dV tiles: T as a layout whose slices are
 * (layout batch, T head), rows key blocks, columns (h_local, query block);
 * every entry of T is visited (causal = 0: T holds visited entries only). */
static sk_schedule_geometry sk_bwd_t_geometry(const sk_attention_problem *p,
                                              const sk_bwd_shape *s, const int32_t *t_offsets,
                                              const int32_t *t_entries) {
    sk_schedule_geometry g;
    g.row_offsets = t_offsets;
    g.col_indices = t_entries;
    g.nnz = p->nnz;
    g.tiles = s->dkv_tiles;
    g.row_blocks = p->col_blocks;
    g.col_blocks = s->t_group * p->row_blocks;
    g.heads_q = (int32_t)p->heads_kv;
    g.layout_batch = p->layout_batch;
    g.layout_heads = s->t_heads;
    g.head_div = (int32_t)p->heads_kv / s->t_heads;
    g.block_q = p->block_k;
    g.block_k = p->block_q;
    g.seq_q = (int32_t)p->seq_k;
    g.seq_k = (int32_t)p->seq_q;
    g.causal = 0;
    /* L2 groups (common/schedule.h) of whole KV heads: a dK/dV tile streams
     * the Q and dO rows of its group's query heads (fp16 / bf16: 2 bytes). */
    g.group_tiles = sk_schedule_l2_group_tiles(p->batch * p->heads_kv, p->col_blocks, 1,
                                               2 * p->group * p->seq_q * p->head_dim * 2);
    return g;
}

static sk_status sk_bwd_workspace_of(const sk_attention_problem *p, const sk_bwd_shape *s,
                                     sk_bwd_workspace *w) {
    const sk_schedule_geometry gq = sk_attention_schedule_geometry(p);
    const sk_schedule_geometry gk = sk_bwd_t_geometry(p, s, NULL, NULL);
    SK_TRY(sk_schedule_layout_of(&gq, &w->dq));
    SK_TRY(sk_schedule_layout_of(&gk, &w->dkv));
    w->dq_at = 0;
    w->dkv_at = w->dq_at + w->dq.total;
    return sk_bwd_workspace_tail(p, s, p->batch * p->heads_q, w->dkv_at + w->dkv.total,
                                 &w->tail);
}

sk_status sk_bwd_workspace_tail(const sk_attention_problem *p, const sk_bwd_shape *s,
                                int64_t lse_rows, size_t at, sk_bwd_tail *t) {
    int64_t rows_bytes;
    const int64_t f[3] = {lse_rows, s->sq_pad, (int64_t)sizeof(float)};
    if (!sk_product_i64(f, 3, &rows_bytes) || rows_bytes > INT64_MAX / 4)
        return sk_error(SK_STATUS_BAD_PARAM_OVERFLOW,
                        "the backward workspace (%lld rows of %lld LSE and Dl floats) overflows "
                        "int64",
                        (long long)lse_rows, (long long)s->sq_pad);
    const size_t nnz = (size_t)(p->nnz > 0 ? p->nnz : 1);
    t->t_offsets = at;
    t->t_entries = t->t_offsets + sk_sched_align(((size_t)s->t_rows + 1) * sizeof(int32_t));
    t->lse2 = t->t_entries + sk_sched_align(nnz * sizeof(int32_t));
    t->dl = t->lse2 + sk_sched_align((size_t)rows_bytes);
    t->total = t->dl + sk_sched_align((size_t)rows_bytes) + SK_SCHED_ALIGN;
    return SK_STATUS_SUCCESS;
}

/* deterministic = 0: the dQaccum part after the tail's parts (before its
 * alignment slack), B * Hq * sq_pad * D floats. */
static sk_status sk_bwd_dqacc_of(const sk_attention_backward_problem *bp, const sk_bwd_shape *s,
                                 sk_bwd_workspace *w) {
    w->dqacc = w->dqacc_bytes = 0;
    if (bp->deterministic) return SK_STATUS_SUCCESS;
    const sk_attention_problem *p = &bp->fwd;
    const int64_t f[5] = {p->batch, p->heads_q, s->sq_pad, p->head_dim, (int64_t)sizeof(float)};
    int64_t bytes;
    if (!sk_product_i64(f, 5, &bytes) || bytes > INT64_MAX / 4)
        return sk_error(SK_STATUS_BAD_PARAM_OVERFLOW,
                        "bwd->deterministic = 0: the fp32 dQ accumulator (batch * heads_q * %lld "
                        "rows * head_dim floats) overflows int64",
                        (long long)s->sq_pad);
    w->dqacc = w->tail.total - SK_SCHED_ALIGN;
    w->dqacc_bytes = (size_t)bytes;
    w->tail.total += sk_sched_align((size_t)bytes);
    return SK_STATUS_SUCCESS;
}

/* Support, shapes and workspace parts: everything that needs no device. */
static sk_status sk_bwd_prepare(const sk_attention_backward_problem *bp, sk_bwd_shape *s,
                                sk_bwd_workspace *w) {
    SK_TRY(sk_attention_bwd_sm80_check(bp));
    SK_TRY(sk_bwd_shape_of(&bp->fwd, s));
    SK_TRY(sk_bwd_workspace_of(&bp->fwd, s, w));
    return sk_bwd_dqacc_of(bp, s, w);
}

/* The checks the plan and the run both make before enqueuing anything,
 * and the aligned base. */
static sk_status sk_bwd_prepare_enqueue(const sk_attention_backward_problem *bp, void *workspace,
                                        size_t workspace_size, sk_bwd_shape *s,
                                        sk_bwd_workspace *w, char **base, int *hopper) {
    SK_TRY(sk_bwd_prepare(bp, s, w));
    SK_TRY(sk_cuda_check_arch(bp->fwd.backend, hopper));
    sk_plan_layout whole = {};
    whole.total = w->tail.total;
    SK_TRY(sk_schedule_check_workspace(&whole, workspace, workspace_size,
                                       "sk_attention_backward_workspace_size"));
    *base = sk_schedule_base(workspace);
    return SK_STATUS_SUCCESS;
}

extern "C" sk_status sk_cuda_attention_backward_workspace_size(
    const sk_attention_backward_problem *bp, size_t *bytes) {
    sk_bwd_shape s;
    sk_bwd_workspace w;
    SK_TRY(sk_bwd_prepare(bp, &s, &w));
    *bytes = w.tail.total;
    return SK_STATUS_SUCCESS;
}

extern "C" sk_status sk_cuda_attention_backward_plan(const sk_attention_backward_problem *bp,
                                                     void *workspace, size_t workspace_size,
                                                     cudaStream_t stream) {
    sk_bwd_shape s;
    sk_bwd_workspace w;
    char *base;
    int hopper = 0;
    SK_TRY(sk_bwd_prepare_enqueue(bp, workspace, workspace_size, &s, &w, &base, &hopper));
    const sk_attention_problem *p = &bp->fwd;
    int32_t *t_offsets = (int32_t *)(base + w.tail.t_offsets);
    int32_t *t_entries = (int32_t *)(base + w.tail.t_entries);
    SK_TRY(sk_bwd_transpose_enqueue(p, &s, t_offsets, t_entries, stream));
    const sk_schedule_geometry gq = sk_attention_schedule_geometry(p);
    SK_TRY(sk_schedule_enqueue(&gq, &w.dq, base + w.dq_at, stream));
    const sk_schedule_geometry gk = sk_bwd_t_geometry(p, &s, t_offsets, t_entries);
    return sk_schedule_enqueue(&gk, &w.dkv, base + w.dkv_at, stream);
}

extern "C" sk_status sk_cuda_attention_backward_run(const sk_attention_backward_problem *bp,
                                                    void *workspace, size_t workspace_size,
                                                    cudaStream_t stream) {
    sk_bwd_shape s;
    sk_bwd_workspace w;
    char *base;
    int hopper = 0;
    SK_TRY(sk_bwd_prepare_enqueue(bp, workspace, workspace_size, &s, &w, &base, &hopper));
    sk_bwd_plan_view v = {}; /* no varlen tables: the fixed mode */
    v.dq_info = (const int4 *)(base + w.dq_at + w.dq.info);
    v.dkv_info = (const int4 *)(base + w.dkv_at + w.dkv.info);
    v.t_entries = (const int32_t *)(base + w.tail.t_entries);
    v.lse2 = (float *)(base + w.tail.lse2);
    v.dl = (float *)(base + w.tail.dl);
    v.hopper = hopper && bp->fwd.backend != SK_BACKEND_CUDA_SM80;
    v.dqacc = w.dqacc_bytes > 0 ? (float *)(base + w.dqacc) : NULL;
    v.dqacc_bytes = w.dqacc_bytes;
    return sk_attention_bwd_sm80_launch(bp, &s, &v, stream);
}
