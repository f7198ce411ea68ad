/*
 * schedule.cu - the longest-first tile order of the attention and BSR GEMM
 * plans (schedule.h says what it is; plan_contract.cuh holds the workspace
 * layout and the visiting rule the kernels share).
 */
#include <stdint.h>

#include "cuda/common/cuda_check.cuh"
#include "cuda/common/plan_contract.cuh"
#include "cuda/common/schedule.h"

enum { SK_PLAN_THREADS = SK_SCHED_SEGMENT, SK_PLAN_SCAN_UNROLL = 4 };

typedef struct sk_plan_params {
    const int32_t *row_offsets, *col_indices;
    int32_t nnz, num_tiles, row_blocks, col_blocks, heads_q;
    int32_t layout_batch, layout_heads, head_div;
    int32_t block_q, block_k, seq_q, seq_k, causal;
    int32_t segs, bins;
    int32_t *keys;  /* [tiles] */
    int32_t *hist;  /* [segs, bins] */
    int32_t *order; /* [tiles] */
    int4 *info;     /* [tiles] */
} sk_plan_params;

sk_status sk_schedule_layout_of(const sk_schedule_geometry *g, sk_plan_layout *w) {
    if (g->tiles > INT32_MAX)
        return sk_error(SK_STATUS_NOT_SUPPORTED,
                        "%lld tiles (layout rows times their readers): the CUDA backend takes at "
                        "most 2^31 - 1",
                        (long long)g->tiles);
    w->tiles = (int32_t)g->tiles;
    w->segs = (int32_t)((g->tiles + SK_SCHED_SEGMENT - 1) / SK_SCHED_SEGMENT);
    w->bins = (g->col_blocks < SK_SCHED_KEY_CAP ? g->col_blocks : SK_SCHED_KEY_CAP) + 1;
    const size_t n = (size_t)g->tiles;
    w->counter = 0;
    w->order = w->counter + sk_sched_align(sizeof(int32_t));
    w->info = w->order + sk_sched_align(n * sizeof(int32_t));
    w->keys = w->info + sk_sched_align(n * sizeof(int4));
    w->hist = w->keys + sk_sched_align(n * sizeof(int32_t));
    /* Slack for rounding the caller's pointer up to the alignment. */
    w->total = w->hist + sk_sched_align((size_t)w->segs * (size_t)w->bins * sizeof(int32_t)) +
               SK_SCHED_ALIGN;
    return SK_STATUS_SUCCESS;
}

sk_status sk_schedule_check_workspace(const sk_plan_layout *w, const void *workspace,
                                      size_t workspace_size, const char *size_fn) {
    if (workspace == NULL)
        return sk_error(SK_STATUS_BAD_PARAM_WORKSPACE,
                        "workspace is NULL; this problem needs %zu bytes (%s)", w->total, size_fn);
    if (workspace_size < w->total)
        return sk_error(SK_STATUS_BAD_PARAM_WORKSPACE,
                        "workspace_size = %zu bytes, but this problem needs %zu (%s)",
                        workspace_size, w->total, size_fn);
    return SK_STATUS_SUCCESS;
}

char *sk_schedule_base(void *workspace) {
    const uintptr_t a = (uintptr_t)workspace;
    return (char *)((a + SK_SCHED_ALIGN - 1) / SK_SCHED_ALIGN * SK_SCHED_ALIGN);
}

/* The clamped entry range of tile t, and its key-visibility limit. */
__device__ __forceinline__ void sk_plan_row(const sk_plan_params &p, int32_t t, int32_t *start,
                                            int32_t *end, int32_t *kmax) {
    sk_sched_tile_row(t, p.row_blocks, p.heads_q, p.layout_batch, p.layout_heads, p.head_div,
                      p.row_offsets, p.nnz, start, end);
    *kmax = sk_sched_kmax(t % p.row_blocks, p.block_q, p.seq_q, p.seq_k);
}

__global__ void __launch_bounds__(SK_PLAN_THREADS)
    sk_plan_count_kernel(const __grid_constant__ sk_plan_params p) {
    __shared__ int32_t hist[SK_SCHED_MAX_BINS];
    for (int b = threadIdx.x; b < p.bins; b += blockDim.x) hist[b] = 0;
    __syncthreads();
    const int32_t t = blockIdx.x * SK_SCHED_SEGMENT + threadIdx.x;
    if (t < p.num_tiles) {
        int32_t start, end, kmax, count = 0;
        sk_plan_row(p, t, &start, &end, &kmax);
        for (int32_t e = start; e < end; ++e)
            count += sk_sched_visit(__ldg(p.col_indices + e), p.col_blocks, p.causal, p.block_k,
                                    kmax);
        const int32_t key = min(count, p.bins - 1);
        p.keys[t] = key;
        atomicAdd(&hist[key], 1);
    }
    __syncthreads();
    for (int b = threadIdx.x; b < p.bins; b += blockDim.x)
        p.hist[(size_t)blockIdx.x * p.bins + b] = hist[b];
}

/* One CTA: hist[seg][key] becomes the first slot of that segment's tiles
 * with that key, keys in descending order. */
__global__ void __launch_bounds__(SK_PLAN_THREADS)
    sk_plan_offsets_kernel(const __grid_constant__ sk_plan_params p) {
    __shared__ int32_t total[SK_SCHED_MAX_BINS];
    __shared__ int32_t scan[2][SK_SCHED_MAX_BINS];
    const int b = threadIdx.x; /* bins <= blockDim.x */
    int32_t run = 0;
    if (b < p.bins) {
        int32_t seg = 0;
        for (; seg + SK_PLAN_SCAN_UNROLL <= p.segs; seg += SK_PLAN_SCAN_UNROLL) {
            int32_t v[SK_PLAN_SCAN_UNROLL];
#pragma unroll
            for (int u = 0; u < SK_PLAN_SCAN_UNROLL; ++u)
                v[u] = p.hist[(size_t)(seg + u) * p.bins + b];
#pragma unroll
            for (int u = 0; u < SK_PLAN_SCAN_UNROLL; ++u) {
                p.hist[(size_t)(seg + u) * p.bins + b] = run;
                run += v[u];
            }
        }
        for (; seg < p.segs; ++seg) {
            const int32_t v = p.hist[(size_t)seg * p.bins + b];
            p.hist[(size_t)seg * p.bins + b] = run;
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
    if (r < p.bins) scan[0][r] = total[p.bins - 1 - r];
    __syncthreads();
    for (int off = 1; off < SK_SCHED_MAX_BINS; off *= 2) {
        const int32_t x = scan[cur][r] + (r >= off ? scan[cur][r - off] : 0);
        scan[cur ^ 1][r] = x;
        cur ^= 1;
        __syncthreads();
    }
    if (b < p.bins) {
        /* Tiles with a larger key come first. */
        const int32_t base = scan[cur][p.bins - 1 - b] - total[b];
        for (int32_t seg = 0; seg < p.segs; ++seg) p.hist[(size_t)seg * p.bins + b] += base;
    }
}

__global__ void __launch_bounds__(SK_PLAN_THREADS)
    sk_plan_scatter_kernel(const __grid_constant__ sk_plan_params p) {
    __shared__ int32_t keys[SK_SCHED_SEGMENT];
    const int32_t t = blockIdx.x * SK_SCHED_SEGMENT + threadIdx.x;
    const int32_t key = t < p.num_tiles ? p.keys[t] : -1;
    keys[threadIdx.x] = key;
    __syncthreads();
    if (t >= p.num_tiles) return;
    int32_t rank = 0;
    for (int j = 0; j < (int)threadIdx.x; ++j) rank += keys[j] == key;
    const int32_t slot = p.hist[(size_t)blockIdx.x * p.bins + key] + rank;
    int32_t start, end, kmax;
    sk_plan_row(p, t, &start, &end, &kmax);
    int32_t first = start, col = -1;
    for (; first < end; ++first) {
        const int32_t c = __ldg(p.col_indices + first);
        if (sk_sched_visit(c, p.col_blocks, p.causal, p.block_k, kmax)) {
            col = c;
            break;
        }
    }
    p.order[slot] = t;
    p.info[slot] = make_int4(t, first, end, col);
}

/* ---------------------------------------------------------------------------
 * Enqueue
 * ------------------------------------------------------------------------- */

sk_status sk_schedule_enqueue(const sk_schedule_geometry *g, const sk_plan_layout *w, char *base,
                              cudaStream_t stream) {
    sk_plan_params k;
    k.row_offsets = g->row_offsets;
    k.col_indices = g->col_indices;
    k.nnz = g->nnz;
    k.num_tiles = w->tiles;
    k.row_blocks = g->row_blocks;
    k.col_blocks = g->col_blocks;
    k.heads_q = g->heads_q;
    k.layout_batch = g->layout_batch;
    k.layout_heads = g->layout_heads;
    k.head_div = g->head_div;
    k.block_q = g->block_q;
    k.block_k = g->block_k;
    k.seq_q = g->seq_q;
    k.seq_k = g->seq_k;
    k.causal = g->causal;
    k.segs = w->segs;
    k.bins = w->bins;
    k.keys = (int32_t *)(base + w->keys);
    k.hist = (int32_t *)(base + w->hist);
    k.order = (int32_t *)(base + w->order);
    k.info = (int4 *)(base + w->info);

    sk_plan_count_kernel<<<w->segs, SK_PLAN_THREADS, 0, stream>>>(k);
    SK_CUDA_TRY(cudaGetLastError(), "plan count kernel launch");
    sk_plan_offsets_kernel<<<1, SK_PLAN_THREADS, 0, stream>>>(k);
    SK_CUDA_TRY(cudaGetLastError(), "plan offsets kernel launch");
    sk_plan_scatter_kernel<<<w->segs, SK_PLAN_THREADS, 0, stream>>>(k);
    SK_CUDA_TRY(cudaGetLastError(), "plan scatter kernel launch");
    return SK_STATUS_SUCCESS;
}
