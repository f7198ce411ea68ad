/*
 * bwd_transpose.cu - the backward plan's transposed layout T (its format:
 * bwd_kernels.h), built on the GPU with no atomics and no host sync:
 *   1. count  one thread per T row (T slice, key block j): for each merged
 *             query head (h_local) and query block i in order, a binary
 *             search for j in the clamped layout row; counts the visited
 *             hits into t_offsets[row].
 *   2. scan   one CTA: t_offsets becomes the exclusive prefix sum, every
 *             offset clamped to nnz (a corrupt layout may hit more than nnz
 *             times; its rows are then cut there).
 *   3. place  the same walk as 1, writing h_local * row_blocks + i at the
 *             row's next slot while it stays below the next row's offset.
 * A T row is written by one thread in increasing (h_local, i) order, so T
 * is the same on every run. The walk costs row_blocks binary searches per
 * T row (latency-bound, but one thread per key block and slice runs in
 * parallel); the plan runs once per layout. The varlen form (bwd_kernels.h,
 * sk_bwd_transpose_varlen_enqueue) walks, per T row, only its sequence's
 * query blocks, with that sequence's lengths.
 *
 * Robustness: layout rows are clamped as the forward clamps them
 * (common/plan_contract.cuh); unsorted rows make the search miss entries,
 * never leave the row; nothing outside t_offsets[0 .. t_rows] and
 * t_entries[0 .. nnz) is written.
 */
#include <stdint.h>

#include "cuda/attention/bwd_kernels.h"
#include "cuda/common/cuda_check.cuh"
#include "cuda/common/plan_contract.cuh"

enum { SK_T_THREADS = 256, SK_T_SCAN_THREADS = 1024 };

typedef struct sk_t_params {
    const int32_t *row_offsets, *col_indices;
    int32_t *t_offsets, *t_entries;
    int32_t nnz, t_rows, row_blocks, col_blocks;
    int32_t layout_heads, t_heads, t_group;
    int32_t block_q, block_k, seq_q, seq_k, causal;
    /* Varlen (sk_bwd_transpose_varlen_enqueue): T rows per slice t_cols
     * (col_blocks, or col_cap) and the varlen plan's tables. */
    int32_t t_cols, batch;
    const int4 *seqs;
    const int32_t *row_start;
    const int2 *cols;
} sk_t_params;

/* Whether the clamped layout row g holds column j (binary search; a
 * sorted row is searched exactly, any other content stays in bounds). */
__device__ __forceinline__ bool sk_t_row_has(const sk_t_params &p, int32_t g, int32_t j) {
    int32_t a = __ldg(p.row_offsets + g), e = __ldg(p.row_offsets + g + 1);
    a = min(max(a, 0), p.nnz);
    e = max(min(max(e, 0), p.nnz), a);
    while (a < e) {
        const int32_t mid = a + (e - a) / 2, c = __ldg(p.col_indices + mid);
        if (c == j) return true;
        if (c < j)
            a = mid + 1;
        else
            e = mid;
    }
    return false;
}

/* T row tr's hits, in (h_local, i) order: counted (kPlace = false) or
 * written at [at, stop) (kPlace); returns the count. Fixed: T row j of
 * slice (lb, th) over all row_blocks rows. Varlen: T row c of T head th,
 * c's sequence's query blocks only, under its own lengths. */
template <bool kPlace, bool kVarlen>
__device__ __forceinline__ int32_t sk_t_walk(const sk_t_params &p, int32_t tr, int32_t at,
                                             int32_t stop) {
    const int32_t c = tr % p.t_cols, ts = tr / p.t_cols;
    const int32_t th = ts % p.t_heads, lb = ts / p.t_heads;
    int32_t j = c, first = 0, rows = p.row_blocks, seq_q = p.seq_q, seq_k = p.seq_k;
    int32_t cols = p.col_blocks;
    if (kVarlen) {
        const int2 cb = p.cols[c];
        if ((uint32_t)cb.x >= (uint32_t)p.batch) return 0; /* no sequence */
        const int4 sq = p.seqs[cb.x];                      /* clamped by the plan */
        j = cb.y;
        seq_q = max(sq.y, 0);
        seq_k = max(sq.w, 0);
        first = min(max(p.row_start[cb.x], 0), p.row_blocks);
        rows = min((seq_q + p.block_q - 1) / p.block_q, p.row_blocks - first);
        cols = min(cols, (seq_k + p.block_k - 1) / p.block_k);
    }
    int32_t count = 0;
    for (int32_t hl = 0; hl < p.t_group; ++hl) {
        const int32_t slice = lb * p.layout_heads + th * p.t_group + hl;
        for (int32_t i = 0; i < rows; ++i) {
            const int32_t kmax = sk_sched_kmax(i, p.block_q, seq_q, seq_k);
            if (!sk_sched_visit(j, cols, p.causal, p.block_k, kmax)) continue;
            if (!sk_t_row_has(p, slice * p.row_blocks + first + i, j)) continue;
            ++count;
            if (kPlace && at < stop) p.t_entries[at++] = hl * p.row_blocks + i;
        }
    }
    return count;
}

/* Steps 1 (kPlace = false) and 3 (kPlace = true) for T row tr. */
template <bool kPlace, bool kVarlen>
__global__ void __launch_bounds__(SK_T_THREADS)
    sk_t_walk_kernel(const __grid_constant__ sk_t_params p) {
    const int32_t tr = (int32_t)(blockIdx.x * blockDim.x + threadIdx.x);
    if (tr >= p.t_rows) return;
    if (kPlace) {
        sk_t_walk<true, kVarlen>(p, tr, p.t_offsets[tr], p.t_offsets[tr + 1]);
    } else {
        p.t_offsets[tr] = sk_t_walk<false, kVarlen>(p, tr, 0, 0);
    }
}

/* Step 2: counts t_offsets[0 .. t_rows) -> exclusive offsets t_offsets[0 ..
 * t_rows], clamped to nnz. Each thread owns a contiguous run of rows. */
__global__ void __launch_bounds__(SK_T_SCAN_THREADS)
    sk_t_scan_kernel(const __grid_constant__ sk_t_params p) {
    __shared__ int64_t scan[2][SK_T_SCAN_THREADS];
    const int32_t n = p.t_rows, t = (int32_t)threadIdx.x;
    const int32_t per = (n + SK_T_SCAN_THREADS - 1) / SK_T_SCAN_THREADS;
    const int32_t lo = min(t * per, n), hi = min(lo + per, n);
    int64_t sum = 0;
    for (int32_t x = lo; x < hi; ++x) sum += p.t_offsets[x];
    int cur = 0;
    scan[0][t] = sum;
    __syncthreads();
    for (int off = 1; off < SK_T_SCAN_THREADS; off *= 2) { /* inclusive (Hillis-Steele) */
        scan[cur ^ 1][t] = scan[cur][t] + (t >= off ? scan[cur][t - off] : 0);
        cur ^= 1;
        __syncthreads();
    }
    int64_t run = scan[cur][t] - sum;
    for (int32_t x = lo; x < hi; ++x) {
        const int32_t c = p.t_offsets[x];
        p.t_offsets[x] = (int32_t)min(run, (int64_t)p.nnz);
        run += c;
    }
    if (t == SK_T_SCAN_THREADS - 1) p.t_offsets[n] = (int32_t)min(scan[cur][t], (int64_t)p.nnz);
}

/* The three steps on the stream. */
template <bool kVarlen>
static sk_status sk_t_enqueue(const sk_t_params &k, cudaStream_t stream) {
    const int grid = (int)((k.t_rows + SK_T_THREADS - 1) / SK_T_THREADS);
    sk_t_walk_kernel<false, kVarlen><<<grid, SK_T_THREADS, 0, stream>>>(k);
    SK_CUDA_TRY(cudaGetLastError(), "backward plan: transpose count kernel launch");
    sk_t_scan_kernel<<<1, SK_T_SCAN_THREADS, 0, stream>>>(k);
    SK_CUDA_TRY(cudaGetLastError(), "backward plan: transpose scan kernel launch");
    sk_t_walk_kernel<true, kVarlen><<<grid, SK_T_THREADS, 0, stream>>>(k);
    SK_CUDA_TRY(cudaGetLastError(), "backward plan: transpose place kernel launch");
    return SK_STATUS_SUCCESS;
}

static sk_t_params sk_t_params_of(const sk_attention_problem *p, const sk_bwd_shape *s,
                                  int32_t *t_offsets, int32_t *t_entries) {
    sk_t_params k;
    k.row_offsets = p->row_offsets;
    k.col_indices = p->col_indices;
    k.t_offsets = t_offsets;
    k.t_entries = t_entries;
    k.nnz = p->nnz;
    k.t_rows = s->t_rows;
    k.row_blocks = p->row_blocks;
    k.col_blocks = p->col_blocks;
    k.layout_heads = p->layout_heads;
    k.t_heads = s->t_heads;
    k.t_group = s->t_group;
    k.block_q = p->block_q;
    k.block_k = p->block_k;
    k.seq_q = (int32_t)p->seq_q;
    k.seq_k = (int32_t)p->seq_k;
    k.causal = p->causal;
    k.t_cols = p->col_blocks;
    k.batch = 0;
    k.seqs = NULL;
    k.row_start = NULL;
    k.cols = NULL;
    return k;
}

sk_status sk_bwd_transpose_enqueue(const sk_attention_problem *p, const sk_bwd_shape *s,
                                   int32_t *t_offsets, int32_t *t_entries, cudaStream_t stream) {
    return sk_t_enqueue<false>(sk_t_params_of(p, s, t_offsets, t_entries), stream);
}

sk_status sk_bwd_transpose_varlen_enqueue(const sk_attention_problem *p, const sk_bwd_shape *s,
                                          const int4 *seqs, const int32_t *row_start,
                                          const int2 *cols, int32_t batch, int32_t col_cap,
                                          int32_t *t_offsets,
                                          int32_t *t_entries, cudaStream_t stream) {
    sk_t_params k = sk_t_params_of(p, s, t_offsets, t_entries);
    k.t_cols = col_cap;
    k.batch = batch;
    k.seqs = seqs;
    k.row_start = row_start;
    k.cols = cols;
    return sk_t_enqueue<true>(k, stream);
}
