/*
 * test_layout_convert.c - the owned handle and the conversions: mask -> layout
 * -> mask, flex -> layout -> flex, BlockMask's permutation rows, copies of
 * views. Inputs are random (seeded with tu_base_seed) with every density
 * from empty to full.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/harness.h"
#include "common/test_util.h"
#include "sparsek.h"

typedef struct conv_case {
    int64_t rows, cols;
    int32_t br, bc, batch, heads;
} conv_case;

static const conv_case k_cases[] = {
    {1, 1, 64, 64, 1, 1},     {300, 200, 64, 128, 2, 3},  {65, 1000, 128, 64, 1, 2},
    {1000, 65, 64, 64, 3, 1}, {128, 128, 128, 128, 1, 1}, {640, 640, 64, 64, 1, 4},
};
enum { N_CASES = sizeof k_cases / sizeof k_cases[0] };

static void case_dims(const conv_case *c, int64_t *total_rows, int64_t *cb) {
    *total_rows = (c->rows + c->br - 1) / c->br * c->batch * c->heads;
    *cb = (c->cols + c->bc - 1) / c->bc;
}

SK_TEST(layout_mask_round_trip) {
    tu_rng rng;
    tu_rng_seed(&rng, tu_base_seed() ^ 0x3A5Cull);
    const double densities[] = {0.0, 0.05, 0.5, 0.95, 1.0};
    for (int c = 0; c < N_CASES; ++c)
        for (size_t d = 0; d < sizeof densities / sizeof densities[0]; ++d) {
            const conv_case *cc = &k_cases[c];
            int64_t rows, cb;
            case_dims(cc, &rows, &cb);
            const int64_t n = rows * cb;
            sk_grid g = tu_grid(cc->rows, cc->cols, cc->br, cc->bc, cc->batch, cc->heads);
            uint8_t *in = (uint8_t *)malloc((size_t)n), *out = (uint8_t *)malloc((size_t)n + 1);
            REQUIRE(in != NULL && out != NULL, "malloc");
            int64_t ones = 0;
            for (int64_t e = 0; e < n; ++e) {
                /* any non-zero byte selects the block */
                in[e] =
                    tu_rng_uniform(&rng) < densities[d] ? (uint8_t)tu_rng_range(&rng, 1, 255) : 0;
                ones += in[e] != 0;
            }
            sk_layout_t layout = NULL;
            sk_status st = sk_layout_create_from_mask(&layout, &g, in);
            CHECK(st == SK_STATUS_SUCCESS, "%s", sk_last_error());
            sk_bsr v;
            if (st == SK_STATUS_SUCCESS && sk_layout_view(layout, &v) == SK_STATUS_SUCCESS) {
                CHECK(v.nnz == ones, "nnz %d, expected %lld", (int)v.nnz, (long long)ones);
                CHECK(sk_layout_validate(&v) == SK_STATUS_SUCCESS, "%s", sk_last_error());
                memset(out, 0xCD, (size_t)n + 1);
                st = sk_layout_to_mask(&v, out, (size_t)n + 1);
                CHECK(st == SK_STATUS_SUCCESS, "%s", sk_last_error());
                for (int64_t e = 0; e < n; ++e)
                    CHECK(out[e] == (in[e] != 0), "case %d density %g: block %lld got %d", c,
                          densities[d], (long long)e, (int)out[e]);
                CHECK(out[n] == 0xCD, "to_mask wrote past the mask");
            }
            sk_layout_destroy(layout);
            free(in);
            free(out);
            if (sk_test_failures() > 10) return;
        }
}

static int cmp_int32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

SK_TEST(layout_flex_round_trip) {
    tu_rng rng;
    tu_rng_seed(&rng, tu_base_seed() ^ 0xF1E8ull);
    for (int c = 0; c < N_CASES; ++c)
        for (int pad = 0; pad < 3; ++pad) {
            const conv_case *cc = &k_cases[c];
            int64_t rows, cb;
            case_dims(cc, &rows, &cb);
            const int32_t width = (int32_t)cb + pad * 3; /* padded rows, junk after counts */
            sk_grid g = tu_grid(cc->rows, cc->cols, cc->br, cc->bc, cc->batch, cc->heads);
            int32_t *counts = (int32_t *)malloc((size_t)rows * sizeof(int32_t));
            int32_t *indices = (int32_t *)malloc((size_t)(rows * width) * sizeof(int32_t));
            int32_t *perm = (int32_t *)malloc((size_t)cb * sizeof(int32_t));
            int32_t *counts2 = (int32_t *)malloc((size_t)rows * sizeof(int32_t));
            int32_t *indices2 = (int32_t *)malloc((size_t)(rows * cb + 1) * sizeof(int32_t));
            REQUIRE(counts && indices && perm && counts2 && indices2, "malloc");
            for (int64_t r = 0; r < rows; ++r) {
                /* a random subset in random order: shuffle 0..cb-1, keep a prefix */
                for (int32_t j = 0; j < cb; ++j) perm[j] = j;
                for (int32_t j = (int32_t)cb - 1; j > 0; --j) {
                    int32_t t = (int32_t)tu_rng_range(&rng, 0, j), x = perm[j];
                    perm[j] = perm[t];
                    perm[t] = x;
                }
                const int64_t pick = tu_rng_range(&rng, 0, 4);
                counts[r] = pick == 0   ? 0
                            : pick == 1 ? (int32_t)cb
                                        : (int32_t)tu_rng_range(&rng, 0, cb);
                for (int32_t e = 0; e < width; ++e)
                    indices[r * width + e] = e < counts[r] ? perm[e] : -7 - e; /* junk */
            }
            sk_layout_t layout = NULL;
            sk_status st = sk_layout_create_from_flex(&layout, &g, counts, indices, width);
            CHECK(st == SK_STATUS_SUCCESS, "%s", sk_last_error());
            sk_bsr v;
            if (st == SK_STATUS_SUCCESS && sk_layout_view(layout, &v) == SK_STATUS_SUCCESS) {
                CHECK(sk_layout_validate(&v) == SK_STATUS_SUCCESS, "%s", sk_last_error());
                indices2[rows * cb] = 0x7EADBEEF; /* guard past the end */
                st = sk_layout_to_flex(&v, counts2, (size_t)rows, indices2, (size_t)(rows * cb));
                CHECK(st == SK_STATUS_SUCCESS, "%s", sk_last_error());
                CHECK(indices2[rows * cb] == 0x7EADBEEF, "to_flex wrote past indices");
                for (int64_t r = 0; r < rows && st == SK_STATUS_SUCCESS; ++r) {
                    CHECK(counts2[r] == counts[r], "row %lld count %d, expected %d", (long long)r,
                          (int)counts2[r], (int)counts[r]);
                    /* selected set: same as the input's, in increasing order */
                    int32_t sorted[32];
                    memcpy(sorted, indices + r * width, (size_t)counts[r] * sizeof(int32_t));
                    qsort(sorted, (size_t)counts[r], sizeof(int32_t), cmp_int32);
                    const int32_t *row = indices2 + r * cb;
                    for (int32_t e = 0; e < counts[r] && counts2[r] == counts[r]; ++e)
                        CHECK(row[e] == sorted[e], "row %lld entry %d: %d, expected %d",
                              (long long)r, (int)e, (int)row[e], (int)sorted[e]);
                    /* the whole row is a permutation of 0..cb-1, unselected increasing */
                    uint8_t seen[32] = {0};
                    for (int32_t e = 0; e < cb; ++e) {
                        CHECK(row[e] >= 0 && row[e] < cb && !seen[row[e]],
                              "row %lld entry %d = %d: not a permutation", (long long)r, (int)e,
                              (int)row[e]);
                        if (row[e] >= 0 && row[e] < cb) seen[row[e]] = 1;
                        if (e > counts2[r])
                            CHECK(row[e] > row[e - 1], "row %lld: unselected not increasing",
                                  (long long)r);
                    }
                }
                /* and back: from_flex of to_flex's output is the same layout */
                sk_layout_t again = NULL;
                st = sk_layout_create_from_flex(&again, &g, counts2, indices2, (int32_t)cb);
                CHECK(st == SK_STATUS_SUCCESS, "%s", sk_last_error());
                sk_bsr w;
                if (st == SK_STATUS_SUCCESS && sk_layout_view(again, &w) == SK_STATUS_SUCCESS) {
                    CHECK(w.nnz == v.nnz, "nnz %d vs %d", (int)w.nnz, (int)v.nnz);
                    CHECK(memcmp(w.row_offsets, v.row_offsets,
                                 (size_t)(rows + 1) * sizeof(int32_t)) == 0,
                          "row offsets differ");
                    CHECK(w.nnz == v.nnz &&
                              (v.nnz == 0 || memcmp(w.col_indices, v.col_indices,
                                                    (size_t)v.nnz * sizeof(int32_t)) == 0),
                          "indices differ");
                }
                sk_layout_destroy(again);
            }
            sk_layout_destroy(layout);
            free(counts);
            free(indices);
            free(perm);
            free(counts2);
            free(indices2);
            if (sk_test_failures() > 10) return;
        }
}

SK_TEST(layout_from_bsr_copies_a_view) {
    /* slice 0: rows {0, 2}, {}, {1}; slice 1: {}, {0, 1, 2}, {} */
    int32_t off[7] = {0, 2, 2, 3, 3, 6, 6};
    int32_t idx[6] = {0, 2, 1, 0, 1, 2};
    sk_bsr src;
    memset(&src, 0, sizeof src);
    src.grid = tu_grid(3 * 64, 3 * 128, 64, 128, 2, 1);
    src.nnz = 6;
    src.row_offsets = off;
    src.col_indices = idx;
    sk_layout_t layout = NULL;
    sk_status st = sk_layout_create_from_bsr(&layout, &src);
    REQUIRE(st == SK_STATUS_SUCCESS, "%s", sk_last_error());
    sk_bsr v;
    REQUIRE(sk_layout_view(layout, &v) == SK_STATUS_SUCCESS, "%s", sk_last_error());
    CHECK(v.row_offsets != off && v.col_indices != idx, "not a copy");
    CHECK(v.nnz == 6 && memcmp(v.row_offsets, off, sizeof off) == 0 &&
              memcmp(v.col_indices, idx, sizeof idx) == 0,
          "copy differs");
    CHECK(v.grid.rows == src.grid.rows && v.grid.cols == src.grid.cols && v.grid.block_rows == 64 &&
              v.grid.block_cols == 128 && v.grid.batch == 2 && v.grid.heads == 1,
          "grid differs");
    sk_layout_destroy(layout);

    /* an empty layout (nnz 0, col_indices NULL) copies too */
    int32_t zero[7] = {0};
    src.nnz = 0;
    src.row_offsets = zero;
    src.col_indices = NULL;
    st = sk_layout_create_from_bsr(&layout, &src);
    REQUIRE(st == SK_STATUS_SUCCESS, "%s", sk_last_error());
    REQUIRE(sk_layout_view(layout, &v) == SK_STATUS_SUCCESS, "%s", sk_last_error());
    CHECK(v.nnz == 0 && v.col_indices != NULL, "nnz %d", (int)v.nnz);
    sk_layout_destroy(layout);
    sk_layout_destroy(NULL); /* a no-op */
}

SK_TEST(layout_successful_calls_clear_the_last_error) {
    sk_grid g = tu_grid(64, 64, 64, 64, 1, 1);
    sk_layout_t layout = NULL;
    CHECK(sk_layout_create_dense(&layout, NULL) != SK_STATUS_SUCCESS, "NULL grid accepted");
    CHECK(sk_last_error()[0] != '\0', "no message");
    REQUIRE(sk_layout_create_dense(&layout, &g) == SK_STATUS_SUCCESS, "%s", sk_last_error());
    CHECK(sk_last_error()[0] == '\0', "not cleared: %s", sk_last_error());
    sk_bsr v;
    CHECK(sk_layout_view(layout, &v) == SK_STATUS_SUCCESS && v.nnz == 1 && v.col_indices[0] == 0,
          "dense 1x1");
    sk_layout_destroy(layout);
}
