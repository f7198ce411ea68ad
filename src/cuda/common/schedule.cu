/*
 * schedule.cu - the longest-first tile order of the attention and BSR GEMM
 * plans (schedule.h says what it is; plan_contract.cuh holds the workspace
 * layout and the visiting rule the kernels share).
 */
#include <stdint.h>

#include "cuda/common/cuda_check.cuh"
#include "cuda/common/plan_contract.cuh"
#include "cuda/common/sched_sort.cuh"
#include "cuda/common/schedule.h"

enum { SK_PLAN_THREADS = SK_SCHED_SEGMENT };

typedef struct sk_plan_params {
    const int32_t *row_offsets, *col_indices;
    int32_t nnz, num_tiles, row_blocks, col_blocks, heads_q;
    int32_t layout_batch, layout_heads, head_div;
    int32_t block_q, block_k, seq_q, seq_k, causal;
    int32_t segs, bins;
    int32_t group_tiles, group_segs; /* tiles and segments per L2 group */
    int32_t *keys;                   /* [tiles] */
    int32_t *hist;                   /* [segs, bins] */
    int32_t *order;                  /* [tiles] */
    int4 *info;                      /* [tiles] */
} sk_plan_params;

sk_status sk_schedule_layout_of(const sk_schedule_geometry *g, sk_plan_layout *w) {
    if (g->tiles > INT32_MAX)
        return sk_error(SK_STATUS_NOT_SUPPORTED,
                        "%lld tiles (layout rows times their readers): the CUDA backend takes at "
                        "most 2^31 - 1",
                        (long long)g->tiles);
    w->tiles = (int32_t)g->tiles;
    const int64_t group =
        g->group_tiles <= 0 || g->group_tiles >= g->tiles ? g->tiles : g->group_tiles;
    const int64_t groups = g->tiles == 0 ? 0 : (g->tiles + group - 1) / group;
    const int64_t group_segs = (group + SK_SCHED_SEGMENT - 1) / SK_SCHED_SEGMENT;
    /* groups * group_segs <= tiles + groups <= 2 * tiles: checked, not assumed. */
    if (groups * group_segs > INT32_MAX)
        return sk_error(SK_STATUS_NOT_SUPPORTED,
                        "%lld tiles in groups of %lld: too many plan segments for the CUDA backend",
                        (long long)g->tiles, (long long)group);
    w->group_tiles = (int32_t)group;
    w->groups = (int32_t)groups;
    w->group_segs = (int32_t)group_segs;
    w->segs = (int32_t)(groups * group_segs);
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

int64_t sk_schedule_l2_group_tiles(int64_t slices, int32_t row_blocks, int64_t share,
                                   int64_t kv_bytes_per_slice) {
    if (share < 1 || kv_bytes_per_slice <= 0) return 0;
    const int64_t kv_heads = (slices + share - 1) / share;
    /* KV heads per group: as many as the budget holds, but enough query
     * heads that the CTAs running at once spread over several of them. */
    int64_t per_group = SK_SCHED_L2_BUDGET / kv_bytes_per_slice;
    const int64_t spread = (SK_SCHED_MIN_GROUP_SLICES + share - 1) / share;
    if (per_group < spread) per_group = spread;
    /* Then the fewest groups, KV heads spread evenly over them: a short
     * last group would sort its tiles apart. */
    const int64_t groups = (kv_heads + per_group - 1) / per_group;
    if (groups <= 1) return 0;
    return (kv_heads + groups - 1) / groups * share * row_blocks;
}

/* Tile of thread x of segment seg (segments are numbered group by group),
 * or -1 past the end of its group or of the problem. */
__device__ __forceinline__ int32_t sk_plan_segment_tile(const sk_plan_params &p, int32_t seg,
                                                        int32_t x) {
    return sk_sort_segment_tile(seg, x, p.group_segs, p.group_tiles, p.num_tiles);
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
    sk_sort_hist_zero(hist, p.bins);
    const int32_t t = sk_plan_segment_tile(p, blockIdx.x, threadIdx.x);
    if (t >= 0) {
        int32_t start, end, kmax, count = 0;
        sk_plan_row(p, t, &start, &end, &kmax);
        for (int32_t e = start; e < end; ++e)
            count +=
                sk_sched_visit(__ldg(p.col_indices + e), p.col_blocks, p.causal, p.block_k, kmax);
        const int32_t key = min(count, p.bins - 1);
        p.keys[t] = key;
        atomicAdd(&hist[key], 1);
    }
    sk_sort_hist_store(hist, p.bins, p.hist + (size_t)blockIdx.x * p.bins);
}

/* One CTA per group: the slots of its tiles follow the groups before it. */
__global__ void __launch_bounds__(SK_PLAN_THREADS)
    sk_plan_offsets_kernel(const __grid_constant__ sk_plan_params p) {
    sk_sort_group_offsets(p.hist, p.bins, blockIdx.x * p.group_segs, p.group_segs,
                          blockIdx.x * p.group_tiles);
}

__global__ void __launch_bounds__(SK_PLAN_THREADS)
    sk_plan_scatter_kernel(const __grid_constant__ sk_plan_params p) {
    __shared__ int32_t keys[SK_SCHED_SEGMENT];
    const int32_t t = sk_plan_segment_tile(p, blockIdx.x, threadIdx.x);
    const int32_t key = t >= 0 ? p.keys[t] : -1;
    keys[threadIdx.x] = key;
    __syncthreads();
    if (t < 0) return;
    const int32_t slot = p.hist[(size_t)blockIdx.x * p.bins + key] + sk_sort_rank(keys, key);
    int32_t start, end, kmax;
    sk_plan_row(p, t, &start, &end, &kmax);
    const int2 first =
        sk_sort_first_visit(p.col_indices, start, end, p.col_blocks, p.causal, p.block_k, kmax);
    p.order[slot] = t;
    p.info[slot] = make_int4(t, first.x, end, first.y);
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
    k.group_tiles = w->group_tiles;
    k.group_segs = w->group_segs;
    k.keys = (int32_t *)(base + w->keys);
    k.hist = (int32_t *)(base + w->hist);
    k.order = (int32_t *)(base + w->order);
    k.info = (int4 *)(base + w->info);

    sk_plan_count_kernel<<<w->segs, SK_PLAN_THREADS, 0, stream>>>(k);
    SK_CUDA_TRY(cudaGetLastError(), "plan count kernel launch");
    sk_plan_offsets_kernel<<<w->groups, SK_PLAN_THREADS, 0, stream>>>(k);
    SK_CUDA_TRY(cudaGetLastError(), "plan offsets kernel launch");
    sk_plan_scatter_kernel<<<w->segs, SK_PLAN_THREADS, 0, stream>>>(k);
    SK_CUDA_TRY(cudaGetLastError(), "plan scatter kernel launch");
    return SK_STATUS_SUCCESS;
}
