/*
 * bwd_varlen.cu - the CUDA varlen attention backward (the
 * sk_cuda_attention_varlen_backward_* calls of backend.h; issue 30): the
 * portable backward (bwd_sm80.cu) in varlen mode, on every CUDA backend.
 * Design: docs/perf/varlen_paged.md, "Varlen backward".
 *
 * The packed call is the fixed backward of batch 1 (Sq = total_q, Sk =
 * total_k, row_blocks = R) whose tiles each narrow the kernel parameters to
 * their own sequence (bwd_sm80.cu, sk_bwd_varlen_narrow): pointers at the
 * sequence's first tokens, its lengths, its causal offset. So one body
 * serves both forms, and determinism is the fixed backward's: one CTA owns
 * each dQ tile and each dK/dV key tile, summing in the layout's and T's
 * fixed order.
 *
 * Workspace (256-byte aligned parts from the rounded-up pointer; sizes from
 * capacities only, so one captured plan + run serves every length array):
 *   plan       the varlen forward's plan with the key column table
 *              (varlen_plan.h: seqs, row_start, rows, the dQ order and
 *              tile_info, col_start, cols)
 *   dkv        the longest-first order of the dK/dV tiles (KV head, key
 *              column c < col_cap) over T (common/schedule.h)
 *   t_offsets  int32 [t_heads * col_cap + 1]  T (bwd_kernels.h, varlen form)
 *   t_entries  int32 [nnz]
 *   lse2, dl   fp32 [Hq, R * block_q]  by padded row: layout row r's
 *              queries at r * block_q, so each tile's 64 values are
 *              16-byte aligned; the pre-pass writes 0 past each sequence
 *
 * Plan (on the stream, no host sync): the varlen plan (six kernels), T
 * (three), the dK/dV order (three). Run: the pre-pass, dK/dV, dQ.
 *
 * Robustness: the plan clamps every length (varlen_plan.h) and saturates
 * the row and column counts at R and col_cap; the kernels clamp again what
 * they read from the plan, skip rows past R, key columns past len_k and
 * query rows past len_q, so garbage length arrays or layouts can make
 * results wrong but never send a read or a write outside the tensors.
 */
#include <stdint.h>
#include <string.h>

#include "cuda/attention/bwd_kernels.h"
#include "cuda/attention/varlen_plan.h"
#include "cuda/backend.h"
#include "cuda/common/cuda_check.cuh"
#include "cuda/common/plan_contract.cuh"
#include "cuda/common/schedule.h"

/* Byte offsets of the workspace parts from the aligned base. */
typedef struct sk_vbwd_workspace {
    sk_varlen_plan_layout plan; /* its parts from the base */
    sk_plan_layout dkv;         /* the dK/dV order's parts, from dkv_at */
    size_t dkv_at;
    sk_bwd_tail tail; /* T, lse2, Dl and the total (bwd_kernels.h) */
} sk_vbwd_workspace;

/* The packed call as the fixed backward problem of batch 1 that the
 * portable kernels check and take. */
static void sk_vbwd_flat(const sk_attention_varlen_backward_problem *vp,
                         sk_attention_backward_problem *bp) {
    memset(bp, 0, sizeof *bp);
    bp->fwd = vp->v.flat;
    bp->deterministic = vp->deterministic;
    memcpy(bp->dout_stride, vp->dout_stride, sizeof bp->dout_stride);
    memcpy(bp->dq_stride, vp->dq_stride, sizeof bp->dq_stride);
    memcpy(bp->dk_stride, vp->dk_stride, sizeof bp->dk_stride);
    memcpy(bp->dv_stride, vp->dv_stride, sizeof bp->dv_stride);
    bp->dout = vp->dout;
    bp->dq = vp->dq;
    bp->dk = vp->dk;
    bp->dv = vp->dv;
}

static sk_status sk_vbwd_shape_of(const sk_attention_problem *p, int32_t col_cap, sk_bwd_shape *s) {
    const int merge = p->layout_heads == p->heads_q;
    s->t_heads = merge ? (int32_t)p->heads_kv : p->layout_heads;
    s->t_group = merge ? p->group : 1;
    s->t_slices = p->layout_batch * s->t_heads;
    const int64_t t_rows = (int64_t)s->t_slices * col_cap;
    const int64_t dq_tiles = p->heads_q * (int64_t)p->row_blocks;
    const int64_t dkv_tiles = p->heads_kv * (int64_t)col_cap;
    const int64_t sq_pad = (int64_t)p->row_blocks * p->block_q;
    /* Grids of one CTA per 64-row tile (blockIdx.x below 2^31), and the
     * padded rows as int32 (the kernels' row arithmetic). */
    const int64_t ctas[5] = {t_rows, dq_tiles * (p->block_q / SK_BWD_TILE),
                             dkv_tiles * (p->block_k / SK_BWD_TILE),
                             p->heads_q * (sq_pad / SK_BWD_TILE), sq_pad + SK_BWD_TILE};
    static const char *const what[5] = {
        "layout heads * (ceil(total_k / block_k) + batch)",
        "heads_q * layout rows * (block_q / 64)",
        "heads_kv * (ceil(total_k / block_k) + batch) * (block_k / 64)",
        "heads_q * layout rows * block_q / 64", "layout rows * block_q + 64"};
    for (int i = 0; i < 5; ++i)
        if (ctas[i] > INT32_MAX)
            return sk_error(SK_STATUS_NOT_SUPPORTED,
                            "%s = %lld: the CUDA varlen backward takes at most 2^31 - 1", what[i],
                            (long long)ctas[i]);
    s->t_rows = (int32_t)t_rows;
    s->dq_tiles = (int32_t)dq_tiles;
    s->dkv_tiles = (int32_t)dkv_tiles;
    s->sq_pad = sq_pad;
    return SK_STATUS_SUCCESS;
}

/* The schedule's view of the dK/dV tiles: T as a layout of one batch whose
 * slices are the T heads, rows the key columns, columns (h_local, query
 * block); every entry of T is visited (causal = 0: T holds visited entries
 * only, so the lengths never enter). */
static sk_schedule_geometry sk_vbwd_t_geometry(const sk_attention_problem *p, const sk_bwd_shape *s,
                                               int32_t col_cap, const int32_t *t_offsets,
                                               const int32_t *t_entries) {
    sk_schedule_geometry g;
    memset(&g, 0, sizeof g);
    g.row_offsets = t_offsets;
    g.col_indices = t_entries;
    g.nnz = p->nnz;
    g.tiles = s->dkv_tiles;
    g.row_blocks = col_cap;
    g.col_blocks = s->t_group * p->row_blocks;
    g.heads_q = (int32_t)p->heads_kv;
    g.layout_batch = 1;
    g.layout_heads = s->t_heads;
    g.head_div = (int32_t)p->heads_kv / s->t_heads;
    g.block_q = p->block_k;
    g.block_k = p->block_q;
    g.causal = 0;
    /* L2 groups of whole KV heads: a dK/dV tile streams its sequence's Q
     * and dO rows of the group's query heads; over a KV head, all tokens. */
    g.group_tiles = sk_schedule_l2_group_tiles(p->heads_kv, col_cap, 1,
                                               2 * p->group * p->seq_q * p->head_dim * 2);
    return g;
}

/* Support, shapes and workspace parts: everything that needs no device. */
static sk_status sk_vbwd_prepare(const sk_attention_varlen_backward_problem *vp,
                                 sk_attention_backward_problem *bp, sk_bwd_shape *s,
                                 sk_vbwd_workspace *w) {
    sk_vbwd_flat(vp, bp);
    const sk_attention_problem *p = &bp->fwd;
    SK_TRY(sk_attention_bwd_sm80_check(bp));
    SK_TRY(sk_varlen_plan_layout_of(&vp->v, &w->plan));
    SK_TRY(sk_varlen_plan_add_cols(&vp->v, &w->plan));
    SK_TRY(sk_vbwd_shape_of(p, w->plan.col_cap, s));
    const sk_schedule_geometry gk = sk_vbwd_t_geometry(p, s, w->plan.col_cap, NULL, NULL);
    SK_TRY(sk_schedule_layout_of(&gk, &w->dkv));
    w->dkv_at = w->plan.total - SK_SCHED_ALIGN; /* the plan's parts end, aligned */
    return sk_bwd_workspace_tail(p, s, p->heads_q, w->dkv_at + w->dkv.total, &w->tail);
}

/* A planned or run call: the problem as the fixed one, shapes, parts. */
typedef struct sk_vbwd_call {
    sk_attention_backward_problem bp;
    sk_bwd_shape s;
    sk_vbwd_workspace w;
    char *base; /* the aligned workspace */
} sk_vbwd_call;

/* The checks plan and run both make before enqueuing anything (the
 * workspace before the device, so that its size is checked anywhere). */
static sk_status sk_vbwd_prepare_enqueue(const sk_attention_varlen_backward_problem *vp,
                                         void *workspace, size_t workspace_size, sk_vbwd_call *c) {
    SK_TRY(sk_vbwd_prepare(vp, &c->bp, &c->s, &c->w));
    sk_plan_layout whole;
    memset(&whole, 0, sizeof whole);
    whole.total = c->w.tail.total;
    SK_TRY(sk_schedule_check_workspace(&whole, workspace, workspace_size,
                                       "sk_attention_varlen_backward_workspace_size"));
    int hopper = 0;
    SK_TRY(sk_cuda_check_arch(c->bp.fwd.backend, &hopper));
    c->base = sk_schedule_base(workspace);
    return SK_STATUS_SUCCESS;
}

extern "C" sk_status
sk_cuda_attention_varlen_backward_workspace_size(const sk_attention_varlen_backward_problem *vp,
                                                 size_t *bytes) {
    sk_vbwd_call c;
    SK_TRY(sk_vbwd_prepare(vp, &c.bp, &c.s, &c.w));
    *bytes = c.w.tail.total;
    return SK_STATUS_SUCCESS;
}

extern "C" sk_status
sk_cuda_attention_varlen_backward_plan(const sk_attention_varlen_backward_problem *vp,
                                       void *workspace, size_t workspace_size,
                                       cudaStream_t stream) {
    sk_vbwd_call c;
    SK_TRY(sk_vbwd_prepare_enqueue(vp, workspace, workspace_size, &c));
    sk_varlen_plan_source src;
    src.v = &vp->v;
    src.seq_lens_k = NULL;
    SK_TRY(sk_varlen_plan_enqueue(&src, &c.w.plan, c.base, stream));
    const sk_varlen_plan_view plan = sk_varlen_plan_view_of(&c.w.plan, c.base);
    int32_t *t_offsets = (int32_t *)(c.base + c.w.tail.t_offsets);
    int32_t *t_entries = (int32_t *)(c.base + c.w.tail.t_entries);
    SK_TRY(sk_bwd_transpose_varlen_enqueue(&c.bp.fwd, &c.s, plan.seqs, plan.row_start, plan.cols,
                                           plan.batch, plan.col_cap, t_offsets, t_entries, stream));
    const sk_schedule_geometry gk =
        sk_vbwd_t_geometry(&c.bp.fwd, &c.s, c.w.plan.col_cap, t_offsets, t_entries);
    return sk_schedule_enqueue(&gk, &c.w.dkv, c.base + c.w.dkv_at, stream);
}

extern "C" sk_status
sk_cuda_attention_varlen_backward_run(const sk_attention_varlen_backward_problem *vp,
                                      void *workspace, size_t workspace_size, cudaStream_t stream) {
    sk_vbwd_call c;
    SK_TRY(sk_vbwd_prepare_enqueue(vp, workspace, workspace_size, &c));
    const sk_varlen_plan_view plan = sk_varlen_plan_view_of(&c.w.plan, c.base);
    sk_bwd_plan_view v = {};
    v.dq_info = plan.tile_info; /* {t = h R + r, first entry, end, first col} */
    v.dkv_info = (const int4 *)(c.base + c.w.dkv_at + c.w.dkv.info);
    v.t_entries = (const int32_t *)(c.base + c.w.tail.t_entries);
    v.lse2 = (float *)(c.base + c.w.tail.lse2);
    v.dl = (float *)(c.base + c.w.tail.dl);
    v.hopper = 0;
    v.seqs = plan.seqs;
    v.row_start = plan.row_start;
    v.rows = plan.rows;
    v.cols = plan.cols;
    v.batch = plan.batch;
    v.col_cap = plan.col_cap;
    return sk_attention_bwd_sm80_launch(&c.bp, &c.s, &v, stream);
}
