/*
 * fuzz_api_gemm.c - sk_bsr_gemm_workspace_size, _plan, _run and sk_bsr_gemm
 * on the CPU backend (part of the fuzz_api harness).
 *
 * Buffers: a_values, b (read), c (written; read when beta != 0), the A
 * layout's arrays (read) and the workspace (unused on the CPU). The rules
 * are the header's: the descriptor (struct_size, backend, dtypes, m, n, k
 * >= 1, b_order, finite alpha and beta, ldb and ldc 0 or at least the row),
 * the A layout (grid rows m, cols k, batch = heads = 1; its content for the
 * calls that read it), a_values present when nnz > 0, b and c present,
 * spans within int64, and C apart from every input. Block elements past m
 * or k are NaN (they must never be read), as is C when beta is 0.
 * Tolerance: |got - ref| <= 2 (u_c |ref| + u_32 sqrt(k) mag) + 2^-24,
 * mag = |alpha| sum |a b| + |beta c| (the rule of tests/cpu/test_gemm_cpu.c).
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/test_util.h"
#include "fuzz_api.h"
#include "fz_tensor.h"

typedef struct gemm {
    sk_bsr_gemm_desc d;
    int64_t ldb, ldc, b_inner, b_outer;
    int64_t a_elems, b_elems, c_elems; /* documented spans in elements */
    int spans_ok;
} gemm;

static void make_desc(const api_case *c, sk_bsr_gemm_desc *d) {
    sk_bsr_gemm_desc_init(d, sizeof *d);
    d->backend = (sk_backend)c->backend;
    d->ab_dtype = (sk_dtype)c->dtype;
    d->c_dtype = (sk_dtype)c->c_dtype;
    d->m = c->size[0];
    d->n = c->size[1];
    d->k = c->size[2];
    d->b_order = (sk_order)c->mask;
    d->ldb = c->strides[0][0];
    d->ldc = c->strides[0][1];
    d->alpha = c->scale;
    d->beta = c->beta;
    if (c->fault == API_FAULT_STRUCT_SIZE) d->struct_size += 1;
}

/* The descriptor's and the layout's rules; the spans in g. */
static void expect_gemm(const api_case *c, const api_layout *l, gemm *g, fz_expect *e) {
    const sk_bsr_gemm_desc *d = &g->d;
    if (c->fault == API_FAULT_STRUCT_SIZE) fz_expect_fail(e, "desc->struct_size is wrong");
    if (c->fault == API_FAULT_NULL_DESC) fz_expect_fail(e, "desc is NULL");
    if (c->fault == API_FAULT_NULL_LAYOUT) fz_expect_fail(e, "a_layout is NULL");
    api_expect_backend(e, d->backend, d->ab_dtype, c->op != API_GEMM_WORKSPACE);
    api_expect_dtype(e, d->ab_dtype, "desc->ab_dtype");
    api_expect_dtype(e, d->c_dtype, "desc->c_dtype");
    if (d->m < 1 || d->n < 1 || d->k < 1) fz_expect_fail(e, "m, n or k below 1");
    if (d->b_order != SK_ORDER_ROW_MAJOR && d->b_order != SK_ORDER_COL_MAJOR)
        fz_expect_fail(e, "b_order = %d is not an sk_order", (int)d->b_order);
    if (!isfinite(d->alpha) || !isfinite(d->beta)) fz_expect_fail(e, "alpha or beta not finite");
    const sk_grid *gr = &c->grid;
    if (!l->g.ok) fz_expect_fail(e, "the A layout's grid is refused by sk_grid_blocks' rules");
    if (gr->rows != d->m || gr->cols != d->k) fz_expect_fail(e, "the A grid is not m x k");
    if (gr->batch != 1 || gr->heads != 1) fz_expect_fail(e, "the A grid has batch or heads != 1");
    g->spans_ok = 0;
    if (d->m < 1 || d->n < 1 || d->k < 1) return;
    g->b_inner = d->b_order == SK_ORDER_COL_MAJOR ? d->k : d->n;
    g->b_outer = d->b_order == SK_ORDER_COL_MAJOR ? d->n : d->k;
    g->ldb = d->ldb != 0 ? d->ldb : g->b_inner;
    g->ldc = d->ldc != 0 ? d->ldc : d->n;
    if (g->ldb < g->b_inner) fz_expect_fail(e, "ldb = %lld is below the row", (long long)d->ldb);
    if (g->ldc < d->n) fz_expect_fail(e, "ldc = %lld is below n", (long long)d->ldc);
    if (g->ldb < g->b_inner || g->ldc < d->n) return;
    const size_t ab = fz_dtype_size(d->ab_dtype), cs = fz_dtype_size(d->c_dtype);
    int64_t x;
    g->a_elems = l->g.ok && l->bsr.nnz > 0
                     ? (int64_t)l->bsr.nnz * c->grid.block_rows * c->grid.block_cols
                     : 0;
    if (__builtin_mul_overflow(g->b_outer - 1, g->ldb, &g->b_elems) ||
        __builtin_add_overflow(g->b_elems, g->b_inner, &g->b_elems) ||
        __builtin_mul_overflow(g->b_elems, (int64_t)(ab ? ab : 1), &x) ||
        __builtin_mul_overflow(d->m - 1, g->ldc, &g->c_elems) ||
        __builtin_add_overflow(g->c_elems, d->n, &g->c_elems) ||
        __builtin_mul_overflow(g->c_elems, (int64_t)(cs ? cs : 1), &x)) {
        fz_expect_fail(e, "the span of B or C overflows int64 bytes");
        return;
    }
    g->spans_ok = ab > 0 && cs > 0;
}

/* A as a dense fp64 [m, k] from the layout's blocks (0 where none). */
static double *dense_a(const gemm *g, const api_layout *l, const void *av) {
    const sk_bsr_gemm_desc *d = &g->d;
    const int64_t bm = l->bsr.grid.block_rows, bk = l->bsr.grid.block_cols;
    double *A = (double *)calloc((size_t)(d->m * d->k), sizeof(double));
    if (A == NULL) fz_fail("harness: out of memory");
    for (int64_t gi = 0; gi * bm < d->m; ++gi)
        for (int32_t e = l->bsr.row_offsets[gi]; e < l->bsr.row_offsets[gi + 1]; ++e) {
            const int64_t j = l->bsr.col_indices[e];
            for (int64_t r = gi * bm; r < d->m && r < (gi + 1) * bm; ++r)
                for (int64_t x = j * bk; x < d->k && x < (j + 1) * bk; ++x)
                    A[r * d->k + x] =
                        (double)tu_load(av, d->ab_dtype, ((int64_t)e * bm + r % bm) * bk + x % bk);
        }
    return A;
}

/* The largest finite value of a dtype. */
static double max_finite(sk_dtype dt) {
    return dt == SK_DTYPE_F16 ? 65504.0 : dt == SK_DTYPE_BF16 ? 0x1.fep127 : (double)FLT_MAX;
}

static void check_result(const gemm *g, const api_layout *l, const fz_arena *a) {
    const sk_bsr_gemm_desc *d = &g->d;
    const void *b = a->b[1].ptr, *cv = a->b[2].ptr, *c_in = a->b[2].snap;
    double *A = dense_a(g, l, a->b[0].ptr);
    const double u_c = tu_unit_roundoff(d->c_dtype), u32 = tu_unit_roundoff(SK_DTYPE_F32);
    for (int64_t i = 0; i < d->m; ++i)
        for (int64_t j = 0; j < d->n; ++j) {
            double sum = 0.0, mag = 0.0;
            for (int64_t x = 0; x < d->k; ++x) {
                if (A[i * d->k + x] == 0.0) continue;
                const int64_t at =
                    d->b_order == SK_ORDER_COL_MAJOR ? j * g->ldb + x : x * g->ldb + j;
                const double p = A[i * d->k + x] * (double)tu_load(b, d->ab_dtype, at);
                sum += p;
                mag += fabs(p);
            }
            double ref = (double)d->alpha * sum;
            mag *= fabs((double)d->alpha);
            if (d->beta != 0.0f) {
                const double cij = (double)tu_load(c_in, d->c_dtype, i * g->ldc + j);
                ref += (double)d->beta * cij;
                mag += fabs((double)d->beta * cij);
            }
            if (mag > 0x1.0p100) continue; /* beyond the fp32 range: not specified */
            const double got = (double)tu_load(cv, d->c_dtype, i * g->ldc + j);
            const double tol = 2.0 * (u_c * fabs(ref) + u32 * sqrt((double)d->k) * mag) + 0x1.0p-24;
            /* Beyond C's dtype the result rounds to +-inf; near its edge, either. */
            const double top = max_finite(d->c_dtype);
            if (fabs(ref) + tol >= top) {
                if (fabs(ref) - tol > top && got != (ref > 0 ? INFINITY : -INFINITY)) {
                    free(A);
                    fz_fail("BSR GEMM: C[%lld, %lld] = %.9g, reference %.9g overflows dtype %d",
                            (long long)i, (long long)j, got, ref, (int)d->c_dtype);
                }
                continue;
            }
            if (!(isfinite(got) && fabs(got - ref) <= tol)) {
                free(A);
                fz_fail("BSR GEMM: C[%lld, %lld] = %.9g, reference %.9g (tolerance %.3g)",
                        (long long)i, (long long)j, got, ref, tol);
            }
        }
    free(A);
}

/* Values: A's block elements inside m x k (NaN past them: never read), B's
 * elements (NaN between rows), C's elements when beta != 0 (else NaN: not
 * read); C's elements are the bytes a success may change. */
static void fill(const gemm *g, const api_layout *l, fz_arena *a, tu_rng *rng, double mag) {
    const sk_bsr_gemm_desc *d = &g->d;
    uint8_t *av = fz_arena_fillable(a, 0) ? a->b[0].ptr : NULL;
    uint8_t *b = fz_arena_fillable(a, 1) ? a->b[1].ptr : NULL;
    uint8_t *cv = fz_arena_fillable(a, 2) ? a->b[2].ptr : NULL;
    const int64_t bm = l->bsr.grid.block_rows, bk = l->bsr.grid.block_cols;
    sk_bsr host = l->bsr;
    host.row_offsets = l->off;
    host.col_indices = l->idx;
    fz_layout_ref r0;
    fz_layout_ref_eval(&host, &r0);
    if (av != NULL && !r0.ok) /* the call must fail: any values */
        for (int64_t x = 0; x < g->a_elems; ++x) tu_store(av, d->ab_dtype, x, 1.0f);
    if (av != NULL && r0.ok)
        for (int64_t gi = 0; gi + 1 < l->n_off; ++gi)
            for (int32_t e = l->off[gi]; e < l->off[gi + 1]; ++e) {
                for (int64_t r = 0; r < bm; ++r)
                    for (int64_t x = 0; x < bk; ++x) {
                        const int inside = gi * bm + r < d->m && (int64_t)l->idx[e] * bk + x < d->k;
                        tu_store(av, d->ab_dtype, ((int64_t)e * bm + r) * bk + x,
                                 inside ? (float)(tu_rng_normal(rng) * mag) : NAN);
                    }
            }
    if (b != NULL)
        for (int64_t o = 0; o < g->b_outer; ++o)
            for (int64_t x = 0; x < g->b_inner; ++x)
                tu_store(b, d->ab_dtype, o * g->ldb + x, (float)tu_rng_normal(rng));
    uint8_t *wm = fz_arena_wmask(a, 2);
    const int64_t cs = (int64_t)fz_dtype_size(d->c_dtype);
    for (int64_t i = 0; i < d->m; ++i) {
        memset(wm + i * g->ldc * cs, 1, (size_t)(d->n * cs));
        if (cv != NULL && d->beta != 0.0f)
            for (int64_t j = 0; j < d->n; ++j)
                tu_store(cv, d->c_dtype, i * g->ldc + j, (float)tu_rng_normal(rng));
    }
}

void fuzz_api_gemm(const api_case *c) {
    static const char *const names[4] = {"sk_bsr_gemm_workspace_size", "sk_bsr_gemm_plan",
                                         "sk_bsr_gemm_run", "sk_bsr_gemm"};
    const int op = c->op - API_GEMM_WORKSPACE;
    const char *api = names[op];
    const int operands = op >= 2;
    gemm g;
    memset(&g, 0, sizeof g);
    make_desc(c, &g.d);
    api_layout l;
    if (!api_layout_build(c, op != 0, &l)) return;
    fz_expect e;
    fz_expect_clear(&e);
    expect_gemm(c, &l, &g, &e);
    const double work = g.spans_ok ? (double)l.g.row_blocks * c->grid.block_rows *
                                         (double)l.g.col_blocks * c->grid.block_cols * (double)g.d.n
                                   : 0.0;
    fz_arena a;
    fz_arena_init(&a);
    if (operands) {
        const size_t ab = fz_dtype_size(g.d.ab_dtype), cs = fz_dtype_size(g.d.c_dtype);
        const int usable = g.spans_ok && l.g.ok;
        fz_arena_add(&a, "a_values", usable ? g.a_elems * (int64_t)ab : 64, ab ? ab : 4, FZ_READ);
        fz_arena_add(&a, "b", g.spans_ok ? g.b_elems * (int64_t)ab : 64, ab ? ab : 4, FZ_READ);
        fz_arena_add(&a, "c", g.spans_ok ? g.c_elems * (int64_t)cs : 64, cs ? cs : 4, FZ_WRITE);
    }
    api_layout_add(&l, &a);
    api_workspace_add(c, &a);
    if (!api_place(&a, c, !e.must_fail && operands && work > API_WORK_CAP, &l)) return;
    tu_rng rng;
    tu_rng_seed(&rng, c->seed);
    if (operands) {
        if (g.spans_ok && l.g.ok) fill(&g, &l, &a, &rng, api_magnitude(c));
        if (a.b[0].ptr == NULL && l.bsr.nnz > 0) fz_expect_fail(&e, "a_values is NULL");
        if (a.b[1].ptr == NULL || a.b[2].ptr == NULL) fz_expect_fail(&e, "b or c is NULL");
        api_expect_apart(&e, &a);
    }
    api_layout_fill(&l, &a);
    if (op != 0 && l.g.ok) {
        fz_layout_ref r;
        api_layout_eval(&l, &r);
        if (!r.ok) fz_expect_fail(&e, "the A layout fails the full check");
    }
    fz_arena_snapshot(&a);

    const sk_bsr_gemm_desc *dp = c->fault == API_FAULT_NULL_DESC ? NULL : &g.d;
    const sk_bsr *lp = c->fault == API_FAULT_NULL_LAYOUT ? NULL : &l.bsr;
    void *ws = a.b[a.n - 1].ptr;
    const size_t ws_bytes = (size_t)a.b[a.n - 1].bytes;
    size_t ws_size = API_UNTOUCHED_SIZE;
    sk_status st;
    if (op == 0)
        st = sk_bsr_gemm_workspace_size(dp, lp, &ws_size);
    else if (op == 1)
        st = sk_bsr_gemm_plan(dp, lp, ws, ws_bytes, NULL);
    else if (op == 2)
        st = sk_bsr_gemm_run(dp, lp, a.b[0].ptr, a.b[1].ptr, a.b[2].ptr, ws, ws_bytes, NULL);
    else
        st = sk_bsr_gemm(dp, lp, a.b[0].ptr, a.b[1].ptr, a.b[2].ptr, ws, ws_bytes, NULL);
    const int ok = api_outcome(&a, st, api, &e);
    if (op == 0)
        FZ_REQUIRE(ws_size == (ok ? 0 : API_UNTOUCHED_SIZE),
                   "%s: *workspace_bytes = %zu after %s (the CPU needs 0)", api, ws_size,
                   ok ? "success" : "a failure");
    if (ok && operands && work <= API_WORK_CAP && !api_inputs_overlap(&a)) check_result(&g, &l, &a);
    fz_arena_free(&a);
    api_layout_free(&l);
}
