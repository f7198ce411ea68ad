/*
 * schedule.h - the longest-first tile order that the attention and BSR GEMM
 * plans write into their workspace (schedule.cu), with no host
 * synchronisation and no allocation.
 *
 * A "tile" is one layout row read by one unit of work: for attention, one
 * (batch, query head, query block); for the GEMM, one block row of A (the
 * GEMM kernels then split it over N themselves). Three small kernels sort
 * the tiles by their number of visited entries (plan_contract.cuh's
 * visiting rule), longest first, ties in tile-id order: a stable counting
 * sort, integer only, so the order is the same on every run. Keys are
 * capped at SK_SCHED_KEY_CAP blocks (longer rows tie, in tile-id order).
 *
 * L2 groups. Longest-first over the whole problem puts the same row of
 * every (batch, head) side by side (a causal layout: every head's last row
 * first), so the CTAs that run at once read as many heads' K/V as there
 * are SMs, far more than the L2 holds. The tiles are therefore cut into
 * groups of group_tiles consecutive tile ids (whole (batch, head) slices,
 * chosen by the caller so that a group's K/V fits a share of the L2), and
 * sorted longest-first within each group; groups follow in tile-id order.
 * One group (group_tiles = 0) is the plain longest-first order.
 *   1. count    one thread per tile: clamp the layout row, count the visited
 *               entries, key = min(count, cap); one CTA per segment (up to
 *               1024 tiles of one group) builds that segment's histogram.
 *   2. offsets  one CTA per group: per key, the exclusive prefix over the
 *               group's segments, plus the number of the group's tiles with
 *               a larger key (descending order), plus the group's start.
 *   3. scatter  one thread per tile: its rank among equal keys earlier in
 *               its segment gives its slot; writes tile_order[slot] and
 *               tile_info[slot] = {tile, first visited entry, end, its column}.
 */
#ifndef SK_CUDA_SCHEDULE_H
#define SK_CUDA_SCHEDULE_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

#include "core/problem.h"

/* Which layout rows the tiles read, and the visiting rule's inputs. Tile t
 * reads layout row slice(b, h) * row_blocks + i with i = t % row_blocks,
 * h = (t / row_blocks) % heads_q, b = t / (row_blocks * heads_q). */
typedef struct sk_schedule_geometry {
    const int32_t *row_offsets, *col_indices; /* device */
    int32_t nnz;
    int64_t tiles; /* batch * heads_q * row_blocks */
    int32_t row_blocks, col_blocks, heads_q;
    int32_t layout_batch, layout_heads, head_div;
    int32_t block_q, block_k, seq_q, seq_k, causal; /* causal = 0: every in-range column visits */
    int64_t group_tiles; /* tiles per L2 group (a multiple of row_blocks); 0: one group */
} sk_schedule_geometry;

/* Byte offsets of the workspace parts from the aligned base
 * (plan_contract.cuh lists them), and the total with alignment slack. */
typedef struct sk_plan_layout {
    size_t counter, order, info, keys, hist, total;
    int32_t tiles, segs, bins;
    int32_t group_tiles, groups, group_segs; /* tiles per group, groups, segments per group */
} sk_plan_layout;

/* Workspace parts for g's tiles; SK_STATUS_NOT_SUPPORTED beyond 2^31 - 1 tiles. */
sk_status sk_schedule_layout_of(const sk_schedule_geometry *g, sk_plan_layout *w);

/* SK_STATUS_BAD_PARAM_WORKSPACE unless the caller's workspace is non-NULL
 * and holds w->total bytes; size_fn names the public call that sizes it. */
sk_status sk_schedule_check_workspace(const sk_plan_layout *w, const void *workspace,
                                      size_t workspace_size, const char *size_fn);

/* The caller's workspace pointer rounded up to the part alignment. */
char *sk_schedule_base(void *workspace);

/* How big an L2 group is (issue 28's measurements on an H100, in
 * docs/perf/hopper.md): its KV heads' K/V fits SK_SCHED_L2_BUDGET bytes,
 * but it holds at least SK_SCHED_MIN_GROUP_SLICES query heads, so that the
 * ~132 CTAs running at once spread over several heads instead of all
 * reading the same K/V blocks at the same moment (one or two heads per
 * group ran slower at S = 32K, though they read the least DRAM). The
 * budget is above half the 50 MB L2 because a causal group's tiles do not
 * all read all of their K/V at once; 24, 36 and 48 MB were tried. Constants,
 * not device queries, so that workspace size and plan depend on the problem
 * alone. */
enum {
    SK_SCHED_L2_BUDGET = 36 << 20,
    SK_SCHED_MIN_GROUP_SLICES = 8
};

/* Tiles per L2 group for an attention-like problem whose slices of
 * row_blocks tiles each read kv_bytes_per_slice bytes of K/V, with `share`
 * consecutive slices reading the same K/V (GQA group): whole KV heads
 * whose K/V fits SK_SCHED_L2_BUDGET, as few groups as that allows, of
 * near-equal size. 0 (one group) when all fit. */
int64_t sk_schedule_l2_group_tiles(int64_t slices, int32_t row_blocks, int64_t share,
                                   int64_t kv_bytes_per_slice);

/* Enqueue the three sort kernels on the stream (the base from sk_schedule_base). */
sk_status sk_schedule_enqueue(const sk_schedule_geometry *g, const sk_plan_layout *w, char *base,
                              cudaStream_t stream);

#endif /* SK_CUDA_SCHEDULE_H */
