/*
 * select.cu - the decode selection on the GPU (sk_decode_select): three
 * kernels on one stream, no host synchronisation, fixed workspace.
 *
 *   score   per (row, 64-block tile) CTA: the row's query sums Qp, Qn
 *           (sparsek.h order: t, then g) in shared memory, then one warp
 *           per key block: lane l's FMA chain over its D/32 channels, the
 *           xor-butterfly over the 32 lanes (lane 0 holds (l0 + l16) +
 *           (l8 + l24) ..., the CPU reference's pairwise order), times
 *           scale -> scores[row, j] in the workspace, for the row's
 *           ceil(len / block_k) candidates only.
 *   select  one CTA per row: scores -> order-preserving keys (topk's
 *           score_key; forced blocks, NaN, -inf -> 0), kept in shared
 *           memory up to SEL_SMEM_KEYS blocks (re-read from the scores past
 *           that); if more than k keys are non-zero, an MSB-first radix
 *           select (4 passes of 8 bits, topk's radix_pick on a 256-bin
 *           histogram) finds the k-th largest key T and how many keys equal
 *           to T to take; one pass in index order (8 consecutive blocks
 *           per thread, two CTA scans per 2048 blocks) keeps the forced
 *           blocks, keys > T and the lowest-index ties, each row's blocks
 *           into a fixed-stride scratch row (row_cap), and its count.
 *   place   one CTA per row: its offset (the sum of the earlier rows'
 *           counts), row_offsets, and the copy into col_indices.
 * With two levels (p->max_groups > 0) a score and a select pass over the
 * group summaries come first (no forced group, k = top_groups, the kept
 * lists in the workspace, increasing); the block scoring then writes -inf
 * for the blocks of the other groups without reading their summaries.
 * The rules are sk_dsel_row_rules (core/decode_select.h), the host's.
 */
#include <string.h>

#include "cuda/backend.h"
#include "cuda/decode_select/dsel.cuh"
#include "cuda/topk/kernels.cuh"

enum {
    SC_THREADS = 256,
    SC_WARPS = SC_THREADS / 32,
    SC_TILE = 64,           /* key blocks per scoring CTA */
    SC_MAX_DIM = 256,       /* the most channels (sparsek.h) */
    SEL_THREADS = 256,
    SEL_SMEM_KEYS = 8192,   /* keys of a row kept in shared memory (32 KB) */
    SEL_ITEMS = 8,          /* consecutive blocks per thread in the writing pass */
    PLACE_THREADS = 256,
    WS_ALIGN = 256
};

static __device__ __forceinline__ int32_t row_blocks(const sk_dsel_problem &p, int32_t r) {
    return sk_dsel_blocks(sk_dsel_clamp_len(p.seq_lens[r / p.heads_kv], p.max_seqlen_k),
                          p.block_k);
}

/* PER consecutive 16-bit values as fp32: one 4-, 8- or 16-byte load when
 * PER is 2, 4 or 8 (lane * PER * 2 bytes into a row of 2 * D * 2 bytes:
 * aligned), else one load per value. */
template <int PER>
static __device__ __forceinline__ void load_lane(const uint16_t *src, int bf16, float out[PER]) {
    if (PER == 2 || PER == 4 || PER == 8) {
        uint32_t w[4] = {0u, 0u, 0u, 0u};
        if (PER == 2) {
            w[0] = *reinterpret_cast<const uint32_t *>(src);
        } else if (PER == 4) {
            const uint2 v = *reinterpret_cast<const uint2 *>(src);
            w[0] = v.x;
            w[1] = v.y;
        } else {
            const uint4 v = *reinterpret_cast<const uint4 *>(src);
            w[0] = v.x;
            w[1] = v.y;
            w[2] = v.z;
            w[3] = v.w;
        }
#pragma unroll
        for (int c = 0; c < PER; ++c)
            out[c] = dsel_to_f32((w[c / 2] >> (16 * (c % 2))) & 0xffffu, bf16);
    } else {
#pragma unroll
        for (int c = 0; c < PER; ++c) out[c] = dsel_to_f32(src[c], bf16);
    }
}

/* Blocks a warp loads before it reduces: more loads in flight. */
enum { SC_BATCH = 2 };

/* One scoring pass: over the block summaries, or (two levels) over the
 * group summaries first, then over the blocks of the kept groups. */
typedef struct score_args {
    const uint16_t *summary; /* [rows, count, 2, D] */
    int32_t count;           /* summaries per row: max_blocks or max_groups */
    int32_t divisor;         /* a row scores ceil(n / divisor) of them: 1 or group_blocks */
    const int32_t *kept;     /* NULL, or the kept groups [rows, kept_stride], increasing */
    const int32_t *kept_counts; /* [rows] */
    int32_t kept_stride, group_blocks;
    float *scores;           /* [rows, count] */
} score_args;

/* Whether group g is in the row's kept list (sorted: binary search). */
static __device__ __forceinline__ bool group_kept(const int32_t *list, int32_t count, int32_t g) {
    int32_t lo = 0, hi = count;
    while (lo < hi) {
        const int32_t mid = (lo + hi) >> 1;
        if (list[mid] < g)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < count && list[lo] == g;
}

template <int PER>
__global__ void __launch_bounds__(SC_THREADS, 1)
    sk_dsel_score_kernel(const __grid_constant__ sk_dsel_problem p, const __grid_constant__ score_args a) {
    __shared__ float qs[2 * SC_MAX_DIM]; /* Qp, then Qn */
    const int32_t tiles = (a.count + SC_TILE - 1) / SC_TILE;
    const int32_t r = (int32_t)(blockIdx.x / tiles), tile = (int32_t)(blockIdx.x % tiles);
    const int32_t n = (row_blocks(p, r) + a.divisor - 1) / a.divisor;
    const int32_t j_begin = tile * SC_TILE;
    const int32_t j_end = j_begin + SC_TILE < n ? j_begin + SC_TILE : n;
    if (j_begin >= j_end) return; /* the same for the whole CTA */
    const int bf16 = p.dtype == SK_DTYPE_BF16;
    const int32_t b = r / p.heads_kv, h = r % p.heads_kv;
    const uint16_t *q = (const uint16_t *)p.q;
    for (int32_t d = (int32_t)threadIdx.x; d < p.head_dim; d += SC_THREADS) {
        float qp = 0.0f, qn = 0.0f;
        for (int32_t t = 0; t < p.q_len; ++t)
            for (int32_t g = 0; g < p.group; ++g) {
                const int64_t at = b * p.q_stride[0] + t * p.q_stride[1] +
                                   ((int64_t)h * p.group + g) * p.q_stride[2] + d;
                const float x = dsel_to_f32(q[at], bf16);
                qp += x > 0.0f ? x : 0.0f;
                qn += x < 0.0f ? x : 0.0f;
            }
        qs[d] = qp;
        qs[SC_MAX_DIM + d] = qn;
    }
    __syncthreads();
    const int32_t warp = (int32_t)(threadIdx.x >> 5), lane = (int32_t)(threadIdx.x & 31);
    float qp[PER], qn[PER];
#pragma unroll
    for (int c = 0; c < PER; ++c) {
        qp[c] = qs[lane * PER + c];
        qn[c] = qs[SC_MAX_DIM + lane * PER + c];
    }
    const uint16_t *row = a.summary + (int64_t)r * a.count * 2 * p.head_dim;
    float *out = a.scores + (int64_t)r * a.count;
    const int32_t *kept = a.kept != NULL ? a.kept + (int64_t)r * a.kept_stride : NULL;
    int32_t kept_count = a.kept != NULL ? a.kept_counts[r] : 0; /* the select kernel's: in range */
    kept_count = kept_count < 0 ? 0 : (kept_count > a.kept_stride ? a.kept_stride : kept_count);
    for (int32_t j0 = j_begin + warp; j0 < j_end; j0 += SC_WARPS * SC_BATCH) {
        float mn[SC_BATCH][PER], mx[SC_BATCH][PER];
        bool skip[SC_BATCH]; /* the same for the whole warp */
#pragma unroll
        for (int u = 0; u < SC_BATCH; ++u) {
            const int32_t j = j0 + u * SC_WARPS;
            skip[u] = j >= j_end;
            if (!skip[u] && kept != NULL && !group_kept(kept, kept_count, j / a.group_blocks)) {
                skip[u] = true; /* outside the kept groups: -inf, summary unread */
                if (lane == 0) out[j] = __int_as_float((int)0xff800000u);
            }
            if (skip[u]) continue;
            const uint16_t *blk = row + (int64_t)j * 2 * p.head_dim + lane * PER;
            load_lane<PER>(blk + p.head_dim, bf16, mx[u]);
            load_lane<PER>(blk, bf16, mn[u]);
        }
#pragma unroll
        for (int u = 0; u < SC_BATCH; ++u) {
            const int32_t j = j0 + u * SC_WARPS;
            if (skip[u]) continue;
            float acc = 0.0f;
#pragma unroll
            for (int c = 0; c < PER; ++c) {
                acc = fmaf(qp[c], mx[u][c], acc);
                acc = fmaf(qn[c], mn[u][c], acc);
            }
#pragma unroll
            for (int o = SK_DSEL_LANES / 2; o >= 1; o >>= 1)
                acc = acc + __shfl_xor_sync(0xffffffffu, acc, o);
            if (lane == 0) out[j] = acc * p.scale;
        }
    }
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
        for (int32_t j = (int32_t)threadIdx.x; j < n; j += SEL_THREADS) {
            const uint32_t key = sel_key(s, j);
            if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
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
} select_args;

__global__ void __launch_bounds__(SEL_THREADS)
    sk_dsel_select_kernel(const __grid_constant__ sk_dsel_problem p, const __grid_constant__ select_args a) {
    __shared__ uint32_t keys[SEL_SMEM_KEYS];
    __shared__ uint32_t hist[256];
    __shared__ int32_t warp_part[SEL_THREADS / 32];
    __shared__ int32_t pick[2];
    const int32_t r = (int32_t)blockIdx.x;
    sel_row s;
    s.rule = sk_dsel_row_rules((row_blocks(p, r) + a.divisor - 1) / a.divisor, a.sinks, a.recent, a.k);
    const int32_t n = s.rule.n_cand;
    s.scores = a.scores + (int64_t)r * a.count;
    s.keys = keys;
    s.cached = 0;
    int32_t nonzero = 0;
    for (int32_t j = (int32_t)threadIdx.x; j < n; j += SEL_THREADS) {
        const uint32_t key = sel_key(s, j);
        if (j < SEL_SMEM_KEYS) keys[j] = key;
        nonzero += key != 0u;
    }
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
        for (int e = 0; e < SEL_ITEMS; ++e)
            if ((picked >> e) & 1u) {
                if (pos < a.row_cap) out[pos] = j0 + e;
                ++pos;
            }
    }
    if (threadIdx.x == 0) a.counts[r] = sel_before < a.row_cap ? sel_before : a.row_cap;
}

__global__ void __launch_bounds__(PLACE_THREADS)
    sk_dsel_place_kernel(const __grid_constant__ sk_dsel_problem p, const int32_t *counts,
                         const int32_t *scratch) {
    __shared__ int32_t warp_part[PLACE_THREADS / 32];
    const int32_t r = (int32_t)blockIdx.x;
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

static void launch_score(const sk_dsel_problem *p, const score_args *a, cudaStream_t s) {
    const unsigned ctas = (unsigned)((int64_t)p->rows * ((a->count + SC_TILE - 1) / SC_TILE));
    switch (p->head_dim / SK_DSEL_LANES) {
    case 1: sk_dsel_score_kernel<1><<<ctas, SC_THREADS, 0, s>>>(*p, *a); break;
    case 2: sk_dsel_score_kernel<2><<<ctas, SC_THREADS, 0, s>>>(*p, *a); break;
    case 3: sk_dsel_score_kernel<3><<<ctas, SC_THREADS, 0, s>>>(*p, *a); break;
    case 4: sk_dsel_score_kernel<4><<<ctas, SC_THREADS, 0, s>>>(*p, *a); break;
    case 5: sk_dsel_score_kernel<5><<<ctas, SC_THREADS, 0, s>>>(*p, *a); break;
    case 6: sk_dsel_score_kernel<6><<<ctas, SC_THREADS, 0, s>>>(*p, *a); break;
    case 7: sk_dsel_score_kernel<7><<<ctas, SC_THREADS, 0, s>>>(*p, *a); break;
    default: sk_dsel_score_kernel<8><<<ctas, SC_THREADS, 0, s>>>(*p, *a); break;
    }
}

sk_status sk_cuda_dsel_select(const sk_dsel_problem *p, void *workspace, size_t workspace_size,
                              struct CUstream_st *stream) {
    const ws_parts w = ws_layout(p, (uintptr_t)workspace);
    if (workspace_size < w.bytes)
        return sk_error(SK_STATUS_BAD_PARAM_WORKSPACE, "workspace_size = %zu, %zu needed",
                        workspace_size, w.bytes);
    SK_TRY(dsel_check_device(p->backend));
    const int64_t tiles = (p->max_blocks + SC_TILE - 1) / SC_TILE;
    if ((int64_t)p->rows * tiles > INT32_MAX)
        return sk_error(SK_STATUS_NOT_SUPPORTED, "%d rows x %lld score tiles exceed one grid",
                        (int)p->rows, (long long)tiles);
    const cudaStream_t s = (cudaStream_t)stream;
    const uint16_t *sum = (const uint16_t *)p->summary;
    score_args sa;
    memset(&sa, 0, sizeof sa);
    sa.summary = sum;
    sa.count = p->max_blocks;
    sa.divisor = 1;
    sa.scores = w.scores;
    if (p->max_groups > 0) { /* the first level: groups, then the kept groups' blocks */
        score_args ga = sa;
        ga.summary = sum + (int64_t)p->rows * p->max_blocks * 2 * p->head_dim;
        ga.count = p->max_groups;
        ga.divisor = p->group_blocks;
        ga.scores = w.group_scores;
        launch_score(p, &ga, s);
        SK_CUDA_TRY(cudaGetLastError(), "group score kernel launch");
        select_args gs = {w.group_scores, p->max_groups, p->group_blocks, 0, 0, p->top_groups,
                          p->group_cap, w.group_counts, w.kept};
        sk_dsel_select_kernel<<<(unsigned)p->rows, SEL_THREADS, 0, s>>>(*p, gs);
        SK_CUDA_TRY(cudaGetLastError(), "group select kernel launch");
        sa.kept = w.kept;
        sa.kept_counts = w.group_counts;
        sa.kept_stride = p->group_cap;
        sa.group_blocks = p->group_blocks;
    }
    launch_score(p, &sa, s);
    SK_CUDA_TRY(cudaGetLastError(), "score kernel launch");
    select_args bs = {w.scores, p->max_blocks, 1, p->sink_blocks, p->recent_blocks, p->k,
                      p->row_cap, w.counts, w.scratch};
    sk_dsel_select_kernel<<<(unsigned)p->rows, SEL_THREADS, 0, s>>>(*p, bs);
    SK_CUDA_TRY(cudaGetLastError(), "select kernel launch");
    sk_dsel_place_kernel<<<(unsigned)p->rows, PLACE_THREADS, 0, s>>>(*p, w.counts, w.scratch);
    return sk_cuda_status(cudaGetLastError(), "place kernel launch");
}
