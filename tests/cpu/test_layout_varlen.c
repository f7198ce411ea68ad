/*
 * test_layout_varlen.c - the varlen layout builders, conversions, grid and
 * capacity helpers (sparsek.h, "Varlen batches").
 *
 * A varlen builder must give each sequence exactly the rows the fixed-batch
 * builder of the same name gives that sequence's own grid (len_q x len_k
 * tokens; test_layout_patterns.c checks those against brute force), in the
 * row order of the header (row s * R + row_start(b) + i), empty rows for a
 * sequence with no key and for the rows past the sequences; the random
 * builder is checked by its rules (counts, candidates, reproducibility).
 * The conversions are checked against the test's own reading of the masks
 * and layouts. Lengths are seeded and include 0.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/harness.h"
#include "common/test_util.h"
#include "sparsek.h"

enum { MAXB = 10 };

typedef struct lengths {
    int32_t batch;
    int32_t cu_q[MAXB + 1], cu_k[MAXB + 1];
} lengths;

static int64_t ceil_div(int64_t a, int64_t b) {
    return (a + b - 1) / b;
}

static int64_t len_q(const lengths *l, int32_t b) {
    return l->cu_q[b + 1] - l->cu_q[b];
}
static int64_t len_k(const lengths *l, int32_t b) {
    return l->cu_k[b + 1] - l->cu_k[b];
}

/* Seeded lengths: some empty, some one token, some several blocks. */
static lengths random_lengths(tu_rng *rng) {
    lengths l;
    l.batch = (int32_t)tu_rng_range(rng, 1, MAXB);
    l.cu_q[0] = l.cu_k[0] = 0;
    for (int32_t b = 0; b < l.batch; ++b) {
        const int64_t kind = tu_rng_range(rng, 0, 7);
        const int64_t q = kind == 0 ? 0 : kind == 1 ? 1 : tu_rng_range(rng, 1, 400);
        const int64_t k = kind == 2 ? 0 : kind == 3 ? 1 : tu_rng_range(rng, 1, 400);
        l.cu_q[b + 1] = l.cu_q[b] + (int32_t)q;
        l.cu_k[b + 1] = l.cu_k[b] + (int32_t)k;
    }
    return l;
}

static sk_varlen_grid vgrid_of(const lengths *l, int32_t bq, int32_t bk, int32_t heads) {
    sk_varlen_grid g = {l->batch, bq, bk, heads, l->cu_q, l->cu_k};
    return g;
}

static uint64_t seed_of(uint64_t test, uint64_t id) {
    tu_rng r;
    tu_rng_seed(&r, tu_base_seed() ^ (test << 40) ^ (id * 0x9E3779B97F4A7C15ull) ^ 0x1a70);
    return tu_rng_next(&r);
}

/* ---------------------------------------------------------------------------
 * The pattern builders against the fixed builders, sequence by sequence
 * ------------------------------------------------------------------------- */

typedef enum kind { KIND_DENSE, KIND_CAUSAL, KIND_WINDOW, KIND_SINKS, KINDS } kind;

static sk_status build_fixed(kind k, sk_layout_t *out, const sk_grid *g, int64_t a, int64_t b) {
    switch (k) {
    case KIND_DENSE:
        return sk_layout_create_dense(out, g);
    case KIND_CAUSAL:
        return sk_layout_create_causal(out, g);
    case KIND_WINDOW:
        return sk_layout_create_window(out, g, a, b);
    case KIND_SINKS:
        return sk_layout_create_sinks_window(out, g, a, b);
    case KINDS:
        break;
    }
    return SK_STATUS_INTERNAL_ERROR;
}

static sk_status build_varlen(kind k, sk_layout_t *out, const sk_varlen_grid *g, int64_t a,
                              int64_t b) {
    switch (k) {
    case KIND_DENSE:
        return sk_layout_create_varlen_dense(out, g);
    case KIND_CAUSAL:
        return sk_layout_create_varlen_causal(out, g);
    case KIND_WINDOW:
        return sk_layout_create_varlen_window(out, g, a, b);
    case KIND_SINKS:
        return sk_layout_create_varlen_sinks_window(out, g, a, b);
    case KINDS:
        break;
    }
    return SK_STATUS_INTERNAL_ERROR;
}

/* Row g of a view as [begin, end) into col_indices. */
static int rows_equal(const sk_bsr *x, int64_t gx, const sk_bsr *y, int64_t gy) {
    const int32_t nx = x->row_offsets[gx + 1] - x->row_offsets[gx];
    const int32_t ny = y->row_offsets[gy + 1] - y->row_offsets[gy];
    return nx == ny && (nx == 0 || memcmp(x->col_indices + x->row_offsets[gx],
                                          y->col_indices + y->row_offsets[gy],
                                          (size_t)nx * sizeof(int32_t)) == 0);
}

static int row_empty(const sk_bsr *x, int64_t g) {
    return x->row_offsets[g + 1] == x->row_offsets[g];
}

/* The varlen layout `v` against per-sequence layouts seq[b] (NULL: the
 * sequence's rows must be empty): row by row, then the rows past the
 * sequences empty. Returns the number of mismatched rows. */
static int compare_rows(const sk_bsr *v, const lengths *l, const sk_bsr *const *seq) {
    const int64_t R = ceil_div(v->grid.rows, v->grid.block_rows);
    int bad = 0;
    for (int64_t s = 0; s < v->grid.heads; ++s) {
        int64_t g = s * R;
        for (int32_t b = 0; b < l->batch; ++b) {
            const int64_t nbq = ceil_div(len_q(l, b), v->grid.block_rows);
            for (int64_t i = 0; i < nbq; ++i, ++g) {
                const int ok =
                    seq[b] != NULL ? rows_equal(v, g, seq[b], s * nbq + i) : row_empty(v, g);
                if (!ok && bad++ < 3)
                    CHECK(ok, "slice %lld, sequence %d (%lld x %lld), row %lld differs",
                          (long long)s, (int)b, (long long)len_q(l, b), (long long)len_k(l, b),
                          (long long)i);
            }
        }
        for (; g < (s + 1) * R; ++g)
            if (!row_empty(v, g) && bad++ < 3)
                CHECK(0, "row %lld past the sequences is not empty", (long long)g);
    }
    return bad;
}

SK_TEST(varlen_layout_builders_equal_fixed_per_sequence) {
    static const int64_t args[KINDS][2] = {{0, 0}, {0, 0}, {100, 30}, {70, 130}};
    tu_rng rng;
    tu_rng_seed(&rng, seed_of(1, 0));
    for (int id = 0; id < 24; ++id) {
        const lengths l = random_lengths(&rng);
        const kind k = (kind)(id % KINDS);
        const int32_t bq = tu_rng_range(&rng, 0, 1) ? 128 : 64;
        const int32_t bk = tu_rng_range(&rng, 0, 1) ? 128 : 64;
        const int32_t heads = (int32_t)tu_rng_range(&rng, 1, 3);
        const sk_varlen_grid vg = vgrid_of(&l, bq, bk, heads);
        sk_layout_t v = NULL;
        sk_layout_t seq_layouts[MAXB] = {NULL};
        const sk_bsr *seq[MAXB] = {NULL};
        sk_bsr views[MAXB], vv;
        sk_status st = build_varlen(k, &v, &vg, args[k][0], args[k][1]);
        REQUIRE(st == SK_STATUS_SUCCESS, "kind %d: %s %s", (int)k, sk_status_name(st),
                sk_last_error());
        sk_layout_view(v, &vv);
        for (int32_t b = 0; b < l.batch; ++b) {
            if (len_q(&l, b) == 0 || len_k(&l, b) == 0) continue;
            const sk_grid g = {len_q(&l, b), len_k(&l, b), bq, bk, 1, heads};
            st = build_fixed(k, &seq_layouts[b], &g, args[k][0], args[k][1]);
            CHECK(st == SK_STATUS_SUCCESS, "%s", sk_last_error());
            if (st == SK_STATUS_SUCCESS) {
                sk_layout_view(seq_layouts[b], &views[b]);
                seq[b] = &views[b];
            }
        }
        sk_grid want;
        CHECK(sk_varlen_layout_grid(&vg, &want) == SK_STATUS_SUCCESS, "%s", sk_last_error());
        CHECK(memcmp(&want, &vv.grid, sizeof want) == 0,
              "the layout's grid is not sk_varlen_layout_grid's");
        CHECK(compare_rows(&vv, &l, seq) == 0, "kind %d, case %d (B = %d)", (int)k, id,
              (int)l.batch);
        st = sk_layout_validate_varlen(&vv, &vg);
        CHECK(st == SK_STATUS_SUCCESS, "validate_varlen: %s", sk_last_error());
        for (int32_t b = 0; b < l.batch; ++b) sk_layout_destroy(seq_layouts[b]);
        sk_layout_destroy(v);
    }
}

/* The builders' grid: R = the rows the sequences need (at least 1),
 * cols = the longest key sequence (at least 1). */
SK_TEST(varlen_layout_grid_values) {
    const int32_t cu_q[4] = {0, 65, 65, 193}, cu_k[4] = {0, 10, 310, 310};
    const sk_varlen_grid vg = {3, 64, 128, 4, cu_q, cu_k};
    sk_grid g;
    REQUIRE(sk_varlen_layout_grid(&vg, &g) == SK_STATUS_SUCCESS, "%s", sk_last_error());
    CHECK(g.rows == 4 * 64 && g.cols == 300 && g.block_rows == 64 && g.block_cols == 128 &&
              g.batch == 1 && g.heads == 4,
          "grid %lld x %lld, blocks %d x %d, batch %d heads %d", (long long)g.rows,
          (long long)g.cols, (int)g.block_rows, (int)g.block_cols, (int)g.batch, (int)g.heads);
    const int32_t zero[3] = {0, 0, 0};
    const sk_varlen_grid empty = {2, 128, 64, 1, zero, zero};
    REQUIRE(sk_varlen_layout_grid(&empty, &g) == SK_STATUS_SUCCESS, "%s", sk_last_error());
    CHECK(g.rows == 128 && g.cols == 1, "all empty: %lld x %lld", (long long)g.rows,
          (long long)g.cols);
    /* Every builder takes it: one empty row per slice. */
    sk_layout_t out = NULL;
    REQUIRE(sk_layout_create_varlen_causal(&out, &empty) == SK_STATUS_SUCCESS, "%s",
            sk_last_error());
    sk_bsr v;
    sk_layout_view(out, &v);
    CHECK(v.nnz == 0 && v.row_offsets[1] == 0, "nnz %d", (int)v.nnz);
    sk_layout_destroy(out);
}

/* Random: each row min(k, candidates) distinct blocks among its sequence's
 * key blocks (the causal prefix with causal), the same from the same seed,
 * another from another seed. */
SK_TEST(varlen_layout_random_rules) {
    tu_rng rng;
    tu_rng_seed(&rng, seed_of(2, 0));
    for (int id = 0; id < 12; ++id) {
        const lengths l = random_lengths(&rng);
        const int causal = id % 2, k = (int)tu_rng_range(&rng, 0, 4);
        const sk_varlen_grid vg = vgrid_of(&l, 64, 64, 2);
        const uint64_t seed = tu_rng_next(&rng);
        sk_layout_t a = NULL, b2 = NULL, c = NULL;
        REQUIRE(sk_layout_create_varlen_random(&a, &vg, k, seed, causal) == SK_STATUS_SUCCESS, "%s",
                sk_last_error());
        REQUIRE(sk_layout_create_varlen_random(&b2, &vg, k, seed, causal) == SK_STATUS_SUCCESS,
                "%s", sk_last_error());
        REQUIRE(sk_layout_create_varlen_random(&c, &vg, k, seed + 1, causal) == SK_STATUS_SUCCESS,
                "%s", sk_last_error());
        sk_bsr va, vb, vc;
        sk_layout_view(a, &va), sk_layout_view(b2, &vb), sk_layout_view(c, &vc);
        CHECK(sk_layout_validate_varlen(&va, &vg) == SK_STATUS_SUCCESS, "%s", sk_last_error());
        const int64_t R = ceil_div(va.grid.rows, 64);
        int bad = 0, differs = 0;
        int64_t drawn = 0;
        for (int64_t s = 0; s < 2; ++s) {
            int64_t g = s * R;
            for (int32_t b = 0; b < l.batch; ++b) {
                const int64_t lq = len_q(&l, b), lk = len_k(&l, b);
                for (int64_t i = 0; i < ceil_div(lq, 64); ++i, ++g) {
                    /* Candidates: blocks holding a key <= the row's last query position. */
                    const int64_t last = (i + 1) * 64 < lq ? (i + 1) * 64 - 1 : lq - 1;
                    const int64_t p = last + lk - lq;
                    const int64_t n = !causal ? ceil_div(lk, 64) : p < 0 ? 0 : p / 64 + 1;
                    const int32_t count = va.row_offsets[g + 1] - va.row_offsets[g];
                    const int ok = count == (k < n ? k : n) &&
                                   (count == 0 || va.col_indices[va.row_offsets[g + 1] - 1] < n);
                    if (!ok && bad++ < 3)
                        CHECK(ok,
                              "sequence %d (%lld x %lld) row %lld: %d blocks of %lld candidates",
                              (int)b, (long long)lq, (long long)lk, (long long)i, (int)count,
                              (long long)n);
                    drawn += k < n;
                    differs += !rows_equal(&va, g, &vc, g);
                }
            }
        }
        CHECK(va.nnz == vb.nnz &&
                  memcmp(va.row_offsets, vb.row_offsets, (size_t)(2 * R + 1) * 4) == 0 &&
                  memcmp(va.col_indices, vb.col_indices, (size_t)va.nnz * 4) == 0,
              "the same seed gave another layout");
        if (drawn > 4 && k > 0)
            CHECK(differs > 0, "another seed gave the same %lld drawn rows", (long long)drawn);
        sk_layout_destroy(a), sk_layout_destroy(b2), sk_layout_destroy(c);
    }
}

/* ---------------------------------------------------------------------------
 * Conversions
 * ------------------------------------------------------------------------- */

/* From per-sequence masks: each row lists exactly its mask row's set bytes. */
SK_TEST(varlen_layout_from_masks) {
    tu_rng rng;
    tu_rng_seed(&rng, seed_of(3, 0));
    for (int id = 0; id < 10; ++id) {
        const lengths l = random_lengths(&rng);
        const int32_t heads = (int32_t)tu_rng_range(&rng, 1, 3), bq = 64, bk = 128;
        const sk_varlen_grid vg = vgrid_of(&l, bq, bk, heads);
        int64_t bytes = 0, at[MAXB];
        for (int32_t b = 0; b < l.batch; ++b) {
            at[b] = bytes;
            bytes += heads * ceil_div(len_q(&l, b), bq) * ceil_div(len_k(&l, b), bk);
        }
        uint8_t *masks = (uint8_t *)malloc((size_t)bytes + 1);
        REQUIRE(masks != NULL, "out of memory");
        for (int64_t e = 0; e < bytes; ++e) masks[e] = (uint8_t)(tu_rng_range(&rng, 0, 2) ? 0 : 7);
        sk_layout_t out = NULL;
        const sk_status st = sk_layout_create_varlen_from_masks(&out, &vg, masks, (size_t)bytes);
        if (st != SK_STATUS_SUCCESS) {
            CHECK(0, "%s %s", sk_status_name(st), sk_last_error());
            free(masks);
            continue;
        }
        sk_bsr v;
        sk_layout_view(out, &v);
        const int64_t R = ceil_div(v.grid.rows, bq);
        int bad = 0;
        for (int64_t s = 0; s < heads; ++s) {
            int64_t g = s * R;
            for (int32_t b = 0; b < l.batch; ++b) {
                const int64_t nbq = ceil_div(len_q(&l, b), bq), nbk = ceil_div(len_k(&l, b), bk);
                for (int64_t i = 0; i < nbq; ++i, ++g) {
                    const uint8_t *row = masks + at[b] + (s * nbq + i) * nbk;
                    int32_t e = v.row_offsets[g];
                    int ok = 1;
                    for (int64_t j = 0; j < nbk; ++j)
                        if (row[j]) ok = ok && e < v.row_offsets[g + 1] && v.col_indices[e++] == j;
                    ok = ok && e == v.row_offsets[g + 1];
                    if (!ok && bad++ < 3)
                        CHECK(ok, "sequence %d slice %lld row %lld", (int)b, (long long)s,
                              (long long)i);
                }
            }
        }
        CHECK(sk_layout_validate_varlen(&v, &vg) == SK_STATUS_SUCCESS, "%s", sk_last_error());
        sk_layout_destroy(out);
        free(masks);
    }
}

/* From per-sequence layouts (NULL entries: empty rows). */
SK_TEST(varlen_layout_from_layouts) {
    tu_rng rng;
    tu_rng_seed(&rng, seed_of(4, 0));
    for (int id = 0; id < 10; ++id) {
        const lengths l = random_lengths(&rng);
        const int32_t heads = (int32_t)tu_rng_range(&rng, 1, 3), bq = 128, bk = 64;
        const sk_varlen_grid vg = vgrid_of(&l, bq, bk, heads);
        sk_layout_t owned[MAXB] = {NULL};
        sk_bsr views[MAXB];
        const sk_bsr *list[MAXB] = {NULL};
        for (int32_t b = 0; b < l.batch; ++b) {
            if (len_q(&l, b) == 0 || len_k(&l, b) == 0 || tu_rng_range(&rng, 0, 4) == 0) continue;
            const sk_grid g = {len_q(&l, b), len_k(&l, b), bq, bk, 1, heads};
            if (sk_layout_create_random(&owned[b], &g, 2, tu_rng_next(&rng), b % 2) ==
                SK_STATUS_SUCCESS) {
                sk_layout_view(owned[b], &views[b]);
                list[b] = &views[b];
            }
        }
        sk_layout_t out = NULL;
        const sk_status st = sk_layout_create_varlen_from_layouts(&out, &vg, list);
        CHECK(st == SK_STATUS_SUCCESS, "%s %s", sk_status_name(st), sk_last_error());
        if (st == SK_STATUS_SUCCESS) {
            sk_bsr v;
            sk_layout_view(out, &v);
            CHECK(compare_rows(&v, &l, list) == 0, "case %d", id);
            CHECK(sk_layout_validate_varlen(&v, &vg) == SK_STATUS_SUCCESS, "%s", sk_last_error());
            sk_layout_destroy(out);
        }
        for (int32_t b = 0; b < l.batch; ++b) sk_layout_destroy(owned[b]);
    }
}

/* sk_varlen_max_row_blocks bounds the rows of every length array of B
 * sequences of total_q tokens none above max_seqlen_q (all of them for
 * B = 2 and 3 by enumeration), and is reached where the bound says. */
SK_TEST(varlen_max_row_blocks_bounds_every_split) {
    static const int64_t totals[4] = {1, 129, 300, 700};
    static const int64_t maxes[3] = {1, 200, 1000};
    for (int32_t batch = 2; batch <= 3; ++batch)
        for (int t = 0; t < 4; ++t)
            for (int m = 0; m < 3; ++m)
                for (int32_t bq = 64; bq <= 128; bq *= 2) {
                    int32_t bound = -1;
                    const sk_status st =
                        sk_varlen_max_row_blocks(batch, totals[t], maxes[m], bq, &bound);
                    REQUIRE(st == SK_STATUS_SUCCESS, "%s", sk_last_error());
                    const int64_t T = totals[t], M = maxes[m];
                    int64_t best = -1;
                    for (int64_t a = 0; a <= T && a <= M; ++a)
                        for (int64_t b = 0; a + b <= T && b <= M; ++b) {
                            const int64_t c = T - a - b;
                            if ((batch == 2 && c != 0) || c > M) continue;
                            const int64_t need =
                                ceil_div(a, bq) + ceil_div(b, bq) + ceil_div(c, bq);
                            if (need > best) best = need;
                        }
                    if (best < 0) continue; /* no split fits max_seqlen_q */
                    CHECK(bound >= best && bound <= (best > 1 ? best : 1) + 1,
                          "B %d T %lld max %lld bq %d: bound %d, most rows %lld", (int)batch,
                          (long long)T, (long long)M, (int)bq, (int)bound, (long long)best);
                }
    int32_t r = 0;
    CHECK(sk_varlen_max_row_blocks(0, 10, 10, 64, &r) == SK_STATUS_BAD_PARAM_SHAPE, "batch 0");
    CHECK(sk_varlen_max_row_blocks(1, 10, 10, 96, &r) == SK_STATUS_BAD_PARAM_VALUE, "block 96");
    CHECK(sk_varlen_max_row_blocks(1, 0, 10, 64, &r) == SK_STATUS_BAD_PARAM_SHAPE, "total 0");
}
