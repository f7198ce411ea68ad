/*
 * varlen_plan.cu - the GPU plan of the varlen and paged attention forwards
 * (varlen_plan.h states the workspace and what kernels read): per-sequence
 * clamped lengths and row starts, the row table, and the longest-first
 * tile order with the absent rows dropped to the end.
 *
 * Five kernels (six with the backward's columns), no host synchronisation:
 *   1. seqs     one CTA: clamp each sequence's lengths (seqs), then the
 *               exclusive prefix sum of nb_q saturated at R (row_start), in
 *               passes of 1024 sequences with a carried total (and, for
 *               the backward, of nb_k saturated at col_cap: col_start).
 *   2. rows     one thread per layout row r: the sequence holding it, by a
 *               binary search of row_start (no scatter, so no write race
 *               and nothing left unwritten when lengths are garbage); the
 *               backward's column table likewise from col_start.
 *   3. count    as schedule.cu's, per segment of 1024 tiles of one L2 group:
 *               the visited entries of each present tile (key), a
 *               per-segment histogram. Absent tiles have no key.
 *   4. offsets  one CTA per group: the first slot of each (segment, key),
 *               keys descending, after the group's base h0 * P.
 *   5. scatter  one thread per tile: present tiles by rank, absent ones
 *               into [Hq * P, Hq * R) in tile-id order.
 * The sort's pieces are the fixed schedule's (common/sched_sort.cuh); the
 * rows' sequences, their visiting limits and the absent rows come from the
 * device arrays, and the group bases depend on P (a device value).
 */
#include <stdint.h>

#include "cuda/attention/varlen_plan.h"
#include "cuda/common/cuda_check.cuh"
#include "cuda/common/plan_contract.cuh"
#include "cuda/common/sched_sort.cuh"
#include "cuda/common/schedule.h"

enum { SK_VPLAN_THREADS = SK_SCHED_SEGMENT, SK_VPLAN_ROW_THREADS = 256 };

typedef struct sk_vplan_params {
    const int32_t *cu_q, *cu_k, *lens_k; /* cu_k (varlen) or lens_k (paged) */
    const int32_t *row_offsets, *col_indices;
    int32_t nnz, batch, rows, heads_q, col_blocks;
    int32_t layout_heads, head_div, block_q, block_k, causal;
    int32_t total_q, total_k, max_q, max_k;
    int32_t num_tiles, bins, group_tiles, group_segs;
    int4 *seqs;
    int32_t *row_start;
    int2 *row_table;
    int32_t *col_start; /* the backward's key columns: NULL in the forward */
    int2 *col_table;
    int32_t col_cap;
    int32_t *keys, *hist, *order;
    int4 *info;
} sk_vplan_params;

sk_status sk_varlen_plan_layout_of(const sk_attention_varlen_problem *v, sk_varlen_plan_layout *w) {
    const sk_attention_problem *f = &v->flat;
    const int64_t tiles = f->heads_q * (int64_t)f->row_blocks;
    if (tiles > INT32_MAX)
        return sk_error(SK_STATUS_NOT_SUPPORTED,
                        "heads_q x layout rows = %lld tiles: the CUDA backend takes at most "
                        "2^31 - 1",
                        (long long)tiles);
    w->batch = v->batch;
    w->row_blocks = f->row_blocks;
    w->heads_q = (int32_t)f->heads_q;
    w->tiles = (int32_t)tiles;
    /* L2 groups of whole query heads, as the fixed forward's: a KV head's
     * K and V are every sequence's keys (varlen) or the cache (paged). */
    const int64_t group = sk_schedule_l2_group_tiles(f->heads_q, f->row_blocks, f->group,
                                                     2 * f->seq_k * f->head_dim * 2);
    w->group_tiles = (int32_t)(group <= 0 || group >= tiles ? tiles : group);
    w->groups = (int32_t)((tiles + w->group_tiles - 1) / w->group_tiles);
    w->group_segs = (w->group_tiles + SK_SCHED_SEGMENT - 1) / SK_SCHED_SEGMENT;
    if ((int64_t)w->groups * w->group_segs > INT32_MAX)
        return sk_error(SK_STATUS_NOT_SUPPORTED,
                        "%lld tiles: too many plan segments for the CUDA backend",
                        (long long)tiles);
    w->segs = w->groups * w->group_segs;
    w->bins = (f->col_blocks < SK_SCHED_KEY_CAP ? f->col_blocks : SK_SCHED_KEY_CAP) + 1;
    const size_t b = (size_t)v->batch, n = (size_t)tiles;
    w->counter = 0;
    w->seqs = w->counter + sk_sched_align(sizeof(int32_t));
    w->row_start = w->seqs + sk_sched_align(b * sizeof(int4));
    w->rows = w->row_start + sk_sched_align((b + 1) * sizeof(int32_t));
    w->order = w->rows + sk_sched_align((size_t)f->row_blocks * sizeof(int2));
    w->info = w->order + sk_sched_align(n * sizeof(int32_t));
    w->keys = w->info + sk_sched_align(n * sizeof(int4));
    w->hist = w->keys + sk_sched_align(n * sizeof(int32_t));
    w->total = w->hist + sk_sched_align((size_t)w->segs * (size_t)w->bins * sizeof(int32_t)) +
               SK_SCHED_ALIGN;
    w->col_start = w->cols = 0;
    w->col_cap = 0;
    return SK_STATUS_SUCCESS;
}

sk_status sk_varlen_plan_add_cols(const sk_attention_varlen_problem *v, sk_varlen_plan_layout *w) {
    const sk_attention_problem *f = &v->flat;
    /* sum over b of ceil(len_k(b) / block_k) < total_k / block_k + B. */
    const int64_t cap = sk_ceil_div_i64(f->seq_k, f->block_k) + v->batch;
    if (cap > INT32_MAX)
        return sk_error(SK_STATUS_NOT_SUPPORTED,
                        "ceil(total_k / block_k) + batch = %lld key blocks: the CUDA backend "
                        "takes at most 2^31 - 1",
                        (long long)cap);
    w->col_cap = (int32_t)cap;
    w->col_start = w->total - SK_SCHED_ALIGN; /* the parts' end, aligned */
    w->cols = w->col_start + sk_sched_align(((size_t)v->batch + 1) * sizeof(int32_t));
    w->total = w->cols + sk_sched_align((size_t)cap * sizeof(int2)) + SK_SCHED_ALIGN;
    return SK_STATUS_SUCCESS;
}

sk_varlen_plan_view sk_varlen_plan_view_of(const sk_varlen_plan_layout *w, char *base) {
    sk_varlen_plan_view s;
    s.tile_counter = (int32_t *)(base + w->counter);
    s.tile_order = (const int32_t *)(base + w->order);
    s.tile_info = (const int4 *)(base + w->info);
    s.seqs = (const int4 *)(base + w->seqs);
    s.row_start = (const int32_t *)(base + w->row_start);
    s.rows = (const int2 *)(base + w->rows);
    s.col_start = w->col_cap > 0 ? (const int32_t *)(base + w->col_start) : NULL;
    s.cols = w->col_cap > 0 ? (const int2 *)(base + w->cols) : NULL;
    s.col_cap = w->col_cap;
    s.batch = w->batch;
    s.row_blocks = w->row_blocks;
    s.num_tiles = w->tiles;
    return s;
}

/* ---------------------------------------------------------------------------
 * 1. Sequences and row starts
 * ------------------------------------------------------------------------- */

/* [start, start + len) of entry b of a cumulative array, clamped. */
__device__ __forceinline__ int2 sk_vplan_span(const int32_t *cu, int32_t b, int32_t total,
                                              int32_t max_len) {
    const int32_t s = min(max(__ldg(cu + b), 0), total);
    const int32_t e = min(max(__ldg(cu + b + 1), s), total);
    return make_int2(s, min(e - s, max_len));
}

/* One pass of an exclusive prefix sum over the CTA (every thread calls it
 * with its term x): the sum of the terms before x, from *carry on,
 * saturated at cap; *carry advances by the pass's total (saturated). */
__device__ __forceinline__ long long sk_vplan_scan_pass(long long x, long long *carry,
                                                        long long cap, long long *warp_sum) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    /* Inclusive scan over the CTA: in the warp, then over warp sums. */
    long long inc = x;
    for (int off = 1; off < 32; off *= 2) {
        const long long y = __shfl_up_sync(0xffffffffu, inc, off);
        if (lane >= off) inc += y;
    }
    if (lane == 31) warp_sum[warp] = inc;
    __syncthreads();
    if (warp == 0) {
        long long s = warp_sum[lane];
        for (int off = 1; off < 32; off *= 2) {
            const long long y = __shfl_up_sync(0xffffffffu, s, off);
            if (lane >= off) s += y;
        }
        warp_sum[lane] = s;
    }
    __syncthreads();
    const long long before = *carry + (warp > 0 ? warp_sum[warp - 1] : 0) + inc - x;
    *carry = min(*carry + warp_sum[SK_VPLAN_THREADS / 32 - 1], cap);
    __syncthreads(); /* warp_sum is rewritten by the next pass */
    return min(before, cap);
}

__global__ void __launch_bounds__(SK_VPLAN_THREADS)
    sk_vplan_seqs_kernel(const __grid_constant__ sk_vplan_params p) {
    __shared__ long long warp_sum[SK_VPLAN_THREADS / 32];
    long long carry = 0, col_carry = 0; /* rows (columns) of the passes before, saturated */
    for (int32_t b0 = 0; b0 < p.batch; b0 += SK_VPLAN_THREADS) {
        const int32_t b = b0 + (int32_t)threadIdx.x;
        long long nb = 0, nk = 0;
        if (b < p.batch) {
            const int2 q = sk_vplan_span(p.cu_q, b, p.total_q, p.max_q);
            int2 k;
            if (p.cu_k != NULL) {
                k = sk_vplan_span(p.cu_k, b, p.total_k, p.max_k);
            } else {
                k = make_int2(0, min(max(__ldg(p.lens_k + b), 0), p.max_k));
            }
            p.seqs[b] = make_int4(q.x, q.y, k.x, k.y);
            nb = ((long long)q.y + p.block_q - 1) / p.block_q;
            nk = ((long long)k.y + p.block_k - 1) / p.block_k;
        }
        const long long before = sk_vplan_scan_pass(nb, &carry, p.rows, warp_sum);
        if (b < p.batch) p.row_start[b] = (int32_t)before;
        if (p.col_start != NULL) { /* CTA-uniform */
            const long long cb = sk_vplan_scan_pass(nk, &col_carry, p.col_cap, warp_sum);
            if (b < p.batch) p.col_start[b] = (int32_t)cb;
        }
    }
    if (threadIdx.x == 0) {
        p.row_start[p.batch] = (int32_t)carry;
        if (p.col_start != NULL) p.col_start[p.batch] = (int32_t)col_carry;
    }
}

/* ---------------------------------------------------------------------------
 * 2. The row table
 * ------------------------------------------------------------------------- */

/* The row table (kCols = false: entry r of [0, R) from row_start) or the
 * backward's column table (kCols: entry c of [0, col_cap) from col_start):
 * {b, r - start[b]} for the sequence b holding r, {-1, -1} past start[B]. */
template <bool kCols>
__global__ void __launch_bounds__(SK_VPLAN_ROW_THREADS)
    sk_vplan_rows_kernel(const __grid_constant__ sk_vplan_params p) {
    const int32_t r = blockIdx.x * SK_VPLAN_ROW_THREADS + threadIdx.x;
    const int32_t *start = kCols ? p.col_start : p.row_start;
    int2 *table = kCols ? p.col_table : p.row_table;
    if (r >= (kCols ? p.col_cap : p.rows)) return;
    if (r >= start[p.batch]) {
        table[r] = make_int2(-1, -1);
        return;
    }
    /* The last b with start[b] <= r: then start[b + 1] > r, so sequence b
     * holds r (start[0] = 0 <= r). */
    int32_t lo = 0, hi = p.batch - 1;
    while (lo < hi) {
        const int32_t mid = lo + (hi - lo + 1) / 2;
        if (start[mid] <= r)
            lo = mid;
        else
            hi = mid - 1;
    }
    table[r] = make_int2(lo, r - start[lo]);
}

/* ---------------------------------------------------------------------------
 * 3-5. The tile order
 * ------------------------------------------------------------------------- */

/* Tile of thread x of segment seg, or -1 past its group or the tiles. */
__device__ __forceinline__ int32_t sk_vplan_segment_tile(const sk_vplan_params &p, int32_t seg,
                                                         int32_t x) {
    return sk_sort_segment_tile(seg, x, p.group_segs, p.group_tiles, p.num_tiles);
}

/* Tile t's entries [*start, *end), and its visiting limits (the column
 * bound min(col_blocks, nb_k) and kmax); false for an absent row. */
__device__ __forceinline__ bool sk_vplan_tile_row(const sk_vplan_params &p, int32_t t,
                                                  int32_t *start, int32_t *end, int32_t *cols,
                                                  int32_t *kmax) {
    const int2 row = p.row_table[t % p.rows];
    if (row.x < 0) return false;
    const int4 s = p.seqs[row.x]; /* {q0, len_q, k0, len_k} */
    sk_sched_tile_row(t, p.rows, p.heads_q, 1, p.layout_heads, p.head_div, p.row_offsets, p.nnz,
                      start, end);
    *cols = (int32_t)min((int64_t)p.col_blocks, ((int64_t)s.w + p.block_k - 1) / p.block_k);
    *kmax = sk_sched_kmax(row.y, p.block_q, s.y, s.w);
    return true;
}

__global__ void __launch_bounds__(SK_VPLAN_THREADS)
    sk_vplan_count_kernel(const __grid_constant__ sk_vplan_params p) {
    __shared__ int32_t hist[SK_SCHED_MAX_BINS];
    sk_sort_hist_zero(hist, p.bins);
    const int32_t t = sk_vplan_segment_tile(p, blockIdx.x, threadIdx.x);
    int32_t start, end, cols, kmax;
    if (t >= 0 && sk_vplan_tile_row(p, t, &start, &end, &cols, &kmax)) {
        int32_t count = 0;
        for (int32_t e = start; e < end; ++e)
            count += sk_sched_visit(__ldg(p.col_indices + e), cols, p.causal, p.block_k, kmax);
        const int32_t key = min(count, p.bins - 1);
        p.keys[t] = key;
        atomicAdd(&hist[key], 1);
    } else if (t >= 0) {
        p.keys[t] = -1; /* absent */
    }
    sk_sort_hist_store(hist, p.bins, p.hist + (size_t)blockIdx.x * p.bins);
}

/* One CTA per group of heads [h0, h1): its present tiles take slots
 * [h0 P, h1 P), P = row_start[B]. */
__global__ void __launch_bounds__(SK_VPLAN_THREADS)
    sk_vplan_offsets_kernel(const __grid_constant__ sk_vplan_params p) {
    const int64_t h0 = (int64_t)blockIdx.x * p.group_tiles / p.rows;
    sk_sort_group_offsets(p.hist, p.bins, blockIdx.x * p.group_segs, p.group_segs,
                          (int32_t)(h0 * p.row_start[p.batch]));
}

__global__ void __launch_bounds__(SK_VPLAN_THREADS)
    sk_vplan_scatter_kernel(const __grid_constant__ sk_vplan_params p) {
    __shared__ int32_t keys[SK_SCHED_SEGMENT];
    const int32_t t = sk_vplan_segment_tile(p, blockIdx.x, threadIdx.x);
    const int32_t key = t >= 0 ? p.keys[t] : -2;
    keys[threadIdx.x] = key;
    __syncthreads();
    if (t < 0) return;
    const int32_t present = p.row_start[p.batch];
    if (key < 0) { /* absent: after every present tile, in tile-id order */
        const int32_t h = t / p.rows, r = t - h * p.rows;
        const int32_t slot = p.heads_q * present + h * (p.rows - present) + (r - present);
        p.order[slot] = -1;
        p.info[slot] = make_int4(-1, 0, 0, -1);
        return;
    }
    const int32_t slot = p.hist[(size_t)blockIdx.x * p.bins + key] + sk_sort_rank(keys, key);
    int32_t start, end, cols, kmax;
    sk_vplan_tile_row(p, t, &start, &end, &cols, &kmax);
    const int2 first =
        sk_sort_first_visit(p.col_indices, start, end, cols, p.causal, p.block_k, kmax);
    p.order[slot] = t;
    p.info[slot] = make_int4(t, first.x, end, first.y);
}

/* ---------------------------------------------------------------------------
 * Enqueue
 * ------------------------------------------------------------------------- */

sk_status sk_varlen_plan_enqueue(const sk_varlen_plan_source *src, const sk_varlen_plan_layout *w,
                                 char *base, cudaStream_t stream) {
    const sk_attention_varlen_problem *v = src->v;
    const sk_attention_problem *f = &v->flat;
    sk_vplan_params k;
    k.cu_q = v->cu_seqlens_q;
    k.cu_k = src->seq_lens_k != NULL ? NULL : v->cu_seqlens_k;
    k.lens_k = src->seq_lens_k;
    k.row_offsets = f->row_offsets;
    k.col_indices = f->col_indices;
    k.nnz = f->nnz;
    k.batch = v->batch;
    k.rows = f->row_blocks;
    k.heads_q = (int32_t)f->heads_q;
    k.col_blocks = f->col_blocks;
    k.layout_heads = f->layout_heads;
    k.head_div = f->head_div;
    k.block_q = f->block_q;
    k.block_k = f->block_k;
    k.causal = f->causal;
    k.total_q = (int32_t)f->seq_q;
    /* Paged: k0 is 0 and len_k is clamped to max_seqlen_k (<= the cache). */
    k.total_k = (int32_t)(src->seq_lens_k != NULL ? 0 : f->seq_k);
    k.max_q = (int32_t)v->max_seqlen_q;
    k.max_k = (int32_t)v->max_seqlen_k;
    k.num_tiles = w->tiles;
    k.bins = w->bins;
    k.group_tiles = w->group_tiles;
    k.group_segs = w->group_segs;
    k.seqs = (int4 *)(base + w->seqs);
    k.row_start = (int32_t *)(base + w->row_start);
    k.row_table = (int2 *)(base + w->rows);
    k.col_cap = w->col_cap;
    k.col_start = w->col_cap > 0 ? (int32_t *)(base + w->col_start) : NULL;
    k.col_table = w->col_cap > 0 ? (int2 *)(base + w->cols) : NULL;
    k.keys = (int32_t *)(base + w->keys);
    k.hist = (int32_t *)(base + w->hist);
    k.order = (int32_t *)(base + w->order);
    k.info = (int4 *)(base + w->info);

    sk_vplan_seqs_kernel<<<1, SK_VPLAN_THREADS, 0, stream>>>(k);
    SK_CUDA_TRY(cudaGetLastError(), "varlen plan sequences kernel launch");
    sk_vplan_rows_kernel<false><<<(k.rows + SK_VPLAN_ROW_THREADS - 1) / SK_VPLAN_ROW_THREADS,
                                  SK_VPLAN_ROW_THREADS, 0, stream>>>(k);
    SK_CUDA_TRY(cudaGetLastError(), "varlen plan rows kernel launch");
    if (k.col_cap > 0) {
        sk_vplan_rows_kernel<true><<<(k.col_cap + SK_VPLAN_ROW_THREADS - 1) /
                                         SK_VPLAN_ROW_THREADS,
                                     SK_VPLAN_ROW_THREADS, 0, stream>>>(k);
        SK_CUDA_TRY(cudaGetLastError(), "varlen plan columns kernel launch");
    }
    sk_vplan_count_kernel<<<w->segs, SK_VPLAN_THREADS, 0, stream>>>(k);
    SK_CUDA_TRY(cudaGetLastError(), "varlen plan count kernel launch");
    sk_vplan_offsets_kernel<<<w->groups, SK_VPLAN_THREADS, 0, stream>>>(k);
    SK_CUDA_TRY(cudaGetLastError(), "varlen plan offsets kernel launch");
    sk_vplan_scatter_kernel<<<w->segs, SK_VPLAN_THREADS, 0, stream>>>(k);
    SK_CUDA_TRY(cudaGetLastError(), "varlen plan scatter kernel launch");
    return SK_STATUS_SUCCESS;
}
