/*
 * decode_kernel.cuh - the portable (sm_80+) split-KV decode kernel (part of
 * decode.cu, included there only). Design: docs/perf/decode.md.
 *
 * One CTA of 4 warps per (sequence b, KV head, split, row group). Its
 * query rows are the group's Hq / Hkv heads x q_len tokens, row m = t x
 * group + hh (token t, head hkv x group + hh), padded to 16 x kMT rows per
 * row group (the MMA M dimension); rows past group x q_len are zero and
 * never written. Keys arrive in chunks of 16 logical positions: a chunk
 * lies in one selected block (blocks are 16 .. 128 keys) and one page
 * (pages are 16 .. 128 slots), so its 16 rows are one strided run of the
 * cache. The row's chunks, in the layout's (sorted) block order, are
 * numbered entry x (block_k / 16) + sub; split s takes a contiguous share
 * of them, and warp w the chunks w, w + 4, ... of that share.
 *
 * Each warp runs its own kStages-deep cp.async pipeline over its chunks
 * (no CTA barrier in the main loop): S = Q K^T with mma.sync m16n8k16 (Q
 * from shared memory by ldmatrix, K by ldmatrix), the masked online
 * softmax in base 2, O += P V (V by ldmatrix.trans). At the end the four
 * warps' (max, sum, O) are combined through shared memory in warp order,
 * and the CTA writes either O and LSE (one split) or its normalised fp32
 * partial O and its LSE into the workspace for the merge kernel.
 *
 * Robustness (sparsek.h "Decode"): len_k(b) is clamped to [0,
 * max_seqlen_k]; the row's offsets to [0, nnz]; an index outside [0,
 * nb(b)) or a page outside [0, num_pages) makes its chunk absent (never
 * read); slots past len_k are zero-filled, never read; the count of
 * entries below nb(b) is found by binary search (the row is sorted in a
 * valid layout), and each entry is range-checked again before use.
 */
#ifndef SK_CUDA_DECODE_KERNEL_CUH
#define SK_CUDA_DECODE_KERNEL_CUH

#include <stdint.h>

#include "cuda/attention/sm80_common.cuh"
#include "cuda/common/ptx.cuh"

enum {
    SK_DECODE_WARPS = 4,
    SK_DECODE_THREADS = SK_DECODE_WARPS * 32,
    SK_DECODE_CHUNK = 16, /* keys per warp step */
    SK_DECODE_STAGES = 3, /* cp.async stages per warp */
    SK_DECODE_MERGE_MAX_SPLITS = 128 /* the merge holds a row's LSEs in 4 registers a lane */
};

/* The kernels' one parameter block (byte strides). */
struct sk_decode_params {
    const char *q, *k, *v;
    char *o;
    float *lse;                 /* [B, Hq, q_len] or NULL */
    float *part_o, *part_lse;   /* workspace: [rows, splits, D], [rows, splits]; splits > 1 */
    const int32_t *seq_lens_k, *page_table, *row_offsets, *col_indices;
    int64_t q_stride[3], o_stride[3], k_stride[3], v_stride[3]; /* bytes */
    int64_t table_stride;
    int32_t batch, heads_q, heads_kv, group, q_len, rows, row_groups, splits;
    int32_t num_pages, page_size, max_seqlen_k, block_k, layout_heads, nnz, dense, causal;
    float scale_log2;
};

/* Shared memory of a CTA: per warp kStages stages of K and V (16 rows of
 * kD each, swizzled), the Q tile, each warp's row maxima and sums, and
 * each warp-stage's chunk (first key, valid keys). The warps' fp32 O for
 * the combine reuses the stages. */
template <int kD, int kMT>
struct sk_decode_smem {
    static constexpr int kRows = 16 * kMT;
    static constexpr uint32_t kStageBytes = 2u * SK_DECODE_CHUNK * kD * 2; /* K then V */
    static constexpr uint32_t kStages = SK_DECODE_WARPS * SK_DECODE_STAGES * kStageBytes;
    static constexpr uint32_t kQ = kRows * kD * 2;
    static constexpr uint32_t kStats = SK_DECODE_WARPS * kRows * 2 * 4;
    static constexpr uint32_t kMeta = SK_DECODE_WARPS * SK_DECODE_STAGES * 8;
    static constexpr uint32_t kCombine = SK_DECODE_WARPS * kRows * kD * 4;
    static constexpr uint32_t kTotal = kStages + kQ + kStats + kMeta;
    static_assert(kCombine <= kStages, "the combine's fp32 O must fit in the stages");
    static_assert(kTotal <= 227u * 1024u, "shared memory budget");
};

/* The chunk numbering of one (sequence, KV head) row. */
struct sk_decode_row {
    int32_t len_k, entry0, entries, cpb, block_k;
};

__device__ __forceinline__ sk_decode_row sk_decode_row_of(const sk_decode_params &p, int b,
                                                         int hkv) {
    sk_decode_row r;
    int32_t len = __ldg(p.seq_lens_k + b);
    r.len_k = min(max(len, 0), p.max_seqlen_k);
    if (p.dense) {
        r.block_k = SK_DECODE_CHUNK;
        r.entry0 = 0;
        r.entries = (r.len_k + SK_DECODE_CHUNK - 1) / SK_DECODE_CHUNK;
        r.cpb = 1;
        return r;
    }
    r.block_k = p.block_k;
    r.cpb = p.block_k / SK_DECODE_CHUNK;
    const int64_t row = (int64_t)b * p.layout_heads + (p.layout_heads == 1 ? 0 : hkv);
    const int32_t lo = min(max(__ldg(p.row_offsets + row), 0), p.nnz);
    const int32_t hi = min(max(__ldg(p.row_offsets + row + 1), lo), p.nnz);
    const int32_t nb = (r.len_k + p.block_k - 1) / p.block_k;
    /* Entries below nb: a prefix of a sorted row (binary search). */
    int32_t a = lo, z = hi;
    while (a < z) {
        const int32_t mid = a + (z - a) / 2;
        if (__ldg(p.col_indices + mid) < nb)
            a = mid + 1;
        else
            z = mid;
    }
    r.entry0 = lo;
    r.entries = min(a - lo, nb); /* a corrupt row cannot make more work than nb blocks */
    return r;
}

/* The first key of chunk c of the row, or -1 when the chunk is absent
 * (an index out of range, no key left, a page out of range); *rows: its
 * keys below len_k; *src_k, *src_v: its first row in the caches. */
__device__ __forceinline__ int sk_decode_chunk(const sk_decode_params &p, const sk_decode_row &r,
                                               int b, int hkv, int c, int *rows,
                                               const char **src_k, const char **src_v) {
    const int e = c / r.cpb, sub = c - e * r.cpb;
    const int32_t j = p.dense ? e : __ldg(p.col_indices + r.entry0 + e);
    const int32_t nb = (r.len_k + r.block_k - 1) / r.block_k;
    if (j < 0 || j >= nb) return -1;
    const int key0 = j * r.block_k + sub * SK_DECODE_CHUNK;
    if (key0 >= r.len_k) return -1;
    const int32_t page = __ldg(p.page_table + (int64_t)b * p.table_stride + key0 / p.page_size);
    if (page < 0 || page >= p.num_pages) return -1;
    const int64_t slot = key0 % p.page_size;
    *rows = min(SK_DECODE_CHUNK, r.len_k - key0);
    *src_k = p.k + page * p.k_stride[0] + slot * p.k_stride[1] + hkv * p.k_stride[2];
    *src_v = p.v + page * p.v_stride[0] + slot * p.v_stride[1] + hkv * p.v_stride[2];
    return key0;
}

#include "cuda/decode/decode_kernel_body.cuh"

#endif /* SK_CUDA_DECODE_KERNEL_CUH */
