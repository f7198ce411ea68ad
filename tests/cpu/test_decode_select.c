/*
 * test_decode_select.c - the decode page selection on the CPU backend
 * (sparsek.h "Decode page selection"): summaries against brute force,
 * append against a rebuild (and blocks past the appended range left
 * untouched), the selection against the naive full sort (exact on
 * quantised inputs, where fp32 sums are exact; by score margins
 * otherwise), infinite keys, and bad inputs (status, a message naming the
 * argument, nothing written). The naive code is tests/common/dsel_case.c.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dsel_case.h"
#include "common/harness.h"
#include "common/test_util.h"
#include "sparsek.h"

SK_TEST(dsel_desc_init_sets_defaults) {
    sk_decode_select_desc d;
    memset(&d, 0x5a, sizeof d);
    REQUIRE(sk_decode_select_desc_init(&d, sizeof d) == SK_STATUS_SUCCESS, "%s", sk_last_error());
    CHECK(d.struct_size == sizeof d && d.backend == SK_BACKEND_CUDA && d.dtype == SK_DTYPE_F16,
          "struct_size / backend / dtype");
    CHECK(d.block_k == 64 && d.k == 64 && d.sink_blocks == 1 && d.recent_blocks == 2 &&
              d.page_size == 64,
          "block_k %d k %d sinks %d recent %d page %d", (int)d.block_k, (int)d.k,
          (int)d.sink_blocks, (int)d.recent_blocks, (int)d.page_size);
    CHECK(d.batch == 0 && d.scale == 0.0f && d.q_strides[0] == 0 && d.k_strides[2] == 0, "zeros");
    CHECK(sk_decode_select_desc_init(&d, sizeof d - 1) == SK_STATUS_BAD_PARAM_STRUCT_SIZE,
          "short struct_size");
}

static size_t esize(sk_dtype t) { return t == SK_DTYPE_F32 ? 4 : 2; }

/* Summary of the library (built) vs brute force; returns mismatches. */
static int check_summary(const dc_case *c, const void *summary, const int32_t *lens) {
    const int64_t n = dc_summary_elems(c);
    float *want = (float *)malloc((size_t)n * 4), *got = (float *)malloc((size_t)n * 4);
    if (want == NULL || got == NULL) {
        free(want), free(got);
        return -1;
    }
    dc_naive_summary(c, lens, want);
    dc_summary_to_f32(c, summary, got);
    int bad = 0;
    for (int64_t i = 0; i < n; ++i)
        if (memcmp(&want[i], &got[i], 4) != 0 && !(want[i] == 0.0f && got[i] == 0.0f)) {
            if (bad < 3) fprintf(stderr, "  summary[%lld] = %g, want %g\n", (long long)i, got[i], want[i]);
            ++bad;
        }
    free(want), free(got);
    return bad;
}

static void summary_case(sk_dtype dtype, int32_t bk, int32_t ps, int32_t max_len, int padded,
                         int32_t groups, uint64_t seed) {
    tu_rng rng;
    tu_rng_seed(&rng, seed);
    dc_case c;
    REQUIRE(dc_alloc(&c, &rng, SK_BACKEND_CPU, dtype, 3, 1, 4, 2, 64, bk, ps, max_len, padded, 0, 1),
            "no memory");
    c.desc.group_blocks = groups;
    c.desc.top_groups = 1;
    size_t bytes = 0;
    REQUIRE(sk_kv_summary_bytes(&c.desc, &bytes) == SK_STATUS_SUCCESS, "%s", sk_last_error());
    CHECK(bytes == (size_t)dc_summary_elems(&c) * esize(dtype), "bytes %zu", bytes);
    void *sum = malloc(bytes);
    REQUIRE(sum != NULL, "no memory");
    memset(sum, 0x7f, bytes);
    sk_status st = sk_kv_summary_build(&c.desc, c.cache, c.table, c.lens, sum, NULL);
    CHECK(st == SK_STATUS_SUCCESS, "%s", sk_last_error());
    const int bad = check_summary(&c, sum, c.lens);
    CHECK(bad == 0, "%d summary values off (dtype %d, block_k %d, page %d, len %d, seed %llu)", bad,
          (int)dtype, (int)bk, (int)ps, (int)max_len, (unsigned long long)seed);
    free(sum);
    dc_free(&c);
}

SK_TEST(dsel_summary_build_matches_brute_force) {
    const uint64_t seed = tu_base_seed() ^ 0xd5e1;
    summary_case(SK_DTYPE_F32, 64, 64, 300, 0, 0, seed);
    summary_case(SK_DTYPE_F16, 16, 64, 300, 1, 0, seed + 1);
    summary_case(SK_DTYPE_BF16, 128, 32, 517, 0, 0, seed + 2);
    summary_case(SK_DTYPE_F16, 32, 16, 100, 1, 0, seed + 3);
    summary_case(SK_DTYPE_BF16, 64, 128, 1, 0, 0, seed + 4);
    /* Two levels: the group summaries after the blocks'. */
    summary_case(SK_DTYPE_F32, 16, 64, 300, 0, 4, seed + 5);
    summary_case(SK_DTYPE_F16, 32, 16, 517, 1, 3, seed + 6);
}

/* Build at old lengths, append step by step to the new ones: equal to a
 * rebuild, and blocks past the appended ones untouched. */
static void append_case(sk_dtype dtype, int32_t bk, int32_t ps, int32_t max_len, int32_t step,
                        int32_t groups, uint64_t seed) {
    tu_rng rng;
    tu_rng_seed(&rng, seed);
    dc_case c;
    REQUIRE(dc_alloc(&c, &rng, SK_BACKEND_CPU, dtype, 4, 1, 2, 2, 32, bk, ps, max_len, 1, 0, 1),
            "no memory");
    c.desc.group_blocks = groups;
    c.desc.top_groups = 2;
    const int32_t B = 4;
    int32_t cur[4], next[4];
    for (int32_t b = 0; b < B; ++b) cur[b] = (int32_t)tu_rng_range(&rng, 0, c.lens[b]);
    size_t bytes = 0;
    REQUIRE(sk_kv_summary_bytes(&c.desc, &bytes) == SK_STATUS_SUCCESS, "%s", sk_last_error());
    unsigned char *sum = (unsigned char *)malloc(bytes), *ref = (unsigned char *)malloc(bytes);
    REQUIRE(sum != NULL && ref != NULL, "no memory");
    REQUIRE(sk_kv_summary_build(&c.desc, c.cache, c.table, cur, sum, NULL) == SK_STATUS_SUCCESS,
            "%s", sk_last_error());
    const int64_t block_bytes = 2 * c.desc.head_dim * (int64_t)esize(dtype);
    const int32_t mb = dc_max_blocks(&c);
    int steps = 0, done = 0;
    while (!done && steps < 64) {
        done = 1;
        for (int32_t b = 0; b < B; ++b) {
            next[b] = cur[b] + (int32_t)tu_rng_range(&rng, 0, step);
            if (next[b] > c.lens[b]) next[b] = c.lens[b];
            if (next[b] < c.lens[b]) done = 0;
        }
        /* Poison the blocks past each sequence's new last block. */
        for (int32_t b = 0; b < B; ++b)
            for (int32_t h = 0; h < c.desc.heads_kv; ++h)
                for (int32_t j = (next[b] + bk - 1) / bk; j < mb; ++j)
                    memset(sum + ((int64_t)(b * c.desc.heads_kv + h) * mb + j) * block_bytes, 0x5a,
                           (size_t)block_bytes);
        memcpy(ref, sum, bytes);
        sk_status st = sk_kv_summary_append(&c.desc, c.cache, c.table, cur, next, sum, NULL);
        REQUIRE(st == SK_STATUS_SUCCESS, "%s", sk_last_error());
        for (int32_t b = 0; b < B; ++b)
            for (int32_t h = 0; h < c.desc.heads_kv; ++h)
                for (int32_t j = (next[b] + bk - 1) / bk; j < mb; ++j) {
                    const int64_t at = ((int64_t)(b * c.desc.heads_kv + h) * mb + j) * block_bytes;
                    CHECK(memcmp(sum + at, ref + at, (size_t)block_bytes) == 0,
                          "step %d: block %d of (%d, %d) past the appended keys was written", steps,
                          (int)j, (int)b, (int)h);
                }
        /* Blocks past the new length must hold the empty summary for the
         * comparison with a rebuild: restore them as the rebuild writes. */
        unsigned char *rebuilt = (unsigned char *)malloc(bytes);
        REQUIRE(rebuilt != NULL, "no memory");
        REQUIRE(sk_kv_summary_build(&c.desc, c.cache, c.table, next, rebuilt, NULL) ==
                    SK_STATUS_SUCCESS,
                "%s", sk_last_error());
        int diff = 0;
        for (int32_t b = 0; b < B; ++b)
            for (int32_t h = 0; h < c.desc.heads_kv; ++h)
                for (int32_t j = 0; j < (next[b] + bk - 1) / bk; ++j) {
                    const int64_t at = ((int64_t)(b * c.desc.heads_kv + h) * mb + j) * block_bytes;
                    diff += memcmp(sum + at, rebuilt + at, (size_t)block_bytes) != 0;
                }
        /* Group summaries (after every block's): all equal to a rebuild's,
         * though the blocks past the lengths hold garbage here. */
        const int64_t groups_at = (int64_t)dc_rows(&c) * mb * block_bytes;
        diff += memcmp(sum + groups_at, rebuilt + groups_at, bytes - (size_t)groups_at) != 0;
        CHECK(diff == 0, "step %d: %d blocks (or the groups) differ from a rebuild (seed %llu)",
              steps, diff, (unsigned long long)seed);
        memcpy(sum, rebuilt, bytes);
        free(rebuilt);
        memcpy(cur, next, sizeof cur);
        ++steps;
    }
    free(sum), free(ref);
    dc_free(&c);
}

SK_TEST(dsel_summary_append_equals_rebuild) {
    const uint64_t seed = tu_base_seed() ^ 0xa99e;
    append_case(SK_DTYPE_F16, 64, 64, 700, 1, 0, seed);
    append_case(SK_DTYPE_BF16, 16, 64, 400, 37, 0, seed + 1);
    append_case(SK_DTYPE_F32, 128, 16, 900, 200, 0, seed + 2);
    append_case(SK_DTYPE_F16, 32, 128, 300, 5, 0, seed + 3);
    append_case(SK_DTYPE_F16, 16, 32, 500, 3, 4, seed + 4);
    append_case(SK_DTYPE_BF16, 32, 64, 800, 90, 5, seed + 5);
}

/* The library's layout for case c (summary built first). */
static int run_select(dc_case *c, int32_t **off, int32_t **idx, int32_t *cap, void **sum_out) {
    size_t bytes = 0;
    if (sk_kv_summary_bytes(&c->desc, &bytes) != SK_STATUS_SUCCESS) return 0;
    void *sum = malloc(bytes);
    const int32_t rows = dc_rows(c);
    if (sk_decode_select_capacity(&c->desc, NULL, cap) != SK_STATUS_SUCCESS) return 0;
    *off = (int32_t *)malloc((size_t)(rows + 1) * 4);
    *idx = (int32_t *)malloc((size_t)(*cap + 1) * 4);
    if (sum == NULL || *off == NULL || *idx == NULL) return 0;
    if (sk_kv_summary_build(&c->desc, c->cache, c->table, c->lens, sum, NULL) != SK_STATUS_SUCCESS)
        return 0;
    sk_bsr l;
    memset(&l, 0, sizeof l);
    l.row_offsets = *off;
    l.col_indices = *idx;
    if (sk_decode_select(&c->desc, c->q, sum, c->lens, &l, NULL, 0, NULL) != SK_STATUS_SUCCESS)
        return 0;
    if (l.nnz != *cap || l.grid.batch != c->desc.batch || l.grid.heads != c->desc.heads_kv ||
        l.grid.block_cols != c->desc.block_k || l.grid.rows != c->desc.q_len ||
        l.grid.cols != c->desc.max_seqlen_k || l.grid.block_rows != 64)
        return 0;
    *sum_out = sum;
    return 1;
}

/* Exact: quantised inputs make every fp32 sum exact, so the library's
 * layout must equal the naive one (ties everywhere test the tie rule). */
static int select_exact_case(sk_dtype dtype, int32_t B, int32_t q_len, int32_t hq, int32_t hkv,
                             int32_t D, int32_t bk, int32_t ps, int32_t len, int32_t k,
                             int32_t sinks, int32_t recent, int inf_keys, int32_t groups,
                             uint64_t seed) {
    tu_rng rng;
    tu_rng_seed(&rng, seed);
    dc_case c;
    if (!dc_alloc(&c, &rng, SK_BACKEND_CPU, dtype, B, q_len, hq, hkv, D, bk, ps, len,
                  (int)(seed & 1), 1, B > 1))
        return 1;
    c.desc.k = k;
    c.desc.sink_blocks = sinks;
    c.desc.recent_blocks = recent;
    c.desc.group_blocks = groups;
    c.desc.top_groups = groups > 0 ? 1 + (int32_t)(seed % 3) : 0;
    for (int i = 0; i < inf_keys; ++i) {
        const int32_t b = (int32_t)tu_rng_range(&rng, 0, B - 1);
        if (c.lens[b] == 0) continue;
        dc_set_key(&c, b, (int32_t)tu_rng_range(&rng, 0, c.lens[b] - 1),
                   (int32_t)tu_rng_range(&rng, 0, hkv - 1), (int32_t)tu_rng_range(&rng, 0, D - 1),
                   (i & 1) ? INFINITY : -INFINITY);
    }
    int32_t *off = NULL, *idx = NULL, cap = 0;
    void *sum = NULL;
    int fails = 0;
    if (!run_select(&c, &off, &idx, &cap, &sum)) {
        fprintf(stderr, "  select failed: %s\n", sk_last_error());
        fails = 1;
    } else {
        const int32_t rows = dc_rows(&c);
        float *sf = (float *)malloc((size_t)dc_summary_elems(&c) * 4);
        int32_t *woff = (int32_t *)malloc((size_t)(rows + 1) * 4);
        int32_t *widx = (int32_t *)malloc((size_t)dc_max_blocks(&c) * rows * 4 + 4);
        dc_naive_summary(&c, c.lens, sf);
        dc_naive_select(&c, sf, woff, widx, NULL);
        if (off[rows] > cap || memcmp(off, woff, (size_t)(rows + 1) * 4) != 0 ||
            memcmp(idx, widx, (size_t)off[rows] * 4) != 0) {
            fprintf(stderr, "  layout differs from the naive one (count %d, want %d, cap %d)\n",
                    (int)off[rows], (int)woff[rows], (int)cap);
            fails = 1;
        }
        free(sf), free(woff), free(widx);
    }
    if (fails)
        fprintf(stderr,
                "  case: dtype %d B %d q_len %d hq %d hkv %d D %d bk %d page %d len %d k %d "
                "sinks %d recent %d inf %d groups %d seed %llu\n",
                (int)dtype, (int)B, (int)q_len, (int)hq, (int)hkv, (int)D, (int)bk, (int)ps,
                (int)len, (int)k, (int)sinks, (int)recent, inf_keys, (int)groups,
                (unsigned long long)seed);
    free(off), free(idx), free(sum);
    dc_free(&c);
    return fails;
}

SK_TEST(dsel_select_matches_naive_on_exact_scores) {
    const uint64_t seed = tu_base_seed() ^ 0x5e1ec7;
    tu_rng rng;
    tu_rng_seed(&rng, seed);
    static const int32_t blocks[4] = {16, 32, 64, 128};
    static const int32_t groups[5] = {1, 2, 4, 8, 16};
    static const sk_dtype dtypes[3] = {SK_DTYPE_F32, SK_DTYPE_F16, SK_DTYPE_BF16};
    int fails = 0;
    for (int i = 0; i < 40; ++i) {
        const int32_t hkv = (int32_t)tu_rng_range(&rng, 1, 3);
        const int32_t g = groups[tu_rng_range(&rng, 0, 4)];
        const int32_t bk = blocks[tu_rng_range(&rng, 0, 3)], ps = blocks[tu_rng_range(&rng, 0, 3)];
        fails += select_exact_case(dtypes[i % 3], (int32_t)tu_rng_range(&rng, 1, 4),
                                   (int32_t)tu_rng_range(&rng, 1, 16), hkv * g, hkv,
                                   32 * (int32_t)tu_rng_range(&rng, 1, 4), bk, ps,
                                   (int32_t)tu_rng_range(&rng, 1, 1500),
                                   (int32_t)tu_rng_range(&rng, 0, 12), (int32_t)tu_rng_range(&rng, 0, 2),
                                   (int32_t)tu_rng_range(&rng, 0, 3), i % 4 == 3 ? 6 : 0,
                                   i % 3 == 1 ? (int32_t)tu_rng_range(&rng, 2, 9) : 0,
                                   seed + 17 * (uint64_t)i);
    }
    CHECK(fails == 0, "%d of 40 cases differ (seed %llu)", fails, (unsigned long long)seed);
}

/* Real-valued inputs: each row's picks by score must be among the best by
 * the naive fp64 scores, up to a rounding margin. */
SK_TEST(dsel_select_picks_the_best_bounds) {
    const uint64_t seed = tu_base_seed() ^ 0xb0b;
    tu_rng rng;
    tu_rng_seed(&rng, seed);
    dc_case c;
    REQUIRE(dc_alloc(&c, &rng, SK_BACKEND_CPU, SK_DTYPE_BF16, 3, 4, 8, 2, 128, 32, 64, 3000, 1, 0, 0),
            "no memory");
    c.desc.k = 10;
    int32_t *off = NULL, *idx = NULL, cap = 0;
    void *sum = NULL;
    REQUIRE(run_select(&c, &off, &idx, &cap, &sum), "%s", sk_last_error());
    const int32_t rows = dc_rows(&c), mb = dc_max_blocks(&c);
    float *sf = (float *)malloc((size_t)dc_summary_elems(&c) * 4);
    double *sc = (double *)malloc((size_t)rows * mb * 8);
    int32_t *woff = (int32_t *)malloc((size_t)(rows + 1) * 4), *widx = (int32_t *)malloc((size_t)rows * mb * 4);
    REQUIRE(sf && sc && woff && widx, "no memory");
    dc_naive_summary(&c, c.lens, sf);
    dc_naive_select(&c, sf, woff, widx, sc);
    int bad = 0;
    for (int32_t r = 0; r < rows; ++r) {
        const int32_t n = (c.lens[r / 2] + 31) / 32;
        char *picked = (char *)calloc((size_t)mb, 1);
        for (int32_t e = off[r]; e < off[r + 1]; ++e) picked[idx[e]] = 1;
        double worst_in = INFINITY, best_out = -INFINITY, mag = 0.0;
        for (int32_t j = 0; j < n; ++j) {
            if (j < c.desc.sink_blocks || j >= n - c.desc.recent_blocks) continue;
            const double s = sc[(int64_t)r * mb + j];
            mag = fabs(s) > mag ? fabs(s) : mag;
            if (picked[j] && s < worst_in) worst_in = s;
            if (!picked[j] && s > best_out) best_out = s;
        }
        bad += off[r + 1] - off[r] != woff[r + 1] - woff[r];
        bad += best_out > worst_in + 1e-5 * mag;
        free(picked);
    }
    CHECK(bad == 0, "%d rows pick below their best bounds (seed %llu)", bad, (unsigned long long)seed);
    free(off), free(idx), free(sum), free(sf), free(sc), free(woff), free(widx);
    dc_free(&c);
}

/* ---------------------------------------------------------------------------
 * Bad inputs: status, message naming the argument, nothing written
 * ------------------------------------------------------------------------- */

static int unchanged(const unsigned char *buf, size_t n, unsigned char v) {
    for (size_t i = 0; i < n; ++i)
        if (buf[i] != v) return 0;
    return 1;
}

#define EXPECT_FAIL(call, status, word)                                                            \
    do {                                                                                           \
        const sk_status st_ = (call);                                                              \
        CHECK(st_ == (status), "%s: got %s (%s)", #call, sk_status_name(st_), sk_last_error());    \
        CHECK(strstr(sk_last_error(), (word)) != NULL, "%s: message '%s' lacks '%s'", #call,       \
              sk_last_error(), (word));                                                            \
    } while (0)

SK_TEST(dsel_bad_inputs_write_nothing) {
    tu_rng rng;
    tu_rng_seed(&rng, tu_base_seed() ^ 0xbad);
    dc_case c;
    REQUIRE(dc_alloc(&c, &rng, SK_BACKEND_CPU, SK_DTYPE_F16, 2, 1, 4, 2, 64, 64, 64, 500, 0, 0, 0),
            "no memory");
    size_t bytes = 0;
    int32_t cap = 0;
    REQUIRE(sk_kv_summary_bytes(&c.desc, &bytes) == SK_STATUS_SUCCESS &&
                sk_decode_select_capacity(&c.desc, NULL, &cap) == SK_STATUS_SUCCESS,
            "%s", sk_last_error());
    unsigned char *sum = (unsigned char *)malloc(bytes);
    int32_t off[5], *idx = (int32_t *)malloc((size_t)cap * 4);
    REQUIRE(sum != NULL && idx != NULL, "no memory");
    memset(sum, 0x33, bytes);
    memset(off, 0x33, sizeof off);
    memset(idx, 0x33, (size_t)cap * 4);
    sk_bsr l;
    memset(&l, 0, sizeof l);
    l.row_offsets = off;
    l.col_indices = idx;
    sk_decode_select_desc d = c.desc;

    EXPECT_FAIL(sk_kv_summary_build(NULL, c.cache, c.table, c.lens, sum, NULL),
                SK_STATUS_BAD_PARAM_NULL_POINTER, "desc");
    EXPECT_FAIL(sk_kv_summary_build(&d, NULL, c.table, c.lens, sum, NULL),
                SK_STATUS_BAD_PARAM_NULL_POINTER, "k_cache");
    EXPECT_FAIL(sk_kv_summary_build(&d, c.cache, NULL, c.lens, sum, NULL),
                SK_STATUS_BAD_PARAM_NULL_POINTER, "page_table");
    EXPECT_FAIL(sk_kv_summary_build(&d, c.cache, c.table, NULL, sum, NULL),
                SK_STATUS_BAD_PARAM_NULL_POINTER, "seq_lens_k");
    EXPECT_FAIL(sk_kv_summary_build(&d, c.cache, c.table, c.lens, NULL, NULL),
                SK_STATUS_BAD_PARAM_NULL_POINTER, "summary");
    EXPECT_FAIL(sk_kv_summary_append(&d, c.cache, c.table, NULL, c.lens, sum, NULL),
                SK_STATUS_BAD_PARAM_NULL_POINTER, "old_lens");
    d.block_k = 48;
    EXPECT_FAIL(sk_kv_summary_bytes(&d, &bytes), SK_STATUS_BAD_PARAM_VALUE, "block_k");
    d = c.desc;
    d.head_dim = 48;
    EXPECT_FAIL(sk_decode_select_capacity(&d, NULL, &cap), SK_STATUS_BAD_PARAM_SHAPE, "head_dim");
    d = c.desc;
    d.q_len = 65;
    EXPECT_FAIL(sk_decode_select_capacity(&d, NULL, &cap), SK_STATUS_BAD_PARAM_SHAPE, "q_len");
    d = c.desc;
    d.page_size = 8;
    EXPECT_FAIL(sk_decode_select_capacity(&d, NULL, &cap), SK_STATUS_BAD_PARAM_VALUE, "page_size");
    d = c.desc;
    d.max_seqlen_k = (int64_t)d.max_pages * d.page_size + 1;
    EXPECT_FAIL(sk_decode_select_capacity(&d, NULL, &cap), SK_STATUS_BAD_PARAM_SHAPE,
                "max_seqlen_k");
    d = c.desc;
    d.k = -1;
    EXPECT_FAIL(sk_decode_select_capacity(&d, NULL, &cap), SK_STATUS_BAD_PARAM_VALUE, "desc->k");
    d = c.desc;
    d.scale = NAN;
    EXPECT_FAIL(sk_decode_select_capacity(&d, NULL, &cap), SK_STATUS_BAD_PARAM_VALUE, "scale");
    d = c.desc;
    d.heads_q = 3;
    EXPECT_FAIL(sk_decode_select_capacity(&d, NULL, &cap), SK_STATUS_BAD_PARAM_SHAPE, "heads_q");
    d = c.desc;
    d.group_blocks = 1;
    EXPECT_FAIL(sk_decode_select_capacity(&d, NULL, &cap), SK_STATUS_BAD_PARAM_VALUE,
                "group_blocks");
    d.group_blocks = 8;
    d.top_groups = 0;
    EXPECT_FAIL(sk_decode_select_capacity(&d, NULL, &cap), SK_STATUS_BAD_PARAM_VALUE, "top_groups");
    d = c.desc;
    d.struct_size = 8;
    EXPECT_FAIL(sk_decode_select_capacity(&d, NULL, &cap), SK_STATUS_BAD_PARAM_STRUCT_SIZE, "desc");
    d = c.desc;

    /* Host content: lengths, pages, old > new. */
    int32_t lens[2] = {c.lens[0], (int32_t)d.max_seqlen_k + 1};
    EXPECT_FAIL(sk_kv_summary_build(&d, c.cache, c.table, lens, sum, NULL),
                SK_STATUS_BAD_PARAM_SHAPE, "seq_lens_k[1]");
    EXPECT_FAIL(sk_decode_select(&d, c.q, sum, lens, &l, NULL, 0, NULL), SK_STATUS_BAD_PARAM_SHAPE,
                "seq_lens_k[1]");
    int32_t old[2] = {c.lens[0], c.lens[1] + 1};
    EXPECT_FAIL(sk_kv_summary_append(&d, c.cache, c.table, old, c.lens, sum, NULL),
                SK_STATUS_BAD_PARAM_SHAPE, "old_lens[1]");
    const int32_t saved = c.table[0];
    c.table[0] = (int32_t)d.num_pages;
    EXPECT_FAIL(sk_kv_summary_build(&d, c.cache, c.table, c.lens, sum, NULL),
                SK_STATUS_BAD_PARAM_VALUE, "page_table[0][0]");
    c.table[0] = saved;

    /* Aliasing and alignment. */
    EXPECT_FAIL(sk_kv_summary_build(&d, c.cache, c.table, c.lens, c.cache, NULL),
                SK_STATUS_BAD_PARAM_STRIDE, "overlaps");
    EXPECT_FAIL(sk_decode_select(&d, c.q, sum, c.lens, NULL, NULL, 0, NULL),
                SK_STATUS_BAD_PARAM_NULL_POINTER, "layout");
    l.row_offsets = (int32_t *)(void *)sum;
    EXPECT_FAIL(sk_decode_select(&d, c.q, sum, c.lens, &l, NULL, 0, NULL),
                SK_STATUS_BAD_PARAM_STRIDE, "overlaps");
    l.row_offsets = off;
    EXPECT_FAIL(sk_decode_select(&d, (const char *)c.q + 1, sum, c.lens, &l, NULL, 0, NULL),
                SK_STATUS_BAD_PARAM_ALIGNMENT, "q");

    CHECK(unchanged(sum, bytes, 0x33), "summary written by a failed call");
    CHECK(unchanged((const unsigned char *)off, sizeof off, 0x33) &&
              unchanged((const unsigned char *)idx, (size_t)cap * 4, 0x33),
          "layout written by a failed call");
    CHECK(l.nnz == 0, "layout->nnz set by a failed call");
    free(sum), free(idx);
    dc_free(&c);
}
