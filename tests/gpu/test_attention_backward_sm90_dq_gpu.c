/*
 * test_attention_backward_sm90_dq_gpu.c - the Hopper dQ kernel of the
 * backward (src/cuda/attention/bwd_sm90_dq.cu) on the cases that stress
 * it, each run by gb_run_case (gpu_bwd.h: NaN-poisoned outputs and
 * workspace, NaN in every input no gradient may read, two runs bitwise
 * equal, the CPU backend and the naive fp64 bound), and each checked to
 * have taken the path it must: the Hopper dQ pass on a Hopper GPU under
 * SK_BACKEND_CUDA / _SM90 (sk_bwd90_dq_launches() counts its enqueues), the
 * portable one under _SM80, on other GPUs and for what it declines
 * (block_q 64). A silent fallback cannot pass.
 *
 *   gpu_bwd90_dq_tails       query tails inside 128-row blocks (a block of
 *                            2 rows: its second half not loaded; of 72 rows),
 *                            key tails, block_k 64 / 128, D 64 / 128, both dtypes
 *   gpu_bwd90_dq_causal      causal with Sq < Sk and Sq > Sk (empty rows),
 *                            GQA 4 / 8 with per-query-head, per-KV-head and
 *                            broadcast layouts
 *   gpu_bwd90_dq_nan_unread  empty rows and keys no pair reaches (NaN),
 *                            checked non-vacuous
 *   gpu_bwd90_dq_persistent  more tiles than SMs (the static stride over the
 *                            schedule), empty tiles among them
 *   gpu_bwd90_dq_declined    block_q 64: the portable pass, counted as such
 */
#include <stdio.h>
#include <string.h>

#include "common/harness.h"
#include "common/test_util.h"
#include "cuda/attention/bwd_sm90_dq.h"
#include "gpu/cuda_api.h"
#include "gpu/gpu_bwd.h"
#include "gpu/gpu_util.h"

/* Whether the Hopper dQ pass must run for a case it covers. */
static int hopper_expected(void) {
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess)
        return 0;
    return major == 9 && gt_opt.backend != SK_BACKEND_CUDA_SM80;
}

/* block_q 128 (the kernel's tile), a layout of density 0.6. */
static gb_case dq_case(sk_dtype dtype, int64_t d, int64_t sq, int64_t sk, int32_t bk, int causal,
                       uint64_t salt) {
    gb_case c = gb_case_base(dtype, d, sq, sk, 128, bk, causal);
    c.f.density = 0.6;
    c.f.seed ^= 0x9d90ull + salt * 7919u;
    return c;
}

/* Run one case and check the path: `hopper` says whether the Hopper dQ
 * pass must have run (both runs of gb_run_case), else it must not have. */
static void run_checked(const gb_case *c, int hopper, int64_t counts[2]) {
    const int before = sk_bwd90_dq_launches(), declined = gb_cases_declined;
    const int failed = gb_run_case(c, counts);
    const int ran = sk_bwd90_dq_launches() - before;
    if (failed || gb_cases_declined > declined) return; /* reported already */
    char desc[512];
    gt_case_describe(&c->f, desc, sizeof desc);
    if (hopper)
        CHECK(ran >= 2, "the Hopper dQ pass ran %d times, expected every run [%s]", ran, desc);
    else
        CHECK(ran == 0, "the Hopper dQ pass ran %d times where it must not [%s]", ran, desc);
}

SK_TEST(gpu_bwd90_dq_tails) {
    const int hopper = hopper_expected();
    static const int64_t shapes[][2] = {{130, 300}, {200, 200}, {1037, 129}, {128, 64}};
    const int n = gt_opt.quick ? 2 : 16;
    for (int t = 0; t < n; ++t) {
        const int64_t *sh = shapes[t % 4];
        gb_case c = dq_case(t & 4 ? SK_DTYPE_BF16 : SK_DTYPE_F16, t & 8 ? 128 : 64, sh[0], sh[1],
                            t & 1 ? 128 : 64, 0, (uint64_t)t);
        c.grad_stride[1] = t % 3; /* dQ: packed and both padded layouts */
        c.f.stride_mode[0] = (t + 1) % 3;
        c.plan_run = t & 2;
        run_checked(&c, hopper, NULL);
    }
}

SK_TEST(gpu_bwd90_dq_causal) {
    const int hopper = hopper_expected();
    static const int64_t shapes[][2] = {{300, 700}, {700, 300}, {256, 256}, {129, 1000}};
    const int n = gt_opt.quick ? 2 : 16;
    for (int t = 0; t < n; ++t) {
        const int64_t *sh = shapes[t % 4];
        gb_case c = dq_case(t & 8 ? SK_DTYPE_BF16 : SK_DTYPE_F16, t & 4 ? 128 : 64, sh[0], sh[1],
                            t & 1 ? 128 : 64, 1, 100u + (uint64_t)t);
        c.f.heads_q = t & 2 ? 8 : 4;
        c.f.heads_kv = t & 2 ? 1 : 2;
        c.f.layout_heads = t % 3 == 0   ? (int32_t)c.f.heads_q
                           : t % 3 == 1 ? (int32_t)c.f.heads_kv
                                        : 1;
        c.f.density = t & 1 ? 1.0 : 0.4;
        c.grad_stride[1] = (t + 2) % 3;
        c.plan_run = t & 1;
        run_checked(&c, hopper, NULL);
    }
}

/* Both kinds of NaN input by construction, whatever the seed: causal with
 * Sq > Sk makes the first Sq - Sk rows empty, and one block per layout row
 * (k_per_row 1) leaves keys no pair reaches wherever a KV head's layout
 * rows are fewer than its key blocks (3 query blocks of 128 rows; cases
 * 0-2: 64-key blocks, 4 of them, and one layout slice per KV head) or
 * where only one query block sees a run of keys (case 3: Sq - Sk = 300, so
 * keys 340..399 are seen by the last query block alone, and its one block
 * cannot cover both key blocks 2 and 3). The check below keeps it so. */
SK_TEST(gpu_bwd90_dq_nan_unread) {
    const int hopper = hopper_expected();
    static const int64_t shapes[4][5] = {
        /* Sq, Sk, block_k, heads_kv, layout_heads (heads_q 4) */
        {300, 250, 64, 2, 2},  /* per-KV-head layout */
        {300, 230, 64, 4, 4},  /* per-query-head layout (group 1) */
        {300, 250, 64, 2, 1},  /* one layout for every head */
        {700, 400, 128, 2, 2}, /* 128-key blocks, most query blocks empty */
    };
    const int n = gt_opt.quick ? 1 : 4;
    for (int t = 0; t < n; ++t) {
        const int64_t *sh = shapes[t];
        gb_case c = dq_case(t & 1 ? SK_DTYPE_BF16 : SK_DTYPE_F16, t & 2 ? 128 : 64, sh[0], sh[1],
                            (int32_t)sh[2], 1, 200u + (uint64_t)t);
        c.f.heads_q = 4;
        c.f.heads_kv = sh[3];
        c.f.layout_heads = (int32_t)sh[4];
        c.f.k_per_row = 1;
        c.f.empty_rows = 0.3;
        c.plan_run = t & 1;
        int64_t counts[2] = {0, 0};
        run_checked(&c, hopper, counts);
        CHECK(counts[0] > 0 && counts[1] > 0,
              "case %d: %lld empty rows and %lld keys no pair reaches: vacuous", t,
              (long long)counts[0], (long long)counts[1]);
    }
}

/* 16 heads x 9 query blocks = 144 tiles: more than an H100's 132 SMs, so
 * some CTAs take a second tile (and its Q after the first's), empty ones
 * among them. */
SK_TEST(gpu_bwd90_dq_persistent) {
    const int hopper = hopper_expected();
    const int n = gt_opt.quick ? 0 : 2;
    for (int t = 0; t < n; ++t) {
        gb_case c =
            dq_case(t ? SK_DTYPE_BF16 : SK_DTYPE_F16, 64, 1100, 192, 64, t, 300u + (uint64_t)t);
        c.f.heads_q = 16;
        c.f.heads_kv = 4;
        c.f.layout_heads = 16;
        c.f.empty_rows = 0.25;
        c.plan_run = 1;
        run_checked(&c, hopper, NULL);
    }
}

SK_TEST(gpu_bwd90_dq_declined) {
    gb_case c = dq_case(SK_DTYPE_F16, 64, 200, 300, 64, 1, 400u);
    c.f.block_q = 64;
    run_checked(&c, 0, NULL);
}
