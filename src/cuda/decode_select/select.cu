/*
 * select.cu - the decode selection on the GPU (sk_decode_select): three
 * kernels on one stream (four or five with two levels), no host
 * synchronisation, fixed workspace.
 *
 *   score   score.cuh: one warp per summary, the contract's arithmetic ->
 *           scores[row, j] in the workspace, for the row's
 *           ceil(len / block_k) candidates only.
 *   select  one CTA per row: scores (eight loads in flight a thread) ->
 *           order-preserving keys (topk's score_key; forced blocks, NaN,
 *           -inf -> 0), kept in shared memory up to SEL_SMEM_KEYS blocks
 *           (re-read from the scores past that); if more than k keys are
 *           non-zero, an MSB-first radix select (4 passes of 8 bits,
 *           topk's radix_pick on a 256-bin histogram built with one
 *           atomic per distinct bin of a warp) finds the k-th largest key
 *           T and how many keys equal to T to take; one pass in index
 *           order (8 consecutive blocks per thread, two CTA scans per 2048
 *           blocks) keeps the forced blocks, keys > T and the lowest-index
 *           ties, each row's blocks into a fixed-stride scratch row
 *           (row_cap), and its count.
 *   place   one CTA per row: its offset (the sum of the earlier rows'
 *           counts), row_offsets, and the copy into col_indices.
 * With two levels (p->max_groups > 0): score over the group summaries,
 * select over the groups (no forced group, k = top_groups, the kept lists
 * in the workspace, increasing; it also writes -inf as the score of every
 * block of the groups it did not keep) -- one kernel, a CTA per row, when
 * max_groups <= PICK_MAX_GROUPS (sk_dsel_group_pick_kernel) --, score over
 * the kept groups' blocks only (one CTA per kept group), then select and
 * place as above.
 * On a 9.0 device every launch after a call's first uses programmatic
 * stream serialization (pdl_enter in every kernel, before any read).
 * The rules are sk_dsel_row_rules (core/decode_select.h), the host's.
 */
#include <string.h>

#include "cuda/backend.h"
#include "cuda/decode_select/dsel.cuh"
#include "cuda/topk/kernels.cuh"
#include "cuda/decode_select/score.cuh" /* after kernels.cuh: uses its launch helpers */

enum {
    SEL_THREADS = 256,
    SEL_SMEM_KEYS = 8192,   /* keys of a row kept in shared memory (32 KB) */
    SEL_ITEMS = 8,          /* consecutive blocks per thread in the writing pass */
    PLACE_THREADS = 256,
    PICK_MAX_GROUPS = 256,  /* groups a row's one CTA scores and selects (128 KB at D 128) */
    WS_ALIGN = 256
};

static __device__ __forceinline__ int32_t row_blocks(const sk_dsel_problem &p, int32_t r) {
    return sk_dsel_blocks(sk_dsel_clamp_len(p.seq_lens[r / p.heads_kv], p.max_seqlen_k),
                          p.block_k);
}

/* A row's keys: shared memory below `cached`, else from the scores. */
typedef struct sel_row {
    const float *scores;
    const uint32_t *keys;
    int32_t cached;
    sk_topk_row rule;
} sel_row;

static __device__ __forceinline__ uint32_t sel_key(const sel_row &s, int32_t j) {
    if (j < s.cached) return s.keys[j];
    return sk_topk_is_forced(&s.rule, j) ? 0u : score_key(s.scores[j]);
}

/* The k-th largest key of the row (more than k are non-zero) and how many
 * keys equal to it to take (the lowest-index ones). */
static __device__ uint32_t sel_threshold(const sel_row &s, int32_t k, uint32_t *hist,
                                         int32_t *pick, int32_t *eq_take) {
    const int32_t n = s.rule.n_cand;
    const int lane = (int)(threadIdx.x & 31);
    uint32_t prefix = 0, mask = 0;
    int32_t kk = k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int32_t i = (int32_t)threadIdx.x; i < 256; i += SEL_THREADS) hist[i] = 0;
        __syncthreads();
        /* Keys crowd into a few bins (similar scores share their top
         * bits; the zeros of a two-level row): one atomic per distinct
         * bin of a warp, not one per key. The loop bound is the same for
         * the whole CTA, so every lane takes part in the match. */
        for (int32_t j0 = 0; j0 < n; j0 += SEL_THREADS) {
            const int32_t j = j0 + (int32_t)threadIdx.x;
            const uint32_t key = j < n ? sel_key(s, j) : 0u;
            const bool in = j < n && (key & mask) == prefix;
            const uint32_t bin = in ? (key >> shift) & 255u : 256u;
            const uint32_t peers = __match_any_sync(0xffffffffu, bin);
            if (in && lane == __ffs((int)peers) - 1) atomicAdd(&hist[bin], (uint32_t)__popc(peers));
        }
        __syncthreads();
        if (threadIdx.x < 32) {
            int32_t rest = kk;
            const uint32_t digit = radix_pick(hist, lane, &rest);
            if (lane == 0) {
                pick[0] = (int32_t)digit;
                pick[1] = rest;
            }
        }
        __syncthreads();
        prefix |= (uint32_t)pick[0] << shift;
        mask |= 255u << shift;
        kk = pick[1];
        __syncthreads(); /* pick and hist are rewritten by the next pass */
    }
    *eq_take = kk;
    return prefix;
}

/* One selection pass: the blocks (the rules of sparsek.h), or the groups
 * of the first level (no forced group, k = top_groups). */
typedef struct select_args {
    const float *scores;  /* [rows, count] */
    int32_t count, divisor; /* as score_args */
    int32_t sinks, recent, k, row_cap;
    int32_t *counts;      /* [rows] */
    int32_t *scratch;     /* [rows, row_cap] */
    float *fill;          /* the group pass: block scores [rows, max_blocks] that get -inf
                           * for every block of an unpicked group (below the row's block
                           * count); NULL for the block pass */
} select_args;

/* The group pass's last step: -inf for the blocks of the groups it did
 * not pick (the kept pass scores only the picked ones), coalesced. A
 * group below `cached` finds its outcome in picked[g]; past that, in the
 * row's kept list (this CTA's writes: visible after the barrier). */
static __device__ void fill_unpicked(const sk_dsel_problem &p, const select_args &a,
                                     const uint32_t *picked, int32_t cached, const int32_t *list,
                                     int32_t listed) {
    __syncthreads();
    const int32_t r = (int32_t)blockIdx.x, blocks = row_blocks(p, r);
    float *dst = a.fill + (int64_t)r * p.max_blocks;
    for (int32_t j = (int32_t)threadIdx.x; j < blocks; j += SEL_THREADS) {
        const int32_t g = j / a.divisor;
        bool kept;
        if (g < cached) {
            kept = picked[g] != 0u;
        } else { /* binary search of the increasing list */
            int32_t lo = 0, hi = listed;
            while (lo < hi) {
                const int32_t mid = (lo + hi) >> 1;
                if (list[mid] < g)
                    lo = mid + 1;
                else
                    hi = mid;
            }
            kept = lo < listed && list[lo] == g;
        }
        if (!kept) dst[j] = __int_as_float((int)0xff800000u);
    }
}

/* The rest of a row's selection once its keys are in shared memory
 * (below s.cached; the scores past that) and each thread knows how many
 * of the keys it wrote are non-zero: the threshold, the pass in index
 * order, the count, and (group pass) the -inf of the unpicked groups. */
static __device__ void select_row(const sk_dsel_problem &p, const select_args &a, sel_row &s,
                                  uint32_t *keys, uint32_t *hist, int32_t *warp_part, int32_t *pick,
                                  int32_t nonzero) {
    const int32_t r = (int32_t)blockIdx.x, n = s.rule.n_cand;
    int32_t total;
    (void)cta_exclusive_sum<SEL_THREADS>(nonzero, warp_part, &total);
    __syncthreads();
    s.cached = n < SEL_SMEM_KEYS ? n : SEL_SMEM_KEYS;
    /* Selected by score: key > thr, or key == thr among the first eq_take. */
    uint32_t thr = 0xffffffffu;
    int32_t eq_take = 0;
    if (a.k > 0 && total > 0) {
        if (total <= a.k)
            thr = 0u; /* every non-zero key */
        else
            thr = sel_threshold(s, a.k, hist, pick, &eq_take);
    }
    /* In index order, SEL_ITEMS consecutive blocks per thread and chunk:
     * the ties' ranks, then the places, from two CTA scans per chunk. */
    int32_t eq_before = 0, sel_before = 0;
    int32_t *out = a.scratch + (int64_t)r * a.row_cap;
    for (int32_t base = 0; base < n; base += SEL_THREADS * SEL_ITEMS) {
        const int32_t j0 = base + (int32_t)threadIdx.x * SEL_ITEMS;
        uint32_t key[SEL_ITEMS];
        bool forced[SEL_ITEMS];
        int32_t eq_count = 0;
#pragma unroll
        for (int e = 0; e < SEL_ITEMS; ++e) {
            const int32_t j = j0 + e;
            key[e] = j < n ? sel_key(s, j) : 0u;
            forced[e] = j < n && sk_topk_is_forced(&s.rule, j);
            eq_count += j < n && !forced[e] && key[e] == thr;
        }
        int32_t sum;
        int32_t eq_rank = eq_before + cta_exclusive_sum<SEL_THREADS>(eq_count, warp_part, &sum);
        eq_before += sum;
        __syncthreads();
        uint32_t picked = 0;
        int32_t sel_count = 0;
#pragma unroll
        for (int e = 0; e < SEL_ITEMS; ++e) {
            const int32_t j = j0 + e;
            const bool eq = j < n && !forced[e] && key[e] == thr;
            const bool sel = j < n && (forced[e] || key[e] > thr || (eq && eq_rank < eq_take));
            eq_rank += eq;
            picked |= (uint32_t)sel << e;
            sel_count += sel;
        }
        int32_t pos = sel_before + cta_exclusive_sum<SEL_THREADS>(sel_count, warp_part, &sum);
        sel_before += sum;
        __syncthreads();
#pragma unroll
        for (int e = 0; e < SEL_ITEMS; ++e) {
            if ((picked >> e) & 1u) {
                if (pos < a.row_cap) out[pos] = j0 + e;
                ++pos;
            }
            /* The group pass keeps each cached group's outcome in its key
             * slot (read by no other thread in this pass). */
            if (a.fill != NULL && j0 + e < s.cached) keys[j0 + e] = (picked >> e) & 1u;
        }
    }
    const int32_t listed = sel_before < a.row_cap ? sel_before : a.row_cap;
    if (threadIdx.x == 0) a.counts[r] = listed;
    if (a.fill != NULL) fill_unpicked(p, a, keys, s.cached, out, listed);
}

__global__ void __launch_bounds__(SEL_THREADS)
    sk_dsel_select_kernel(const __grid_constant__ sk_dsel_problem p, const __grid_constant__ select_args a) {
    __shared__ uint32_t keys[SEL_SMEM_KEYS];
    __shared__ uint32_t hist[256];
    __shared__ int32_t warp_part[SEL_THREADS / 32];
    __shared__ int32_t pick[2];
    const int32_t r = (int32_t)blockIdx.x;
    pdl_enter();
    sel_row s;
    s.rule = sk_dsel_row_rules((row_blocks(p, r) + a.divisor - 1) / a.divisor, a.sinks, a.recent, a.k);
    const int32_t n = s.rule.n_cand;
    s.scores = a.scores + (int64_t)r * a.count;
    s.keys = keys;
    s.cached = 0;
    int32_t nonzero = 0;
    /* SEL_ITEMS loads in flight per thread, then their keys. */
    for (int32_t base = 0; base < n; base += SEL_THREADS * SEL_ITEMS) {
        float v[SEL_ITEMS];
#pragma unroll
        for (int e = 0; e < SEL_ITEMS; ++e) {
            const int32_t j = base + e * SEL_THREADS + (int32_t)threadIdx.x;
            v[e] = j < n ? s.scores[j] : 0.0f;
        }
#pragma unroll
        for (int e = 0; e < SEL_ITEMS; ++e) {
            const int32_t j = base + e * SEL_THREADS + (int32_t)threadIdx.x;
            if (j >= n) continue;
            const uint32_t key = sk_topk_is_forced(&s.rule, j) ? 0u : score_key(v[e]);
            if (j < SEL_SMEM_KEYS) keys[j] = key;
            nonzero += key != 0u;
        }
    }
    select_row(p, a, s, keys, hist, warp_part, pick, nonzero);
}

/* Two levels with few groups (max_groups <= PICK_MAX_GROUPS): the group
 * scoring and the group select as one CTA per row. Each warp scores its
 * groups with score.cuh's score_run (the same arithmetic), PICK_BATCH
 * loads in flight, and puts their keys straight into shared memory: no
 * score round trip through the workspace, one launch fewer. */
template <int PER>
__global__ void __launch_bounds__(SEL_THREADS, 1)
    sk_dsel_group_pick_kernel(const __grid_constant__ sk_dsel_problem p,
                              const __grid_constant__ score_args ga, const __grid_constant__ select_args gs) {
    enum { PICK_BATCH = PER <= 4 ? 8 : 4 };
    __shared__ uint32_t keys[SEL_SMEM_KEYS];
    __shared__ uint32_t hist[256];
    __shared__ int32_t warp_part[SEL_THREADS / 32];
    __shared__ int32_t pick[2];
    __shared__ float qs[2 * SC_MAX_DIM];
    const int32_t r = (int32_t)blockIdx.x;
    pdl_enter();
    const int32_t len = p.seq_lens[r / p.heads_kv];
    sum_queries(p, r, qs);
    sel_row s;
    s.rule = sk_dsel_row_rules((sk_dsel_blocks(sk_dsel_clamp_len(len, p.max_seqlen_k), p.block_k) +
                                gs.divisor - 1) / gs.divisor,
                               gs.sinks, gs.recent, gs.k);
    const int32_t n = s.rule.n_cand; /* <= max_groups <= SEL_SMEM_KEYS */
    s.scores = gs.scores + (int64_t)r * gs.count;
    s.keys = keys;
    s.cached = 0;
    __syncthreads();
    const int bf16 = p.dtype == SK_DTYPE_BF16;
    const int32_t warp = (int32_t)(threadIdx.x >> 5), lane = (int32_t)(threadIdx.x & 31);
    float qp[PER], qn[PER];
    lane_queries<PER>(qs, lane, qp, qn);
    const uint16_t *row = ga.summary + (int64_t)r * ga.count * 2 * p.head_dim;
    int32_t nonzero = 0;
    for (int32_t j0 = warp; j0 < n; j0 += SC_WARPS * PICK_BATCH) {
        float sc[PICK_BATCH];
        score_run<PER, PICK_BATCH>(row, j0, n, p.head_dim, bf16, lane, qp, qn, p.scale, sc);
#pragma unroll
        for (int u = 0; u < PICK_BATCH; ++u) {
            const int32_t j = j0 + u * SC_WARPS;
            if (lane != 0 || j >= n) continue;
            const uint32_t key = sk_topk_is_forced(&s.rule, j) ? 0u : score_key(sc[u]);
            keys[j] = key;
            nonzero += key != 0u;
        }
    }
    select_row(p, gs, s, keys, hist, warp_part, pick, nonzero);
}

static cudaError_t launch_group_pick(const sk_dsel_problem *p, const score_args *ga,
                                     const select_args *gs, cudaStream_t s) {
    launch_cfg l; /* the first kernel of a call: a plain launch */
    const cudaLaunchConfig_t *c = launch_config(&l, (unsigned)p->rows, SEL_THREADS, 0, s, 0);
    switch (p->head_dim / SK_DSEL_LANES) {
    case 1: return cudaLaunchKernelEx(c, sk_dsel_group_pick_kernel<1>, *p, *ga, *gs);
    case 2: return cudaLaunchKernelEx(c, sk_dsel_group_pick_kernel<2>, *p, *ga, *gs);
    case 3: return cudaLaunchKernelEx(c, sk_dsel_group_pick_kernel<3>, *p, *ga, *gs);
    case 4: return cudaLaunchKernelEx(c, sk_dsel_group_pick_kernel<4>, *p, *ga, *gs);
    case 5: return cudaLaunchKernelEx(c, sk_dsel_group_pick_kernel<5>, *p, *ga, *gs);
    case 6: return cudaLaunchKernelEx(c, sk_dsel_group_pick_kernel<6>, *p, *ga, *gs);
    case 7: return cudaLaunchKernelEx(c, sk_dsel_group_pick_kernel<7>, *p, *ga, *gs);
    default: return cudaLaunchKernelEx(c, sk_dsel_group_pick_kernel<8>, *p, *ga, *gs);
    }
}

__global__ void __launch_bounds__(PLACE_THREADS)
    sk_dsel_place_kernel(const __grid_constant__ sk_dsel_problem p, const int32_t *counts,
                         const int32_t *scratch) {
    __shared__ int32_t warp_part[PLACE_THREADS / 32];
    const int32_t r = (int32_t)blockIdx.x;
    pdl_enter();
    int32_t part = 0;
    for (int32_t i = (int32_t)threadIdx.x; i < r; i += PLACE_THREADS) part += counts[i];
    int32_t offset;
    (void)cta_exclusive_sum<PLACE_THREADS>(part, warp_part, &offset);
    const int32_t count = counts[r];
    if (threadIdx.x == 0) {
        p.row_offsets[r] = offset;
        if (r == p.rows - 1) p.row_offsets[p.rows] = offset + count;
    }
    const int32_t *src = scratch + (int64_t)r * p.row_cap;
    for (int32_t i = (int32_t)threadIdx.x; i < count; i += PLACE_THREADS)
        p.col_indices[offset + i] = src[i];
}

static size_t align_up(size_t x) { return (x + WS_ALIGN - 1) / WS_ALIGN * WS_ALIGN; }

/* Workspace: scores [rows, max_blocks] fp32, counts [rows], scratch
 * [rows, row_cap] int32; with two levels also the group scores [rows,
 * max_groups], counts [rows] and kept lists [rows, group_cap]; each part
 * WS_ALIGN-aligned. */
typedef struct ws_parts {
    float *scores, *group_scores;
    int32_t *counts, *scratch, *group_counts, *kept;
    size_t bytes;
} ws_parts;

static ws_parts ws_layout(const sk_dsel_problem *p, uintptr_t base) {
    const size_t rows = (size_t)p->rows;
    const size_t sizes[6] = {
        align_up(rows * (size_t)p->max_blocks * sizeof(float)),
        align_up(rows * sizeof(int32_t)),
        align_up(rows * (size_t)(p->row_cap > 0 ? p->row_cap : 1) * sizeof(int32_t)),
        p->max_groups > 0 ? align_up(rows * (size_t)p->max_groups * sizeof(float)) : 0,
        p->max_groups > 0 ? align_up(rows * sizeof(int32_t)) : 0,
        p->max_groups > 0 ? align_up(rows * (size_t)p->group_cap * sizeof(int32_t)) : 0};
    size_t at[6], total = 0;
    for (int i = 0; i < 6; ++i) {
        at[i] = total;
        total += sizes[i];
    }
    ws_parts w;
    w.scores = (float *)(base + at[0]);
    w.counts = (int32_t *)(base + at[1]);
    w.scratch = (int32_t *)(base + at[2]);
    w.group_scores = (float *)(base + at[3]);
    w.group_counts = (int32_t *)(base + at[4]);
    w.kept = (int32_t *)(base + at[5]);
    w.bytes = total;
    return w;
}

sk_status sk_cuda_dsel_workspace_size(const sk_dsel_problem *p, size_t *bytes) {
    *bytes = ws_layout(p, 0).bytes;
    return SK_STATUS_SUCCESS;
}

/* A launch of one CTA per row; with programmatic serialization when
 * `pdl` (see sk_cuda_dsel_select). */
template <typename Kernel, typename Args>
static cudaError_t launch_rows(const sk_dsel_problem *p, Kernel kernel, unsigned threads,
                               const Args &args, int pdl, cudaStream_t s) {
    launch_cfg l;
    return cudaLaunchKernelEx(launch_config(&l, (unsigned)p->rows, threads, 0, s, pdl), kernel, *p,
                              args);
}

sk_status sk_cuda_dsel_select(const sk_dsel_problem *p, void *workspace, size_t workspace_size,
                              struct CUstream_st *stream) {
    const ws_parts w = ws_layout(p, (uintptr_t)workspace);
    if (workspace_size < w.bytes)
        return sk_error(SK_STATUS_BAD_PARAM_WORKSPACE, "workspace_size = %zu, %zu needed",
                        workspace_size, w.bytes);
    /* On a 9.0 device every kernel after the first is launched with
     * programmatic stream serialization: its CTAs are scheduled while its
     * predecessor drains and wait (pdl_enter) before they read anything. */
    int pdl = 0;
    SK_TRY(dsel_check_device(p->backend, &pdl));
    const cudaStream_t s = (cudaStream_t)stream;
    const uint16_t *sum = (const uint16_t *)p->summary;
    score_args sa, ga, ka;
    memset(&sa, 0, sizeof sa);
    sa.summary = sum;
    sa.count = p->max_blocks;
    sa.divisor = 1;
    sa.tile = SC_TILE;
    sa.scores = w.scores;
    ga = ka = sa;
    if (p->max_groups > 0) { /* the groups' pass, then the kept groups' blocks' */
        ga.summary = sum + (int64_t)p->rows * p->max_blocks * 2 * p->head_dim;
        ga.count = p->max_groups;
        ga.divisor = p->group_blocks;
        ga.tile = SC_RUN;
        ga.scores = w.group_scores;
        ka.tile = SC_RUN;
        ka.kept = w.kept;
        ka.kept_counts = w.group_counts;
        ka.kept_stride = p->group_cap;
        ka.group_blocks = p->group_blocks;
    }
    const int64_t ctas = p->max_groups > 0 ? (score_ctas(p, &ga) > score_ctas(p, &ka)
                                                  ? score_ctas(p, &ga)
                                                  : score_ctas(p, &ka))
                                           : score_ctas(p, &sa);
    if (ctas > INT32_MAX)
        return sk_error(SK_STATUS_NOT_SUPPORTED, "%d rows need %lld score CTAs, over one grid",
                        (int)p->rows, (long long)ctas);
    const select_args bs = {w.scores, p->max_blocks, 1, p->sink_blocks, p->recent_blocks, p->k,
                            p->row_cap, w.counts, w.scratch, NULL};
    if (p->max_groups > 0) {
        const select_args gs = {w.group_scores, p->max_groups, p->group_blocks, 0, 0,
                                p->top_groups, p->group_cap, w.group_counts, w.kept, w.scores};
        if (p->max_groups <= PICK_MAX_GROUPS) {
            SK_CUDA_TRY(launch_group_pick(p, &ga, &gs, s), "group pick kernel launch");
        } else {
            SK_CUDA_TRY(launch_score(p, &ga, 0, s), "group score kernel launch");
            SK_CUDA_TRY(launch_rows(p, sk_dsel_select_kernel, SEL_THREADS, gs, pdl, s),
                        "group select kernel launch");
        }
        SK_CUDA_TRY(launch_score(p, &ka, pdl, s), "kept score kernel launch");
    } else {
        SK_CUDA_TRY(launch_score(p, &sa, 0, s), "score kernel launch");
    }
    SK_CUDA_TRY(launch_rows(p, sk_dsel_select_kernel, SEL_THREADS, bs, pdl, s),
                "select kernel launch");
    launch_cfg l;
    const cudaLaunchConfig_t *c = launch_config(&l, (unsigned)p->rows, PLACE_THREADS, 0, s, pdl);
    return sk_cuda_status(cudaLaunchKernelEx(c, sk_dsel_place_kernel, *p, (const int32_t *)w.counts,
                                             (const int32_t *)w.scratch),
                          "place kernel launch");
}
