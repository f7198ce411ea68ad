/*
 * plan_contract.cuh - what a plan (schedule.cu, run by the attention and
 * the BSR GEMM dispatch: attention/fwd.cu, gemm/gemm.cu) and the kernels
 * that read it must agree on: the workspace layout, the per-tile
 * information the plan precomputes, and the rule that says which selected
 * blocks a tile really visits. The GEMM reads the same parts with one tile
 * per block row of A (gemm/kernels.h); below, "tile" is the attention's.
 *
 * Workspace (every part 256-byte aligned; the caller's pointer is rounded
 * up to 256 first, and the size includes that slack):
 *   counter     int32            tile counter of the persistent kernels
 *   tile_order  int32 [tiles]    tile ids, longest rows first (attention/kernels.h)
 *   tile_info   int4  [tiles]    per slot: {tile id, first position, end, first column}
 *   keys        int32 [tiles]    plan scratch: sort key of each tile
 *   hist        int32 [segs, bins] plan scratch: per-segment histograms / offsets
 * Only counter, tile_order and tile_info are read by the run.
 *
 * Visiting rule (robustness, sparsek.h): a tile's layout row g reads
 * col_indices[start, end) with start = clamp(row_offsets[g], 0, nnz) and
 * end = max(start, clamp(row_offsets[g + 1], 0, nnz)). An entry is visited
 * iff its column is in [0, col_blocks) and, when causal, the block holds at
 * least one visible key for the tile's last query row (col * bk <= kmax,
 * kmax = min((i + 1) * bq, Sq) - 1 + Sk - Sq). Other entries are skipped:
 * out-of-range ones as if absent, fully masked ones because they would
 * contribute nothing. A tile with no visited entry is "empty".
 */
#ifndef SK_CUDA_PLAN_CONTRACT_CUH
#define SK_CUDA_PLAN_CONTRACT_CUH

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

#include "core/problem.h"

enum {
    SK_SCHED_ALIGN = 256,      /* bytes; alignment of each workspace part */
    SK_SCHED_SEGMENT = 1024,   /* tiles per plan segment (one CTA of the sort) */
    SK_SCHED_KEY_CAP = 1023,   /* sort keys (visited block counts) are capped here */
    SK_SCHED_MAX_BINS = SK_SCHED_KEY_CAP + 1
};

static inline size_t sk_sched_align(size_t bytes) {
    return (bytes + SK_SCHED_ALIGN - 1) / SK_SCHED_ALIGN * SK_SCHED_ALIGN;
}

/* The layout row of tile t and its clamped entry range [*start, *end). */
__device__ __forceinline__ void sk_sched_tile_row(int32_t t, int32_t row_blocks, int32_t heads_q,
                                                  int32_t layout_batch, int32_t layout_heads,
                                                  int32_t head_div, const int32_t *row_offsets,
                                                  int32_t nnz, int32_t *start, int32_t *end) {
    const int32_t i = t % row_blocks, bh = t / row_blocks;
    const int32_t h = bh % heads_q, b = bh / heads_q;
    const int32_t slice = (layout_batch == 1 ? 0 : b) * layout_heads + h / head_div;
    const int32_t g = slice * row_blocks + i;
    int32_t a = __ldg(row_offsets + g), e = __ldg(row_offsets + g + 1);
    a = min(max(a, 0), nnz);
    e = max(min(max(e, 0), nnz), a);
    *start = a;
    *end = e;
}

/* The largest key index any query row of tile row i may see (causal). */
__device__ __forceinline__ int32_t sk_sched_kmax(int32_t i, int32_t block_q, int32_t seq_q,
                                                 int32_t seq_k) {
    return min((i + 1) * block_q, seq_q) - 1 + (seq_k - seq_q);
}

/* Whether a selected column is visited (see the rule above). */
__device__ __forceinline__ bool sk_sched_visit(int32_t col, int32_t col_blocks, int32_t causal,
                                               int32_t block_k, int32_t kmax) {
    return (uint32_t)col < (uint32_t)col_blocks && (!causal || col * block_k <= kmax);
}

#endif /* SK_CUDA_PLAN_CONTRACT_CUH */
