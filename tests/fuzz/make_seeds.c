/*
 * make_seeds.c - writes the committed seed corpora of the fuzz harnesses
 * (tests/fuzz/corpus/<harness>/seed-*) and the regression inputs of the
 * defects they found (tests/fuzz/regressions/<harness>/gen-*), encoded
 * with the harnesses' own formats (layout_case.h, api_case.h), so that
 * `make fuzz-seeds` reproduces them byte for byte.
 *
 * Seeds are small valid calls of every entry point, and near-valid ones (a
 * boundary value, one broken rule) for the fuzzer to mutate from. Usage:
 *     make_seeds <tests/fuzz directory>
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz/api_case.h"
#include "fuzz/layout_case.h"

static const char *root;
static int written;

static void emit(const char *dir, const char *harness, const char *name, fz_codec *c) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s/%s/%s", root, dir, harness, name);
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(c->out, 1, c->out_len, f) != c->out_len) {
        fprintf(stderr, "make_seeds: cannot write %s\n", path);
        exit(1);
    }
    fclose(f);
    fz_codec_free(c);
    ++written;
}

/* ---------------------------------------------------------------------------
 * fuzz_layout
 * ------------------------------------------------------------------------- */

static layout_case lc(int64_t rows, int64_t cols, int32_t br, int32_t bc, int32_t batch,
                      int32_t heads) {
    layout_case k;
    memset(&k, 0, sizeof k);
    const sk_grid g = {rows, cols, br, bc, batch, heads};
    k.grid = g;
    k.flags = LC_LSE;
    k.head_dim = 3; /* D = 4 */
    k.magnitude = 4;
    k.data_seed = 7;
    k.win_left = 100;
    k.win_right = 30;
    k.sink_tokens = 64;
    k.window_tokens = 100;
    k.stride = 2;
    k.local_blocks = 1;
    k.rand_k = 2;
    k.topk_k = 1;
    k.topk_sink = 1;
    k.topk_local = 1;
    k.causal_bits = 5;
    k.builder_seed = 11;
    return k;
}

static void lc_emit(const char *dir, const char *name, layout_case *k, const char *mask) {
    k->mask = (const uint8_t *)mask;
    k->mask_len = strlen(mask);
    fz_codec c;
    fz_codec_writer(&c);
    layout_case_code(&c, k);
    emit(dir, "fuzz_layout", name, &c);
}

static void lc_add_edit(layout_case *k, uint8_t kind, uint16_t pos, int32_t value) {
    k->edits[k->n_edits].kind = kind;
    k->edits[k->n_edits].pos = pos;
    k->edits[k->n_edits].value = value;
    ++k->n_edits;
}

static void layout_seeds(void) {
    layout_case k;
    k = lc(100, 100, 64, 64, 1, 1);
    lc_emit("corpus", "seed-small-full", &k, "\xff");
    k = lc(100, 100, 64, 64, 1, 1);
    k.flags |= LC_CAUSAL;
    lc_emit("corpus", "seed-small-causal", &k, "\x0d");
    k = lc(150, 130, 64, 64, 2, 2);
    k.head_dim = 0; /* D = 1 */
    k.dtype = 1;
    k.heads_sel = 1; /* heads = Hkv */
    lc_emit("corpus", "seed-gqa-f16", &k, "\x5a\x33\xc4");
    k = lc(130, 257, 128, 64, 1, 3);
    k.head_dim = 0;
    k.dtype = 2;
    k.heads_sel = 3; /* heads = Hq, Hkv a divisor */
    k.flags = LC_RUN;
    lc_emit("corpus", "seed-tails-bf16-run", &k, "\x96\x01");
    k = lc(70, 1, 64, 64, 1, 1);
    lc_emit("corpus", "seed-one-key", &k, "\x01");
    k = lc(1, 500, 64, 128, 1, 2);
    k.flags |= LC_CAUSAL;
    k.heads_sel = 2;
    lc_emit("corpus", "seed-one-query-causal", &k, "\xfe\x7f");
    k = lc(200, 200, 64, 64, 1, 1);
    lc_emit("corpus", "seed-empty-rows", &k, "\x00\x00\x0f");
    k = lc(64 * 5, 64 * 4, 64, 64, 2, 1);
    k.head_dim = 0;
    k.scale = 0.25f;
    k.batch_sel = 1;
    lc_emit("corpus", "seed-strided-scale", &k, "\x11\x22\x44\x88");
    /* Broken layouts, one rule each. */
    k = lc(200, 300, 64, 64, 1, 1);
    lc_add_edit(&k, 0, 2, 99);
    lc_emit("corpus", "seed-bad-offset", &k, "\xff");
    k = lc(200, 300, 64, 64, 1, 1);
    lc_add_edit(&k, 1, 1, -1);
    lc_emit("corpus", "seed-decreasing-offsets", &k, "\xff");
    k = lc(200, 300, 64, 64, 1, 1);
    lc_add_edit(&k, 2, 3, 5);
    lc_emit("corpus", "seed-index-range", &k, "\xff");
    k = lc(200, 300, 64, 64, 1, 1);
    lc_add_edit(&k, 2, 1, 0);
    lc_emit("corpus", "seed-duplicate", &k, "\xff");
    k = lc(200, 300, 64, 64, 1, 1);
    lc_add_edit(&k, 3, 0, 2);
    lc_emit("corpus", "seed-unsorted", &k, "\xff");
    k = lc(200, 300, 64, 64, 1, 1);
    k.nnz_delta = 1;
    lc_emit("corpus", "seed-count", &k, "\xaa");
    k = lc(200, 300, 64, 64, 1, 1);
    k.flags |= LC_NULL_INDICES | LC_SHORT;
    lc_emit("corpus", "seed-null-indices", &k, "\x0f");
    k = lc(200, 300, 64, 64, 1, 2);
    k.flags |= LC_SHORT | LC_FLEX_EDITS;
    lc_add_edit(&k, 0, 1, 9);
    lc_add_edit(&k, 2, 4, 1);
    lc_emit("corpus", "seed-flex-edits", &k, "\x3c");
    /* Grids at the edges of the rules. */
    k = lc(64, 64 * (int64_t)INT32_MAX, 64, 64, 1, 1); /* col_blocks exactly INT32_MAX */
    lc_emit("corpus", "seed-grid-dense-int32-max", &k, "\x01");
    k = lc(64, 64 * (int64_t)INT32_MAX + 1, 64, 64, 1, 1); /* col_blocks one past */
    lc_emit("corpus", "seed-grid-dense-over", &k, "\x01");
    /* 2^16 x 2^16 blocks: a dense count past INT32_MAX, accepted since issue 33. */
    k = lc(64 * ((int64_t)1 << 16), 64 * ((int64_t)1 << 16), 64, 64, 1, 1);
    lc_emit("corpus", "seed-grid-dense-2-32", &k, "\x01");
    k = lc(64 * 2, 64, 64, 64, INT32_MAX / 4, 2); /* row offsets at the int32 edge */
    lc_emit("corpus", "seed-grid-rows-edge", &k, "\x01");
    k = lc(100, 100, 63, 64, 1, 1);
    lc_emit("corpus", "seed-grid-block-63", &k, "\x01");
    k = lc(0, 100, 64, 64, 1, 1);
    lc_emit("corpus", "seed-grid-rows-0", &k, "\x01");
    k = lc(100, 100, 64, 64, 0, 1);
    lc_emit("corpus", "seed-grid-batch-0", &k, "\x01");
    /* Builder parameters at their bounds. */
    k = lc(500, 700, 64, 128, 1, 1);
    k.win_left = 0;
    k.win_right = 0;
    k.sink_tokens = 0;
    k.window_tokens = 1;
    k.stride = 1;
    k.local_blocks = 0;
    k.rand_k = 0;
    k.topk_k = 0;
    k.topk_sink = 0;
    k.topk_local = 0;
    k.causal_bits = 7;
    lc_emit("corpus", "seed-builders-zero", &k, "\x01");
    k = lc(500, 300, 64, 64, 2, 1);
    k.win_left = INT64_MAX;
    k.win_right = INT64_MAX;
    k.sink_tokens = INT64_MAX;
    k.window_tokens = INT64_MAX;
    k.stride = INT32_MAX;
    k.local_blocks = INT32_MAX;
    k.rand_k = INT32_MAX;
    k.topk_k = INT32_MAX;
    k.topk_sink = INT32_MAX;
    k.topk_local = INT32_MAX;
    k.causal_bits = 0;
    lc_emit("corpus", "seed-builders-max", &k, "\x01");
    k = lc(500, 300, 64, 64, 1, 1);
    k.win_left = -1;
    k.window_tokens = 0;
    k.stride = 0;
    k.rand_k = -1;
    k.topk_local = -1;
    lc_emit("corpus", "seed-builders-negative", &k, "\x01");

    /* Issue 27 defect 1: counts that overflow int64 pass the grid check. */
    k = lc(1, INT64_MAX, 64, 64, 1, 1);
    lc_emit("regressions", "gen-grid-cols-int64-max", &k, "\x01");
    k = lc(INT64_MAX, 1, 128, 64, 1, 1);
    lc_emit("regressions", "gen-grid-rows-int64-max", &k, "\x01");
    k = lc(1, INT64_MAX - 3, 64, 128, 1, 1);
    lc_emit("regressions", "gen-grid-cols-int64-max-minus-3", &k, "\x01");
    /* slices x row blocks = 153092023 x 60247241209 = INT64_MAX exactly. */
    k = lc(60247241209LL * 64, 64, 64, 64, 153092023, 1);
    lc_emit("regressions", "gen-grid-rows-total-int64-max", &k, "\x01");
    k = lc(INT64_MAX - 64, 64, 128, 64, 1, 1);
    lc_emit("regressions", "gen-grid-rows-near-int64-max", &k, "\x01");
}

/* ---------------------------------------------------------------------------
 * fuzz_api
 * ------------------------------------------------------------------------- */

static api_case ac(uint8_t op, int32_t dtype, int64_t b, int64_t sq, int64_t sk, int64_t hq,
                   int64_t hkv, int64_t d) {
    api_case k;
    memset(&k, 0, sizeof k);
    k.op = op;
    k.fault = 4; /* none */
    k.backend = SK_BACKEND_CPU;
    k.dtype = dtype;
    k.c_dtype = SK_DTYPE_F32;
    const int64_t size[6] = {b, sq, sk, hq, hkv, d};
    memcpy(k.size, size, sizeof size);
    const sk_grid g = {sq, sk, 64, 64, 1, 1};
    k.grid = g;
    k.density = 160;
    k.block_q = k.block_k = 64;
    k.k = 2;
    k.flags = API_LSE;
    k.magnitude = 4;
    k.seed = 1234 + op;
    k.place.mode = 1; /* one arena, abutting */
    return k;
}

static void ac_emit(const char *dir, const char *name, api_case *k) {
    fz_codec c;
    fz_codec_writer(&c);
    api_case_code(&c, k);
    emit(dir, "fuzz_api", name, &c);
}

/* Padded [B, S, H, D] strides. */
static void padded(int64_t st[3], int64_t s, int64_t h, int64_t d) {
    st[2] = d + 3;
    st[1] = h * st[2] + 5;
    st[0] = s * st[1] + 7;
}

static void attention_seeds(void) {
    api_case k;
    k = ac(API_ATTN_FORWARD, SK_DTYPE_F32, 1, 100, 130, 2, 1, 8);
    ac_emit("corpus", "seed-attn-forward-f32", &k);
    k = ac(API_ATTN_RUN, SK_DTYPE_F16, 2, 70, 200, 2, 2, 4);
    k.grid.batch = 2;
    k.grid.heads = 2;
    k.mask = SK_MASK_CAUSAL;
    padded(k.strides[0], 70, 2, 4);
    padded(k.strides[3], 70, 2, 4);
    k.place.mode = 0;
    ac_emit("corpus", "seed-attn-run-f16-padded-causal", &k);
    k = ac(API_ATTN_FORWARD, SK_DTYPE_BF16, 1, 64, 64, 4, 2, 8);
    k.grid.heads = 2;
    k.grid.block_cols = 128;
    k.strides[1][1] = 8; /* K as [B, H, S, D] */
    k.strides[1][2] = 64 * 8;
    k.strides[1][0] = 2 * 64 * 8;
    k.flags = 0;
    ac_emit("corpus", "seed-attn-forward-bf16-bhsd", &k);
    k = ac(API_ATTN_FORWARD, SK_DTYPE_F32, 1, 129, 65, 1, 1, 2);
    k.density = 0; /* every row empty */
    k.place.mode = 2;
    for (int i = 0; i < FZ_MAX_BUFS; ++i) k.place.at[i] = 0; /* all at one place */
    ac_emit("corpus", "seed-attn-overlap-all", &k);
    k = ac(API_ATTN_PLAN, SK_DTYPE_F16, 1, 300, 300, 1, 1, 64);
    k.workspace_bytes = 100;
    ac_emit("corpus", "seed-attn-plan", &k);
    k = ac(API_ATTN_WORKSPACE, SK_DTYPE_F16, 4, 1 << 20, 1 << 20, 8, 8, 128);
    k.grid.rows = k.grid.cols = 1 << 20;
    k.grid.block_rows = k.grid.block_cols = 128;
    ac_emit("corpus", "seed-attn-workspace-large", &k);
    k = ac(API_ATTN_RUN, SK_DTYPE_F32, 1, 100, 100, 1, 1, 4);
    k.n_edits = 1;
    k.edits[0].kind = 2;
    k.edits[0].value = 7;
    ac_emit("corpus", "seed-attn-bad-layout", &k);
    k = ac(API_ATTN_RUN, SK_DTYPE_F32, 1, 100, 100, 1, 1, 4);
    k.strides[3][0] = 100 * 4;
    k.strides[3][1] = 2; /* O's rows overlap each other */
    k.strides[3][2] = 4;
    ac_emit("corpus", "seed-attn-o-self-overlap", &k);
    k = ac(API_ATTN_FORWARD, SK_DTYPE_F32, 1, 64, 64, 1, 1, 4);
    k.scale = 2e38f; /* |scale| log2(e) still below FLT_MAX */
    ac_emit("corpus", "seed-attn-scale-large", &k);
    /* Issue 27 defect 8: scale = 3e38 gave NaN in O and LSE with success. */
    k.scale = 3e38f;
    ac_emit("regressions", "gen-attn-scale-3e38", &k);

    /* Issue 27 defects 2 and 3 on F32, B = Sq = Sk = 64, H = 1, D = 4: q, k,
     * v, o 1024 bytes each, lse 256, row_offsets 8, col_indices 4; placed
     * explicitly (mode 2). Defect 2: the layout arrays inside O. */
    k = ac(API_ATTN_FORWARD, SK_DTYPE_F32, 1, 64, 64, 1, 1, 4);
    k.density = 255;
    k.place.mode = 2;
    const int64_t apart[8] = {0, 1024, 2048, 3072, 4096, 4352, 4360, 0};
    memcpy(k.place.at, apart, sizeof apart);
    k.place.at[5] = 3072;
    k.place.at[6] = 3080;
    ac_emit("regressions", "gen-attn-o-over-layout", &k);
    k.op = API_ATTN_RUN;
    ac_emit("regressions", "gen-attn-run-o-over-layout", &k);
    /* Defect 3: LSE inside K, then inside V. */
    memcpy(k.place.at, apart, sizeof apart);
    k.op = API_ATTN_FORWARD;
    k.place.at[4] = 1024;
    ac_emit("regressions", "gen-attn-lse-over-k", &k);
    k.place.at[4] = 2048;
    ac_emit("regressions", "gen-attn-lse-over-v", &k);
    /* Found by fuzz_api: layout arrays one byte off their int32 alignment
     * are read as int32 (a misaligned load) instead of being refused. */
    k = ac(API_ATTN_FORWARD, SK_DTYPE_F32, 1, 64, 64, 1, 1, 4);
    k.place.misalign = 1u << 5; /* row_offsets */
    ac_emit("regressions", "gen-attn-layout-misaligned", &k);
}

/* A backward case (blocks of 64: keep it small, the fuzzer runs it, a
 * forward and the fp64 reference), O and LSE from a real forward. */
static api_case bwd_case(uint8_t op, int32_t dtype, int64_t b, int64_t sq, int64_t sk, int64_t hq,
                         int64_t hkv, int64_t d) {
    api_case k = ac(op, dtype, b, sq, sk, hq, hkv, d);
    k.deterministic = 1;
    k.bwd_flags = API_BWD_REAL_FWD;
    return k;
}

static void backward_seeds(void) {
    api_case k;
    k = bwd_case(API_BWD, SK_DTYPE_F32, 1, 70, 130, 2, 1, 4);
    ac_emit("corpus", "seed-bwd-f32-gqa", &k);
    k.bwd_flags = 0; /* O and LSE arbitrary: only the outcome rules */
    ac_emit("corpus", "seed-bwd-f32-arbitrary-o", &k);
    k = bwd_case(API_BWD_RUN, SK_DTYPE_F16, 2, 40, 70, 2, 2, 4);
    k.grid.batch = 2;
    k.grid.heads = 2;
    k.mask = SK_MASK_CAUSAL;
    padded(k.bwd_strides[0], 40, 2, 4); /* dO */
    padded(k.bwd_strides[1], 40, 2, 4); /* dQ */
    padded(k.bwd_strides[2], 70, 2, 4); /* dK */
    k.place.mode = 0;
    ac_emit("corpus", "seed-bwd-run-f16-padded-causal", &k);
    k = bwd_case(API_BWD, SK_DTYPE_BF16, 1, 80, 40, 4, 2, 4);
    k.grid.heads = 4; /* per query head; Sq > Sk: causal empties the first rows */
    k.mask = SK_MASK_CAUSAL;
    k.deterministic = 0;
    ac_emit("corpus", "seed-bwd-bf16-per-head-causal", &k);
    k = bwd_case(API_BWD_WORKSPACE, SK_DTYPE_F16, 4, 1 << 20, 1 << 20, 8, 8, 128);
    k.grid.rows = k.grid.cols = 1 << 20;
    k.grid.block_rows = k.grid.block_cols = 128;
    ac_emit("corpus", "seed-bwd-workspace-large", &k);
    k = bwd_case(API_BWD_PLAN, SK_DTYPE_F32, 1, 40, 40, 1, 1, 4);
    k.workspace_bytes = 100;
    ac_emit("corpus", "seed-bwd-plan", &k);
    k.bwd_flags = API_BWD_STRUCT_SIZE | API_BWD_INIT_SIZE;
    ac_emit("corpus", "seed-bwd-plan-struct-size", &k);
    k = bwd_case(API_BWD, SK_DTYPE_F32, 1, 16, 16, 1, 1, 4);
    k.deterministic = 2;
    ac_emit("corpus", "seed-bwd-deterministic-2", &k);
    k.deterministic = 1;
    k.bwd_flags |= API_BWD_NULL;
    ac_emit("corpus", "seed-bwd-null-bwd", &k);
    k = bwd_case(API_BWD_RUN, SK_DTYPE_F32, 1, 16, 16, 1, 1, 4);
    k.bwd_strides[1][0] = 16 * 4;
    k.bwd_strides[1][1] = 2; /* dQ's rows overlap each other */
    k.bwd_strides[1][2] = 4;
    ac_emit("corpus", "seed-bwd-dq-self-overlap", &k);
    k = bwd_case(API_BWD, SK_DTYPE_F32, 1, 16, 16, 1, 1, 4);
    k.place.null_mask = 1u << 5; /* lse: required by the backward */
    ac_emit("corpus", "seed-bwd-lse-null", &k);
    k.place.null_mask = 1u << 10; /* col_indices (a high bit) */
    ac_emit("corpus", "seed-bwd-col-indices-null", &k);
    k.place.null_mask = 0;
    k.place.misalign = 1u << 8; /* dv (a high bit) */
    ac_emit("corpus", "seed-bwd-dv-misaligned", &k);
    k.place.misalign = 0;
    k.density = 0; /* every row empty: zero gradients */
    k.place.mode = 2;
    for (int i = 0; i < FZ_MAX_BUFS; ++i) k.place.at[i] = 0; /* all at one place */
    ac_emit("corpus", "seed-bwd-overlap-all", &k);

    /* F32, B = H = 1, S = 16, D = 4: q, k, v, o, dout, dq, dk, dv 256
     * bytes each, lse 64, row_offsets 8; placed apart (mode 2), then each
     * output moved onto another buffer. */
    k = bwd_case(API_BWD, SK_DTYPE_F32, 1, 16, 16, 1, 1, 4);
    k.density = 255;
    k.place.mode = 2;
    const int64_t apart[12] = {0, 256, 512, 768, 1024, 1280, 1344, 1600, 1856, 2112, 2120, 0};
    memcpy(k.place.at, apart, sizeof apart);
    ac_emit("corpus", "seed-bwd-apart", &k);
    static const struct {
        int out;
        int64_t at;
        const char *name;
    } moves[6] = {{6, 1024, "seed-bwd-dq-over-dout"},   {6, 768, "seed-bwd-dq-over-o"},
                  {7, 1280, "seed-bwd-dk-over-lse"},    {7, 0, "seed-bwd-dk-over-q"},
                  {8, 2112, "seed-bwd-dv-over-layout"}, {8, 1600, "seed-bwd-dv-over-dk"}};
    for (int i = 0; i < 6; ++i) {
        memcpy(k.place.at, apart, sizeof apart);
        k.place.at[moves[i].out] = moves[i].at;
        ac_emit("corpus", moves[i].name, &k);
    }
}

static api_case gemm_case(uint8_t op, int32_t ab, int32_t cd, int64_t m, int64_t n, int64_t kk) {
    api_case k = ac(op, ab, m, n, kk, 0, 0, 0);
    const int64_t size[6] = {m, n, kk, 0, 0, 0};
    memcpy(k.size, size, sizeof size);
    k.c_dtype = cd;
    k.scale = 1.0f;
    k.mask = SK_ORDER_ROW_MAJOR;
    k.grid.rows = m;
    k.grid.cols = kk;
    return k;
}

static void gemm_seeds(void) {
    api_case k;
    k = gemm_case(API_GEMM, SK_DTYPE_F32, SK_DTYPE_F32, 100, 8, 130);
    ac_emit("corpus", "seed-gemm-f32", &k);
    k = gemm_case(API_GEMM_RUN, SK_DTYPE_F16, SK_DTYPE_BF16, 70, 9, 64);
    k.beta = 0.5f;
    k.scale = -2.0f;
    k.mask = SK_ORDER_COL_MAJOR;
    k.strides[0][0] = 70; /* ldb above k */
    k.strides[0][1] = 12; /* ldc above n */
    k.grid.block_rows = 128;
    k.place.mode = 0;
    ac_emit("corpus", "seed-gemm-run-colmajor-beta", &k);
    k = gemm_case(API_GEMM_PLAN, SK_DTYPE_BF16, SK_DTYPE_F32, 300, 16, 300);
    ac_emit("corpus", "seed-gemm-plan", &k);
    k = gemm_case(API_GEMM_WORKSPACE, SK_DTYPE_F16, SK_DTYPE_F16, 1 << 16, 1024, 1 << 16);
    ac_emit("corpus", "seed-gemm-workspace", &k);
    k = gemm_case(API_GEMM, SK_DTYPE_F32, SK_DTYPE_F32, 64, 8, 64);
    k.strides[0][1] = 4; /* ldc below n */
    ac_emit("corpus", "seed-gemm-ldc-short", &k);
    /* Defect 2 for the GEMM: C over A's row_offsets. F32, m = k = 64, n = 8,
     * one block: a_values 16384 bytes, b 2048, c 2048, row_offsets 8,
     * col_indices 4. */
    k = gemm_case(API_GEMM, SK_DTYPE_F32, SK_DTYPE_F32, 64, 8, 64);
    k.density = 255;
    k.place.mode = 2;
    const int64_t at[8] = {0, 16384, 18432, 18440, 18448, 0, 0, 0};
    memcpy(k.place.at, at, sizeof at);
    ac_emit("regressions", "gen-gemm-c-over-layout", &k);
    k = gemm_case(API_GEMM, SK_DTYPE_F32, SK_DTYPE_F32, 64, 8, 64);
    k.density = 255;
    k.place.misalign = 1u << 4; /* col_indices */
    ac_emit("regressions", "gen-gemm-layout-misaligned", &k);
}

static api_case topk_case(uint8_t op, int32_t dtype, int64_t b, int64_t sq, int64_t sk, int64_t hq,
                          int64_t hkv, int64_t d) {
    api_case k = ac(op, dtype, b, sq, sk, hq, hkv, d);
    k.k = 2;
    k.sink_blocks = 1;
    k.local_blocks = 1;
    return k;
}

static void topk_seeds(void) {
    api_case k;
    k = topk_case(API_BLOCK_POOL, SK_DTYPE_F16, 1, 200, 300, 2, 1, 8);
    ac_emit("corpus", "seed-topk-pool", &k);
    k = topk_case(API_SELECT_TOPK, SK_DTYPE_F32, 2, 300, 500, 2, 2, 4);
    k.topk_mask = SK_MASK_CAUSAL;
    ac_emit("corpus", "seed-topk-select-causal", &k);
    k = topk_case(API_POOL_SELECT_TOPK, SK_DTYPE_BF16, 1, 256, 400, 4, 2, 8);
    k.per_kv_head = 1;
    k.block_k = 128;
    padded(k.strides[0], 256, 4, 8);
    k.place.mode = 0;
    ac_emit("corpus", "seed-topk-pool-select-per-kv", &k);
    k = topk_case(API_FROM_SCORES, SK_DTYPE_F16, 1, 500, 700, 1, 1, 8);
    k.flags = API_SPECIAL;
    k.k = 3;
    ac_emit("corpus", "seed-topk-from-scores-special", &k);
    k = topk_case(API_TOPK_CAPACITY, SK_DTYPE_F16, 2, 1000, 3000, 4, 1, 64);
    k.topk_mask = SK_MASK_CAUSAL;
    ac_emit("corpus", "seed-topk-capacity", &k);
    k = topk_case(API_TOPK_WORKSPACE, SK_DTYPE_F16, 1, 100, 100, 1, 1, 64);
    ac_emit("corpus", "seed-topk-workspace", &k);
    k = topk_case(API_POOL_SELECT_WORKSPACE, SK_DTYPE_F16, 1, 100, 100, 1, 1, 64);
    ac_emit("corpus", "seed-topk-pool-select-workspace", &k);
    k = topk_case(API_ATTN_TOPK, SK_DTYPE_F32, 1, 130, 200, 2, 1, 4);
    k.mask = SK_MASK_CAUSAL;
    k.topk_mask = SK_MASK_CAUSAL;
    ac_emit("corpus", "seed-attn-topk", &k);
    k = topk_case(API_ATTN_TOPK, SK_DTYPE_F16, 1, 130, 200, 2, 1, 4);
    k.attn_fault = 7;
    ac_emit("corpus", "seed-attn-topk-k-strides-differ", &k);
    k = topk_case(API_ATTN_TOPK_WORKSPACE, SK_DTYPE_F16, 1, 130, 200, 2, 1, 8);
    ac_emit("corpus", "seed-attn-topk-workspace", &k);
    k = topk_case(API_SELECT_TOPK, SK_DTYPE_F16, 1, 100, 100, 1, 1, 8);
    k.k = -1;
    ac_emit("corpus", "seed-topk-k-negative", &k);

    /* Found by fuzz_api: with a capacity of 0 (k, sinks, local all 0) and
     * layout->col_indices NULL (allowed then), the CPU selection forms
     * NULL + 0 (UBSan: applying zero offset to null pointer). */
    k = topk_case(API_FROM_SCORES, SK_DTYPE_F16, 1, 100, 100, 1, 1, 8);
    k.k = k.sink_blocks = k.local_blocks = 0;
    k.place.null_mask = 1u << 2; /* col_indices */
    ac_emit("regressions", "gen-topk-null-indices-capacity-0", &k);

    /* Defect 1 through a top-k descriptor: Sk = INT64_MAX. */
    k = topk_case(API_TOPK_CAPACITY, SK_DTYPE_F16, 1, 1, INT64_MAX, 1, 1, 8);
    ac_emit("regressions", "gen-topk-capacity-seq-k-int64-max", &k);
    /* Defect 3 in sk_attention_topk: F32, Sq = Sk = 64, H = 1, D = 4: q, k,
     * v, o 1024 bytes, lse 256; LSE inside V. */
    k = topk_case(API_ATTN_TOPK, SK_DTYPE_F32, 1, 64, 64, 1, 1, 4);
    k.place.mode = 2;
    const int64_t at[8] = {0, 1024, 2048, 3072, 2048, 4096, 4104, 0};
    memcpy(k.place.at, at, sizeof at);
    ac_emit("regressions", "gen-attn-topk-lse-over-v", &k);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: make_seeds <tests/fuzz directory>\n");
        return 2;
    }
    root = argv[1];
    layout_seeds();
    attention_seeds();
    backward_seeds();
    gemm_seeds();
    topk_seeds();
    printf("make_seeds: %d files written under %s\n", written, root);
    return 0;
}
