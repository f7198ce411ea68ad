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
 *   1. count    one thread per tile: clamp the layout row, count the visited
 *               entries, key = min(count, cap); one CTA per segment of 1024
 *               tiles builds that segment's histogram of keys.
 *   2. offsets  one CTA: per key, the exclusive prefix over segments, plus
 *               the number of tiles with a larger key (descending order).
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
} sk_schedule_geometry;

/* Byte offsets of the workspace parts from the aligned base
 * (plan_contract.cuh lists them), and the total with alignment slack. */
typedef struct sk_plan_layout {
    size_t counter, order, info, keys, hist, total;
    int32_t tiles, segs, bins;
} sk_plan_layout;

/* Workspace parts for g's tiles; SK_STATUS_NOT_SUPPORTED beyond 2^31 - 1 tiles. */
sk_status sk_schedule_layout_of(const sk_schedule_geometry *g, sk_plan_layout *w);

/* SK_STATUS_BAD_PARAM_WORKSPACE unless the caller's workspace is non-NULL
 * and holds w->total bytes; size_fn names the public call that sizes it. */
sk_status sk_schedule_check_workspace(const sk_plan_layout *w, const void *workspace,
                                      size_t workspace_size, const char *size_fn);

/* The caller's workspace pointer rounded up to the part alignment. */
char *sk_schedule_base(void *workspace);

/* Enqueue the three sort kernels on the stream (the base from sk_schedule_base). */
sk_status sk_schedule_enqueue(const sk_schedule_geometry *g, const sk_plan_layout *w, char *base,
                              cudaStream_t stream);

#endif /* SK_CUDA_SCHEDULE_H */
