/*
 * test_attention_cases.c - hand-picked GPU cases and properties: edge
 * shapes, many tiles, layouts that fail validation (bounds and the
 * documented clamping), CUDA-graph capture, and the CUDA-specific bad
 * inputs (workspace, head_dim, alignment, forced backend), each checking
 * status, message and that nothing was written.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/harness.h"
#include "common/test_util.h"
#include "gpu/cuda_api.h"
#include "gpu/gpu_util.h"

static gt_case base_case(sk_dtype dtype, int64_t d, int64_t sq, int64_t sk, int32_t bq, int32_t bk,
                         int causal) {
    gt_case c;
    memset(&c, 0, sizeof c);
    c.dtype = dtype;
    c.batch = 1;
    c.seq_q = sq;
    c.seq_k = sk;
    c.heads_q = 2;
    c.heads_kv = 1;
    c.head_dim = d;
    c.block_q = bq;
    c.block_k = bk;
    c.causal = causal;
    c.layout_batch = 1;
    c.layout_heads = 2;
    c.density = 1.0;
    c.with_lse = 1;
    c.seed = tu_base_seed() ^ (uint64_t)(sq * 1000003 + sk * 101 + bq + bk + causal);
    return c;
}

SK_TEST(gpu_edge_shapes) {
    gt_case cs[12];
    int n = 0;
    cs[n++] = base_case(SK_DTYPE_F16, 64, 1, 1, 64, 64, 0);
    cs[n++] = base_case(SK_DTYPE_BF16, 128, 1, 1, 128, 128, 1);
    cs[n++] = base_case(SK_DTYPE_F16, 128, 1, 700, 64, 128, 1);   /* one query, last key row */
    cs[n++] = base_case(SK_DTYPE_BF16, 64, 700, 1, 128, 64, 1);   /* Sq > Sk: most rows empty */
    cs[n++] = base_case(SK_DTYPE_F16, 64, 64, 64, 64, 64, 1);     /* exactly one block */
    cs[n++] = base_case(SK_DTYPE_F16, 128, 257, 129, 128, 128, 0); /* tails of one row */
    cs[n++] = base_case(SK_DTYPE_BF16, 128, 300, 500, 64, 64, 1);
    cs[n] = base_case(SK_DTYPE_F16, 64, 200, 300, 128, 64, 0); /* nothing selected */
    cs[n++].density = 0.0;
    cs[n] = base_case(SK_DTYPE_BF16, 128, 129, 1000, 128, 64, 1); /* GQA 8, per-KV-head layout */
    cs[n].heads_q = 8;
    cs[n].layout_heads = 1;
    cs[n].heads_kv = 1;
    cs[n++].k_per_row = 1;
    cs[n] = base_case(SK_DTYPE_F16, 128, 512, 512, 128, 128, 1); /* padded everything */
    for (int t = 0; t < 4; ++t) cs[n].stride_mode[t] = 1 + (t & 1);
    cs[n].scale = -0.07f;
    cs[n++].q_amp = 4.0f;
    int failed = 0;
    for (int i = 0; i < n; ++i) {
        if (gt_opt.quick && i % 3 != 0) continue;
        failed += gt_run_case(&cs[i]) != 0;
    }
    printf("    %d cases, %d failed\n", gt_opt.quick ? (n + 2) / 3 : n, failed);
}

/* Many tiles of different lengths: the persistent grid switches tiles many
 * times, and the longest-first order matters. */
SK_TEST(gpu_many_tiles) {
    if (gt_opt.quick) return;
    gt_case c = base_case(SK_DTYPE_F16, 128, 1100, 1500, 64, 128, 1);
    c.batch = 2;
    c.heads_q = 16;
    c.heads_kv = 2;
    c.layout_batch = 2;
    c.layout_heads = 16;
    c.density = 0.5;
    c.empty_rows = 0.1;
    int failed = gt_run_case(&c) != 0;
    gt_case d = c;
    d.dtype = SK_DTYPE_BF16;
    d.head_dim = 64;
    d.block_q = 128;
    d.block_k = 64;
    d.causal = 0;
    d.seq_q = 1500;
    d.seq_k = 1100;
    d.k_per_row = 3;
    d.seed ^= 0x55;
    failed += gt_run_case(&d) != 0;
    printf("    2 cases, %d failed\n", failed);
}

/* Problems big enough for several L2 groups in the plan's tile order
 * (common/schedule.h): a slice's K/V is 16384 x 128 x 2 x 2 B = 8 MiB, so
 * a group holds 3 of the 8 KV heads (6 of the 16 query heads, GQA 2): 3
 * groups, the last one short; with block_q 64 a group spans two sort
 * segments (1536 tiles). Every tile must run exactly once. */
SK_TEST(gpu_l2_groups) {
    if (gt_opt.quick) return;
    gt_case c = base_case(SK_DTYPE_BF16, 128, 16384, 16384, 64, 128, 1);
    c.heads_q = 16;
    c.heads_kv = 8;
    c.layout_heads = 16;
    c.k_per_row = 2;
    c.empty_rows = 0.05;
    int failed = gt_run_case(&c) != 0;
    gt_case d = c;
    d.dtype = SK_DTYPE_F16;
    d.block_q = 128;
    d.causal = 0;
    d.layout_heads = 8;
    d.k_per_row = 3;
    d.seed ^= 0x2b;
    failed += gt_run_case(&d) != 0;
    printf("    2 cases, %d failed\n", failed);
}

/* ---------------------------------------------------------------------------
 * Layouts that fail validation
 * ------------------------------------------------------------------------- */

/* Run the instance with an arbitrary device layout; outputs to o / lse. */
static sk_status run_with_layout(gt_inst *x, const sk_bsr *host_layout, void *o, float *lse) {
    sk_bsr dev;
    if (gt_bsr_to_device(host_layout, &dev) != 0) return SK_STATUS_INTERNAL_ERROR;
    sk_attention_desc d;
    gt_inst_desc(x, gt_opt.backend, &d);
    sk_status st = SK_STATUS_INTERNAL_ERROR;
    if (gt_inst_poison_outputs(x) == 0) {
        st = sk_attention_forward(&d, &dev, x->dq, x->dk, x->dv, x->dout, x->dlse, x->dws,
                                  x->ws_bytes, NULL);
        if (st == SK_STATUS_SUCCESS && (gt_sync() != 0 || gt_inst_fetch_outputs(x, o, lse) != 0))
            st = SK_STATUS_EXECUTION_FAILED;
    }
    gt_bsr_free_device(&dev);
    return st;
}

/* Out-of-range column indices are skipped as if absent: the result equals
 * the clean layout's, bit for bit. Row offsets are clamped to [0, nnz] and
 * each row's end raised to its start: the result equals that of the layout
 * spelled out by this rule. */
/* The block size of the single-case tests: 64, or 128 when the forced
 * backend (the Hopper kernel) covers only that. */
static int32_t case_block(void) {
    const gt_case probe = {.block_q = 64, .block_k = 64};
    return gt_backend_covers(&probe) ? 64 : 128;
}

SK_TEST(gpu_invalid_layout_in_bounds) {
    gt_case c = base_case(SK_DTYPE_F16, 64, 300, 333, case_block(), case_block(), 1);
    c.batch = 2;
    c.layout_batch = 2;
    c.density = 1.0; /* every K/V block holds real values */
    gt_inst x;
    REQUIRE(gt_inst_create(&x, &c, 0) == 0, "setup");
    const int64_t rows = (int64_t)x.slices * x.rb;
    void *o_clean = malloc(x.o.bytes), *o_dirty = malloc(x.o.bytes);
    float *l_clean = malloc((size_t)x.lse_elems * 4), *l_dirty = malloc((size_t)x.lse_elems * 4);
    tu_rng rng;
    tu_rng_seed(&rng, c.seed ^ 0xbadu);

    /* A sparse clean layout: drop ~half the entries. */
    sk_bsr clean = x.layout;
    clean.row_offsets = malloc((size_t)(rows + 1) * 4);
    clean.col_indices = malloc((size_t)x.layout.nnz * 4 + 4);
    int32_t e = 0;
    for (int64_t r = 0; r < rows; ++r) {
        clean.row_offsets[r] = e;
        for (int32_t i = x.layout.row_offsets[r]; i < x.layout.row_offsets[r + 1]; ++i)
            if (tu_rng_uniform(&rng) < 0.5) clean.col_indices[e++] = x.layout.col_indices[i];
    }
    clean.row_offsets[rows] = e;
    clean.nnz = e;
    /* The same with junk columns mixed in. */
    static const int32_t junk[4] = {-1, -2147483647 - 1, 2147483647, 0};
    sk_bsr dirty = clean;
    dirty.row_offsets = malloc((size_t)(rows + 1) * 4);
    dirty.col_indices = malloc((size_t)(3 * clean.nnz + rows + 4) * 4);
    e = 0;
    for (int64_t r = 0; r < rows; ++r) {
        dirty.row_offsets[r] = e;
        for (int32_t i = clean.row_offsets[r]; i <= clean.row_offsets[r + 1]; ++i) {
            if (tu_rng_uniform(&rng) < 0.4) {
                int32_t j = junk[tu_rng_range(&rng, 0, 3)];
                if (j == 0) j = (int32_t)x.cb; /* one past the last column */
                dirty.col_indices[e++] = j;
            }
            if (i < clean.row_offsets[r + 1]) dirty.col_indices[e++] = clean.col_indices[i];
        }
    }
    dirty.row_offsets[rows] = e;
    dirty.nnz = e;
    sk_status st = run_with_layout(&x, &clean, o_clean, l_clean);
    CHECK(st == SK_STATUS_SUCCESS, "clean: %s %s", sk_status_name(st), sk_last_error());
    st = run_with_layout(&x, &dirty, o_dirty, l_dirty);
    CHECK(st == SK_STATUS_SUCCESS, "junk columns: %s %s", sk_status_name(st), sk_last_error());
    CHECK(memcmp(o_clean, o_dirty, x.o.bytes) == 0, "junk columns changed O");
    CHECK(memcmp(l_clean, l_dirty, (size_t)x.lse_elems * 4) == 0, "junk columns changed LSE");

    /* Garbage row offsets: negative, past nnz, decreasing. */
    sk_bsr bad = clean;
    bad.row_offsets = malloc((size_t)(rows + 1) * 4);
    for (int64_t r = 0; r <= rows; ++r) {
        const double u = tu_rng_uniform(&rng);
        bad.row_offsets[r] = u < 0.1   ? -(int32_t)tu_rng_range(&rng, 1, 1000000)
                             : u < 0.2 ? clean.nnz + (int32_t)tu_rng_range(&rng, 1, 1000000)
                             : u < 0.3 ? 2147483647
                                       : (int32_t)tu_rng_range(&rng, 0, clean.nnz);
    }
    /* The layout that the documented clamping makes of it. */
    sk_bsr spelled = clean;
    spelled.row_offsets = malloc((size_t)(rows + 1) * 4);
    int64_t total = 0;
    for (int64_t r = 0; r < rows; ++r) {
        int32_t a = bad.row_offsets[r], b = bad.row_offsets[r + 1];
        a = a < 0 ? 0 : a > clean.nnz ? clean.nnz : a;
        b = b < 0 ? 0 : b > clean.nnz ? clean.nnz : b;
        total += b > a ? b - a : 0;
    }
    spelled.col_indices = malloc((size_t)total * 4 + 4);
    e = 0;
    for (int64_t r = 0; r < rows; ++r) {
        int32_t a = bad.row_offsets[r], b = bad.row_offsets[r + 1];
        a = a < 0 ? 0 : a > clean.nnz ? clean.nnz : a;
        b = b < 0 ? 0 : b > clean.nnz ? clean.nnz : b;
        spelled.row_offsets[r] = e;
        for (int32_t i = a; i < b; ++i) spelled.col_indices[e++] = clean.col_indices[i];
    }
    spelled.row_offsets[rows] = e;
    spelled.nnz = e;
    st = run_with_layout(&x, &bad, o_dirty, l_dirty);
    CHECK(st == SK_STATUS_SUCCESS, "bad offsets: %s %s", sk_status_name(st), sk_last_error());
    st = run_with_layout(&x, &spelled, o_clean, l_clean);
    CHECK(st == SK_STATUS_SUCCESS, "spelled: %s %s", sk_status_name(st), sk_last_error());
    CHECK(memcmp(o_clean, o_dirty, x.o.bytes) == 0, "clamped offsets: O differs from spelled");
    CHECK(memcmp(l_clean, l_dirty, (size_t)x.lse_elems * 4) == 0,
          "clamped offsets: LSE differs from spelled");

    gt_bsr_free(&clean);
    gt_bsr_free(&dirty);
    free(bad.row_offsets);
    gt_bsr_free(&spelled);
    free(o_clean);
    free(o_dirty);
    free(l_clean);
    free(l_dirty);
    gt_inst_destroy(&x);
}

/* ---------------------------------------------------------------------------
 * CUDA graphs
 * ------------------------------------------------------------------------- */

/* Plan + run captured in a graph: capturing runs nothing, and replays equal
 * the direct run bitwise. */
static void check_graph_capture(gt_case c) {
    if (!gt_backend_covers(&c)) {
        printf("    graph capture of %dx%d blocks: not covered by the forced backend (declines "
               "are checked by the random cases)\n",
               (int)c.block_q, (int)c.block_k);
        return;
    }
    gt_inst x;
    REQUIRE(gt_inst_create(&x, &c, 0) == 0, "setup");
    void *o_direct = malloc(x.o.bytes), *o_graph = malloc(x.o.bytes);
    float *l_direct = malloc((size_t)x.lse_elems * 4), *l_graph = malloc((size_t)x.lse_elems * 4);
    cudaStream_t stream = NULL;
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess, "stream");

    CHECK(gt_inst_poison_outputs(&x) == 0, "upload");
    sk_status st = gt_inst_forward(&x, gt_opt.backend, stream);
    CHECK(st == SK_STATUS_SUCCESS, "direct: %s %s", sk_status_name(st), sk_last_error());
    CHECK(cudaStreamSynchronize(stream) == cudaSuccess, "sync");
    CHECK(gt_inst_fetch_outputs(&x, o_direct, l_direct) == 0, "download");

    CHECK(gt_inst_poison_outputs(&x) == 0, "upload");
    REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal) == cudaSuccess, "capture");
    st = gt_inst_forward(&x, gt_opt.backend, stream);
    const cudaError_t end = cudaStreamEndCapture(stream, &graph);
    CHECK(st == SK_STATUS_SUCCESS, "captured forward: %s %s", sk_status_name(st), sk_last_error());
    REQUIRE(end == cudaSuccess, "cudaStreamEndCapture: %s", cudaGetErrorName(end));
    CHECK(gt_inst_outputs_untouched(&x), "capturing ran the work");
    REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess, "instantiate");
    for (int rep = 0; rep < 2; ++rep) {
        CHECK(gt_inst_poison_outputs(&x) == 0, "upload");
        CHECK(cudaGraphLaunch(exec, stream) == cudaSuccess, "launch");
        CHECK(cudaStreamSynchronize(stream) == cudaSuccess, "sync");
        CHECK(gt_inst_fetch_outputs(&x, o_graph, l_graph) == 0, "download");
        CHECK(memcmp(o_direct, o_graph, x.o.bytes) == 0, "replay %d: O differs from direct", rep);
        CHECK(memcmp(l_direct, l_graph, (size_t)x.lse_elems * 4) == 0,
              "replay %d: LSE differs from direct", rep);
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
    free(o_direct);
    free(o_graph);
    free(l_direct);
    free(l_graph);
    gt_inst_destroy(&x);
}

SK_TEST(gpu_graph_capture) {
    gt_case c = base_case(SK_DTYPE_BF16, 128, 333, 444, 128, 64, 1);
    c.heads_q = 4;
    c.heads_kv = 2;
    c.layout_heads = 2;
    c.density = 0.4;
    check_graph_capture(c);
}

/* 128 x 128 blocks: the Hopper kernel on an H100/H200. */
SK_TEST(gpu_graph_capture_128) {
    gt_case c = base_case(SK_DTYPE_F16, 128, 300, 520, 128, 128, 1);
    c.heads_q = 8;
    c.heads_kv = 2;
    c.layout_heads = 2;
    c.density = 0.5;
    check_graph_capture(c);
}

/* ---------------------------------------------------------------------------
 * Bad inputs specific to the CUDA backend: status, message, nothing written
 * ------------------------------------------------------------------------- */

SK_TEST(gpu_bad_workspace) {
    gt_case c = base_case(SK_DTYPE_F16, 64, 100, 100, case_block(), case_block(), 0);
    gt_inst x;
    REQUIRE(gt_inst_create(&x, &c, 0) == 0, "setup");
    REQUIRE(gt_inst_poison_outputs(&x) == 0, "upload");
    sk_attention_desc d;
    gt_inst_desc(&x, gt_opt.backend, &d);
    sk_status st = sk_attention_forward(&d, &x.dlayout, x.dq, x.dk, x.dv, x.dout, x.dlse, x.dws,
                                        x.ws_bytes - 1, NULL);
    CHECK(st == SK_STATUS_BAD_PARAM_WORKSPACE, "too small: %s", sk_status_name(st));
    CHECK(strstr(sk_last_error(), "workspace") != NULL, "message: %s", sk_last_error());
    st = sk_attention_run(&d, &x.dlayout, x.dq, x.dk, x.dv, x.dout, x.dlse, x.dws, 16, NULL);
    CHECK(st == SK_STATUS_BAD_PARAM_WORKSPACE, "run, 16 bytes: %s", sk_status_name(st));
    st = sk_attention_plan(&d, &x.dlayout, x.dws, 0, NULL);
    CHECK(st == SK_STATUS_BAD_PARAM_WORKSPACE, "plan, 0 bytes: %s", sk_status_name(st));
    st = sk_attention_run(&d, &x.dlayout, x.dq, x.dk, x.dv, x.dout, x.dlse, NULL, x.ws_bytes, NULL);
    CHECK(st == SK_STATUS_BAD_PARAM_WORKSPACE, "NULL workspace: %s", sk_status_name(st));
    CHECK(strstr(sk_last_error(), "workspace") != NULL, "message: %s", sk_last_error());
    CHECK(gt_sync() == 0, "sync");
    CHECK(gt_inst_outputs_untouched(&x), "outputs written on failure");
    /* The exact size works. */
    st = sk_attention_forward(&d, &x.dlayout, x.dq, x.dk, x.dv, x.dout, x.dlse, x.dws, x.ws_bytes,
                              NULL);
    CHECK(st == SK_STATUS_SUCCESS, "exact size: %s %s", sk_status_name(st), sk_last_error());
    CHECK(gt_sync() == 0, "sync");
    gt_inst_destroy(&x);
}

SK_TEST(gpu_head_dim_96_not_supported) {
    gt_case c = base_case(SK_DTYPE_BF16, 96, 80, 80, 64, 64, 1);
    gt_inst x;
    REQUIRE(gt_inst_create(&x, &c, 0) == 0, "setup");
    REQUIRE(gt_inst_poison_outputs(&x) == 0, "upload");
    sk_attention_desc d;
    gt_inst_desc(&x, gt_opt.backend, &d);
    sk_status st = sk_attention_forward(&d, &x.dlayout, x.dq, x.dk, x.dv, x.dout, x.dlse, x.dws,
                                        x.ws_bytes, NULL);
    CHECK(st == SK_STATUS_NOT_SUPPORTED, "forward: %s", sk_status_name(st));
    CHECK(strstr(sk_last_error(), "96") != NULL, "message names the value: %s", sk_last_error());
    st = sk_attention_run(&d, &x.dlayout, x.dq, x.dk, x.dv, x.dout, x.dlse, x.dws, x.ws_bytes,
                          NULL);
    CHECK(st == SK_STATUS_NOT_SUPPORTED, "run: %s", sk_status_name(st));
    CHECK(gt_sync() == 0, "sync");
    CHECK(gt_inst_outputs_untouched(&x), "outputs written on failure");
    gt_inst_destroy(&x);
}

SK_TEST(gpu_misaligned_pointer) {
    gt_case c = base_case(SK_DTYPE_F16, 64, 100, 100, 64, 64, 0);
    gt_inst x;
    REQUIRE(gt_inst_create(&x, &c, 0) == 0, "setup");
    REQUIRE(gt_inst_poison_outputs(&x) == 0, "upload");
    sk_attention_desc d;
    gt_inst_desc(&x, gt_opt.backend, &d);
    const char *q = (const char *)x.dq + 2; /* one element: not 16-byte aligned */
    sk_status st = sk_attention_forward(&d, &x.dlayout, q, x.dk, x.dv, x.dout, x.dlse, x.dws,
                                        x.ws_bytes, NULL);
    CHECK(st == SK_STATUS_BAD_PARAM_ALIGNMENT, "q + 1: %s", sk_status_name(st));
    CHECK(strstr(sk_last_error(), "q") != NULL, "message: %s", sk_last_error());
    char *o = (char *)x.dout + 8;
    st = sk_attention_forward(&d, &x.dlayout, x.dq, x.dk, x.dv, o, x.dlse, x.dws, x.ws_bytes, NULL);
    CHECK(st == SK_STATUS_BAD_PARAM_ALIGNMENT, "o + 4: %s", sk_status_name(st));
    d.k_strides[0] = 100 * 68; /* rows 136 bytes apart: not a multiple of 16 */
    d.k_strides[1] = 68;
    d.k_strides[2] = 64;
    st = sk_attention_forward(&d, &x.dlayout, x.dq, x.dk, x.dv, x.dout, x.dlse, x.dws, x.ws_bytes,
                              NULL);
    CHECK(st == SK_STATUS_BAD_PARAM_ALIGNMENT || st == SK_STATUS_BAD_PARAM_STRIDE,
          "k stride: %s", sk_status_name(st));
    CHECK(gt_sync() == 0, "sync");
    CHECK(gt_inst_outputs_untouched(&x), "outputs written on failure");
    gt_inst_destroy(&x);
}

/* sparsek.h, "Workspace and streams": two runs in flight at once on two
 * streams, each with its own workspace and outputs, sharing the layout and
 * Q, K, V, both give the reference result, repeatedly. */
SK_TEST(gpu_two_streams_two_workspaces) {
    gt_case c = base_case(SK_DTYPE_BF16, 128, 2048, 2048, case_block(), case_block(), 1);
    c.heads_q = 16;
    c.heads_kv = 4;
    c.layout_heads = 4;
    c.density = 0.5;
    if (!gt_backend_covers(&c)) return;
    gt_inst x;
    REQUIRE(gt_inst_create(&x, &c, 1) == 0, "setup"); /* with the tolerances (fp64 pass) */
    REQUIRE(gt_inst_cpu_reference(&x) == SK_STATUS_SUCCESS, "CPU reference: %s", sk_last_error());
    sk_attention_desc d;
    gt_inst_desc(&x, gt_opt.backend, &d);
    void *o2 = NULL, *ws2 = NULL;
    float *lse2 = NULL;
    cudaStream_t s1 = NULL, s2 = NULL;
    REQUIRE(cudaMalloc(&o2, x.o.bytes) == cudaSuccess &&
                cudaMalloc((void **)&lse2, (size_t)x.lse_elems * 4) == cudaSuccess &&
                cudaMalloc(&ws2, x.ws_bytes) == cudaSuccess,
            "device buffers");
    REQUIRE(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking) == cudaSuccess &&
                cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking) == cudaSuccess,
            "streams");
    void *o_host = malloc(x.o.bytes);
    float *lse_host = malloc((size_t)x.lse_elems * 4);
    REQUIRE(o_host != NULL && lse_host != NULL, "host buffers");
    for (int rep = 0; rep < 3; ++rep) {
        CHECK(gt_inst_poison_outputs(&x) == 0, "poison 1");
        CHECK(cudaMemcpy(o2, x.o.host, x.o.bytes, cudaMemcpyHostToDevice) == cudaSuccess &&
                  cudaMemcpy(lse2, x.lse_nan, (size_t)x.lse_elems * 4,
                             cudaMemcpyHostToDevice) == cudaSuccess,
              "poison 2");
        for (int i = 0; i < 4; ++i) { /* interleaved: both streams busy at once */
            sk_status st = sk_attention_forward(&d, &x.dlayout, x.dq, x.dk, x.dv, x.dout, x.dlse,
                                                x.dws, x.ws_bytes, s1);
            CHECK(st == SK_STATUS_SUCCESS, "stream 1: %s %s", sk_status_name(st), sk_last_error());
            st = sk_attention_forward(&d, &x.dlayout, x.dq, x.dk, x.dv, o2, lse2, ws2, x.ws_bytes,
                                      s2);
            CHECK(st == SK_STATUS_SUCCESS, "stream 2: %s %s", sk_status_name(st), sk_last_error());
        }
        CHECK(cudaStreamSynchronize(s1) == cudaSuccess && cudaStreamSynchronize(s2) == cudaSuccess,
              "sync");
        CHECK(gt_inst_fetch_outputs(&x, o_host, lse_host) == 0, "download 1");
        CHECK(gt_inst_compare(&x, o_host, lse_host, "stream 1") == 0, "stream 1, round %d", rep);
        CHECK(cudaMemcpy(o_host, o2, x.o.bytes, cudaMemcpyDeviceToHost) == cudaSuccess &&
                  cudaMemcpy(lse_host, lse2, (size_t)x.lse_elems * 4, cudaMemcpyDeviceToHost) ==
                      cudaSuccess,
              "download 2");
        CHECK(gt_inst_compare(&x, o_host, lse_host, "stream 2") == 0, "stream 2, round %d", rep);
    }
    free(o_host);
    free(lse_host);
    cudaStreamDestroy(s1);
    cudaStreamDestroy(s2);
    cudaFree(o2);
    cudaFree(lse2);
    cudaFree(ws2);
    gt_inst_destroy(&x);
}

/* The Hopper kernel encodes an empty tile t as kTileEmptyBase - t (an int):
 * it takes at most 2^31 - 3 tiles and declines more with a status naming
 * the count. Planning only (no launch: the workspace is missing). */
SK_TEST(gpu_hopper_tile_cap) {
    int dev = 0, major = 0;
    REQUIRE(cudaGetDevice(&dev) == cudaSuccess, "device");
    REQUIRE(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess,
            "compute capability");
    if (major != 9) {
        printf("    not a Hopper GPU: the forced Hopper backend is refused before the cap\n");
        return;
    }
    const sk_grid grid = {128, 128, 128, 128, 1, 1};
    const uint8_t one = 1;
    sk_bsr host, dev_layout;
    REQUIRE(gt_bsr_from_mask(&host, &grid, &one) == 0, "layout");
    REQUIRE(gt_bsr_to_device(&host, &dev_layout) == 0, "device layout");
    sk_attention_desc d;
    REQUIRE(sk_attention_desc_init(&d, sizeof d) == SK_STATUS_SUCCESS, "init");
    d.backend = SK_BACKEND_CUDA_SM90;
    d.dtype = SK_DTYPE_F16;
    d.seq_q = d.seq_k = 128;
    d.heads_q = d.heads_kv = 1;
    d.head_dim = 64;
    d.batch = INT32_MAX - 1; /* 2^31 - 2 tiles: one too many */
    sk_status st = sk_attention_plan(&d, &dev_layout, NULL, 0, NULL);
    CHECK(st == SK_STATUS_NOT_SUPPORTED, "2^31 - 2 tiles: %s %s", sk_status_name(st),
          sk_last_error());
    CHECK(strstr(sk_last_error(), "2147483646 tiles") != NULL, "message: %s", sk_last_error());
    d.batch = INT32_MAX - 2; /* 2^31 - 3: the kernel takes it; the missing workspace stops it */
    st = sk_attention_plan(&d, &dev_layout, NULL, 0, NULL);
    CHECK(st == SK_STATUS_BAD_PARAM_WORKSPACE, "2^31 - 3 tiles: %s %s", sk_status_name(st),
          sk_last_error());
    gt_bsr_free_device(&dev_layout);
    gt_bsr_free(&host);
}

/* SK_BACKEND_CUDA_SM90 either computes the right answer or says it cannot,
 * writing nothing. */
SK_TEST(gpu_forced_hopper_backend) {
    gt_case c = base_case(SK_DTYPE_F16, 128, 256, 256, 128, 128, 1);
    gt_inst x;
    REQUIRE(gt_inst_create(&x, &c, 1) == 0, "setup");
    REQUIRE(gt_inst_poison_outputs(&x) == 0, "upload");
    const sk_status st = gt_inst_forward(&x, SK_BACKEND_CUDA_SM90, NULL);
    CHECK(gt_sync() == 0, "sync");
    if (st == SK_STATUS_NOT_SUPPORTED) {
        CHECK(strstr(sk_last_error(), "SM90") != NULL, "message: %s", sk_last_error());
        CHECK(gt_inst_outputs_untouched(&x), "outputs written on failure");
        printf("    SK_BACKEND_CUDA_SM90: not supported here (%s)\n", sk_last_error());
    } else {
        CHECK(st == SK_STATUS_SUCCESS, "%s %s", sk_status_name(st), sk_last_error());
        void *o = malloc(x.o.bytes);
        float *lse = malloc((size_t)x.lse_elems * 4);
        CHECK(gt_inst_fetch_outputs(&x, o, lse) == 0, "download");
        sk_attention_desc d;
        gt_inst_desc(&x, SK_BACKEND_CPU, &d);
        CHECK(sk_attention_run(&d, &x.layout, x.q.host, x.k.host, x.v.host, x.o_ref, x.lse_ref,
                               NULL, 0, NULL) == SK_STATUS_SUCCESS,
              "reference: %s", sk_last_error());
        CHECK(gt_inst_compare(&x, o, lse, "sm90 vs reference") == 0, "sm90 result");
        free(o);
        free(lse);
    }
    gt_inst_destroy(&x);
}
