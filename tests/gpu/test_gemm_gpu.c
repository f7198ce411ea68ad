/*
 * test_gemm_gpu.c - the CUDA BSR GEMM (sk_bsr_gemm, C = alpha A B + beta C)
 * against the CPU backend on the same host inputs.
 *
 * A case is run as follows:
 *   1. A seeded block mask (density, empty block rows) becomes A's BSR
 *      layout; A's block values are N(0, 1) rounded to ab_dtype, and every
 *      block element past m (rows) or past k (columns) is NaN, so a read of
 *      one poisons C.
 *   2. B [k, n] (row- or column-major) gets N(0, 1) values; its ldb padding
 *      and the slack after its end are NaN. C's ldc padding and slack are
 *      NaN too; its logical elements are NaN when beta == 0 (C must not be
 *      read) and N(0, 1) otherwise.
 *   3. The CPU backend computes the reference from the same host buffers.
 *   4. On the GPU (the backend --backend names): C is reset before every
 *      run; plan and run (sk_bsr_gemm, or sk_bsr_gemm_plan then
 *      sk_bsr_gemm_run); twice: the two results must agree bit for bit.
 *   5. Every element of C's [m, n] must be within the tolerance rule of the
 *      reference; everything else in C's allocation (ldc padding, slack)
 *      must still hold its initial bits.
 *
 * Tolerance rule (docs/DEVELOPING.md: 2 x the error bound of a naive
 * same-precision implementation, plus a small atol). For element (i, j):
 *   |gpu - ref| <= 2 * (u_c * |ref|                                rounding C to its dtype
 *                       + 2^-22 * k_eff * |alpha| * sum_x |a_ix b_xj|   fp32 accumulation
 *                       + 2^-23 * |beta * c_ij|)                   fp32 alpha acc + beta c
 *                  + 1e-6
 * u_c the unit roundoff of C's dtype (2^-24 for F32), k_eff the number of
 * products accumulated for row i (the valid columns of its visited
 * blocks), the sum taken in fp64 over those products; the products of two
 * fp16/bf16 values are exact in fp32, so only the k_eff additions round
 * (each by at most 2^-24 of the running magnitude; 2^-22 leaves room).
 * NaN / inf positions must match. gemm_gpu_checker_catches_errors shows the
 * rule is tight enough to catch one element off by 3 tolerances, a NaN, a
 * written padding element and a skipped A block.
 *
 * With --backend sm90, problems the Hopper kernel does not cover
 * (gg_sm90_covers) must be declined with SK_STATUS_NOT_SUPPORTED and C left
 * untouched; they count as declined. While the Hopper kernel declines even
 * a problem it should cover (a placeholder, or no Hopper GPU), a probe says
 * so once and every case is checked as a decline.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/harness.h"
#include "common/test_util.h"
#include "gpu/cuda_api.h"
#include "gpu/gpu_util.h"
#include "sparsek.h"

int gt_gemm_cases_run, gt_gemm_cases_failed, gt_gemm_cases_declined;

enum {
    GG_SLACK = 64,      /* NaN elements after the end of B and C */
    GG_MAX_REPORTS = 8, /* errors printed per comparison */
    GG_RANDOM_CASES = 120,
    GG_HOPPER_CASES = 110,
    GG_QUICK_CASES = 4
};
#define GG_ACC_U  0x1.0p-22 /* per accumulated product (fp32 sums) */
#define GG_BETA_U 0x1.0p-23 /* fp32 evaluation of alpha acc + beta c */
#define GG_ATOL   1e-6
/* Work budget of one random case, m * n * k * density (CPU reference and
 * the magnitude pass are both that order). */
#define GG_CASE_WORK  4.0e7
#define GG_QUICK_WORK 2.0e6

typedef struct gg_case {
    sk_dtype ab, c;
    int64_t m, n, k;
    int32_t bm, bk;
    sk_order b_order;
    int ldb_pad, ldc_pad; /* 16-byte units past the aligned row; -1: ld 0 (packed) if aligned */
    float alpha, beta;
    double density;    /* P(block selected) */
    double empty_rows; /* P(block row left empty) */
    int split;         /* sk_bsr_gemm_plan + sk_bsr_gemm_run instead of sk_bsr_gemm */
    uint64_t seed;
} gg_case;

/* A materialised case. Sizes in elements. */
typedef struct gg_inst {
    gg_case c;
    int64_t rb, cb, ldb, ldc, desc_ldb, desc_ldc;
    int64_t a_elems, b_elems, c_elems; /* allocated, slack included */
    size_t ab_size, c_size;
    sk_bsr layout, dlayout;   /* host, device */
    void *a, *b, *c0, *cref;  /* host: inputs, C's initial state, CPU result */
    double *sab;              /* [m, n] sum_x |a_ix b_xj| over the visited products */
    int64_t *keff;            /* [rb] products accumulated per row of that block row */
    void *da, *db, *dc, *dws; /* device */
    size_t ws_bytes;
} gg_inst;

static const char *dt_name(sk_dtype t) {
    return t == SK_DTYPE_F16 ? "f16" : t == SK_DTYPE_BF16 ? "bf16" : "f32";
}

static size_t dt_size(sk_dtype t) {
    return t == SK_DTYPE_F32 ? 4 : 2;
}

static int64_t round_up(int64_t x, int64_t a) {
    return (x + a - 1) / a * a;
}

static void gg_describe(const gg_case *c, char *buf, size_t len) {
    snprintf(buf, len,
             "ab=%s c=%s m=%lld n=%lld k=%lld blocks %dx%d B %s ldb_pad=%d ldc_pad=%d "
             "alpha=%g beta=%g density=%.2f empty=%.2f split=%d seed=%llu",
             dt_name(c->ab), dt_name(c->c), (long long)c->m, (long long)c->n, (long long)c->k,
             (int)c->bm, (int)c->bk, c->b_order == SK_ORDER_ROW_MAJOR ? "row" : "col", c->ldb_pad,
             c->ldc_pad, (double)c->alpha, (double)c->beta, c->density, c->empty_rows, c->split,
             (unsigned long long)c->seed);
}

static gg_case gg_base(sk_dtype ab, sk_dtype c, int64_t m, int64_t n, int64_t k, int32_t bm,
                       int32_t bk, uint64_t seed) {
    gg_case g;
    memset(&g, 0, sizeof g);
    g.ab = ab;
    g.c = c;
    g.m = m;
    g.n = n;
    g.k = k;
    g.bm = bm;
    g.bk = bk;
    g.b_order = SK_ORDER_ROW_MAJOR;
    g.alpha = 1.0f;
    g.density = 0.5;
    g.seed = seed;
    return g;
}

/* ---------------------------------------------------------------------------
 * Which problems the forced Hopper backend must decline
 * ------------------------------------------------------------------------- */

/* The Hopper GEMM kernel's coverage (bsr_gemm.cu's message): block_rows 128
 * and rows of C that end on a 16-byte boundary (n * sizeof(C) % 16 == 0). */
static int gg_sm90_covers(const gg_case *c) {
    const int64_t c_size = c->c == SK_DTYPE_F32 ? 4 : 2;
    return c->bm == 128 && (c->n * c_size) % 16 == 0;
}

static int gg_create(gg_inst *x, const gg_case *c, int with_ref);
static void gg_destroy(gg_inst *x);
static sk_status gg_gpu(gg_inst *x, sk_backend backend, cudaStream_t stream, int split);

/* Whether SK_BACKEND_CUDA_SM90 runs a problem it covers (probed once). */
static int gg_sm90_present(void) {
    static int state = -1;
    if (state >= 0) return state;
    gg_case c = gg_base(SK_DTYPE_F16, SK_DTYPE_F32, 128, 128, 128, 128, 128, 1);
    c.density = 1.0;
    gg_inst x;
    state = 0;
    if (gg_create(&x, &c, 0) == 0 && gt_upload(x.dc, x.c0, (size_t)x.c_elems * x.c_size) == 0) {
        const sk_status st = gg_gpu(&x, SK_BACKEND_CUDA_SM90, NULL, 0);
        state = st == SK_STATUS_SUCCESS;
        if (!state)
            printf("    note: SK_BACKEND_CUDA_SM90 declines a 128 x 128-block GEMM (%s: %s); "
                   "every sm90 GEMM case is checked as a decline\n",
                   sk_status_name(st), sk_last_error());
        (void)gt_sync();
    }
    gg_destroy(&x);
    return state;
}

static int gg_expect_decline(const gg_case *c) {
    return gt_opt.backend == SK_BACKEND_CUDA_SM90 && (!gg_sm90_covers(c) || !gg_sm90_present());
}

/* ---------------------------------------------------------------------------
 * Cases
 * ------------------------------------------------------------------------- */

static int64_t gg_row_end(const gg_inst *x, int64_t i) {
    const int64_t e = (i + 1) * x->c.bm;
    return e < x->c.m ? e : x->c.m;
}

/* fp64 magnitudes for the tolerance: sab and keff (parallel over block rows). */
static int gg_magnitudes(gg_inst *x) {
    const gg_case *c = &x->c;
    const int64_t m = c->m, n = c->n, k = c->k, bm = c->bm, bk = c->bk;
    double *bd = malloc((size_t)(k * n) * sizeof(double));
    x->sab = calloc((size_t)(m * n), sizeof(double));
    x->keff = calloc((size_t)x->rb, sizeof(int64_t));
    if (bd == NULL || x->sab == NULL || x->keff == NULL) {
        free(bd);
        return -1;
    }
    for (int64_t r = 0; r < k; ++r)
        for (int64_t j = 0; j < n; ++j) {
            const int64_t at = c->b_order == SK_ORDER_ROW_MAJOR ? r * x->ldb + j : j * x->ldb + r;
            bd[r * n + j] = fabs((double)tu_load(x->b, c->ab, at));
        }
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t i = 0; i < x->rb; ++i) {
        const int64_t rows = gg_row_end(x, i) - i * bm;
        for (int32_t e = x->layout.row_offsets[i]; e < x->layout.row_offsets[i + 1]; ++e) {
            const int64_t k0 = (int64_t)x->layout.col_indices[e] * bk;
            const int64_t kc = k - k0 < bk ? k - k0 : bk;
            x->keff[i] += kc;
            for (int64_t r = 0; r < rows; ++r) {
                double *s = x->sab + (i * bm + r) * n;
                for (int64_t kk = 0; kk < kc; ++kk) {
                    const double a =
                        fabs((double)tu_load(x->a, c->ab, ((int64_t)e * bm + r) * bk + kk));
                    const double *b = bd + (k0 + kk) * n;
                    for (int64_t j = 0; j < n; ++j) s[j] += a * b[j];
                }
            }
        }
    }
    free(bd);
    return 0;
}

static void gg_desc(const gg_inst *x, sk_backend backend, sk_bsr_gemm_desc *d) {
    sk_bsr_gemm_desc_init(d, sizeof *d);
    d->backend = backend;
    d->ab_dtype = x->c.ab;
    d->c_dtype = x->c.c;
    d->m = x->c.m;
    d->n = x->c.n;
    d->k = x->c.k;
    d->b_order = x->c.b_order;
    d->ldb = x->desc_ldb;
    d->ldc = x->desc_ldc;
    d->alpha = x->c.alpha;
    d->beta = x->c.beta;
}

/* Host inputs, device copies, workspace; with_ref: also the CPU reference
 * and the magnitudes. 0 on success (gg_destroy either way). */
static int gg_create(gg_inst *x, const gg_case *c, int with_ref) {
    memset(x, 0, sizeof *x);
    x->c = *c;
    tu_rng rng;
    tu_rng_seed(&rng, c->seed);
    const int64_t m = c->m, n = c->n, k = c->k, bm = c->bm, bk = c->bk;
    x->rb = (m + bm - 1) / bm;
    x->cb = (k + bk - 1) / bk;
    x->ab_size = dt_size(c->ab);
    x->c_size = dt_size(c->c);

    uint8_t *mask = malloc((size_t)(x->rb * x->cb));
    if (mask == NULL) return -1;
    for (int64_t i = 0; i < x->rb; ++i) {
        const int empty = c->empty_rows > 0 && tu_rng_uniform(&rng) < c->empty_rows;
        for (int64_t j = 0; j < x->cb; ++j)
            mask[i * x->cb + j] = (uint8_t)(!empty && tu_rng_uniform(&rng) < c->density);
    }
    const sk_grid grid = {m, k, c->bm, c->bk, 1, 1};
    const int rc = gt_bsr_from_mask(&x->layout, &grid, mask);
    free(mask);
    if (rc != 0) return -1;

    /* A: valid block elements random, the rest NaN. */
    x->a_elems = (x->layout.nnz > 0 ? x->layout.nnz : 1) * bm * bk;
    x->a = malloc((size_t)x->a_elems * x->ab_size);
    if (x->a == NULL) return -1;
    tu_fill_nan(x->a, c->ab, x->a_elems);
    for (int64_t i = 0; i < x->rb; ++i)
        for (int32_t e = x->layout.row_offsets[i]; e < x->layout.row_offsets[i + 1]; ++e) {
            const int64_t k0 = (int64_t)x->layout.col_indices[e] * bk;
            for (int64_t r = 0; r < gg_row_end(x, i) - i * bm; ++r)
                for (int64_t kk = 0; kk < bk && k0 + kk < k; ++kk)
                    tu_store(x->a, c->ab, ((int64_t)e * bm + r) * bk + kk,
                             (float)tu_rng_normal(&rng));
        }

    /* B: [k, n] in its order; padding and slack NaN. 16-byte rows for CUDA. */
    const int row_major = c->b_order == SK_ORDER_ROW_MAJOR;
    const int64_t b_inner = row_major ? n : k, b_outer = row_major ? k : n;
    const int64_t b_align = 16 / (int64_t)x->ab_size;
    x->ldb = round_up(b_inner, b_align) + b_align * (c->ldb_pad > 0 ? c->ldb_pad : 0);
    x->desc_ldb = c->ldb_pad < 0 && x->ldb == b_inner ? 0 : x->ldb;
    x->b_elems = (b_outer - 1) * x->ldb + b_inner + GG_SLACK;
    x->b = malloc((size_t)x->b_elems * x->ab_size);
    if (x->b == NULL) return -1;
    tu_fill_nan(x->b, c->ab, x->b_elems);
    for (int64_t o = 0; o < b_outer; ++o)
        for (int64_t i = 0; i < b_inner; ++i)
            tu_store(x->b, c->ab, o * x->ldb + i, (float)tu_rng_normal(&rng));

    /* C: NaN everywhere, then values in [m, n] when beta != 0. */
    const int64_t c_align = 16 / (int64_t)x->c_size;
    x->ldc = round_up(n, c_align) + c_align * (c->ldc_pad > 0 ? c->ldc_pad : 0);
    x->desc_ldc = c->ldc_pad < 0 && x->ldc == n ? 0 : x->ldc;
    x->c_elems = (m - 1) * x->ldc + n + GG_SLACK;
    x->c0 = malloc((size_t)x->c_elems * x->c_size);
    if (x->c0 == NULL) return -1;
    tu_fill_nan(x->c0, c->c, x->c_elems);
    if (c->beta != 0.0f)
        for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j)
                tu_store(x->c0, c->c, i * x->ldc + j, (float)tu_rng_normal(&rng));

    /* Device copies and workspace. */
    x->da = gt_device_alloc((size_t)x->a_elems * x->ab_size);
    x->db = gt_device_alloc((size_t)x->b_elems * x->ab_size);
    x->dc = gt_device_alloc((size_t)x->c_elems * x->c_size);
    if (x->da == NULL || x->db == NULL || x->dc == NULL ||
        gt_upload(x->da, x->a, (size_t)x->a_elems * x->ab_size) != 0 ||
        gt_upload(x->db, x->b, (size_t)x->b_elems * x->ab_size) != 0 ||
        gt_bsr_to_device(&x->layout, &x->dlayout) != 0)
        return -1;
    sk_bsr_gemm_desc d;
    gg_desc(x, gt_opt.backend, &d);
    if (sk_bsr_gemm_workspace_size(&d, &x->dlayout, &x->ws_bytes) != SK_STATUS_SUCCESS) {
        printf("    sk_bsr_gemm_workspace_size: %s\n", sk_last_error());
        return -1;
    }
    x->dws = gt_device_alloc(x->ws_bytes);
    if (x->dws == NULL) return -1;
    if (!with_ref) return 0;

    /* The CPU reference on the same host buffers. */
    x->cref = malloc((size_t)x->c_elems * x->c_size);
    if (x->cref == NULL) return -1;
    memcpy(x->cref, x->c0, (size_t)x->c_elems * x->c_size);
    gg_desc(x, SK_BACKEND_CPU, &d);
    const sk_status st = sk_bsr_gemm(&d, &x->layout, x->a, x->b, x->cref, NULL, 0, NULL);
    if (st != SK_STATUS_SUCCESS) {
        printf("    CPU reference: %s: %s\n", sk_status_name(st), sk_last_error());
        return -1;
    }
    return gg_magnitudes(x);
}

static void gg_destroy(gg_inst *x) {
    free(x->a);
    free(x->b);
    free(x->c0);
    free(x->cref);
    free(x->sab);
    free(x->keff);
    gt_bsr_free(&x->layout);
    gt_bsr_free_device(&x->dlayout);
    gt_device_free(x->da);
    gt_device_free(x->db);
    gt_device_free(x->dc);
    gt_device_free(x->dws);
    memset(x, 0, sizeof *x);
}

/* The GEMM on the device buffers (C as it is on the device). */
static sk_status gg_gpu(gg_inst *x, sk_backend backend, cudaStream_t stream, int split) {
    sk_bsr_gemm_desc d;
    gg_desc(x, backend, &d);
    if (!split)
        return sk_bsr_gemm(&d, &x->dlayout, x->da, x->db, x->dc, x->dws, x->ws_bytes, stream);
    const sk_status st = sk_bsr_gemm_plan(&d, &x->dlayout, x->dws, x->ws_bytes, stream);
    if (st != SK_STATUS_SUCCESS) return st;
    return sk_bsr_gemm_run(&d, &x->dlayout, x->da, x->db, x->dc, x->dws, x->ws_bytes, stream);
}

static int gg_reset_c(gg_inst *x) {
    return gt_upload(x->dc, x->c0, (size_t)x->c_elems * x->c_size);
}

static int gg_fetch_c(const gg_inst *x, void *host) {
    return gt_download(host, x->dc, (size_t)x->c_elems * x->c_size);
}

/* The tolerance of element (i, j) (the rule in the file comment). */
static double gg_tol(const gg_inst *x, int64_t i, int64_t j, double ref) {
    const gg_case *c = &x->c;
    const double c_old = c->beta != 0.0f ? tu_load(x->c0, c->c, i * x->ldc + j) : 0.0;
    const double e =
        tu_unit_roundoff(c->c) * fabs(ref) +
        GG_ACC_U * (double)x->keff[i / c->bm] * fabs((double)c->alpha) * x->sab[i * c->n + j] +
        GG_BETA_U * fabs((double)c->beta * c_old);
    return 2.0 * e + GG_ATOL;
}

/* Errors of a downloaded C against the reference, and of its padding and
 * slack against their initial bits. */
static int64_t gg_compare(const gg_inst *x, const void *got, const char *what) {
    const gg_case *c = &x->c;
    int64_t errors = 0;
    double worst = 0;
    for (int64_t i = 0; i < c->m; ++i)
        for (int64_t j = 0; j < c->n; ++j) {
            const int64_t at = i * x->ldc + j;
            const double g = tu_load(got, c->c, at), r = tu_load(x->cref, c->c, at);
            const double tol = gg_tol(x, i, j, r);
            int bad;
            if (isnan(r) || isinf(r))
                bad = !(isnan(r) ? isnan(g) : g == r);
            else
                bad = !isfinite(g) || fabs(g - r) > tol;
            if (isfinite(g) && isfinite(r) && fabs(g - r) / tol > worst) worst = fabs(g - r) / tol;
            if (bad && ++errors <= GG_MAX_REPORTS)
                printf("    %s: C[%lld, %lld] = %.8g, reference %.8g, tolerance %.3g\n", what,
                       (long long)i, (long long)j, g, r, tol);
        }
    const char *g8 = got, *c8 = x->c0;
    for (int64_t i = 0; i < c->m; ++i) {
        const int64_t from = i * x->ldc + c->n;
        const int64_t to = i + 1 < c->m ? (i + 1) * x->ldc : x->c_elems;
        if (memcmp(g8 + from * (int64_t)x->c_size, c8 + from * (int64_t)x->c_size,
                   (size_t)(to - from) * x->c_size) != 0 &&
            ++errors <= GG_MAX_REPORTS)
            printf("    %s: C's padding or slack after row %lld was written\n", what, (long long)i);
    }
    if (gt_opt.verbose || errors > 0)
        printf("    %s: %lld errors, worst error/tolerance %.3f\n", what, (long long)errors, worst);
    return errors;
}

/* Run one case; returns 0 when it passed (failures recorded with CHECK). */
static int gg_run_case(const gg_case *c) {
    char desc[400];
    gg_describe(c, desc, sizeof desc);
    if (gt_opt.verbose) printf("  gemm case: %s\n", desc);
    const int decline = gg_expect_decline(c);
    gg_inst x;
    int failed = 1;
    void *g1 = NULL, *g2 = NULL;
    if (gg_create(&x, c, !decline) != 0) {
        CHECK(0, "could not set up the case [%s]", desc);
        goto done;
    }
    const size_t bytes = (size_t)x.c_elems * x.c_size;
    g1 = malloc(bytes);
    g2 = malloc(bytes);
    if (g1 == NULL || g2 == NULL) {
        CHECK(0, "out of host memory [%s]", desc);
        goto done;
    }
    if (decline) {
        /* The forced kernel must decline, say why, and write nothing. */
        CHECK(gg_reset_c(&x) == 0, "upload [%s]", desc);
        const sk_status st = gg_gpu(&x, gt_opt.backend, NULL, c->split);
        CHECK(st == SK_STATUS_NOT_SUPPORTED, "expected NOT_SUPPORTED, got %s: %s [%s]",
              sk_status_name(st), sk_last_error(), desc);
        const int same = gt_sync() == 0 && gg_fetch_c(&x, g1) == 0 && memcmp(g1, x.c0, bytes) == 0;
        CHECK(same, "C written on decline [%s]", desc);
        failed = st != SK_STATUS_NOT_SUPPORTED || !same;
        ++gt_cases_declined;
        ++gt_gemm_cases_declined;
        goto done;
    }
    for (int run = 0; run < 2; ++run) {
        if (gg_reset_c(&x) != 0) {
            CHECK(0, "upload failed [%s]", desc);
            goto done;
        }
        const sk_status st = gg_gpu(&x, gt_opt.backend, NULL, c->split);
        if (st != SK_STATUS_SUCCESS) {
            CHECK(0, "sk_bsr_gemm: %s: %s [%s]", sk_status_name(st), sk_last_error(), desc);
            goto done;
        }
        if (gt_sync() != 0 || gg_fetch_c(&x, run == 0 ? g1 : g2) != 0) {
            CHECK(0, "GPU run %d failed [%s]", run, desc);
            goto done;
        }
    }
    {
        const int same = memcmp(g1, g2, bytes) == 0;
        CHECK(same, "two runs differ (not bitwise reproducible) [%s]", desc);
        const int64_t errors = gg_compare(&x, g1, "gpu vs CPU");
        CHECK(errors == 0, "%lld elements wrong [%s]", (long long)errors, desc);
        failed = errors != 0 || !same;
    }
done:
    free(g1);
    free(g2);
    gg_destroy(&x);
    ++gt_cases_run;
    ++gt_gemm_cases_run;
    gt_cases_failed += failed;
    gt_gemm_cases_failed += failed;
    return failed;
}

static void gg_print_counts(const char *test, int run0, int failed0, int declined0) {
    printf("    %s: %d GEMM cases run, %d failed, %d declined by the forced backend\n", test,
           gt_gemm_cases_run - run0, gt_gemm_cases_failed - failed0,
           gt_gemm_cases_declined - declined0);
}

/* ---------------------------------------------------------------------------
 * Random cases
 * ------------------------------------------------------------------------- */

/* A dimension: whole blocks, tiny, one off a block multiple, or anything. */
static int64_t gg_pick_dim(tu_rng *rng, int32_t block, int quick) {
    const int64_t max_len = quick ? 200 : 520;
    const double r = tu_rng_uniform(rng);
    if (r < 0.25) return block * tu_rng_range(rng, 1, max_len / block > 1 ? max_len / block : 1);
    if (r < 0.40) return tu_rng_range(rng, 1, 24);
    if (r < 0.50) return block * tu_rng_range(rng, 1, 3) + (tu_rng_uniform(rng) < 0.5 ? 1 : -1);
    return tu_rng_range(rng, 1, max_len);
}

/* Case i: the combination (ab, c, bm, bk, B order) cycles through all 48,
 * the rest is drawn from the case's own seed. */
static void gg_random_case(gg_case *c, int i, int quick, uint64_t seed) {
    static const sk_dtype cdt[3] = {SK_DTYPE_F16, SK_DTYPE_BF16, SK_DTYPE_F32};
    static const float alphas[5] = {1.0f, 1.0f, 0.5f, -1.25f, 2.5f};
    static const float betas[6] = {0.0f, 0.0f, 0.0f, 0.5f, -1.0f, 1.0f};
    static const double densities[7] = {0.0, 0.05, 0.3, 0.6, 0.6, 1.0, 1.0};
    const int combo = quick ? (i * 11) % 48 : i % 48;
    tu_rng rng;
    tu_rng_seed(&rng, seed);
    *c = gg_base(combo & 1 ? SK_DTYPE_BF16 : SK_DTYPE_F16, cdt[(combo >> 1) % 3], 1, 1, 1,
                 (combo / 6) & 1 ? 128 : 64, (combo / 12) & 1 ? 128 : 64, seed);
    c->b_order = (combo / 24) & 1 ? SK_ORDER_COL_MAJOR : SK_ORDER_ROW_MAJOR;
    c->m = gg_pick_dim(&rng, c->bm, quick);
    c->n = gg_pick_dim(&rng, 128, quick);
    c->k = gg_pick_dim(&rng, c->bk, quick);
    c->ldb_pad = (int)tu_rng_range(&rng, -1, 2);
    c->ldc_pad = (int)tu_rng_range(&rng, -1, 2);
    c->alpha = alphas[tu_rng_range(&rng, 0, 4)];
    c->beta = betas[tu_rng_range(&rng, 0, 5)];
    c->density = densities[tu_rng_range(&rng, 0, 6)];
    c->empty_rows = tu_rng_uniform(&rng) < 0.25 ? 0.3 : 0.0;
    c->split = tu_rng_uniform(&rng) < 0.3;
    const double budget = quick ? GG_QUICK_WORK : GG_CASE_WORK;
    while ((double)c->m * c->n * c->k * (c->density > 0.1 ? c->density : 0.1) > budget) {
        if (c->k >= c->m && c->k >= c->n)
            c->k = (c->k + 1) / 2;
        else if (c->m >= c->n)
            c->m = (c->m + 1) / 2;
        else
            c->n = (c->n + 1) / 2;
    }
}

SK_TEST(gemm_gpu_random_cases) {
    const int run0 = gt_gemm_cases_run, failed0 = gt_gemm_cases_failed;
    const int declined0 = gt_gemm_cases_declined;
    const int cases = gt_opt.quick ? GG_QUICK_CASES : GG_RANDOM_CASES;
    const uint64_t base = tu_base_seed() ^ 0x67656d6d00000000ull; /* "gemm" */
    for (int i = 0; i < cases; ++i) {
        gg_case c;
        gg_random_case(&c, i, gt_opt.quick, base + (uint64_t)i);
        gg_run_case(&c);
    }
    gg_print_counts("random", run0, failed0, declined0);
    CHECK(gt_gemm_cases_run - run0 == cases, "%d of %d cases ran", gt_gemm_cases_run - run0, cases);
}

/* The same draw restricted to what the Hopper kernel covers (block_rows
 * 128, n a multiple of 8: 16-byte rows of C), so that it too sees more than
 * 100 random cases; every other backend runs them as well. */
SK_TEST(gemm_gpu_random_hopper_shapes) {
    const int run0 = gt_gemm_cases_run, failed0 = gt_gemm_cases_failed;
    const int declined0 = gt_gemm_cases_declined;
    const int cases = gt_opt.quick ? GG_QUICK_CASES : GG_HOPPER_CASES;
    const uint64_t base = tu_base_seed() ^ 0x6839300000000000ull; /* "h90" */
    for (int i = 0; i < cases; ++i) {
        gg_case c;
        gg_random_case(&c, i, gt_opt.quick, base + (uint64_t)i);
        c.bm = 128;
        c.n = (c.n + 7) / 8 * 8;
        gg_run_case(&c);
    }
    gg_print_counts("random (Hopper shapes)", run0, failed0, declined0);
    CHECK(gt_gemm_cases_run - run0 == cases, "%d of %d cases ran", gt_gemm_cases_run - run0, cases);
    if (gt_opt.backend == SK_BACKEND_CUDA_SM90 && gg_sm90_present())
        CHECK(gt_gemm_cases_declined == declined0, "the Hopper kernel declined %d of its own cases",
              gt_gemm_cases_declined - declined0);
}

/* ---------------------------------------------------------------------------
 * Chosen cases: tiny, whole blocks, empty, dense, large
 * ------------------------------------------------------------------------- */

SK_TEST(gemm_gpu_chosen_cases) {
    const int run0 = gt_gemm_cases_run, failed0 = gt_gemm_cases_failed;
    const int declined0 = gt_gemm_cases_declined;
    const uint64_t s = tu_base_seed() ^ 0x5151;
    gg_case c;
    /* One element. */
    c = gg_base(SK_DTYPE_F16, SK_DTYPE_F32, 1, 1, 1, 64, 64, s + 1);
    c.density = 1.0;
    gg_run_case(&c);
    /* 17 x 17 x 17, every dtype pair of C, beta != 0. */
    c = gg_base(SK_DTYPE_BF16, SK_DTYPE_BF16, 17, 17, 17, 128, 128, s + 2);
    c.density = 1.0;
    c.beta = -1.0f;
    c.alpha = 0.5f;
    c.ldc_pad = 1;
    gg_run_case(&c);
    /* Nothing selected: C = 0 (beta 0, C NaN before) and C = beta C. */
    c = gg_base(SK_DTYPE_F16, SK_DTYPE_F16, 200, 300, 100, 64, 128, s + 3);
    c.density = 0.0;
    c.ldb_pad = 1;
    c.ldc_pad = 2;
    gg_run_case(&c);
    c.beta = 0.5f;
    c.b_order = SK_ORDER_COL_MAJOR;
    gg_run_case(&c);
    /* Whole blocks, dense, both B orders, split plan / run. */
    c = gg_base(SK_DTYPE_F16, SK_DTYPE_F32, 256, 256, 256, 128, 64, s + 4);
    c.density = 1.0;
    c.split = 1;
    gg_run_case(&c);
    c.b_order = SK_ORDER_COL_MAJOR;
    gg_run_case(&c);
    if (!gt_opt.quick) {
        /* Large: many tiles, long rows. */
        c = gg_base(SK_DTYPE_F16, SK_DTYPE_F32, 1024, 1024, 2048, 128, 128, s + 5);
        c.density = 0.5;
        gg_run_case(&c);
        c = gg_base(SK_DTYPE_BF16, SK_DTYPE_BF16, 1000, 1000, 1500, 64, 64, s + 6);
        c.b_order = SK_ORDER_COL_MAJOR;
        c.density = 0.4;
        c.beta = 0.5f;
        c.ldb_pad = 2;
        c.ldc_pad = 1;
        gg_run_case(&c);
        c = gg_base(SK_DTYPE_BF16, SK_DTYPE_F16, 2048, 384, 4096, 128, 64, s + 7);
        c.density = 0.2;
        c.empty_rows = 0.3;
        c.alpha = -1.25f;
        gg_run_case(&c);
        c = gg_base(SK_DTYPE_F16, SK_DTYPE_BF16, 1111, 777, 999, 64, 128, s + 8);
        c.density = 1.0;
        c.b_order = SK_ORDER_COL_MAJOR;
        c.beta = -1.0f;
        c.ldb_pad = 1;
        gg_run_case(&c);
    }
    gg_print_counts("chosen", run0, failed0, declined0);
    CHECK(gt_gemm_cases_failed == failed0, "%d chosen cases failed",
          gt_gemm_cases_failed - failed0);
}

/* ---------------------------------------------------------------------------
 * The comparison can fail
 * ------------------------------------------------------------------------- */

/* Store v into element `at` of a C buffer of the case's dtype. */
static void gg_poke(const gg_inst *x, void *buf, int64_t at, double v) {
    tu_store(buf, x->c.c, at, (float)v);
}

SK_TEST(gemm_gpu_checker_catches_errors) {
    gg_case c = gg_base(SK_DTYPE_F16, SK_DTYPE_F32, 150, 70, 300, 64, 64, tu_base_seed() ^ 0xbad);
    c.density = 0.7;
    c.beta = 0.5f;
    c.ldc_pad = 1;
    if (gg_expect_decline(&c)) {
        printf("    not covered by the forced backend: skipped\n");
        return;
    }
    gg_inst x;
    REQUIRE(gg_create(&x, &c, 1) == 0, "setup");
    const size_t bytes = (size_t)x.c_elems * x.c_size;
    void *g = malloc(bytes), *h = malloc(bytes);
    REQUIRE(g != NULL && h != NULL, "memory");
    CHECK(gg_reset_c(&x) == 0, "upload");
    const sk_status st = gg_gpu(&x, gt_opt.backend, NULL, 0);
    CHECK(st == SK_STATUS_SUCCESS, "%s: %s", sk_status_name(st), sk_last_error());
    CHECK(gt_sync() == 0 && gg_fetch_c(&x, g) == 0, "GPU run");
    CHECK(gg_compare(&x, g, "as computed") == 0, "the GPU result itself fails");

    const int64_t i = 37, j = 11, at = i * x.ldc + j;
    const double r = tu_load(x.cref, c.c, at), tol = gg_tol(&x, i, j, r);
    memcpy(h, g, bytes);
    gg_poke(&x, h, at, r + 3.0 * tol);
    CHECK(gg_compare(&x, h, "expected error: one element + 3 tol") == 1, "3 tol missed");
    memcpy(h, g, bytes);
    gg_poke(&x, h, at, NAN);
    CHECK(gg_compare(&x, h, "expected error: one NaN") == 1, "NaN missed");
    memcpy(h, g, bytes);
    gg_poke(&x, h, 5 * x.ldc + c.n, 0.0); /* row 5's ldc padding */
    CHECK(gg_compare(&x, h, "expected error: padding written") == 1, "padding write missed");

    /* One A block skipped: the CPU result without it must fail the rule. */
    int32_t e = -1;
    for (int64_t rb = 0; rb < x.rb && e < 0; ++rb)
        if (x.layout.row_offsets[rb + 1] > x.layout.row_offsets[rb]) e = x.layout.row_offsets[rb];
    REQUIRE(e >= 0, "the case has a block");
    void *a_saved = malloc((size_t)x.a_elems * x.ab_size), *cref_saved = x.cref;
    REQUIRE(a_saved != NULL, "memory");
    memcpy(a_saved, x.a, (size_t)x.a_elems * x.ab_size);
    for (int64_t t = 0; t < (int64_t)c.bm * c.bk; ++t)
        if (!isnan(tu_load(x.a, c.ab, (int64_t)e * c.bm * c.bk + t)))
            tu_store(x.a, c.ab, (int64_t)e * c.bm * c.bk + t, 0.0f);
    memcpy(h, x.c0, bytes);
    sk_bsr_gemm_desc d;
    gg_desc(&x, SK_BACKEND_CPU, &d);
    CHECK(sk_bsr_gemm(&d, &x.layout, x.a, x.b, h, NULL, 0, NULL) == SK_STATUS_SUCCESS, "CPU");
    x.cref = h;
    const int64_t skipped = gg_compare(&x, g, "expected errors: reference without one block");
    CHECK(skipped > 0, "a skipped block passes the tolerance rule");
    x.cref = cref_saved;
    memcpy(x.a, a_saved, (size_t)x.a_elems * x.ab_size);
    free(a_saved);
    free(g);
    free(h);
    gg_destroy(&x);
}

/* ---------------------------------------------------------------------------
 * CUDA graphs
 * ------------------------------------------------------------------------- */

/* Plan + run captured once: capturing runs nothing; replays equal the
 * direct run bitwise and the reference. */
SK_TEST(gemm_gpu_graph_capture) {
    gg_case c =
        gg_base(SK_DTYPE_BF16, SK_DTYPE_BF16, 300, 200, 500, 128, 64, tu_base_seed() ^ 0x9a);
    c.density = 0.4;
    c.ldc_pad = 1;
    if (gg_expect_decline(&c)) {
        printf("    not covered by the forced backend: skipped (declines are checked by the "
               "random cases)\n");
        return;
    }
    gg_inst x;
    REQUIRE(gg_create(&x, &c, 1) == 0, "setup");
    const size_t bytes = (size_t)x.c_elems * x.c_size;
    void *direct = malloc(bytes), *replay = malloc(bytes);
    REQUIRE(direct != NULL && replay != NULL, "memory");
    cudaStream_t stream = NULL;
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess, "stream");

    CHECK(gg_reset_c(&x) == 0, "upload");
    sk_status st = gg_gpu(&x, gt_opt.backend, stream, 0);
    CHECK(st == SK_STATUS_SUCCESS, "direct: %s %s", sk_status_name(st), sk_last_error());
    CHECK(cudaStreamSynchronize(stream) == cudaSuccess, "sync");
    CHECK(gg_fetch_c(&x, direct) == 0, "download");
    CHECK(gg_compare(&x, direct, "direct") == 0, "direct run wrong");

    CHECK(gg_reset_c(&x) == 0, "upload");
    REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal) == cudaSuccess, "capture");
    st = gg_gpu(&x, gt_opt.backend, stream, 0);
    const cudaError_t end = cudaStreamEndCapture(stream, &graph);
    CHECK(st == SK_STATUS_SUCCESS, "captured: %s %s", sk_status_name(st), sk_last_error());
    REQUIRE(end == cudaSuccess, "cudaStreamEndCapture: %s", cudaGetErrorName(end));
    CHECK(gg_fetch_c(&x, replay) == 0 && memcmp(replay, x.c0, bytes) == 0,
          "capturing ran the work");
    REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess, "instantiate");
    for (int rep = 0; rep < 2; ++rep) {
        CHECK(gg_reset_c(&x) == 0, "upload");
        CHECK(cudaGraphLaunch(exec, stream) == cudaSuccess, "launch");
        CHECK(cudaStreamSynchronize(stream) == cudaSuccess, "sync");
        CHECK(gg_fetch_c(&x, replay) == 0, "download");
        CHECK(memcmp(direct, replay, bytes) == 0, "replay %d differs from the direct run", rep);
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
    free(direct);
    free(replay);
    gg_destroy(&x);
}

/* ---------------------------------------------------------------------------
 * Robustness: device layouts are not validated
 * ------------------------------------------------------------------------- */

/* Columns outside [0, col_blocks) (their blocks NaN) are skipped, and a last
 * offset past nnz is clamped: the result equals the reference of the layout
 * without them. */
SK_TEST(gemm_gpu_out_of_range_columns) {
    gg_case c = gg_base(SK_DTYPE_F16, SK_DTYPE_F32, 300, 150, 700, 64, 128, tu_base_seed() ^ 0x0c);
    c.density = 0.5;
    if (gg_expect_decline(&c)) {
        printf("    not covered by the forced backend: skipped\n");
        return;
    }
    gg_inst x;
    REQUIRE(gg_create(&x, &c, 1) == 0, "setup");
    const int64_t blk = (int64_t)c.bm * c.bk;
    const int32_t bad_cols[3] = {-1, (int32_t)x.cb, 0x7fffffff};
    /* Each row gets up to three bad entries: first, middle, last. */
    const int64_t cap = x.layout.nnz + 3 * x.rb;
    int32_t *off = malloc((size_t)(x.rb + 1) * sizeof(int32_t));
    int32_t *idx = malloc((size_t)cap * sizeof(int32_t));
    void *vals = malloc((size_t)(cap > 0 ? cap : 1) * (size_t)blk * x.ab_size);
    REQUIRE(off != NULL && idx != NULL && vals != NULL, "memory");
    tu_fill_nan(vals, c.ab, (cap > 0 ? cap : 1) * blk);
    int32_t n = 0;
    for (int64_t i = 0; i < x.rb; ++i) {
        off[i] = n;
        const int32_t e0 = x.layout.row_offsets[i], e1 = x.layout.row_offsets[i + 1];
        if (i % 2 == 0) idx[n++] = bad_cols[i % 3];
        for (int32_t e = e0; e < e1; ++e) {
            if (i % 3 == 1 && e == (e0 + e1) / 2) idx[n++] = bad_cols[(i + 1) % 3];
            memcpy((char *)vals + (size_t)n * (size_t)blk * x.ab_size,
                   (const char *)x.a + (size_t)e * (size_t)blk * x.ab_size,
                   (size_t)blk * x.ab_size);
            idx[n++] = x.layout.col_indices[e];
        }
        if (i % 3 == 0) idx[n++] = bad_cols[(i + 2) % 3];
    }
    off[x.rb] = n + 1000; /* past nnz: clamped */
    sk_bsr host = x.layout;
    host.nnz = n;
    host.row_offsets = off;
    host.col_indices = idx;
    sk_bsr dev;
    REQUIRE(gt_bsr_to_device(&host, &dev) == 0, "layout upload");
    void *dvals = gt_device_alloc((size_t)(n > 0 ? n : 1) * (size_t)blk * x.ab_size);
    REQUIRE(dvals != NULL &&
                gt_upload(dvals, vals, (size_t)(n > 0 ? n : 1) * (size_t)blk * x.ab_size) == 0,
            "values upload");
    size_t ws_bytes = 0;
    sk_bsr_gemm_desc d;
    gg_desc(&x, gt_opt.backend, &d);
    REQUIRE(sk_bsr_gemm_workspace_size(&d, &dev, &ws_bytes) == SK_STATUS_SUCCESS, "%s",
            sk_last_error());
    void *ws = gt_device_alloc(ws_bytes);
    void *got = malloc((size_t)x.c_elems * x.c_size);
    REQUIRE(ws != NULL && got != NULL, "memory");
    CHECK(gg_reset_c(&x) == 0, "upload");
    const sk_status st = sk_bsr_gemm(&d, &dev, dvals, x.db, x.dc, ws, ws_bytes, NULL);
    CHECK(st == SK_STATUS_SUCCESS, "%s: %s", sk_status_name(st), sk_last_error());
    CHECK(gt_sync() == 0 && gg_fetch_c(&x, got) == 0, "GPU run");
    CHECK(gg_compare(&x, got, "bad columns skipped") == 0, "%d bad entries not skipped",
          (int)(n - x.layout.nnz));
    free(got);
    gt_device_free(ws);
    gt_device_free(dvals);
    gt_bsr_free_device(&dev);
    free(off);
    free(idx);
    free(vals);
    gg_destroy(&x);
}

/* ---------------------------------------------------------------------------
 * Bad workspace
 * ------------------------------------------------------------------------- */

SK_TEST(gemm_gpu_bad_workspace) {
    /* The forced Hopper backend declines before the workspace check; test
     * the library's choice there. */
    const sk_backend be = gt_opt.backend == SK_BACKEND_CUDA_SM90 ? SK_BACKEND_CUDA : gt_opt.backend;
    gg_case c = gg_base(SK_DTYPE_F16, SK_DTYPE_F16, 100, 64, 200, 64, 64, tu_base_seed() ^ 0x3c);
    gg_inst x;
    REQUIRE(gg_create(&x, &c, 0) == 0, "setup");
    const size_t bytes = (size_t)x.c_elems * x.c_size;
    void *got = malloc(bytes);
    REQUIRE(got != NULL, "memory");
    CHECK(gg_reset_c(&x) == 0, "upload");
    sk_bsr_gemm_desc d;
    gg_desc(&x, be, &d);
    const size_t need = x.ws_bytes;
    for (int i = 0; i < 4; ++i) {
        sk_status st;
        if (i == 0)
            st = sk_bsr_gemm(&d, &x.dlayout, x.da, x.db, x.dc, NULL, need, NULL);
        else if (i == 1)
            st = sk_bsr_gemm(&d, &x.dlayout, x.da, x.db, x.dc, x.dws, need - 1, NULL);
        else if (i == 2)
            st = sk_bsr_gemm_run(&d, &x.dlayout, x.da, x.db, x.dc, NULL, need, NULL);
        else
            st = sk_bsr_gemm_plan(&d, &x.dlayout, x.dws, 0, NULL);
        CHECK(st == SK_STATUS_BAD_PARAM_WORKSPACE, "call %d: %s", i, sk_status_name(st));
        CHECK(strstr(sk_last_error(), "workspace") != NULL, "call %d: message: %s", i,
              sk_last_error());
    }
    CHECK(gt_sync() == 0 && gg_fetch_c(&x, got) == 0 && memcmp(got, x.c0, bytes) == 0,
          "C written by a call that failed");
    /* The same buffers with the right size work. */
    const sk_status ok = sk_bsr_gemm(&d, &x.dlayout, x.da, x.db, x.dc, x.dws, need, NULL);
    CHECK(ok == SK_STATUS_SUCCESS, "%s: %s", sk_status_name(ok), sk_last_error());
    CHECK(gt_sync() == 0, "sync");
    free(got);
    gg_destroy(&x);
}

/* ---------------------------------------------------------------------------
 * Timing (SPARSEK_GEMM_TIMING=1): M = N = K = 8192, random k blocks per row
 * ------------------------------------------------------------------------- */

enum { GG_PATTERN = 1 << 22, GG_TIMING_REPS = 15, GG_TIMING_WARMUP = 3, GG_TIMING_SAMPLES = 48 };

typedef struct gg_timing_cfg {
    const char *name;
    sk_dtype ab, c;
    int32_t bm, bk;
    sk_order order;
    double density;
} gg_timing_cfg;

static void gg_time_one(const gg_timing_cfg *t, const uint16_t *pat, const void *dpat) {
    const int64_t M = 8192, N = 8192, K = 8192;
    const int64_t rb = M / t->bm, cb = K / t->bk;
    const int32_t per_row = (int32_t)(cb * t->density + 0.5);
    uint8_t *mask = calloc((size_t)(rb * cb), 1);
    int32_t *perm = malloc((size_t)cb * sizeof(int32_t));
    REQUIRE(mask != NULL && perm != NULL, "memory");
    tu_rng rng;
    tu_rng_seed(&rng, tu_base_seed() ^ 0x7133);
    for (int64_t i = 0; i < rb; ++i) {
        for (int64_t j = 0; j < cb; ++j) perm[j] = (int32_t)j;
        for (int64_t j = 0; j < per_row; ++j) {
            const int64_t r = tu_rng_range(&rng, j, cb - 1);
            const int32_t s = perm[j];
            perm[j] = perm[r];
            perm[r] = s;
            mask[i * cb + perm[j]] = 1;
        }
    }
    sk_bsr host, dev;
    const sk_grid grid = {M, K, t->bm, t->bk, 1, 1};
    REQUIRE(gt_bsr_from_mask(&host, &grid, mask) == 0 && gt_bsr_to_device(&host, &dev) == 0,
            "layout");
    free(mask);
    free(perm);
    const int64_t a_elems = (int64_t)host.nnz * t->bm * t->bk, b_elems = K * N;
    const size_t cs = dt_size(t->c);
    void *da = gt_device_alloc((size_t)a_elems * 2), *db = gt_device_alloc((size_t)b_elems * 2);
    void *dc = gt_device_alloc((size_t)(M * N) * cs);
    REQUIRE(da != NULL && db != NULL && dc != NULL, "device memory");
    REQUIRE(gt_fill_repeated(da, dpat, GG_PATTERN, a_elems) == 0 &&
                gt_fill_repeated(db, dpat, GG_PATTERN, b_elems) == 0,
            "fill");
    cudaMemset(dc, 0xff, (size_t)(M * N) * cs);
    sk_bsr_gemm_desc d;
    sk_bsr_gemm_desc_init(&d, sizeof d);
    d.backend = gt_opt.backend;
    d.ab_dtype = t->ab;
    d.c_dtype = t->c;
    d.m = M;
    d.n = N;
    d.k = K;
    d.b_order = t->order;
    size_t ws_bytes = 0;
    sk_status st = sk_bsr_gemm_workspace_size(&d, &dev, &ws_bytes);
    void *ws = st == SK_STATUS_SUCCESS ? gt_device_alloc(ws_bytes) : NULL;
    if (ws != NULL) st = sk_bsr_gemm(&d, &dev, da, db, dc, ws, ws_bytes, NULL);
    if (st != SK_STATUS_SUCCESS || gt_sync() != 0) {
        printf("    timing %s: %s %s\n", t->name, sk_status_name(st), sk_last_error());
        CHECK(gt_opt.backend == SK_BACKEND_CUDA_SM90 && st == SK_STATUS_NOT_SUPPORTED,
              "timing case failed");
    } else {
        /* Sampled elements against fp64 (values: the pattern repeated). */
        void *crow = malloc((size_t)N * cs);
        double worst = 0;
        for (int s = 0; s < GG_TIMING_SAMPLES && crow != NULL; ++s) {
            const int64_t i = tu_rng_range(&rng, 0, M - 1), j = tu_rng_range(&rng, 0, N - 1);
            gt_download(crow, (const char *)dc + (size_t)(i * N) * cs, (size_t)N * cs);
            double ref = 0, mag = 0;
            int64_t keff = 0;
            const int64_t bi = i / t->bm, r = i % t->bm;
            for (int32_t e = host.row_offsets[bi]; e < host.row_offsets[bi + 1]; ++e) {
                const int64_t k0 = (int64_t)host.col_indices[e] * t->bk;
                for (int64_t kk = 0; kk < t->bk; ++kk) {
                    const double a =
                        tu_load(pat, t->ab, (((int64_t)e * t->bm + r) * t->bk + kk) % GG_PATTERN);
                    const int64_t bat =
                        t->order == SK_ORDER_ROW_MAJOR ? (k0 + kk) * N + j : j * K + k0 + kk;
                    const double b = tu_load(pat, t->ab, bat % GG_PATTERN);
                    ref += a * b;
                    mag += fabs(a * b);
                    ++keff;
                }
            }
            const double g = tu_load(crow, t->c, j);
            const double tol =
                2.0 * (tu_unit_roundoff(t->c) * fabs(ref) + GG_ACC_U * keff * mag) + GG_ATOL;
            const double err = fabs(g - ref) / tol;
            worst = isfinite(g) && err > worst ? err : isfinite(g) ? worst : INFINITY;
        }
        free(crow);
        CHECK(worst <= 1.0, "%s: sampled error / tolerance %.3f", t->name, worst);
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0);
        cudaEventCreate(&e1);
        float ms[GG_TIMING_REPS];
        for (int rep = 0; rep < GG_TIMING_WARMUP + GG_TIMING_REPS; ++rep) {
            cudaEventRecord(e0, NULL);
            st = sk_bsr_gemm_run(&d, &dev, da, db, dc, ws, ws_bytes, NULL);
            cudaEventRecord(e1, NULL);
            cudaEventSynchronize(e1);
            if (rep >= GG_TIMING_WARMUP) cudaEventElapsedTime(&ms[rep - GG_TIMING_WARMUP], e0, e1);
        }
        CHECK(st == SK_STATUS_SUCCESS && gt_sync() == 0, "timed runs");
        qsort(ms, GG_TIMING_REPS, sizeof(float), gt_cmp_float);
        const double med = ms[GG_TIMING_REPS / 2] * 1e-3;
        const double flops = 2.0 * (double)host.nnz * t->bm * t->bk * (double)N;
        sk_device_info info;
        sk_device_get_info(0, &info);
        printf("{\"name\": \"%s\", \"gpu\": \"%s\", \"backend\": \"%s\", \"m\": %lld, \"n\": "
               "%lld, \"k\": %lld, \"ab\": \"%s\", \"c\": \"%s\", \"block_m\": %d, "
               "\"block_k\": %d, \"b_order\": \"%s\", \"density\": %.4f, \"median_us\": %.1f, "
               "\"min_us\": %.1f, \"actual_tflops\": %.1f, \"dense_equivalent_tflops\": %.1f, "
               "\"check_worst_err_over_tol\": %.3f}\n",
               t->name, info.name,
               gt_opt.backend == SK_BACKEND_CUDA_SM80   ? "sm80"
               : gt_opt.backend == SK_BACKEND_CUDA_SM90 ? "sm90"
                                                        : "cuda",
               (long long)M, (long long)N, (long long)K, dt_name(t->ab), dt_name(t->c), (int)t->bm,
               (int)t->bk, t->order == SK_ORDER_ROW_MAJOR ? "row" : "col",
               (double)host.nnz / (double)(rb * cb), med * 1e6, ms[0] * 1e3, flops / med * 1e-12,
               2.0 * (double)M * N * K / med * 1e-12, worst);
        fflush(stdout);
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
    }
    gt_device_free(ws);
    gt_device_free(da);
    gt_device_free(db);
    gt_device_free(dc);
    gt_bsr_free_device(&dev);
    gt_bsr_free(&host);
}

SK_TEST(gemm_gpu_timing) {
    const char *env = getenv("SPARSEK_GEMM_TIMING");
    if (env == NULL || strcmp(env, "1") != 0 || gt_opt.quick) {
        printf("    skipped (set SPARSEK_GEMM_TIMING=1)\n");
        return;
    }
    static const gg_timing_cfg cfgs[] = {
        {"f16_b128_rand25", SK_DTYPE_F16, SK_DTYPE_F16, 128, 128, SK_ORDER_ROW_MAJOR, 0.25},
        {"bf16_b128_rand25", SK_DTYPE_BF16, SK_DTYPE_BF16, 128, 128, SK_ORDER_ROW_MAJOR, 0.25},
        {"f16_b128_rand25_colB", SK_DTYPE_F16, SK_DTYPE_F16, 128, 128, SK_ORDER_COL_MAJOR, 0.25},
        {"f16_b64_rand25_f32c", SK_DTYPE_F16, SK_DTYPE_F32, 64, 64, SK_ORDER_ROW_MAJOR, 0.25},
        {"f16_b128_dense", SK_DTYPE_F16, SK_DTYPE_F16, 128, 128, SK_ORDER_ROW_MAJOR, 1.0},
    };
    uint16_t *pat16 = malloc((size_t)GG_PATTERN * 2), *patbf = malloc((size_t)GG_PATTERN * 2);
    void *dpat = gt_device_alloc((size_t)GG_PATTERN * 2);
    REQUIRE(pat16 != NULL && patbf != NULL && dpat != NULL, "memory");
    tu_rng rng;
    tu_rng_seed(&rng, tu_base_seed() ^ 0x7a7);
    for (int64_t i = 0; i < GG_PATTERN; ++i) {
        const float v = (float)(tu_rng_uniform(&rng) * 2.0 - 1.0);
        pat16[i] = tu_f32_to_f16(v);
        patbf[i] = tu_f32_to_bf16(v);
    }
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; ++i) {
        const uint16_t *pat = cfgs[i].ab == SK_DTYPE_F16 ? pat16 : patbf;
        REQUIRE(gt_upload(dpat, pat, (size_t)GG_PATTERN * 2) == 0, "upload");
        gg_time_one(&cfgs[i], pat, dpat);
    }
    gt_device_free(dpat);
    free(pat16);
    free(patbf);
}
