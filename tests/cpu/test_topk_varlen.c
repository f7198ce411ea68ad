/*
 * test_topk_varlen.c - the top-k selection on varlen and paged inputs (CPU
 * backend) against the fixed selection run on each sequence alone
 * (tests/common/topk_varlen_case.c): empty sequences, tails, q_len < k_len,
 * GQA, per_kv_head, causal, sinks and local blocks, NaN scores; the paged
 * form for every page size equal to the packed one bit for bit (NaN in
 * every unused slot and page, garbage past each table row); the layout
 * accepted by the varlen forward; bad inputs (status, message naming the
 * argument, nothing written).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/harness.h"
#include "common/test_util.h"
#include "common/topk_varlen_case.h"
#include "sparsek.h"

enum { POISON = 0x7f7f7f7f };

/* The layout buffers of a case, poisoned. */
typedef struct tv_out {
    int32_t *off, *idx;
    int64_t n_off;
    int32_t cap;
    sk_bsr l;
} tv_out;

static int out_alloc(const tvc_case *c, tv_out *o) {
    const int32_t rows = tvc_rows(c);
    o->cap = tvc_capacity(c);
    o->n_off = (int64_t)(c->per_kv_head ? c->heads_kv : c->heads_q) * rows + 1;
    o->off = (int32_t *)malloc((size_t)o->n_off * sizeof(int32_t));
    o->idx = (int32_t *)malloc(((size_t)o->cap + 1) * sizeof(int32_t));
    if (rows < 1 || o->off == NULL || o->idx == NULL) return 0;
    for (int64_t i = 0; i < o->n_off; ++i) o->off[i] = POISON;
    for (int32_t i = 0; i <= o->cap; ++i) o->idx[i] = POISON;
    memset(&o->l, 0, sizeof o->l);
    o->l.row_offsets = o->off;
    o->l.col_indices = o->idx;
    return 1;
}

static void out_free(tv_out *o) {
    free(o->off);
    free(o->idx);
}

/* The bad-input and aliasing tests' case: two sequences, the second with
 * 40 queries over 90 keys (tails in both), and its poisoned layout. */
static int two_sequences(tvc_case *c, tv_out *o, uint64_t seed) {
    tvc_init(c);
    c->batch = 2;
    c->len_q[1] = 40;
    c->len_k[1] = 90;
    return tvc_make(c, seed) && out_alloc(c, o);
}

static sk_status run_case(const tvc_case *c, int paged, tv_out *o) {
    sk_topk_varlen_desc d;
    tvc_desc(c, SK_BACKEND_CPU, &d);
    if (paged)
        return sk_topk_paged_select(&d, c->cu_q, c->len_k, c->page_table, c->q, c->k_cache,
                                    &o->l, NULL, 0, NULL);
    return sk_topk_varlen_select(&d, c->cu_q, c->cu_k, c->q, c->k, &o->l, NULL, 0, NULL);
}

/* The case packed and, for every page size, paged: each equal to the
 * expected rows. Returns the failures. */
static int check_case(tvc_case *c, uint64_t seed, const char *name) {
    char why[256];
    int fails = 0;
    if (!tvc_make(c, seed)) {
        CHECK(0, "%s: allocation", name);
        tvc_free(c);
        return 1;
    }
    int32_t *exp_off = NULL, *exp_idx = NULL;
    if (!tvc_expected(c, &exp_off, &exp_idx, why)) {
        CHECK(0, "%s (seed %llu): %s", name, (unsigned long long)seed, why);
        tvc_free(c);
        return 1;
    }
    static const int32_t pages[5] = {0, 16, 32, 64, 128};
    for (int v = 0; v < 5; ++v) {
        const int paged = pages[v] != 0;
        if (paged) {
            tvc_free(c);
            c->page_size = pages[v];
            if (!tvc_make(c, seed)) {
                CHECK(0, "%s: allocation", name);
                ++fails;
                break;
            }
        }
        tv_out o;
        if (!out_alloc(c, &o)) {
            CHECK(0, "%s: allocation", name);
            out_free(&o);
            ++fails;
            break;
        }
        const sk_status st = run_case(c, paged, &o);
        CHECK(st == SK_STATUS_SUCCESS, "%s page_size %d (seed %llu): %s", name, (int)pages[v],
              (unsigned long long)seed, sk_last_error());
        if (st == SK_STATUS_SUCCESS) {
            const int same = tvc_compare(c, exp_off, exp_idx, o.off, o.idx, why);
            CHECK(same, "%s page_size %d (seed %llu): %s", name, (int)pages[v],
                  (unsigned long long)seed, why);
            fails += !same;
            CHECK(o.l.nnz == o.cap && o.l.grid.batch == 1 && o.l.grid.block_rows == c->bq &&
                      o.l.grid.cols == c->max_k && o.l.grid.rows == (int64_t)tvc_rows(c) * c->bq,
                  "%s: layout grid / nnz", name);
            for (int32_t e = o.off[o.n_off - 1]; e <= o.cap; ++e)
                if (o.idx[e] != POISON) {
                    CHECK(0, "%s: col_indices[%d] past the count was written", name, (int)e);
                    ++fails;
                    break;
                }
        } else {
            ++fails;
        }
        out_free(&o);
    }
    free(exp_off);
    free(exp_idx);
    tvc_free(c);
    return fails;
}

SK_TEST(topk_varlen_matches_fixed_per_sequence) {
    const uint64_t seed = tu_base_seed() ^ 0x7a11;
    static const char *const names[TVC_PRESETS] = {"gqa causal", "per_kv_head strided",
                                                   "bf16 nan"};
    tvc_case c;
    for (int i = 0; i < TVC_PRESETS; ++i) {
        tvc_preset(&c, i);
        check_case(&c, seed + (uint64_t)i, names[i]);
    }
    tu_rng rng;
    tu_rng_seed(&rng, seed + 3);
    for (int it = 0; it < 12; ++it) {
        tvc_random(&c, &rng, 600, it, 0);
        char name[64];
        snprintf(name, sizeof name, "random case %d", it);
        check_case(&c, seed + 10 + (uint64_t)it, name);
    }
}

/* The selected layout runs through the CPU varlen forward. */
SK_TEST(topk_varlen_layout_feeds_varlen_forward) {
    const uint64_t seed = tu_base_seed() ^ 0x7a12;
    tvc_case c;
    tvc_init(&c);
    c.batch = 3;
    const int32_t lq[3] = {100, 0, 70}, lk[3] = {200, 30, 150};
    memcpy(c.len_q, lq, sizeof lq);
    memcpy(c.len_k, lk, sizeof lk);
    c.heads_q = 2;
    c.causal = 1;
    c.sink_blocks = 1;
    REQUIRE(tvc_make(&c, seed), "allocation");
    tv_out o;
    REQUIRE(out_alloc(&c, &o), "allocation");
    REQUIRE(run_case(&c, 0, &o) == SK_STATUS_SUCCESS, "select: %s", sk_last_error());
    o.l.nnz = o.off[o.n_off - 1];
    sk_attention_varlen_desc a;
    sk_attention_varlen_desc_init(&a, sizeof a);
    a.backend = SK_BACKEND_CPU;
    a.dtype = SK_DTYPE_F32;
    a.batch = c.batch;
    a.total_q = c.total_q;
    a.total_k = c.total_k;
    a.max_seqlen_q = c.max_q;
    a.max_seqlen_k = c.max_k;
    a.heads_q = c.heads_q;
    a.heads_kv = c.heads_kv;
    a.head_dim = c.head_dim;
    a.mask = SK_MASK_CAUSAL;
    float *out = (float *)malloc((size_t)(c.total_q * c.heads_q * c.head_dim) * sizeof(float));
    REQUIRE(out != NULL, "allocation");
    const sk_status st = sk_attention_varlen_forward(&a, &o.l, c.cu_q, c.cu_k, c.q, c.k, c.k, out,
                                                     NULL, NULL, 0, NULL);
    CHECK(st == SK_STATUS_SUCCESS, "varlen forward on the selected layout: %s", sk_last_error());
    free(out);
    out_free(&o);
    tvc_free(&c);
}

/* One bad call: its status, a message naming `what`, nothing written. */
static void expect_bad(sk_status st, sk_status want, const char *what, const tv_out *o,
                       const char *label) {
    CHECK(st == want, "%s: status %d, expected %d (%s)", label, (int)st, (int)want,
          sk_last_error());
    CHECK(strstr(sk_last_error(), what) != NULL, "%s: message '%s' does not name '%s'", label,
          sk_last_error(), what);
    int untouched = 1;
    for (int64_t i = 0; i < o->n_off; ++i) untouched &= o->off[i] == POISON;
    for (int32_t i = 0; i <= o->cap; ++i) untouched &= o->idx[i] == POISON;
    CHECK(untouched, "%s: the layout was written", label);
}

SK_TEST(topk_varlen_bad_inputs) {
    const uint64_t seed = tu_base_seed() ^ 0x7a13;
    tvc_case c;
    tv_out o;
    REQUIRE(two_sequences(&c, &o, seed), "allocation");
    sk_topk_varlen_desc d;
    sk_status st;

    CHECK(sk_topk_varlen_select(NULL, c.cu_q, c.cu_k, c.q, c.k, &o.l, NULL, 0, NULL) ==
              SK_STATUS_BAD_PARAM_NULL_POINTER,
          "NULL desc");
    tvc_desc(&c, SK_BACKEND_CPU, &d);
    d.block_q = 96;
    st = sk_topk_varlen_select(&d, c.cu_q, c.cu_k, c.q, c.k, &o.l, NULL, 0, NULL);
    expect_bad(st, SK_STATUS_BAD_PARAM_VALUE, "block_q", &o, "block_q 96");
    tvc_desc(&c, SK_BACKEND_CPU, &d);
    d.k = -1;
    st = sk_topk_varlen_select(&d, c.cu_q, c.cu_k, c.q, c.k, &o.l, NULL, 0, NULL);
    expect_bad(st, SK_STATUS_BAD_PARAM_VALUE, "desc->k", &o, "k -1");
    tvc_desc(&c, SK_BACKEND_CPU, &d);
    d.total_k = 0;
    st = sk_topk_varlen_select(&d, c.cu_q, c.cu_k, c.q, c.k, &o.l, NULL, 0, NULL);
    expect_bad(st, SK_STATUS_BAD_PARAM_SHAPE, "total_k", &o, "total_k 0");
    tvc_desc(&c, SK_BACKEND_CPU, &d);
    d.max_seqlen_q = c.len_q[0] - 1; /* lengths past the declared maximum */
    st = sk_topk_varlen_select(&d, c.cu_q, c.cu_k, c.q, c.k, &o.l, NULL, 0, NULL);
    expect_bad(st, SK_STATUS_BAD_PARAM_SHAPE, "cu_seqlens_q", &o, "len_q > max_seqlen_q");
    tvc_desc(&c, SK_BACKEND_CPU, &d);
    int32_t bad_cu[3] = {0, 90, 80}; /* decreasing */
    st = sk_topk_varlen_select(&d, c.cu_q, bad_cu, c.q, c.k, &o.l, NULL, 0, NULL);
    expect_bad(st, SK_STATUS_BAD_PARAM_SHAPE, "cu_seqlens_k", &o, "decreasing cu_seqlens_k");
    st = sk_topk_varlen_select(&d, c.cu_q, NULL, c.q, c.k, &o.l, NULL, 0, NULL);
    expect_bad(st, SK_STATUS_BAD_PARAM_NULL_POINTER, "cu_seqlens_k", &o, "NULL cu_seqlens_k");
    st = sk_topk_varlen_select(&d, c.cu_q, c.cu_k, NULL, c.k, &o.l, NULL, 0, NULL);
    expect_bad(st, SK_STATUS_BAD_PARAM_NULL_POINTER, "q", &o, "NULL q");
    sk_bsr alias = o.l;
    alias.col_indices = (int32_t *)c.q; /* written over an input */
    st = sk_topk_varlen_select(&d, c.cu_q, c.cu_k, c.q, c.k, &alias, NULL, 0, NULL);
    expect_bad(st, SK_STATUS_BAD_PARAM_STRIDE, "layout->col_indices", &o, "aliased output");
    sk_bsr none = o.l;
    none.row_offsets = NULL;
    st = sk_topk_varlen_select(&d, c.cu_q, c.cu_k, c.q, c.k, &none, NULL, 0, NULL);
    expect_bad(st, SK_STATUS_BAD_PARAM_NULL_POINTER, "layout->row_offsets", &o, "NULL offsets");

    /* Paged. */
    tvc_desc(&c, SK_BACKEND_CPU, &d);
    d.page_size = 48;
    st = sk_topk_paged_select(&d, c.cu_q, c.len_k, c.page_table, c.q, c.k_cache, &o.l, NULL, 0,
                              NULL);
    expect_bad(st, SK_STATUS_BAD_PARAM_VALUE, "page_size", &o, "page_size 48");
    tvc_desc(&c, SK_BACKEND_CPU, &d);
    const int32_t saved = c.page_table[0];
    c.page_table[0] = (int32_t)c.num_pages; /* out of range */
    st = sk_topk_paged_select(&d, c.cu_q, c.len_k, c.page_table, c.q, c.k_cache, &o.l, NULL, 0,
                              NULL);
    expect_bad(st, SK_STATUS_BAD_PARAM_VALUE, "page_table[0][0]", &o, "page out of range");
    c.page_table[0] = saved;
    int32_t long_k[2] = {c.len_k[0], (int32_t)c.max_k + 1};
    st = sk_topk_paged_select(&d, c.cu_q, long_k, c.page_table, c.q, c.k_cache, &o.l, NULL, 0,
                              NULL);
    expect_bad(st, SK_STATUS_BAD_PARAM_SHAPE, "seq_lens_k[1]", &o, "len_k > max_seqlen_k");
    st = sk_topk_paged_select(&d, c.cu_q, c.len_k, NULL, c.q, c.k_cache, &o.l, NULL, 0, NULL);
    expect_bad(st, SK_STATUS_BAD_PARAM_NULL_POINTER, "page_table", &o, "NULL page table");
    d.max_pages = 1; /* max_seqlen_k past what a table row holds */
    d.page_size = 16;
    st = sk_topk_paged_select(&d, c.cu_q, c.len_k, c.page_table, c.q, c.k_cache, &o.l, NULL, 0,
                              NULL);
    expect_bad(st, SK_STATUS_BAD_PARAM_SHAPE, "max_seqlen_k", &o, "max_pages too small");

    /* The valid call still succeeds after all that. */
    CHECK(run_case(&c, 1, &o) == SK_STATUS_SUCCESS, "valid paged call: %s", sk_last_error());
    out_free(&o);
    tvc_free(&c);
}

/* The aliasing rule: each layout array placed over each input of both
 * calls is refused (BAD_PARAM_STRIDE, both named), and nothing is written
 * (the input keeps its bytes). */
SK_TEST(topk_varlen_aliasing) {
    const uint64_t seed = tu_base_seed() ^ 0x7a14;
    tvc_case c;
    tv_out o;
    REQUIRE(two_sequences(&c, &o, seed), "allocation");
    sk_topk_varlen_desc d;
    tvc_desc(&c, SK_BACKEND_CPU, &d);
    for (int paged = 0; paged < 2; ++paged) {
        const void *inputs[4] = {c.q, paged ? c.k_cache : c.k, c.cu_q,
                                 paged ? (const void *)c.page_table : (const void *)c.cu_k};
        const char *names[4] = {"q", paged ? "k_cache" : "k", "cu_seqlens_q",
                                paged ? "page_table" : "cu_seqlens_k"};
        for (int in = 0; in < 4; ++in)
            for (int out = 0; out < 2; ++out) {
                unsigned char before[16];
                memcpy(before, inputs[in], sizeof before);
                sk_bsr l = o.l;
                if (out == 0)
                    l.row_offsets = (int32_t *)inputs[in];
                else
                    l.col_indices = (int32_t *)inputs[in];
                const sk_status st =
                    paged ? sk_topk_paged_select(&d, c.cu_q, c.len_k, c.page_table, c.q,
                                                 c.k_cache, &l, NULL, 0, NULL)
                          : sk_topk_varlen_select(&d, c.cu_q, c.cu_k, c.q, c.k, &l, NULL, 0, NULL);
                char label[96];
                snprintf(label, sizeof label, "%s over %s (paged %d)",
                         out ? "col_indices" : "row_offsets", names[in], paged);
                expect_bad(st, SK_STATUS_BAD_PARAM_STRIDE, names[in], &o, label);
                CHECK(strstr(sk_last_error(), out ? "layout->col_indices" : "layout->row_offsets"),
                      "%s: message '%s'", label, sk_last_error());
                CHECK(memcmp(before, inputs[in], sizeof before) == 0, "%s: input written", label);
            }
    }
    out_free(&o);
    tvc_free(&c);
}
