/*
 * test_attention_random.c - seeded random cases against the CPU reference.
 *
 * Every combination of dtype {f16, bf16} x head_dim {64, 128} x block_q
 * {64, 128} x block_k {64, 128} x {full, causal} gets GT_VARIANTS random
 * cases (224 in all), each drawing: GQA ratio 1, 4 or 8; batch 1-3; Sq and
 * Sk aligned, with tails, tiny, equal or not (both ways); layout broadcast
 * over batch and heads (1 / Hkv / Hq); one block per row, a few, random
 * density or dense; empty rows; packed or padded strides ([B,S,H,D] and
 * [B,H,S,D]) per tensor; with or without LSE; default, positive or
 * negative scales; sharper softmax. The seed of each case derives from the
 * suite's seed (printed) and the case's position, and is printed on failure.
 * --quick keeps one small case per (dtype, head_dim, causal).
 */
#include <stdio.h>
#include <string.h>

#include "common/harness.h"
#include "common/test_util.h"
#include "gpu/gpu_util.h"

enum { GT_VARIANTS = 7 };

/* Work budget of one case: B * Hq * Sq * Sk * D (the CPU reference and the
 * fp64 pass are both that order). */
#define GT_CASE_WORK 3.0e8
#define GT_QUICK_WORK 4.0e6

static int64_t pick_len(tu_rng *rng, int32_t block, int quick) {
    const double r = tu_rng_uniform(rng);
    const int64_t max_len = quick ? 200 : 640;
    if (r < 0.3) { /* whole blocks */
        const int64_t n = tu_rng_range(rng, 1, max_len / block > 1 ? max_len / block : 1);
        return n * block;
    }
    if (r < 0.4) return tu_rng_range(rng, 1, 24); /* tiny */
    return tu_rng_range(rng, 1, max_len);        /* tails */
}

static void random_case(gt_case *c, tu_rng *rng, sk_dtype dtype, int64_t d, int32_t bq,
                        int32_t bk, int causal, int quick) {
    static const int groups[3] = {1, 4, 8};
    memset(c, 0, sizeof *c);
    c->dtype = dtype;
    c->head_dim = d;
    c->block_q = bq;
    c->block_k = bk;
    c->causal = causal;
    c->heads_kv = quick ? 1 : tu_rng_range(rng, 1, 2);
    c->heads_q = c->heads_kv * groups[tu_rng_range(rng, 0, 2)];
    c->batch = quick ? 1 : (tu_rng_uniform(rng) < 0.15 ? 3 : tu_rng_range(rng, 1, 2));
    c->seq_k = pick_len(rng, bk, quick);
    c->seq_q = tu_rng_uniform(rng) < 0.35 ? c->seq_k : pick_len(rng, bq, quick);
    const double budget = quick ? GT_QUICK_WORK : GT_CASE_WORK;
    while ((double)c->batch * c->heads_q * c->seq_q * c->seq_k * d > budget) {
        if (c->seq_q >= c->seq_k)
            c->seq_q = (c->seq_q + 1) / 2;
        else
            c->seq_k = (c->seq_k + 1) / 2;
    }
    c->layout_batch = (c->batch > 1 && tu_rng_uniform(rng) < 0.5) ? (int32_t)c->batch : 1;
    {
        const double r = tu_rng_uniform(rng);
        c->layout_heads = r < 0.3 ? 1 : r < 0.6 ? (int32_t)c->heads_kv : (int32_t)c->heads_q;
    }
    {
        const double r = tu_rng_uniform(rng);
        if (r < 0.2)
            c->k_per_row = 1;
        else if (r < 0.4)
            c->k_per_row = (int32_t)tu_rng_range(rng, 2, 4);
        else if (r < 0.6)
            c->density = 1.0;
        else
            c->density = 0.1 + 0.6 * tu_rng_uniform(rng);
    }
    c->empty_rows = tu_rng_uniform(rng) < 0.3 ? 0.2 : 0.0;
    for (int t = 0; t < 4; ++t) {
        const double r = tu_rng_uniform(rng);
        c->stride_mode[t] = r < 0.5 ? 0 : r < 0.75 ? 1 : 2;
    }
    c->with_lse = tu_rng_uniform(rng) < 0.85;
    {
        const double r = tu_rng_uniform(rng);
        c->scale = r < 0.8   ? 0.0f
                   : r < 0.9 ? (float)(0.02 + 0.28 * tu_rng_uniform(rng))
                             : (float)-(0.02 + 0.18 * tu_rng_uniform(rng));
    }
    c->q_amp = tu_rng_uniform(rng) < 0.3 ? 3.0f : 1.0f;
    c->seed = tu_rng_next(rng);
}

/* All block sizes x causal for one (dtype, head_dim). */
static void run_group(sk_dtype dtype, int64_t d, uint64_t salt) {
    tu_rng rng;
    tu_rng_seed(&rng, tu_base_seed() ^ salt);
    int run = 0, failed = 0;
    for (int combo = 0; combo < 8; ++combo) {
        const int32_t bq = combo & 1 ? 128 : 64, bk = combo & 2 ? 128 : 64;
        const int causal = (combo >> 2) & 1;
        for (int v = 0; v < GT_VARIANTS; ++v) {
            gt_case c;
            random_case(&c, &rng, dtype, d, bq, bk, causal, gt_opt.quick);
            /* quick: one small case per causal mode, blocks 64x128 and 128x64 */
            if (gt_opt.quick && !(v == 0 && (combo == 2 || combo == 5))) continue;
            failed += gt_run_case(&c) != 0;
            ++run;
        }
    }
    printf("    %d cases, %d failed\n", run, failed);
}

SK_TEST(gpu_random_f16_d64) { run_group(SK_DTYPE_F16, 64, 0x1001); }
SK_TEST(gpu_random_f16_d128) { run_group(SK_DTYPE_F16, 128, 0x1002); }
SK_TEST(gpu_random_bf16_d64) { run_group(SK_DTYPE_BF16, 64, 0x1003); }
SK_TEST(gpu_random_bf16_d128) { run_group(SK_DTYPE_BF16, 128, 0x1004); }
