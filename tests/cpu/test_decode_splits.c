/*
 * test_decode_splits.c - the decode's split-KV count and workspace (host
 * logic of src/core/decode.c and src/cuda/decode/decode.cu): the split
 * rule's two variants on issue 31's rows (docs/perf/decode.md, "The
 * per-call fixed cost"), forced counts, the switch's default, and the
 * CUDA workspace size (the splits' partials) where the library is built
 * with CUDA (no device is needed: the split count falls
 * back to 264 CTA slots, or reads the device that is present).
 */
#include <stdio.h>
#include <string.h>

#include "common/harness.h"
#include "core/decode.h"
#include "sparsek.h"

/* A checked-looking problem for sk_decode_split_count: only the fields
 * the rule reads. blocks_per_row 0: dense. */
static sk_decode_problem split_problem(int64_t batch, int64_t hkv, int64_t context,
                                       int64_t blocks_per_row) {
    sk_decode_problem dp;
    memset(&dp, 0, sizeof dp);
    sk_attention_problem *p = &dp.paged.v.flat;
    dp.paged.v.batch = (int32_t)batch;
    dp.paged.v.max_seqlen_k = context;
    p->heads_kv = hkv;
    p->heads_q = 32;
    dp.q_len = 1;
    dp.dense = blocks_per_row == 0;
    if (!dp.dense) {
        p->block_k = 64;
        p->col_blocks = (int32_t)(context / 64);
        p->layout_batch = (int32_t)batch;
        p->layout_heads = (int32_t)hkv;
        p->nnz = (int32_t)(batch * hkv * blocks_per_row);
    }
    return dp;
}

SK_TEST(decode_split_rule_rows) {
    /* Issue 31's rows on 264 CTA slots (an H100 SXM: 132 SMs x 2). */
    static const struct {
        int64_t batch, hkv, context, blocks; /* blocks 0: dense */
        int32_t rule1, rule2;
    } rows[] = {
        {1, 8, 131072, 0, 33, 33},  /* 3972 keys a split at 264 CTAs: >= 2048 */
        {1, 4, 131072, 0, 66, 33},  /* 1986 < 2048: one CTA per SM (132 / 4) */
        {8, 8, 131072, 0, 4, 4},    {8, 4, 131072, 0, 8, 8},    {32, 8, 32768, 0, 1, 1},
        {32, 4, 32768, 0, 2, 2},    {128, 8, 4096, 0, 1, 1},    {128, 4, 4096, 0, 1, 1},
        {2, 8, 32768, 0, 16, 16},   /* 2048 keys a split: fills both slots */
        {8, 8, 131072, 67, 4, 4},   /* the sparse row: 67 blocks of 64 per row */
        {8, 4, 131072, 67, 8, 8},   /* a layout's row: rule 2 as rule 1 */
        {8, 4, 131072, 20, 5, 5},   /* 1280 selected keys: >= 256 a split */
        {1, 8, 8192, 0, 32, 16},    /* short dense: one CTA per SM, >= 256 keys */
        {1, 8, 8192, 4, 1, 1},      /* 256 selected keys: one split */
        {1, 1, 100, 0, 1, 1},       /* fewer keys than one split: 1, never 0 */
        {1, 1, 1 << 30, 0, 128, 128} /* capped at SK_DECODE_MAX_SPLITS */
    };
    CHECK(sk_decode_get_split_rule() == 2, "the default rule is %d", sk_decode_get_split_rule());
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; ++i) {
        const sk_decode_problem dp =
            split_problem(rows[i].batch, rows[i].hkv, rows[i].context, rows[i].blocks);
        for (int rule = 1; rule <= 2; ++rule) {
            sk_decode_set_split_rule(rule);
            const int32_t got = sk_decode_split_count(&dp, 1, 264, 132);
            const int32_t want = rule == 1 ? rows[i].rule1 : rows[i].rule2;
            CHECK(got == want, "B %lld, Hkv %lld, %lld keys, %lld blocks, rule %d: %d splits, want %d",
                  (long long)rows[i].batch, (long long)rows[i].hkv, (long long)rows[i].context,
                  (long long)rows[i].blocks, rule, (int)got, (int)want);
        }
    }
    sk_decode_set_split_rule(2);
    /* Row groups count as CTAs; a forced count wins over either rule. */
    sk_decode_problem dp = split_problem(1, 8, 131072, 0);
    CHECK(sk_decode_split_count(&dp, 2, 264, 132) == 16, "two row groups: %d",
          (int)sk_decode_split_count(&dp, 2, 264, 132));
    CHECK(sk_decode_split_count(&dp, 1, 108, 108) == 13, "an A100's 108 slots: %d",
          (int)sk_decode_split_count(&dp, 1, 108, 108));
    dp = split_problem(1, 4, 131072, 0); /* 1986 keys a split at 66: one CTA per SM */
    CHECK(sk_decode_split_count(&dp, 1, 264, 132) == 33, "B 1, Hkv 4: %d",
          (int)sk_decode_split_count(&dp, 1, 264, 132));
    CHECK(sk_decode_split_count(&dp, 1, 228, 114) == 57, "114 SMs (2299 keys a split): %d",
          (int)sk_decode_split_count(&dp, 1, 228, 114));
    dp = split_problem(1, 8, 131072, 0);
    dp.num_splits = 7;
    for (int rule = 1; rule <= 2; ++rule) {
        sk_decode_set_split_rule(rule);
        CHECK(sk_decode_split_count(&dp, 1, 264, 132) == 7, "forced 7, rule %d", rule);
    }
    sk_decode_set_split_rule(2);
}

/* The CUDA workspace: partial O and LSE (fp32) for every split and row
 * (plus 256 bytes of slack, decode.cu); 0 for one split. */
SK_TEST(decode_cuda_workspace_size_holds_the_partials) {
    static const struct {
        int64_t batch, q_len, hq, hkv, d, context;
        int32_t splits;
    } cases[] = {{1, 1, 32, 8, 128, 131072, 33}, {3, 4, 32, 4, 64, 5000, 7},
                 {2, 16, 16, 2, 128, 4096, 2},   {5, 2, 8, 8, 64, 1000, 1},
                 {1, 3, 6, 6, 128, 300, 128}};
    int checked = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        sk_decode_desc d;
        REQUIRE(sk_decode_desc_init(&d, sizeof d) == SK_STATUS_SUCCESS, "%s", sk_last_error());
        d.backend = SK_BACKEND_CUDA;
        d.dtype = SK_DTYPE_BF16;
        d.batch = cases[i].batch;
        d.q_len = cases[i].q_len;
        d.heads_q = cases[i].hq;
        d.heads_kv = cases[i].hkv;
        d.head_dim = cases[i].d;
        d.max_seqlen_k = cases[i].context;
        d.page_size = 64;
        d.max_pages = (int32_t)((cases[i].context + 63) / 64);
        d.num_pages = d.batch * d.max_pages;
        d.num_splits = cases[i].splits;
        int32_t splits = 0;
        const sk_status st = sk_decode_splits(&d, NULL, &splits);
        if (st == SK_STATUS_NOT_SUPPORTED_BACKEND) continue; /* built without CUDA */
        REQUIRE(st == SK_STATUS_SUCCESS, "%s", sk_last_error());
        CHECK(splits == cases[i].splits, "case %zu: %d splits", i, (int)splits);
        const int64_t partial_rows = d.batch * d.heads_q * d.q_len * splits;
        const size_t want = splits == 1 ? 0 : (size_t)(partial_rows * (d.head_dim + 1) * 4 + 256);
        size_t bytes = 1;
        REQUIRE(sk_decode_workspace_size(&d, NULL, &bytes) == SK_STATUS_SUCCESS, "%s",
                sk_last_error());
        CHECK(bytes == want, "case %zu: %zu bytes, want %zu", i, bytes, want);
        ++checked;
    }
    if (checked == 0) printf("    (built without CUDA: the workspace sizes were not checked)\n");
}
