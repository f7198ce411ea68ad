/*
 * topk.cu - the CUDA top-k block selection: block means, block scores, and
 * the per-row selection into a BSR layout, all enqueued on one stream with
 * no allocation and no host synchronisation (CUDA-graph capturable).
 *
 * Kernels, in launch order:
 *   pool     one launch for Q and K: one thread per (head, 8-element chunk
 *            of D) of one block of one tensor, 16-byte loads of the block's
 *            tokens (8 in flight), fp32 sums, one division by the token
 *            count. Q and K are read once (bandwidth-bound: about 98% of a
 *            plain read kernel on the H200, docs/perf/topk.md).
 *   group sum  with per_kv_head and a group > 1 only: the fp32 sum of each group's pooled
 *            Q rows (ascending head order), the scoring's A operand.
 *   score    scores[slice, i, j] = scale * sum_d A[i, d] * pooled_k[j, d]: a
 *            plain fp32 SIMT GEMM (FMA), 128 x 128 tiles, 8 x 8 outputs per
 *            thread, D in steps of 8 through shared memory with a register
 *            prefetch, two CTAs per SM. With causal, tiles wholly past the
 *            candidates of their last row are skipped (those scores are
 *            never read). Streaming stores keep the operands in L2.
 *   select   one warp per layout row. Scores become order-preserving 32-bit
 *            keys (NaN, -inf, forced and non-candidate blocks -> key 0,
 *            -0 -> +0), kept in shared memory when the row has at most
 *            SEL_CACHE candidates. If at most k keys are non-zero all are
 *            taken. Else, for k <= 32 (the filter path): t = the k-th
 *            largest of the 32 lanes' maxima is at most the k-th largest
 *            key T, so the keys >= t (usually a few more than k) hold every
 *            key >= T; gathered as (key, ~index) composites, the k-th largest
 *            composite (rank counting) gives T and the index of the last tie
 *            taken. Otherwise (k > 32, or more than SEL_FILTER keys >= t) an
 *            MSB-first radix select (4 passes of 8 bits, a 256-bin warp
 *            histogram) finds T and how many keys equal to T to take. One
 *            pass in index order then keeps forced blocks, keys > T and the
 *            lowest-index ties (the documented tie rule), writing them in
 *            increasing order into a fixed-stride scratch row, and the count.
 *   compact  up to CMP_MAX_CTAS CTAs: each sums the counts of the rows before
 *            its range itself, scans its rows (row_offsets) and copies their
 *            scratch entries into col_indices.
 * The counts depend on the scores only through NaN / -inf (see
 * topk_backend.h), so the layout equals the host rules' bit for bit for the
 * same scores, and two runs are identical.
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda/cuda_check.cuh"
#include "cuda/topk_backend.h"

enum {
    WS_ALIGN = 256,
    POOL_THREADS = 256,
    POOL_INFLIGHT = 8, /* 16-byte loads in flight per thread */
    SC_TM = 128,       /* score tile rows (query blocks) */
    SC_TN = 128,       /* score tile columns (key blocks) */
    SC_KC = 8,         /* D step through shared memory */
    SC_PAD = 4,        /* keeps the float4 rows of the transposed tiles 16-byte aligned */
    SC_THREADS = 256,
    SUM_THREADS = 256,
    SEL_WARPS = 4,     /* rows per CTA */
    SEL_CACHE = 1024,  /* keys of a row kept in shared memory (4 KB per warp) */
    SEL_FILTER = 128,  /* filter-path candidates (uint64, in the warp's 1 KB histogram) */
    SEL_UNROLL = 8,    /* score loads in flight per lane in the first pass */
    CMP_THREADS = 256, /* compaction: one row per thread in the scan, a warp per row in the copy */
    CMP_MAX_CTAS = 128
};

static size_t align_up(size_t x) { return (x + WS_ALIGN - 1) / WS_ALIGN * WS_ALIGN; }

/* Byte offsets of the workspace regions (see topk_backend.h). */
typedef struct ws_layout {
    size_t scores_off, qsum_off, counts_off, scratch_off, total;
} ws_layout;

/* With per_kv_head and a group of more than one head, the group sums of the
 * pooled Q rows (the scoring's A operand, [B, Hkv, row_blocks, D] fp32). */
static int needs_qsum(const sk_topk_problem *p, int with_scores) {
    return with_scores && p->per_kv_head && p->group > 1;
}

static ws_layout workspace_layout(const sk_topk_problem *p, int with_scores) {
    ws_layout w;
    w.scores_off = 0;
    const size_t scores = with_scores ? align_up((size_t)p->total_rows * p->col_blocks * 4) : 0;
    w.qsum_off = scores;
    const size_t qsum =
        needs_qsum(p, with_scores) ? align_up((size_t)p->total_rows * (size_t)p->head_dim * 4) : 0;
    w.counts_off = w.qsum_off + qsum;
    w.scratch_off = w.counts_off + align_up((size_t)p->total_rows * 4);
    w.total = w.scratch_off + (size_t)p->total_rows * (size_t)p->row_cap * 4;
    return w;
}

/* ---------------------------------------------------------------------------
 * Pooling
 * ------------------------------------------------------------------------- */

typedef struct pool_tensor {
    const char *src;                      /* [B, S, H, D] F16 or BF16 */
    int64_t stride_b, stride_s, stride_h; /* elements */
    int64_t seq;
    int32_t heads, block, nblocks;
    float *dst;                           /* [B, H, nblocks, D] */
} pool_tensor;

typedef struct pool_params {
    pool_tensor t[2]; /* Q, then K: blockIdx.x < t[0].nblocks pools Q */
    int32_t batch, dim, chunks; /* chunks = D / 8 */
    int32_t bf16;
} pool_params;

/* acc[0..8) += the 8 fp16/bf16 values of v (widening is exact). */
static __device__ __forceinline__ void add8(float acc[8], uint4 v, int bf16) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        float lo, hi;
        if (bf16) {
            lo = __uint_as_float(w[e] << 16);
            hi = __uint_as_float(w[e] & 0xffff0000u);
        } else {
            lo = __half2float(__ushort_as_half((unsigned short)(w[e] & 0xffffu)));
            hi = __half2float(__ushort_as_half((unsigned short)(w[e] >> 16)));
        }
        acc[2 * e] += lo;
        acc[2 * e + 1] += hi;
    }
}

__global__ void __launch_bounds__(POOL_THREADS, 4) sk_topk_pool_kernel(const __grid_constant__ pool_params p) {
    const int which = (int32_t)blockIdx.x >= p.t[0].nblocks;
    const pool_tensor t = which ? p.t[1] : p.t[0];
    const int32_t blk = (int32_t)blockIdx.x - (which ? p.t[0].nblocks : 0);
    const int32_t item = (int32_t)blockIdx.y * POOL_THREADS + (int32_t)threadIdx.x;
    if (item >= t.heads * p.chunks) return;
    const int32_t h = item / p.chunks, c = item - h * p.chunks;
    const int64_t t0 = (int64_t)blk * t.block;
    const int32_t count = (int32_t)(t.seq - t0 < t.block ? t.seq - t0 : t.block);
    /* The sequence stride is a multiple of 16 bytes whenever it is stepped. */
    const int64_t step = t.stride_s / 8;
    for (int32_t b = (int32_t)blockIdx.z; b < p.batch; b += (int32_t)gridDim.z) {
        const uint4 *src = (const uint4 *)(t.src + 2 * (b * t.stride_b + t0 * t.stride_s +
                                                        h * t.stride_h + (int64_t)c * 8));
        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        int32_t u0 = 0;
        for (; u0 + POOL_INFLIGHT <= count; u0 += POOL_INFLIGHT) {
            uint4 v[POOL_INFLIGHT];
#pragma unroll
            for (int u = 0; u < POOL_INFLIGHT; ++u) v[u] = __ldg(src + (int64_t)(u0 + u) * step);
#pragma unroll
            for (int u = 0; u < POOL_INFLIGHT; ++u) add8(acc, v[u], p.bf16);
        }
        for (; u0 < count; ++u0) add8(acc, __ldg(src + (int64_t)u0 * step), p.bf16);
        const float n = (float)count;
        float4 *out = (float4 *)(t.dst + (((int64_t)b * t.heads + h) * t.nblocks + blk) * p.dim +
                                 (int64_t)c * 8);
        out[0] = make_float4(acc[0] / n, acc[1] / n, acc[2] / n, acc[3] / n);
        out[1] = make_float4(acc[4] / n, acc[5] / n, acc[6] / n, acc[7] / n);
    }
}

static void pool_tensor_set(pool_tensor *t, const void *src, const int64_t stride[3], int64_t seq,
                            int64_t heads, int32_t block, int32_t nblocks, float *dst) {
    t->src = (const char *)src;
    t->stride_b = stride[0];
    t->stride_s = stride[1];
    t->stride_h = stride[2];
    t->seq = seq;
    t->heads = (int32_t)heads;
    t->block = block;
    t->nblocks = nblocks;
    t->dst = dst;
}

/* One launch pools Q (the first row_blocks CTAs along x) and K. */
static sk_status launch_pool(const sk_topk_problem *p, cudaStream_t stream) {
    pool_params pp;
    pool_tensor_set(&pp.t[0], p->q, p->q_stride, p->seq_q, p->heads_q, p->block_q, p->row_blocks,
                    p->pooled_q_out);
    pool_tensor_set(&pp.t[1], p->k_in, p->k_stride, p->seq_k, p->heads_kv, p->block_k,
                    p->col_blocks, p->pooled_k_out);
    pp.batch = (int32_t)p->batch;
    pp.dim = (int32_t)p->head_dim;
    pp.chunks = (int32_t)(p->head_dim / 8);
    pp.bf16 = p->dtype == SK_DTYPE_BF16;
    const int64_t items = p->heads_q * (p->head_dim / 8); /* heads_q >= heads_kv */
    const int64_t gy = (items + POOL_THREADS - 1) / POOL_THREADS;
    const int64_t gx = (int64_t)p->row_blocks + p->col_blocks;
    if (items > INT32_MAX || gy > 65535 || gx > INT32_MAX)
        return sk_error(SK_STATUS_NOT_SUPPORTED,
                        "heads_q x head_dim = %lld x %lld (or the block count) is too large for "
                        "the CUDA pooling kernel",
                        (long long)p->heads_q, (long long)p->head_dim);
    dim3 grid((unsigned)gx, (unsigned)gy, (unsigned)(p->batch < 65535 ? p->batch : 65535));
    sk_topk_pool_kernel<<<grid, POOL_THREADS, 0, stream>>>(pp);
    return sk_cuda_status(cudaGetLastError(), "pooling kernel launch");
}

/* ---------------------------------------------------------------------------
 * Scoring
 * ------------------------------------------------------------------------- */

typedef struct score_params {
    const float *a;        /* [slices, row_blocks, D]: pooled Q of the slice's head (or group sum) */
    const float *pooled_k; /* [B, Hkv, col_blocks, D] */
    float *scores;         /* [slices, row_blocks, col_blocks] */
    sk_topk_problem p;     /* geometry and rules */
    int64_t a_slice_stride; /* elements between slices of a */
    int32_t tiles_i, tiles_j;
} score_params;

/* Group sums for per_kv_head: qsum[b, hk, i, :] = sum over the group's query
 * heads h = hk * G .. hk * G + G - 1 (ascending) of pooled_q[b, h, i, :],
 * fp32; one thread per 4 values. */
__global__ void __launch_bounds__(SUM_THREADS) sk_topk_group_sum_kernel(const float *pooled_q, int32_t group,
                                                             int64_t rows_d, int64_t n4,
                                                             float *qsum) {
    for (int64_t e = (int64_t)blockIdx.x * SUM_THREADS + threadIdx.x; e < n4;
         e += (int64_t)gridDim.x * SUM_THREADS) {
        const int64_t slice = e * 4 / rows_d, at = e * 4 - slice * rows_d;
        const float *src = pooled_q + slice * group * rows_d + at;
        float4 a = __ldg((const float4 *)src);
        for (int32_t g = 1; g < group; ++g) {
            const float4 v = __ldg((const float4 *)(src + g * rows_d));
            a.x += v.x;
            a.y += v.y;
            a.z += v.z;
            a.w += v.w;
        }
        *(float4 *)(qsum + e * 4) = a;
    }
}

/* scores = scale * A B^T per slice, fp32 FMA. 128 x 128 tile, 256 threads,
 * 8 x 8 outputs per thread (rows ty*4 + r and 64 + ty*4 + r, columns tx*4 + c
 * and 64 + tx*4 + c); D in steps of SC_KC through shared memory (transposed,
 * so each step reads float4 rows), the next step prefetched into registers.
 * Rows and columns past the end read the last valid row (never stored).
 * Scores are written with streaming stores: the selection reads them once,
 * while the pooled operands should stay in L2. */
__global__ void __launch_bounds__(SC_THREADS, 2) sk_topk_score_kernel(const __grid_constant__ score_params sp) {
    static_assert(SC_TM == 128 && SC_TN == 128 && SC_THREADS == 256 && SC_KC == 8,
                  "thread layout: 16 x 16 threads of 8 x 8 outputs, 2 loads of 4 per step");
    static_assert(2 * SC_KC * (SC_TM + SC_PAD) * 4 <= 48 * 1024, "static shared memory budget");
    const sk_topk_problem *p = &sp.p;
    const int32_t tile = (int32_t)blockIdx.x;
    const int32_t tj = tile % sp.tiles_j;
    const int32_t ti = (tile / sp.tiles_j) % sp.tiles_i;
    const int32_t slice = tile / sp.tiles_j / sp.tiles_i;
    const int32_t i0 = ti * SC_TM, j0 = tj * SC_TN;
    const int32_t rb = p->row_blocks, cb = p->col_blocks;
    if (p->causal) {
        const int32_t last = i0 + SC_TM - 1 < rb - 1 ? i0 + SC_TM - 1 : rb - 1;
        if (j0 >= sk_topk_row_rules(p, last).n_cand) return; /* no candidate in the tile */
    }
    const int32_t dim = (int32_t)p->head_dim;
    const int32_t b = slice / p->heads, hs = slice % p->heads;
    const int32_t hk = p->per_kv_head ? hs : hs / p->group;

    __shared__ __align__(16) float As[SC_KC][SC_TM + SC_PAD];
    __shared__ __align__(16) float Bs[SC_KC][SC_TN + SC_PAD];
    const int32_t tid = (int32_t)threadIdx.x;
    const int32_t lr = tid >> 1, lc = (tid & 1) * 4; /* loader: tile row, 4 of the 8 d's */
    const int32_t tx = tid % 16, ty = tid / 16;
    const int32_t ar = i0 + lr < rb ? i0 + lr : rb - 1, br = j0 + lr < cb ? j0 + lr : cb - 1;
    const float *a_src = sp.a + (int64_t)slice * sp.a_slice_stride + (int64_t)ar * dim + lc;
    const float *b_src = sp.pooled_k + (((int64_t)b * p->heads_kv + hk) * cb + br) * dim + lc;

    float acc[8][8];
#pragma unroll
    for (int r = 0; r < 8; ++r)
#pragma unroll
        for (int c = 0; c < 8; ++c) acc[r][c] = 0.f;

    float4 ra = __ldg((const float4 *)a_src), rk = __ldg((const float4 *)b_src);
    for (int32_t k0 = 0; k0 < dim; k0 += SC_KC) {
        As[lc + 0][lr] = ra.x;
        As[lc + 1][lr] = ra.y;
        As[lc + 2][lr] = ra.z;
        As[lc + 3][lr] = ra.w;
        Bs[lc + 0][lr] = rk.x;
        Bs[lc + 1][lr] = rk.y;
        Bs[lc + 2][lr] = rk.z;
        Bs[lc + 3][lr] = rk.w;
        __syncthreads();
        if (k0 + SC_KC < dim) {
            ra = __ldg((const float4 *)(a_src + k0 + SC_KC));
            rk = __ldg((const float4 *)(b_src + k0 + SC_KC));
        }
#pragma unroll
        for (int kk = 0; kk < SC_KC; ++kk) {
            const float4 a0 = *(const float4 *)&As[kk][ty * 4];
            const float4 a1 = *(const float4 *)&As[kk][64 + ty * 4];
            const float4 b0 = *(const float4 *)&Bs[kk][tx * 4];
            const float4 b1 = *(const float4 *)&Bs[kk][64 + tx * 4];
            const float av[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
            const float bv[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
            for (int r = 0; r < 8; ++r)
#pragma unroll
                for (int c = 0; c < 8; ++c) acc[r][c] = fmaf(av[r], bv[c], acc[r][c]);
        }
        __syncthreads();
    }

    const float scale = p->scale;
    const int vec = (cb % 4) == 0;
#pragma unroll
    for (int r = 0; r < 8; ++r) {
        const int32_t i = i0 + (r < 4 ? ty * 4 + r : 64 + ty * 4 + (r - 4));
        if (i >= rb) continue;
        float *out = sp.scores + ((int64_t)slice * rb + i) * cb;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int32_t j = j0 + half * 64 + tx * 4;
            const float v0 = scale * acc[r][half * 4 + 0], v1 = scale * acc[r][half * 4 + 1];
            const float v2 = scale * acc[r][half * 4 + 2], v3 = scale * acc[r][half * 4 + 3];
            if (vec && j + 3 < cb) {
                __stcs((float4 *)(out + j), make_float4(v0, v1, v2, v3));
            } else {
                if (j + 0 < cb) __stcs(out + j + 0, v0);
                if (j + 1 < cb) __stcs(out + j + 1, v1);
                if (j + 2 < cb) __stcs(out + j + 2, v2);
                if (j + 3 < cb) __stcs(out + j + 3, v3);
            }
        }
    }
}

/* ---------------------------------------------------------------------------
 * Selection
 * ------------------------------------------------------------------------- */

typedef struct select_params {
    sk_topk_problem p;
    const float *scores; /* [total_rows, col_blocks] */
    int32_t *counts;     /* [total_rows] */
    int32_t *scratch;    /* [total_rows, row_cap] */
} select_params;

/* Larger score -> larger key; 0 for scores never picked (NaN, -inf). -0 and
 * +0 share a key, so they tie. Every other key is >= 0x00800000. */
static __device__ __forceinline__ uint32_t score_key(float s) {
    uint32_t u = __float_as_uint(s);
    if (isnan(s) || u == 0xff800000u) return 0u;
    if (u == 0x80000000u) u = 0u;
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

static __device__ __forceinline__ uint32_t row_key(const float *row, const sk_topk_row *rule,
                                                   int32_t j) {
    return sk_topk_is_forced(rule, j) ? 0u : score_key(row[j]);
}

static __device__ __forceinline__ int32_t warp_inclusive_sum(int32_t v, int lane) {
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int32_t n = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += n;
    }
    return v;
}

/* The take-th largest (1-based, take <= 32) of the 32 lanes' values: a
 * bitonic sort across the warp, descending. */
static __device__ __forceinline__ uint32_t warp_kth_largest(uint32_t v, int lane, int32_t take) {
#pragma unroll
    for (int size = 2; size <= 32; size <<= 1)
#pragma unroll
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            const uint32_t o = __shfl_xor_sync(0xffffffffu, v, stride);
            const bool lower = (lane & stride) == 0, asc = (lane & size) == 0;
            v = lower == asc ? max(v, o) : min(v, o);
        }
    return __shfl_sync(0xffffffffu, v, take - 1);
}

__global__ void __launch_bounds__(SEL_WARPS * 32) sk_topk_select_kernel(const __grid_constant__ select_params sp) {
    __shared__ __align__(8) uint32_t hist_all[SEL_WARPS][256];
    __shared__ uint32_t keys_all[SEL_WARPS][SEL_CACHE];
    const sk_topk_problem *p = &sp.p;
    const int warp = (int)(threadIdx.x >> 5), lane = (int)(threadIdx.x & 31);
    const int32_t g = (int32_t)blockIdx.x * SEL_WARPS + warp;
    if (g >= p->total_rows) return; /* whole warps leave; no block barrier follows */
    const sk_topk_row rule = sk_topk_row_rules(p, g % p->row_blocks);
    const int32_t n = rule.n_cand;
    const float *row = sp.scores + (int64_t)g * p->col_blocks;
    uint32_t *hist = hist_all[warp];
    uint64_t *cand = (uint64_t *)(void *)hist_all[warp]; /* SEL_FILTER entries, shares hist */
    uint32_t *keys = keys_all[warp];
    const int cached = n <= SEL_CACHE;
    const uint32_t lt = (1u << lane) - 1u;

    /* Keys, how many can be picked by score, and each lane's largest key.
     * Each lane later reads only the keys it wrote itself. */
    int32_t valid = 0;
    uint32_t lane_max = 0u;
#pragma unroll SEL_UNROLL
    for (int32_t j = lane; j < n; j += 32) {
        const uint32_t key = row_key(row, &rule, j);
        if (cached) keys[j] = key;
        valid += key != 0u;
        lane_max = max(lane_max, key);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) valid += __shfl_xor_sync(0xffffffffu, valid, o);
    const int32_t take = p->k < valid ? p->k : valid;

    /* Selected by score: key > thr, and keys == thr either up to index
     * thr_idx (filter path) or the first need_eq of them (radix path). */
    uint32_t thr = 0u, thr_idx = 0u;
    int32_t need_eq = 0;
    int by_index = 0;
    int done = 0;
    if (take == valid) {
        thr = 0u; /* every non-zero key */
        done = 1;
    } else if (take == 0) {
        thr = 0xffffffffu; /* none: no key reaches it (the largest is +inf's 0xff800000) */
        done = 1;
    } else if (take <= 32) {
        /* Filter: t, the take-th largest lane maximum, is at most the take-th
         * largest key T (take keys are >= t), so every key >= T is >= t.
         * Gather the keys >= t as (key, ~index) composites; if at most
         * SEL_FILTER, the take-th largest composite is (T, index of the
         * last tie taken). */
        const uint32_t t = warp_kth_largest(lane_max, lane, take);
        if (t != 0u) {
            int32_t m = 0;
            for (int32_t j0 = 0; j0 < n; j0 += 32) {
                const int32_t j = j0 + lane;
                const uint32_t key = j >= n ? 0u : (cached ? keys[j] : row_key(row, &rule, j));
                const int in = key != 0u && key >= t;
                const uint32_t mask = __ballot_sync(0xffffffffu, in);
                const int32_t pos = m + __popc(mask & lt);
                if (in && pos < SEL_FILTER) cand[pos] = ((uint64_t)key << 32) | (uint32_t)~(uint32_t)j;
                m += __popc(mask);
            }
            __syncwarp();
            if (m <= SEL_FILTER) {
                uint64_t found = 0u;
                for (int32_t e = lane; e < m; e += 32) {
                    const uint64_t mine = cand[e];
                    int32_t above = 0;
                    for (int32_t f = 0; f < m; ++f) above += cand[f] > mine;
                    if (above == take - 1) found = mine;
                }
                /* Exactly one entry has take - 1 above it (composites differ). */
                const uint32_t who = __ballot_sync(0xffffffffu, found != 0u);
                found = __shfl_sync(0xffffffffu, found, __ffs((int)who) - 1);
                thr = (uint32_t)(found >> 32);
                thr_idx = ~(uint32_t)found;
                by_index = 1;
                done = 1;
            }
            __syncwarp(); /* cand shares hist: all reads done before any reuse */
        }
    }
    if (!done) {
        uint32_t prefix = 0u;
        int32_t kk = take; /* rank of the wanted key among those matching prefix */
        for (int pass = 0; pass < 4; ++pass) {
            const int shift = 24 - 8 * pass;
            for (int e = lane; e < 256; e += 32) hist[e] = 0u;
            __syncwarp();
            for (int32_t j = lane; j < n; j += 32) {
                const uint32_t key = cached ? keys[j] : row_key(row, &rule, j);
                if (key != 0u && (pass == 0 || (key >> (shift + 8)) == (prefix >> (shift + 8))))
                    atomicAdd(&hist[(key >> shift) & 255u], 1u);
            }
            __syncwarp();
            /* Lane l owns digits 255 - 8l .. 248 - 8l, largest first. */
            int32_t c[8], own = 0;
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                c[e] = (int32_t)hist[255 - 8 * lane - e];
                own += c[e];
            }
            const int32_t incl = warp_inclusive_sum(own, lane);
            const uint32_t hit = __ballot_sync(0xffffffffu, incl >= kk);
            const int src = __ffs((int)hit) - 1; /* exists: the matching keys number >= kk */
            int32_t digit = 0, rest = 0, cum = incl - own;
            bool found = false;
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                if (!found && cum + c[e] >= kk) {
                    found = true;
                    digit = 255 - 8 * lane - e;
                    rest = kk - cum;
                }
                cum += c[e];
            }
            digit = __shfl_sync(0xffffffffu, digit, src);
            kk = __shfl_sync(0xffffffffu, rest, src);
            prefix |= (uint32_t)digit << shift;
            __syncwarp(); /* every lane has read hist before the next pass clears it */
        }
        thr = prefix;
        need_eq = kk;
    }

    /* Forced and selected blocks in increasing order into the scratch row. */
    int32_t *out = sp.scratch + (int64_t)g * p->row_cap;
    int32_t written = 0, eq_seen = 0;
    for (int32_t j0 = 0; j0 < n; j0 += 32) {
        const int32_t j = j0 + lane;
        const int in = j < n;
        const uint32_t key = !in ? 0u : (cached ? keys[j] : row_key(row, &rule, j));
        const int is_eq = key != 0u && key == thr;
        int eq_sel;
        if (by_index) {
            eq_sel = is_eq && (uint32_t)j <= thr_idx;
        } else {
            const uint32_t eq_mask = __ballot_sync(0xffffffffu, is_eq && need_eq > 0);
            eq_sel = is_eq && eq_seen + __popc(eq_mask & lt) < need_eq;
            eq_seen += __popc(eq_mask);
        }
        const int sel = (in && sk_topk_is_forced(&rule, j)) || key > thr || eq_sel;
        const uint32_t sel_mask = __ballot_sync(0xffffffffu, sel);
        const int32_t pos = written + __popc(sel_mask & lt);
        if (sel && pos < p->row_cap) out[pos] = j;
        written += __popc(sel_mask);
    }
    if (lane == 0) sp.counts[g] = written < p->row_cap ? written : p->row_cap;
}

/* Row offsets and the packed column indices, one pass. CTA c owns rows
 * [c * per_cta, min((c + 1) * per_cta, rows)): it sums the counts of every
 * earlier row itself (at most CMP_MAX_CTAS CTAs read the counts, from L2),
 * scans its own rows in chunks of CMP_THREADS, writes their offsets, and
 * copies each row's scratch entries with one warp per row. The last CTA
 * also writes row_offsets[rows]. */
__global__ void __launch_bounds__(CMP_THREADS) sk_topk_compact_kernel(const int32_t *counts, const int32_t *scratch,
                                                          int32_t row_cap, int32_t rows,
                                                          int32_t per_cta, int32_t *row_offsets,
                                                          int32_t *col_indices) {
    __shared__ int32_t warp_part[CMP_THREADS / 32];
    __shared__ int32_t chunk_off[CMP_THREADS];
    __shared__ int32_t chunk_total;
    const int tid = (int)threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int32_t r0 = (int32_t)blockIdx.x * per_cta;
    const int32_t r1 = r0 + per_cta < rows ? r0 + per_cta : rows;

    /* Sum of counts[0 .. r0): r0 is a multiple of 4 and counts is 256-byte
     * aligned, so int4 loads, 8 in flight per thread. */
    int32_t part = 0;
    const int4 *c4 = (const int4 *)counts;
    const int32_t n4 = r0 / 4;
#pragma unroll 8
    for (int32_t e = tid; e < n4; e += CMP_THREADS) {
        const int4 v = __ldg(c4 + e);
        part += v.x + v.y + v.z + v.w;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) part += __shfl_xor_sync(0xffffffffu, part, o);
    if (lane == 0) warp_part[warp] = part;
    __syncthreads();
    int32_t base = 0;
#pragma unroll
    for (int w = 0; w < CMP_THREADS / 32; ++w) base += warp_part[w];
    __syncthreads(); /* warp_part is reused by the scans */

    for (int32_t c0 = r0; c0 < r1; c0 += CMP_THREADS) {
        const int32_t r = c0 + tid;
        const int32_t v = r < r1 ? counts[r] : 0;
        const int32_t incl = warp_inclusive_sum(v, lane);
        if (lane == 31) warp_part[warp] = incl;
        __syncthreads();
        int32_t before = 0, total = 0;
#pragma unroll
        for (int w = 0; w < CMP_THREADS / 32; ++w) {
            before += w < warp ? warp_part[w] : 0;
            total += warp_part[w];
        }
        const int32_t off = base + before + incl - v;
        chunk_off[tid] = off;
        if (r < r1) row_offsets[r] = off;
        if (tid == 0) chunk_total = total;
        __syncthreads();
        /* Copy: warp w takes rows c0 + w, c0 + w + 8, ... of the chunk. */
        for (int32_t q = warp; q < CMP_THREADS && c0 + q < r1; q += CMP_THREADS / 32) {
            const int32_t g = c0 + q, nsel = counts[g], dst = chunk_off[q];
            const int32_t *src = scratch + (int64_t)g * row_cap;
            for (int32_t e = lane; e < nsel; e += 32) col_indices[dst + e] = src[e];
        }
        base += chunk_total;
        __syncthreads(); /* warp_part, chunk_off and chunk_total are rewritten next */
    }
    if (r1 == rows && tid == 0) row_offsets[rows] = base;
}

/* ---------------------------------------------------------------------------
 * Entry points
 * ------------------------------------------------------------------------- */

static sk_status check_device(void) {
    int device, major, minor;
    SK_TRY(sk_cuda_current_cc(&device, &major, &minor));
    if (major < 8)
        return sk_error(SK_STATUS_NOT_SUPPORTED_BACKEND,
                        "device %d has compute capability %d.%d; the CUDA top-k kernels need 8.0 "
                        "or later",
                        device, major, minor);
    return SK_STATUS_SUCCESS;
}

extern "C" sk_status sk_cuda_topk_workspace_size(const sk_topk_problem *p, int with_scores,
                                                 size_t *bytes) {
    *bytes = workspace_layout(p, with_scores).total;
    return SK_STATUS_SUCCESS;
}

extern "C" sk_status sk_cuda_topk_pool(const sk_topk_problem *p, cudaStream_t stream) {
    SK_TRY(check_device());
    return launch_pool(p, stream);
}

extern "C" sk_status sk_cuda_topk_select(const sk_topk_problem *p, void *workspace,
                                         size_t workspace_size, cudaStream_t stream) {
    SK_TRY(check_device());
    const int with_scores = p->pooled_q != NULL;
    const ws_layout w = workspace_layout(p, with_scores);
    if (workspace_size < w.total)
        return sk_error(SK_STATUS_BAD_PARAM_WORKSPACE,
                        "workspace_size = %zu is less than the %zu bytes needed", workspace_size,
                        w.total);
    char *base = (char *)workspace;
    int32_t *counts = (int32_t *)(base + w.counts_off);
    int32_t *scratch = (int32_t *)(base + w.scratch_off);
    const float *scores = p->scores;
    if (with_scores) {
        score_params sp;
        sp.p = *p;
        sp.a = p->pooled_q;
        sp.a_slice_stride = (int64_t)p->row_blocks * p->head_dim;
        sp.pooled_k = p->pooled_k;
        sp.scores = (float *)(base + w.scores_off);
        sp.tiles_i = (p->row_blocks + SC_TM - 1) / SC_TM;
        sp.tiles_j = (p->col_blocks + SC_TN - 1) / SC_TN;
        if (needs_qsum(p, with_scores)) {
            float *qsum = (float *)(base + w.qsum_off);
            const int64_t n4 = (int64_t)p->total_rows * p->head_dim / 4;
            int64_t blocks = (n4 + SUM_THREADS - 1) / SUM_THREADS;
            if (blocks > (1 << 20)) blocks = 1 << 20;
            sk_topk_group_sum_kernel<<<(unsigned)blocks, SUM_THREADS, 0, stream>>>(
                p->pooled_q, p->group, sp.a_slice_stride, n4, qsum);
            SK_CUDA_TRY(cudaGetLastError(), "group-sum kernel launch");
            sp.a = qsum;
        }
        const int64_t tiles = (int64_t)p->slices * sp.tiles_i * sp.tiles_j; /* <= dense count */
        sk_topk_score_kernel<<<(unsigned)tiles, SC_THREADS, 0, stream>>>(sp);
        SK_CUDA_TRY(cudaGetLastError(), "scoring kernel launch");
        scores = sp.scores;
    }
    select_params sel;
    sel.p = *p;
    sel.scores = scores;
    sel.counts = counts;
    sel.scratch = scratch;
    const unsigned sel_blocks = (unsigned)((p->total_rows + SEL_WARPS - 1) / SEL_WARPS);
    sk_topk_select_kernel<<<sel_blocks, SEL_WARPS * 32, 0, stream>>>(sel);
    SK_CUDA_TRY(cudaGetLastError(), "selection kernel launch");
    /* At most CMP_MAX_CTAS CTAs, each a multiple of CMP_THREADS rows. */
    const int64_t rows = p->total_rows;
    int64_t per_cta = (rows + CMP_MAX_CTAS - 1) / CMP_MAX_CTAS;
    per_cta = (per_cta + CMP_THREADS - 1) / CMP_THREADS * CMP_THREADS;
    const int64_t ctas = (rows + per_cta - 1) / per_cta;
    sk_topk_compact_kernel<<<(unsigned)ctas, CMP_THREADS, 0, stream>>>(
        counts, scratch, p->row_cap, p->total_rows, (int32_t)per_cta, p->row_offsets,
        p->col_indices);
    SK_CUDA_TRY(cudaGetLastError(), "compaction kernel launch");
    return SK_STATUS_SUCCESS;
}
