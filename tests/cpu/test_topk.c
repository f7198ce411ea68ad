/*
 * test_topk.c - the CPU backend of the top-k block selection through the
 * public API: pooling against the naive fp64 means, the scoring through the
 * layouts it leads to (every k: each row's whole ranking) against the naive
 * fp64 scores, the layout capacity against the row rules found by brute
 * force, sk_attention_topk and sk_pool_select_topk against their steps.
 * The naive implementation is tests/common/topk_naive.c; the selection on
 * given scores is in test_topk_select.c, bad inputs in test_topk_errors.c,
 * the internal score span in test_topk_span.c.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/harness.h"
#include "common/test_util.h"
#include "common/topk_check.h"
#include "common/topk_naive.h"
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

/* sk_select_topk on the CPU for every k from 0 to the column blocks, no
 * forced block: the layouts give each row's whole ranking of its blocks,
 * which must be that of the naive fp64 scores (tk_layout_matches_naive_scores:
 * exact but for blocks whose scores lie within the tolerance rule of each
 * other). The CPU scores themselves never leave the library. */
static int ranks_as_naive_scores(tk_problem *t, const float *pq, const float *pk,
                                 const char *name) {
    int ok = 1;
    for (int32_t k = 0; ok && k <= tk_col_blocks(t); ++k) {
        t->desc.k = k;
        tk_layout_buf l;
        ok = tk_layout_buf_alloc(t, &l) &&
             sk_select_topk(&t->desc, pq, pk, &l.bsr, NULL, 0, NULL) == SK_STATUS_SUCCESS;
        if (!ok) printf("    %s, k %d: %s\n", name, (int)k, sk_last_error());
        ok = ok && tk_layout_sane(t, &l, name) &&
             tk_layout_matches_naive_scores(t, pq, pk, l.off, l.idx, name);
        if (!ok) printf("    %s: differs at k = %d\n", name, (int)k);
        tk_layout_buf_free(&l);
    }
    return ok;
}

/* Per query head and per KV head (group sums), with a positive and a
 * negative scale (a scale dropped or its sign lost reorders the blocks). */
SK_TEST(topk_scores_match_naive_loop) {
    for (int c = 0; c < 4; ++c) {
        const int per_kv = c & 1;
        tk_problem t;
        tk_problem_init(&t, SK_BACKEND_CPU, SK_DTYPE_F32, 2, 200, 300, 6, 2, 16, 64, 64);
        t.desc.per_kv_head = per_kv;
        t.desc.scale = (c & 2) ? -0.3f : 0.3f;
        tu_rng rng;
        tu_rng_seed(&rng, tu_base_seed() ^ (0x200u + (unsigned)c));
        float *pq, *pk;
        REQUIRE(tk_random_pooled(&t, &rng, 0, &pq, &pk), "no memory");
        char name[160];
        tk_describe(&t, name, sizeof name);
        CHECK(ranks_as_naive_scores(&t, pq, pk, name), "%s, scale %g: not the naive ranking",
              name, (double)t.desc.scale);
        free(pq);
        free(pk);
        tk_problem_free(&t);
    }
}

/* One score per KV head is the sum of its query heads' scores: with exact
 * (quantised) pooled blocks, sk_select_topk per KV head must give, for every
 * k, the layout that sk_layout_from_scores gives on the sums of the naive
 * per-query-head scores, ties included. */
SK_TEST(topk_per_kv_head_scores_are_group_sums) {
    enum { HEADS = 4, RB = 4, CB = 8 };
    tk_problem t;
    tk_problem_init(&t, SK_BACKEND_CPU, SK_DTYPE_F32, 1, RB * 64, CB * 64, HEADS, 1, 8, 64, 64);
    t.desc.scale = 0.5f; /* exact, like the quantised values */
    tu_rng rng;
    tu_rng_seed(&rng, tu_base_seed() ^ 0x250);
    float *pq, *pk;
    REQUIRE(tk_random_pooled(&t, &rng, 1, &pq, &pk), "no memory");
    float sums[RB * CB];
    for (int e = 0; e < RB * CB; ++e) {
        double a, sum = 0;
        for (int h = 0; h < HEADS; ++h) sum += tk_naive_score(&t, pq, pk, h, e / CB, e % CB, &a);
        sums[e] = (float)sum; /* exact */
    }
    t.desc.per_kv_head = 1;
    for (int32_t k = 0; k <= CB; ++k) {
        t.desc.k = k;
        tk_layout_buf from_pooled, from_sums;
        REQUIRE(tk_layout_buf_alloc(&t, &from_pooled) && tk_layout_buf_alloc(&t, &from_sums),
                "no memory");
        sk_status st = sk_select_topk(&t.desc, pq, pk, &from_pooled.bsr, NULL, 0, NULL);
        CHECK(st == SK_STATUS_SUCCESS, "k %d: %s", (int)k, sk_last_error());
        st = sk_layout_from_scores(&t.desc, sums, &from_sums.bsr, NULL, 0, NULL);
        CHECK(st == SK_STATUS_SUCCESS, "k %d: %s", (int)k, sk_last_error());
        const int32_t n = from_sums.off[RB];
        CHECK(n >= 0 && n <= from_sums.cap &&
                  memcmp(from_pooled.off, from_sums.off, (RB + 1) * 4) == 0 &&
                  memcmp(from_pooled.idx, from_sums.idx, (size_t)n * 4) == 0,
              "k %d: per-KV-head layout differs from the one on the sums of the heads' scores",
              (int)k);
        tk_layout_buf_free(&from_pooled);
        tk_layout_buf_free(&from_sums);
    }
    free(pq);
    free(pk);
    tk_problem_free(&t);
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

/* sk_attention_topk on the CPU equals pool + select + attention forward,
 * bitwise (O, LSE and the layout), and sk_pool_select_topk gives the same
 * layout. Needs TK_WITH_V. */
static int check_attention_cpu(const tk_problem *t, const char *name) {
    sk_attention_desc a;
    tk_attention_desc(t, &a);
    const sk_topk_desc *d = &t->desc;
    const int64_t no = d->batch * d->seq_q * d->heads_q * d->head_dim;
    const int64_t nl = d->batch * d->heads_q * d->seq_q;
    const size_t es = d->dtype == SK_DTYPE_F32 ? 4 : 2;
    void *o1 = malloc((size_t)no * es), *o2 = malloc((size_t)no * es);
    float *l1 = (float *)malloc((size_t)nl * 4), *l2 = (float *)malloc((size_t)nl * 4);
    float *pq = (float *)malloc((size_t)tk_pooled_q_len(t) * 4);
    float *pk = (float *)malloc((size_t)tk_pooled_k_len(t) * 4);
    tk_layout_buf la, lb, lc;
    if (o1 == NULL || o2 == NULL || l1 == NULL || l2 == NULL || pq == NULL || pk == NULL ||
        !tk_layout_buf_alloc(t, &la) || !tk_layout_buf_alloc(t, &lb) ||
        !tk_layout_buf_alloc(t, &lc))
        return 0;
    tu_fill_nan(o1, d->dtype, no);
    tu_fill_nan(o2, d->dtype, no);
    tu_fill_nan(l1, SK_DTYPE_F32, nl);
    tu_fill_nan(l2, SK_DTYPE_F32, nl);
    int ok = 1;
    sk_status st = sk_attention_topk(&a, d, t->q, t->k, t->v, o1, l1, &la.bsr, NULL, 0, NULL);
    if (st != SK_STATUS_SUCCESS) {
        printf("    %s: sk_attention_topk: %s\n", name, sk_last_error());
        ok = 0;
    }
    st = sk_block_pool(d, t->q, t->k, pq, pk, NULL);
    if (st == SK_STATUS_SUCCESS) st = sk_select_topk(d, pq, pk, &lb.bsr, NULL, 0, NULL);
    sk_bsr real = lb.bsr;
    real.nnz = lb.off[lb.rows];
    if (st == SK_STATUS_SUCCESS)
        st = sk_attention_forward(&a, &real, t->q, t->k, t->v, o2, l2, NULL, 0, NULL);
    if (st != SK_STATUS_SUCCESS) {
        printf("    %s: steps: %s\n", name, sk_last_error());
        ok = 0;
    }
    size_t ps_bytes = 1;
    st = sk_pool_select_topk_workspace_size(d, &ps_bytes);
    if (st == SK_STATUS_SUCCESS && ps_bytes != 0) st = SK_STATUS_INTERNAL_ERROR;
    if (st == SK_STATUS_SUCCESS) st = sk_pool_select_topk(d, t->q, t->k, &lc.bsr, NULL, 0, NULL);
    if (st != SK_STATUS_SUCCESS) {
        printf("    %s: sk_pool_select_topk (workspace %zu bytes): %s\n", name, ps_bytes,
               sk_last_error());
        ok = 0;
    }
    if (ok) {
        ok &= tk_layout_sane(t, &la, name);
        ok &= memcmp(la.off, lb.off, ((size_t)la.rows + 1) * 4) == 0;
        ok &= memcmp(la.idx, lb.idx, (size_t)la.cap * 4) == 0;
        ok &= memcmp(lc.off, lb.off, ((size_t)lc.rows + 1) * 4) == 0;
        ok &= memcmp(lc.idx, lb.idx, (size_t)lc.cap * 4) == 0 && lc.bsr.nnz == lb.bsr.nnz;
        ok &= memcmp(o1, o2, (size_t)no * es) == 0;
        ok &= memcmp(l1, l2, (size_t)nl * 4) == 0;
        int64_t nan_o = 0;
        for (int64_t e = 0; e < no; ++e) nan_o += isnan(tu_load(o1, d->dtype, e));
        if (nan_o != 0) {
            printf("    %s: %lld NaN outputs\n", name, (long long)nan_o);
            ok = 0;
        }
        if (!ok) printf("    %s: sk_attention_topk differs from its steps\n", name);
    }
    free(o1);
    free(o2);
    free(l1);
    free(l2);
    free(pq);
    free(pk);
    tk_layout_buf_free(&la);
    tk_layout_buf_free(&lb);
    tk_layout_buf_free(&lc);
    return ok;
}

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
        CHECK(check_attention_cpu(&t, name), "%s", name);
        tk_problem_free(&t);
    }
}
