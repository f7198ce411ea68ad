/*
 * layout_build.c - the pattern builders: dense, causal, window, sinks+window,
 * strided, random and top-k from block scores.
 *
 * Geometry. Query row block i holds tokens q0 = i*bq .. q1 = min(q0+bq, Sq)-1
 * and sits at key positions p0 = q0 + (Sk - Sq) .. p1 = q1 + (Sk - Sq)
 * (bottom-right alignment; p1 <= Sk - 1 always, p0 and p1 may be negative).
 * Key block j holds keys j*bk .. min(j*bk+bk, Sk)-1.
 *
 * Block membership is decided per row by interval arithmetic, never by
 * enumerating token pairs. For every token-level pattern here, the keys that
 * some query of the row admits form at most two contiguous key ranges
 * (e.g. the window's union over p in [p0, p1] of [p-left, p+right] is
 * [p0-left, p1+right], because consecutive windows overlap); a key block is
 * kept iff it holds a key of such a range, so the kept blocks are
 * [lo/bk, hi/bk] of each range clipped to [0, Sk-1]. In particular the causal
 * blocks of a row are 0 .. p1/bk (none when p1 < 0).
 *
 * A slice is a run of segments (layout.h, sk_layout_build): the fixed-batch
 * builders' one segment is the whole grid, a varlen layout's are its
 * sequences, each with its own tokens and bottom-right alignment.
 * The deterministic builders compute one slice (a counting pass, then a
 * filling pass) and replicate it to every slice. The random and top-k
 * builders work per (slice, row), with a counting pass first so that the
 * index array is allocated once, at its exact size; their rows are filled in
 * parallel (OpenMP), and since a row depends only on its own inputs (its
 * scores, or its own random stream) the layout does not depend on the
 * thread count. The strided pattern is block-level (see sparsek.h).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "core/internal.h"
#include "core/layout.h"

#ifdef _OPENMP
#include <omp.h>
static int max_threads(void) {
    return omp_get_max_threads();
}
static int thread_id(void) {
    return omp_get_thread_num();
}
#else
static int max_threads(void) {
    return 1;
}
static int thread_id(void) {
    return 0;
}
#endif

/* Token distances (window sizes, sink counts) beyond this are equivalent to
 * "unbounded": positions are below 2^39 in magnitude for any checked grid,
 * so clamping keeps all arithmetic far from int64 overflow. */
#define SK_DISTANCE_CAP ((int64_t)1 << 60)

static int64_t min_i64(int64_t a, int64_t b) {
    return a < b ? a : b;
}
static int64_t max_i64(int64_t a, int64_t b) {
    return a > b ? a : b;
}

/* Key positions p0 (first query) and p1 (last valid query) of row block i. */
static void row_positions(const sk_grid *grid, int32_t i, int64_t *p0, int64_t *p1) {
    int64_t q0 = (int64_t)i * grid->block_rows;
    int64_t q1 = min_i64(q0 + grid->block_rows, grid->rows) - 1;
    int64_t shift = grid->cols - grid->rows;
    *p0 = q0 + shift;
    *p1 = q1 + shift;
}

int32_t sk_layout_causal_blocks(const sk_grid *grid, int32_t row) {
    int64_t p0, p1;
    row_positions(grid, row, &p0, &p1);
    return p1 < 0 ? 0 : (int32_t)(p1 / grid->block_cols + 1); /* p1 <= Sk-1: <= col_blocks */
}

int32_t sk_layout_diagonal_block(const sk_grid *grid, int32_t row) {
    int64_t p0, p1;
    row_positions(grid, row, &p0, &p1);
    return p1 < 0 ? 0 : (int32_t)(p1 / grid->block_cols);
}

/* nnz = per_slice x slices, which must fit int32. per_slice <= row_blocks
 * x col_blocks < 2^62 and slices < 2^31: the product is checked, and a grid
 * whose pattern selects more than INT32_MAX blocks is refused here, before
 * any allocation (sk_grid_check no longer bounds the dense count). */
static sk_status all_slices(int64_t per_slice, int32_t slices, int64_t *nnz) {
    if (!sk_mul_i64(per_slice, slices, nnz) || *nnz > INT32_MAX)
        return sk_error(SK_STATUS_BAD_LAYOUT_OVERFLOW,
                        "grid: the pattern selects %lld blocks per slice x %d slices, more than "
                        "INT32_MAX = %d (a layout's nnz, row_offsets and col_indices are int32)",
                        (long long)per_slice, (int)slices, INT32_MAX);
    return SK_STATUS_SUCCESS;
}

/* ---------------------------------------------------------------------------
 * Emitting sorted block lists. Each helper appends to dst[n..] (or only
 * counts when dst is NULL) and returns the new count.
 * ------------------------------------------------------------------------- */

/* Blocks lo .. hi (nothing when hi < lo). */
static int32_t emit_range(int32_t *dst, int32_t n, int64_t lo, int64_t hi) {
    if (hi < lo) return n;
    if (dst != NULL)
        for (int64_t j = lo; j <= hi; ++j) dst[n + (j - lo)] = (int32_t)j;
    return n + (int32_t)(hi - lo + 1);
}

/* Blocks j in lo .. hi with j == d (mod step), step >= 1. */
static int32_t emit_progression(int32_t *dst, int32_t n, int64_t lo, int64_t hi, int64_t d,
                                int64_t step) {
    if (hi < lo) return n;
    int64_t first = lo + (((d - lo) % step) + step) % step;
    if (first > hi) return n;
    int64_t count = (hi - first) / step + 1;
    if (dst != NULL)
        for (int64_t m = 0; m < count; ++m) dst[n + m] = (int32_t)(first + m * step);
    return n + (int32_t)count;
}

/* The blocks holding a key of the key range [a, b] (clipped to [0, Sk-1]). */
static int32_t emit_keys(int32_t *dst, int32_t n, const sk_grid *grid, int64_t a, int64_t b) {
    a = max_i64(a, 0);
    b = min_i64(b, grid->cols - 1);
    if (b < a) return n;
    return emit_range(dst, n, a / grid->block_cols, b / grid->block_cols);
}

/* ---------------------------------------------------------------------------
 * Deterministic patterns
 * ------------------------------------------------------------------------- */

typedef enum pattern_kind {
    PATTERN_DENSE,
    PATTERN_CAUSAL,
    PATTERN_WINDOW,       /* a = left, b = right (tokens, capped) */
    PATTERN_SINKS_WINDOW, /* a = sink tokens, b = window tokens (capped) */
    PATTERN_STRIDED       /* stride, local, causal */
} pattern_kind;

typedef struct pattern {
    pattern_kind kind;
    int64_t a, b;
    int64_t stride, local;
    int causal;
} pattern;

/* Row i's sorted blocks into dst (or counted only when dst is NULL). */
static int32_t pattern_row(const sk_grid *grid, int32_t col_blocks, const pattern *pt, int32_t i,
                           int32_t *dst) {
    int64_t p0, p1;
    row_positions(grid, i, &p0, &p1);
    const int64_t bk = grid->block_cols;
    switch (pt->kind) {
    case PATTERN_DENSE:
        return emit_range(dst, 0, 0, col_blocks - 1);
    case PATTERN_CAUSAL: /* keys 0 .. p1 */
        return emit_keys(dst, 0, grid, 0, p1);
    case PATTERN_WINDOW: /* union over p of [p - left, p + right] */
        return emit_keys(dst, 0, grid, p0 - pt->a, p1 + pt->b);
    case PATTERN_SINKS_WINDOW: {
        /* Sinks: keys k < sink_tokens with k <= p for some p: 0 .. min(sink-1, p1).
         * Window: union over p of (p - W, p]: p0 - W + 1 .. p1. */
        int64_t sink_hi = min_i64(pt->a - 1, p1);
        int64_t win_lo = max_i64(p0 - pt->b + 1, 0), win_hi = p1;
        if (sink_hi < 0) return emit_keys(dst, 0, grid, win_lo, win_hi);
        if (win_hi < win_lo) return emit_keys(dst, 0, grid, 0, sink_hi);
        int64_t sink_last = sink_hi / bk, win_first = win_lo / bk;
        if (win_first <= sink_last + 1) /* the block ranges touch: one range */
            return emit_keys(dst, 0, grid, 0, max_i64(sink_hi, win_hi));
        int32_t n = emit_range(dst, 0, 0, sink_last);
        return emit_range(dst, n, win_first, win_hi / bk);
    }
    case PATTERN_STRIDED: {
        /* Block-level: d = the diagonal block; keep |d - j| < local and
         * (d - j) % stride == 0, on both sides of d unless causal. With
         * causal, every j <= d holds a causal pair (j*bk <= d*bk <= p1),
         * and a row with p1 < 0 has none. */
        if (pt->causal && p1 < 0) return 0;
        const int64_t d = p1 < 0 ? 0 : p1 / bk, last = col_blocks - 1;
        int32_t n = 0;
        if (pt->local >= 1) {
            int64_t lo = max_i64(d - pt->local + 1, 0);
            int64_t hi = pt->causal ? d : min_i64(d + pt->local - 1, last);
            n = emit_progression(dst, n, 0, lo - 1, d, pt->stride);
            n = emit_range(dst, n, lo, hi);
            if (!pt->causal) n = emit_progression(dst, n, hi + 1, last, d, pt->stride);
        } else {
            n = emit_progression(dst, n, 0, d, d, pt->stride);
            if (!pt->causal) n = emit_progression(dst, n, d + 1, last, d, pt->stride);
        }
        return n;
    }
    }
    return 0;
}

/* Block rows of one segment (sk_layout_build): ceil(rows / block_rows). */
static int32_t segment_rows(const sk_grid *seg) {
    return (int32_t)sk_ceil_div_i64(seg->rows, seg->block_rows);
}

/* Row i of a segment; a segment with no key has no block. */
static int32_t segment_row(const sk_grid *seg, const pattern *pt, int32_t i, int32_t *dst) {
    if (seg->cols < 1) return 0;
    return pattern_row(seg, (int32_t)sk_ceil_div_i64(seg->cols, seg->block_cols), pt, i, dst);
}

/* The segments' rows must fit the layout's: a bug in the caller otherwise. */
static sk_status check_segments(const sk_grid *segs, int32_t count, int32_t row_blocks) {
    int64_t rows = 0;
    for (int32_t s = 0; s < count; ++s) rows += segment_rows(&segs[s]);
    if (rows > row_blocks)
        return sk_error(SK_STATUS_INTERNAL_ERROR,
                        "%lld segment rows do not fit the layout's %d row blocks", (long long)rows,
                        (int)row_blocks);
    return SK_STATUS_SUCCESS;
}

/* Build one slice of `pt` over the segments (rows past them empty),
 * replicate it to every slice. grid is checked. */
static sk_status build_pattern(sk_layout_t *out, const sk_grid *grid, const sk_grid *segs,
                               int32_t count, const pattern *pt) {
    int32_t row_blocks, col_blocks, slices;
    SK_TRY(sk_grid_check(grid, &row_blocks, &col_blocks, &slices));
    SK_TRY(check_segments(segs, count, row_blocks));

    int64_t per_slice = 0;
    for (int32_t s = 0; s < count; ++s)
        for (int32_t i = 0; i < segment_rows(&segs[s]); ++i)
            per_slice += segment_row(&segs[s], pt, i, NULL);
    int64_t nnz;
    SK_TRY(all_slices(per_slice, slices, &nnz));
    const int32_t total_rows = slices * row_blocks;

    struct sk_layout_s *layout = sk_layout_alloc(grid, total_rows, nnz);
    if (layout == NULL)
        return sk_error(SK_STATUS_ALLOC_FAILED, "no memory for %d rows and nnz = %lld",
                        (int)total_rows, (long long)nnz);
    int32_t *off = layout->bsr.row_offsets, *idx = layout->bsr.col_indices;
    off[0] = 0;
    int32_t n = 0, r = 0;
    for (int32_t s = 0; s < count; ++s)
        for (int32_t i = 0; i < segment_rows(&segs[s]); ++i) {
            n += segment_row(&segs[s], pt, i, idx + n);
            off[++r] = n;
        }
    while (r < row_blocks) off[++r] = n;
    for (int32_t s = 1; s < slices; ++s) {
        const int64_t base = per_slice * s;
        if (per_slice > 0) memcpy(idx + base, idx, (size_t)per_slice * sizeof(int32_t));
        for (int32_t i = 0; i < row_blocks; ++i)
            off[(int64_t)s * row_blocks + i + 1] = (int32_t)(off[i + 1] + base);
    }
    return sk_layout_finish(layout, out);
}

static sk_status build_random(sk_layout_t *out, const sk_grid *grid, const sk_grid *segs,
                              int32_t count, int32_t k, uint64_t seed, int causal);

/* A token distance argument (`name` = value`unit` in messages), >= lo,
 * capped at SK_DISTANCE_CAP into *capped. */
static sk_status token_distance(int64_t value, int64_t lo, const char *name, const char *unit,
                                int64_t *capped) {
    if (value < lo)
        return sk_error(SK_STATUS_BAD_PARAM_VALUE, "%s = %lld%s must be >= %lld", name,
                        (long long)value, unit, (long long)lo);
    *capped = min_i64(value, SK_DISTANCE_CAP);
    return SK_STATUS_SUCCESS;
}

sk_status sk_layout_build(sk_layout_t *out, const sk_grid *grid, const sk_grid *segs, int32_t count,
                          const sk_layout_params *prm) {
    pattern pt = {PATTERN_DENSE, 0, 0, 1, 0, 0};
    switch (prm->kind) {
    case SK_LAYOUT_DENSE:
        break;
    case SK_LAYOUT_CAUSAL:
        pt.kind = PATTERN_CAUSAL;
        pt.causal = 1;
        break;
    case SK_LAYOUT_WINDOW:
        SK_TRY(token_distance(prm->a, 0, "left", " tokens", &pt.a));
        SK_TRY(token_distance(prm->b, 0, "right", " tokens", &pt.b));
        pt.kind = PATTERN_WINDOW;
        break;
    case SK_LAYOUT_SINKS_WINDOW:
        SK_TRY(token_distance(prm->a, 0, "sink_tokens", "", &pt.a));
        SK_TRY(token_distance(prm->b, 1, "window_tokens", "", &pt.b));
        pt.kind = PATTERN_SINKS_WINDOW;
        pt.causal = 1;
        break;
    case SK_LAYOUT_RANDOM:
        if (prm->k < 0)
            return sk_error(SK_STATUS_BAD_PARAM_VALUE, "k = %d must be >= 0", (int)prm->k);
        return build_random(out, grid, segs, count, prm->k, prm->seed, prm->causal);
    }
    return build_pattern(out, grid, segs, count, &pt);
}

/* A fixed-batch builder: the grid checked, then one segment, the grid. */
static sk_status build_fixed(sk_layout_t *out, const sk_grid *grid, const sk_layout_params *prm) {
    SK_CHECK_NOT_NULL(out);
    SK_CHECK_NOT_NULL(grid);
    SK_TRY(sk_grid_check(grid, NULL, NULL, NULL));
    return sk_layout_build(out, grid, grid, 1, prm);
}

sk_status sk_layout_create_dense(sk_layout_t *out, const sk_grid *grid) {
    SK_ENTER("sk_layout_create_dense");
    const sk_layout_params prm = {SK_LAYOUT_DENSE, 0, 0, 0, 0, 0};
    return build_fixed(out, grid, &prm);
}

sk_status sk_layout_create_causal(sk_layout_t *out, const sk_grid *grid) {
    SK_ENTER("sk_layout_create_causal");
    const sk_layout_params prm = {SK_LAYOUT_CAUSAL, 0, 0, 0, 0, 0};
    return build_fixed(out, grid, &prm);
}

sk_status sk_layout_create_window(sk_layout_t *out, const sk_grid *grid, int64_t left,
                                  int64_t right) {
    SK_ENTER("sk_layout_create_window");
    const sk_layout_params prm = {SK_LAYOUT_WINDOW, left, right, 0, 0, 0};
    return build_fixed(out, grid, &prm);
}

sk_status sk_layout_create_sinks_window(sk_layout_t *out, const sk_grid *grid, int64_t sink_tokens,
                                        int64_t window_tokens) {
    SK_ENTER("sk_layout_create_sinks_window");
    const sk_layout_params prm = {SK_LAYOUT_SINKS_WINDOW, sink_tokens, window_tokens, 0, 0, 0};
    return build_fixed(out, grid, &prm);
}

sk_status sk_layout_create_strided(sk_layout_t *out, const sk_grid *grid, int32_t stride,
                                   int32_t local_blocks, int causal) {
    SK_ENTER("sk_layout_create_strided");
    SK_CHECK_NOT_NULL(out);
    SK_CHECK_NOT_NULL(grid);
    SK_TRY(sk_grid_check(grid, NULL, NULL, NULL));
    if (stride < 1)
        return sk_error(SK_STATUS_BAD_PARAM_VALUE, "stride = %d must be >= 1", (int)stride);
    if (local_blocks < 0)
        return sk_error(SK_STATUS_BAD_PARAM_VALUE, "local_blocks = %d must be >= 0",
                        (int)local_blocks);
    pattern pt = {PATTERN_STRIDED, 0, 0, stride, local_blocks, causal != 0};
    return build_pattern(out, grid, grid, 1, &pt);
}

/* ---------------------------------------------------------------------------
 * Random
 *
 * Each (slice, row) has its own splitmix64 stream (Steele, Lea and Flood,
 * 2014: a 64-bit counter advanced by the golden gamma 0x9E3779B97F4A7C15,
 * each value passed through the mixer below), started at
 *     state = mix(mix(seed) ^ (g * 0x9E3779B97F4A7C15)),  g = s*row_blocks + r,
 * so rows and slices draw independently and every platform gets the same
 * layout. A uniform integer in [0, m) is taken by rejection: draw x until
 * x >= 2^64 mod m, return x mod m (unbiased). The k blocks of a row are
 * drawn among its n candidates (0 .. n-1: every block, or the causal prefix)
 * with Floyd's algorithm: for t = n-k .. n-1, draw r in [0, t]; take r, or t
 * when r was taken already. This gives a uniform k-subset in k draws. The
 * row is then listed in increasing order. When k >= n the row is all n
 * candidates (no draws).
 * ------------------------------------------------------------------------- */

#define SK_GOLDEN_GAMMA 0x9E3779B97F4A7C15ull

static uint64_t sm64_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t sm64_next(uint64_t *state) {
    *state += SK_GOLDEN_GAMMA;
    return sm64_mix(*state);
}

/* Uniform in [0, m), m >= 1. */
static uint64_t sm64_below(uint64_t *state, uint64_t m) {
    const uint64_t threshold = (0 - m) % m; /* 2^64 mod m */
    for (;;) {
        uint64_t x = sm64_next(state);
        if (x >= threshold) return x % m;
    }
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Row g of the random layout: k < n candidates drawn into row[0 .. k-1],
 * listed in increasing order. taken[0 .. n-1] is scratch holding stamps of
 * earlier rows (never g + 1). */
static void random_row(int32_t *row, int32_t g, int32_t n, int32_t k, uint64_t seed_mixed,
                       int32_t *taken) {
    const int32_t stamp = g + 1; /* g + 1 <= INT32_MAX - 1 after sk_grid_check */
    uint64_t state = sm64_mix(seed_mixed ^ ((uint64_t)g * SK_GOLDEN_GAMMA));
    for (int32_t t = n - k; t < n; ++t) {
        int32_t r = (int32_t)sm64_below(&state, (uint64_t)t + 1);
        int32_t pick = taken[r] == stamp ? t : r;
        taken[pick] = stamp;
        row[t - (n - k)] = pick;
    }
    if (k >= n / 32) { /* list in order by a scan of the stamps: O(n) */
        int32_t e = 0;
        for (int32_t j = 0; j < n; ++j)
            if (taken[j] == stamp) row[e++] = j;
    } else {
        qsort(row, (size_t)k, sizeof(int32_t), cmp_i32);
    }
}

/* The candidates of each row of one slice: every key block of the row's
 * segment, or its causal prefix; 0 in the rows past the segments. */
static void random_candidates(int32_t *cand, int32_t row_blocks, const sk_grid *segs, int32_t count,
                              int causal) {
    int32_t r = 0;
    for (int32_t s = 0; s < count; ++s) {
        const sk_grid *seg = &segs[s];
        const int32_t cb = (int32_t)sk_ceil_div_i64(seg->cols, seg->block_cols);
        for (int32_t i = 0; i < segment_rows(seg); ++i)
            cand[r++] = causal ? sk_layout_causal_blocks(seg, i) : cb;
    }
    while (r < row_blocks) cand[r++] = 0;
}

static sk_status build_random(sk_layout_t *out, const sk_grid *grid, const sk_grid *segs,
                              int32_t count, int32_t k, uint64_t seed, int causal) {
    int32_t row_blocks, col_blocks, slices;
    SK_TRY(sk_grid_check(grid, &row_blocks, &col_blocks, &slices));
    SK_TRY(check_segments(segs, count, row_blocks));
    const int32_t total_rows = slices * row_blocks;
    const int threads = max_threads();
    int32_t *cand = (int32_t *)malloc(((size_t)row_blocks + 1) * sizeof(int32_t));
    if (cand == NULL)
        return sk_error(SK_STATUS_ALLOC_FAILED, "no memory for %d row counts", (int)row_blocks);
    random_candidates(cand, row_blocks, segs, count, causal);

    /* The count of a row depends only on its row block. */
    int64_t per_slice = 0;
    for (int32_t i = 0; i < row_blocks; ++i) per_slice += k < cand[i] ? k : cand[i];
    int64_t nnz;
    const sk_status counted = all_slices(per_slice, slices, &nnz);
    if (counted != SK_STATUS_SUCCESS) {
        free(cand);
        return counted;
    }

    struct sk_layout_s *layout = sk_layout_alloc(grid, total_rows, nnz);
    int32_t *taken = (int32_t *)calloc((size_t)threads * (size_t)col_blocks, sizeof(int32_t));
    if (layout == NULL || taken == NULL) {
        sk_layout_free(layout);
        free(taken);
        free(cand);
        return sk_error(SK_STATUS_ALLOC_FAILED, "no memory for %d rows and nnz = %lld",
                        (int)total_rows, (long long)nnz);
    }
    int32_t *off = layout->bsr.row_offsets, *idx = layout->bsr.col_indices;
    off[0] = 0;
    for (int32_t g = 0; g < total_rows; ++g) {
        int32_t n = cand[g % row_blocks];
        off[g + 1] = off[g] + (k < n ? k : n);
    }
    const uint64_t seed_mixed = sm64_mix(seed);
    /* Rows are independent (one stream each): any thread count gives the
     * same layout. */
#pragma omp parallel for schedule(dynamic, 16) if (nnz > 65536)
    for (int32_t g = 0; g < total_rows; ++g) {
        const int32_t n = cand[g % row_blocks];
        int32_t *row = idx + off[g];
        if (k >= n) {
            for (int32_t j = 0; j < n; ++j) row[j] = j;
        } else {
            random_row(row, g, n, k, seed_mixed, taken + (size_t)thread_id() * col_blocks);
        }
    }
    free(taken);
    free(cand);
    return sk_layout_finish(layout, out);
}

sk_status sk_layout_create_random(sk_layout_t *out, const sk_grid *grid, int32_t k, uint64_t seed,
                                  int causal) {
    SK_ENTER("sk_layout_create_random");
    const sk_layout_params prm = {SK_LAYOUT_RANDOM, 0, 0, k, seed, causal};
    return build_fixed(out, grid, &prm);
}

/* ---------------------------------------------------------------------------
 * Top-k from block scores
 *
 * Per (slice, row): candidates are 0 .. n-1 (n = col_blocks, or the causal
 * count). Forced: sinks 0 .. sink_blocks-1 and the local blocks
 * d-local_blocks+1 .. d (d = the diagonal block), both cut to the
 * candidates. The other candidates with score > -inf (so never NaN or -inf)
 * are eligible; the k best of them are kept, "better" being the strict total
 * order: higher score, then lower index. Because the order is total, the
 * chosen set is unique, whatever the selection method: here a quickselect
 * (median-of-three pivots, O(n) expected) that falls back to a full sort of
 * the remaining range after 2*log2(n) + 8 rounds, so O(n log n) at worst.
 * ------------------------------------------------------------------------- */

typedef struct scored {
    float score; /* never NaN here */
    int32_t index;
} scored;

/* a comes before b: higher score, or equal score and lower index. */
static int scored_better(scored a, scored b) {
    return a.score > b.score || (a.score == b.score && a.index < b.index);
}

static int scored_cmp(const void *pa, const void *pb) {
    const scored a = *(const scored *)pa, b = *(const scored *)pb;
    return scored_better(a, b) ? -1 : scored_better(b, a) ? 1 : 0;
}

static void scored_swap(scored *a, scored *b) {
    scored t = *a;
    *a = *b;
    *b = t;
}

/* Reorder a[0 .. m-1] so that a[0 .. k-1] are its k best, 0 < k < m. */
static void select_best(scored *a, int32_t m, int32_t k) {
    int32_t lo = 0, hi = m - 1, budget = 8;
    const int32_t target = k - 1;
    for (int32_t x = m; x > 1; x >>= 1) budget += 2;
    while (lo < hi) {
        if (budget-- == 0) {
            qsort(a + lo, (size_t)(hi - lo + 1), sizeof *a, scored_cmp);
            return;
        }
        /* Median of three to a[hi], then Lomuto partition: better ones left. */
        int32_t mid = lo + (hi - lo) / 2;
        if (scored_better(a[mid], a[lo])) scored_swap(&a[mid], &a[lo]);
        if (scored_better(a[hi], a[lo])) scored_swap(&a[hi], &a[lo]);
        if (scored_better(a[mid], a[hi])) scored_swap(&a[mid], &a[hi]);
        const scored pivot = a[hi];
        int32_t store = lo;
        for (int32_t e = lo; e < hi; ++e)
            if (scored_better(a[e], pivot)) scored_swap(&a[e], &a[store++]);
        scored_swap(&a[store], &a[hi]);
        if (store == target) return;
        if (store < target)
            lo = store + 1;
        else
            hi = store - 1;
    }
}

/* The forced blocks of a row: [0, sink_end) and [local_lo, local_hi]. */
typedef struct forced_blocks {
    int32_t candidates; /* n */
    int32_t sink_end;
    int32_t local_lo, local_hi; /* empty when local_hi < local_lo */
} forced_blocks;

static forced_blocks topk_forced(const sk_grid *grid, int32_t col_blocks, int32_t i,
                                 const sk_topk_options *opt) {
    forced_blocks f;
    f.candidates = opt->causal ? sk_layout_causal_blocks(grid, i) : col_blocks;
    f.sink_end = opt->sink_blocks < f.candidates ? opt->sink_blocks : f.candidates;
    int64_t d = sk_layout_diagonal_block(grid, i);
    f.local_lo = (int32_t)max_i64(d - (int64_t)opt->local_blocks + 1, 0);
    f.local_hi = (int32_t)min_i64(d, (int64_t)f.candidates - 1);
    if (opt->local_blocks == 0) f.local_hi = -1;
    return f;
}

static int is_forced(const forced_blocks *f, int32_t j) {
    return j < f->sink_end || (j >= f->local_lo && j <= f->local_hi);
}

sk_status sk_layout_create_topk(sk_layout_t *out, const sk_grid *grid, const float *scores,
                                const sk_topk_options *options) {
    SK_ENTER("sk_layout_create_topk");
    SK_CHECK_NOT_NULL(out);
    SK_CHECK_NOT_NULL(grid);
    SK_CHECK_NOT_NULL(scores);
    SK_CHECK_NOT_NULL(options);
    SK_TRY(sk_check_alignment(scores, NULL, 4, 4, 0, "scores"));
    int32_t row_blocks, col_blocks, slices;
    SK_TRY(sk_grid_check(grid, &row_blocks, &col_blocks, &slices));
    const sk_topk_options opt = *options;
    if (opt.k < 0)
        return sk_error(SK_STATUS_BAD_PARAM_VALUE, "options->k = %d must be >= 0", (int)opt.k);
    if (opt.sink_blocks < 0)
        return sk_error(SK_STATUS_BAD_PARAM_VALUE, "options->sink_blocks = %d must be >= 0",
                        (int)opt.sink_blocks);
    if (opt.local_blocks < 0)
        return sk_error(SK_STATUS_BAD_PARAM_VALUE, "options->local_blocks = %d must be >= 0",
                        (int)opt.local_blocks);
    const int32_t total_rows = slices * row_blocks;

    const int threads = max_threads();

    /* Counting pass: forced blocks plus min(k, eligible others). */
    int32_t *counts = (int32_t *)malloc((size_t)total_rows * sizeof(int32_t));
    if (counts == NULL)
        return sk_error(SK_STATUS_ALLOC_FAILED, "no memory for %d row counts", (int)total_rows);
    const int big = (int64_t)total_rows * col_blocks > 65536; /* dense count: int64 */
#pragma omp parallel for schedule(static) if (big)
    for (int32_t g = 0; g < total_rows; ++g) {
        const forced_blocks f = topk_forced(grid, col_blocks, g % row_blocks, &opt);
        const float *row = scores + (int64_t)g * col_blocks;
        int32_t forced = 0, eligible = 0;
        for (int32_t j = 0; j < f.candidates; ++j) {
            if (is_forced(&f, j))
                ++forced;
            else if (row[j] > -INFINITY)
                ++eligible;
        }
        counts[g] = forced + (opt.k < eligible ? opt.k : eligible); /* <= col_blocks */
    }
    int64_t nnz = 0;
    for (int32_t g = 0; g < total_rows; ++g) nnz += counts[g]; /* <= the dense count: int64 */
    const sk_status fits = sk_layout_check_nnz(nnz, "scores: the selection keeps too many blocks");
    if (fits != SK_STATUS_SUCCESS) {
        free(counts);
        return fits;
    }

    struct sk_layout_s *layout = sk_layout_alloc(grid, total_rows, nnz);
    int32_t *taken = (int32_t *)calloc((size_t)threads * (size_t)col_blocks, sizeof(int32_t));
    scored *pool = (scored *)malloc((size_t)threads * (size_t)col_blocks * sizeof(scored));
    if (layout == NULL || taken == NULL || pool == NULL) {
        sk_layout_free(layout);
        free(counts);
        free(taken);
        free(pool);
        return sk_error(SK_STATUS_ALLOC_FAILED, "no memory for %d rows and nnz = %lld",
                        (int)total_rows, (long long)nnz);
    }
    int32_t *off = layout->bsr.row_offsets, *idx = layout->bsr.col_indices;
    off[0] = 0;
    for (int32_t g = 0; g < total_rows; ++g) off[g + 1] = off[g] + counts[g];
    free(counts);

    int mismatch = 0;
#pragma omp parallel for schedule(dynamic, 16) if (big)
    for (int32_t g = 0; g < total_rows; ++g) {
        const forced_blocks f = topk_forced(grid, col_blocks, g % row_blocks, &opt);
        const float *row = scores + (int64_t)g * col_blocks;
        const size_t t = (size_t)thread_id();
        int32_t *mark = taken + t * col_blocks;
        scored *cand = pool + t * col_blocks;
        const int32_t stamp = g + 1; /* g + 1 <= INT32_MAX - 1 after sk_grid_check */
        int32_t m = 0;
        for (int32_t j = 0; j < f.candidates; ++j) {
            if (is_forced(&f, j)) {
                mark[j] = stamp;
            } else if (row[j] > -INFINITY) {
                cand[m].score = row[j];
                cand[m].index = j;
                ++m;
            }
        }
        const int32_t picks = opt.k < m ? opt.k : m;
        if (picks > 0 && picks < m) select_best(cand, m, picks);
        for (int32_t e = 0; e < picks; ++e) mark[cand[e].index] = stamp;
        /* Write within the row's counted extent only. */
        int32_t w = off[g];
        for (int32_t j = 0; j < f.candidates && w < off[g + 1]; ++j)
            if (mark[j] == stamp) idx[w++] = j;
        if (w != off[g + 1]) {
#pragma omp atomic write
            mismatch = 1;
        }
    }
    free(taken);
    free(pool);
    if (mismatch) { /* the two passes disagree: a bug */
        sk_layout_free(layout);
        return sk_error(SK_STATUS_INTERNAL_ERROR, "the top-k counting and filling passes differ");
    }
    return sk_layout_finish(layout, out);
}
