/*
 * test_topk_select.c - the CPU top-k selection (sk_layout_from_scores,
 * sk_select_topk): hand-made score rows with the layout they must give
 * (ties, NaN and -inf, forced blocks, causal candidates, k beyond the
 * candidates), then random cases against the host builder
 * sk_layout_create_topk and the naive selection of tests/common.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/harness.h"
#include "common/test_util.h"
#include "common/topk_check.h"
#include "common/topk_naive.h"
#include "sparsek.h"

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
    const float s4[4] = {-FLT_MAX, -INFINITY, -3e38f, NAN};
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

/* sk_select_topk on the CPU from pooled Q/K: a sane layout, the naive
 * selection on the naive fp64 scores (tk_layout_matches_naive_scores), and
 * with exact inputs (quantised: the naive fp32 scores are the library's,
 * bit for bit) the host builder and the naive selection on those scores. */
static int check_select_cpu(const tk_problem *t, const float *pq, const float *pk, int exact,
                            const char *name) {
    tk_layout_buf l;
    float *scores = (float *)malloc((size_t)tk_total_rows(t) * tk_col_blocks(t) * 4);
    if (scores == NULL || !tk_layout_buf_alloc(t, &l)) {
        free(scores);
        return 0;
    }
    int ok = sk_select_topk(&t->desc, pq, pk, &l.bsr, NULL, 0, NULL) == SK_STATUS_SUCCESS;
    if (!ok) printf("    %s: %s\n", name, sk_last_error());
    ok = ok && tk_layout_sane(t, &l, name);
    ok = ok && tk_layout_matches_naive_scores(t, pq, pk, l.off, l.idx, name);
    if (ok && exact) {
        tk_naive_scores(t, pq, pk, scores);
        ok &= tk_layout_equals_builder(t, scores, l.off, l.idx, name);
        ok &= tk_layout_equals_naive(t, scores, l.off, l.idx, name);
    }
    free(scores);
    tk_layout_buf_free(&l);
    return ok;
}

/* sk_layout_from_scores on the CPU: a sane layout, the host builder's and
 * the naive selection's on the same scores. */
static int check_from_scores_cpu(const tk_problem *t, const float *scores, const char *name) {
    tk_layout_buf l;
    if (!tk_layout_buf_alloc(t, &l)) return 0;
    sk_status st = sk_layout_from_scores(&t->desc, scores, &l.bsr, NULL, 0, NULL);
    if (st != SK_STATUS_SUCCESS) {
        printf("    %s: %s\n", name, sk_last_error());
        tk_layout_buf_free(&l);
        return 0;
    }
    int ok = tk_layout_sane(t, &l, name);
    ok &= tk_layout_equals_builder(t, scores, l.off, l.idx, name);
    ok &= tk_layout_equals_naive(t, scores, l.off, l.idx, name);
    tk_layout_buf_free(&l);
    return ok;
}

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
        cases += check_select_cpu(&t, pq, pk, c % 2 == 0, name);
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
        CHECK(check_from_scores_cpu(&t, scores, name), "case %d: %s", c, name);
        free(scores);
        tk_problem_free(&t);
    }
}
