/*
 * select.cu - the top-k selection kernels: per layout row, the forced
 * blocks and the k best-scored candidates (the rules of
 * src/core/topk_rules.h) into a fixed-stride scratch row, or, by the
 * register selection, straight to the row's place in col_indices.
 *
 * One warp per layout row. Scores become order-preserving 32-bit keys (NaN,
 * -inf, forced and non-candidate blocks -> key 0, -0 -> +0). With k <= 32
 * and at most 2048 key blocks, the register selection
 * (sk_topk_select_reg_kernel, one launch: up to 1024 key blocks, rows of
 * over 512 candidates (32 scores per lane) first, the rest with 16; past
 * 1024, rows of over 1024 candidates with 64 scores per lane, the rest with
 * 32, at fewer CTAs per SM): the filter path below on register-resident
 * scores, after which the take largest gathered composites and the forced
 * blocks are written straight to their places in the row (a count of
 * selected and forced blocks before each), both into the scratch row and at
 * the row's place in col_indices from the row table (with its row_offsets
 * entry), and a row shorter than its bound raises the flag. Otherwise the
 * general kernel, keys kept in shared memory when the row has at most
 * SEL_CACHE candidates. If at most k keys are non-zero all are taken. Else,
 * for k <= 32 (the filter path): t = the k-th largest of the 32 lanes'
 * maxima is at most the k-th largest key T, so the keys >= t (usually a few
 * more than k) hold every key >= T; gathered as (key, ~index) composites,
 * the k-th largest composite (rank counting) gives T and the index of the
 * last tie taken. Otherwise (k > 32, or more than SEL_FILTER keys >= t) an
 * MSB-first radix select (4 passes of 8 bits, a 256-bin warp histogram)
 * finds T and how many keys equal to T to take. One pass in index order then
 * keeps forced blocks, keys > T and the lowest-index ties (the documented
 * tie rule), writing them in increasing order into a fixed-stride scratch
 * row, and the count. The register selection reads the row table
 * (kernels.cuh, fill_row_table) that the scoring kernel's first CTA or the
 * row-table kernel (score_sm80.cu) wrote.
 * The counts depend on the scores only through NaN / -inf (see
 * topk_rules.h), so the layout equals the host rules' bit for bit for the
 * same scores, and two runs are identical.
 */
#include <cuda_runtime.h>
#include <float.h>
#include <stdint.h>

#include "cuda/common/cuda_check.cuh"
#include "cuda/topk/kernels.cuh"

enum {
    SEL_WARPS = 4,     /* rows per CTA */
    SEL_CACHE = 1024,  /* keys of a row kept in shared memory (4 KB per warp) */
    SEL_FILTER = 128,  /* filter-path candidates (uint64, in the warp's 1 KB histogram) */
    SEL_UNROLL = 8,    /* score loads in flight per lane in the first pass */
    SEL_REG_KEYS = 64, /* register selection: the most keys per lane */
    SEL_REG_MAX = 32 * SEL_REG_KEYS, /* ... for rows of at most 2048 key blocks */
    SEL_REG_K = 32     /* ... and k <= 32 */
};

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

int sk_topk_select_in_registers(const sk_topk_problem *p) {
    return p->k <= SEL_REG_K && p->col_blocks <= SEL_REG_MAX;
}

sk_status sk_topk_launch_select(const sk_topk_problem *p, const float *scores, int32_t *counts,
                                int32_t *scratch, const row_table *table, int hopper,
                                cudaStream_t stream) {
    launch_cfg l;
    select_params sel;
    sel.p = *p;
    sel.scores = scores;
    sel.counts = counts;
    sel.scratch = scratch;
    sel.table = *table;
    sel.per_slice = p->slices > 0 ? (int32_t)(p->capacity / p->slices) : 0;
    sel.vec = ((uintptr_t)scores % 16 == 0) && p->col_blocks % 4 == 0;
    if (sk_topk_select_in_registers(p)) {
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
    return SK_STATUS_SUCCESS;
}
