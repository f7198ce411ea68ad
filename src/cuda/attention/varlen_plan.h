/*
 * varlen_plan.h - the GPU plan of the varlen and paged attention forwards
 * (varlen_plan.cu): what the plan writes into the workspace, and exactly
 * what a kernel reads from it. The sm80 kernels (fwd_sm80*.cuh in varlen
 * mode) and the Hopper varlen kernel read only what this header states;
 * docs/perf/varlen_paged.md says why it is built this way.
 *
 * Graph safe: the workspace size and every part's offset come from
 * capacities only (B, R = the layout's block rows per slice, Hq, the
 * layout's cols); the plan reads the length arrays on the device only
 * (five small kernels, no host synchronisation, no allocation), so one
 * captured plan + run serves every length array within the capacities.
 *
 * Tiles. Tile id t = h * R + r: query head h in [0, Hq), layout row r in
 * [0, R) of head h's slice, i.e. the fixed forward's tile id with batch 1
 * and row_blocks = R (kernels.h). Hq * R tile ids, of which Hq * P are
 * "present", P = min(row_start(B), R): rows r >= P map to no sequence.
 *
 * Workspace (from the caller's pointer rounded up to 256 bytes, then each
 * part 256-byte aligned; byte offsets in sk_varlen_plan_layout):
 *
 *   counter    int32 [1]     the persistent kernels' tile counter. The RUN
 *                            zeroes it on the stream before each launch.
 *   seqs       int4  [B]     per sequence b, clamped so that every read
 *                            stays inside the tensors whatever the arrays
 *                            hold: {q0, len_q, k0, len_k}
 *                              q0    = clamp(cu_seqlens_q[b], 0, total_q)
 *                              len_q = min(clamp(cu_seqlens_q[b + 1], q0,
 *                                      total_q) - q0, max_seqlen_q)
 *                              varlen: k0, len_k likewise from cu_seqlens_k
 *                                      (total_k, max_seqlen_k)
 *                              paged:  k0 = 0, len_k = clamp(seq_lens_k[b],
 *                                      0, max_seqlen_k) (<= max_pages x
 *                                      page_size: the host checked that)
 *                            so q0 + len_q <= total_q, k0 + len_k <= total_k.
 *   row_start  int32 [B + 1] exclusive prefix sum of nb_q(b) = ceil(len_q(b)
 *                            / block_q), saturated at R: row_start[B] = P.
 *   rows       int2  [R]     the row table: rows[r] = {b, i} (sequence b,
 *                            its query block i: tokens q0 + i * block_q ..
 *                            min(q0 + (i + 1) * block_q, q0 + len_q) - 1)
 *                            for r < P; {-1, -1} for r >= P (absent).
 *                            0 <= i < nb_q(b) for every present row.
 *   tile_order int32 [Hq * R] tile ids in run order; -1 for the absent
 *                            entries, which are all at the end (slots
 *                            [Hq * P, Hq * R)).
 *   tile_info  int4  [Hq * R] per slot, as the fixed forward's
 *                            (plan_contract.cuh): {t, first visited entry,
 *                            end of the row's entries, column of the first
 *                            visited entry (-1: none, the tile is empty)};
 *                            absent slots {-1, 0, 0, -1}. A kernel that
 *                            takes slots in order through the counter may
 *                            stop at the first x = -1: nothing follows.
 *   keys, hist                plan scratch (never read by a run).
 *   col_start  int32 [B + 1] (the backward's plan only, after
 *                            sk_varlen_plan_add_cols; absent in the
 *                            forward's) exclusive prefix sum of nb_k(b) =
 *                            ceil(len_k(b) / block_k), saturated at
 *                            col_cap = ceil(total_k / block_k) + B (a bound
 *                            on the sum for valid lengths): the backward's
 *                            key tiles numbered over all sequences.
 *   cols       int2  [col_cap] the column table, as rows: cols[c] = {b, j}
 *                            (sequence b, its key block j) for c <
 *                            col_start[B]; {-1, -1} past it.
 *
 * The order: the tile ids are cut into L2 groups of whole query heads (as
 * the fixed forward, common/schedule.h: a group's KV heads fit a share of
 * L2), groups in head order; within a group, present tiles longest first
 * (most visited blocks, capped at SK_SCHED_KEY_CAP), ties in tile-id order.
 * Group g of heads [h0, h1) fills slots [h0 * P, h1 * P). Integer only:
 * the same order on every run.
 *
 * The visiting rule a kernel must apply (the plan's counts and first
 * entries use it): tile t's layout row g = slice(h) * R + r, slice(h) =
 * (layout_heads == 1 ? 0 : h / head_div), entries [start, end) clamped as
 * plan_contract.cuh's sk_sched_tile_row (batch 1, row_blocks = R). An entry
 * with column c is visited iff 0 <= c < min(col_blocks, nb_k(b)), nb_k(b) =
 * ceil(len_k(b) / block_k), and, when causal, c * block_k <= kmax with
 * kmax = min((i + 1) * block_q, len_q) - 1 + len_k - len_q (bottom-right
 * per sequence: key k visible to query q of the sequence iff k <= q +
 * len_k - len_q). Keys at or past len_k are masked (and, as the packed
 * tensors continue with the next sequence's tokens, never loaded: zero
 * filled). Outputs: O rows q0 + i * block_q + q (q < len_q - i * block_q)
 * of head h; LSE at lse[h * total_q + q0 + i * block_q + q].
 *
 * A kernel's tile prologue therefore reads tile_info[slot] (t, entries),
 * rows[t % R] and seqs[rows[t % R].x]: two dependent 8- and 16-byte loads
 * after the slot's entry.
 */
#ifndef SK_CUDA_ATTENTION_VARLEN_PLAN_H
#define SK_CUDA_ATTENTION_VARLEN_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

#include "core/problem.h"

/* Byte offsets of the parts from the aligned base, and the sizes. */
typedef struct sk_varlen_plan_layout {
    size_t counter, seqs, row_start, rows, order, info, keys, hist, total;
    int32_t batch, row_blocks, heads_q, tiles; /* B, R, Hq, Hq * R */
    int32_t segs, bins, group_tiles, groups, group_segs;
    size_t col_start, cols; /* the backward's column parts (col_cap > 0) */
    int32_t col_cap;        /* 0: none (the forward) */
} sk_varlen_plan_layout;

/* What a kernel reads (pointers into the workspace; see above). */
typedef struct sk_varlen_plan_view {
    int32_t *tile_counter;
    const int32_t *tile_order; /* [tiles] */
    const int4 *tile_info;     /* [tiles] */
    const int4 *seqs;          /* [batch] {q0, len_q, k0, len_k} */
    const int32_t *row_start;  /* [batch + 1] */
    const int2 *rows;          /* [row_blocks] {b, i} or {-1, -1} */
    int32_t batch, row_blocks, num_tiles;
    const int32_t *col_start;  /* [batch + 1]; NULL without the column parts */
    const int2 *cols;          /* [col_cap] {b, j} or {-1, -1}; NULL likewise */
    int32_t col_cap;
} sk_varlen_plan_view;

/* The plan's inputs: the checked problem and, for paged, seq_lens_k
 * (cu_seqlens_k is then NULL). */
typedef struct sk_varlen_plan_source {
    const sk_attention_varlen_problem *v;
    const int32_t *seq_lens_k; /* paged: [B]; varlen: NULL */
} sk_varlen_plan_source;

/* The workspace parts for this problem (capacities only). */
sk_status sk_varlen_plan_layout_of(const sk_attention_varlen_problem *v, sk_varlen_plan_layout *w);

/* Append the backward's column parts (col_start, cols) to w: the plan then
 * writes them too (varlen only: the paged forward has no backward). */
sk_status sk_varlen_plan_add_cols(const sk_attention_varlen_problem *v, sk_varlen_plan_layout *w);

/* The kernel's view of a planned workspace (base from sk_schedule_base). */
sk_varlen_plan_view sk_varlen_plan_view_of(const sk_varlen_plan_layout *w, char *base);

/* Enqueue the plan's kernels on the stream. */
sk_status sk_varlen_plan_enqueue(const sk_varlen_plan_source *src, const sk_varlen_plan_layout *w,
                                 char *base, cudaStream_t stream);

#endif /* SK_CUDA_ATTENTION_VARLEN_PLAN_H */
