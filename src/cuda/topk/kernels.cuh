/*
 * kernels.cuh - what the top-k kernel files share (included by the .cu
 * files of src/cuda/topk/ only): the row table, the scoring kernels' tile
 * walk and split operands, programmatic dependent launch, and the launch
 * of each kernel file that chain.cu strings together. The scoring kernels
 * (score_sm80.cu: fp32 SIMT; score_sm90.cu: 3xTF32 wgmma; score_rows_sm90.cu)
 * score 128 x 128 tiles of one slice, skip causal tiles that hold no
 * candidate, and give their extra first CTA the row table.
 */
#ifndef SK_CUDA_TOPK_KERNELS_CUH
#define SK_CUDA_TOPK_KERNELS_CUH

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <float.h>
#include <stdint.h>

#include "core/topk_rules.h"
#include "cuda/common/ptx.cuh"

enum {
    SC_TM = 128,       /* score tile rows (query blocks) */
    SC_TN = 128,       /* score tile columns (key blocks) */
    TBL_THREADS = 256  /* the row table: one CTA */
};

/* Workspace pointers of the per-call row table (see chain.cu). */
typedef struct row_table {
    int4 *rule;    /* [row_blocks] {n_cand, sink_end, local_lo, local_hi} */
    int2 *place;   /* [row_blocks] {first entry of the row within its slice, bound} */
    int32_t *flag; /* != 0: some row came out shorter than its bound */
} row_table;

static __device__ __forceinline__ int32_t warp_inclusive_sum(int32_t v, int lane) {
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int32_t n = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += n;
    }
    return v;
}

/* Shared with the decode selection (src/cuda/decode_select/select.cu). */
/* Larger score -> larger key; 0 for scores never picked (NaN, -inf). -0 and
 * +0 share a key, so they tie. Every other key is >= 0x00800000. */
static __device__ __forceinline__ uint32_t score_key(float s) {
    uint32_t u = __float_as_uint(s);
    u = u == 0x80000000u ? 0u : u;                                   /* -0 -> +0 */
    const uint32_t key = u ^ ((uint32_t)((int32_t)u >> 31) | 0x80000000u); /* negative: ~u */
    return s > __int_as_float((int)0xff800000u) ? key : 0u;          /* false for NaN, -inf */
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

/* Exclusive prefix sum of v over a CTA of THREADS threads (all of them
 * call it); *total = the sum over the CTA. warp_part: THREADS / 32 shared
 * words, which may be rewritten only after a barrier that follows the
 * call. */
template <int THREADS>
static __device__ __forceinline__ int32_t cta_exclusive_sum(int32_t v, int32_t *warp_part,
                                                            int32_t *total) {
    const int warp = (int)(threadIdx.x >> 5), lane = (int)(threadIdx.x & 31);
    const int32_t incl = warp_inclusive_sum(v, lane);
    if (lane == 31) warp_part[warp] = incl;
    __syncthreads();
    int32_t before = 0, sum = 0;
#pragma unroll
    for (int w = 0; w < THREADS / 32; ++w) {
        before += w < warp ? warp_part[w] : 0;
        sum += warp_part[w];
    }
    *total = sum;
    return before + incl - v;
}

/* Every slice has the same row rules, so one CTA of TBL_THREADS threads
 * tabulates them once per call (sk_topk_row_rules, the host's function):
 * the rules, and each row's place in its slice's part of col_indices when
 * every row reaches its bound (the sum of the earlier rows' bounds). It also
 * clears the short-row flag. The selection then needs no 64-bit division
 * per row, and the placement no scan. */
static __device__ void fill_row_table(const sk_topk_problem *p, const row_table *t) {
    __shared__ int32_t warp_total[TBL_THREADS / 32];
    const int tid = (int)threadIdx.x;
    int32_t base = 0;
    for (int32_t r0 = 0; r0 < p->row_blocks; r0 += TBL_THREADS) {
        const int32_t r = r0 + tid;
        sk_topk_row rule = {0, 0, 0, -1, 0, 0};
        if (r < p->row_blocks) rule = sk_topk_row_rules(p, r);
        int32_t total;
        const int32_t before = cta_exclusive_sum<TBL_THREADS>(rule.bound, warp_total, &total);
        if (r < p->row_blocks) {
            t->rule[r] = make_int4(rule.n_cand, rule.sink_end, rule.local_lo, rule.local_hi);
            t->place[r] = make_int2(base + before, rule.bound);
        }
        base += total;
        __syncthreads(); /* warp_total is rewritten next */
    }
    if (tid == 0) *t->flag = 0;
}

/* The Hopper row scoring's operands (score_rows_sm90.cu), split into
 * fp16 hi/lo pairs with a power-of-two scale per row. Every 128-row tile of
 * pooled K (per batch and KV head) is one block that the scoring
 * bulk-copies into shared memory as it is: 2 x chunks panels of ROWS_PANEL
 * bytes (the fp16 hi of each 64-dim chunk, then the lo, 128B-swizzled),
 * then ROWS_META bytes: each row's epilogue factor (float[128]: 2^-e for K,
 * scale 2^-e for A; 0 where the two-multiplication epilogue would not be
 * exact; 512 bytes, padded to 1024 so that blocks stay aligned to the
 * 128B-swizzle atom). The row exponents e go to a separate array (the
 * general epilogue only). K is split either by the split kernel (from pooled K) or, in
 * sk_pool_select_topk, by the pooling itself, which then also splits Q into
 * the same blocks per 128-row tile of each slice (q_tiles); else each
 * scoring CTA splits its own A rows into shared memory. Rows past the end
 * of the split kernel's tiles are zero; the pooling leaves them unwritten
 * (they reach only score rows and columns that are never stored). */
enum { ROWS_PANEL = SC_TM * 128, ROWS_CHUNK = 64, ROWS_META = 1024 };
enum { SPLIT_FAST_EXP = 87 }; /* |e| bound of the two-multiplication epilogue */

typedef struct split_operands {
    char *k_tiles;        /* [kv slices * tiles_j] blocks of split_tile_bytes(chunks) */
    int32_t *k_exp;       /* [kv slices * tiles_j * 128] */
    char *q_tiles;        /* pre-split A, [slices * tiles_i] blocks, or NULL; non-NULL: the
                             pooling split both operands (no split kernel) */
    int32_t *q_exp;       /* [slices * tiles_i * 128] */
    int32_t chunks;       /* split_chunks(head_dim): 1 or 2 */
} split_operands;

/* 64-dim chunks of a split row; bytes of a split tile's panels, and of the
 * whole block. */
static inline __host__ __device__ int32_t split_chunks(int64_t head_dim) {
    return (int32_t)((head_dim + ROWS_CHUNK - 1) / ROWS_CHUNK);
}
static inline __host__ __device__ size_t split_panel_bytes(int32_t chunks) {
    return (size_t)2 * (size_t)chunks * ROWS_PANEL;
}
static inline __host__ __device__ size_t split_tile_bytes(int32_t chunks) {
    return split_panel_bytes(chunks) + ROWS_META;
}

/* 2^e for e in [-126, 127]. */
static __device__ __forceinline__ float split_pow2(int32_t e) {
    return __uint_as_float((uint32_t)(e + 127) << 23);
}

/* The largest finite |x| among four values (0 if none). */
static __device__ __forceinline__ float split_abs_max4(float x0, float x1, float x2, float x3) {
    const float a0 = fabsf(x0), a1 = fabsf(x1), a2 = fabsf(x2), a3 = fabsf(x3);
    return fmaxf(fmaxf(a0 <= FLT_MAX ? a0 : 0.f, a1 <= FLT_MAX ? a1 : 0.f),
                 fmaxf(a2 <= FLT_MAX ? a2 : 0.f, a3 <= FLT_MAX ? a3 : 0.f));
}

/* The row exponent e from the row's largest finite |x| = m: m 2^e lies in
 * [2^14, 2^15); tiny rows get the clamp. A row with no finite non-zero
 * value gets 0: any exponent splits it exactly, and 0 keeps its factor on
 * the fast epilogue (the clamp sent every tile holding such a row, e.g. the
 * zero blocks that sk_pool_select_topk does not pool, to ldexpf: +33 us at
 * the issue's shape, docs/perf/topk_log.md step 21). */
static __device__ __forceinline__ int32_t split_exponent(float m) {
    if (m == 0.f) return 0;
    const int32_t e = 14 - ((int32_t)(__float_as_uint(m) >> 23) - 127);
    return e < -126 ? -126 : (e > 126 ? 126 : e);
}

/* The row's epilogue factor mult 2^-e, or 0 where the two-multiplication
 * epilogue would not be exact. */
static __device__ __forceinline__ float split_factor(float mult, int32_t e) {
    const float factor = mult * split_pow2(-e);
    const int fast = e >= -SPLIT_FAST_EXP && e <= SPLIT_FAST_EXP && fabsf(factor) >= FLT_MIN &&
                     fabsf(factor) <= FLT_MAX;
    return fast ? factor : 0.f;
}

/* A score whose product on the fast path came out inf or NaN: some pooled
 * entry is not finite. Recomputed as the fp32 sum, over the layout head's
 * query heads (one, or the per_kv_head group), of each head's dot product
 * with the key row, from the fp32 pooled blocks p->pooled_q / pooled_k:
 * the inf or NaN that the CPU reference gives (a sum over heads of
 * per-head products), where the split's hi * lo terms (inf * 0) or a
 * product of the group's summed Q rows (inf - inf lost) could give
 * another. Unscaled. Rare: only scores that are not finite come here (not
 * inlined, so that the callers keep their registers). */
static __device__ __noinline__ float topk_nonfinite_score(const sk_topk_problem *p,
                                                          int32_t slice, int32_t i, int32_t j) {
    const int64_t dim = p->head_dim, b = slice / p->heads, hs = slice % p->heads;
    const int64_t h0 = p->per_kv_head ? hs * p->group : hs, nh = p->per_kv_head ? p->group : 1;
    const int64_t hk = p->per_kv_head ? hs : hs / p->group;
    const float *k = p->pooled_k + ((b * p->heads_kv + hk) * p->col_blocks + j) * dim;
    float s = 0.f;
    for (int64_t h = h0; h < h0 + nh; ++h) {
        const float *q = p->pooled_q + ((b * p->heads_q + h) * p->row_blocks + i) * dim;
        float dot = 0.f;
        for (int64_t d = 0; d < dim; ++d) dot = fmaf(q[d], k[d], dot);
        s += dot;
    }
    return s;
}

/* Whether any of four values is not finite (inf or NaN). */
static __device__ __forceinline__ int split_any_nonfinite4(float x0, float x1, float x2, float x3) {
    return !(fabsf(x0) <= FLT_MAX && fabsf(x1) <= FLT_MAX && fabsf(x2) <= FLT_MAX &&
             fabsf(x3) <= FLT_MAX);
}

/* The factor a split row stores: 0 (the epilogue's general path) for a row
 * holding a value that is not finite, so that the Hopper row scoring's
 * general epilogue gives its non-finite scores the fp32 dot product's
 * value (sr_fix_nonfinite); else split_factor. */
static __device__ __forceinline__ float split_row_factor(float mult, int32_t e, int nonfinite) {
    return nonfinite ? 0.f : split_factor(mult, e);
}

/* hi/lo fp16 pairs of two scaled values (lo = 0 where x is not finite). */
static __device__ __forceinline__ void split_pair(float x0, float x1, uint32_t *hi, uint32_t *lo) {
    const uint32_t h = sk_cvt_f16x2(x1, x0);
    const float2 hf = __half22float2(*(const __half2 *)&h);
    float r0 = x0 - hf.x, r1 = x1 - hf.y;
    r0 = r0 == r0 ? r0 : 0.f; /* inf - inf, NaN */
    r1 = r1 == r1 ? r1 : 0.f;
    *hi = h;
    *lo = sk_cvt_f16x2(r1, r0);
}

typedef struct score_params {
    const float *a;        /* [slices, row_blocks, D]: pooled Q of the slice's head (or group sum) */
    const float *pooled_k; /* [B, Hkv, col_blocks, D] */
    float *scores;         /* [slices, row_blocks, col_blocks] */
    sk_topk_problem p;     /* geometry and rules */
    int64_t a_slice_stride; /* elements between slices of a */
    int32_t tiles_i, tiles_j;
    int32_t tiles;         /* slices * tiles_i * tiles_j; CTA 0 fills the row table, CTA t + 1 scores tile t */
    row_table table;
    split_operands split;  /* the Hopper row scoring only */
} score_params;

/* Programmatic dependent launch (Hopper). Every top-k kernel after the
 * first of a call is launched with programmatic stream serialization
 * (launch_config), so its CTAs may be scheduled while the kernel before it
 * drains its last wave, instead of after a full drain and launch. Each
 * kernel first lets its own successor be scheduled, then waits until its
 * predecessor has completed and its writes are visible; nothing is read
 * before that wait. On sm_80 both are left out and launches are plain. */
static __device__ __forceinline__ void pdl_enter(void) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    sk_griddep_launch_dependents();
    sk_griddep_wait();
#endif
}

/* Waits for the predecessor first, then lets the successor be scheduled:
 * the successor may then read what the predecessor's predecessors wrote
 * before its own wait (the Hopper row scoring reads pooled Q so). */
static __device__ __forceinline__ void pdl_wait_then_release(void) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    sk_griddep_wait();
    sk_griddep_launch_dependents();
#endif
}

/* The first kernel of a chain: only lets its successor be scheduled. */
static __device__ __forceinline__ void pdl_release(void) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    sk_griddep_launch_dependents();
#endif
}

typedef struct launch_cfg {
    cudaLaunchConfig_t cfg;
    cudaLaunchAttribute attr;
} launch_cfg;

/* A launch configuration, with programmatic stream serialization when
 * `pdl` (a 9.0 device; every kernel launched so calls pdl_enter first). */
static inline const cudaLaunchConfig_t *launch_config(launch_cfg *l, unsigned grid, unsigned block,
                                                      size_t smem, cudaStream_t stream, int pdl) {
    l->cfg = cudaLaunchConfig_t{};
    l->cfg.gridDim = dim3(grid, 1, 1);
    l->cfg.blockDim = dim3(block, 1, 1);
    l->cfg.dynamicSmemBytes = smem;
    l->cfg.stream = stream;
    l->attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    l->attr.val.programmaticStreamSerializationAllowed = 1;
    l->cfg.attrs = &l->attr;
    l->cfg.numAttrs = pdl ? 1 : 0;
    return &l->cfg;
}

/* The tile a scoring CTA owns: its slice, that slice's batch and KV head,
 * first row i0 and first column j0. */
typedef struct score_tile {
    int32_t slice, b, hk, i0, j0;
} score_tile;

/* The start of every scoring CTA (after pdl_enter): CTA 0 fills the row
 * table (first, so that it is not the grid's tail), CTA t + 1 owns tile t.
 * Returns 0 when the CTA has no tile to score: the row-table CTA, or, with
 * causal, a tile that holds no candidate of any of its rows (those scores
 * are never read). Call with all threads (the row table needs the CTA). */
static __device__ __forceinline__ int score_tile_begin(const score_params *sp, score_tile *t) {
    const sk_topk_problem *p = &sp->p;
    if (blockIdx.x == 0) {
        fill_row_table(p, &sp->table);
        return 0;
    }
    const int32_t tile = (int32_t)blockIdx.x - 1;
    const int32_t tj = tile % sp->tiles_j;
    const int32_t ti = (tile / sp->tiles_j) % sp->tiles_i;
    t->slice = tile / sp->tiles_j / sp->tiles_i;
    t->i0 = ti * SC_TM;
    t->j0 = tj * SC_TN;
    t->b = t->slice / p->heads;
    const int32_t hs = t->slice % p->heads;
    t->hk = p->per_kv_head ? hs : hs / p->group;
    if (p->causal) {
        const int32_t last = t->i0 + SC_TM - 1 < p->row_blocks - 1 ? t->i0 + SC_TM - 1
                                                                     : p->row_blocks - 1;
        if (t->j0 >= sk_topk_row_rules(p, last).n_cand) return 0;
    }
    return 1;
}

/* ---------------------------------------------------------------------------
 * The launches chain.cu strings together, one or more per kernel file, in
 * chain order. Each enqueues on `stream` (with programmatic serialization
 * when `hopper`, as pdl_enter expects) and returns the launch's status.
 * ------------------------------------------------------------------------- */

/* pool.cu. One launch pools Q (the first row_blocks CTAs along x) and K:
 * into fp32, or with `split` (pool_splits) straight into the row scoring's
 * split operands. `span_only`: for the selection's own use, only the blocks
 * in p->score_rows / p->score_cols are read (the others are zeros); else
 * (sk_block_pool) every block. The first kernel of a chain: no
 * programmatic serialization. */
sk_status sk_topk_launch_pool(const sk_topk_problem *p, const split_operands *split, int span_only,
                              cudaStream_t stream);

/* score_sm80.cu. The group sums of the pooled Q rows (per_kv_head with a
 * group > 1) into qsum [slices, row_blocks, D], the scoring's A operand. */
sk_status sk_topk_launch_group_sum(const sk_topk_problem *p, float *qsum, int hopper,
                                   cudaStream_t stream);

/* score_sm80.cu. The portable scoring, tiles + 1 CTAs (no programmatic
 * serialization: it runs on every device). */
sk_status sk_topk_score_sm80(const score_params *sp, cudaStream_t stream);

/* The Hopper scoring (score_sm90.cu): same grid and outputs as the
 * portable kernel, tiles + 1 CTAs. Call on a compute capability 9.0 device. */
sk_status sk_topk_score_sm90(const score_params *sp, cudaStream_t stream);

/* The Hopper scoring for head_dim <= 128 (score_rows_sm90.cu): splits
 * K once into sp->split, then scores with slices * tiles_i + 1 CTAs, each
 * splitting its own A rows and walking the column tiles of one row tile.
 * Same outputs as the other scoring kernels. Call on a compute capability
 * 9.0 device. */
sk_status sk_topk_score_rows_sm90(const score_params *sp, cudaStream_t stream);

/* select.cu. Whether the register selection takes the rows (k <= 32, at
 * most 2048 key blocks): it then needs the row table, and places each row
 * itself. */
int sk_topk_select_in_registers(const sk_topk_problem *p);

/* score_sm80.cu. The row table alone, one CTA (when no scoring kernel fills
 * it). */
sk_status sk_topk_launch_row_table(const sk_topk_problem *p, const row_table *table, int hopper,
                                   cudaStream_t stream);

/* select.cu. The selection of every row from scores [total_rows,
 * col_blocks] into counts and the scratch rows (and, by the register
 * selection, into p->col_indices and p->row_offsets). */
sk_status sk_topk_launch_select(const sk_topk_problem *p, const float *scores, int32_t *counts,
                                int32_t *scratch, const row_table *table, int hopper,
                                cudaStream_t stream);

/* place.cu. The row offsets and packed column indices: `compact` forces the
 * compaction of the scratch rows (after the general selection), else the
 * short-row flag decides. */
sk_status sk_topk_launch_place(const sk_topk_problem *p, const int32_t *counts,
                               const int32_t *scratch, const row_table *table, int compact,
                               int hopper, cudaStream_t stream);

#endif /* SK_CUDA_TOPK_KERNELS_CUH */
