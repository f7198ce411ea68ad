/*
 * test_attention_backward_gpu.c - the CUDA attention backward against the
 * CPU backend's backward and the naive fp64 bound (gpu_bwd.h says how a
 * case runs: NaN-poisoned outputs and workspace, NaN in every input no
 * gradient may read, two runs bitwise equal, padding untouched).
 *
 *   gpu_bwd_random_*     every dtype {f16, bf16} x head_dim {64, 128} x
 *                        block_q {64, 128} x block_k {64, 128} x {full,
 *                        causal} gets GB_VARIANTS seeded cases (224 in
 *                        all), drawn as the forward's random cases
 *                        (gt_case_random: GQA 1/4/8, tails, Sq != Sk both
 *                        ways, broadcast / per-KV-head / per-query-head
 *                        layouts, one block a row to dense, empty rows,
 *                        padded strides, scales), plus stride modes for
 *                        dO, dQ, dK, dV and one-shot or plan + run.
 *   gpu_bwd_nan_unread   cases built to have both empty rows and keys no
 *                        pair reaches (their inputs NaN), checked non-vacuous.
 *   gpu_bwd_edge_shapes  one token, nothing selected, Sq >> Sk causal, ...
 *   gpu_bwd_hopper_dkv_edges  the Hopper dK/dV kernel's edges (block tails,
 *                        alternating warpgroups, GQA 8, causal Sq != Sk).
 *   gpu_bwd_nondet_*     bwd->deterministic = 0 (the fused pass: dQ by fp32
 *                        atomics; Hopper's, or the portable one under
 *                        --backend sm80 / off Hopper, gpu_bwd.c checks which
 *                        ran): 4 x 32 random cases as above, the NaN, edge
 *                        and Hopper edge cases; each run twice (dQ within
 *                        the tolerance both times, dK / dV bitwise) and once
 *                        more with deterministic = 1 (the same dK / dV bits).
 *   gpu_bwd_graph_capture  forward + backward plan + run captured in a CUDA
 *                        graph: capturing runs nothing, replays equal the
 *                        direct run bitwise.
 *   gpu_bwd_bad_*        the CUDA-specific refusals (workspace size and
 *                        placement, head_dim, alignment): status, message,
 *                        nothing written.
 *   gpu_bwd_corrupt_*    layouts that fail validation and a stale plan stay
 *                        in bounds (compute-sanitizer checks the reads).
 * --quick keeps a few small cases of each (for compute-sanitizer).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/harness.h"
#include "common/test_util.h"
#include "gpu/cuda_api.h"
#include "gpu/gpu_bwd.h"
#include "gpu/gpu_util.h"

enum { GB_VARIANTS = 7 };

/* Work budget of one case: B * Hq * Sq * Sk * D (the CPU backward and the
 * naive fp64 backward are both that order). */
#define GB_CASE_WORK  6.0e7
#define GB_QUICK_WORK 2.0e6

/* A random backward case: the forward's draw, then the gradients' strides
 * and the call style. */
static void random_case(gb_case *c, tu_rng *rng, sk_dtype dtype, int64_t d, int32_t bq, int32_t bk,
                        int causal) {
    memset(c, 0, sizeof *c);
    gt_case_random(&c->f, rng, dtype, d, bq, bk, causal, gt_opt.quick,
                   gt_opt.quick ? GB_QUICK_WORK : GB_CASE_WORK);
    for (int t = 0; t < 4; ++t) {
        const double r = tu_rng_uniform(rng);
        c->grad_stride[t] = r < 0.5 ? 0 : r < 0.75 ? 1 : 2;
    }
    c->plan_run = tu_rng_uniform(rng) < 0.5;
}

/* All block sizes x causal for one (dtype, head_dim): `variants` cases
 * each, in deterministic mode 1 or 0 (nondet). */
static void run_group_mode(sk_dtype dtype, int64_t d, uint64_t salt, int variants, int nondet) {
    tu_rng rng;
    tu_rng_seed(&rng, tu_base_seed() ^ salt);
    int run = 0, failed = 0;
    for (int combo = 0; combo < 8; ++combo) {
        const int32_t bq = combo & 1 ? 128 : 64, bk = combo & 2 ? 128 : 64;
        const int causal = (combo >> 2) & 1;
        for (int v = 0; v < variants; ++v) {
            gb_case c;
            random_case(&c, &rng, dtype, d, bq, bk, causal);
            c.nondet = nondet;
            if (gt_opt.quick && !(v == 0 && (combo == 2 || combo == 5))) continue;
            failed += gb_run_case(&c, NULL) != 0;
            ++run;
        }
    }
    printf("    %d backward cases%s, %d failed\n", run, nondet ? " (deterministic 0)" : "",
           failed);
}

static void run_group(sk_dtype dtype, int64_t d, uint64_t salt) {
    run_group_mode(dtype, d, salt, GB_VARIANTS, 0);
}

SK_TEST(gpu_bwd_random_f16_d64) {
    run_group(SK_DTYPE_F16, 64, 0x2901);
}
SK_TEST(gpu_bwd_random_f16_d128) {
    run_group(SK_DTYPE_F16, 128, 0x2902);
}
SK_TEST(gpu_bwd_random_bf16_d64) {
    run_group(SK_DTYPE_BF16, 64, 0x2903);
}
SK_TEST(gpu_bwd_random_bf16_d128) {
    run_group(SK_DTYPE_BF16, 128, 0x2904);
}

/* deterministic = 0: 4 x 8 x 4 = 128 cases, other seeds than the above. */
SK_TEST(gpu_bwd_nondet_random_f16_d64) {
    run_group_mode(SK_DTYPE_F16, 64, 0x29f1, 4, 1);
}
SK_TEST(gpu_bwd_nondet_random_f16_d128) {
    run_group_mode(SK_DTYPE_F16, 128, 0x29f2, 4, 1);
}
SK_TEST(gpu_bwd_nondet_random_bf16_d64) {
    run_group_mode(SK_DTYPE_BF16, 64, 0x29f3, 4, 1);
}
SK_TEST(gpu_bwd_nondet_random_bf16_d128) {
    run_group_mode(SK_DTYPE_BF16, 128, 0x29f4, 4, 1);
}

/* ---------------------------------------------------------------------------
 * Hand-picked cases
 * ------------------------------------------------------------------------- */

static gb_case base_case(sk_dtype dtype, int64_t d, int64_t sq, int64_t sk, int32_t bq, int32_t bk,
                         int causal) {
    return gb_case_base(dtype, d, sq, sk, bq, bk, causal);
}

/* Empty rows (empty layout rows, and the first Sq - Sk rows when causal)
 * and keys that no pair reaches (one block a row of many): their Q, dO, O,
 * LSE and K, V are NaN. Each case must have both, or it proves nothing. */
static void nan_unread_cases(int nondet) {
    const int n = gt_opt.quick ? 1 : 4;
    for (int t = 0; t < n; ++t) {
        gb_case c = base_case(t & 1 ? SK_DTYPE_BF16 : SK_DTYPE_F16, t & 2 ? 128 : 64, 300,
                              200 + 150 * t, t & 1 ? 128 : 64, t & 2 ? 64 : 128, t != 3);
        c.f.heads_q = 4;
        c.f.heads_kv = 2;
        c.f.layout_heads = t == 2 ? 2 : 4;
        c.f.k_per_row = 1;
        c.f.empty_rows = 0.3;
        c.grad_stride[0] = c.grad_stride[2] = t % 3;
        c.f.stride_mode[1] = (t + 1) % 3;
        c.plan_run = t & 1;
        c.nondet = nondet;
        int64_t counts[2] = {0, 0};
        gb_run_case(&c, counts);
        CHECK(counts[0] > 0 && counts[1] > 0,
              "case %d: %lld empty rows and %lld keys no pair reaches: vacuous", t,
              (long long)counts[0], (long long)counts[1]);
    }
}

SK_TEST(gpu_bwd_nan_unread) {
    nan_unread_cases(0);
}

/* The fused pass: NaN K rows of unreached keys must not reach dQ (0 x NaN). */
SK_TEST(gpu_bwd_nondet_nan_unread) {
    nan_unread_cases(1);
}

static void edge_shapes(int nondet) {
    gb_case cs[12];
    int n = 0;
    cs[n++] = base_case(SK_DTYPE_F16, 64, 1, 1, 64, 64, 0);
    cs[n++] = base_case(SK_DTYPE_BF16, 128, 1, 1, 128, 128, 1);
    cs[n++] = base_case(SK_DTYPE_F16, 128, 1, 700, 64, 128, 1);    /* one query, the last key row */
    cs[n++] = base_case(SK_DTYPE_BF16, 64, 700, 1, 128, 64, 1);    /* Sq > Sk: most rows empty */
    cs[n++] = base_case(SK_DTYPE_F16, 64, 64, 64, 64, 64, 1);      /* exactly one block */
    cs[n++] = base_case(SK_DTYPE_F16, 128, 257, 129, 128, 128, 0); /* tails of one row */
    cs[n] = base_case(SK_DTYPE_F16, 64, 200, 300, 128, 64, 0);     /* nothing selected: all zero */
    cs[n++].f.density = 0.0;
    cs[n] = base_case(SK_DTYPE_BF16, 128, 129, 1000, 128, 64, 1); /* MQA 8, one block a row */
    cs[n].f.heads_q = 8;
    cs[n].f.layout_heads = 1;
    cs[n++].f.k_per_row = 1;
    cs[n] = base_case(SK_DTYPE_F16, 128, 512, 512, 128, 128, 1); /* padded everything */
    for (int t = 0; t < 4; ++t) cs[n].f.stride_mode[t] = cs[n].grad_stride[t] = 1 + (t & 1);
    cs[n].f.scale = -0.07f;
    cs[n++].f.q_amp = 4.0f;
    cs[n] = base_case(SK_DTYPE_BF16, 64, 640, 96, 64, 128, 1); /* Sq >> Sk, per-query-head GQA */
    cs[n].f.heads_q = 8;
    cs[n].f.heads_kv = 2;
    cs[n].f.layout_heads = 8;
    cs[n++].f.density = 0.6;
    cs[n] = base_case(SK_DTYPE_F16, 64, 96, 640, 128, 64, 0); /* per-batch layouts */
    cs[n].f.batch = 3;
    cs[n].f.layout_batch = 3;
    cs[n].f.heads_q = 4;
    cs[n].f.heads_kv = 4;
    cs[n].f.layout_heads = 4;
    cs[n++].f.density = 0.3;
    int failed = 0;
    const int count = gt_opt.quick ? 4 : n;
    for (int i = 0; i < count; ++i) {
        cs[i].plan_run = i & 1;
        cs[i].nondet = nondet;
        failed += gb_run_case(&cs[i], NULL) != 0;
    }
    printf("    %d edge cases%s, %d failed\n", count, nondet ? " (deterministic 0)" : "", failed);
}

SK_TEST(gpu_bwd_edge_shapes) {
    edge_shapes(0);
}

/* The fused passes on the same edges: one token, nothing selected (dQaccum
 * stays zero), Sq >> Sk, MQA, padded strides. */
SK_TEST(gpu_bwd_nondet_edge_shapes) {
    edge_shapes(1);
}

/* The Hopper dK/dV kernel's own edges (bwd_sm90_dkv.cu; on other devices
 * and SK_BACKEND_CUDA_SM80 the portable kernel runs them, and gb_run_case
 * checks which one ran): 128-key blocks whose second warpgroup's keys pass
 * Sk, 64-key blocks (alternating warpgroups) with odd and even tile counts,
 * GQA 8 with a per-query-head layout (T merges the heads) and a per-KV-head
 * one (T repeated 8 times), causal Sq != Sk both ways with empty rows (NaN
 * Q / dO rows inside the diagonal tiles: zeroed before the GEMMs), padded
 * strides. NaN in unread inputs and the bitwise repeat as in every case. */
static void hopper_edges(int nondet) {
    gb_case cs[10];
    int n = 0;
    cs[n] = base_case(SK_DTYPE_BF16, 128, 200, 300, 64, 128, 1); /* Sk tail inside a block */
    cs[n].f.heads_q = 8;
    cs[n].f.heads_kv = 1;
    cs[n].f.layout_heads = 8;
    cs[n++].f.density = 0.7;
    cs[n] = base_case(SK_DTYPE_F16, 128, 333, 190, 128, 128, 1); /* Sq > Sk: empty rows */
    cs[n].f.heads_q = 8;
    cs[n].f.heads_kv = 2;
    cs[n].f.layout_heads = 8;
    cs[n].f.empty_rows = 0.2;
    cs[n++].f.density = 0.8;
    cs[n] = base_case(SK_DTYPE_F16, 128, 197, 260, 64, 64, 0); /* 64-key blocks, per batch */
    cs[n].f.batch = 2;
    cs[n].f.layout_batch = 2;
    cs[n++].f.density = 0.5;
    cs[n] = base_case(SK_DTYPE_BF16, 64, 1000, 1000, 64, 64, 1); /* GQA 8, per-KV-head layout */
    cs[n].f.heads_q = 8;
    cs[n].f.heads_kv = 1;
    cs[n].f.layout_heads = 1;
    cs[n++].f.density = 0.6;
    cs[n] = base_case(SK_DTYPE_F16, 64, 517, 517, 128, 128, 1); /* padded, negative scale */
    for (int t = 0; t < 4; ++t) cs[n].f.stride_mode[t] = cs[n].grad_stride[t] = 1 + (t & 1);
    cs[n].f.scale = -0.09f;
    cs[n++].f.q_amp = 3.0f;
    cs[n] = base_case(SK_DTYPE_BF16, 128, 700, 300, 128, 64, 1); /* Sq >> Sk, 64-key blocks */
    cs[n].f.heads_q = 4;
    cs[n].f.heads_kv = 2;
    cs[n].f.layout_heads = 2;
    cs[n++].f.empty_rows = 0.3;
    cs[n] = base_case(SK_DTYPE_F16, 64, 129, 900, 128, 128, 1); /* Sq < Sk: diagonal at the end */
    cs[n].f.heads_q = 8;
    cs[n].f.heads_kv = 8;
    cs[n].f.layout_heads = 8;
    cs[n++].f.k_per_row = 2;
    cs[n] = base_case(SK_DTYPE_BF16, 128, 64, 64, 64, 64, 1); /* one tile: the end marks alone */
    cs[n].f.heads_q = 1;
    cs[n++].f.layout_heads = 1; /* base_case's 2 would name a head the case lacks */
    /* 64-row query blocks, 128-key blocks, causal, one block a row with
     * empty rows: key blocks that only early rows select keep keys past
     * their last row's diagonal (NaN, zeroed by the fused pass before dQ). */
    for (int t = 0; t < 2; ++t) {
        cs[n] = base_case(t ? SK_DTYPE_F16 : SK_DTYPE_BF16, 64 << t, 512, 512, 64, 128, 1);
        cs[n].f.heads_q = 4;
        cs[n].f.heads_kv = 2;
        cs[n].f.layout_heads = 4;
        cs[n].f.k_per_row = 1;
        cs[n++].f.empty_rows = 0.4;
    }
    int failed = 0, empty = 0;
    const int count = gt_opt.quick ? 3 : n;
    for (int i = 0; i < count; ++i) {
        cs[i].plan_run = i & 1;
        cs[i].nondet = nondet;
        int64_t counts[2] = {0, 0};
        failed += gb_run_case(&cs[i], counts) != 0;
        empty += counts[0] > 0;
    }
    /* Cases 1 and 5 must have empty rows (NaN inside diagonal tiles). */
    CHECK(empty >= (count > 5 ? 2 : 1), "only %d cases with empty rows: vacuous", empty);
    printf("    %d Hopper dK/dV edge cases%s, %d failed\n", count,
           nondet ? " (deterministic 0)" : "", failed);
}

SK_TEST(gpu_bwd_hopper_dkv_edges) {
    hopper_edges(0);
}

SK_TEST(gpu_bwd_nondet_hopper_edges) {
    hopper_edges(1);
}

/* ---------------------------------------------------------------------------
 * CUDA graphs
 * ------------------------------------------------------------------------- */

/* The forward, then the backward's plan and run, on `stream`. */
static sk_status training_step(gb_inst *b, cudaStream_t stream) {
    const sk_status st = gt_inst_forward(&b->x, gt_opt.backend, stream);
    if (st != SK_STATUS_SUCCESS) return st;
    return gb_inst_backward(b, gt_opt.backend, stream);
}

SK_TEST(gpu_bwd_graph_capture) {
    gb_case c = base_case(SK_DTYPE_BF16, 128, 333, 444, 128, 64, 1);
    c.f.heads_q = 4;
    c.f.heads_kv = 2;
    c.f.layout_heads = 2;
    c.f.density = 0.4;
    c.plan_run = 1;
    c.keep_unread = 1; /* the forward reads the K, V of keys no pair reaches */
    if (gt_opt.backend == SK_BACKEND_CUDA_SM90)
        c.f.block_k = 128; /* the forward's Hopper kernel takes 128 x 128 blocks */
    gb_inst b;
    REQUIRE(gb_inst_create(&b, &c) == 0, "setup");
    void *direct[3] = {malloc(b.dq.bytes), malloc(b.dk.bytes), malloc(b.dv.bytes)};
    void *graph[3] = {malloc(b.dq.bytes), malloc(b.dk.bytes), malloc(b.dv.bytes)};
    cudaStream_t stream = NULL;
    cudaGraph_t g = NULL;
    cudaGraphExec_t exec = NULL;
    REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess, "stream");
    CHECK(gb_inst_poison(&b, 0xa5) == 0, "upload");
    sk_status st = training_step(&b, stream);
    if (st == SK_STATUS_NOT_SUPPORTED && gt_opt.backend == SK_BACKEND_CUDA_SM90) {
        printf("    SK_BACKEND_CUDA_SM90 not supported here: %s\n", sk_last_error());
        goto done;
    }
    CHECK(st == SK_STATUS_SUCCESS, "direct: %s %s", sk_status_name(st), sk_last_error());
    CHECK(cudaStreamSynchronize(stream) == cudaSuccess, "sync");
    CHECK(gb_inst_fetch(&b, direct[0], direct[1], direct[2]) == 0, "download");
    CHECK(gb_inst_compare(&b, direct[0], direct[1], direct[2], "direct (GPU forward)") == 0,
          "the GPU forward's O and LSE give the reference gradients");

    CHECK(gb_inst_poison(&b, 0x5a) == 0, "upload");
    REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal) == cudaSuccess, "capture");
    st = training_step(&b, stream);
    const cudaError_t end = cudaStreamEndCapture(stream, &g);
    CHECK(st == SK_STATUS_SUCCESS, "captured: %s %s", sk_status_name(st), sk_last_error());
    REQUIRE(end == cudaSuccess, "cudaStreamEndCapture: %s", cudaGetErrorName(end));
    CHECK(gb_inst_untouched(&b), "capturing ran the work");
    REQUIRE(cudaGraphInstantiate(&exec, g, 0) == cudaSuccess, "instantiate");
    for (int rep = 0; rep < 2; ++rep) {
        CHECK(gb_inst_poison(&b, rep ? 0x00 : 0xff) == 0, "upload");
        CHECK(cudaGraphLaunch(exec, stream) == cudaSuccess, "launch");
        CHECK(cudaStreamSynchronize(stream) == cudaSuccess, "sync");
        CHECK(gb_inst_fetch(&b, graph[0], graph[1], graph[2]) == 0, "download");
        CHECK(memcmp(direct[0], graph[0], b.dq.bytes) == 0, "replay %d: dQ differs", rep);
        CHECK(memcmp(direct[1], graph[1], b.dk.bytes) == 0, "replay %d: dK differs", rep);
        CHECK(memcmp(direct[2], graph[2], b.dv.bytes) == 0, "replay %d: dV differs", rep);
    }
done:
    if (exec != NULL) cudaGraphExecDestroy(exec);
    if (g != NULL) cudaGraphDestroy(g);
    cudaStreamDestroy(stream);
    for (int i = 0; i < 3; ++i) free(direct[i]), free(graph[i]);
    gb_inst_destroy(&b);
}

/* ---------------------------------------------------------------------------
 * Refusals specific to the CUDA backward: status, message, nothing written
 * ------------------------------------------------------------------------- */

/* One call with the instance's device buffers, some replaced. */
typedef struct bad_call {
    const void *q;
    void *dq, *dk, *ws;
    size_t ws_bytes;
    int64_t head_dim; /* 0: the case's */
} bad_call;

static sk_status call_bad(gb_inst *b, const bad_call *a) {
    sk_attention_desc d;
    sk_attention_backward_desc bd;
    gb_inst_desc(b, gt_opt.backend, &d, &bd);
    if (a->head_dim != 0) d.head_dim = a->head_dim;
    gt_inst *x = &b->x;
    return sk_attention_backward(&d, &bd, &x->dlayout, a->q, x->dk, x->dv, x->dout, b->d_dout,
                                 x->dlse, a->dq, a->dk, b->d_dv, a->ws, a->ws_bytes, NULL);
}

static void expect_bad(gb_inst *b, const bad_call *a, sk_status want, const char *needle,
                       const char *what) {
    const sk_status st = call_bad(b, a);
    CHECK(st == want, "%s: %s, want %s (%s)", what, sk_status_name(st), sk_status_name(want),
          sk_last_error());
    CHECK(strstr(sk_last_error(), needle) != NULL, "%s: message \"%s\" lacks \"%s\"", what,
          sk_last_error(), needle);
    CHECK(gt_sync() == 0 && gb_inst_untouched(b), "%s: outputs written", what);
}

SK_TEST(gpu_bwd_bad_inputs) {
    gb_case c = base_case(SK_DTYPE_F16, 64, 100, 150, 64, 64, 1);
    gb_inst b;
    REQUIRE(gb_inst_create(&b, &c) == 0, "setup");
    REQUIRE(gb_inst_poison(&b, 0) == 0, "upload");
    const bad_call ok = {b.x.dq, b.d_dq, b.d_dk, b.d_ws, b.ws_bytes, 0};
    bad_call a = ok;
    a.ws_bytes = b.ws_bytes - 1;
    expect_bad(&b, &a, SK_STATUS_BAD_PARAM_WORKSPACE, "workspace", "workspace one byte short");
    a.ws = NULL;
    a.ws_bytes = b.ws_bytes;
    expect_bad(&b, &a, SK_STATUS_BAD_PARAM_WORKSPACE, "workspace", "NULL workspace");
    a = ok;
    a.ws = b.d_dq; /* the workspace over dq: the aliasing rule */
    expect_bad(&b, &a, SK_STATUS_BAD_PARAM_STRIDE, "overlaps", "workspace over dq");
    a = ok;
    a.head_dim = 96;
    expect_bad(&b, &a, SK_STATUS_NOT_SUPPORTED, "head_dim = 96", "head_dim 96");
    a = ok;
    a.dk = (char *)b.d_dk + 2;
    expect_bad(&b, &a, SK_STATUS_BAD_PARAM_ALIGNMENT, "dk", "dk + 1 element");
    a = ok;
    a.q = (const char *)b.x.dq + 8;
    expect_bad(&b, &a, SK_STATUS_BAD_PARAM_ALIGNMENT, "q", "q + 4 elements");
    /* The plan alone with too little workspace. */
    {
        sk_attention_desc d;
        sk_attention_backward_desc bd;
        gb_inst_desc(&b, gt_opt.backend, &d, &bd);
        const sk_status st = sk_attention_backward_plan(&d, &bd, &b.x.dlayout, b.d_ws, 256, NULL);
        CHECK(st == SK_STATUS_BAD_PARAM_WORKSPACE, "plan, 256 bytes: %s", sk_status_name(st));
    }
    /* The exact size works (or the forced Hopper backend says why not). */
    const sk_status st = call_bad(&b, &ok);
    CHECK(st == SK_STATUS_SUCCESS ||
              (gt_opt.backend == SK_BACKEND_CUDA_SM90 && st == SK_STATUS_NOT_SUPPORTED),
          "exact workspace: %s %s", sk_status_name(st), sk_last_error());
    CHECK(gt_sync() == 0, "sync");
    gb_inst_destroy(&b);
}

/* ---------------------------------------------------------------------------
 * Robustness: corrupt layouts and a stale plan stay in bounds
 * ------------------------------------------------------------------------- */

/* Overwrite the device layout of an instance with `ro` / `ci` (host arrays
 * of its sizes), run the backward (or the run alone when plan == 0, on a
 * workspace of garbage), and check it succeeds and writes nothing outside
 * the outputs' logical extents. */
static void run_corrupt(gb_inst *b, const int32_t *ro, const int32_t *ci, int plan,
                        const char *what) {
    const int64_t rows = (int64_t)b->x.layout.grid.batch * b->x.layout.grid.heads * b->x.rb;
    if (ro != NULL)
        CHECK(gt_upload(b->x.dlayout.row_offsets, ro, (size_t)(rows + 1) * 4) == 0, "upload");
    if (ci != NULL)
        CHECK(gt_upload(b->x.dlayout.col_indices, ci, (size_t)b->x.layout.nnz * 4) == 0, "upload");
    CHECK(gb_inst_poison(b, 0xc3) == 0, "upload");
    if (!plan) { /* a workspace of small random words: tiles, entries, offsets in and out of range
                  */
        const size_t words = b->ws_bytes / 4;
        int32_t *w = malloc(words * 4);
        tu_rng rng;
        tu_rng_seed(&rng, tu_base_seed() ^ 0x57a1e);
        const int64_t hi = 2 * (int64_t)(b->x.layout.nnz + rows);
        for (size_t i = 0; w != NULL && i < words; ++i) w[i] = (int32_t)tu_rng_range(&rng, -2, hi);
        CHECK(w != NULL && gt_upload(b->d_ws, w, words * 4) == 0, "upload");
        free(w);
    }
    sk_attention_desc d;
    sk_attention_backward_desc bd;
    gb_inst_desc(b, gt_opt.backend, &d, &bd);
    gt_inst *x = &b->x;
    sk_status st = SK_STATUS_SUCCESS;
    if (plan) st = sk_attention_backward_plan(&d, &bd, &x->dlayout, b->d_ws, b->ws_bytes, NULL);
    if (st == SK_STATUS_SUCCESS)
        st = sk_attention_backward_run(&d, &bd, &x->dlayout, x->dq, x->dk, x->dv, x->dout,
                                       b->d_dout, x->dlse, b->d_dq, b->d_dk, b->d_dv, b->d_ws,
                                       b->ws_bytes, NULL);
    if (st == SK_STATUS_NOT_SUPPORTED && gt_opt.backend == SK_BACKEND_CUDA_SM90) return;
    CHECK(st == SK_STATUS_SUCCESS, "%s: %s %s", what, sk_status_name(st), sk_last_error());
    CHECK(gt_sync() == 0, "%s: the kernels failed", what);
    void *g[3] = {malloc(b->dq.bytes), malloc(b->dk.bytes), malloc(b->dv.bytes)};
    const gt_tensor *t[3] = {&b->dq, &b->dk, &b->dv};
    if (g[0] && g[1] && g[2] && gb_inst_fetch(b, g[0], g[1], g[2]) == 0) {
        for (int i = 0; i < 3; ++i) { /* padding only: results are unspecified */
            uint16_t *v = g[i];
            const uint16_t *nan = t[i]->host;
            int64_t written = 0;
            for (int64_t e = 0; e < t[i]->alloc; ++e) written += v[e] != nan[e];
            int64_t inside = 0;
            for (int64_t bb = 0; bb < t[i]->extent[0]; ++bb)
                for (int64_t s = 0; s < t[i]->extent[1]; ++s)
                    for (int64_t h = 0; h < t[i]->extent[2]; ++h)
                        for (int64_t e = 0; e < t[i]->d; ++e) {
                            const int64_t at = gt_tensor_index(t[i], bb, s, h, e);
                            inside += v[at] != nan[at];
                        }
            CHECK(written == inside, "%s: %lld elements written outside gradient %d", what,
                  (long long)(written - inside), i);
        }
    } else {
        CHECK(0, "%s: download", what);
    }
    for (int i = 0; i < 3; ++i) free(g[i]);
}

SK_TEST(gpu_bwd_corrupt_layouts_stay_in_bounds) {
    gb_case c = base_case(SK_DTYPE_BF16, 64, 300, 330, 64, 64, 1);
    c.f.density = 0.5;
    c.grad_stride[1] = c.grad_stride[2] = 1;
    gb_inst b;
    REQUIRE(gb_inst_create(&b, &c) == 0, "setup");
    const int64_t rows = (int64_t)b.x.layout.grid.batch * b.x.layout.grid.heads * b.x.rb;
    const int32_t nnz = b.x.layout.nnz;
    REQUIRE(nnz > 2, "the layout needs entries");
    int32_t *ro = malloc((size_t)(rows + 1) * 4), *ci = malloc((size_t)nnz * 4);
    REQUIRE(ro != NULL && ci != NULL, "memory");
    /* Offsets past nnz and decreasing, negative ones. */
    for (int64_t r = 0; r <= rows; ++r) ro[r] = (int32_t)((r * 7919) % (3 * nnz)) - nnz / 2;
    run_corrupt(&b, ro, NULL, 1, "offsets out of range");
    /* Every row the whole array; indices out of range, repeated, unsorted. */
    for (int64_t r = 0; r <= rows; ++r) ro[r] = r == rows ? nnz : 0;
    for (int32_t e = 0; e < nnz; ++e) ci[e] = (int32_t)((e * 37) % (b.x.cb + 3)) - 1;
    run_corrupt(&b, ro, ci, 1, "indices out of range, repeated, unsorted");
    /* The run without its plan, on a workspace of garbage. */
    memcpy(ro, b.x.layout.row_offsets, (size_t)(rows + 1) * 4);
    run_corrupt(&b, ro, b.x.layout.col_indices, 0, "a stale plan");
    free(ro);
    free(ci);
    gb_inst_destroy(&b);
}
