/*
 * test_gemm_cpu.c - the CPU BSR GEMM against the naive dense fp64 GEMM
 * (tests/common/naive_ref.c).
 *
 * Every case: a seeded random block mask turned into a BSR here
 * (nr_bsr_from_mask); A's block values and B rounded to ab_dtype; the
 * reference gets the same rounded values as a dense fp64 A (zeros outside
 * the stored blocks). Block elements past m or k are NaN, and so are B's and
 * C's leading-dimension padding, so a read of them shows up as NaN. With
 * beta == 0, C starts as NaN and must come out exact; padding of C must be
 * untouched.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/harness.h"
#include "common/naive_ref.h"
#include "common/test_util.h"
#include "sparsek.h"

typedef struct gemm_case {
    sk_dtype ab_dtype, c_dtype;
    int64_t m, n, k;
    int32_t bm, bk;
    sk_order b_order;
    int64_t ldb_pad, ldc_pad; /* 0: packed (ld left 0); else ld = packed + pad */
    float alpha, beta;
    double density;
    int empty_rows; /* every second block row of A empty */
    int use_plan;   /* sk_bsr_gemm (plan + run) instead of sk_bsr_gemm_run */
} gemm_case;

static const sk_dtype all_dtypes[3] = {SK_DTYPE_F16, SK_DTYPE_BF16, SK_DTYPE_F32};

static const char *dtype_text(sk_dtype t) {
    return t == SK_DTYPE_F16 ? "F16" : t == SK_DTYPE_BF16 ? "BF16" : "F32";
}

static size_t elem_size(sk_dtype t) {
    return t == SK_DTYPE_F32 ? 4 : 2;
}

static gemm_case base_case(sk_dtype ab, sk_dtype c) {
    gemm_case g;
    memset(&g, 0, sizeof g);
    g.ab_dtype = ab;
    g.c_dtype = c;
    g.m = 200;
    g.n = 70;
    g.k = 300;
    g.bm = 64;
    g.bk = 128;
    g.b_order = SK_ORDER_ROW_MAJOR;
    g.alpha = 1.0f;
    g.density = 0.5;
    return g;
}

/*
 * Tolerance rule (docs/DEVELOPING.md): |got - ref| <= 2 * E + atol, E the
 * error bound of a naive same-precision GEMM: fp32 sums of k products and
 * one rounding of C to its dtype,
 *   E = u_c * |ref| + u_f32 * sqrt(k) * mag,
 *   mag = |alpha| * sum_x |a_ix b_xj| + |beta c_ij|,
 * sqrt(k) because rounding errors add up like a random walk; atol = 2^-24
 * covers fp16 subnormal results.
 */
static double gemm_tol(sk_dtype c_dtype, double ref, double k, double mag) {
    const double e =
        tu_unit_roundoff(c_dtype) * fabs(ref) + tu_unit_roundoff(SK_DTYPE_F32) * sqrt(k) * mag;
    return 2.0 * e + 0x1.0p-24;
}

/* Returns 0 when everything matched. */
static int run_gemm_case(const gemm_case *g, uint64_t seed) {
    char label[256];
    snprintf(label, sizeof label,
             "[seed %llu: ab=%s c=%s m=%lld n=%lld k=%lld bm=%d bk=%d b_order=%d ldb+%lld ldc+%lld "
             "alpha=%g beta=%g density=%.2f empty=%d plan=%d]",
             (unsigned long long)seed, dtype_text(g->ab_dtype), dtype_text(g->c_dtype),
             (long long)g->m, (long long)g->n, (long long)g->k, (int)g->bm, (int)g->bk,
             (int)g->b_order, (long long)g->ldb_pad, (long long)g->ldc_pad, (double)g->alpha,
             (double)g->beta, g->density, g->empty_rows, g->use_plan);
    const int failures_before = sk_test_failures();
    tu_rng rng;
    tu_rng_seed(&rng, seed);
    const int64_t m = g->m, n = g->n, k = g->k;
    const int64_t RB = (m + g->bm - 1) / g->bm, CB = (k + g->bk - 1) / g->bk;

    uint8_t *mask = (uint8_t *)malloc((size_t)(RB * CB));
    if (mask == NULL) {
        CHECK(0, "%s out of memory", label);
        return 1;
    }
    for (int64_t i = 0; i < RB; ++i)
        for (int64_t j = 0; j < CB; ++j)
            mask[i * CB + j] =
                (uint8_t)(tu_rng_uniform(&rng) < g->density && !(g->empty_rows && i % 2 == 1));
    sk_grid grid = {m, k, g->bm, g->bk, 1, 1};
    sk_bsr layout;
    if (nr_bsr_from_mask(&layout, &grid, mask) != 0) {
        CHECK(0, "%s out of memory", label);
        free(mask);
        return 1;
    }

    const size_t ab = elem_size(g->ab_dtype), cs = elem_size(g->c_dtype);
    const int64_t nnz = layout.nnz, blk = (int64_t)g->bm * g->bk;
    const int64_t b_inner = g->b_order == SK_ORDER_ROW_MAJOR ? n : k;
    const int64_t b_outer = g->b_order == SK_ORDER_ROW_MAJOR ? k : n;
    const int64_t ldb = b_inner + g->ldb_pad, ldc = n + g->ldc_pad;
    const int64_t b_span = (b_outer - 1) * ldb + b_inner, c_span = (m - 1) * ldc + n;
    void *a_vals = malloc((size_t)(nnz > 0 ? nnz * blk : 1) * ab);
    void *b = malloc((size_t)b_span * ab), *c = malloc((size_t)c_span * cs);
    double *ad = (double *)calloc((size_t)(m * k), sizeof(double));
    double *bd = (double *)malloc((size_t)(k * n) * sizeof(double));
    double *cd = (double *)malloc((size_t)(m * n) * sizeof(double));
    double *ref = (double *)malloc((size_t)(m * n) * sizeof(double));
    void *c_before = malloc((size_t)c_span * cs);
    if (!a_vals || !b || !c || !ad || !bd || !cd || !ref || !c_before) {
        CHECK(0, "%s out of memory", label);
        goto done;
    }

    /* A's blocks: elements past m or k stay NaN (never to be read). */
    tu_fill_nan(a_vals, g->ab_dtype, nnz * blk);
    for (int64_t i = 0; i < RB; ++i)
        for (int32_t e = layout.row_offsets[i]; e < layout.row_offsets[i + 1]; ++e) {
            const int64_t j = layout.col_indices[e];
            for (int64_t r = 0; r < g->bm; ++r)
                for (int64_t x = 0; x < g->bk; ++x) {
                    const int64_t row = i * g->bm + r, col = j * g->bk + x;
                    if (row >= m || col >= k) continue;
                    const int64_t at = (int64_t)e * blk + r * g->bk + x;
                    tu_store(a_vals, g->ab_dtype, at, (float)tu_rng_normal(&rng));
                    ad[row * k + col] = tu_load(a_vals, g->ab_dtype, at);
                }
        }
    tu_fill_nan(b, g->ab_dtype, b_span);
    for (int64_t x = 0; x < k; ++x)
        for (int64_t y = 0; y < n; ++y) {
            const int64_t at = g->b_order == SK_ORDER_ROW_MAJOR ? x * ldb + y : y * ldb + x;
            tu_store(b, g->ab_dtype, at, (float)tu_rng_normal(&rng));
            bd[x * n + y] = tu_load(b, g->ab_dtype, at);
        }
    /* C: NaN everywhere when beta == 0 (it must not be read); else values,
     * with NaN in the ldc padding. */
    tu_fill_nan(c, g->c_dtype, c_span);
    for (int64_t r = 0; r < m; ++r)
        for (int64_t y = 0; y < n; ++y) {
            if (g->beta != 0.0f) tu_store(c, g->c_dtype, r * ldc + y, (float)tu_rng_normal(&rng));
            cd[r * n + y] = g->beta != 0.0f ? tu_load(c, g->c_dtype, r * ldc + y) : 0.0;
        }
    memcpy(c_before, c, (size_t)c_span * cs);

    sk_bsr_gemm_desc desc;
    CHECK(sk_bsr_gemm_desc_init(&desc, sizeof desc) == SK_STATUS_SUCCESS, "%s", sk_last_error());
    desc.backend = SK_BACKEND_CPU;
    desc.ab_dtype = g->ab_dtype;
    desc.c_dtype = g->c_dtype;
    desc.m = m;
    desc.n = n;
    desc.k = k;
    desc.b_order = g->b_order;
    desc.ldb = g->ldb_pad ? ldb : 0;
    desc.ldc = g->ldc_pad ? ldc : 0;
    desc.alpha = g->alpha;
    desc.beta = g->beta;
    const sk_status st = g->use_plan ? sk_bsr_gemm(&desc, &layout, a_vals, b, c, NULL, 0, NULL)
                                     : sk_bsr_gemm_run(&desc, &layout, a_vals, b, c, NULL, 0, NULL);
    if (st != SK_STATUS_SUCCESS) {
        CHECK(0, "%s %s: %s", label, sk_status_name(st), sk_last_error());
        goto done;
    }

    nr_gemm(m, n, k, g->alpha, ad, bd, g->beta, cd, ref);
    int64_t bad = 0;
    for (int64_t r = 0; r < m; ++r) {
        const int row_empty = layout.row_offsets[r / g->bm] == layout.row_offsets[r / g->bm + 1];
        for (int64_t y = 0; y < n; ++y) {
            double mag = fabs((double)g->beta * cd[r * n + y]);
            for (int64_t x = 0; x < k; ++x)
                mag += fabs((double)g->alpha * ad[r * k + x] * bd[x * n + y]);
            const double want = ref[r * n + y];
            const double got = tu_load(c, g->c_dtype, r * ldc + y);
            const double tol = gemm_tol(g->c_dtype, want, (double)k, mag);
            int ok = isfinite(got) && fabs(got - want) <= tol;
            /* An empty block row is beta * C: exactly 0 when beta == 0. */
            if (row_empty && g->beta == 0.0f) ok = got == 0.0;
            if (!ok && bad++ < 3)
                CHECK(ok, "%s C[%lld, %lld] = %.9g, reference %.9g, tol %.3g%s", label,
                      (long long)r, (long long)y, got, want, tol, row_empty ? " (empty row)" : "");
        }
        for (int64_t y = n; y < ldc && r + 1 < m; ++y)
            if (memcmp((char *)c + (size_t)(r * ldc + y) * cs,
                       (char *)c_before + (size_t)(r * ldc + y) * cs, cs) != 0 &&
                bad++ < 3)
                CHECK(0, "%s C padding [%lld, %lld] was written", label, (long long)r,
                      (long long)y);
    }
    CHECK(bad == 0, "%s %lld mismatches", label, (long long)bad);

done:
    free(a_vals), free(b), free(c), free(ad), free(bd), free(cd), free(ref), free(c_before);
    free(mask);
    nr_bsr_free(&layout);
    return sk_test_failures() != failures_before;
}

static uint64_t case_seed(uint64_t test_id, uint64_t case_id) {
    tu_rng r;
    tu_rng_seed(&r,
                tu_base_seed() ^ (test_id * 0x9E3779B97F4A7C15ull) ^ (case_id << 24) ^ 0x6d6dull);
    return tu_rng_next(&r);
}

SK_TEST(gemm_cpu_all_dtypes_beta_zero_overwrites_nan) {
    int id = 0;
    for (int a = 0; a < 3; ++a)
        for (int c = 0; c < 3; ++c) {
            gemm_case g = base_case(all_dtypes[a], all_dtypes[c]);
            run_gemm_case(&g, case_seed(1, (uint64_t)id++));
        }
}

SK_TEST(gemm_cpu_alpha_beta) {
    static const float ab[4][2] = {{1.0f, 1.0f}, {-0.5f, 2.0f}, {3.0f, -1.0f}, {0.0f, 0.75f}};
    int id = 0;
    for (int t = 0; t < 3; ++t)
        for (int x = 0; x < 4; ++x) {
            gemm_case g = base_case(all_dtypes[t], all_dtypes[(t + x) % 3]);
            g.alpha = ab[x][0];
            g.beta = ab[x][1];
            g.use_plan = x % 2;
            run_gemm_case(&g, case_seed(2, (uint64_t)id++));
        }
}

SK_TEST(gemm_cpu_col_major_b_and_padding) {
    int id = 0;
    for (int t = 0; t < 3; ++t)
        for (int order = 0; order < 2; ++order)
            for (int pad = 0; pad < 2; ++pad) {
                gemm_case g = base_case(all_dtypes[t], all_dtypes[(t + 1) % 3]);
                g.b_order = order ? SK_ORDER_COL_MAJOR : SK_ORDER_ROW_MAJOR;
                g.ldb_pad = pad ? 5 : 0;
                g.ldc_pad = pad ? 3 : 0;
                g.beta = pad ? 0.5f : 0.0f;
                g.n = 300; /* more than one column chunk */
                run_gemm_case(&g, case_seed(3, (uint64_t)id++));
            }
}

SK_TEST(gemm_cpu_tails_and_block_sizes) {
    static const int32_t blocks[4][2] = {{64, 64}, {64, 128}, {128, 64}, {128, 128}};
    static const int64_t shapes[3][3] = {{1, 1, 1}, {129, 257, 65}, {64, 31, 128}};
    int id = 0;
    for (int bi = 0; bi < 4; ++bi)
        for (int si = 0; si < 3; ++si) {
            gemm_case g = base_case(all_dtypes[(bi + si) % 3], all_dtypes[si % 3]);
            g.bm = blocks[bi][0];
            g.bk = blocks[bi][1];
            g.m = shapes[si][0];
            g.n = shapes[si][1];
            g.k = shapes[si][2];
            g.density = 0.8;
            g.beta = si == 1 ? -1.5f : 0.0f;
            g.b_order = bi % 2 ? SK_ORDER_COL_MAJOR : SK_ORDER_ROW_MAJOR;
            run_gemm_case(&g, case_seed(4, (uint64_t)id++));
        }
}

SK_TEST(gemm_cpu_empty_block_rows) {
    int id = 0;
    for (int t = 0; t < 3; ++t)
        for (int beta = 0; beta < 2; ++beta) {
            gemm_case g = base_case(all_dtypes[t], all_dtypes[t]);
            g.empty_rows = 1;
            g.beta = beta ? 0.25f : 0.0f;
            run_gemm_case(&g, case_seed(5, (uint64_t)id++));
            g.density = 0.0; /* no block at all */
            run_gemm_case(&g, case_seed(5, (uint64_t)id++));
        }
}

SK_TEST(gemm_cpu_random_cases) {
    tu_rng rng;
    tu_rng_seed(&rng, case_seed(6, 999));
    for (int id = 0; id < 16; ++id) {
        gemm_case g =
            base_case(all_dtypes[tu_rng_range(&rng, 0, 2)], all_dtypes[tu_rng_range(&rng, 0, 2)]);
        g.m = tu_rng_range(&rng, 1, 300);
        g.n = tu_rng_range(&rng, 1, 300);
        g.k = tu_rng_range(&rng, 1, 300);
        g.bm = tu_rng_range(&rng, 0, 1) ? 128 : 64;
        g.bk = tu_rng_range(&rng, 0, 1) ? 128 : 64;
        g.b_order = tu_rng_range(&rng, 0, 1) ? SK_ORDER_COL_MAJOR : SK_ORDER_ROW_MAJOR;
        g.ldb_pad = tu_rng_range(&rng, 0, 1) * tu_rng_range(&rng, 1, 9);
        g.ldc_pad = tu_rng_range(&rng, 0, 1) * tu_rng_range(&rng, 1, 9);
        g.alpha = (float)(tu_rng_uniform(&rng) * 4.0 - 2.0);
        g.beta = tu_rng_range(&rng, 0, 1) ? 0.0f : (float)(tu_rng_uniform(&rng) * 4.0 - 2.0);
        g.density = tu_rng_uniform(&rng);
        g.empty_rows = tu_rng_range(&rng, 0, 3) == 0;
        g.use_plan = (int)tu_rng_range(&rng, 0, 1);
        run_gemm_case(&g, case_seed(6, (uint64_t)id));
    }
}
