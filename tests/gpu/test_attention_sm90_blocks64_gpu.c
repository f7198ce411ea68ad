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
 * block_q = 64, and offered for block_q = 128 with block_k = 64, where a
 * split run (pass A, then pass B carried in) gives the reference result.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/harness.h"
#include "common/test_util.h"
#include "core/attention_internal.h" /* sk_attention_carry_supported */
#include "gpu/gpu_util.h"

static gt_case b64_case(sk_dtype dtype, int64_t d, int32_t bq, int32_t bk, int causal,
                        int64_t sq, int64_t sk, uint64_t salt) {
    /* B 2, Hq 4 over Hkv 2, a layout row per (batch, head) so that partner
     * rows differ; 2 random blocks a row, 30 % of the rows empty (one row of
     * a pair empty, or both); a sharper softmax. */
    const gt_case c = {.dtype = dtype, .batch = 2, .seq_q = sq, .seq_k = sk, .heads_q = 4,
                       .heads_kv = 2, .head_dim = d, .block_q = bq, .block_k = bk,
                       .causal = causal, .layout_batch = 2, .layout_heads = 4, .k_per_row = 2,
                       .empty_rows = 0.3, .with_lse = 1, .q_amp = 3.0f,
                       .seed = tu_base_seed() ^ salt};
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

    /* Forced anyway: the Hopper backend declines, says why, writes nothing. */
    const gt_case c = b64_case(SK_DTYPE_F16, 64, 64, 64, 0, 200, 300, 0xb64c8u);
    gt_inst x;
    REQUIRE(gt_inst_create(&x, &c, 0) == 0, "setup");
    sk_attention_desc d;
    gt_inst_desc(&x, SK_BACKEND_CUDA_SM90, &d);
    float *carry = gt_device_alloc((size_t)x.lse_elems * 4);
    REQUIRE(carry != NULL, "memory");
    CHECK(gt_upload(carry, x.lse_nan, (size_t)x.lse_elems * 4) == 0, "upload");
    sk_status st = sk_attention_plan(&d, &x.dlayout, x.dws, x.ws_bytes, NULL);
    CHECK(st == SK_STATUS_SUCCESS, "plan: %s %s", sk_status_name(st), sk_last_error());
    CHECK(gt_inst_poison_outputs(&x) == 0, "upload");
    st = sk_attention_run_carry(&d, &x.dlayout, x.dq, x.dk, x.dv, x.dout, x.dlse, carry, x.dws,
                                x.ws_bytes, NULL);
    CHECK(st == SK_STATUS_NOT_SUPPORTED, "carry-in at block_q 64: %s", sk_status_name(st));
    CHECK(strstr(sk_last_error(), "block_q 64") != NULL, "message: %s", sk_last_error());
    CHECK(gt_sync() == 0 && gt_inst_outputs_untouched(&x), "outputs written on decline");
    gt_device_free(carry);
    gt_inst_destroy(&x);
}

/* The carry-in kernel with key blocks of 64 (block_q 128): each row's
 * blocks split in two layouts, A's forward, then B's run carried in from
 * A's O and LSE, must give the whole layout's attention (the CPU
 * reference, within the tolerance rule). Context parallelism uses square
 * blocks, so this is where that kernel runs. */
SK_TEST(gpu_blocks64_carry_k64) {
    gt_case c = b64_case(SK_DTYPE_BF16, 128, 128, 64, 1, 300, 500, 0xb64d0u);
    c.k_per_row = 5;
    c.empty_rows = 0.2;
    gt_inst x;
    REQUIRE(gt_inst_create(&x, &c, 1) == 0, "setup");
    REQUIRE(gt_inst_cpu_reference(&x) == SK_STATUS_SUCCESS, "CPU reference: %s", sk_last_error());
    sk_attention_desc d;
    gt_inst_desc(&x, gt_opt.backend, &d);
    int offered = 0;
    if (sk_attention_carry_supported(&d, &x.layout, &offered) != SK_STATUS_SUCCESS || !offered) {
        printf("    no Hopper kernel here: carry-in not run\n");
        gt_inst_destroy(&x);
        return;
    }
    /* A: the first half of each row's blocks; B: the rest. */
    const int64_t rows = (int64_t)x.slices * x.rb;
    const int32_t *ro = x.layout.row_offsets, *ci = x.layout.col_indices;
    sk_bsr a = x.layout, b = x.layout;
    a.row_offsets = malloc((size_t)(rows + 1) * 4);
    b.row_offsets = malloc((size_t)(rows + 1) * 4);
    a.col_indices = malloc((size_t)(x.layout.nnz + 1) * 4);
    b.col_indices = malloc((size_t)(x.layout.nnz + 1) * 4);
    REQUIRE(a.row_offsets && b.row_offsets && a.col_indices && b.col_indices, "host memory");
    a.nnz = b.nnz = 0;
    for (int64_t r = 0; r < rows; ++r) {
        a.row_offsets[r] = a.nnz;
        b.row_offsets[r] = b.nnz;
        const int32_t half = ro[r] + (ro[r + 1] - ro[r]) / 2;
        for (int32_t k = ro[r]; k < ro[r + 1]; ++k) {
            if (k < half)
                a.col_indices[a.nnz++] = ci[k];
            else
                b.col_indices[b.nnz++] = ci[k];
        }
    }
    a.row_offsets[rows] = a.nnz;
    b.row_offsets[rows] = b.nnz;
    sk_bsr da, db;
    REQUIRE(gt_bsr_to_device(&a, &da) == 0 && gt_bsr_to_device(&b, &db) == 0, "upload layouts");
    float *carry = gt_device_alloc((size_t)x.lse_elems * 4);
    float *lse_h = malloc((size_t)x.lse_elems * 4);
    void *o = malloc(x.o.bytes);
    REQUIRE(carry != NULL && lse_h != NULL && o != NULL, "memory");
    CHECK(gt_inst_poison_outputs(&x) == 0, "upload");
    sk_status st = sk_attention_forward(&d, &da, x.dq, x.dk, x.dv, x.dout, x.dlse, x.dws,
                                        x.ws_bytes, NULL);
    CHECK(st == SK_STATUS_SUCCESS, "pass A: %s %s", sk_status_name(st), sk_last_error());
    CHECK(gt_sync() == 0 && gt_download(lse_h, x.dlse, (size_t)x.lse_elems * 4) == 0 &&
              gt_upload(carry, lse_h, (size_t)x.lse_elems * 4) == 0,
          "carried LSE");
    st = sk_attention_plan(&d, &db, x.dws, x.ws_bytes, NULL);
    CHECK(st == SK_STATUS_SUCCESS, "plan B: %s %s", sk_status_name(st), sk_last_error());
    st = sk_attention_run_carry(&d, &db, x.dq, x.dk, x.dv, x.dout, x.dlse, carry, x.dws,
                                x.ws_bytes, NULL);
    CHECK(st == SK_STATUS_SUCCESS, "pass B (carry-in): %s %s", sk_status_name(st),
          sk_last_error());
    CHECK(gt_sync() == 0 && gt_inst_fetch_outputs(&x, o, lse_h) == 0, "download");
    const int errors = gt_inst_compare(&x, o, lse_h, "carry-in 128x64 vs reference");
    CHECK(errors == 0, "%d elements outside the tolerance", errors);
    printf("    carry-in, blocks 128 x 64: %lld + %lld blocks, %d errors\n", (long long)a.nnz,
           (long long)b.nnz, errors);
    gt_device_free(carry);
    gt_bsr_free_device(&da);
    gt_bsr_free_device(&db);
    free(a.row_offsets), free(b.row_offsets), free(a.col_indices), free(b.col_indices);
    free(lse_h), free(o);
    gt_inst_destroy(&x);
}
