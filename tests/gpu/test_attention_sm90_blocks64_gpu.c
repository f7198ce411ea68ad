/*
 * test_attention_sm90_blocks64_gpu.c - the Hopper forward with blocks of 64
 * (issue 28; src/cuda/attention/fwd_sm90_pair.cuh and the _k64 kernels)
 * against the CPU reference, on the shapes that stress what is new: pairs
 * of 64-row query blocks (an odd number of query blocks, so the last pair
 * has no partner; query and key tails; rows of a pair that select
 * different blocks, one of them nothing), key blocks of 64 (Sk not a
 * multiple of 64, causal diagonals inside a 64-key block), every (block_q,
 * block_k) in {64, 128}^2, f16 / bf16, D 64 / 128, causal or not. Each case
 * goes through gt_run_case: NaN in unselected K/V blocks and past the
 * sequences, NaN-poisoned O / LSE, two runs compared bitwise. Under
 * `--backend sm90` the Hopper kernel is forced; under `cuda` it is the
 * dispatch's choice on an SM90 device.
 *   build/sk_gpu_tests --backend sm90 blocks64
 * Also: the carry-in (context parallel's remote pass) is not offered for
 * block_q = 64, and offered for block_q = 128 with block_k = 64.
 */
#include <stdio.h>
#include <string.h>

#include "common/harness.h"
#include "common/test_util.h"
#include "core/attention_internal.h" /* sk_attention_carry_supported */
#include "gpu/gpu_util.h"

static gt_case b64_case(sk_dtype dtype, int64_t d, int32_t bq, int32_t bk, int causal,
                        int64_t sq, int64_t sk, uint64_t salt) {
    gt_case c;
    memset(&c, 0, sizeof c);
    c.dtype = dtype;
    c.batch = 2;
    c.seq_q = sq;
    c.seq_k = sk;
    c.heads_q = 4;
    c.heads_kv = 2;
    c.head_dim = d;
    c.block_q = bq;
    c.block_k = bk;
    c.causal = causal;
    c.layout_batch = 2;
    c.layout_heads = 4; /* a row per (batch, head): partners differ */
    c.k_per_row = 2;    /* 2 random blocks a row: the two rows of a pair differ */
    c.empty_rows = 0.3; /* one row of a pair empty, or both */
    c.with_lse = 1;
    c.q_amp = 3.0f;
    c.seed = tu_base_seed() ^ salt;
    return c;
}

/* Every block combination x dtype x head dim x causal, on two shapes: Sq
 * 265 (5 query blocks of 64: the last pair alone, a tail of 9 rows; 3 of
 * 128) over Sk 481 (a key tail of 33), and Sq 448 (7 blocks of 64, no tail)
 * over Sk 130 (Sq > Sk: causal rows with no key). */
SK_TEST(gpu_blocks64_pairs) {
    int run = 0, failed = 0;
    for (int combo = 0; combo < 32; ++combo) {
        const int32_t bq = combo & 1 ? 128 : 64, bk = combo & 2 ? 128 : 64;
        const sk_dtype dt = combo & 4 ? SK_DTYPE_BF16 : SK_DTYPE_F16;
        const int64_t d = combo & 8 ? 128 : 64;
        const int causal = (combo >> 4) & 1;
        for (int shape = 0; shape < 2; ++shape) {
            if (gt_opt.quick && (combo % 5 != 0 || shape == 1)) continue;
            const gt_case c = b64_case(dt, d, bq, bk, causal, shape ? 448 : 265,
                                       shape ? 130 : 481, 0xb640u + 2u * combo + shape);
            failed += gt_run_case(&c) != 0;
            ++run;
        }
    }
    printf("    %d cases, %d failed\n", run, failed);
}

/* Layout rows shared by a pair's halves or not, dense rows, GQA 4 with a
 * per-KV-head layout, and a selection so sparse that most pairs have one
 * empty half: blocks 64 x 64 and 64 x 128. */
SK_TEST(gpu_blocks64_layouts) {
    int run = 0, failed = 0;
    for (int k = 0; k < 8; ++k) {
        if (gt_opt.quick && k % 3 != 0) continue;
        const int32_t bk = k & 1 ? 128 : 64;
        gt_case c = b64_case(k & 2 ? SK_DTYPE_BF16 : SK_DTYPE_F16, 128, 64, bk, (k >> 1) & 1,
                             64 * 9 + 40, 64 * 11 + 5, 0xb64f0u + (uint64_t)k);
        switch (k >> 2) {
        case 0: /* dense rows: both halves select every visible block */
            c.k_per_row = 0;
            c.density = 1.0;
            c.empty_rows = 0.0;
            break;
        default: /* GQA 4, one layout row per KV head, one block a row, many empty */
            c.heads_q = 8;
            c.heads_kv = 2;
            c.layout_heads = 2;
            c.k_per_row = 1;
            c.empty_rows = 0.6;
            break;
        }
        failed += gt_run_case(&c) != 0;
        ++run;
    }
    printf("    %d cases, %d failed\n", run, failed);
}

/* Context parallelism's carry-in and parts run on the Hopper kernel only;
 * pairs of 64-row query blocks take neither, so block_q = 64 must not be
 * offered them (sk_attention_carry_supported), block_q = 128 with block_k
 * 64 must, wherever block_q = block_k = 128 is. */
SK_TEST(gpu_blocks64_carry_offer) {
    int offered[3] = {0, 0, 0};
    static const int32_t blocks[3][2] = {{128, 128}, {128, 64}, {64, 64}};
    for (int i = 0; i < 3; ++i) {
        const gt_case c = b64_case(SK_DTYPE_BF16, 128, blocks[i][0], blocks[i][1], 1, 256, 256,
                                   0xb64c0u + (uint64_t)i);
        gt_inst x;
        REQUIRE(gt_inst_create(&x, &c, 0) == 0, "setup");
        sk_attention_desc d;
        gt_inst_desc(&x, SK_BACKEND_CUDA, &d);
        const sk_status st = sk_attention_carry_supported(&d, &x.layout, &offered[i]);
        CHECK(st == SK_STATUS_SUCCESS, "blocks %d x %d: %s %s", (int)blocks[i][0],
              (int)blocks[i][1], sk_status_name(st), sk_last_error());
        gt_inst_destroy(&x);
    }
    if (!offered[0]) {
        printf("    no Hopper kernel here: carry-in offered for none\n");
        CHECK(!offered[1] && !offered[2], "offered %d %d without the Hopper kernel", offered[1],
              offered[2]);
        return;
    }
    CHECK(offered[1], "block_q 128, block_k 64: carry-in not offered");
    CHECK(!offered[2], "block_q 64: carry-in offered (pairs take none)");
}
