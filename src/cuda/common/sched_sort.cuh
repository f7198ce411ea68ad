/*
 * sched_sort.cuh - the pieces of the plans' stable counting sort (longest
 * rows first within L2 groups) that the fixed-batch schedule
 * (schedule.cu) and the varlen plan (attention/varlen_plan.cu) share: the
 * tiles of a segment, the per-segment histogram, the per-group offsets in
 * descending key order, the rank of a tile among equal keys of its
 * segment, and a row's first visited entry. schedule.h describes the
 * three passes; each plan supplies its own rows, keys and group bases.
 */
#ifndef SK_CUDA_SCHED_SORT_CUH
#define SK_CUDA_SCHED_SORT_CUH

#include <stdint.h>

#include "cuda/common/plan_contract.cuh"

enum { SK_SORT_SCAN_UNROLL = 4 };

/* Tile of thread x of segment seg (segments are numbered group by group:
 * group_segs per group of group_tiles tiles), or -1 past the end of its
 * group or of the num_tiles tiles. */
__device__ __forceinline__ int32_t sk_sort_segment_tile(int32_t seg, int32_t x, int32_t group_segs,
                                                        int32_t group_tiles, int32_t num_tiles) {
    const int32_t grp = seg / group_segs;
    const int32_t local = (seg - grp * group_segs) * SK_SCHED_SEGMENT + x;
    const int64_t t = (int64_t)grp * group_tiles + local;
    return local < group_tiles && t < num_tiles ? (int32_t)t : -1;
}

/* The CTA's shared histogram of bins keys, zeroed (all threads; a barrier
 * follows). */
__device__ __forceinline__ void sk_sort_hist_zero(int32_t *hist, int32_t bins) {
    for (int b = threadIdx.x; b < bins; b += blockDim.x) hist[b] = 0;
    __syncthreads();
}

/* After every tile's atomicAdd: the histogram to hist_out (this segment's
 * row of [segs, bins]). */
__device__ __forceinline__ void sk_sort_hist_store(const int32_t *hist, int32_t bins,
                                                   int32_t *hist_out) {
    __syncthreads();
    for (int b = threadIdx.x; b < bins; b += blockDim.x) hist_out[b] = hist[b];
}

/* One CTA per group (blockDim.x >= bins): hist[seg][key] becomes the first
 * slot of that segment's tiles with that key, keys in descending order
 * within the group, from group_base on. */
__device__ __forceinline__ void sk_sort_group_offsets(int32_t *hist, int32_t bins, int32_t seg0,
                                                      int32_t group_segs, int32_t group_base) {
    __shared__ int32_t total[SK_SCHED_MAX_BINS];
    __shared__ int32_t scan[2][SK_SCHED_MAX_BINS];
    const int b = threadIdx.x;
    const int32_t seg_end = seg0 + group_segs;
    int32_t run = 0;
    if (b < bins) {
        int32_t seg = seg0;
        for (; seg + SK_SORT_SCAN_UNROLL <= seg_end; seg += SK_SORT_SCAN_UNROLL) {
            int32_t v[SK_SORT_SCAN_UNROLL];
#pragma unroll
            for (int u = 0; u < SK_SORT_SCAN_UNROLL; ++u) v[u] = hist[(size_t)(seg + u) * bins + b];
#pragma unroll
            for (int u = 0; u < SK_SORT_SCAN_UNROLL; ++u) {
                hist[(size_t)(seg + u) * bins + b] = run;
                run += v[u];
            }
        }
        for (; seg < seg_end; ++seg) {
            const int32_t v = hist[(size_t)seg * bins + b];
            hist[(size_t)seg * bins + b] = run;
            run += v;
        }
        total[b] = run;
    }
    /* Inclusive scan of the totals in descending key order (Hillis-Steele):
     * scan[r] over r = bins - 1 - key. */
    const int r = b;
    int cur = 0;
    scan[0][r] = 0;
    __syncthreads();
    if (r < bins) scan[0][r] = total[bins - 1 - r];
    __syncthreads();
    for (int off = 1; off < SK_SCHED_MAX_BINS; off *= 2) {
        const int32_t x = scan[cur][r] + (r >= off ? scan[cur][r - off] : 0);
        scan[cur ^ 1][r] = x;
        cur ^= 1;
        __syncthreads();
    }
    if (b < bins) {
        /* The groups before this one, then this group's tiles with a larger key. */
        const int32_t base = group_base + scan[cur][bins - 1 - b] - total[b];
        for (int32_t seg = seg0; seg < seg_end; ++seg) hist[(size_t)seg * bins + b] += base;
    }
}

/* The rank of this thread's key among equal keys of the threads before it
 * in the CTA (keys: every thread's key in shared memory, stored before a
 * barrier). */
__device__ __forceinline__ int32_t sk_sort_rank(const int32_t *keys, int32_t key) {
    int32_t rank = 0;
    for (int j = 0; j < (int)threadIdx.x; ++j) rank += keys[j] == key;
    return rank;
}

/* The first visited entry of col_indices[start, end) (plan_contract.cuh's
 * rule with the column bound cols) and its column; end and -1 if none. */
__device__ __forceinline__ int2 sk_sort_first_visit(const int32_t *col_indices, int32_t start,
                                                    int32_t end, int32_t cols, int32_t causal,
                                                    int32_t block_k, int32_t kmax) {
    for (int32_t e = start; e < end; ++e) {
        const int32_t c = __ldg(col_indices + e);
        if (sk_sched_visit(c, cols, causal, block_k, kmax)) return make_int2(e, c);
    }
    return make_int2(end, -1);
}

#endif /* SK_CUDA_SCHED_SORT_CUH */
