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
 * negative scales; sharper softmax (the draw: gt_case_random, gpu_util.c,
 * which the backward's random cases share). The seed of each case derives from the
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
            gt_case_random(&c, &rng, dtype, d, bq, bk, causal, gt_opt.quick,
                           gt_opt.quick ? GT_QUICK_WORK : GT_CASE_WORK);
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
