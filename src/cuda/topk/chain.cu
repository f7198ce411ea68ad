/*
 * chain.cu - the CUDA top-k block selection (the sk_cuda_topk_* calls of
 * backend.h): its workspace layout, and the order in which it enqueues its
 * kernels on one stream, with no allocation and no host synchronisation
 * (CUDA-graph capturable).
 *
 * Kernels, in launch order (each file's header says how it works):
 *   pool       pool.cu: the block means of Q and K, one launch (in
 *              sk_pool_select_topk on a 9.0 device with D = 64 or 128 and
 *              no group sums, straight into the row scoring's split
 *              operands: pool_splits)
 *   group sum  score_sm80.cu: with per_kv_head and a group > 1 only, the
 *              fp32 sum of each group's pooled Q rows (the scoring's A)
 *   score      scores[slice, i, j] = scale * sum_d A[i, d] * pooled_k[j, d],
 *              128 x 128 tiles, with one extra CTA (the first) that fills
 *              the row table. On a 9.0 device (unless the backend forces
 *              SK_BACKEND_CUDA_SM80) a Hopper kernel, fp32-accurate but not
 *              the fmaf chain bit for bit: with head_dim <= 128
 *              score_rows_sm90.cu (K split once into fp16 hi/lo with a
 *              power-of-two scale per row, a CTA per 128 rows walking its
 *              column tiles), else score_sm90.cu (wgmma with the 3xTF32
 *              split, a CTA per tile). Else score_sm80.cu (fp32 SIMT FMA).
 *              A score that comes out inf or NaN (a pooled entry not
 *              finite) gets the fp32 value, per head and then summed over
 *              the group (topk_nonfinite_score): what the split's hi * lo
 *              terms or the group's summed rows would lose (inf * 0,
 *              inf - inf). Rows holding such an entry are marked by a split
 *              factor of 0 (split_row_factor), so the Hopper row scoring
 *              handles them on its general epilogue only.
 *   row table  select.cu (sk_layout_from_scores only: else the scoring's
 *              first CTA fills it)
 *   select     select.cu: the register selection (k <= 32, at most 2048 key
 *              blocks), which also places each row; else the general kernel
 *   place      place.cu: the last row offset, or the compaction
 * On a 9.0 device every kernel after the first is launched with
 * programmatic stream serialization (kernels.cuh, pdl_enter), so it is
 * scheduled while its predecessor drains.
 *
 * Workspace of sk_select_topk (sk_cuda_topk_workspace_size):
 *   [0, scores)          fp32 block scores [slices, row_blocks, col_blocks]
 *                        (with causal, blocks past a row's candidates may
 *                        be left unwritten); left there after the call,
 *                        which the GPU tests read
 *   then, 256-aligned    per_kv_head with a group > 1 only: fp32 group sums
 *                        of the pooled Q [slices, row_blocks, D]
 *   then, 256-aligned    int32 counts [total_rows]
 *   then, 256-aligned    int32 scratch [total_rows, row_cap]
 *   then, 256-aligned    the row table: int32x4 rules [row_blocks]
 *                        {n_cand, sink_end, local_lo, local_hi},
 *   then, 256-aligned    int32x2 places [row_blocks] {first entry of the
 *                        row within its slice when every row fills its
 *                        bound, bound},
 *   then, 256-aligned    int32 short-row flag
 *   then                 (head_dim <= 128) the Hopper row scoring's split K
 *                        tiles and row exponents (kernels.cuh)
 * sk_layout_from_scores needs the regions from the counts on, from offset 0.
 * sk_pool_select_topk's workspace (sk_cuda_topk_pool_select_workspace_size)
 * is that of sk_select_topk followed by one region, 256-aligned, that holds
 * either the split Q tiles and their row exponents (written by the pooling
 * when it splits) or the fp32 pooled Q and K (written when it does not).
 * There, the blocks outside the score span (sk_topk_score_span) are zeros,
 * and so are the scores that depend on them.
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda/backend.h"
#include "cuda/common/cuda_check.cuh"
#include "cuda/topk/kernels.cuh"

enum { WS_ALIGN = 256 };

static size_t align_up(size_t x) { return (x + WS_ALIGN - 1) / WS_ALIGN * WS_ALIGN; }

/* Byte offsets of the workspace regions (see the file header). */
typedef struct ws_layout {
    size_t scores_off, qsum_off, counts_off, scratch_off, rule_off, place_off, flag_off;
    size_t k_split_off, k_rows_off;
    size_t q_split_off, q_rows_off, pooled_q_off, pooled_k_off; /* sk_pool_select_topk only */
    size_t total;
} ws_layout;

/* The Hopper row scoring (head_dim <= 128) splits its operands into the
 * workspace; sized whenever that kernel may run (a 9.0 device is only known
 * at the call). */
static int needs_split(const sk_topk_problem *p, int with_scores) {
    return with_scores && p->head_dim <= 128 && p->backend != SK_BACKEND_CUDA_SM80;
}

/* With per_kv_head and a group of more than one head, the group sums of the
 * pooled Q rows (the scoring's A operand, [B, Hkv, row_blocks, D] fp32). */
static int needs_qsum(const sk_topk_problem *p, int with_scores) {
    return with_scores && p->per_kv_head && p->group > 1;
}

/* sk_pool_select_topk hands the pooling the split of both operands when
 * the row scoring runs without group sums and D / 8 threads hold a whole
 * split row (D = 64 or 128); else it pools into fp32 and selects as
 * sk_select_topk does. */
static int pool_splits(const sk_topk_problem *p, int hopper) {
    return hopper && needs_split(p, 1) && !needs_qsum(p, 1) && p->head_dim % ROWS_CHUNK == 0;
}

/* with_pool: sk_pool_select_topk's workspace, the selection's (with scores)
 * followed by one region that holds either the split Q tiles and their
 * exponents (a pooling that splits, pool_splits) or the fp32 pooled Q and K
 * (one that does not): a call uses one of the two, never both. */
static ws_layout workspace_layout(const sk_topk_problem *p, int with_scores, int with_pool) {
    ws_layout w;
    w.scores_off = 0;
    const size_t scores = with_scores ? align_up((size_t)p->total_rows * p->col_blocks * 4) : 0;
    w.qsum_off = scores;
    const size_t qsum =
        needs_qsum(p, with_scores) ? align_up((size_t)p->total_rows * (size_t)p->head_dim * 4) : 0;
    w.counts_off = w.qsum_off + qsum;
    w.scratch_off = w.counts_off + align_up((size_t)p->total_rows * 4);
    w.rule_off = w.scratch_off + align_up((size_t)p->total_rows * (size_t)p->row_cap * 4);
    w.place_off = w.rule_off + align_up((size_t)p->row_blocks * 16);
    w.flag_off = w.place_off + align_up((size_t)p->row_blocks * 8);
    const int split = needs_split(p, with_scores);
    const size_t k_tiles =
        split ? (size_t)(p->batch * p->heads_kv) * (size_t)((p->col_blocks + SC_TN - 1) / SC_TN) : 0;
    const size_t tile_bytes = split_tile_bytes(split_chunks(p->head_dim));
    w.k_split_off = w.flag_off + WS_ALIGN;
    w.k_rows_off = w.k_split_off + k_tiles * tile_bytes;
    w.total = w.k_rows_off + k_tiles * SC_TN * 4;
    w.q_split_off = w.q_rows_off = w.pooled_q_off = w.pooled_k_off = w.total;
    if (with_pool) {
        const size_t q_tiles =
            split ? (size_t)p->slices * (size_t)((p->row_blocks + SC_TM - 1) / SC_TM) : 0;
        w.q_split_off = align_up(w.total);
        w.q_rows_off = w.q_split_off + q_tiles * tile_bytes;
        const size_t split_end = w.q_rows_off + q_tiles * SC_TM * 4;
        w.pooled_q_off = w.q_split_off;
        w.pooled_k_off =
            w.pooled_q_off + align_up((size_t)(p->batch * p->heads_q * p->row_blocks) *
                                      (size_t)p->head_dim * 4);
        const size_t pooled_end = w.pooled_k_off + (size_t)(p->batch * p->heads_kv *
                                                            p->col_blocks) *
                                                       (size_t)p->head_dim * 4;
        w.total = split_end > pooled_end ? split_end : pooled_end;
    }
    return w;
}

/* The row scoring's split operands in the workspace; with presplit, the
 * pooling's Q tiles too (workspace_layout with_pool). */
static split_operands split_at(const sk_topk_problem *p, char *base, const ws_layout *w,
                               int presplit) {
    split_operands so;
    so.k_tiles = base + w->k_split_off;
    so.k_exp = (int32_t *)(base + w->k_rows_off);
    so.q_tiles = presplit ? base + w->q_split_off : NULL;
    so.q_exp = presplit ? (int32_t *)(base + w->q_rows_off) : NULL;
    so.chunks = split_chunks(p->head_dim);
    return so;
}

/* The device checks (sk_cuda_check_arch: 8.0 or later, 9.0 when the backend
 * forces the Hopper kernels). *hopper: score with the Hopper kernel (a 9.0
 * device, unless the backend forces the portable kernels). */
static sk_status check_device(sk_backend backend, int *hopper) {
    SK_TRY(sk_cuda_check_arch(backend, hopper));
    if (backend == SK_BACKEND_CUDA_SM80) *hopper = 0;
    return SK_STATUS_SUCCESS;
}

extern "C" sk_status sk_cuda_topk_workspace_size(const sk_topk_problem *p, int with_scores,
                                                 size_t *bytes) {
    *bytes = workspace_layout(p, with_scores, 0).total;
    return SK_STATUS_SUCCESS;
}

extern "C" sk_status sk_cuda_topk_pool_select_workspace_size(const sk_topk_problem *p,
                                                             size_t *bytes) {
    *bytes = workspace_layout(p, 1, 1).total;
    return SK_STATUS_SUCCESS;
}

extern "C" sk_status sk_cuda_topk_pool(const sk_topk_problem *p, cudaStream_t stream) {
    int hopper;
    SK_TRY(check_device(p->backend, &hopper));
    return sk_topk_launch_pool(p, NULL, 0, stream);
}

static sk_status check_workspace_size(size_t workspace_size, const ws_layout *w) {
    if (workspace_size < w->total)
        return sk_error(SK_STATUS_BAD_PARAM_WORKSPACE,
                        "workspace_size = %zu is less than the %zu bytes needed", workspace_size,
                        w->total);
    return SK_STATUS_SUCCESS;
}

/* The selection chain after the pooling (or from p->scores), regions of w
 * in `base`. presplit: the pooling wrote both split operands (pool_splits). */
static sk_status select_chain(const sk_topk_problem *p, char *base, ws_layout w, int hopper,
                              int presplit, cudaStream_t stream) {
    const int with_scores = p->pooled_q != NULL;
    int32_t *counts = (int32_t *)(base + w.counts_off);
    int32_t *scratch = (int32_t *)(base + w.scratch_off);
    row_table table;
    table.rule = (int4 *)(base + w.rule_off);
    table.place = (int2 *)(base + w.place_off);
    table.flag = (int32_t *)(base + w.flag_off);
    /* The register selection takes every row (k <= 32, at most 2048 key
     * blocks) and then places the rows by the row table; else the general
     * selection kernel and the compaction. */
    const int reg = sk_topk_select_in_registers(p);
    const float *scores = p->scores;
    if (with_scores) {
        score_params sp = score_params{};
        sp.p = *p;
        sp.table = table;
        sp.a = p->pooled_q;
        sp.a_slice_stride = (int64_t)p->row_blocks * p->head_dim;
        sp.pooled_k = p->pooled_k;
        sp.scores = (float *)(base + w.scores_off);
        sp.tiles_i = (p->row_blocks + SC_TM - 1) / SC_TM;
        sp.tiles_j = (p->col_blocks + SC_TN - 1) / SC_TN;
        if (needs_qsum(p, with_scores)) {
            float *qsum = (float *)(base + w.qsum_off);
            SK_TRY(sk_topk_launch_group_sum(p, qsum, hopper, stream));
            sp.a = qsum;
        }
        /* <= the dense tile count (sk_grid_check), plus the row-table CTA */
        const int64_t tiles = (int64_t)p->slices * sp.tiles_i * sp.tiles_j;
        sp.tiles = (int32_t)tiles;
        if (hopper && needs_split(p, with_scores)) {
            sp.split = split_at(p, base, &w, presplit);
            SK_TRY(sk_topk_score_rows_sm90(&sp, stream));
        } else if (hopper) {
            SK_TRY(sk_topk_score_sm90(&sp, stream));
        } else {
            SK_TRY(sk_topk_score_sm80(&sp, stream));
        }
        scores = sp.scores;
    } else if (reg) {
        SK_TRY(sk_topk_launch_row_table(p, &table, hopper, stream));
    }
    SK_TRY(sk_topk_launch_select(p, scores, counts, scratch, &table, hopper, stream));
    return sk_topk_launch_place(p, counts, scratch, &table, !reg, hopper, stream);
}

extern "C" sk_status sk_cuda_topk_select(const sk_topk_problem *p, void *workspace,
                                         size_t workspace_size, cudaStream_t stream) {
    int hopper;
    SK_TRY(check_device(p->backend, &hopper));
    const ws_layout w = workspace_layout(p, p->pooled_q != NULL, 0);
    SK_TRY(check_workspace_size(workspace_size, &w));
    return select_chain(p, (char *)workspace, w, hopper, 0, stream);
}

extern "C" sk_status sk_cuda_topk_pool_select(const sk_topk_problem *p, void *workspace,
                                              size_t workspace_size, cudaStream_t stream) {
    int hopper;
    SK_TRY(check_device(p->backend, &hopper));
    const ws_layout w = workspace_layout(p, 1, 1);
    SK_TRY(check_workspace_size(workspace_size, &w));
    char *base = (char *)workspace;
    sk_topk_problem q = *p;
    q.pooled_q_out = (float *)(base + w.pooled_q_off);
    q.pooled_k_out = (float *)(base + w.pooled_k_off);
    q.pooled_q = q.pooled_q_out; /* (not written when the pooling splits) */
    q.pooled_k = q.pooled_k_out;
    const int presplit = pool_splits(p, hopper);
    if (presplit) {
        const split_operands so = split_at(p, base, &w, 1);
        SK_TRY(sk_topk_launch_pool(&q, &so, 1, stream));
    } else {
        SK_TRY(sk_topk_launch_pool(&q, NULL, 1, stream));
    }
    return select_chain(&q, base, w, hopper, presplit, stream);
}
