/*
 * test_decode.c - the decode attention on the CPU backend (sparsek.h
 * "Decode") against the naive fp64 reference on each row's keys gathered
 * through the page table (tests/common/decode_case.h): random cases over
 * every option, then properties: the dense case equals a full layout,
 * bitwise repeats, plan + run equals the one-shot call, empty selections
 * give O = 0 and LSE = -inf, and a decode equals the paged forward with
 * len_q = q_len per sequence.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/decode_case.h"
#include "common/harness.h"
#include "common/test_util.h"
#include "sparsek.h"

/* Run a case on the CPU (plan + run when `split`, else one-shot). */
static sk_status run_case(const dc_case *c, dc_data *x, int split) {
    const sk_decode_desc d = dc_desc(c, x, SK_BACKEND_CPU);
    const sk_bsr *lay = c->block_k != 0 ? &x->layout : NULL;
    float *lse = c->with_lse ? x->lse : NULL;
    if (split) {
        const sk_status st = sk_decode_plan(&d, lay, x->seq_lens_k, x->table, NULL, 0, NULL);
        if (st != SK_STATUS_SUCCESS) return st;
        return sk_decode_run(&d, lay, x->seq_lens_k, x->table, x->q, x->k_cache, x->v_cache, x->o,
                             lse, NULL, 0, NULL);
    }
    return sk_decode(&d, lay, x->seq_lens_k, x->table, x->q, x->k_cache, x->v_cache, x->o, lse,
                     NULL, 0, NULL);
}

SK_TEST(decode_cpu_random_cases_match_naive) {
    const uint64_t base = tu_base_seed() + 3100;
    int64_t empty = 0;
    for (int i = 0; i < 60; ++i) {
        tu_rng rng;
        tu_rng_seed(&rng, base + (uint64_t)i);
        const dc_case c = dc_random_case(&rng, 4, i % 3 == 0 ? 700 : 150, 1);
        char label[512];
        dc_label(&c, base + (uint64_t)i, label, sizeof label);
        dc_data x;
        if (!dc_make(&c, &rng, &x)) {
            CHECK(0, "%s out of memory", label);
            dc_data_free(&x);
            continue;
        }
        const sk_status st = run_case(&c, &x, i % 2);
        CHECK(st == SK_STATUS_SUCCESS, "%s %s %s", label, sk_status_name(st), sk_last_error());
        if (st == SK_STATUS_SUCCESS) {
            dc_compare(&c, &x, x.o, c.with_lse ? x.lse : NULL, label, &empty);
            if (!c.with_lse)
                for (int64_t e = 0; e < x.lse_elems; ++e)
                    if (!isnan(x.lse[e])) {
                        CHECK(0, "%s LSE written without being asked for", label);
                        break;
                    }
        }
        dc_data_free(&x);
    }
    CHECK(empty > 0, "no case had an empty row (the generator should make some)");
}

/* A fixed GQA case: q_len 4, Hq/Hkv 8/2, D 64, page 16, block 16. */
static dc_case fixed_case(void) {
    static const int32_t lens[3] = {200, 3, 77};
    return dc_gqa_case(SK_DTYPE_BF16, 4, 8, 2, 64, 16, 16, lens);
}

/* Every block selected equals no layout, bit for bit; repeats are bitwise. */
SK_TEST(decode_cpu_full_layout_equals_dense_and_repeats) {
    tu_rng rng;
    tu_rng_seed(&rng, tu_base_seed() + 3200);
    dc_case c = fixed_case();
    dc_data x;
    REQUIRE(dc_make(&c, &rng, &x), "out of memory");
    const size_t ob = (size_t)x.q_elems * dc_elem_size(c.dtype), lb = (size_t)x.lse_elems * 4;
    void *o1 = malloc(ob);
    float *l1 = (float *)malloc(lb);
    if (o1 && l1) {
        sk_status st = run_case(&c, &x, 0);
        CHECK(st == SK_STATUS_SUCCESS, "%s", sk_last_error());
        dc_compare(&c, &x, x.o, x.lse, "[full layout]", NULL);
        memcpy(o1, x.o, ob);
        memcpy(l1, x.lse, lb);
        st = run_case(&c, &x, 1);
        CHECK(st == SK_STATUS_SUCCESS && memcmp(o1, x.o, ob) == 0 && memcmp(l1, x.lse, lb) == 0,
              "plan + run differs from the one-shot call");
        c.block_k = 0; /* the same keys, no layout */
        tu_fill_nan(x.o, c.dtype, x.q_elems);
        st = run_case(&c, &x, 0);
        CHECK(st == SK_STATUS_SUCCESS, "%s", sk_last_error());
        /* Block sizes differ (16 vs the dense 64): equal within the rule. */
        dc_compare(&c, &x, x.o, x.lse, "[dense]", NULL);
    } else {
        CHECK(0, "out of memory");
    }
    free(o1);
    free(l1);
    dc_data_free(&x);
}

/* An empty selection: O = 0 and LSE = -inf everywhere, NaN caches unread. */
SK_TEST(decode_cpu_empty_selection) {
    tu_rng rng;
    tu_rng_seed(&rng, tu_base_seed() + 3300);
    dc_case c = fixed_case();
    c.density = 0.0;
    dc_data x;
    REQUIRE(dc_make(&c, &rng, &x), "out of memory");
    REQUIRE(x.layout.nnz == 0, "nnz %d", (int)x.layout.nnz);
    const sk_status st = run_case(&c, &x, 0);
    CHECK(st == SK_STATUS_SUCCESS, "%s", sk_last_error());
    int64_t empty = 0;
    dc_compare(&c, &x, x.o, x.lse, "[empty]", &empty);
    CHECK(empty == c.batch * c.heads_q * c.q_len, "%lld empty rows", (long long)empty);
    dc_data_free(&x);
}

/* Decode = the paged forward with len_q = q_len per sequence and the same
 * selection per KV head (a varlen layout with one row per sequence). */
SK_TEST(decode_cpu_equals_paged_forward) {
    tu_rng rng;
    tu_rng_seed(&rng, tu_base_seed() + 3400);
    dc_case c = fixed_case();
    c.block_k = 64;
    c.density = 0.6;
    dc_data x;
    REQUIRE(dc_make(&c, &rng, &x), "out of memory");
    sk_status st = run_case(&c, &x, 0);
    CHECK(st == SK_STATUS_SUCCESS, "%s", sk_last_error());
    /* The paged call: Q packed [B * q_len, Hq, D] is the decode Q's rows
     * (its batch stride is q_len token strides: not padded here). */
    sk_attention_paged_desc pd;
    sk_attention_paged_desc_init(&pd, sizeof pd);
    pd.backend = SK_BACKEND_CPU;
    pd.dtype = c.dtype;
    pd.batch = c.batch;
    pd.total_q = c.batch * c.q_len;
    pd.max_seqlen_q = c.q_len;
    pd.max_seqlen_k = x.max_seqlen_k;
    pd.heads_q = c.heads_q;
    pd.heads_kv = c.heads_kv;
    pd.head_dim = c.head_dim;
    pd.mask = SK_MASK_CAUSAL;
    pd.num_pages = x.num_pages;
    pd.page_size = c.page_size;
    pd.max_pages = (int32_t)x.max_pages;
    pd.page_table_stride = x.table_stride;
    /* Varlen layout: heads slices of B rows (one block row per sequence). */
    int32_t cu_q[DC_MAXB + 1];
    for (int32_t b = 0; b <= c.batch; ++b) cu_q[b] = b * c.q_len;
    int32_t off[2 * DC_MAXB + 1], *idx = (int32_t *)malloc((size_t)(x.layout.nnz + 1) * 4);
    REQUIRE(idx != NULL, "out of memory");
    int32_t n = 0, r = 0;
    off[0] = 0;
    for (int32_t h = 0; h < c.heads_kv; ++h)
        for (int32_t b = 0; b < c.batch; ++b) {
            const int32_t s = b * (int32_t)c.heads_kv + h;
            for (int32_t e = x.layout.row_offsets[s]; e < x.layout.row_offsets[s + 1]; ++e)
                idx[n++] = x.layout.col_indices[e];
            off[++r] = n;
        }
    sk_bsr vl;
    vl.grid = tu_grid((int64_t)c.batch * 64, x.max_seqlen_k, 64, 64, 1, (int32_t)c.heads_kv);
    vl.nnz = n;
    vl.row_offsets = off;
    vl.col_indices = idx;
    const size_t ob = (size_t)x.q_elems * dc_elem_size(c.dtype);
    void *o2 = malloc(ob);
    float *l2 = (float *)malloc((size_t)x.lse_elems * 4);
    if (o2 && l2) {
        tu_fill_nan(o2, c.dtype, x.q_elems);
        st = sk_attention_paged_forward(&pd, &vl, cu_q, x.seq_lens_k, x.table, x.q, x.k_cache,
                                        x.v_cache, o2, l2, NULL, 0, NULL);
        CHECK(st == SK_STATUS_SUCCESS, "paged: %s", sk_last_error());
        CHECK(memcmp(o2, x.o, ob) == 0, "O differs from the paged forward's");
        /* LSE: paged [Hq, total_q], decode [B, Hq, q_len]. */
        int same = 1;
        for (int32_t b = 0; b < c.batch; ++b)
            for (int64_t h = 0; h < c.heads_q; ++h)
                for (int32_t t = 0; t < c.q_len; ++t) {
                    const float a = x.lse[(b * c.heads_q + h) * c.q_len + t];
                    const float p = l2[h * c.batch * c.q_len + b * c.q_len + t];
                    same &= memcmp(&a, &p, 4) == 0;
                }
        CHECK(same, "LSE differs from the paged forward's");
    } else {
        CHECK(0, "out of memory");
    }
    free(o2);
    free(l2);
    free(idx);
    dc_data_free(&x);
}
