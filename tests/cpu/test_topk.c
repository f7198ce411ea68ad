/*
 * test_topk.c - the CPU backend of the top-k block selection: pooling and
 * scores against naive loops written here, the selection against hand-made
 * expectations, an independent repeated-argmax selection and the host
 * builder sk_layout_create_topk, sk_attention_topk against its two steps.
 * Bad inputs are in test_topk_errors.c.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/test_util.h"
#include "cpu/test_topk_lib.h"
#include "cpu/cpu_backend.h"
#include "harness.h"
#include "sparsek.h"

SK_TEST(topk_desc_init_sets_defaults) {
    sk_topk_desc d;
    memset(&d, 0x5a, sizeof d);
    sk_status st = sk_topk_desc_init(&d, sizeof d);
    REQUIRE(st == SK_STATUS_SUCCESS, "%s %s", sk_status_name(st), sk_last_error());
    CHECK(d.struct_size == sizeof d, "struct_size %zu", d.struct_size);
    CHECK(d.backend == SK_BACKEND_CUDA, "backend %d", (int)d.backend);
    CHECK(d.dtype == SK_DTYPE_F16, "dtype %d", (int)d.dtype);
    CHECK(d.block_q == 128 && d.block_k == 128, "blocks %d %d", (int)d.block_q, (int)d.block_k);
    CHECK(d.k == 16 && d.sink_blocks == 0 && d.local_blocks == 0, "k %d sinks %d local %d",
          (int)d.k, (int)d.sink_blocks, (int)d.local_blocks);
    CHECK(d.scale == 0.0f && d.mask == SK_MASK_NONE && d.per_kv_head == 0, "scale/mask/per_kv");
    CHECK(d.batch == 0 && d.seq_q == 0 && d.q_strides[0] == 0 && d.k_strides[2] == 0, "zeros");
}

/* ---------------------------------------------------------------------------
 * Pooling
 * ------------------------------------------------------------------------- */

static void pool_case(sk_dtype dtype, int padded, int64_t sq, int64_t sk, int32_t bq, int32_t bk,
                      uint64_t seed) {
    tk_problem t;
    tk_problem_init(&t, SK_BACKEND_CPU, dtype, 2, sq, sk, 4, 2, 24, bq, bk);
    if (padded) tk_problem_pad_strides(&t);
    tu_rng rng;
    tu_rng_seed(&rng, seed);
    REQUIRE(tk_problem_alloc_host(&t, &rng, 0), "no memory");
    const int64_t nq = tk_pooled_q_len(&t), nk = tk_pooled_k_len(&t);
    float *pq = (float *)malloc((size_t)nq * 4), *pk = (float *)malloc((size_t)nk * 4);
    REQUIRE(pq != NULL && pk != NULL, "no memory");
    tu_fill_nan(pq, SK_DTYPE_F32, nq);
    tu_fill_nan(pk, SK_DTYPE_F32, nk);
    sk_status st = sk_block_pool(&t.desc, t.q, t.k, pq, pk, NULL);
    CHECK(st == SK_STATUS_SUCCESS, "%s %s", sk_status_name(st), sk_last_error());
    int bad = 0;
    bad += tk_check_pooled(&t, 1, pq, "pooled_q");
    bad += tk_check_pooled(&t, 0, pk, "pooled_k");
    CHECK(bad == 0, "%d pooled values off (dtype %d, padded %d, Sq %lld, Sk %lld)", bad, (int)dtype,
          padded, (long long)sq, (long long)sk);
    free(pq);
    free(pk);
    tk_problem_free(&t);
}

SK_TEST(topk_pool_matches_naive_loop_with_tails_and_strides) {
    const uint64_t seed = tu_base_seed() ^ 0x100;
    pool_case(SK_DTYPE_F32, 0, 300, 200, 128, 64, seed);
    pool_case(SK_DTYPE_F16, 1, 300, 200, 128, 64, seed + 1);
    pool_case(SK_DTYPE_BF16, 1, 129, 65, 64, 128, seed + 2);
    pool_case(SK_DTYPE_BF16, 0, 1, 1, 64, 64, seed + 3);
}

/* ---------------------------------------------------------------------------
 * Scores
 * ------------------------------------------------------------------------- */

SK_TEST(topk_scores_match_naive_loop) {
    for (int per_kv = 0; per_kv < 2; ++per_kv) {
        tk_problem t;
        tk_problem_init(&t, SK_BACKEND_CPU, SK_DTYPE_F32, 2, 200, 300, 6, 2, 16, 64, 64);
        t.desc.per_kv_head = per_kv;
        t.desc.scale = 0.3f;
        tu_rng rng;
        tu_rng_seed(&rng, tu_base_seed() ^ (0x200u + (unsigned)per_kv));
        float *pq, *pk;
        REQUIRE(tk_random_pooled(&t, &rng, 0, &pq, &pk), "no memory");
        sk_topk_problem p;
        tk_fill_problem(&t, &p);
        p.pooled_q = pq;
        p.pooled_k = pk;
        const int64_t n = (int64_t)p.total_rows * p.col_blocks;
        float *got = (float *)malloc((size_t)n * 4);
        REQUIRE(got != NULL, "no memory");
        sk_cpu_topk_scores(&p, got);
        int bad = tk_check_scores(&t, pq, pk, got, 1.0);
        CHECK(bad == 0, "%d scores off (per_kv_head %d)", bad, per_kv);
        free(got);
        free(pq);
        free(pk);
        tk_problem_free(&t);
    }
}

SK_TEST(topk_per_kv_head_scores_are_group_sums) {
    tk_problem t;
    tk_problem_init(&t, SK_BACKEND_CPU, SK_DTYPE_F32, 1, 256, 256, 4, 1, 8, 64, 64);
    t.desc.scale = 0.5f; /* exact, like the quantised values */
    tu_rng rng;
    tu_rng_seed(&rng, tu_base_seed() ^ 0x250);
    float *pq, *pk;
    REQUIRE(tk_random_pooled(&t, &rng, 1, &pq, &pk), "no memory");
    sk_topk_problem ph, pg;
    tk_fill_problem(&t, &ph);
    t.desc.per_kv_head = 1;
    tk_fill_problem(&t, &pg);
    ph.pooled_q = pg.pooled_q = pq;
    ph.pooled_k = pg.pooled_k = pk;
    float *sh = (float *)malloc(4 * 4 * 4 * 4), *sg = (float *)malloc(4 * 4 * 4);
    REQUIRE(sh != NULL && sg != NULL, "no memory");
    sk_cpu_topk_scores(&ph, sh); /* [4 heads, 4, 4] */
    sk_cpu_topk_scores(&pg, sg); /* [1, 4, 4] */
    /* Quantised pooled values: every product and sum is exact. */
    for (int e = 0; e < 16; ++e) {
        const float sum = sh[e] + sh[16 + e] + sh[32 + e] + sh[48 + e];
        CHECK(sg[e] == sum, "entry %d: per-KV-head %g, sum of heads %g", e, (double)sg[e],
              (double)sum);
    }
    free(sh);
    free(sg);
    free(pq);
    free(pk);
    tk_problem_free(&t);
}

/* ---------------------------------------------------------------------------
 * Selection on hand-made score rows
 * ------------------------------------------------------------------------- */

/* One slice; selection from `scores` [rb, cb]; the layout must equal
 * expect_off [rb + 1] / expect_idx, with the capacity expect_cap. Also
 * checked against the builder and the naive selection. */
static void hand_case(const char *name, int64_t sq, int64_t sk, int32_t bq, int32_t bk,
                      int32_t k, int32_t sinks, int32_t local, int causal, const float *scores,
                      const int32_t *expect_off, const int32_t *expect_idx, int32_t expect_cap) {
    tk_problem t;
    tk_problem_init(&t, SK_BACKEND_CPU, SK_DTYPE_F32, 1, sq, sk, 1, 1, 8, bq, bk);
    t.desc.k = k;
    t.desc.sink_blocks = sinks;
    t.desc.local_blocks = local;
    t.desc.mask = causal ? SK_MASK_CAUSAL : SK_MASK_NONE;
    sk_grid grid;
    int32_t cap = -1;
    sk_status st = sk_topk_layout_capacity(&t.desc, &grid, &cap);
    REQUIRE(st == SK_STATUS_SUCCESS, "%s: %s", name, sk_last_error());
    CHECK(cap == expect_cap, "%s: capacity %d, expected %d", name, (int)cap, (int)expect_cap);
    const int32_t rb = (int32_t)((sq + bq - 1) / bq);
    int32_t *off = (int32_t *)malloc(((size_t)rb + 1) * 4);
    int32_t *idx = (int32_t *)malloc(((size_t)cap + 1) * 4);
    REQUIRE(off != NULL && idx != NULL, "no memory");
    for (int32_t i = 0; i <= rb; ++i) off[i] = -5;
    for (int32_t i = 0; i <= cap; ++i) idx[i] = -5;
    sk_bsr layout;
    memset(&layout, 0, sizeof layout);
    layout.row_offsets = off;
    layout.col_indices = idx;
    st = sk_layout_from_scores(&t.desc, scores, &layout, NULL, 0, NULL);
    REQUIRE(st == SK_STATUS_SUCCESS, "%s: %s %s", name, sk_status_name(st), sk_last_error());
    CHECK(layout.nnz == cap, "%s: nnz %d, capacity %d", name, (int)layout.nnz, (int)cap);
    CHECK(layout.grid.rows == sq && layout.grid.cols == sk && layout.grid.block_rows == bq &&
              layout.grid.block_cols == bk && layout.grid.batch == 1 && layout.grid.heads == 1,
          "%s: grid", name);
    for (int32_t i = 0; i <= rb; ++i)
        CHECK(off[i] == expect_off[i], "%s: row_offsets[%d] = %d, expected %d", name, (int)i,
              (int)off[i], (int)expect_off[i]);
    for (int32_t e = 0; e < expect_off[rb]; ++e)
        CHECK(idx[e] == expect_idx[e], "%s: col_indices[%d] = %d, expected %d", name, (int)e,
              (int)idx[e], (int)expect_idx[e]);
    CHECK(idx[cap] == -5, "%s: wrote past the capacity", name);
    CHECK(tk_layout_equals_builder(&t, scores, off, idx, name), "%s: differs from the builder",
          name);
    CHECK(tk_layout_equals_naive(&t, scores, off, idx, name), "%s: differs from the naive rule",
          name);
    free(off);
    free(idx);
    tk_problem_free(&t);
}

SK_TEST(topk_select_ties_go_to_the_lower_index) {
    const float s[6] = {1, 1, 1, 1, 1, 1};
    const int32_t off[2] = {0, 3}, idx[3] = {0, 1, 2};
    hand_case("all equal", 64, 6 * 64, 64, 64, 3, 0, 0, 0, s, off, idx, 3);
    const float s2[6] = {0.5f, 2, 0.5f, 2, 0.5f, 2};
    const int32_t idx2[3] = {1, 3, 5};
    hand_case("equal best", 64, 6 * 64, 64, 64, 3, 0, 0, 0, s2, off, idx2, 3);
    const int32_t off4[2] = {0, 4}, idx4[4] = {0, 1, 3, 5};
    hand_case("tie at the threshold", 64, 6 * 64, 64, 64, 4, 0, 0, 0, s2, off4, idx4, 4);
    /* -0 and +0 tie: the lower index wins. */
    const float s3[6] = {-1, -0.0f, 5, 0.0f, NAN, -INFINITY};
    const int32_t off3[2] = {0, 2}, idx3[2] = {1, 2};
    hand_case("signed zeros", 64, 6 * 64, 64, 64, 2, 0, 0, 0, s3, off3, idx3, 2);
    const float s4[6] = {-1, 0.0f, 5, -0.0f, NAN, -INFINITY};
    hand_case("signed zeros swapped", 64, 6 * 64, 64, 64, 2, 0, 0, 0, s4, off3, idx3, 2);
}

SK_TEST(topk_select_never_picks_nan_or_minus_inf) {
    const float s[5] = {NAN, -INFINITY, 1, NAN, 2};
    const int32_t off[2] = {0, 2}, idx[2] = {2, 4};
    hand_case("NaN and -inf", 64, 5 * 64, 64, 64, 4, 0, 0, 0, s, off, idx, 4);
    const float s2[4] = {1, INFINITY, 2, INFINITY};
    const int32_t off2[2] = {0, 1}, idx2[1] = {1};
    hand_case("+inf first", 64, 4 * 64, 64, 64, 1, 0, 0, 0, s2, off2, idx2, 1);
    const float s3[3] = {NAN, NAN, -INFINITY};
    const int32_t off3[2] = {0, 0};
    hand_case("nothing pickable", 64, 3 * 64, 64, 64, 2, 0, 0, 0, s3, off3, NULL, 2);
    const float s4[4] = {-FLT_MAX_TEST, -INFINITY, -3e38f, NAN};
    const int32_t off4[2] = {0, 2}, idx4[2] = {0, 2};
    hand_case("huge negatives are pickable", 64, 4 * 64, 64, 64, 3, 0, 0, 0, s4, off4, idx4, 3);
}

SK_TEST(topk_select_forced_blocks_are_kept_whatever_their_score) {
    /* 4 x 4 blocks, no causal: row i has diagonal block i. sinks 1, local 2. */
    const float s[16] = {NAN, 9, 8, -INFINITY,   /* row 0: forced {0}; local {0}; picks 1 */
                         -INFINITY, NAN, 3, 4,   /* row 1: forced {0, 1}; picks 3 */
                         5, 6, 7, NAN,           /* row 2: forced {0, 1, 2}; 3 is NaN */
                         1, 1, 1, 1};            /* row 3: forced {0, 2, 3}; picks 1 */
    const int32_t off[5] = {0, 2, 5, 8, 12};
    const int32_t idx[12] = {0, 1, 0, 1, 3, 0, 1, 2, 0, 1, 2, 3};
    /* bounds: 1 + min(1, 3) = 2; 2 + 1 = 3; 3 + 1 = 4 (real 3); 3 + 1 = 4 */
    hand_case("sinks and local", 4 * 64, 4 * 64, 64, 64, 1, 1, 2, 0, s, off, idx, 13);
    /* Sinks beyond the candidates (causal): row 0 has one candidate, row 1 two. */
    const float s2[4] = {0, 1, 2, 3};
    const int32_t off2[3] = {0, 1, 3}, idx2[3] = {0, 0, 1};
    hand_case("sinks clipped", 128, 128, 64, 64, 0, 5, 0, 1, s2, off2, idx2, 3);
}

SK_TEST(topk_select_causal_never_picks_a_block_without_a_causal_pair) {
    /* Sq = Sk = 256, blocks 64: row i sees blocks 0 .. i; future blocks score high. */
    float s[16];
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) s[i * 4 + j] = j > i ? 100.0f : (float)(j % 2);
    /* k = 2: row 0 {0}; row 1 {0, 1}; row 2 scores 0, 1, 0: 1, then 0 (tie
     * with 2); row 3 scores 0, 1, 0, 1: {1, 3}. */
    const int32_t off[5] = {0, 1, 3, 5, 7};
    const int32_t idx_k2[7] = {0, 0, 1, 0, 1, 1, 3};
    hand_case("causal square", 256, 256, 64, 64, 2, 0, 0, 1, s, off, idx_k2, 7);

    /* Sq > Sk: the first rows have no causal pair at all and stay empty. */
    float s2[8] = {1, 1, 1, 1, 1, 1, 1, 1}; /* 4 rows x 2 col blocks */
    const int32_t off2[5] = {0, 0, 0, 1, 3};
    const int32_t idx2[3] = {0, 0, 1};
    hand_case("causal Sq > Sk", 256, 128, 64, 64, 5, 1, 1, 1, s2, off2, idx2, 3);

    /* Sq < Sk with tails: Sq 100 (bq 64: 2 rows), Sk 300 (bk 128: 3 cols);
     * row 0's last query sits at key 263 (block 2), so all 3 are candidates. */
    const float s3[6] = {3, 2, 1, 1, 2, 3};
    const int32_t off3[3] = {0, 2, 4}, idx3[4] = {0, 1, 1, 2};
    hand_case("causal tails", 100, 300, 64, 128, 2, 0, 0, 1, s3, off3, idx3, 4);
}

SK_TEST(topk_select_k_larger_than_the_candidates_takes_them_all) {
    const float s[12] = {1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6};
    const int32_t off[3] = {0, 6, 12}, idx[12] = {0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5};
    hand_case("k > candidates", 128, 6 * 64, 64, 64, 100, 2, 3, 0, s, off, idx, 12);
    const int32_t off0[3] = {0, 0, 0};
    hand_case("k = 0, nothing forced", 128, 6 * 64, 64, 64, 0, 0, 0, 0, s, off0, NULL, 0);
}

/* ---------------------------------------------------------------------------
 * Random cases: builder and naive selection agree with the backend
 * ------------------------------------------------------------------------- */

SK_TEST(topk_select_random_matches_builder_and_naive) {
    tu_rng rng;
    tu_rng_seed(&rng, tu_base_seed() ^ 0x300);
    int cases = 0;
    for (int c = 0; c < 24; ++c) {
        tk_problem t;
        const int32_t bq = (c & 1) ? 64 : 128, bk = (c & 2) ? 64 : 128;
        const int64_t sq = tu_rng_range(&rng, 1, 700), sk = tu_rng_range(&rng, 1, 900);
        const int64_t hkv = tu_rng_range(&rng, 1, 2), group = tu_rng_range(&rng, 1, 3);
        tk_problem_init(&t, SK_BACKEND_CPU, SK_DTYPE_F32, tu_rng_range(&rng, 1, 2), sq, sk,
                        hkv * group, hkv, 8 * tu_rng_range(&rng, 1, 3), bq, bk);
        t.desc.k = (int32_t)tu_rng_range(&rng, 0, 6);
        t.desc.sink_blocks = (int32_t)tu_rng_range(&rng, 0, 2);
        t.desc.local_blocks = (int32_t)tu_rng_range(&rng, 0, 3);
        t.desc.mask = (c % 3) ? SK_MASK_CAUSAL : SK_MASK_NONE;
        t.desc.per_kv_head = (c % 4) == 3;
        float *pq, *pk;
        REQUIRE(tk_random_pooled(&t, &rng, c % 2 == 0, &pq, &pk), "no memory");
        char name[160];
        tk_describe(&t, name, sizeof name);
        cases += tk_check_select_cpu(&t, pq, pk, name);
        free(pq);
        free(pk);
        tk_problem_free(&t);
    }
    CHECK(cases == 24, "%d of 24 cases agreed", cases);
}

SK_TEST(topk_from_scores_random_with_specials_matches_builder_and_naive) {
    tu_rng rng;
    tu_rng_seed(&rng, tu_base_seed() ^ 0x400);
    for (int c = 0; c < 16; ++c) {
        tk_problem t;
        const int32_t bq = (c & 1) ? 64 : 128, bk = (c & 2) ? 64 : 128;
        tk_problem_init(&t, SK_BACKEND_CPU, SK_DTYPE_F16, 2, tu_rng_range(&rng, 1, 900),
                        tu_rng_range(&rng, 1, 1500), 3, 3, 8, bq, bk);
        t.desc.k = (int32_t)tu_rng_range(&rng, 0, 9);
        t.desc.sink_blocks = (int32_t)tu_rng_range(&rng, 0, 3);
        t.desc.local_blocks = (int32_t)tu_rng_range(&rng, 0, 2);
        t.desc.mask = (c & 4) ? SK_MASK_CAUSAL : SK_MASK_NONE;
        float *scores = tk_random_scores(&t, &rng, 0.2);
        REQUIRE(scores != NULL, "no memory");
        char name[160];
        tk_describe(&t, name, sizeof name);
        CHECK(tk_check_from_scores_cpu(&t, scores, name), "case %d: %s", c, name);
        free(scores);
        tk_problem_free(&t);
    }
}

SK_TEST(topk_capacity_is_the_sum_of_row_bounds) {
    tu_rng rng;
    tu_rng_seed(&rng, tu_base_seed() ^ 0x500);
    for (int c = 0; c < 40; ++c) {
        tk_problem t;
        tk_problem_init(&t, SK_BACKEND_CPU, SK_DTYPE_BF16, tu_rng_range(&rng, 1, 3),
                        tu_rng_range(&rng, 1, 2000), tu_rng_range(&rng, 1, 2000), 4, 2, 64,
                        (c & 1) ? 64 : 128, (c & 2) ? 64 : 128);
        t.desc.k = (int32_t)tu_rng_range(&rng, 0, 20);
        t.desc.sink_blocks = (int32_t)tu_rng_range(&rng, 0, 4);
        t.desc.local_blocks = (int32_t)tu_rng_range(&rng, 0, 5);
        t.desc.mask = (c & 4) ? SK_MASK_CAUSAL : SK_MASK_NONE;
        t.desc.per_kv_head = (c & 8) != 0;
        sk_grid grid;
        int32_t cap = -1;
        sk_status st = sk_topk_layout_capacity(&t.desc, &grid, &cap);
        REQUIRE(st == SK_STATUS_SUCCESS, "%s", sk_last_error());
        const int64_t expect = tk_naive_capacity(&t);
        char name[160];
        tk_describe(&t, name, sizeof name);
        CHECK(cap == expect, "%s: capacity %d, naive %lld", name, (int)cap, (long long)expect);
        CHECK(grid.heads == (t.desc.per_kv_head ? 2 : 4) && grid.batch == t.desc.batch &&
                  grid.rows == t.desc.seq_q && grid.cols == t.desc.seq_k &&
                  grid.block_rows == t.desc.block_q && grid.block_cols == t.desc.block_k,
              "%s: grid", name);
        tk_problem_free(&t);
    }
}

/* sk_topk_score_span against brute force over token positions
 * (tk_row_sets): the rows with a block to pick by score, and the hull of
 * those blocks, exactly. sk_pool_select_topk pools nothing outside them. */
SK_TEST(topk_score_span_is_the_hull_of_the_pickable_blocks) {
    tu_rng rng;
    tu_rng_seed(&rng, tu_base_seed() ^ 0x510);
    int nonempty = 0, narrower = 0;
    for (int c = 0; c < 60; ++c) {
        tk_problem t;
        tk_problem_init(&t, SK_BACKEND_CPU, SK_DTYPE_BF16, 1, tu_rng_range(&rng, 1, 2000),
                        tu_rng_range(&rng, 1, 2000), 4, 2, 64, (c & 1) ? 64 : 128,
                        (c & 2) ? 64 : 128);
        t.desc.k = (int32_t)tu_rng_range(&rng, 0, 6);
        t.desc.sink_blocks = (int32_t)tu_rng_range(&rng, 0, 4);
        t.desc.local_blocks = (int32_t)tu_rng_range(&rng, 0, 12);
        t.desc.mask = (c & 4) ? SK_MASK_CAUSAL : SK_MASK_NONE;
        sk_topk_problem p;
        tk_fill_problem(&t, &p);
        int32_t rows[2] = {-7, -7}, cols[2] = {-7, -7};
        sk_topk_score_span(&p, rows, cols);
        const int32_t cb = tk_col_blocks(&t);
        int32_t er[2], ec[2];
        REQUIRE(tk_score_span_naive(&t, er, ec), "no memory");
        const int any = er[1] > er[0];
        char name[160];
        tk_describe(&t, name, sizeof name);
        CHECK(rows[0] == er[0] && rows[1] == er[1] && cols[0] == ec[0] && cols[1] == ec[1],
              "%s: span rows [%d, %d) cols [%d, %d), brute force [%d, %d) [%d, %d)", name,
              (int)rows[0], (int)rows[1], (int)cols[0], (int)cols[1], (int)er[0], (int)er[1],
              (int)ec[0], (int)ec[1]);
        nonempty += any;
        narrower += any && (er[0] > 0 || ec[0] > 0 || ec[1] < cb);
        tk_problem_free(&t);
    }
    /* the draws must reach both kinds of case, or the check above is idle */
    CHECK(nonempty >= 20 && narrower >= 10, "%d non-empty spans, %d narrower than the grid",
          nonempty, narrower);
}

/* The row bounds of the last shape are kept per thread (summarize_rows in
 * src/core/topk.c): a shape that differs in any one field must not get the
 * previous shape's capacity. Each variant changes the capacity, so a stale
 * value fails the check. */
SK_TEST(topk_capacity_follows_every_field_of_the_shape) {
    enum { VARIANTS = 9 };
    for (int v = 0; v < VARIANTS; ++v) {
        tk_problem t[2];
        for (int i = 0; i < 2; ++i) {
            tk_problem_init(&t[i], SK_BACKEND_CPU, SK_DTYPE_BF16, 1, 1000, 1300, 4, 2, 64, 64, 128);
            t[i].desc.k = 5;
            t[i].desc.sink_blocks = 1;
            t[i].desc.local_blocks = 2;
            t[i].desc.mask = SK_MASK_CAUSAL;
        }
        sk_topk_desc *d = &t[1].desc;
        switch (v) {
        case 0: d->seq_q = 1100; break;
        case 1: d->seq_k = 1500; break;
        case 2: d->block_q = 128; break;
        case 3: d->block_k = 64; break;
        case 4: d->k = 7; break;
        case 5: d->sink_blocks = 3; break;
        case 6: d->local_blocks = 4; break;
        case 7: d->mask = SK_MASK_NONE; break;
        default: d->batch = 2; break;
        }
        const int64_t expect[2] = {tk_naive_capacity(&t[0]), tk_naive_capacity(&t[1])};
        CHECK(expect[0] != expect[1], "variant %d does not change the capacity", v);
        for (int call = 0; call < 4; ++call) { /* base, variant, base, variant */
            int32_t cap = -1;
            const sk_status st = sk_topk_layout_capacity(&t[call & 1].desc, NULL, &cap);
            CHECK(st == SK_STATUS_SUCCESS && cap == expect[call & 1],
                  "variant %d, call %d: capacity %d, naive %lld (%s)", v, call, (int)cap,
                  (long long)expect[call & 1], sk_last_error());
        }
        tk_problem_free(&t[0]);
        tk_problem_free(&t[1]);
    }
}

/* ---------------------------------------------------------------------------
 * sk_attention_topk = pool + select + attention; sk_pool_select_topk = pool +
 * select
 * ------------------------------------------------------------------------- */

SK_TEST(topk_attention_cpu_equals_its_steps) {
    for (int per_kv = 0; per_kv < 2; ++per_kv) {
        tk_problem t;
        tk_problem_init(&t, SK_BACKEND_CPU, SK_DTYPE_BF16, 2, 300, 333, 4, 2, 32, 64, 64);
        t.desc.k = 2;
        t.desc.sink_blocks = 1;
        t.desc.local_blocks = 1;
        t.desc.mask = SK_MASK_CAUSAL;
        t.desc.per_kv_head = per_kv;
        tu_rng rng;
        tu_rng_seed(&rng, tu_base_seed() ^ (0x600u + (unsigned)per_kv));
        REQUIRE(tk_problem_alloc_host(&t, &rng, TK_WITH_V), "no memory");
        char name[160];
        tk_describe(&t, name, sizeof name);
        CHECK(tk_check_attention_cpu(&t, name), "%s", name);
        tk_problem_free(&t);
    }
}
