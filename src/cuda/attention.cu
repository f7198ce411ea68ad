/*
 * attention.cu - the CUDA attention backend: workspace size, the plan
 * (tile order on the GPU), and the choice of kernel.
 *
 * Plan. Three small kernels sort the tiles by their number of visited
 * blocks, longest first, ties in tile-id order (a stable counting sort), with
 * no host synchronisation and no allocation:
 *   1. count    one thread per tile: clamp the layout row, count the visited
 *               entries (attention_sm80_sched.cuh), key = min(count, cap);
 *               one CTA per segment of 1024 tiles builds that segment's
 *               histogram of keys.
 *   2. offsets  one CTA: per key, the exclusive prefix over segments, plus
 *               the number of tiles with a larger key (descending order).
 *   3. scatter  one thread per tile: its rank among equal keys earlier in
 *               its segment gives its slot; writes tile_order[slot] and the
 *               sm80 kernel's tile_info[slot] (first visited entry).
 * Integer counting only, so the order is the same on every run. Keys are
 * capped at 1023 blocks (rows longer than that tie, in tile-id order).
 *
 * Run. Checks device, kernel support and workspace first (nothing is
 * enqueued on failure), resets the tile counter with cudaMemsetAsync on the
 * stream, then launches the chosen kernel: SK_BACKEND_CUDA takes the
 * Hopper kernel on compute capability 9.0 when it covers the problem, else
 * the portable one; SK_BACKEND_CUDA_SM80 / _SM90 force one.
 */
#include <stdint.h>

#include "cuda/attention_kernels.h"
#include "cuda/attention_sm80_sched.cuh"
#include "cuda/backend.h"
#include "cuda/cuda_check.cuh"

enum { SK_PLAN_THREADS = SK_SCHED_SEGMENT, SK_PLAN_SCAN_UNROLL = 4 };

typedef struct sk_plan_layout {
    size_t counter, order, info, keys, hist, total; /* byte offsets from the aligned base */
    int32_t tiles, segs, bins;
} sk_plan_layout;

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

/* Workspace parts (attention_sm80_sched.cuh); fails for more than 2^31 - 1
 * tiles. */
static sk_status sk_plan_layout_of(const sk_attention_problem *p, sk_plan_layout *w) {
    const int64_t tiles = p->batch * p->heads_q * (int64_t)p->row_blocks;
    if (tiles > INT32_MAX)
        return sk_error(SK_STATUS_NOT_SUPPORTED,
                        "batch * heads_q * row_blocks = %lld tiles: the CUDA backend takes at "
                        "most 2^31 - 1",
                        (long long)tiles);
    w->tiles = (int32_t)tiles;
    w->segs = (int32_t)((tiles + SK_SCHED_SEGMENT - 1) / SK_SCHED_SEGMENT);
    w->bins = (p->col_blocks < SK_SCHED_KEY_CAP ? p->col_blocks : SK_SCHED_KEY_CAP) + 1;
    const size_t n = (size_t)tiles;
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

static char *sk_plan_base(void *workspace) {
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
 * Checks shared by plan and run
 * ------------------------------------------------------------------------- */

typedef enum sk_kernel_choice { SK_KERNEL_SM80 = 0, SK_KERNEL_SM90 = 1 } sk_kernel_choice;

/* Device present and new enough, and which kernel serves the problem. */
static sk_status sk_choose_kernel(const sk_attention_problem *p, sk_kernel_choice *choice) {
    int device = 0, major = 0, minor = 0;
    SK_TRY(sk_cuda_current_cc(&device, &major, &minor));
    if (major < 8)
        return sk_error(SK_STATUS_NOT_SUPPORTED_BACKEND,
                        "device %d has compute capability %d.%d; the CUDA backend needs 8.0 or "
                        "later",
                        device, major, minor);
    const int hopper = major == 9 && minor == 0;
    switch (p->backend) {
    case SK_BACKEND_CUDA_SM90:
        if (!hopper)
            return sk_error(SK_STATUS_NOT_SUPPORTED,
                            "backend SK_BACKEND_CUDA_SM90 needs compute capability 9.0; device "
                            "%d has %d.%d (use SK_BACKEND_CUDA)",
                            device, major, minor);
        if (!sk_attention_sm90_supports(p))
            return sk_error(SK_STATUS_NOT_SUPPORTED,
                            "backend SK_BACKEND_CUDA_SM90: the Hopper kernel does not cover this "
                            "problem (dtype %d, head_dim %lld, blocks %d x %d); use "
                            "SK_BACKEND_CUDA",
                            (int)p->dtype, (long long)p->head_dim, (int)p->block_q,
                            (int)p->block_k);
        *choice = SK_KERNEL_SM90;
        return SK_STATUS_SUCCESS;
    case SK_BACKEND_CUDA:
        if (hopper && sk_attention_sm90_supports(p)) {
            *choice = SK_KERNEL_SM90;
            return SK_STATUS_SUCCESS;
        }
        break;
    default:
        break;
    }
    SK_TRY(sk_attention_sm80_check(p));
    *choice = SK_KERNEL_SM80;
    return SK_STATUS_SUCCESS;
}

static sk_status sk_check_workspace(const sk_plan_layout *w, const void *workspace,
                                    size_t workspace_size) {
    if (workspace == NULL)
        return sk_error(SK_STATUS_BAD_PARAM_WORKSPACE,
                        "workspace is NULL; this problem needs %zu bytes "
                        "(sk_attention_workspace_size)",
                        w->total);
    if (workspace_size < w->total)
        return sk_error(SK_STATUS_BAD_PARAM_WORKSPACE,
                        "workspace_size = %zu bytes, but this problem needs %zu "
                        "(sk_attention_workspace_size)",
                        workspace_size, w->total);
    return SK_STATUS_SUCCESS;
}

/* ---------------------------------------------------------------------------
 * Entry points
 * ------------------------------------------------------------------------- */

extern "C" sk_status sk_cuda_attention_workspace_size(const sk_attention_problem *p,
                                                      size_t *bytes) {
    sk_plan_layout w;
    SK_TRY(sk_plan_layout_of(p, &w));
    *bytes = w.total;
    return SK_STATUS_SUCCESS;
}

/* The checks the plan and the run both make before enqueuing anything
 * (workspace parts, kernel choice, workspace size), and the aligned base. */
static sk_status sk_prepare_enqueue(const sk_attention_problem *p, void *workspace,
                                    size_t workspace_size, sk_plan_layout *w,
                                    sk_kernel_choice *choice, char **base) {
    SK_TRY(sk_plan_layout_of(p, w));
    SK_TRY(sk_choose_kernel(p, choice));
    SK_TRY(sk_check_workspace(w, workspace, workspace_size));
    *base = sk_plan_base(workspace);
    return SK_STATUS_SUCCESS;
}

extern "C" sk_status sk_cuda_attention_plan(const sk_attention_problem *p, void *workspace,
                                            size_t workspace_size, cudaStream_t stream) {
    sk_plan_layout w;
    sk_kernel_choice choice;
    char *base;
    SK_TRY(sk_prepare_enqueue(p, workspace, workspace_size, &w, &choice, &base));
    sk_plan_params k;
    k.row_offsets = p->row_offsets;
    k.col_indices = p->col_indices;
    k.nnz = p->nnz;
    k.num_tiles = w.tiles;
    k.row_blocks = p->row_blocks;
    k.col_blocks = p->col_blocks;
    k.heads_q = (int32_t)p->heads_q;
    k.layout_batch = p->layout_batch;
    k.layout_heads = p->layout_heads;
    k.head_div = p->head_div;
    k.block_q = p->block_q;
    k.block_k = p->block_k;
    k.seq_q = (int32_t)p->seq_q;
    k.seq_k = (int32_t)p->seq_k;
    k.causal = p->causal;
    k.segs = w.segs;
    k.bins = w.bins;
    k.keys = (int32_t *)(base + w.keys);
    k.hist = (int32_t *)(base + w.hist);
    k.order = (int32_t *)(base + w.order);
    k.info = (int4 *)(base + w.info);

    sk_plan_count_kernel<<<w.segs, SK_PLAN_THREADS, 0, stream>>>(k);
    SK_CUDA_TRY(cudaGetLastError(), "plan count kernel launch");
    sk_plan_offsets_kernel<<<1, SK_PLAN_THREADS, 0, stream>>>(k);
    SK_CUDA_TRY(cudaGetLastError(), "plan offsets kernel launch");
    sk_plan_scatter_kernel<<<w.segs, SK_PLAN_THREADS, 0, stream>>>(k);
    SK_CUDA_TRY(cudaGetLastError(), "plan scatter kernel launch");
    return SK_STATUS_SUCCESS;
}

extern "C" sk_status sk_cuda_attention_run(const sk_attention_problem *p, void *workspace,
                                           size_t workspace_size, cudaStream_t stream) {
    sk_plan_layout w;
    sk_kernel_choice choice;
    char *base;
    SK_TRY(sk_prepare_enqueue(p, workspace, workspace_size, &w, &choice, &base));
    sk_attention_schedule s;
    s.tile_order = (const int32_t *)(base + w.order);
    s.tile_counter = (int32_t *)(base + w.counter);
    s.num_tiles = w.tiles;
    s.tile_info = (const int4 *)(base + w.info);
    SK_CUDA_TRY(cudaMemsetAsync(s.tile_counter, 0, sizeof(int32_t), stream),
                "cudaMemsetAsync (tile counter)");
    if (choice == SK_KERNEL_SM90) return sk_attention_sm90_launch(p, &s, stream);
    return sk_attention_sm80_launch(p, &s, stream);
}
