/*
 * summary.cu - the key block summaries of the decode selection
 * (sk_kv_summary_build / sk_kv_summary_append): per (sequence, KV head, key
 * block) the per-channel min and max of the block's keys, read through the
 * page table.
 *
 * One thread per (row, 8-channel chunk, block slot): it walks its blocks
 * j = j0 + blockIdx.y, + gridDim.y, ... and, inside each, the keys in
 * position order, as the CPU reference does, so the two agree bit for bit
 * (comparisons only: x < min, x > max; NaN never replaces). Consecutive
 * threads take consecutive 16-byte chunks of one key row, then the next KV
 * head of the same slot: the loads of a warp are 512 contiguous bytes.
 * Lengths are clamped to [0, max_seqlen_k] (an append's old length to [0,
 * new length]); a page index outside [0, num_pages) makes its keys absent.
 * The append walks only the blocks holding keys old .. new - 1 and merges
 * the first with its stored summary when it held keys before. With two
 * levels a second kernel then recomputes the groups of those blocks from
 * the stored block summaries.
 */
#include "cuda/backend.h"
#include "cuda/decode_select/dsel.cuh"

enum {
    SUM_THREADS = 256,
    SUM_CHUNK = 8,           /* channels per thread: one 16-byte load */
    SUM_BUILD_SLOTS = 4096,  /* block slots of a build (gridDim.y) */
    SUM_APPEND_SLOTS = 16    /* ... of an append: a decode step touches one block */
};

/* A thread's row r and 8-channel chunk c, the row's clamped length and
 * old length (0 for a build); false when the thread has no work (past the
 * rows, or an append that adds nothing to its row). */
static __device__ __forceinline__ bool summary_item(const sk_dsel_problem &p, int append,
                                                    int32_t *r, int32_t *c, int32_t *len,
                                                    int32_t *old) {
    const int32_t chunks = p.head_dim / SUM_CHUNK;
    const int64_t item = (int64_t)blockIdx.x * SUM_THREADS + threadIdx.x;
    if (item >= (int64_t)p.rows * chunks) return false;
    *r = (int32_t)(item / chunks);
    *c = (int32_t)(item % chunks);
    *len = sk_dsel_clamp_len(p.seq_lens[*r / p.heads_kv], p.max_seqlen_k);
    *old = append ? sk_dsel_clamp_len(p.old_lens[*r / p.heads_kv], *len) : 0;
    return !append || *old != *len;
}

__global__ void __launch_bounds__(SUM_THREADS)
    sk_dsel_summary_kernel(const __grid_constant__ sk_dsel_problem p, int append) {
    int32_t r, c, len, old;
    if (!summary_item(p, append, &r, &c, &len, &old)) return;
    const int32_t b = r / p.heads_kv, h = r % p.heads_kv;
    const int32_t j0 = append ? old / p.block_k : 0;
    const int32_t j1 = append ? sk_dsel_blocks(len, p.block_k) : p.max_blocks;
    const int bf16 = p.dtype == SK_DTYPE_BF16;
    const int32_t *table = p.page_table + (int64_t)b * p.page_table_stride;
    const uint16_t *cache = (const uint16_t *)p.k_cache + (int64_t)h * p.k_stride[2] + c * SUM_CHUNK;
    uint16_t *out = (uint16_t *)p.summary_out;
    for (int32_t j = j0 + (int32_t)blockIdx.y; j < j1; j += (int32_t)gridDim.y) {
        uint16_t *dst = out + ((int64_t)r * p.max_blocks + j) * 2 * p.head_dim + c * SUM_CHUNK;
        const int64_t lo = (int64_t)j * p.block_k;
        const int64_t hi = lo + p.block_k < len ? lo + p.block_k : len;
        float mn[SUM_CHUNK], mx[SUM_CHUNK];
        if (append && lo < old) {
            dsel_load8(dst, bf16, mn);
            dsel_load8(dst + p.head_dim, bf16, mx);
        } else {
#pragma unroll
            for (int e = 0; e < SUM_CHUNK; ++e) {
                mn[e] = __int_as_float(0x7f800000);
                mx[e] = __int_as_float((int)0xff800000u);
            }
        }
        for (int64_t pos = lo > old ? lo : old; pos < hi; ++pos) {
            const int32_t page = table[pos / p.page_size];
            if (page < 0 || page >= p.num_pages) continue; /* absent */
            float x[SUM_CHUNK];
            dsel_load8(cache + page * p.k_stride[0] + (pos % p.page_size) * p.k_stride[1], bf16, x);
#pragma unroll
            for (int e = 0; e < SUM_CHUNK; ++e) {
                if (x[e] < mn[e]) mn[e] = x[e];
                if (x[e] > mx[e]) mx[e] = x[e];
            }
        }
        dsel_store8(dst, bf16, mn);
        dsel_store8(dst + p.head_dim, bf16, mx);
    }
}

/* Two levels: the groups holding the blocks the kernel above updated
 * (build: every group), each the min / max of its blocks' summaries below
 * the row's block count, in block order (as the CPU reference). The same
 * thread mapping, over group slots. */
__global__ void __launch_bounds__(SUM_THREADS)
    sk_dsel_group_kernel(const __grid_constant__ sk_dsel_problem p, int append) {
    int32_t r, c, len, old;
    if (!summary_item(p, append, &r, &c, &len, &old)) return;
    const int32_t n = sk_dsel_blocks(len, p.block_k);
    const int32_t g0 = append ? old / p.block_k / p.group_blocks : 0;
    const int32_t g1 = append ? (n - 1) / p.group_blocks + 1 : p.max_groups;
    const int bf16 = p.dtype == SK_DTYPE_BF16;
    uint16_t *out = (uint16_t *)p.summary_out;
    const uint16_t *blocks = out + (int64_t)r * p.max_blocks * 2 * p.head_dim + c * SUM_CHUNK;
    uint16_t *groups = out + ((int64_t)p.rows * p.max_blocks + (int64_t)r * p.max_groups) * 2 * p.head_dim +
                       c * SUM_CHUNK;
    for (int32_t g = g0 + (int32_t)blockIdx.y; g < g1; g += (int32_t)gridDim.y) {
        float mn[SUM_CHUNK], mx[SUM_CHUNK];
#pragma unroll
        for (int e = 0; e < SUM_CHUNK; ++e) {
            mn[e] = __int_as_float(0x7f800000);
            mx[e] = __int_as_float((int)0xff800000u);
        }
        const int32_t j1 = (g + 1) * p.group_blocks < n ? (g + 1) * p.group_blocks : n;
        for (int32_t j = g * p.group_blocks; j < j1; ++j) {
            float lo[SUM_CHUNK], hi[SUM_CHUNK];
            dsel_load8(blocks + (int64_t)j * 2 * p.head_dim, bf16, lo);
            dsel_load8(blocks + (int64_t)j * 2 * p.head_dim + p.head_dim, bf16, hi);
#pragma unroll
            for (int e = 0; e < SUM_CHUNK; ++e) {
                if (lo[e] < mn[e]) mn[e] = lo[e];
                if (hi[e] > mx[e]) mx[e] = hi[e];
            }
        }
        uint16_t *dst = groups + (int64_t)g * 2 * p.head_dim;
        dsel_store8(dst, bf16, mn);
        dsel_store8(dst + p.head_dim, bf16, mx);
    }
}

sk_status sk_cuda_dsel_summary(const sk_dsel_problem *p, int append, struct CUstream_st *stream) {
    SK_TRY(dsel_check_device(p->backend));
    const int64_t items = (int64_t)p->rows * (p->head_dim / SUM_CHUNK);
    const int64_t ctas = (items + SUM_THREADS - 1) / SUM_THREADS;
    if (ctas > INT32_MAX)
        return sk_error(SK_STATUS_NOT_SUPPORTED, "%lld summary rows x chunks exceed one grid",
                        (long long)items);
    const int32_t slots_max = append ? SUM_APPEND_SLOTS : SUM_BUILD_SLOTS;
    const int32_t slots = p->max_blocks < slots_max ? p->max_blocks : slots_max;
    sk_dsel_summary_kernel<<<dim3((unsigned)ctas, (unsigned)slots, 1), SUM_THREADS, 0,
                             (cudaStream_t)stream>>>(*p, append);
    if (p->max_groups == 0) return sk_cuda_status(cudaGetLastError(), "summary kernel launch");
    SK_CUDA_TRY(cudaGetLastError(), "summary kernel launch");
    const int32_t group_slots = p->max_groups < slots_max ? p->max_groups : slots_max;
    sk_dsel_group_kernel<<<dim3((unsigned)ctas, (unsigned)group_slots, 1), SUM_THREADS, 0,
                           (cudaStream_t)stream>>>(*p, append);
    return sk_cuda_status(cudaGetLastError(), "group summary kernel launch");
}
