/*
 * test_layout_errors.c - bad inputs of the layout API: sk_layout_validate's
 * statuses one by one, and every builder's and converter's argument checks.
 * Each case checks the status, that sk_last_error() names the argument or
 * problem, and that nothing was written (*out keeps a sentinel, output
 * buffers keep their fill).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/harness.h"
#include "sparsek.h"

/* Expect `call` to fail with `want` and a message containing `needle`. */
#define EXPECT_STATUS(call, want, needle)                                                          \
    do {                                                                                           \
        sk_status st_ = (call);                                                                    \
        CHECK(st_ == (want), "%s: got %s, expected %s (%s)", #call, sk_status_name(st_),           \
              sk_status_name(want), sk_last_error());                                              \
        CHECK(strstr(sk_last_error(), (needle)) != NULL, "%s: message \"%s\" lacks \"%s\"", #call, \
              sk_last_error(), (needle));                                                          \
    } while (0)

static char sentinel_object;
#define SENTINEL ((sk_layout_t)(void *)&sentinel_object)

static sk_grid err_grid(int64_t rows, int64_t cols) {
    sk_grid g;
    memset(&g, 0, sizeof g);
    g.rows = rows;
    g.cols = cols;
    g.block_rows = 64;
    g.block_cols = 64;
    g.batch = 1;
    g.heads = 1;
    return g;
}

/* ---------------------------------------------------------------------------
 * sk_layout_validate: one status each. Grid 128 x 256 tokens: 2 x 4 blocks.
 * ------------------------------------------------------------------------- */

static sk_bsr bsr_of(int32_t *off, int32_t *idx, int32_t nnz) {
    sk_bsr b;
    memset(&b, 0, sizeof b);
    b.grid = err_grid(128, 256);
    b.nnz = nnz;
    b.row_offsets = off;
    b.col_indices = idx;
    return b;
}

SK_TEST(layout_validate_accepts_a_good_layout) {
    int32_t off[3] = {0, 2, 3}, idx[3] = {1, 3, 0};
    sk_bsr b = bsr_of(off, idx, 3);
    sk_status st = sk_layout_validate(&b);
    CHECK(st == SK_STATUS_SUCCESS, "%s", sk_last_error());
    CHECK(sk_last_error()[0] == '\0', "%s", sk_last_error());
}

SK_TEST(layout_validate_rejects_unsorted) {
    int32_t off[3] = {0, 2, 3}, idx[3] = {3, 1, 0};
    sk_bsr b = bsr_of(off, idx, 3);
    EXPECT_STATUS(sk_layout_validate(&b), SK_STATUS_BAD_LAYOUT_UNSORTED, "col_indices[1]");
}

SK_TEST(layout_validate_rejects_duplicate) {
    int32_t off[3] = {0, 1, 3}, idx[3] = {1, 2, 2};
    sk_bsr b = bsr_of(off, idx, 3);
    EXPECT_STATUS(sk_layout_validate(&b), SK_STATUS_BAD_LAYOUT_DUPLICATE, "col_indices[2]");
}

SK_TEST(layout_validate_rejects_index_out_of_range) {
    int32_t off[3] = {0, 2, 3}, idx[3] = {1, 4, 0};
    sk_bsr b = bsr_of(off, idx, 3);
    EXPECT_STATUS(sk_layout_validate(&b), SK_STATUS_BAD_LAYOUT_INDEX_RANGE, "col_indices[1]");
    int32_t neg[3] = {-1, 2, 0};
    b.col_indices = neg;
    EXPECT_STATUS(sk_layout_validate(&b), SK_STATUS_BAD_LAYOUT_INDEX_RANGE, "col_indices[0]");
}

SK_TEST(layout_validate_rejects_first_offset_not_zero) {
    int32_t off[3] = {1, 2, 3}, idx[3] = {1, 2, 0};
    sk_bsr b = bsr_of(off, idx, 3);
    EXPECT_STATUS(sk_layout_validate(&b), SK_STATUS_BAD_LAYOUT_OFFSETS, "row_offsets[0]");
}

SK_TEST(layout_validate_rejects_decreasing_offsets) {
    int32_t off[3] = {0, 3, 2}, idx[3] = {1, 2, 3};
    sk_bsr b = bsr_of(off, idx, 3);
    EXPECT_STATUS(sk_layout_validate(&b), SK_STATUS_BAD_LAYOUT_OFFSETS, "row_offsets");
}

SK_TEST(layout_validate_rejects_wrong_total_count) {
    int32_t off[3] = {0, 1, 2}, idx[3] = {1, 2, 3};
    sk_bsr b = bsr_of(off, idx, 3); /* last offset 2, nnz 3 */
    EXPECT_STATUS(sk_layout_validate(&b), SK_STATUS_BAD_LAYOUT_COUNT, "nnz");
}

SK_TEST(layout_validate_rejects_overflowing_grids) {
    int32_t off[3] = {0, 0, 0};
    sk_bsr b = bsr_of(off, NULL, 0);
    b.grid.rows = (int64_t)1 << 40; /* 2^34 row blocks: no int32 row offsets */
    EXPECT_STATUS(sk_layout_validate(&b), SK_STATUS_BAD_LAYOUT_OVERFLOW, "int32");
    b.grid.rows = 64;
    b.grid.cols = (int64_t)64 << 31; /* 2^31 column blocks: no int32 col_indices */
    EXPECT_STATUS(sk_layout_validate(&b), SK_STATUS_BAD_LAYOUT_OVERFLOW, "int32");
    b.grid.rows = 64 * 50000;
    b.grid.cols = 64;
    b.grid.batch = 50000; /* 50000 slices x 50000 rows */
    EXPECT_STATUS(sk_layout_validate(&b), SK_STATUS_BAD_LAYOUT_OVERFLOW, "int32");
}

SK_TEST(layout_validate_rejects_null_arrays) {
    int32_t idx[3] = {0, 1, 2};
    sk_bsr b = bsr_of(NULL, idx, 3);
    EXPECT_STATUS(sk_layout_validate(&b), SK_STATUS_BAD_PARAM_NULL_POINTER, "row_offsets");
    int32_t off[3] = {0, 1, 3};
    b = bsr_of(off, NULL, 3);
    EXPECT_STATUS(sk_layout_validate(&b), SK_STATUS_BAD_PARAM_NULL_POINTER, "col_indices");
    EXPECT_STATUS(sk_layout_validate(NULL), SK_STATUS_BAD_PARAM_NULL_POINTER, "layout");
}

/* ---------------------------------------------------------------------------
 * Builders: pointers, grid, values. *out must keep its sentinel.
 * ------------------------------------------------------------------------- */

SK_TEST(layout_builders_reject_null_out) {
    sk_grid g = err_grid(128, 128);
    const char *needle = "out";
    EXPECT_STATUS(sk_layout_create_dense(NULL, &g), SK_STATUS_BAD_PARAM_NULL_POINTER, needle);
    EXPECT_STATUS(sk_layout_create_causal(NULL, &g), SK_STATUS_BAD_PARAM_NULL_POINTER, needle);
    EXPECT_STATUS(sk_layout_create_window(NULL, &g, 1, 1), SK_STATUS_BAD_PARAM_NULL_POINTER,
                  needle);
    EXPECT_STATUS(sk_layout_create_sinks_window(NULL, &g, 1, 1), SK_STATUS_BAD_PARAM_NULL_POINTER,
                  needle);
    EXPECT_STATUS(sk_layout_create_strided(NULL, &g, 1, 1, 0), SK_STATUS_BAD_PARAM_NULL_POINTER,
                  needle);
    EXPECT_STATUS(sk_layout_create_random(NULL, &g, 1, 1, 0), SK_STATUS_BAD_PARAM_NULL_POINTER,
                  needle);
    float scores[4] = {0};
    sk_topk_options opt;
    memset(&opt, 0, sizeof opt);
    EXPECT_STATUS(sk_layout_create_topk(NULL, &g, scores, &opt), SK_STATUS_BAD_PARAM_NULL_POINTER,
                  needle);
    uint8_t mask[4] = {0};
    EXPECT_STATUS(sk_layout_create_from_mask(NULL, &g, mask), SK_STATUS_BAD_PARAM_NULL_POINTER,
                  needle);
    int32_t counts[2] = {0}, indices[4] = {0};
    EXPECT_STATUS(sk_layout_create_from_flex(NULL, &g, counts, indices, 2),
                  SK_STATUS_BAD_PARAM_NULL_POINTER, needle);
    int32_t off[3] = {0};
    sk_bsr b;
    memset(&b, 0, sizeof b);
    b.grid = g;
    b.row_offsets = off;
    EXPECT_STATUS(sk_layout_create_from_bsr(NULL, &b), SK_STATUS_BAD_PARAM_NULL_POINTER, needle);
}

SK_TEST(layout_builders_reject_null_grid) {
    sk_layout_t out = SENTINEL;
    EXPECT_STATUS(sk_layout_create_dense(&out, NULL), SK_STATUS_BAD_PARAM_NULL_POINTER, "grid");
    EXPECT_STATUS(sk_layout_create_causal(&out, NULL), SK_STATUS_BAD_PARAM_NULL_POINTER, "grid");
    EXPECT_STATUS(sk_layout_create_window(&out, NULL, 1, 1), SK_STATUS_BAD_PARAM_NULL_POINTER,
                  "grid");
    EXPECT_STATUS(sk_layout_create_sinks_window(&out, NULL, 1, 1), SK_STATUS_BAD_PARAM_NULL_POINTER,
                  "grid");
    EXPECT_STATUS(sk_layout_create_strided(&out, NULL, 1, 1, 0), SK_STATUS_BAD_PARAM_NULL_POINTER,
                  "grid");
    EXPECT_STATUS(sk_layout_create_random(&out, NULL, 1, 1, 0), SK_STATUS_BAD_PARAM_NULL_POINTER,
                  "grid");
    float scores[4] = {0};
    sk_topk_options opt;
    memset(&opt, 0, sizeof opt);
    EXPECT_STATUS(sk_layout_create_topk(&out, NULL, scores, &opt), SK_STATUS_BAD_PARAM_NULL_POINTER,
                  "grid");
    uint8_t mask[4] = {0};
    EXPECT_STATUS(sk_layout_create_from_mask(&out, NULL, mask), SK_STATUS_BAD_PARAM_NULL_POINTER,
                  "grid");
    int32_t counts[2] = {0}, indices[4] = {0};
    EXPECT_STATUS(sk_layout_create_from_flex(&out, NULL, counts, indices, 2),
                  SK_STATUS_BAD_PARAM_NULL_POINTER, "grid");
    EXPECT_STATUS(sk_layout_create_from_bsr(&out, NULL), SK_STATUS_BAD_PARAM_NULL_POINTER,
                  "layout");
    CHECK(out == SENTINEL, "*out was written");
}

SK_TEST(layout_builders_reject_bad_grids) {
    sk_layout_t out = SENTINEL;
    sk_grid g = err_grid(128, 128);
    g.block_rows = 96;
    EXPECT_STATUS(sk_layout_create_dense(&out, &g), SK_STATUS_BAD_PARAM_VALUE, "block_rows = 96");
    EXPECT_STATUS(sk_layout_create_random(&out, &g, 1, 7, 0), SK_STATUS_BAD_PARAM_VALUE,
                  "block_rows");
    g = err_grid(128, 128);
    g.block_cols = 96;
    EXPECT_STATUS(sk_layout_create_causal(&out, &g), SK_STATUS_BAD_PARAM_VALUE, "block_cols = 96");
    g = err_grid(0, 128);
    EXPECT_STATUS(sk_layout_create_window(&out, &g, 1, 1), SK_STATUS_BAD_PARAM_SHAPE, "rows = 0");
    g = err_grid(128, -5);
    EXPECT_STATUS(sk_layout_create_sinks_window(&out, &g, 1, 1), SK_STATUS_BAD_PARAM_SHAPE,
                  "cols = -5");
    g = err_grid(128, 128);
    g.heads = 0;
    EXPECT_STATUS(sk_layout_create_strided(&out, &g, 1, 1, 0), SK_STATUS_BAD_PARAM_SHAPE,
                  "heads = 0");
    g = err_grid(64 * 50000, 64 * 50000);
    EXPECT_STATUS(sk_layout_create_dense(&out, &g), SK_STATUS_BAD_LAYOUT_OVERFLOW, "int32");
    CHECK(out == SENTINEL, "*out was written");
}

SK_TEST(layout_builders_reject_bad_values) {
    sk_layout_t out = SENTINEL;
    sk_grid g = err_grid(256, 256);
    EXPECT_STATUS(sk_layout_create_window(&out, &g, -1, 4), SK_STATUS_BAD_PARAM_VALUE, "left = -1");
    EXPECT_STATUS(sk_layout_create_window(&out, &g, 4, -2), SK_STATUS_BAD_PARAM_VALUE,
                  "right = -2");
    EXPECT_STATUS(sk_layout_create_sinks_window(&out, &g, -1, 4), SK_STATUS_BAD_PARAM_VALUE,
                  "sink_tokens = -1");
    EXPECT_STATUS(sk_layout_create_sinks_window(&out, &g, 4, 0), SK_STATUS_BAD_PARAM_VALUE,
                  "window_tokens = 0");
    EXPECT_STATUS(sk_layout_create_strided(&out, &g, 0, 1, 1), SK_STATUS_BAD_PARAM_VALUE,
                  "stride = 0");
    EXPECT_STATUS(sk_layout_create_strided(&out, &g, 2, -1, 1), SK_STATUS_BAD_PARAM_VALUE,
                  "local_blocks = -1");
    EXPECT_STATUS(sk_layout_create_random(&out, &g, -3, 1, 0), SK_STATUS_BAD_PARAM_VALUE, "k = -3");
    CHECK(out == SENTINEL, "*out was written");
}

SK_TEST(layout_topk_rejects_bad_arguments) {
    sk_layout_t out = SENTINEL;
    sk_grid g = err_grid(128, 128);
    float scores[4] = {1, 2, 3, 4};
    sk_topk_options opt;
    memset(&opt, 0, sizeof opt);
    opt.k = 1;
    EXPECT_STATUS(sk_layout_create_topk(&out, &g, NULL, &opt), SK_STATUS_BAD_PARAM_NULL_POINTER,
                  "scores");
    EXPECT_STATUS(sk_layout_create_topk(&out, &g, scores, NULL), SK_STATUS_BAD_PARAM_NULL_POINTER,
                  "options");
    opt.k = -1;
    EXPECT_STATUS(sk_layout_create_topk(&out, &g, scores, &opt), SK_STATUS_BAD_PARAM_VALUE,
                  "options->k = -1");
    opt.k = 1;
    opt.sink_blocks = -2;
    EXPECT_STATUS(sk_layout_create_topk(&out, &g, scores, &opt), SK_STATUS_BAD_PARAM_VALUE,
                  "sink_blocks = -2");
    opt.sink_blocks = 0;
    opt.local_blocks = -4;
    EXPECT_STATUS(sk_layout_create_topk(&out, &g, scores, &opt), SK_STATUS_BAD_PARAM_VALUE,
                  "local_blocks = -4");
    CHECK(out == SENTINEL, "*out was written");
}

/* ---------------------------------------------------------------------------
 * Mask and flex conversions
 * ------------------------------------------------------------------------- */

SK_TEST(layout_from_mask_rejects_null_mask) {
    sk_layout_t out = SENTINEL;
    sk_grid g = err_grid(128, 128);
    EXPECT_STATUS(sk_layout_create_from_mask(&out, &g, NULL), SK_STATUS_BAD_PARAM_NULL_POINTER,
                  "mask");
    CHECK(out == SENTINEL, "*out was written");
}

SK_TEST(layout_to_mask_rejects_bad_arguments) {
    int32_t off[3] = {0, 2, 3}, idx[3] = {1, 3, 0};
    sk_bsr b = bsr_of(off, idx, 3); /* 2 x 4 blocks: 8 bytes */
    uint8_t mask[9];
    memset(mask, 0xAB, sizeof mask);
    EXPECT_STATUS(sk_layout_to_mask(&b, mask, 7), SK_STATUS_BAD_PARAM_SHAPE, "mask_bytes = 7");
    EXPECT_STATUS(sk_layout_to_mask(&b, NULL, 8), SK_STATUS_BAD_PARAM_NULL_POINTER, "mask");
    EXPECT_STATUS(sk_layout_to_mask(NULL, mask, 8), SK_STATUS_BAD_PARAM_NULL_POINTER, "layout");
    int32_t bad[3] = {3, 1, 0}; /* unsorted: the view is validated first */
    b.col_indices = bad;
    EXPECT_STATUS(sk_layout_to_mask(&b, mask, 8), SK_STATUS_BAD_LAYOUT_UNSORTED, "col_indices[");
    for (size_t e = 0; e < sizeof mask; ++e) CHECK(mask[e] == 0xAB, "mask[%zu] was written", e);
    b.col_indices = idx;
    CHECK(sk_layout_to_mask(&b, mask, 8) == SK_STATUS_SUCCESS, "%s", sk_last_error());
    CHECK(mask[8] == 0xAB && mask[1] == 1 && mask[3] == 1 && mask[4] == 1 && mask[0] == 0,
          "exact-size mask");
}

SK_TEST(layout_to_flex_rejects_bad_arguments) {
    int32_t off[3] = {0, 2, 3}, idx[3] = {1, 3, 0};
    sk_bsr b = bsr_of(off, idx, 3); /* 2 rows x 4 blocks */
    int32_t counts[2] = {-9, -9}, indices[8];
    for (int e = 0; e < 8; ++e) indices[e] = -9;
    EXPECT_STATUS(sk_layout_to_flex(&b, counts, 1, indices, 8), SK_STATUS_BAD_PARAM_SHAPE,
                  "counts_len = 1");
    EXPECT_STATUS(sk_layout_to_flex(&b, counts, 2, indices, 7), SK_STATUS_BAD_PARAM_SHAPE,
                  "indices_len = 7");
    EXPECT_STATUS(sk_layout_to_flex(&b, NULL, 2, indices, 8), SK_STATUS_BAD_PARAM_NULL_POINTER,
                  "counts");
    EXPECT_STATUS(sk_layout_to_flex(&b, counts, 2, NULL, 8), SK_STATUS_BAD_PARAM_NULL_POINTER,
                  "indices");
    b.nnz = 2; /* last offset 3 */
    EXPECT_STATUS(sk_layout_to_flex(&b, counts, 2, indices, 8), SK_STATUS_BAD_LAYOUT_COUNT,
                  "row_offsets");
    CHECK(counts[0] == -9 && counts[1] == -9, "counts were written");
    for (int e = 0; e < 8; ++e) CHECK(indices[e] == -9, "indices[%d] was written", e);
}

SK_TEST(layout_from_flex_rejects_bad_rows) {
    sk_layout_t out = SENTINEL;
    sk_grid g = err_grid(128, 256); /* 2 rows x 4 blocks */
    int32_t counts[2] = {2, 1};
    int32_t indices[2 * 5] = {3, 1, -1, -1, -1, 0, -1, -1, -1, -1}; /* row_width 5 */
    EXPECT_STATUS(sk_layout_create_from_flex(&out, &g, NULL, indices, 5),
                  SK_STATUS_BAD_PARAM_NULL_POINTER, "counts");
    EXPECT_STATUS(sk_layout_create_from_flex(&out, &g, counts, NULL, 5),
                  SK_STATUS_BAD_PARAM_NULL_POINTER, "indices");
    EXPECT_STATUS(sk_layout_create_from_flex(&out, &g, counts, indices, 0),
                  SK_STATUS_BAD_PARAM_SHAPE, "row_width = 0");
    counts[1] = -1;
    EXPECT_STATUS(sk_layout_create_from_flex(&out, &g, counts, indices, 5),
                  SK_STATUS_BAD_LAYOUT_COUNT, "counts[1] = -1");
    counts[1] = 5; /* > col_blocks (4) */
    EXPECT_STATUS(sk_layout_create_from_flex(&out, &g, counts, indices, 5),
                  SK_STATUS_BAD_LAYOUT_COUNT, "counts[1] = 5");
    counts[1] = 1;
    EXPECT_STATUS(sk_layout_create_from_flex(&out, &g, counts, indices, 1), /* count > width */
                  SK_STATUS_BAD_LAYOUT_COUNT, "counts[0] = 2");
    indices[5] = 4;
    EXPECT_STATUS(sk_layout_create_from_flex(&out, &g, counts, indices, 5),
                  SK_STATUS_BAD_LAYOUT_INDEX_RANGE, "indices[5] = 4");
    indices[5] = -2;
    EXPECT_STATUS(sk_layout_create_from_flex(&out, &g, counts, indices, 5),
                  SK_STATUS_BAD_LAYOUT_INDEX_RANGE, "indices[5] = -2");
    indices[5] = 0;
    indices[1] = 3; /* row 0 lists 3 twice */
    EXPECT_STATUS(sk_layout_create_from_flex(&out, &g, counts, indices, 5),
                  SK_STATUS_BAD_LAYOUT_DUPLICATE, "block 3 more than once");
    CHECK(out == SENTINEL, "*out was written");
    indices[1] = 1;
    sk_status st = sk_layout_create_from_flex(&out, &g, counts, indices, 5);
    CHECK(st == SK_STATUS_SUCCESS, "%s", sk_last_error());
    if (st == SK_STATUS_SUCCESS) sk_layout_destroy(out);
}

SK_TEST(layout_from_bsr_and_view_reject_bad_arguments) {
    sk_layout_t out = SENTINEL;
    int32_t off[3] = {0, 2, 3}, idx[3] = {1, 1, 0};
    sk_bsr b = bsr_of(off, idx, 3);
    EXPECT_STATUS(sk_layout_create_from_bsr(&out, &b), SK_STATUS_BAD_LAYOUT_DUPLICATE,
                  "col_indices[1]");
    CHECK(out == SENTINEL, "*out was written");
    sk_bsr view;
    memset(&view, 0x5A, sizeof view);
    EXPECT_STATUS(sk_layout_view(NULL, &view), SK_STATUS_BAD_PARAM_NULL_POINTER, "layout");
    sk_bsr fresh;
    memset(&fresh, 0x5A, sizeof fresh);
    CHECK(memcmp(&view, &fresh, sizeof view) == 0, "view was written");
    sk_grid g = err_grid(64, 64);
    sk_layout_t layout = NULL;
    REQUIRE(sk_layout_create_dense(&layout, &g) == SK_STATUS_SUCCESS, "%s", sk_last_error());
    EXPECT_STATUS(sk_layout_view(layout, NULL), SK_STATUS_BAD_PARAM_NULL_POINTER, "view");
    sk_layout_destroy(layout);
}

/* ---------------------------------------------------------------------------
 * Misaligned int32 / fp32 arrays: read as such, so refused before any read
 * (found by the atheris harness through Layout.topk, issue 27). Each array
 * is shifted by one byte inside a buffer that holds a good copy.
 * ------------------------------------------------------------------------- */

/* A copy of `n` int32 at one byte past a 4-byte boundary. */
static int32_t *misaligned_i32(unsigned char *buf, const int32_t *src, size_t n) {
    memcpy(buf + 1, src, n * sizeof(int32_t));
    return (int32_t *)(void *)(buf + 1);
}

SK_TEST(layout_functions_reject_misaligned_arrays) {
    int32_t off[3] = {0, 2, 3}, idx[3] = {1, 3, 0};
    int64_t w_off[4], w_idx[4], w_scores[8], w_counts[4], w_flex[8]; /* 8-byte aligned */
    unsigned char *b_off = (unsigned char *)w_off, *b_idx = (unsigned char *)w_idx;
    unsigned char *b_scores = (unsigned char *)w_scores, *b_counts = (unsigned char *)w_counts;
    unsigned char *b_flex = (unsigned char *)w_flex;
    sk_bsr good = bsr_of(off, idx, 3);

    sk_bsr bad = good;
    bad.row_offsets = misaligned_i32(b_off, off, 3);
    EXPECT_STATUS(sk_layout_validate(&bad), SK_STATUS_BAD_PARAM_ALIGNMENT, "layout->row_offsets");
    bad = good;
    bad.col_indices = misaligned_i32(b_idx, idx, 3);
    EXPECT_STATUS(sk_layout_validate(&bad), SK_STATUS_BAD_PARAM_ALIGNMENT, "layout->col_indices");

    sk_layout_t out = SENTINEL;
    EXPECT_STATUS(sk_layout_create_from_bsr(&out, &bad), SK_STATUS_BAD_PARAM_ALIGNMENT,
                  "layout->col_indices");
    CHECK(out == SENTINEL, "*out written on failure");

    /* Scores of the top-k builder: 2 x 4 blocks. */
    float scores[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    memcpy(b_scores + 2, scores, sizeof scores);
    sk_topk_options opt;
    memset(&opt, 0, sizeof opt);
    opt.k = 1;
    const sk_grid g = err_grid(128, 256);
    EXPECT_STATUS(sk_layout_create_topk(&out, &g, (const float *)(void *)(b_scores + 2), &opt),
                  SK_STATUS_BAD_PARAM_ALIGNMENT, "scores");
    CHECK(out == SENTINEL, "*out written on failure");

    /* FlexAttention's form, both ways. */
    int32_t counts[2] = {2, 1}, flex[8] = {1, 3, 0, 0, 0, 0, 0, 0};
    EXPECT_STATUS(sk_layout_create_from_flex(&out, &g, misaligned_i32(b_counts, counts, 2), flex, 4),
                  SK_STATUS_BAD_PARAM_ALIGNMENT, "counts");
    EXPECT_STATUS(sk_layout_create_from_flex(&out, &g, counts, misaligned_i32(b_flex, flex, 8), 4),
                  SK_STATUS_BAD_PARAM_ALIGNMENT, "indices");
    CHECK(out == SENTINEL, "*out written on failure");
    memset(b_counts, 0x5a, sizeof w_counts);
    EXPECT_STATUS(sk_layout_to_flex(&good, (int32_t *)(void *)(b_counts + 1), 2, flex, 8),
                  SK_STATUS_BAD_PARAM_ALIGNMENT, "counts");
    for (size_t i = 0; i < sizeof w_counts; ++i)
        CHECK(b_counts[i] == 0x5a, "counts byte %zu written on failure", i);
}
