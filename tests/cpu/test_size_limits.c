/*
 * test_size_limits.c - sizes at the edges of int32 and int64: grids,
 * layout builders, attention / GEMM / top-k descriptors and strides.
 *
 * Every size the library derives (block counts, slice x row counts, dense
 * block counts, element and byte spans) must be refused cleanly when it
 * does not fit, and accepted when it lands exactly on the limit. The cases
 * sit at INT64_MAX, INT64_MAX - k for small k, and at products landing
 * exactly on INT32_MAX / INT64_MAX and one past. A refused call must write
 * nothing (outputs keep their sentinels) and must not touch memory: under
 * ASan a builder that writes past its arrays fails the run.
 *
 * "Accepted" is observed without running on huge buffers: a descriptor
 * through a call that checks only the geometry (workspace size, capacity),
 * a tensor extent by the NEXT check failing (a later tensor with a negative
 * stride), so the call returns before any data is touched.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common/harness.h"
#include "common/test_util.h"
#include "sparsek.h"

/* INT64_MAX = 7^2 x 73 x 127 x 337 x 92737 x 649657: 49 x 73 slices of
 * INT64_MAX / 3577 row blocks is exactly INT64_MAX rows. */
#define SLICES_OF_INT64_MAX 3577

/* sk_grid_blocks fails with `want`, the message holds `needle`, and the
 * outputs keep their sentinels. */
static void expect_grid_refused(const sk_grid *g, const char *needle) {
    int32_t rb = -7, cb = -7, ns = -7;
    const sk_status st = sk_grid_blocks(g, &rb, &cb, &ns);
    CHECK(st == SK_STATUS_BAD_LAYOUT_OVERFLOW,
          "grid %lld x %lld (blocks %d, %d x %d slices): got %s (%s), rb %d cb %d",
          (long long)g->rows, (long long)g->cols, (int)g->block_rows, (int)g->batch, (int)g->heads,
          sk_status_name(st), sk_last_error(), (int)rb, (int)cb);
    CHECK(strstr(sk_last_error(), needle) != NULL, "message \"%s\" lacks \"%s\"", sk_last_error(),
          needle);
    CHECK(rb == -7 && cb == -7 && ns == -7, "outputs written on failure: %d %d %d", (int)rb,
          (int)cb, (int)ns);
}

static void expect_grid_accepted(const sk_grid *g, int64_t want_rb, int64_t want_cb) {
    int32_t rb = -7, cb = -7, ns = -7;
    const sk_status st = sk_grid_blocks(g, &rb, &cb, &ns);
    CHECK(st == SK_STATUS_SUCCESS, "grid %lld x %lld: %s (%s)", (long long)g->rows,
          (long long)g->cols, sk_status_name(st), sk_last_error());
    CHECK(rb == want_rb && cb == want_cb, "blocks %d x %d, want %lld x %lld", (int)rb, (int)cb,
          (long long)want_rb, (long long)want_cb);
}

/* Rows or cols within two blocks of INT64_MAX: ceil(x / block) must not
 * wrap into a small count (it did: {1, INT64_MAX} gave one column block). */
SK_TEST(size_limits_grid_near_int64_max) {
    const int32_t blocks[2] = {64, 128};
    for (int b = 0; b < 2; ++b)
        for (int64_t k = 0; k <= 2 * blocks[b] + 1; ++k) {
            const sk_grid wide = tu_grid(1, INT64_MAX - k, blocks[b], blocks[b], 1, 1);
            expect_grid_refused(&wide, "block count");
            const sk_grid tall = tu_grid(INT64_MAX - k, 1, blocks[b], blocks[b], 1, 1);
            expect_grid_refused(&tall, "row-offset");
        }
    /* The report's grid. */
    const sk_grid g = tu_grid(1, INT64_MAX, 64, 64, 1, 1);
    expect_grid_refused(&g, "block count");
    /* slices x row blocks overflowing int64 itself. */
    const sk_grid huge = tu_grid(INT64_MAX, 1, 64, 64, INT32_MAX, INT32_MAX);
    expect_grid_refused(&huge, "row-offset");
}

/* slices x row_blocks exactly INT64_MAX: "+ 1" must not be computed. */
SK_TEST(size_limits_grid_rows_total_exactly_int64_max) {
    const int64_t rb = INT64_MAX / SLICES_OF_INT64_MAX;
    CHECK(rb * SLICES_OF_INT64_MAX == INT64_MAX, "factorisation");
    const sk_grid g = tu_grid(rb * 64, 64, 64, 64, 49, 73);
    expect_grid_refused(&g, "row-offset");
    const sk_grid g1 = tu_grid(rb * 64 - 63, 64, 64, 64, 49, 73); /* the same rb, a tail block */
    expect_grid_refused(&g1, "row-offset");
}

/* The int32 limits: slices x row_blocks + 1 <= INT32_MAX and col_blocks
 * <= INT32_MAX. The dense block count, their product, is no longer bounded
 * (docs/perf/context_parallel.md section 7): grids past INT32_MAX dense
 * blocks are accepted, each count exactly at its edge too. */
SK_TEST(size_limits_grid_int32_edges) {
    const sk_grid rows_ok = tu_grid(64 * (int64_t)(INT32_MAX - 1), 64, 64, 64, 1, 1);
    expect_grid_accepted(&rows_ok, INT32_MAX - 1, 1);
    const sk_grid rows_over = tu_grid(64 * (int64_t)INT32_MAX, 64, 64, 64, 1, 1);
    expect_grid_refused(&rows_over, "row-offset");
    const sk_grid rows_over_tail = tu_grid(64 * (int64_t)(INT32_MAX - 1) + 1, 64, 64, 64, 1, 1);
    expect_grid_refused(&rows_over_tail, "row-offset");
    /* col_blocks exactly INT32_MAX (a tail block), and one past. */
    const sk_grid cols_ok = tu_grid(1, 128 * (int64_t)INT32_MAX, 128, 128, 1, 1);
    expect_grid_accepted(&cols_ok, 1, INT32_MAX);
    const sk_grid cols_ok_tail = tu_grid(1, 128 * (int64_t)(INT32_MAX - 1) + 1, 128, 128, 1, 1);
    expect_grid_accepted(&cols_ok_tail, 1, INT32_MAX);
    const sk_grid cols_over = tu_grid(1, 128 * (int64_t)INT32_MAX + 1, 128, 128, 1, 1);
    expect_grid_refused(&cols_over, "column block count");
    /* Dense counts past INT32_MAX: 2^31 exactly (once refused), and both
     * counts at their edges at once (~2^62 dense blocks). */
    const sk_grid prod_2_31 = tu_grid(64 * 64, 64 * ((int64_t)1 << 15), 64, 64, 64, 16);
    expect_grid_accepted(&prod_2_31, 64, (int64_t)1 << 15);
    const sk_grid both_edges =
        tu_grid(64 * (int64_t)(INT32_MAX - 1), 64 * (int64_t)INT32_MAX, 64, 64, 1, 1);
    expect_grid_accepted(&both_edges, INT32_MAX - 1, INT32_MAX);
    /* The 16M-token grid of issue 33: 131072 x 131072 blocks of 128. */
    const sk_grid s16m = tu_grid((int64_t)1 << 24, (int64_t)1 << 24, 128, 128, 1, 1);
    expect_grid_accepted(&s16m, 131072, 131072);
}

/* Every builder refuses the hostile grids with *out untouched; before the
 * fix causal and strided wrote far past a one-element array (SIGSEGV) and
 * the window builders failed their own self-check. */
SK_TEST(size_limits_builders_refuse_overflowing_grids) {
    const int64_t rb = INT64_MAX / SLICES_OF_INT64_MAX;
    const sk_grid grids[5] = {
        tu_grid(1, INT64_MAX, 64, 64, 1, 1), tu_grid(1, INT64_MAX - 63, 64, 64, 1, 1),
        tu_grid(INT64_MAX, 1, 128, 128, 1, 1), tu_grid(rb * 64, 64, 64, 64, 49, 73),
        tu_grid(1, 128 * (int64_t)INT32_MAX + 1, 128, 128, 1, 1)};
    static char sentinel_object;
    sk_layout_t const sentinel = (sk_layout_t)(void *)&sentinel_object;
    const uint8_t mask[1] = {1};
    const float scores[1] = {1.0f};
    const int32_t counts[1] = {1}, indices[1] = {0};
    sk_topk_options opt;
    memset(&opt, 0, sizeof opt);
    opt.k = 1;
    for (int i = 0; i < 5; ++i) {
        const sk_grid *g = &grids[i];
        sk_status st[9];
        sk_layout_t out[9];
        for (int j = 0; j < 9; ++j) out[j] = sentinel;
        st[0] = sk_layout_create_dense(&out[0], g);
        st[1] = sk_layout_create_causal(&out[1], g);
        st[2] = sk_layout_create_window(&out[2], g, 0, 0);
        st[3] = sk_layout_create_sinks_window(&out[3], g, 1, 1);
        st[4] = sk_layout_create_strided(&out[4], g, 2, 1, 1);
        st[5] = sk_layout_create_random(&out[5], g, 1, 7, 1);
        st[6] = sk_layout_create_topk(&out[6], g, scores, &opt);
        st[7] = sk_layout_create_from_mask(&out[7], g, mask);
        st[8] = sk_layout_create_from_flex(&out[8], g, counts, indices, 1);
        for (int j = 0; j < 9; ++j) {
            CHECK(st[j] == SK_STATUS_BAD_LAYOUT_OVERFLOW, "grid %d, builder %d: %s", i, j,
                  sk_status_name(st[j]));
            CHECK(out[j] == sentinel, "grid %d, builder %d wrote *out", i, j);
        }
    }
}

/* ---------------------------------------------------------------------------
 * Attention descriptors: byte sizes through sk_attention_workspace_size (the
 * geometry alone), on a grid that is itself fine.
 * ------------------------------------------------------------------------- */

static sk_status attention_geometry(sk_dtype dtype, int64_t batch, int64_t seq, int64_t heads,
                                    int64_t dim) {
    sk_attention_desc d;
    sk_attention_desc_init(&d, sizeof d);
    d.backend = SK_BACKEND_CPU;
    d.dtype = dtype;
    d.batch = batch;
    d.seq_q = d.seq_k = seq;
    d.heads_q = d.heads_kv = heads;
    d.head_dim = dim;
    int32_t dummy = 0;
    sk_bsr layout;
    memset(&layout, 0, sizeof layout);
    layout.grid = tu_grid(seq, seq, 64, 64, 1, 1);
    layout.row_offsets = &dummy;
    size_t bytes = 77;
    return sk_attention_workspace_size(&d, &layout, &bytes);
}

SK_TEST(size_limits_attention_descriptor_bytes) {
    /* F32 Q of B = Sq = H = 1: D x 4 bytes; INT64_MAX / 4 fits exactly
     * (INT64_MAX - 3 bytes), one more overflows. */
    sk_status st = attention_geometry(SK_DTYPE_F32, 1, 1, 1, INT64_MAX / 4);
    CHECK(st == SK_STATUS_SUCCESS, "D = INT64_MAX / 4: %s %s", sk_status_name(st), sk_last_error());
    st = attention_geometry(SK_DTYPE_F32, 1, 1, 1, INT64_MAX / 4 + 1);
    CHECK(st == SK_STATUS_BAD_PARAM_OVERFLOW, "D = INT64_MAX / 4 + 1: %s", sk_status_name(st));
    CHECK(strstr(sk_last_error(), "q and o") != NULL, "%s", sk_last_error());
    /* F16 with D = INT64_MAX / 2: elements exactly INT64_MAX / 2, bytes
     * INT64_MAX - 1; D = INT64_MAX: the element count lands on INT64_MAX. */
    st = attention_geometry(SK_DTYPE_F16, 1, 1, 1, INT64_MAX / 2);
    CHECK(st == SK_STATUS_SUCCESS, "F16 D = INT64_MAX / 2: %s %s", sk_status_name(st),
          sk_last_error());
    st = attention_geometry(SK_DTYPE_F16, 1, 1, 1, INT64_MAX);
    CHECK(st == SK_STATUS_BAD_PARAM_OVERFLOW, "F16 D = INT64_MAX: %s", sk_status_name(st));
    /* Products of five factors: B x S x H x D x 2 bytes = 2^30 x 2^6 x 2^24
     * x 2^2 x 2 = 2^63: one past; with D = 2, 2^62 fits. */
    st = attention_geometry(SK_DTYPE_F16, (int64_t)1 << 30, 64, (int64_t)1 << 24, 4);
    CHECK(st == SK_STATUS_BAD_PARAM_OVERFLOW, "2^63 bytes: %s", sk_status_name(st));
    st = attention_geometry(SK_DTYPE_F16, (int64_t)1 << 30, 64, (int64_t)1 << 24, 2);
    CHECK(st == SK_STATUS_SUCCESS, "2^62 bytes: %s %s", sk_status_name(st), sk_last_error());
    /* LSE [B, Hq, Sq] fp32 is twice Q's bytes when D = 1 in F16: B x Hq x
     * Sq = 2^61 fits Q (2^62 bytes) but not LSE (2^63 bytes). */
    st = attention_geometry(SK_DTYPE_F16, (int64_t)1 << 30, 64, (int64_t)1 << 25, 1);
    CHECK(st == SK_STATUS_BAD_PARAM_OVERFLOW, "LSE 2^63 bytes: %s", sk_status_name(st));
    CHECK(strstr(sk_last_error(), "lse") != NULL, "%s", sk_last_error());
}

/* ---------------------------------------------------------------------------
 * Strides: a tensor extent at the int64 edge. Q [B = 8, Sq = 64, H = 1,
 * D = 1] F32 with a batch stride s: span = 1 + 7 s + 63 elements.
 * ------------------------------------------------------------------------- */

typedef struct stride_case {
    int64_t batch_stride;
    sk_status want;
    const char *needle;
} stride_case;

SK_TEST(size_limits_attention_strides) {
    /* 7 x (INT64_MAX / 7) lands exactly on INT64_MAX: the element span
     * overflows. Smaller strides give element spans that fit but byte spans
     * that do not, until span x 4 <= INT64_MAX. */
    const int64_t s_bytes_ok = (INT64_MAX / 4 - 64) / 7; /* span exactly INT64_MAX / 4 */
    const stride_case cases[4] = {
        {INT64_MAX / 7, SK_STATUS_BAD_PARAM_OVERFLOW, "q: extent 8 x stride"},
        {(INT64_MAX - 64) / 7, SK_STATUS_BAD_PARAM_OVERFLOW, "q: the byte span"},
        {s_bytes_ok + 1, SK_STATUS_BAD_PARAM_OVERFLOW, "q: the byte span"},
        /* accepted: the next check (k's negative stride) answers */
        {s_bytes_ok, SK_STATUS_BAD_PARAM_STRIDE, "k stride over seq"}};
    float dummy[4] = {0, 0, 0, 0};
    int32_t off[2] = {0, 1}, idx[1] = {0};
    for (int i = 0; i < 4; ++i) {
        sk_attention_desc d;
        sk_attention_desc_init(&d, sizeof d);
        d.backend = SK_BACKEND_CPU;
        d.dtype = SK_DTYPE_F32;
        d.batch = 8;
        d.seq_q = d.seq_k = 64;
        d.heads_q = d.heads_kv = 1;
        d.head_dim = 1;
        d.q_strides[0] = cases[i].batch_stride;
        d.q_strides[1] = 1;
        d.q_strides[2] = 1;
        d.k_strides[0] = 64;
        d.k_strides[1] = -1;
        d.k_strides[2] = 1;
        sk_bsr layout;
        memset(&layout, 0, sizeof layout);
        layout.grid = tu_grid(64, 64, 64, 64, 1, 1);
        layout.nnz = 1;
        layout.row_offsets = off;
        layout.col_indices = idx;
        /* The pointers are never dereferenced: every case fails a check. */
        const sk_status st =
            sk_attention_run(&d, &layout, dummy, dummy, dummy, dummy + 2, NULL, NULL, 0, NULL);
        CHECK(st == cases[i].want, "stride %lld: got %s, want %s (%s)",
              (long long)cases[i].batch_stride, sk_status_name(st), sk_status_name(cases[i].want),
              sk_last_error());
        CHECK(strstr(sk_last_error(), cases[i].needle) != NULL,
              "stride %lld: message \"%s\" lacks \"%s\"", (long long)cases[i].batch_stride,
              sk_last_error(), cases[i].needle);
        CHECK(dummy[2] == 0.0f && dummy[3] == 0.0f, "o written");
    }
}

/* ---------------------------------------------------------------------------
 * GEMM: B [k, n] and C [m, n] spans through sk_bsr_gemm_workspace_size.
 * ------------------------------------------------------------------------- */

static sk_status gemm_geometry(int64_t ldb, int64_t ldc) {
    sk_bsr_gemm_desc d;
    sk_bsr_gemm_desc_init(&d, sizeof d);
    d.backend = SK_BACKEND_CPU;
    d.ab_dtype = SK_DTYPE_F32;
    d.c_dtype = SK_DTYPE_F32;
    d.m = d.k = 2;
    d.n = 1;
    d.ldb = ldb;
    d.ldc = ldc;
    int32_t off[2] = {0, 0};
    sk_bsr a;
    memset(&a, 0, sizeof a);
    a.grid = tu_grid(2, 2, 64, 64, 1, 1);
    a.row_offsets = off;
    size_t bytes = 77;
    return sk_bsr_gemm_workspace_size(&d, &a, &bytes);
}

SK_TEST(size_limits_gemm_leading_dimensions) {
    /* Two rows of ld elements, n = 1: (ld + 1) x 4 bytes. */
    const int64_t ld_max = INT64_MAX / 4 - 1;
    sk_status st = gemm_geometry(ld_max, 0);
    CHECK(st == SK_STATUS_SUCCESS, "ldb = INT64_MAX / 4 - 1: %s %s", sk_status_name(st),
          sk_last_error());
    st = gemm_geometry(ld_max + 1, 0);
    CHECK(st == SK_STATUS_BAD_PARAM_OVERFLOW && strstr(sk_last_error(), "b:") != NULL,
          "ldb one past: %s %s", sk_status_name(st), sk_last_error());
    st = gemm_geometry(INT64_MAX, 0); /* ld + 1 itself overflows */
    CHECK(st == SK_STATUS_BAD_PARAM_OVERFLOW && strstr(sk_last_error(), "b:") != NULL,
          "ldb = INT64_MAX: %s %s", sk_status_name(st), sk_last_error());
    st = gemm_geometry(0, ld_max);
    CHECK(st == SK_STATUS_SUCCESS, "ldc = INT64_MAX / 4 - 1: %s %s", sk_status_name(st),
          sk_last_error());
    st = gemm_geometry(0, ld_max + 1);
    CHECK(st == SK_STATUS_BAD_PARAM_OVERFLOW && strstr(sk_last_error(), "c:") != NULL,
          "ldc one past: %s %s", sk_status_name(st), sk_last_error());
}

/* ---------------------------------------------------------------------------
 * Top-k descriptors (sk_topk_layout_capacity: the descriptor alone) and
 * the pooling's Q / K extents.
 * ------------------------------------------------------------------------- */

static void topk_desc_of(sk_topk_desc *d, int64_t seq, int64_t dim) {
    sk_topk_desc_init(d, sizeof *d);
    d->backend = SK_BACKEND_CPU;
    d->dtype = SK_DTYPE_F32;
    d->batch = 1;
    d->seq_q = d->seq_k = seq;
    d->heads_q = d->heads_kv = 1;
    d->head_dim = dim;
    d->block_q = d->block_k = 64;
    d->k = 1;
}

SK_TEST(size_limits_topk_descriptor_bytes) {
    /* Q: 64 tokens x D x 4 bytes: D = INT64_MAX / 256 fits, one more not. */
    sk_topk_desc d;
    sk_grid g;
    int32_t cap = -7;
    topk_desc_of(&d, 64, INT64_MAX / 256);
    sk_status st = sk_topk_layout_capacity(&d, &g, &cap);
    CHECK(st == SK_STATUS_SUCCESS && cap == 1, "D = INT64_MAX / 256: %s %s cap %d",
          sk_status_name(st), sk_last_error(), (int)cap);
    cap = -7;
    topk_desc_of(&d, 64, INT64_MAX / 256 + 1);
    st = sk_topk_layout_capacity(&d, &g, &cap);
    CHECK(st == SK_STATUS_BAD_PARAM_OVERFLOW && cap == -7, "one past: %s", sk_status_name(st));
    /* The report's shape: seq_k within a block of INT64_MAX. */
    topk_desc_of(&d, 64, 16);
    d.seq_k = INT64_MAX;
    st = sk_topk_layout_capacity(&d, &g, &cap);
    CHECK(st == SK_STATUS_BAD_LAYOUT_OVERFLOW && cap == -7, "seq_k = INT64_MAX: %s",
          sk_status_name(st));
}

SK_TEST(size_limits_topk_pool_extents) {
    /* Q [1, 8, 1, 1] F32 with seq stride s: span 7 s + 1 elements;
     * 7 x (INT64_MAX / 7) lands exactly on INT64_MAX. */
    const int64_t s_ok = (INT64_MAX / 4 - 1) / 7; /* span exactly INT64_MAX / 4 */
    const int64_t strides[3] = {s_ok + 1, INT64_MAX / 7, s_ok};
    const sk_status want[3] = {SK_STATUS_BAD_PARAM_OVERFLOW, SK_STATUS_BAD_PARAM_OVERFLOW,
                               SK_STATUS_BAD_PARAM_STRIDE};
    const char *const needle[3] = {"q: the byte span", "q: extent 8 x stride", "k stride over seq"};
    float dummy[4] = {0, 0, 0, 0};
    for (int i = 0; i < 3; ++i) {
        sk_topk_desc d;
        topk_desc_of(&d, 8, 1);
        d.q_strides[0] = 1;
        d.q_strides[1] = strides[i];
        d.q_strides[2] = 1;
        d.k_strides[0] = 8;
        d.k_strides[1] = -1;
        d.k_strides[2] = 1;
        const sk_status st = sk_block_pool(&d, dummy, dummy, dummy + 2, dummy + 3, NULL);
        CHECK(st == want[i] && strstr(sk_last_error(), needle[i]) != NULL,
              "stride %lld: %s \"%s\", want %s \"%s\"", (long long)strides[i], sk_status_name(st),
              sk_last_error(), sk_status_name(want[i]), needle[i]);
        CHECK(dummy[2] == 0.0f && dummy[3] == 0.0f, "pooled written");
    }
}
