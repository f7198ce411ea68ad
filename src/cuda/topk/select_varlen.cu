/*
 * select_varlen.cu - the top-k selection on varlen and paged inputs on the GPU
 * (sk_cuda_topk_varlen_*, backend.h): portable kernels (sm_80 and later),
 * bit-exact with the CPU reference (src/cpu/topk_varlen_ref.c), no
 * allocation, no host synchronisation (graph safe).
 *
 * Bit-exactness comes from doing the CPU's arithmetic in the CPU's order:
 * block means as fp64 sums over the tokens in order, divided by the count
 * and rounded once; scores as fp64 sums over the group's heads and D in
 * order (each product of two floats is exact in fp64), scaled and rounded
 * once; the selection by (score descending, index ascending) with NaN and
 * -inf never picked. fp64 is slow on some parts, but the pooling reads each
 * token once and the scoring is small next to the attention.
 *
 * Kernels, in launch order:
 *   seqs    one CTA: each sequence's clamped {q0, len_q, k0, len_k} (the
 *           varlen plan's rules: docs/perf/varlen_paged.md), and two
 *           saturated prefix sums: row_start (query blocks, at most R) and
 *           kb_start (key blocks, at most kb_cap)
 *   pool    one CTA per pooled row (Q: head x R rows; K: Hkv x kb_cap key
 *           blocks), a thread per element of D; K through the page table
 *           when paged (a page index outside [0, num_pages) reads as zeros)
 *   select  one CTA per layout row (slice, r): the row's sequence by
 *           binary search over row_start, its rules (sk_topk_row_rules on
 *           the sequence's own Sq, Sk), scores of its pickable candidates
 *           into the workspace, then in chunks of the CTA's width each
 *           candidate's rank among the pickable scores (O(n^2) per row:
 *           the fixed path's radix selection is the upgrade), forced or
 *           rank < k kept, placed in index order into its scratch row
 *   place   place.cu's compaction: row offsets, col_indices
 *
 * Workspace (each part 256-byte aligned from the caller's 16-byte aligned
 * base): seqs int4 [B]; row_start, kb_start int32 [B + 1]; pooled Q fp32
 * [Hq, R, D]; pooled K fp32 [Hkv, kb_cap, D]; scores fp32 [slices, R,
 * max_kb]; counts int32 [slices x R]; scratch int32 [slices x R, row_cap].
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include "cuda/backend.h"
#include "cuda/common/cuda_check.cuh"
#include "cuda/topk/kernels.cuh"

enum {
    TV_ALIGN = 256,
    TV_SEQ_THREADS = 1024, /* the seqs kernel's one CTA */
    TV_POOL_THREADS = 128,
    TV_SEL_THREADS = 128
};

static size_t tv_align(size_t x) { return (x + TV_ALIGN - 1) / TV_ALIGN * TV_ALIGN; }

/* Byte offsets of the workspace parts (see the file header). */
typedef struct tv_layout {
    size_t seqs, row_start, kb_start, pooled_q, pooled_k, scores, counts, scratch, total;
} tv_layout;

static tv_layout tv_layout_of(const sk_topk_varlen_problem *p) {
    tv_layout w;
    const size_t dim = (size_t)p->t.head_dim, rows = (size_t)p->slices * p->rows;
    w.seqs = 0;
    w.row_start = tv_align(w.seqs + (size_t)p->batch * 16);
    w.kb_start = tv_align(w.row_start + ((size_t)p->batch + 1) * 4);
    w.pooled_q = tv_align(w.kb_start + ((size_t)p->batch + 1) * 4);
    w.pooled_k = tv_align(w.pooled_q + (size_t)p->t.heads_q * p->rows * dim * 4);
    w.scores = tv_align(w.pooled_k + (size_t)p->t.heads_kv * p->kb_cap * dim * 4);
    w.counts = tv_align(w.scores + rows * p->max_kb * 4);
    w.scratch = tv_align(w.counts + rows * 4);
    w.total = tv_align(w.scratch + rows * p->row_cap * 4);
    return w;
}

/* What the kernels read: the problem's template and the workspace parts. */
typedef struct tv_params {
    sk_topk_problem t;             /* per-sequence template (seq_q, seq_k set per row) */
    int32_t batch, rows, kb_cap, max_kb, row_cap, slices;
    int32_t total_q, total_k, max_q, max_k;
    int32_t paged, page_size, max_pages, bf16;
    int64_t num_pages, page_table_stride;
    const int32_t *cu_q, *cu_k, *lens_k, *page_table;
    const void *q, *k;
    int4 *seqs;
    int32_t *row_start, *kb_start;
    float *pooled_q, *pooled_k, *scores;
    int32_t *counts, *scratch;
} tv_params;

/* ---------------------------------------------------------------------------
 * seqs: clamped sequences and the two saturated prefix sums
 * ------------------------------------------------------------------------- */

/* [start, start + len) of entry b of a cumulative array, clamped. */
static __device__ __forceinline__ int2 tv_span(const int32_t *cu, int32_t b, int32_t total,
                                               int32_t max_len) {
    const int32_t s = min(max(cu[b], 0), total);
    const int32_t e = min(max(cu[b + 1], s), total);
    return make_int2(s, min(e - s, max_len));
}

/* Inclusive sum over the CTA of TV_SEQ_THREADS threads (all call it); *total
 * the CTA's sum. `part`: TV_SEQ_THREADS / 32 shared words. */
static __device__ long long tv_cta_inclusive(long long v, long long *part, long long *total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 1; o < 32; o <<= 1) {
        const long long y = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += y;
    }
    if (lane == 31) part[warp] = v;
    __syncthreads();
    long long before = 0, sum = 0;
    for (int w = 0; w < TV_SEQ_THREADS / 32; ++w) {
        before += w < warp ? part[w] : 0;
        sum += part[w];
    }
    __syncthreads(); /* part is rewritten by the next call */
    *total = sum;
    return before + v;
}

__global__ void __launch_bounds__(TV_SEQ_THREADS) tv_seqs_kernel(const __grid_constant__ tv_params p) {
    __shared__ long long part[TV_SEQ_THREADS / 32];
    long long carry_q = 0, carry_k = 0; /* saturated at R and kb_cap */
    for (int32_t b0 = 0; b0 < p.batch; b0 += TV_SEQ_THREADS) {
        const int32_t b = b0 + (int32_t)threadIdx.x;
        long long nq = 0, nk = 0;
        if (b < p.batch) {
            const int2 q = tv_span(p.cu_q, b, p.total_q, p.max_q);
            const int2 k = p.paged ? make_int2(0, min(max(p.lens_k[b], 0), p.max_k))
                                   : tv_span(p.cu_k, b, p.total_k, p.max_k);
            p.seqs[b] = make_int4(q.x, q.y, k.x, k.y);
            nq = ((long long)q.y + p.t.block_q - 1) / p.t.block_q;
            nk = ((long long)k.y + p.t.block_k - 1) / p.t.block_k;
        }
        long long tq, tk;
        const long long iq = tv_cta_inclusive(nq, part, &tq);
        const long long ik = tv_cta_inclusive(nk, part, &tk);
        if (b < p.batch) {
            p.row_start[b] = (int32_t)min(carry_q + iq - nq, (long long)p.rows);
            p.kb_start[b] = (int32_t)min(carry_k + ik - nk, (long long)p.kb_cap);
        }
        carry_q = min(carry_q + tq, (long long)p.rows);
        carry_k = min(carry_k + tk, (long long)p.kb_cap);
    }
    if (threadIdx.x == 0) {
        p.row_start[p.batch] = (int32_t)carry_q;
        p.kb_start[p.batch] = (int32_t)carry_k;
    }
}

/* The last b with starts[b] <= r, for r < starts[B] (starts[0] = 0): the
 * sequence that holds row (or key block) r. */
static __device__ __forceinline__ int32_t tv_owner(const int32_t *starts, int32_t batch,
                                                   int32_t r) {
    int32_t lo = 0, hi = batch - 1;
    while (lo < hi) {
        const int32_t mid = lo + (hi - lo + 1) / 2;
        if (starts[mid] <= r)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* ---------------------------------------------------------------------------
 * pool: block means, fp64 sums in token order
 * ------------------------------------------------------------------------- */

static __device__ __forceinline__ float tv_load(const void *base, int64_t index, int bf16) {
    const unsigned short u = ((const unsigned short *)base)[index];
    return bf16 ? __uint_as_float((uint32_t)u << 16) : __half2float(__ushort_as_half(u));
}

/* side 0: Q rows (blockIdx.x = h * R + r); side 1: K blocks (h * kb_cap + j). */
__global__ void __launch_bounds__(TV_POOL_THREADS) tv_pool_kernel(const __grid_constant__ tv_params p,
                                                                  int side) {
    const int32_t per_head = side == 0 ? p.rows : p.kb_cap;
    const int32_t h = (int32_t)(blockIdx.x / (uint32_t)per_head);
    const int32_t r = (int32_t)(blockIdx.x % (uint32_t)per_head);
    const int32_t *starts = side == 0 ? p.row_start : p.kb_start;
    const int64_t dim = p.t.head_dim;
    float *out = (side == 0 ? p.pooled_q : p.pooled_k) + (int64_t)blockIdx.x * dim;
    int32_t first = 0, count = 0, b = 0;
    if (r < starts[p.batch]) {
        b = tv_owner(starts, p.batch, r);
        const int4 s = p.seqs[b];
        const int32_t block = side == 0 ? p.t.block_q : p.t.block_k;
        const int32_t len = side == 0 ? s.y : s.w;
        first = (r - starts[b]) * block;
        count = max(min(block, len - first), 0);
        first += side == 0 ? s.x : s.z;
    }
    const int32_t *table = p.paged ? p.page_table + (int64_t)b * p.page_table_stride : NULL;
    for (int64_t d = threadIdx.x; d < dim; d += TV_POOL_THREADS) {
        double sum = 0.0;
        for (int32_t t = first; t < first + count; ++t) {
            if (side == 0) {
                sum += (double)tv_load(p.q, t * p.t.q_stride[1] + h * p.t.q_stride[2] + d, p.bf16);
            } else if (!p.paged) {
                sum += (double)tv_load(p.k, t * p.t.k_stride[1] + h * p.t.k_stride[2] + d, p.bf16);
            } else {
                /* t < len_k <= max_pages x page_size: inside the table row */
                const int32_t page = table[t / p.page_size];
                if (page >= 0 && page < p.num_pages)
                    sum += (double)tv_load(p.k, page * p.t.k_stride[0] +
                                                    (t % p.page_size) * p.t.k_stride[1] +
                                                    h * p.t.k_stride[2] + d,
                                           p.bf16);
            }
        }
        out[d] = count > 0 ? (float)(sum / (double)count) : 0.0f;
    }
}

/* ---------------------------------------------------------------------------
 * select: score and pick one layout row
 * ------------------------------------------------------------------------- */

/* Whether candidate j's score may be picked: not forced, neither NaN nor
 * -inf (the CPU reference's test). */
static __device__ __forceinline__ bool tv_pickable(const sk_topk_row *rule, const float *row,
                                                   int32_t j, int32_t scored) {
    if (j >= scored || sk_topk_is_forced(rule, j)) return false;
    const float s = row[j];
    return !isnan(s) && s != -INFINITY;
}

__global__ void __launch_bounds__(TV_SEL_THREADS) tv_select_kernel(const __grid_constant__ tv_params p) {
    __shared__ int32_t warp_part[TV_SEL_THREADS / 32];
    const int32_t g = (int32_t)blockIdx.x, slice = g / p.rows, r = g % p.rows;
    const int tid = (int)threadIdx.x;
    int32_t kept = 0;
    if (r < p.row_start[p.batch]) {
        const int32_t b = tv_owner(p.row_start, p.batch, r);
        const int4 s = p.seqs[b]; /* {q0, len_q, k0, len_k} */
        sk_topk_problem tp = p.t;
        tp.seq_q = s.y;
        tp.seq_k = s.w;
        tp.col_blocks = (int32_t)(((int64_t)s.w + p.t.block_k - 1) / p.t.block_k);
        if (s.w > 0) {
            const sk_topk_row rule = sk_topk_row_rules(&tp, r - p.row_start[b]);
            /* Key blocks pooled for this sequence (fewer than col_blocks only
             * when garbage lengths overran kb_cap): the rest never picked. */
            const int32_t kb0 = p.kb_start[b];
            const int32_t scored = min(rule.n_cand, p.kb_start[b + 1] - kb0);
            float *row = p.scores + (int64_t)g * p.max_kb;
            const int32_t nq = p.t.per_kv_head ? p.t.group : 1;
            const int32_t h0 = p.t.per_kv_head ? slice * p.t.group : slice;
            const int32_t hk = p.t.per_kv_head ? slice : slice / p.t.group;
            const int64_t dim = p.t.head_dim;
            for (int32_t j = tid; j < scored; j += TV_SEL_THREADS) {
                if (sk_topk_is_forced(&rule, j)) continue;
                const float *krow = p.pooled_k + ((int64_t)hk * p.kb_cap + kb0 + j) * dim;
                double acc = 0.0;
                for (int32_t e = 0; e < nq; ++e) {
                    const float *qrow = p.pooled_q + ((int64_t)(h0 + e) * p.rows + r) * dim;
                    for (int64_t d = 0; d < dim; ++d) acc += (double)qrow[d] * (double)krow[d];
                }
                row[j] = (float)((double)p.t.scale * acc);
            }
            __syncthreads(); /* the row's scores, from global memory, for every thread */
            int32_t *out = p.scratch + (int64_t)g * p.row_cap;
            for (int32_t j0 = 0; j0 < rule.n_cand; j0 += TV_SEL_THREADS) {
                const int32_t j = j0 + tid;
                int keep = 0;
                if (j < rule.n_cand) {
                    if (sk_topk_is_forced(&rule, j)) {
                        keep = 1;
                    } else if (p.t.k > 0 && tv_pickable(&rule, row, j, scored)) {
                        const float sj = row[j];
                        int32_t rank = 0;
                        for (int32_t x = 0; x < scored && rank < p.t.k; ++x)
                            if (x != j && tv_pickable(&rule, row, x, scored)) {
                                const float sx = row[x];
                                rank += sx > sj || (sx == sj && x < j);
                            }
                        keep = rank < p.t.k;
                    }
                }
                int32_t total;
                const int32_t pos = kept + cta_exclusive_sum<TV_SEL_THREADS>(keep, warp_part, &total);
                if (keep && pos < p.row_cap) out[pos] = j;
                kept += total;
                __syncthreads(); /* warp_part is rewritten by the next chunk */
            }
            kept = min(kept, p.row_cap);
        }
    }
    if (tid == 0) p.counts[g] = kept;
}

/* ---------------------------------------------------------------------------
 * Host side
 * ------------------------------------------------------------------------- */

extern "C" sk_status sk_cuda_topk_varlen_workspace_size(const sk_topk_varlen_problem *p,
                                                        size_t *bytes) {
    *bytes = tv_layout_of(p).total + TV_ALIGN; /* the base is rounded up to 256 */
    return SK_STATUS_SUCCESS;
}

extern "C" sk_status sk_cuda_topk_varlen_select(const sk_topk_varlen_problem *p, void *workspace,
                                                size_t workspace_size, cudaStream_t stream) {
    int hopper;
    SK_TRY(sk_cuda_check_arch(p->t.backend, &hopper));
    const tv_layout w = tv_layout_of(p);
    if (workspace_size < w.total + TV_ALIGN)
        return sk_error(SK_STATUS_BAD_PARAM_WORKSPACE,
                        "workspace_size = %zu is less than the %zu bytes needed", workspace_size,
                        w.total + TV_ALIGN);
    char *base = (char *)(((uintptr_t)workspace + TV_ALIGN - 1) / TV_ALIGN * TV_ALIGN);
    tv_params tp;
    memset(&tp, 0, sizeof tp);
    tp.t = p->t;
    tp.batch = p->batch;
    tp.rows = p->rows;
    tp.kb_cap = p->kb_cap;
    tp.max_kb = p->max_kb;
    tp.row_cap = p->row_cap;
    tp.slices = p->slices;
    tp.total_q = (int32_t)p->total_q;
    tp.total_k = (int32_t)p->total_k;
    tp.max_q = (int32_t)p->max_seqlen_q;
    tp.max_k = (int32_t)p->max_seqlen_k;
    tp.paged = p->paged;
    tp.page_size = p->page_size;
    tp.max_pages = p->max_pages;
    tp.bf16 = p->t.dtype == SK_DTYPE_BF16;
    tp.num_pages = p->num_pages;
    tp.page_table_stride = p->page_table_stride;
    tp.cu_q = p->cu_seqlens_q;
    tp.cu_k = p->cu_seqlens_k;
    tp.lens_k = p->seq_lens_k;
    tp.page_table = p->page_table;
    tp.q = p->q;
    tp.k = p->k;
    tp.seqs = (int4 *)(base + w.seqs);
    tp.row_start = (int32_t *)(base + w.row_start);
    tp.kb_start = (int32_t *)(base + w.kb_start);
    tp.pooled_q = (float *)(base + w.pooled_q);
    tp.pooled_k = (float *)(base + w.pooled_k);
    tp.scores = (float *)(base + w.scores);
    tp.counts = (int32_t *)(base + w.counts);
    tp.scratch = (int32_t *)(base + w.scratch);

    tv_seqs_kernel<<<1, TV_SEQ_THREADS, 0, stream>>>(tp);
    SK_CUDA_TRY(cudaGetLastError(), "varlen top-k sequence kernel launch");
    /* Hq x R and Hkv x kb_cap rows: below 2^31 (the score matrix limit and
     * the pooled K size checks of src/core/topk_varlen.c). */
    tv_pool_kernel<<<(unsigned)(p->t.heads_q * p->rows), TV_POOL_THREADS, 0, stream>>>(tp, 0);
    SK_CUDA_TRY(cudaGetLastError(), "varlen top-k Q pooling launch");
    tv_pool_kernel<<<(unsigned)(p->t.heads_kv * p->kb_cap), TV_POOL_THREADS, 0, stream>>>(tp, 1);
    SK_CUDA_TRY(cudaGetLastError(), "varlen top-k K pooling launch");
    tv_select_kernel<<<(unsigned)(p->slices * p->rows), TV_SEL_THREADS, 0, stream>>>(tp);
    SK_CUDA_TRY(cudaGetLastError(), "varlen top-k selection launch");

    sk_topk_problem place = p->t;
    place.total_rows = p->slices * p->rows;
    place.row_cap = p->row_cap;
    place.capacity = p->capacity;
    place.row_offsets = p->row_offsets;
    place.col_indices = p->col_indices;
    row_table none;
    memset(&none, 0, sizeof none);
    return sk_topk_launch_place(&place, tp.counts, tp.scratch, &none, 1, 0, stream);
}
