/*
 * pool.cu - the top-k pooling kernel: the block means of Q and K, one
 * launch for both. One thread per (head, 8-element chunk of D) of one block
 * of one tensor, 16-byte loads of the block's tokens (8 in flight), fp32
 * sums, one division by the token count; a CTA takes every head of its
 * block where they fit in 512 threads, so that it reads whole token rows.
 * Q and K are read once (bandwidth-bound: 92.5 % of DRAM peak on the H200,
 * docs/perf/topk_log.md step 9). In sk_pool_select_topk on a 9.0 device with
 * D = 64 or 128 and no group sums (pool_splits in chain.cu), the means go
 * straight into the row scoring's split operands (Q and K tiles,
 * pool_store_split) instead of fp32, and the split kernel is not launched
 * (step 13). In sk_pool_select_topk, in either form, the blocks outside the
 * score span (sk_topk_score_span) are not read, only zeroed (step 21).
 * The first kernel of the chain (chain.cu): it only releases its successor.
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda/common/cuda_check.cuh"
#include "cuda/common/hopper.cuh"
#include "cuda/topk/kernels.cuh"

enum {
    POOL_THREADS = 512, /* the most per pooling CTA: 32 heads x 16 chunks of D = 128 */
    POOL_INFLIGHT = 8   /* 16-byte loads in flight per thread */
};

typedef struct pool_tensor {
    const char *src;                      /* [B, S, H, D] F16 or BF16 */
    int64_t stride_b, stride_s, stride_h; /* elements */
    int64_t seq;
    int32_t heads, block, nblocks;
    int32_t read_lo, read_hi;             /* blocks read; the others are stored as zeros */
    float *dst;                           /* [B, H, nblocks, D], or NULL: */
    char *split;         /* the block means split for the Hopper row scoring instead (split
                            blocks per 128-row tile of each (batch, head), kernels.cuh) */
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
 * split as split_tile_bytes blocks (kernels.cuh): the row's exponent
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
 * 0-4 us, docs/perf/topk_log.md step 18). */
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
sk_status sk_topk_launch_pool(const sk_topk_problem *p, const split_operands *split, int span_only,
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
     * H200, docs/perf/topk_log.md step 9). */
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
