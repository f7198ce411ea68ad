/*
 * topk.cu - the CUDA top-k block selection: block means, block scores, and
 * the per-row selection into a BSR layout, all enqueued on one stream with
 * no allocation and no host synchronisation (CUDA-graph capturable).
 *
 * Kernels, in launch order:
 *   pool     one launch for Q and K: one thread per (head, 8-element chunk
 *            of D) of one block of one tensor, 16-byte loads of the block's
 *            tokens (8 in flight), fp32 sums, one division by the token
 *            count; a CTA takes every head of its block where they fit in
 *            512 threads, so that it reads whole token rows. Q and K are
 *            read once (bandwidth-bound: 92.5 % of DRAM peak on the H200,
 *            docs/perf/topk.md step 9). In sk_pool_select_topk on a 9.0
 *            device with D = 64 or 128 and no group sums (pool_splits), the
 *            means go straight into the row scoring's split operands (Q and
 *            K tiles, pool_store_split) instead of fp32, and the split
 *            kernel is not launched (step 13). In sk_pool_select_topk, in
 *            either form, the blocks outside the score span
 *            (sk_topk_score_span) are not read, only zeroed (step 21).
 *   group sum  with per_kv_head and a group > 1 only: the fp32 sum of each group's pooled
 *            Q rows (ascending head order), the scoring's A operand.
 *   score    scores[slice, i, j] = scale * sum_d A[i, d] * pooled_k[j, d],
 *            128 x 128 tiles. On a 9.0 device (unless the backend forces
 *            SK_BACKEND_CUDA_SM80) a Hopper kernel, fp32-accurate but not
 *            the fmaf chain bit for bit: with head_dim <= 128
 *            topk_score_rows_sm90.cu (K split once into fp16 hi/lo with a
 *            power-of-two scale per row, a CTA per 128 rows walking its
 *            column tiles), else topk_score_sm90.cu (wgmma with the 3xTF32
 *            split, a CTA per tile). Else a plain fp32 SIMT GEMM (FMA), 8 x 8 outputs
 *            per thread, D in steps of 8 through double-buffered shared
 *            memory with a register prefetch, two CTAs per SM. With causal,
 *            tiles wholly past the candidates of their last row are skipped
 *            (those scores are never read). Streaming stores keep the
 *            operands in L2. One extra CTA (the first) fills the row table.
 *            A score that comes out inf or NaN (a pooled entry not
 *            finite) gets the fp32 value, per head and then summed over
 *            the group (topk_nonfinite_score): what the split's hi * lo
 *            terms or the group's summed rows would lose (inf * 0, inf -
 *            inf). Rows holding such an entry are marked by a split factor
 *            of 0 (split_row_factor), so the Hopper row scoring handles
 *            them on its general epilogue only.
 *   row table  (sk_layout_from_scores: its own one-CTA kernel) the rules of
 *            every row of a slice, each row's place in its slice when every
 *            row fills its bound, and the short-row flag cleared.
 *   select   one warp per layout row. Scores become order-preserving 32-bit
 *            keys (NaN, -inf, forced and non-candidate blocks -> key 0,
 *            -0 -> +0). With k <= 32 and at most 2048 key blocks, the
 *            register selection (sk_topk_select_reg_kernel, one launch: up
 *            to 1024 key blocks, rows of over 512 candidates (32 scores per
 *            lane) first, the rest with 16; past 1024, rows of over 1024
 *            candidates with 64 scores per lane, the rest with 32, at
 *            fewer CTAs per SM): the filter path below on register-resident
 *            scores, after which the take largest gathered composites and
 *            the forced blocks are written straight to their places in the
 *            row (a count of selected and forced blocks before each), both
 *            into the scratch row and at the row's place in col_indices from
 *            the row table (with its row_offsets entry), and a row shorter
 *            than its bound raises the flag. Otherwise the general
 *            kernel, keys kept in shared memory when the row has at most
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
 *   place    unless the flag is set (or the general kernel ran), only the
 *            last row offset (the register selection placed the rows);
 *            else the compaction: up to CMP_MAX_CTAS CTAs,
 *            each sums the counts of the rows before its range itself, scans
 *            its rows (row_offsets) and copies their scratch entries into
 *            col_indices.
 * On a 9.0 device every kernel after the first is launched with
 * programmatic stream serialization (topk_kernels.cuh, pdl_enter), so it is
 * scheduled while its predecessor drains.
 * The counts depend on the scores only through NaN / -inf (see
 * topk_backend.h), so the layout equals the host rules' bit for bit for the
 * same scores, and two runs are identical.
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <float.h>
#include <stdint.h>

#include "cuda/cuda_check.cuh"
#include "cuda/hopper.cuh"
#include "cuda/topk_backend.h"
#include "cuda/topk_kernels.cuh"

enum {
    WS_ALIGN = 256,
    POOL_THREADS = 512, /* the most per pooling CTA: 32 heads x 16 chunks of D = 128 */
    POOL_INFLIGHT = 8, /* 16-byte loads in flight per thread */
    SC_KC = 8,         /* D step through shared memory */
    SC_PAD = 4,        /* keeps the float4 rows of the transposed tiles 16-byte aligned */
    SC_THREADS = 256,
    SUM_THREADS = 256,
    SEL_WARPS = 4,     /* rows per CTA */
    SEL_CACHE = 1024,  /* keys of a row kept in shared memory (4 KB per warp) */
    SEL_FILTER = 128,  /* filter-path candidates (uint64, in the warp's 1 KB histogram) */
    SEL_UNROLL = 8,    /* score loads in flight per lane in the first pass */
    SEL_REG_KEYS = 64, /* register selection: the most keys per lane */
    SEL_REG_MAX = 32 * SEL_REG_KEYS, /* ... for rows of at most 2048 key blocks */
    SEL_REG_K = 32,    /* ... and k <= 32 */
    CMP_THREADS = 256, /* compaction: one row per thread in the scan, a warp per row in the copy */
    CMP_MAX_CTAS = 128
};

static size_t align_up(size_t x) { return (x + WS_ALIGN - 1) / WS_ALIGN * WS_ALIGN; }

/* Byte offsets of the workspace regions (see topk_backend.h). */
typedef struct ws_layout {
    size_t scores_off, qsum_off, counts_off, scratch_off, rule_off, place_off, flag_off;
    size_t k_split_off, k_rows_off;
    size_t q_split_off, q_rows_off, pooled_q_off, pooled_k_off; /* sk_pool_select_topk only */
    size_t total;
} ws_layout;

/* The Hopper row scoring (head_dim <= 128) splits its operands into the
 * workspace; sized whenever that kernel may run (a 9.0 device is only known
 * at the call). */
static int needs_split(const sk_topk_problem *p, int with_scores) {
    return with_scores && p->head_dim <= 128 && p->backend != SK_BACKEND_CUDA_SM80;
}

/* With per_kv_head and a group of more than one head, the group sums of the
 * pooled Q rows (the scoring's A operand, [B, Hkv, row_blocks, D] fp32). */
static int needs_qsum(const sk_topk_problem *p, int with_scores) {
    return with_scores && p->per_kv_head && p->group > 1;
}

/* sk_pool_select_topk hands the pooling the split of both operands when
 * the row scoring runs without group sums and D / 8 threads hold a whole
 * split row (D = 64 or 128); else it pools into fp32 and selects as
 * sk_select_topk does. */
static int pool_splits(const sk_topk_problem *p, int hopper) {
    return hopper && needs_split(p, 1) && !needs_qsum(p, 1) && p->head_dim % ROWS_CHUNK == 0;
}

/* with_pool: sk_pool_select_topk's workspace, the selection's (with scores)
 * followed by one region that holds either the split Q tiles and their
 * exponents (a pooling that splits, pool_splits) or the fp32 pooled Q and K
 * (one that does not): a call uses one of the two, never both. */
static ws_layout workspace_layout(const sk_topk_problem *p, int with_scores, int with_pool) {
    ws_layout w;
    w.scores_off = 0;
    const size_t scores = with_scores ? align_up((size_t)p->total_rows * p->col_blocks * 4) : 0;
    w.qsum_off = scores;
    const size_t qsum =
        needs_qsum(p, with_scores) ? align_up((size_t)p->total_rows * (size_t)p->head_dim * 4) : 0;
    w.counts_off = w.qsum_off + qsum;
    w.scratch_off = w.counts_off + align_up((size_t)p->total_rows * 4);
    w.rule_off = w.scratch_off + align_up((size_t)p->total_rows * (size_t)p->row_cap * 4);
    w.place_off = w.rule_off + align_up((size_t)p->row_blocks * 16);
    w.flag_off = w.place_off + align_up((size_t)p->row_blocks * 8);
    const int split = needs_split(p, with_scores);
    const size_t k_tiles =
        split ? (size_t)(p->batch * p->heads_kv) * (size_t)((p->col_blocks + SC_TN - 1) / SC_TN) : 0;
    const size_t tile_bytes = split_tile_bytes(split_chunks(p->head_dim));
    w.k_split_off = w.flag_off + WS_ALIGN;
    w.k_rows_off = w.k_split_off + k_tiles * tile_bytes;
    w.total = w.k_rows_off + k_tiles * SC_TN * 4;
    w.q_split_off = w.q_rows_off = w.pooled_q_off = w.pooled_k_off = w.total;
    if (with_pool) {
        const size_t q_tiles =
            split ? (size_t)p->slices * (size_t)((p->row_blocks + SC_TM - 1) / SC_TM) : 0;
        w.q_split_off = align_up(w.total);
        w.q_rows_off = w.q_split_off + q_tiles * tile_bytes;
        const size_t split_end = w.q_rows_off + q_tiles * SC_TM * 4;
        w.pooled_q_off = w.q_split_off;
        w.pooled_k_off =
            w.pooled_q_off + align_up((size_t)(p->batch * p->heads_q * p->row_blocks) *
                                      (size_t)p->head_dim * 4);
        const size_t pooled_end = w.pooled_k_off + (size_t)(p->batch * p->heads_kv *
                                                            p->col_blocks) *
                                                       (size_t)p->head_dim * 4;
        w.total = split_end > pooled_end ? split_end : pooled_end;
    }
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
    int32_t read_lo, read_hi;             /* blocks read; the others are stored as zeros */
    float *dst;                           /* [B, H, nblocks, D], or NULL: */
    char *split;         /* the block means split for the Hopper row scoring instead (split
                            blocks per 128-row tile of each (batch, head), topk_kernels.cuh) */
    int32_t *split_exp;  /* [B * H * split_tiles * 128] row exponents */
    float split_mult;    /* the rows' factor numerator: scale for Q, 1 for K */
    int32_t split_tiles; /* ceil(nblocks / 128) */
} pool_tensor;

typedef struct pool_params {
    pool_tensor t[2]; /* Q, then K: blockIdx.x < t[0].nblocks pools Q */
    int32_t batch, dim, chunks; /* chunks = D / 8 */
    int32_t bf16;
    int32_t split_chunks; /* split_chunks(D) when a tensor is split */
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

/* One pooled row's 8 values (dims 8 c .. 8 c + 7 of head h, block blk),
 * split as split_tile_bytes blocks (topk_kernels.cuh): the row's exponent
 * comes from its largest finite |x| over the D / 8 threads that hold it
 * (consecutive lanes, D / 8 a power of two up to 32). Same values as the
 * split kernel's and the row scoring's split of the fp32 means. */
static __device__ __forceinline__ void pool_store_split(const pool_tensor *t, const float v[8],
                                                        int32_t row_threads, int32_t chunks,
                                                        int64_t bh, int32_t c, int32_t blk,
                                                        uint64_t keep) {
    const int lane = (int)(threadIdx.x & 31);
    const uint32_t group = row_threads >= 32
                               ? 0xffffffffu
                               : ((1u << row_threads) - 1u) << (lane & ~(row_threads - 1));
    float m = fmaxf(split_abs_max4(v[0], v[1], v[2], v[3]), split_abs_max4(v[4], v[5], v[6], v[7]));
    int bad = split_any_nonfinite4(v[0], v[1], v[2], v[3]) |
              split_any_nonfinite4(v[4], v[5], v[6], v[7]); /* this row: its factor 0 */
    for (int o = row_threads >> 1; o > 0; o >>= 1) {
        m = fmaxf(m, __shfl_xor_sync(group, m, o));
        bad |= __shfl_xor_sync(group, bad, o);
    }
    const int32_t e = split_exponent(m);
    const float f = split_pow2(e);
    uint4 hi, lo;
    split_pair(v[0] * f, v[1] * f, &hi.x, &lo.x);
    split_pair(v[2] * f, v[3] * f, &hi.y, &lo.y);
    split_pair(v[4] * f, v[5] * f, &hi.z, &lo.z);
    split_pair(v[6] * f, v[7] * f, &hi.w, &lo.w);
    const int64_t tile = bh * t->split_tiles + blk / SC_TN;
    const int32_t r = blk % SC_TN;
    char *block = t->split + tile * (int64_t)split_tile_bytes(chunks);
    const uint32_t off = (uint32_t)(c / 8) * ROWS_PANEL + sk_sw128_offset(r, c % 8);
    sk_st_global_v4_hint(block + off, hi, keep);
    sk_st_global_v4_hint(block + (size_t)chunks * ROWS_PANEL + off, lo, keep);
    if (c == 0) {
        ((float *)(block + split_panel_bytes(chunks)))[r] = split_row_factor(t->split_mult, e, bad);
        t->split_exp[tile * SC_TN + r] = e;
    }
}

/* SPLIT: write the split operands (pool_store_split) instead of fp32 means;
 * a template so that the fp32 kernel keeps its own code. The outputs are
 * stored under an L2 evict_last policy: the scoring reads them next, and
 * lines kept in L2 are not written back into the middle of the 2 GiB read
 * stream (H200: the pooling kernel 3-7 us shorter, the whole selection chain
 * 0-4 us, docs/perf/topk.md step 18). */
template <int SPLIT>
__global__ void __launch_bounds__(POOL_THREADS, 2) sk_topk_pool_kernel(const __grid_constant__ pool_params p) {
    pdl_release();
    const int which = (int32_t)blockIdx.x >= p.t[0].nblocks;
    const pool_tensor t = which ? p.t[1] : p.t[0];
    const int32_t blk = (int32_t)blockIdx.x - (which ? p.t[0].nblocks : 0);
    const int32_t item = (int32_t)(blockIdx.y * blockDim.x + threadIdx.x);
    if (item >= t.heads * p.chunks) return;
    const int32_t h = item / p.chunks, c = item - h * p.chunks;
    const int64_t t0 = (int64_t)blk * t.block;
    const int32_t tokens = (int32_t)(t.seq - t0 < t.block ? t.seq - t0 : t.block);
    /* A block outside [read_lo, read_hi) reads nothing and stores zeros:
     * no score that depends on it is ever read (sk_topk_score_span). */
    const int32_t count = blk >= t.read_lo && blk < t.read_hi ? tokens : 0;
    /* The sequence stride is a multiple of 16 bytes whenever it is stepped. */
    const int64_t step = t.stride_s / 8;
    const uint64_t keep = sk_policy_evict_last();
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
        if (count > 0) {
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[e] /= n;
        }
        const int64_t bh = (int64_t)b * t.heads + h;
        if (SPLIT) {
            pool_store_split(&t, acc, p.chunks, p.split_chunks, bh, c, blk, keep);
        } else {
            float *out = t.dst + (bh * t.nblocks + blk) * p.dim + (int64_t)c * 8;
            sk_st_global_v4_hint(out, make_uint4(__float_as_uint(acc[0]), __float_as_uint(acc[1]),
                                                 __float_as_uint(acc[2]), __float_as_uint(acc[3])),
                                 keep);
            sk_st_global_v4_hint(out + 4,
                                 make_uint4(__float_as_uint(acc[4]), __float_as_uint(acc[5]),
                                            __float_as_uint(acc[6]), __float_as_uint(acc[7])),
                                 keep);
        }
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
    t->read_lo = 0;
    t->read_hi = nblocks;
    t->dst = dst;
    t->split = NULL;
    t->split_exp = NULL;
    t->split_mult = 1.f;
    t->split_tiles = 0;
}

static void pool_tensor_split(pool_tensor *t, char *tiles, int32_t *exps, float mult) {
    t->dst = NULL;
    t->split = tiles;
    t->split_exp = exps;
    t->split_mult = mult;
    t->split_tiles = (t->nblocks + SC_TN - 1) / SC_TN;
}

/* One launch pools Q (the first row_blocks CTAs along x) and K: into fp32,
 * or with `split` (pool_splits) straight into the row scoring's split
 * operands. `span_only`: for the selection's own use, only the blocks in
 * p->score_rows / p->score_cols are read (the others are zeros); else
 * (sk_block_pool) every block. */
static sk_status launch_pool(const sk_topk_problem *p, const split_operands *split, int span_only,
                             cudaStream_t stream) {
    pool_params pp;
    pool_tensor_set(&pp.t[0], p->q, p->q_stride, p->seq_q, p->heads_q, p->block_q, p->row_blocks,
                    p->pooled_q_out);
    pool_tensor_set(&pp.t[1], p->k_in, p->k_stride, p->seq_k, p->heads_kv, p->block_k,
                    p->col_blocks, p->pooled_k_out);
    if (span_only) {
        pp.t[0].read_lo = p->score_rows[0];
        pp.t[0].read_hi = p->score_rows[1];
        pp.t[1].read_lo = p->score_cols[0];
        pp.t[1].read_hi = p->score_cols[1];
    }
    pp.split_chunks = 0;
    if (split != NULL) {
        pool_tensor_split(&pp.t[0], split->q_tiles, split->q_exp, p->scale);
        pool_tensor_split(&pp.t[1], split->k_tiles, split->k_exp, 1.f);
        pp.split_chunks = split->chunks;
    }
    pp.batch = (int32_t)p->batch;
    pp.dim = (int32_t)p->head_dim;
    pp.chunks = (int32_t)(p->head_dim / 8);
    pp.bf16 = p->dtype == SK_DTYPE_BF16;
    const int64_t items = p->heads_q * (p->head_dim / 8); /* heads_q >= heads_kv */
    /* Whole token rows per CTA where they fit: a packed block is then one
     * contiguous read (half rows per CTA cost ~6 % of the bandwidth on the
     * H200, docs/perf/topk.md step 9). */
    const int64_t threads = items < POOL_THREADS ? (items + 31) / 32 * 32 : POOL_THREADS;
    const int64_t gy = (items + threads - 1) / threads;
    const int64_t gx = (int64_t)p->row_blocks + p->col_blocks;
    if (items > INT32_MAX || gy > 65535 || gx > INT32_MAX)
        return sk_error(SK_STATUS_NOT_SUPPORTED,
                        "heads_q x head_dim = %lld x %lld (or the block count) is too large for "
                        "the CUDA pooling kernel",
                        (long long)p->heads_q, (long long)p->head_dim);
    dim3 grid((unsigned)gx, (unsigned)gy, (unsigned)(p->batch < 65535 ? p->batch : 65535));
    if (split != NULL)
        sk_topk_pool_kernel<1><<<grid, (unsigned)threads, 0, stream>>>(pp);
    else
        sk_topk_pool_kernel<0><<<grid, (unsigned)threads, 0, stream>>>(pp);
    return sk_cuda_status(cudaGetLastError(), "pooling kernel launch");
}

/* ---------------------------------------------------------------------------
 * Row table
 * ------------------------------------------------------------------------- */

/* The row table alone (sk_layout_from_scores; with scoring, the scoring
 * kernel's last CTA fills it). */
__global__ void __launch_bounds__(TBL_THREADS) sk_topk_row_table_kernel(const __grid_constant__ sk_topk_problem p,
                                                                     const __grid_constant__ row_table t) {
    pdl_enter();
    fill_row_table(&p, &t);
}

/* ---------------------------------------------------------------------------
 * Scoring
 * ------------------------------------------------------------------------- */


/* Group sums for per_kv_head: qsum[b, hk, i, :] = sum over the group's query
 * heads h = hk * G .. hk * G + G - 1 (ascending) of pooled_q[b, h, i, :],
 * fp32; one thread per 4 values. */
__global__ void __launch_bounds__(SUM_THREADS) sk_topk_group_sum_kernel(const float *pooled_q, int32_t group,
                                                             int64_t rows_d, int64_t n4,
                                                             float *qsum) {
    pdl_enter();
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
 * and 64 + tx*4 + c); D in steps of SC_KC through double-buffered shared
 * memory (transposed, so each step reads float4 rows; one barrier per step),
 * the next step prefetched into registers. Each output is one fmaf chain
 * over d = 0 .. D-1 in order, then times the scale.
 * Rows and columns past the end read the last valid row (never stored).
 * Scores are written with streaming stores: the selection reads them once,
 * while the pooled operands should stay in L2. The extra first CTA fills the
 * row table instead. */
__global__ void __launch_bounds__(SC_THREADS, 2) sk_topk_score_kernel(const __grid_constant__ score_params sp) {
    pdl_enter();
    static_assert(SC_TM == 128 && SC_TN == 128 && SC_THREADS == 256 && SC_KC == 8,
                  "thread layout: 16 x 16 threads of 8 x 8 outputs, 2 loads of 4 per step");
    static_assert(2 * 2 * SC_KC * (SC_TM + SC_PAD) * 4 <= 48 * 1024, "static shared memory budget");
    static_assert(SC_THREADS == TBL_THREADS, "the first CTA fills the row table");
    const sk_topk_problem *p = &sp.p;
    score_tile t;
    if (!score_tile_begin(&sp, &t)) return;
    const int32_t slice = t.slice, b = t.b, hk = t.hk, i0 = t.i0, j0 = t.j0;
    const int32_t rb = p->row_blocks, cb = p->col_blocks, dim = (int32_t)p->head_dim;

    __shared__ __align__(16) float As[2][SC_KC][SC_TM + SC_PAD];
    __shared__ __align__(16) float Bs[2][SC_KC][SC_TN + SC_PAD];
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
    As[0][lc + 0][lr] = ra.x;
    As[0][lc + 1][lr] = ra.y;
    As[0][lc + 2][lr] = ra.z;
    As[0][lc + 3][lr] = ra.w;
    Bs[0][lc + 0][lr] = rk.x;
    Bs[0][lc + 1][lr] = rk.y;
    Bs[0][lc + 2][lr] = rk.z;
    Bs[0][lc + 3][lr] = rk.w;
    __syncthreads();
    int buf = 0;
    for (int32_t k0 = 0; k0 < dim; k0 += SC_KC) {
        const int more = k0 + SC_KC < dim;
        if (more) {
            ra = __ldg((const float4 *)(a_src + k0 + SC_KC));
            rk = __ldg((const float4 *)(b_src + k0 + SC_KC));
        }
#pragma unroll
        for (int kk = 0; kk < SC_KC; ++kk) {
            const float4 a0 = *(const float4 *)&As[buf][kk][ty * 4];
            const float4 a1 = *(const float4 *)&As[buf][kk][64 + ty * 4];
            const float4 b0 = *(const float4 *)&Bs[buf][kk][tx * 4];
            const float4 b1 = *(const float4 *)&Bs[buf][kk][64 + tx * 4];
            const float av[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
            const float bv[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
            for (int r = 0; r < 8; ++r)
#pragma unroll
                for (int c = 0; c < 8; ++c) acc[r][c] = fmaf(av[r], bv[c], acc[r][c]);
        }
        /* The other buffer was last read in the previous step, before the
         * barrier that ended it. */
        if (more) {
            As[buf ^ 1][lc + 0][lr] = ra.x;
            As[buf ^ 1][lc + 1][lr] = ra.y;
            As[buf ^ 1][lc + 2][lr] = ra.z;
            As[buf ^ 1][lc + 3][lr] = ra.w;
            Bs[buf ^ 1][lc + 0][lr] = rk.x;
            Bs[buf ^ 1][lc + 1][lr] = rk.y;
            Bs[buf ^ 1][lc + 2][lr] = rk.z;
            Bs[buf ^ 1][lc + 3][lr] = rk.w;
        }
        __syncthreads();
        buf ^= 1;
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
            float d[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                d[e] = acc[r][half * 4 + e];
                /* inf or NaN from a group sum: the per-head sum's value */
                if (!(fabsf(d[e]) <= FLT_MAX) && p->group > 1 && p->per_kv_head && j + e < cb)
                    d[e] = topk_nonfinite_score(p, slice, i, j + e);
            }
            const float v0 = scale * d[0], v1 = scale * d[1], v2 = scale * d[2], v3 = scale * d[3];
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
    row_table table;     /* filled (register selection only) */
    int32_t per_slice;   /* capacity / slices: each slice's part of col_indices */
    int32_t vec;         /* != 0: scores 16-byte aligned and col_blocks % 4 == 0 (16-byte
                            row loads in the register selection) */
} select_params;

/* Larger score -> larger key; 0 for scores never picked (NaN, -inf). -0 and
 * +0 share a key, so they tie. Every other key is >= 0x00800000. */
static __device__ __forceinline__ uint32_t score_key(float s) {
    uint32_t u = __float_as_uint(s);
    u = u == 0x80000000u ? 0u : u;                                   /* -0 -> +0 */
    const uint32_t key = u ^ ((uint32_t)((int32_t)u >> 31) | 0x80000000u); /* negative: ~u */
    return s > __int_as_float((int)0xff800000u) ? key : 0u;          /* false for NaN, -inf */
}

static __device__ __forceinline__ uint32_t row_key(const float *row, const sk_topk_row *rule,
                                                   int32_t j) {
    return sk_topk_is_forced(rule, j) ? 0u : score_key(row[j]);
}

/* The take-th largest (1-based, take <= 32) of the 32 lanes' values: a
 * bitonic sort across the warp, descending. T: uint32_t keys, or floats
 * without NaN (max / min are fmaxf / fminf there; a -0 / +0 tie may come out
 * as either). */
template <typename T>
static __device__ __forceinline__ T warp_kth_largest(T v, int lane, int32_t take) {
#pragma unroll
    for (int size = 2; size <= 32; size <<= 1)
#pragma unroll
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            const T o = __shfl_xor_sync(0xffffffffu, v, stride);
            const bool lower = (lane & stride) == 0, asc = (lane & size) == 0;
            v = lower == asc ? max(v, o) : min(v, o);
        }
    return __shfl_sync(0xffffffffu, v, take - 1);
}

/* One radix pass's choice from a warp's 256-bin histogram of the keys still
 * in play: the digit of the kk-th largest of them, and *kk becomes its rank
 * among the keys with that digit. Lane l owns digits 255 - 8l .. 248 - 8l,
 * largest first. */
static __device__ __forceinline__ uint32_t radix_pick(const uint32_t *hist, int lane, int32_t *kk) {
    int32_t c[8], own = 0;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        c[e] = (int32_t)hist[255 - 8 * lane - e];
        own += c[e];
    }
    const int32_t incl = warp_inclusive_sum(own, lane);
    const uint32_t hit = __ballot_sync(0xffffffffu, incl >= *kk);
    const int src = __ffs((int)hit) - 1; /* exists: the keys in play number >= kk */
    int32_t digit = 0, rest = 0, cum = incl - own;
    bool found = false;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        if (!found && cum + c[e] >= *kk) {
            found = true;
            digit = 255 - 8 * lane - e;
            rest = *kk - cum;
        }
        cum += c[e];
    }
    *kk = __shfl_sync(0xffffffffu, rest, src);
    return (uint32_t)__shfl_sync(0xffffffffu, digit, src);
}

/* Whether block j of a row (n candidates, sinks below sink_end, the local
 * window lo .. lo + local_len - 1) can be picked by score. */
static __device__ __forceinline__ bool pickable(int32_t j, int32_t n, int32_t sink_end,
                                                int32_t lo, uint32_t local_len) {
    return (uint32_t)(j - sink_end) < (uint32_t)(n - sink_end) && (uint32_t)(j - lo) >= local_len;
}

/* A row's keys as both selection kernels read them in their slow paths:
 * from the scores (0 for a block that is not pickable) or, where the
 * general kernel cached them, from shared memory. Lane l reads only blocks
 * l, l + 32, ... (the cache holds what the lane itself wrote). */
typedef struct row_keys {
    const float *row;      /* the row's scores */
    const uint32_t *cache; /* or NULL */
    int32_t n, sink_end, lo;
    uint32_t local_len;
} row_keys;

static __device__ __forceinline__ uint32_t key_at(const row_keys *r, int32_t j) {
    if (r->cache != NULL) return r->cache[j];
    return pickable(j, r->n, r->sink_end, r->lo, r->local_len) ? score_key(r->row[j]) : 0u;
}

/* The radix select of a row's keys, MSB first (4 passes of 8 bits on the
 * warp's 256-bin histogram): returns T, the take-th largest non-zero key
 * (1 <= take <= their count), and *need_eq, how many keys equal to T are
 * among the take largest. */
static __device__ uint32_t radix_threshold(const row_keys *r, int32_t take, uint32_t *hist,
                                           int lane, int32_t *need_eq) {
    uint32_t prefix = 0u;
    int32_t kk = take; /* rank of the wanted key among those matching prefix */
    for (int pass = 0; pass < 4; ++pass) {
        const int shift = 24 - 8 * pass;
        for (int e = lane; e < 256; e += 32) hist[e] = 0u;
        __syncwarp();
        for (int32_t j = lane; j < r->n; j += 32) {
            const uint32_t key = key_at(r, j);
            if (key != 0u && (pass == 0 || (key >> (shift + 8)) == (prefix >> (shift + 8))))
                atomicAdd(&hist[(key >> shift) & 255u], 1u);
        }
        __syncwarp();
        prefix |= radix_pick(hist, lane, &kk) << shift;
        __syncwarp(); /* every lane has read hist before the next pass clears it */
    }
    *need_eq = kk;
    return prefix;
}

/* One pass in index order over the row: the forced blocks, keys > thr, and
 * keys == thr either up to index thr_idx (by_index) or the first need_eq of
 * them (the documented tie rule). Entry i goes to out[i] while i < cap and,
 * when fin is not NULL, to fin[i] while i < bound. Returns the count. */
static __device__ int32_t write_selected(const row_keys *r, uint32_t thr, int by_index,
                                         uint32_t thr_idx, int32_t need_eq, int32_t *out,
                                         int32_t cap, int32_t *fin, int32_t bound, int lane) {
    const uint32_t lt = (1u << lane) - 1u;
    int32_t written = 0, eq_seen = 0;
    for (int32_t j0 = 0; j0 < r->n; j0 += 32) {
        const int32_t j = j0 + lane;
        const int in = j < r->n;
        const uint32_t key = in ? key_at(r, j) : 0u;
        const int is_eq = key != 0u && key == thr;
        int eq_sel;
        if (by_index) {
            eq_sel = is_eq && (uint32_t)j <= thr_idx;
        } else {
            const uint32_t eq_mask = __ballot_sync(0xffffffffu, is_eq && need_eq > 0);
            eq_sel = is_eq && eq_seen + __popc(eq_mask & lt) < need_eq;
            eq_seen += __popc(eq_mask);
        }
        const int forced = in && (j < r->sink_end || (uint32_t)(j - r->lo) < r->local_len);
        const int sel = forced || key > thr || eq_sel;
        const uint32_t sel_mask = __ballot_sync(0xffffffffu, sel);
        const int32_t pos = written + __popc(sel_mask & lt);
        if (sel && pos < cap) out[pos] = j;
        if (sel && fin != NULL && pos < bound) fin[pos] = j;
        written += __popc(sel_mask);
    }
    return written;
}

__global__ void __launch_bounds__(SEL_WARPS * 32) sk_topk_select_kernel(const __grid_constant__ select_params sp) {
    pdl_enter();
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
    const row_keys rk = {row, cached ? keys : NULL, n, rule.sink_end, rule.local_lo,
                         rule.local_hi >= rule.local_lo
                             ? (uint32_t)(rule.local_hi - rule.local_lo + 1)
                             : 0u};
    if (!done) thr = radix_threshold(&rk, take, hist, lane, &need_eq);

    /* Forced and selected blocks in increasing order into the scratch row. */
    const int32_t written = write_selected(&rk, thr, by_index, thr_idx, need_eq,
                                           sp.scratch + (int64_t)g * p->row_cap, p->row_cap,
                                           NULL, 0, lane);
    if (lane == 0) sp.counts[g] = written < p->row_cap ? written : p->row_cap;
}

/* The register selection's bit mask of a lane's passing registers (bit e:
 * register e), as wide as KEYS needs. */
template <int KEYS> struct reg_mask { typedef uint32_t type; };
template <> struct reg_mask<64> { typedef uint64_t type; };
static __device__ __forceinline__ int mask_count(uint32_t m) {
    return __popc(m);
}
static __device__ __forceinline__ int mask_count(uint64_t m) {
    return __popcll(m);
}
static __device__ __forceinline__ int mask_lowest(uint32_t m) {
    return __ffs((int)m) - 1;
}
static __device__ __forceinline__ int mask_lowest(uint64_t m) {
    return __ffsll((long long)m) - 1;
}

/* The selection for rows of at most 32 * KEYS candidates and k <= 32, one
 * warp per row, each lane holding the keys of blocks lane + 32 e in
 * registers (same keys, rules and result as sk_topk_select_kernel). Warp w
 * of rows row_first .. row_first + row_count - 1 of every slice: the
 * candidate count grows with the row, so the host splits the rows at the
 * last one with at most 16 * 32 candidates, and the shorter rows run with
 * KEYS = 16 (fewer instructions per row).
 *   1. the scores, register 4 q + c of a lane holding block
 *      4 lane + 128 q + c (one 16-byte load per group of 128 blocks where
 *      the rows are aligned); in each group that is not wholly pickable,
 *      the forced and non-candidate blocks set to -inf; each lane's
 *      largest score (fmaxf skips NaN);
 *   2. t = the k-th largest lane maximum, or -FLT_MAX when fewer than k
 *      lanes hold a pickable score; gather the m pickable scores >= t
 *      (NaN and -inf never pass) as (key, ~index) composites, which hold
 *      the take = min(k, m) largest: each lane marks its passing registers
 *      in a bit mask, a warp scan of the mask counts gives each lane its
 *      place, and each lane then reloads only its passing scores (from
 *      L1) to write them, lane after lane;
 *   3. if m <= SEL_FILTER, the selected are the take largest composites:
 *      a composite's rank (the number of larger ones) below take puts its
 *      block at that rank in a table; the row is written straight from the
 *      table: the forced blocks are the sinks 0 .. sink_end - 1 and one run
 *      lo2 .. hi past them, and no selected block lies inside either, so
 *      each entry's place is a count of selected blocks and forced blocks
 *      before it;
 *   4. else (many keys tied at t) the 4-pass radix select of
 *      sk_topk_select_kernel on keys reloaded in 32-wide stripes, and its
 *      index-ordered pass.
 * A row shorter than its bound (NaN / -inf scores) raises the flag that
 * makes the placement compact. */
template <int KEYS>
static __device__ __forceinline__ void select_reg_row(const select_params &sp, int32_t row_first,
                                                      int32_t row_count, int32_t w,
                                                      uint32_t *hist, int32_t *taken) {
    static_assert(KEYS % 4 == 0 && KEYS <= SEL_REG_KEYS, "keys per lane: groups of 4");
    static_assert(SEL_REG_K <= 32 && SEL_FILTER * 8 <= 256 * 4, "filter bound and buffer");
    const sk_topk_problem *p = &sp.p;
    const int lane = (int)(threadIdx.x & 31);
    if (w >= p->slices * row_count) return; /* whole warps leave; no block barrier follows */
    const int32_t slice = w / row_count, r = row_first + (w - slice * row_count);
    const int32_t g = slice * p->row_blocks + r;
    const int4 rule = sp.table.rule[r];
    const int32_t n = rule.x, sink_end = rule.y, lo = rule.z, hi = rule.w;
    const uint32_t local_len = hi >= lo ? (uint32_t)(hi - lo + 1) : 0u;
    const float *row = sp.scores + (int64_t)g * p->col_blocks;
    uint64_t *cand = (uint64_t *)(void *)hist; /* SEL_FILTER entries, shares hist */

    /* Register e = 4 q + c holds block 4 lane + 128 q + c: group q is 128
     * consecutive blocks, 4 per lane, one 16-byte load where the rows allow
     * it (sp.vec). A lane past the row reloads its last quad (the mask below
     * drops those blocks), so that no load needs a predicate. Every load is
     * issued before the first score is used. */
    const int32_t lane4 = 4 * lane;
    float sc[KEYS];
    if (n > 0) {
        if (sp.vec) {
            const int32_t last = (n - 1) & ~3; /* a whole quad: col_blocks % 4 == 0 */
#pragma unroll
            for (int q = 0; q < KEYS / 4; ++q) {
                if (128 * q < n) {
                    const int32_t j = lane4 + 128 * q;
                    const float4 v = *(const float4 *)(const void *)(row + (j < last ? j : last));
                    sc[4 * q + 0] = v.x;
                    sc[4 * q + 1] = v.y;
                    sc[4 * q + 2] = v.z;
                    sc[4 * q + 3] = v.w;
                }
            }
        } else {
#pragma unroll
            for (int q = 0; q < KEYS / 4; ++q) {
                if (128 * q < n) {
#pragma unroll
                    for (int c = 0; c < 4; ++c) {
                        const int32_t j = lane4 + 128 * q + c;
                        sc[4 * q + c] = row[j < n ? j : n - 1];
                    }
                }
            }
        }
    }
    /* Only groups that are not wholly pickable are masked: there the
     * forced blocks and those past the candidates become -inf, as does every
     * block of a group past the row (whose registers were not loaded). NaN
     * and -inf may stay elsewhere: fmaxf ignores NaN, and neither passes the
     * threshold below (t >= -FLT_MAX), so from here on comparing scores is
     * comparing keys (the key order is the score order, with -0 == +0 in
     * both). */
    const float neg_inf = __int_as_float((int)0xff800000u);
    float lane_max = neg_inf;
#pragma unroll
    for (int q = 0; q < KEYS / 4; ++q) {
        const int32_t g0 = 128 * q;
        const bool whole = g0 >= sink_end && g0 + 128 <= n && (g0 + 128 <= lo || g0 > hi);
        if (!whole) {
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const int32_t j = lane4 + g0 + c;
                sc[4 * q + c] = pickable(j, n, sink_end, lo, local_len) ? sc[4 * q + c] : neg_inf;
            }
        }
        lane_max = fmaxf(lane_max, fmaxf(fmaxf(sc[4 * q], sc[4 * q + 1]),
                                         fmaxf(sc[4 * q + 2], sc[4 * q + 3])));
    }
    /* Forced: the sinks, then the local run lo2 .. hi beyond them. */
    const int32_t lo2 = lo > sink_end ? lo : sink_end;
    const int32_t local_cnt = hi >= lo2 ? hi - lo2 + 1 : 0;
    const int32_t forced = sink_end + local_cnt;
    const int32_t rest = n - forced;
    const int32_t bound = forced + (p->k < rest ? p->k : rest);
    /* Each entry goes to the scratch row (the compaction's source when some
     * row comes out short) and to the row's place when every row fills its
     * bound (from the row table), so that the placement has nothing to copy
     * in the common case. */
    int32_t *out = sp.scratch + (int64_t)g * p->row_cap;
    const int32_t first = slice * sp.per_slice + sp.table.place[r].x;
    int32_t *fin = p->col_indices + first;

    /* t = the k-th largest lane maximum, or -FLT_MAX where fewer than k
     * lanes hold a pickable score. In the first case at least k scores pass
     * (the k lane maxima >= t), so take = k; in the second every pickable
     * score passes, and m is their count. Either way the m passing scores
     * hold the take largest. */
    int32_t m = 0;
    if (p->k > 0) {
        const float t = fmaxf(warp_kth_largest(lane_max, lane, p->k), -FLT_MAX);
        typedef typename reg_mask<KEYS>::type mask_t;
        mask_t passing = 0u; /* bit e: register e's score is >= t (never -inf or NaN) */
#pragma unroll
        for (int e = 0; e < KEYS; ++e)
            if (sc[e] >= t) passing |= (mask_t)1u << e;
        const int32_t c = mask_count(passing), incl = warp_inclusive_sum(c, lane);
        m = __shfl_sync(0xffffffffu, incl, 31);
        /* The passing scores are reloaded by index (a register array cannot
         * be indexed at run time); they are pickable, so the raw score is
         * the masked one. */
        for (int32_t pos = incl - c; passing != 0u && pos < SEL_FILTER; ++pos) {
            const int e = mask_lowest(passing);
            const int32_t j = lane4 + 128 * (e >> 2) + (e & 3);
            passing &= passing - 1u;
            cand[pos] = ((uint64_t)score_key(row[j]) << 32) | (uint32_t)~(uint32_t)j;
        }
        __syncwarp();
    }
    const int32_t take = p->k < m ? p->k : m;

    int32_t written;
    if (m <= SEL_FILTER) {
        for (int32_t e = lane; e < m; e += 32) {
            const uint64_t mine = cand[e];
            int32_t above = 0;
#pragma unroll 4
            for (int32_t f = 0; f < m; ++f) above += cand[f] > mine;
            if (above < take) taken[above] = (int32_t)~(uint32_t)mine; /* ranks differ */
        }
        __syncwarp();
        const int32_t j = lane < take ? taken[lane] : 0;
        int32_t before = 0; /* selected blocks below j */
        for (int32_t f = 0; f < take; ++f) before += taken[f] < j;
        const int32_t sel_below = __popc(__ballot_sync(0xffffffffu, lane < take && j < lo2));
        if (lane < take) {
            const int32_t at = sink_end + before + (j > hi ? local_cnt : 0);
            out[at] = j;
            fin[at] = j;
        }
        for (int32_t f = lane; f < forced; f += 32) {
            const int32_t at = f < sink_end ? f : f + sel_below;
            const int32_t blk = f < sink_end ? f : lo2 + (f - sink_end);
            out[at] = blk;
            fin[at] = blk;
        }
        written = forced + take;
    } else {
        /* Many ties at t: the radix select of sk_topk_select_kernel, on keys
         * reloaded from the scores (from L1), so that no score register
         * stays live here. */
        __syncwarp(); /* cand shares hist: every lane is past the gather */
        const row_keys rk = {row, NULL, n, sink_end, lo, local_len};
        int32_t need_eq;
        const uint32_t thr = radix_threshold(&rk, take, hist, lane, &need_eq);
        const int32_t wr = write_selected(&rk, thr, 0, 0u, need_eq, out, p->row_cap, fin, bound,
                                          lane);
        written = wr < p->row_cap ? wr : p->row_cap;
    }
    if (lane == 0) {
        sp.counts[g] = written;
        p->row_offsets[g] = first;
        if (written != bound) atomicOr(sp.table.flag, 1);
    }
}

/* The register selection of every row, one launch: the CTAs below
 * long_ctas take rows split .. row_blocks - 1 of every slice (more than
 * LONG_KEYS / 2 * 32 candidates: KEYS = LONG_KEYS), the rest rows 0 ..
 * split - 1 (KEYS = LONG_KEYS / 2). One grid, so that the short rows fill
 * the SMs while the long ones drain (two launches ran one after the other);
 * the long rows first, as they take longer. LONG_KEYS = 32 up to 1024 key
 * blocks (63 registers: 8 CTAs per SM); 64 up to 2048, whose 64 score
 * registers per lane leave room for 5 (96 registers; at least 4). */
template <int LONG_KEYS>
__global__ void __launch_bounds__(SEL_WARPS * 32, LONG_KEYS == 64 ? 4 : 6) sk_topk_select_reg_kernel(
    const __grid_constant__ select_params sp, int32_t split, int32_t long_ctas) {
    pdl_enter();
    __shared__ __align__(8) uint32_t hist_all[SEL_WARPS][256];
    __shared__ int32_t taken_all[SEL_WARPS][SEL_REG_K]; /* selected blocks by rank */
    const int warp = (int)(threadIdx.x >> 5);
    const int32_t cta = (int32_t)blockIdx.x;
    if (cta < long_ctas)
        select_reg_row<LONG_KEYS>(sp, split, sp.p.row_blocks - split, cta * SEL_WARPS + warp,
                                  hist_all[warp], taken_all[warp]);
    else
        select_reg_row<LONG_KEYS / 2>(sp, 0, split, (cta - long_ctas) * SEL_WARPS + warp,
                                      hist_all[warp], taken_all[warp]);
}

typedef struct place_params {
    const int32_t *counts;  /* [rows] */
    const int32_t *scratch; /* [rows, row_cap] */
    int32_t *row_offsets;   /* [rows + 1] */
    int32_t *col_indices;   /* [capacity] */
    row_table table;        /* read unless `compact` */
    int32_t row_cap, rows;
    int32_t capacity;
    int32_t per_cta;        /* compaction: rows per CTA (a multiple of CMP_THREADS) */
    int32_t compact_ctas;   /* compaction: CTAs with rows */
    int32_t compact;        /* != 0: compact whatever the flag says (no row table) */
} place_params;

/* Row offsets and the packed column indices.
 * Unless `compact` is set or the flag says that some row came out short,
 * every row filled its bound, and the register selection has already
 * written each row's entries and offset at the place the row table gives
 * (slice * per_slice + place.x): only the last offset is left.
 * Else the compaction, one pass: CTA c < compact_ctas owns rows
 * [c * per_cta, min((c + 1) * per_cta, rows)): it sums the counts of every
 * earlier row itself (at most CMP_MAX_CTAS CTAs read the counts, from L2),
 * scans its own rows in chunks of CMP_THREADS, writes their offsets, and
 * copies each row's scratch entries with one warp per row. The last CTA
 * also writes row_offsets[rows]. */
__global__ void __launch_bounds__(CMP_THREADS) sk_topk_place_kernel(const __grid_constant__ place_params pp) {
    pdl_enter();
    const int32_t *counts = pp.counts, *scratch = pp.scratch;
    int32_t *row_offsets = pp.row_offsets, *col_indices = pp.col_indices;
    const int32_t row_cap = pp.row_cap, rows = pp.rows, per_cta = pp.per_cta;
    if (!pp.compact && *pp.table.flag == 0) { /* the same value for the whole grid */
        if (blockIdx.x == 0 && threadIdx.x == 0) row_offsets[rows] = pp.capacity;
        return;
    }
    if ((int32_t)blockIdx.x >= pp.compact_ctas) return;
    __shared__ int32_t warp_part[CMP_THREADS / 32];
    __shared__ int32_t chunk_off[CMP_THREADS];
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
        int32_t total;
        const int32_t off = base + cta_exclusive_sum<CMP_THREADS>(v, warp_part, &total);
        chunk_off[tid] = off;
        if (r < r1) row_offsets[r] = off;
        __syncthreads();
        /* Copy: warp w takes rows c0 + w, c0 + w + 8, ... of the chunk. */
        for (int32_t q = warp; q < CMP_THREADS && c0 + q < r1; q += CMP_THREADS / 32) {
            const int32_t g = c0 + q, nsel = counts[g], dst = chunk_off[q];
            const int32_t *src = scratch + (int64_t)g * row_cap;
            for (int32_t e = lane; e < nsel; e += 32) col_indices[dst + e] = src[e];
        }
        base += total;
        __syncthreads(); /* warp_part and chunk_off are rewritten next */
    }
    if (r1 == rows && tid == 0) row_offsets[rows] = base;
}

/* ---------------------------------------------------------------------------
 * Entry points
 * ------------------------------------------------------------------------- */

/* The row scoring's split operands in the workspace; with presplit, the
 * pooling's Q tiles too (workspace_layout with_pool). */
static split_operands split_at(const sk_topk_problem *p, char *base, const ws_layout *w,
                               int presplit) {
    split_operands so;
    so.k_tiles = base + w->k_split_off;
    so.k_exp = (int32_t *)(base + w->k_rows_off);
    so.q_tiles = presplit ? base + w->q_split_off : NULL;
    so.q_exp = presplit ? (int32_t *)(base + w->q_rows_off) : NULL;
    so.chunks = split_chunks(p->head_dim);
    return so;
}

/* The device checks (sk_cuda_check_arch: 8.0 or later, 9.0 when the backend
 * forces the Hopper kernels). *hopper: score with the Hopper kernel (a 9.0
 * device, unless the backend forces the portable kernels). */
static sk_status check_device(sk_backend backend, int *hopper) {
    SK_TRY(sk_cuda_check_arch(backend, hopper));
    if (backend == SK_BACKEND_CUDA_SM80) *hopper = 0;
    return SK_STATUS_SUCCESS;
}

extern "C" sk_status sk_cuda_topk_workspace_size(const sk_topk_problem *p, int with_scores,
                                                 size_t *bytes) {
    *bytes = workspace_layout(p, with_scores, 0).total;
    return SK_STATUS_SUCCESS;
}

extern "C" sk_status sk_cuda_topk_pool_select_workspace_size(const sk_topk_problem *p,
                                                             size_t *bytes) {
    *bytes = workspace_layout(p, 1, 1).total;
    return SK_STATUS_SUCCESS;
}

extern "C" sk_status sk_cuda_topk_pool(const sk_topk_problem *p, cudaStream_t stream) {
    int hopper;
    SK_TRY(check_device(p->backend, &hopper));
    return launch_pool(p, NULL, 0, stream);
}

static sk_status check_workspace_size(size_t workspace_size, const ws_layout *w) {
    if (workspace_size < w->total)
        return sk_error(SK_STATUS_BAD_PARAM_WORKSPACE,
                        "workspace_size = %zu is less than the %zu bytes needed", workspace_size,
                        w->total);
    return SK_STATUS_SUCCESS;
}

/* The selection chain after the pooling (or from p->scores), regions of w
 * in `base`. presplit: the pooling wrote both split operands (pool_splits). */
static sk_status select_chain(const sk_topk_problem *p, char *base, ws_layout w, int hopper,
                              int presplit, cudaStream_t stream) {
    const int with_scores = p->pooled_q != NULL;
    int32_t *counts = (int32_t *)(base + w.counts_off);
    int32_t *scratch = (int32_t *)(base + w.scratch_off);
    row_table table;
    table.rule = (int4 *)(base + w.rule_off);
    table.place = (int2 *)(base + w.place_off);
    table.flag = (int32_t *)(base + w.flag_off);
    /* The register selection takes every row (k <= 32, at most 1024 key
     * blocks) and then places the rows by the row table; else the general
     * selection kernel and the compaction. */
    const int reg = p->k <= SEL_REG_K && p->col_blocks <= SEL_REG_MAX;
    const float *scores = p->scores;
    launch_cfg l; /* every launch below: programmatic serialization on Hopper (pdl_enter) */
    if (with_scores) {
        score_params sp = score_params{};
        sp.p = *p;
        sp.table = table;
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
            SK_CUDA_TRY(cudaLaunchKernelEx(launch_config(&l, (unsigned)blocks, SUM_THREADS, 0,
                                                         stream, hopper),
                                           sk_topk_group_sum_kernel, p->pooled_q, p->group,
                                           sp.a_slice_stride, n4, qsum),
                        "group-sum kernel launch");
            sp.a = qsum;
        }
        /* <= the dense tile count (sk_grid_check), plus the row-table CTA */
        const int64_t tiles = (int64_t)p->slices * sp.tiles_i * sp.tiles_j;
        sp.tiles = (int32_t)tiles;
        if (hopper && needs_split(p, with_scores)) {
            sp.split = split_at(p, base, &w, presplit);
            SK_TRY(sk_topk_score_rows_sm90(&sp, stream));
        } else if (hopper) {
            SK_TRY(sk_topk_score_sm90(&sp, stream));
        } else {
            SK_CUDA_TRY(cudaLaunchKernelEx(launch_config(&l, (unsigned)tiles + 1, SC_THREADS, 0,
                                                         stream, 0),
                                           sk_topk_score_kernel, sp),
                        "scoring kernel launch");
        }
        scores = sp.scores;
    } else if (reg) {
        SK_CUDA_TRY(cudaLaunchKernelEx(launch_config(&l, 1, TBL_THREADS, 0, stream, hopper),
                                       sk_topk_row_table_kernel, *p, table),
                    "row-table kernel launch");
    }
    select_params sel;
    sel.p = *p;
    sel.scores = scores;
    sel.counts = counts;
    sel.scratch = scratch;
    sel.table = table;
    sel.per_slice = p->slices > 0 ? (int32_t)(p->capacity / p->slices) : 0;
    sel.vec = ((uintptr_t)scores % 16 == 0) && p->col_blocks % 4 == 0;
    if (reg) {
        /* 32 keys per lane for up to 1024 key blocks, else 64. n_cand does
         * not decrease with the row: rows 0 .. split - 1 have at most
         * long_keys / 2 * 32 candidates. */
        const int32_t long_keys = p->col_blocks <= 32 * 32 ? 32 : 64;
        int32_t split_lo = 0, split_hi = p->row_blocks; /* first row with more, in [lo, hi] */
        while (split_lo < split_hi) {
            const int32_t mid = split_lo + (split_hi - split_lo) / 2;
            if (sk_topk_row_rules(p, mid).n_cand <= long_keys / 2 * 32)
                split_lo = mid + 1;
            else
                split_hi = mid;
        }
        const int32_t split = split_lo;
        const int64_t long_ctas =
            ((int64_t)p->slices * (p->row_blocks - split) + SEL_WARPS - 1) / SEL_WARPS;
        const int64_t short_ctas = ((int64_t)p->slices * split + SEL_WARPS - 1) / SEL_WARPS;
        SK_CUDA_TRY(cudaLaunchKernelEx(launch_config(&l, (unsigned)(long_ctas + short_ctas),
                                                     SEL_WARPS * 32, 0, stream, hopper),
                                       long_keys == 32 ? sk_topk_select_reg_kernel<32>
                                                       : sk_topk_select_reg_kernel<64>,
                                       sel, split, (int32_t)long_ctas),
                    "selection kernel launch");
    } else {
        const unsigned sel_blocks = (unsigned)((p->total_rows + SEL_WARPS - 1) / SEL_WARPS);
        SK_CUDA_TRY(cudaLaunchKernelEx(launch_config(&l, sel_blocks, SEL_WARPS * 32, 0, stream,
                                                     hopper),
                                       sk_topk_select_kernel, sel),
                    "selection kernel launch");
    }
    /* Compaction: at most CMP_MAX_CTAS CTAs, each a multiple of CMP_THREADS
     * rows (without it, CTA 0 writes the last offset). */
    const int64_t rows = p->total_rows;
    int64_t per_cta = (rows + CMP_MAX_CTAS - 1) / CMP_MAX_CTAS;
    per_cta = (per_cta + CMP_THREADS - 1) / CMP_THREADS * CMP_THREADS;
    place_params pp;
    pp.counts = counts;
    pp.scratch = scratch;
    pp.row_offsets = p->row_offsets;
    pp.col_indices = p->col_indices;
    pp.table = table;
    pp.row_cap = p->row_cap;
    pp.rows = p->total_rows;
    pp.capacity = p->capacity;
    pp.per_cta = (int32_t)per_cta;
    pp.compact_ctas = (int32_t)((rows + per_cta - 1) / per_cta);
    pp.compact = !reg;
    SK_CUDA_TRY(cudaLaunchKernelEx(launch_config(&l, (unsigned)pp.compact_ctas, CMP_THREADS, 0,
                                                 stream, hopper),
                                   sk_topk_place_kernel, pp),
                "placement kernel launch");
    return SK_STATUS_SUCCESS;
}

extern "C" sk_status sk_cuda_topk_select(const sk_topk_problem *p, void *workspace,
                                         size_t workspace_size, cudaStream_t stream) {
    int hopper;
    SK_TRY(check_device(p->backend, &hopper));
    const ws_layout w = workspace_layout(p, p->pooled_q != NULL, 0);
    SK_TRY(check_workspace_size(workspace_size, &w));
    return select_chain(p, (char *)workspace, w, hopper, 0, stream);
}

extern "C" sk_status sk_cuda_topk_pool_select(const sk_topk_problem *p, void *workspace,
                                              size_t workspace_size, cudaStream_t stream) {
    int hopper;
    SK_TRY(check_device(p->backend, &hopper));
    const ws_layout w = workspace_layout(p, 1, 1);
    SK_TRY(check_workspace_size(workspace_size, &w));
    char *base = (char *)workspace;
    sk_topk_problem q = *p;
    q.pooled_q_out = (float *)(base + w.pooled_q_off);
    q.pooled_k_out = (float *)(base + w.pooled_k_off);
    q.pooled_q = q.pooled_q_out; /* (not written when the pooling splits) */
    q.pooled_k = q.pooled_k_out;
    const int presplit = pool_splits(p, hopper);
    if (presplit) {
        const split_operands so = split_at(p, base, &w, 1);
        SK_TRY(launch_pool(&q, &so, 1, stream));
    } else {
        SK_TRY(launch_pool(&q, NULL, 1, stream));
    }
    return select_chain(&q, base, w, hopper, presplit, stream);
}
