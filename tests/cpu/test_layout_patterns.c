/*
 * test_layout_patterns.c - every layout builder against an independent
 * brute-force definition written here.
 *
 * The references enumerate token pairs (q, k) of each block and apply the
 * token-level rule of include/sparsek.h (bottom-right alignment: query q sits
 * at key position p = q + Sk - Sq); a block is expected iff some pair inside
 * it satisfies the rule. The layout under test is compared through
 * sk_layout_to_mask, slice by slice, so replication across slices is checked
 * too. Grids cover Sq != Sk both ways, tails, and single-token sequences.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/harness.h"
#include "common/test_util.h"
#include "sparsek.h"

static const int64_t k_sizes[] = {1, 63, 64, 65, 127, 200, 300};
enum { N_SIZES = sizeof k_sizes / sizeof k_sizes[0] };
static const int32_t k_blocks[] = {64, 128};

static int64_t ceil_div(int64_t a, int64_t b) {
    return (a + b - 1) / b;
}

/* The layout as a dense 0/1 mask [slices, rb, cb] (malloc'd), or NULL. */
static uint8_t *layout_mask(sk_layout_t layout, int64_t *bytes) {
    sk_bsr view;
    if (sk_layout_view(layout, &view) != SK_STATUS_SUCCESS) return NULL;
    int64_t n = ceil_div(view.grid.rows, view.grid.block_rows) *
                ceil_div(view.grid.cols, view.grid.block_cols) * view.grid.batch * view.grid.heads;
    uint8_t *mask = (uint8_t *)malloc((size_t)n);
    if (mask == NULL) return NULL;
    if (sk_layout_to_mask(&view, mask, (size_t)n) != SK_STATUS_SUCCESS) {
        free(mask);
        return NULL;
    }
    *bytes = n;
    return mask;
}

/* ---------------------------------------------------------------------------
 * Token-level rules
 * ------------------------------------------------------------------------- */

typedef enum rule_kind { RULE_DENSE, RULE_CAUSAL, RULE_WINDOW, RULE_SINKS } rule_kind;

typedef struct rule {
    rule_kind kind;
    int64_t a, b; /* window: left, right; sinks: sink tokens, window tokens */
} rule;

static int rule_admits(const rule *r, int64_t q, int64_t k, int64_t sq, int64_t sk) {
    const int64_t p = q + sk - sq;
    switch (r->kind) {
    case RULE_DENSE:
        return 1;
    case RULE_CAUSAL:
        return k <= p;
    case RULE_WINDOW: /* p - left <= k <= p + right, written without overflow */
        return p - k <= r->a && k - p <= r->b;
    case RULE_SINKS:
        return k <= p && (k < r->a || p - k < r->b);
    }
    return 0;
}

/* Expected one-slice mask [rb, cb] by enumerating every token pair. */
static void brute_mask(uint8_t *mask, const rule *r, int64_t sq, int64_t sk, int32_t bq,
                       int32_t bk) {
    const int64_t rb = ceil_div(sq, bq), cb = ceil_div(sk, bk);
    for (int64_t i = 0; i < rb; ++i)
        for (int64_t j = 0; j < cb; ++j) {
            int keep = 0;
            for (int64_t q = i * bq; q < (i + 1) * bq && q < sq && !keep; ++q)
                for (int64_t k = j * bk; k < (j + 1) * bk && k < sk && !keep; ++k)
                    keep = rule_admits(r, q, k, sq, sk);
            mask[i * cb + j] = (uint8_t)keep;
        }
}

/* 1 when block (i, j) holds a causal pair, by enumeration. */
static int block_has_causal_pair(int64_t i, int64_t j, int64_t sq, int64_t sk, int32_t bq,
                                 int32_t bk) {
    for (int64_t q = i * bq; q < (i + 1) * bq && q < sq; ++q)
        for (int64_t k = j * bk; k < (j + 1) * bk && k < sk; ++k)
            if (k <= q + sk - sq) return 1;
    return 0;
}

/* The diagonal block of row i: the key block holding position p of the
 * row's last valid query, found by scanning the blocks, clamped. */
static int64_t diagonal_block(int64_t i, int64_t sq, int64_t sk, int32_t bq, int32_t bk) {
    int64_t q_last = (i + 1) * bq < sq ? (i + 1) * bq - 1 : sq - 1;
    int64_t p = q_last + sk - sq;
    int64_t cb = ceil_div(sk, bk);
    if (p < 0) return 0;
    for (int64_t j = 0; j < cb; ++j)
        if (p >= j * bk && p < (j + 1) * bk) return j;
    return cb - 1;
}

/* Compare a built layout (all slices) with one expected slice mask. */
static void check_layout_equals(sk_layout_t layout, const uint8_t *expect, int64_t rb, int64_t cb,
                                int64_t slices, const char *what) {
    int64_t bytes = 0;
    uint8_t *got = layout_mask(layout, &bytes);
    REQUIRE(got != NULL, "%s: to_mask failed: %s", what, sk_last_error());
    CHECK(bytes == slices * rb * cb, "%s: %lld mask bytes", what, (long long)bytes);
    int reported = 0;
    for (int64_t s = 0; s < slices && bytes == slices * rb * cb; ++s)
        for (int64_t e = 0; e < rb * cb; ++e)
            if (got[s * rb * cb + e] != expect[e] && reported++ < 3)
                CHECK(0, "%s: slice %lld block (%lld, %lld): got %d, expected %d", what,
                      (long long)s, (long long)(e / cb), (long long)(e % cb),
                      (int)got[s * rb * cb + e], (int)expect[e]);
    free(got);
}

typedef sk_status (*build_fn)(sk_layout_t *out, const sk_grid *grid, const void *params);

/* For every size pair and block-size pair: build, compare with the rule. */
static void sweep_rule(const rule *r, build_fn build, const void *params, const char *name) {
    for (int a = 0; a < N_SIZES; ++a)
        for (int b = 0; b < N_SIZES; ++b)
            for (int x = 0; x < 2; ++x)
                for (int y = 0; y < 2; ++y) {
                    const int64_t sq = k_sizes[a], sk = k_sizes[b];
                    const int32_t bq = k_blocks[x], bk = k_blocks[y];
                    /* Two slices on the wider grids check the replication. */
                    const int32_t batch = (a + b) % 3 == 0 ? 2 : 1;
                    const sk_grid g = tu_grid(sq, sk, bq, bk, batch, 1);
                    const int64_t rb = ceil_div(sq, bq), cb = ceil_div(sk, bk);
                    uint8_t *expect = (uint8_t *)malloc((size_t)(rb * cb));
                    REQUIRE(expect != NULL, "malloc");
                    brute_mask(expect, r, sq, sk, bq, bk);
                    sk_layout_t layout = NULL;
                    sk_status st = build(&layout, &g, params);
                    char what[160];
                    snprintf(what, sizeof what, "%s Sq=%lld Sk=%lld bq=%d bk=%d", name,
                             (long long)sq, (long long)sk, (int)bq, (int)bk);
                    CHECK(st == SK_STATUS_SUCCESS, "%s: %s %s", what, sk_status_name(st),
                          sk_last_error());
                    if (st == SK_STATUS_SUCCESS)
                        check_layout_equals(layout, expect, rb, cb, batch, what);
                    sk_layout_destroy(layout);
                    free(expect);
                    if (sk_test_failures() > 10) return;
                }
}

static sk_status build_dense(sk_layout_t *out, const sk_grid *g, const void *p) {
    (void)p;
    return sk_layout_create_dense(out, g);
}
static sk_status build_causal(sk_layout_t *out, const sk_grid *g, const void *p) {
    (void)p;
    return sk_layout_create_causal(out, g);
}
static sk_status build_window(sk_layout_t *out, const sk_grid *g, const void *p) {
    const int64_t *lr = (const int64_t *)p;
    return sk_layout_create_window(out, g, lr[0], lr[1]);
}
static sk_status build_sinks(sk_layout_t *out, const sk_grid *g, const void *p) {
    const int64_t *sw = (const int64_t *)p;
    return sk_layout_create_sinks_window(out, g, sw[0], sw[1]);
}

SK_TEST(layout_dense_matches_brute_force) {
    rule r = {RULE_DENSE, 0, 0};
    sweep_rule(&r, build_dense, NULL, "dense");
}

SK_TEST(layout_causal_matches_brute_force) {
    rule r = {RULE_CAUSAL, 0, 0};
    sweep_rule(&r, build_causal, NULL, "causal");
}

SK_TEST(layout_causal_sq_greater_than_sk_has_empty_leading_rows) {
    /* Sq = 300, Sk = 64, blocks of 64: p = q - 236, so rows 0..2 (q <= 191)
     * see no key, row 3 (q up to 255, p up to 19) and row 4 see block 0. */
    sk_grid g = tu_grid(300, 64, 64, 64, 1, 1);
    sk_layout_t layout = NULL;
    sk_status st = sk_layout_create_causal(&layout, &g);
    REQUIRE(st == SK_STATUS_SUCCESS, "%s", sk_last_error());
    sk_bsr v;
    REQUIRE(sk_layout_view(layout, &v) == SK_STATUS_SUCCESS, "%s", sk_last_error());
    const int32_t expect_off[] = {0, 0, 0, 0, 1, 2};
    for (int r = 0; r <= 5; ++r)
        CHECK(v.row_offsets[r] == expect_off[r], "row_offsets[%d] = %d, expected %d", r,
              (int)v.row_offsets[r], (int)expect_off[r]);
    CHECK(v.nnz == 2, "nnz = %d", (int)v.nnz);
    sk_layout_destroy(layout);
}

SK_TEST(layout_window_matches_brute_force) {
    const int64_t params[][2] = {
        {0, 0},   {1, 0},   {0, 1},   {100, 0},       {64, 64},
        {300, 5}, {0, 200}, {63, 65}, {INT64_MAX, 0}, {INT64_MAX, INT64_MAX}};
    for (size_t t = 0; t < sizeof params / sizeof params[0]; ++t) {
        rule r = {RULE_WINDOW, params[t][0], params[t][1]};
        char name[64];
        snprintf(name, sizeof name, "window(%lld, %lld)", (long long)params[t][0],
                 (long long)params[t][1]);
        sweep_rule(&r, build_window, params[t], name);
    }
}

SK_TEST(layout_sinks_window_matches_brute_force) {
    const int64_t params[][2] = {{0, 1},  {4, 1},         {64, 64},       {100, 30}, {0, 1000},
                                 {65, 1}, {INT64_MAX, 1}, {3, INT64_MAX}, {130, 70}};
    for (size_t t = 0; t < sizeof params / sizeof params[0]; ++t) {
        rule r = {RULE_SINKS, params[t][0], params[t][1]};
        char name[64];
        snprintf(name, sizeof name, "sinks_window(%lld, %lld)", (long long)params[t][0],
                 (long long)params[t][1]);
        sweep_rule(&r, build_sinks, params[t], name);
    }
}

/* Strided is block-level: the reference finds d by scanning blocks and the
 * causal pairs by enumeration. */
SK_TEST(layout_strided_matches_brute_force) {
    const int32_t params[][3] = {{1, 0, 0},         {2, 0, 1},         {2, 1, 0}, {3, 2, 1},
                                 {3, 2, 0},         {1, 1, 1},         {5, 0, 0}, {INT32_MAX, 1, 0},
                                 {2, INT32_MAX, 1}, {2, INT32_MAX, 0}, {4, 3, 0}, {2, 2, 0},
                                 {1, 3, 0},         {3, 3, 1}};
    for (size_t t = 0; t < sizeof params / sizeof params[0]; ++t) {
        const int32_t stride = params[t][0], local = params[t][1], causal = params[t][2];
        for (int a = 0; a < N_SIZES; ++a)
            for (int b = 0; b < N_SIZES; ++b)
                for (int x = 0; x < 2; ++x)
                    for (int y = 0; y < 2; ++y) {
                        const int64_t sq = k_sizes[a], sk = k_sizes[b];
                        const int32_t bq = k_blocks[x], bk = k_blocks[y];
                        const int64_t rb = ceil_div(sq, bq), cb = ceil_div(sk, bk);
                        const int32_t heads = (a + b) % 4 == 1 ? 3 : 1;
                        uint8_t *expect = (uint8_t *)malloc((size_t)(rb * cb));
                        REQUIRE(expect != NULL, "malloc");
                        for (int64_t i = 0; i < rb; ++i) {
                            const int64_t d = diagonal_block(i, sq, sk, bq, bk);
                            for (int64_t j = 0; j < cb; ++j) {
                                int64_t dist = d > j ? d - j : j - d;
                                int keep = dist < local || dist % stride == 0;
                                if (causal &&
                                    (j > d || !block_has_causal_pair(i, j, sq, sk, bq, bk)))
                                    keep = 0;
                                expect[i * cb + j] = (uint8_t)keep;
                            }
                        }
                        sk_grid g = tu_grid(sq, sk, bq, bk, 1, heads);
                        sk_layout_t layout = NULL;
                        sk_status st = sk_layout_create_strided(&layout, &g, stride, local, causal);
                        char what[160];
                        snprintf(what, sizeof what,
                                 "strided(%d, %d, causal %d) Sq=%lld Sk=%lld bq=%d bk=%d",
                                 (int)stride, (int)local, (int)causal, (long long)sq, (long long)sk,
                                 (int)bq, (int)bk);
                        CHECK(st == SK_STATUS_SUCCESS, "%s: %s", what, sk_last_error());
                        if (st == SK_STATUS_SUCCESS)
                            check_layout_equals(layout, expect, rb, cb, heads, what);
                        sk_layout_destroy(layout);
                        free(expect);
                        if (sk_test_failures() > 10) return;
                    }
    }
}

SK_TEST(layout_builders_handle_a_large_grid_quickly) {
    /* 64K tokens in blocks of 64 (1024 blocks a side) x 8 heads: interval
     * arithmetic per row, one slice built and replicated. */
    sk_grid g = tu_grid(65536, 65536, 64, 64, 1, 8);
    sk_layout_t layout = NULL;
    sk_status st = sk_layout_create_sinks_window(&layout, &g, 128, 4096);
    REQUIRE(st == SK_STATUS_SUCCESS, "%s", sk_last_error());
    sk_bsr v;
    REQUIRE(sk_layout_view(layout, &v) == SK_STATUS_SUCCESS, "%s", sk_last_error());
    /* Row i (positions 64i .. 64i+63) keeps the sink blocks 0, 1 and the
     * window keys 64i-4095 .. 64i+63, i.e. blocks i-64 .. i: 67 blocks on
     * the last row; row 0 keeps block 0 only. */
    CHECK(v.row_offsets[1] == 1, "row 0 count %d", (int)v.row_offsets[1]);
    int32_t last = v.row_offsets[1024] - v.row_offsets[1023];
    CHECK(last == 2 + 65, "last row count %d", (int)last);
    CHECK(v.nnz == 8 * v.row_offsets[1024], "nnz %d", (int)v.nnz);
    sk_layout_destroy(layout);
}

/* ---------------------------------------------------------------------------
 * Random
 * ------------------------------------------------------------------------- */

/* Candidates of row i: every block, or the blocks holding a causal pair
 * (by enumeration). */
static int64_t candidate_count(int64_t i, int64_t sq, int64_t sk, int32_t bq, int32_t bk,
                               int causal) {
    const int64_t cb = ceil_div(sk, bk);
    if (!causal) return cb;
    int64_t n = 0;
    for (int64_t j = 0; j < cb; ++j) n += block_has_causal_pair(i, j, sq, sk, bq, bk);
    return n;
}

static int layouts_equal(sk_layout_t a, sk_layout_t b) {
    sk_bsr x, y;
    if (sk_layout_view(a, &x) != SK_STATUS_SUCCESS || sk_layout_view(b, &y) != SK_STATUS_SUCCESS)
        return 0;
    int64_t rows = ceil_div(x.grid.rows, x.grid.block_rows) * x.grid.batch * x.grid.heads;
    if (x.nnz != y.nnz) return 0;
    if (memcmp(x.row_offsets, y.row_offsets, (size_t)(rows + 1) * sizeof(int32_t)) != 0) return 0;
    return memcmp(x.col_indices, y.col_indices, (size_t)x.nnz * sizeof(int32_t)) == 0;
}

SK_TEST(layout_random_counts_candidates_and_reproducibility) {
    const uint64_t seed = tu_base_seed();
    const int64_t dims[][2] = {{1000, 777}, {777, 1000}, {300, 64}, {64, 300}, {1, 500}};
    const int32_t ks[] = {0, 1, 3, 100};
    for (size_t t = 0; t < sizeof dims / sizeof dims[0]; ++t)
        for (int causal = 0; causal < 2; ++causal)
            for (int x = 0; x < 2; ++x) {
                const int64_t sq = dims[t][0], sk = dims[t][1];
                const int32_t bq = k_blocks[x], bk = k_blocks[1 - x];
                const int64_t rb = ceil_div(sq, bq), cb = ceil_div(sk, bk);
                int64_t *cand = (int64_t *)malloc((size_t)rb * sizeof(int64_t));
                REQUIRE(cand != NULL, "malloc");
                for (int64_t i = 0; i < rb; ++i)
                    cand[i] = candidate_count(i, sq, sk, bq, bk, causal);
                for (size_t kk = 0; kk < sizeof ks / sizeof ks[0]; ++kk) {
                    const int32_t k = ks[kk];
                    sk_grid g = tu_grid(sq, sk, bq, bk, 2, 3);
                    sk_layout_t a = NULL, b = NULL, c = NULL;
                    sk_status st = sk_layout_create_random(&a, &g, k, seed, causal);
                    CHECK(st == SK_STATUS_SUCCESS, "%s", sk_last_error());
                    st = sk_layout_create_random(&b, &g, k, seed, causal);
                    CHECK(st == SK_STATUS_SUCCESS, "%s", sk_last_error());
                    st = sk_layout_create_random(&c, &g, k, seed + 1, causal);
                    CHECK(st == SK_STATUS_SUCCESS, "%s", sk_last_error());
                    sk_bsr v;
                    if (a == NULL || b == NULL || c == NULL ||
                        sk_layout_view(a, &v) != SK_STATUS_SUCCESS) {
                        CHECK(0, "no layout");
                        sk_layout_destroy(a);
                        sk_layout_destroy(b);
                        sk_layout_destroy(c);
                        continue;
                    }
                    CHECK(layouts_equal(a, b), "same seed, different layouts");
                    CHECK(sk_layout_validate(&v) == SK_STATUS_SUCCESS, "%s", sk_last_error());
                    double bits = 0; /* log2 of the number of possible layouts */
                    int slices_differ = 0;
                    for (int64_t s = 0; s < 6; ++s)
                        for (int64_t i = 0; i < rb; ++i) {
                            const int64_t gr = s * rb + i, n = cand[i];
                            const int64_t want = k < n ? k : n;
                            const int32_t got = v.row_offsets[gr + 1] - v.row_offsets[gr];
                            CHECK(got == want,
                                  "Sq=%lld Sk=%lld k=%d causal=%d row %lld: %d blocks, "
                                  "expected %lld",
                                  (long long)sq, (long long)sk, (int)k, causal, (long long)gr,
                                  (int)got, (long long)want);
                            for (int32_t e = v.row_offsets[gr]; e < v.row_offsets[gr + 1]; ++e)
                                CHECK(v.col_indices[e] < n && v.col_indices[e] < cb,
                                      "row %lld picks %d, not a candidate (n = %lld)",
                                      (long long)gr, (int)v.col_indices[e], (long long)n);
                            for (int64_t u = 0; u < want; ++u)
                                bits += log2((double)(n - u) / (double)(u + 1));
                            /* slice s against slice 0, same row block */
                            if (s > 0 && got > 0 &&
                                memcmp(v.col_indices + v.row_offsets[gr],
                                       v.col_indices + v.row_offsets[i],
                                       (size_t)got * sizeof(int32_t)) != 0)
                                slices_differ = 1;
                        }
                    if (bits >= 48) { /* a chance below 2^-40 of a false failure */
                        CHECK(!layouts_equal(a, c), "seeds %llu and %llu give equal layouts",
                              (unsigned long long)seed, (unsigned long long)(seed + 1));
                        CHECK(slices_differ, "every slice drew the same blocks");
                    }
                    sk_layout_destroy(a);
                    sk_layout_destroy(b);
                    sk_layout_destroy(c);
                }
                free(cand);
                if (sk_test_failures() > 10) return;
            }
}

SK_TEST(layout_random_is_uniform) {
    /* 2000 rows choosing 3 of 10 blocks: each block is picked 600 times on
     * average, standard deviation about 20.5; allow 5 sigma. Also checks
     * that pairs are not stuck together (block 0 with block 1: 2000 * 3/10 *
     * 2/9 = 133 expected). */
    const uint64_t seed = tu_base_seed() ^ 0x5A5Aull;
    sk_grid g = tu_grid(64 * 2000, 64 * 10, 64, 64, 1, 1);
    sk_layout_t layout = NULL;
    REQUIRE(sk_layout_create_random(&layout, &g, 3, seed, 0) == SK_STATUS_SUCCESS, "%s",
            sk_last_error());
    sk_bsr v;
    REQUIRE(sk_layout_view(layout, &v) == SK_STATUS_SUCCESS, "%s", sk_last_error());
    int hits[10] = {0}, pair01 = 0;
    for (int r = 0; r < 2000; ++r) {
        int has0 = 0, has1 = 0;
        for (int32_t e = v.row_offsets[r]; e < v.row_offsets[r + 1]; ++e) {
            ++hits[v.col_indices[e]];
            has0 |= v.col_indices[e] == 0;
            has1 |= v.col_indices[e] == 1;
        }
        pair01 += has0 && has1;
    }
    for (int j = 0; j < 10; ++j)
        CHECK(hits[j] > 600 - 103 && hits[j] < 600 + 103, "block %d picked %d times", j, hits[j]);
    CHECK(pair01 > 133 - 60 && pair01 < 133 + 60, "blocks 0 and 1 together %d times", pair01);
    sk_layout_destroy(layout);
}

/* The documented algorithm, written again here: splitmix64 per (slice,
 * row), Floyd's selection. Pins the stream so that every platform (and
 * every later version) draws the same layout for a seed. */
static uint64_t ref_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Check every row of a random layout against the documented stream. With
 * causal, Sq == Sk and equal blocks, row i has i + 1 candidates. */
static void check_random_stream(int64_t rb, int64_t cb, int32_t heads, int32_t k, uint64_t seed,
                                int causal) {
    sk_grid g = tu_grid(64 * rb, 64 * cb, 64, 64, 1, heads);
    sk_layout_t layout = NULL;
    REQUIRE(sk_layout_create_random(&layout, &g, k, seed, causal) == SK_STATUS_SUCCESS, "%s",
            sk_last_error());
    sk_bsr v;
    uint8_t *chosen = (uint8_t *)malloc((size_t)cb);
    if (chosen == NULL || sk_layout_view(layout, &v) != SK_STATUS_SUCCESS) {
        CHECK(0, "setup");
        free(chosen);
        sk_layout_destroy(layout);
        return;
    }
    for (int64_t gr = 0; gr < heads * rb && sk_test_failures() < 10; ++gr) {
        const int64_t n = causal ? gr % rb + 1 : cb, kk = k < n ? k : n;
        memset(chosen, 0, (size_t)cb);
        if (kk == n) memset(chosen, 1, (size_t)n);
        uint64_t state = ref_mix(ref_mix(seed) ^ ((uint64_t)gr * 0x9E3779B97F4A7C15ull));
        for (int64_t t = n - kk; t < n && kk < n; ++t) {
            uint64_t m = (uint64_t)t + 1, x;
            do {
                state += 0x9E3779B97F4A7C15ull;
                x = ref_mix(state);
            } while (x < (0 - m) % m);
            uint64_t r = x % m;
            chosen[chosen[r] ? (uint64_t)t : r] = 1;
        }
        int32_t e = v.row_offsets[gr];
        for (int32_t j = 0; j < cb; ++j)
            if (chosen[j]) {
                CHECK(e < v.row_offsets[gr + 1] && v.col_indices[e] == j,
                      "k=%d causal=%d row %lld: expected block %d at entry %d", (int)k, causal,
                      (long long)gr, (int)j, (int)e);
                ++e;
            }
        CHECK(e == v.row_offsets[gr + 1], "row %lld: %d entries, expected %lld", (long long)gr,
              (int)(v.row_offsets[gr + 1] - v.row_offsets[gr]), (long long)kk);
    }
    free(chosen);
    sk_layout_destroy(layout);
}

SK_TEST(layout_random_follows_the_documented_stream) {
    check_random_stream(5, 40, 2, 7, 12345, 0);
    /* Large enough for the multi-threaded path; both ways of ordering rows. */
    check_random_stream(500, 500, 1, 200, 777, 1);
    check_random_stream(300, 1000, 50, 5, 99, 0);
}

/* ---------------------------------------------------------------------------
 * Top-k
 * ------------------------------------------------------------------------- */

/* Build top-k over an rb x cb single-slice grid of 64-blocks, return mask. */
static uint8_t *topk_mask(int64_t sq, int64_t sk, const float *scores, int32_t k, int32_t sinks,
                          int32_t local, int32_t causal) {
    sk_grid g = tu_grid(sq, sk, 64, 64, 1, 1);
    sk_topk_options opt;
    memset(&opt, 0, sizeof opt);
    opt.k = k;
    opt.sink_blocks = sinks;
    opt.local_blocks = local;
    opt.causal = causal;
    sk_layout_t layout = NULL;
    if (sk_layout_create_topk(&layout, &g, scores, &opt) != SK_STATUS_SUCCESS) return NULL;
    int64_t bytes;
    uint8_t *m = layout_mask(layout, &bytes);
    sk_layout_destroy(layout);
    return m;
}

static void check_row(const uint8_t *mask, int64_t cb, int64_t row, const char *expect,
                      const char *what) {
    for (int64_t j = 0; j < cb; ++j)
        CHECK(mask[row * cb + j] == (expect[j] == '1'),
              "%s: row %lld block %lld: got %d, "
              "expected pattern %s",
              what, (long long)row, (long long)j, (int)mask[row * cb + j], expect);
}

SK_TEST(layout_topk_ties_go_to_the_lower_index) {
    /* One row of 6 blocks (Sq = 64, Sk = 384: the diagonal is block 5). */
    const float s[6] = {1.f, 5.f, 5.f, 3.f, 5.f, 0.f};
    uint8_t *m = topk_mask(64, 384, s, 1, 0, 0, 0);
    REQUIRE(m != NULL, "%s", sk_last_error());
    check_row(m, 6, 0, "010000", "k=1");
    free(m);
    m = topk_mask(64, 384, s, 2, 0, 0, 0);
    REQUIRE(m != NULL, "%s", sk_last_error());
    check_row(m, 6, 0, "011000", "k=2");
    free(m);
    m = topk_mask(64, 384, s, 4, 0, 0, 0);
    REQUIRE(m != NULL, "%s", sk_last_error());
    check_row(m, 6, 0, "011110", "k=4");
    free(m);
    const float z[6] = {0.f, -0.f, 0.f, 0.f, -0.f, 0.f}; /* -0 == +0: a tie */
    m = topk_mask(64, 384, z, 2, 0, 0, 0);
    REQUIRE(m != NULL, "%s", sk_last_error());
    check_row(m, 6, 0, "110000", "zeros");
    free(m);
}

SK_TEST(layout_topk_never_picks_nan_or_minus_inf_by_score) {
    const float s[6] = {NAN, -INFINITY, 0.5f, -INFINITY, NAN, INFINITY};
    uint8_t *m = topk_mask(64, 384, s, 5, 0, 0, 0);
    REQUIRE(m != NULL, "%s", sk_last_error());
    check_row(m, 6, 0, "001001", "k=5");
    free(m);
    /* ... but a forced block is kept whatever its score. */
    m = topk_mask(64, 384, s, 5, 1, 2, 0);
    REQUIRE(m != NULL, "%s", sk_last_error());
    check_row(m, 6, 0, "101011", "sink 1, local 2");
    free(m);
    const float all_nan[6] = {NAN, NAN, NAN, NAN, NAN, NAN};
    m = topk_mask(64, 384, all_nan, 3, 0, 0, 0);
    REQUIRE(m != NULL, "%s", sk_last_error());
    check_row(m, 6, 0, "000000", "all NaN");
    free(m);
}

SK_TEST(layout_topk_forced_blocks_and_causal) {
    /* Sq = Sk = 256: 4 x 4 blocks, diagonal d = i. Scores favour the upper
     * triangle, which causal must never pick. */
    float s[16];
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) s[i * 4 + j] = (float)(j > i ? 100 + j : j);
    uint8_t *m = topk_mask(256, 256, s, 1, 0, 0, 1);
    REQUIRE(m != NULL, "%s", sk_last_error());
    check_row(m, 4, 0, "1000", "causal k=1");
    check_row(m, 4, 1, "0100", "causal k=1");
    check_row(m, 4, 3, "0001", "causal k=1");
    free(m);
    m = topk_mask(256, 256, s, 1, 0, 0, 0);
    REQUIRE(m != NULL, "%s", sk_last_error());
    check_row(m, 4, 0, "0001", "non-causal k=1");
    check_row(m, 4, 2, "0001", "non-causal k=1");
    check_row(m, 4, 3, "0001", "non-causal k=1");
    free(m);
    /* sink 1 + local 1 forced, k = 1 more (the best of the rest). */
    m = topk_mask(256, 256, s, 1, 1, 1, 1);
    REQUIRE(m != NULL, "%s", sk_last_error());
    check_row(m, 4, 0, "1000", "forced causal");
    check_row(m, 4, 1, "1100", "forced causal");
    check_row(m, 4, 2, "1110", "forced causal");
    check_row(m, 4, 3, "1011", "forced causal"); /* 0 sink, 3 local, 2 by score */
    free(m);
    /* Sq > Sk, causal: Sq = 256, Sk = 128 -> p = q - 128; rows 0, 1 empty
     * (forced blocks too), row 2 sees block 0, row 3 blocks 0 and 1. */
    float t[8] = {1, 2, 1, 2, 1, 2, 1, 2};
    m = topk_mask(256, 128, t, 0, 5, 5, 1);
    REQUIRE(m != NULL, "%s", sk_last_error());
    check_row(m, 2, 0, "00", "Sq>Sk");
    check_row(m, 2, 1, "00", "Sq>Sk");
    check_row(m, 2, 2, "10", "Sq>Sk");
    check_row(m, 2, 3, "11", "Sq>Sk");
    free(m);
}

/* The reference: candidates and diagonal by enumeration, forced blocks,
 * then k times the best remaining eligible candidate by a linear scan. */
static void topk_reference(uint8_t *mask, const float *scores, int64_t sq, int64_t sk, int32_t bq,
                           int32_t bk, int64_t slices, const sk_topk_options *o) {
    const int64_t rb = ceil_div(sq, bq), cb = ceil_div(sk, bk);
    for (int64_t s = 0; s < slices; ++s)
        for (int64_t i = 0; i < rb; ++i) {
            const float *row = scores + (s * rb + i) * cb;
            uint8_t *out = mask + (s * rb + i) * cb;
            const int64_t d = diagonal_block(i, sq, sk, bq, bk);
            uint8_t cand[1024]; /* cb <= 1024 in these tests */
            for (int64_t j = 0; j < cb; ++j) {
                cand[j] = (uint8_t)(!o->causal || block_has_causal_pair(i, j, sq, sk, bq, bk));
                out[j] = (uint8_t)(cand[j] &&
                                   (j < o->sink_blocks || (j <= d && d - j < o->local_blocks)));
            }
            for (int32_t pick = 0; pick < o->k; ++pick) {
                int64_t best = -1;
                for (int64_t j = 0; j < cb; ++j) {
                    if (!cand[j] || out[j] || isnan(row[j]) || row[j] == -INFINITY) continue;
                    if (best < 0 || row[j] > row[best]) best = j;
                }
                if (best < 0) break;
                out[best] = 1;
            }
        }
}

SK_TEST(layout_topk_matches_reference_on_random_scores) {
    tu_rng rng;
    tu_rng_seed(&rng, tu_base_seed() ^ 0x70CCull);
    const int64_t dims[][2] = {{300, 200}, {200, 300}, {65, 640}, {640, 65}, {1, 300}, {127, 127}};
    for (size_t t = 0; t < sizeof dims / sizeof dims[0]; ++t)
        for (int x = 0; x < 2; ++x)
            for (int trial = 0; trial < 6; ++trial) {
                const int64_t sq = dims[t][0], sk = dims[t][1];
                const int32_t bq = k_blocks[x], bk = k_blocks[(x + trial) % 2];
                const int64_t rb = ceil_div(sq, bq), cb = ceil_div(sk, bk), slices = 2;
                sk_topk_options o;
                memset(&o, 0, sizeof o);
                o.k = (int32_t)tu_rng_range(&rng, 0, 4);
                o.sink_blocks = (int32_t)tu_rng_range(&rng, 0, 2);
                o.local_blocks = (int32_t)tu_rng_range(&rng, 0, 3);
                o.causal = (int32_t)tu_rng_range(&rng, 0, 1);
                const int64_t n = slices * rb * cb;
                float *scores = (float *)malloc((size_t)n * sizeof(float));
                uint8_t *expect = (uint8_t *)malloc((size_t)n);
                REQUIRE(scores != NULL && expect != NULL, "malloc");
                for (int64_t e = 0; e < n; ++e) {
                    int64_t r = tu_rng_range(&rng, 0, 9); /* few values: many ties */
                    scores[e] = r == 0   ? NAN
                                : r == 1 ? -INFINITY
                                : r == 2 ? INFINITY
                                         : (float)(r % 4);
                }
                topk_reference(expect, scores, sq, sk, bq, bk, slices, &o);
                sk_grid g = tu_grid(sq, sk, bq, bk, 1, (int32_t)slices);
                sk_layout_t layout = NULL;
                sk_status st = sk_layout_create_topk(&layout, &g, scores, &o);
                CHECK(st == SK_STATUS_SUCCESS, "%s", sk_last_error());
                if (st == SK_STATUS_SUCCESS) {
                    int64_t bytes;
                    uint8_t *got = layout_mask(layout, &bytes);
                    CHECK(got != NULL && bytes == n, "to_mask");
                    for (int64_t e = 0; got != NULL && e < n; ++e)
                        CHECK(got[e] == expect[e],
                              "Sq=%lld Sk=%lld bq=%d bk=%d k=%d sinks=%d local=%d causal=%d: "
                              "slice %lld row %lld block %lld got %d",
                              (long long)sq, (long long)sk, (int)bq, (int)bk, (int)o.k,
                              (int)o.sink_blocks, (int)o.local_blocks, (int)o.causal,
                              (long long)(e / (rb * cb)), (long long)(e / cb % rb),
                              (long long)(e % cb), (int)got[e]);
                    free(got);
                }
                sk_layout_destroy(layout);
                free(scores);
                free(expect);
                if (sk_test_failures() > 10) return;
            }
}

SK_TEST(layout_topk_large_grid_matches_reference) {
    /* 2 slices x 200 x 300 blocks: large enough for the multi-threaded path,
     * rows long enough for real selections (k = 60 of about 300). */
    tu_rng rng;
    tu_rng_seed(&rng, tu_base_seed() ^ 0xB16ull);
    const int64_t sq = 64 * 200 - 5, sk = 64 * 300 - 17, rb = 200, cb = 300, slices = 2;
    const int64_t n = slices * rb * cb;
    float *scores = (float *)malloc((size_t)n * sizeof(float));
    uint8_t *expect = (uint8_t *)malloc((size_t)n);
    if (scores == NULL || expect == NULL) {
        free(scores);
        free(expect);
        REQUIRE(0, "malloc");
    }
    for (int64_t e = 0; e < n; ++e) {
        int64_t r = tu_rng_range(&rng, 0, 99);
        scores[e] = r == 0 ? NAN : r == 1 ? -INFINITY : (float)(r % 37) * 0.25f;
    }
    sk_topk_options o;
    memset(&o, 0, sizeof o);
    o.k = 60;
    o.sink_blocks = 2;
    o.local_blocks = 3;
    topk_reference(expect, scores, sq, sk, 64, 64, slices, &o);
    sk_grid g = tu_grid(sq, sk, 64, 64, 2, 1);
    sk_layout_t layout = NULL;
    sk_status st = sk_layout_create_topk(&layout, &g, scores, &o);
    CHECK(st == SK_STATUS_SUCCESS, "%s", sk_last_error());
    if (st == SK_STATUS_SUCCESS) {
        int64_t bytes;
        uint8_t *got = layout_mask(layout, &bytes);
        CHECK(got != NULL && bytes == n, "to_mask");
        for (int64_t e = 0; got != NULL && e < n; ++e)
            CHECK(got[e] == expect[e], "slice %lld row %lld block %lld: got %d",
                  (long long)(e / (rb * cb)), (long long)(e / cb % rb), (long long)(e % cb),
                  (int)got[e]);
        free(got);
    }
    sk_layout_destroy(layout);
    free(scores);
    free(expect);
}
