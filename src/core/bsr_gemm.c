/*
 * bsr_gemm.c - the public BSR GEMM entry points: descriptor defaults, every
 * argument check, dispatch. C = alpha * A_bsr * B + beta * C.
 * As for attention, every check runs before a backend is called.
 */
#include <math.h>
#include <string.h>

#include "core/check.h"
#include "core/internal.h"
#include "core/layout.h"
#include "core/problem.h"
#include "cpu/cpu_backend.h"
#include "cuda/backend.h"

sk_status sk_bsr_gemm_desc_init(sk_bsr_gemm_desc *desc, size_t struct_size) {
    SK_ENTER("sk_bsr_gemm_desc_init");
    SK_CHECK_NOT_NULL(desc);
    SK_TRY(sk_check_init_struct_size(struct_size, sizeof(sk_bsr_gemm_desc), "sk_bsr_gemm_desc"));
    memset(desc, 0, sizeof *desc);
    desc->struct_size = sizeof *desc;
    desc->backend = SK_BACKEND_CUDA;
    desc->ab_dtype = SK_DTYPE_F16;
    desc->c_dtype = SK_DTYPE_F32;
    desc->b_order = SK_ORDER_ROW_MAJOR;
    desc->alpha = 1.0f;
    desc->beta = 0.0f;
    return SK_STATUS_SUCCESS;
}

static sk_status build_problem(const sk_bsr_gemm_desc *d, const sk_bsr *a,
                               sk_bsr_gemm_problem *p) {
    if (d == NULL) return sk_error(SK_STATUS_BAD_PARAM_NULL_POINTER, "desc must not be NULL");
    SK_TRY(sk_check_desc_struct_size(d->struct_size, sizeof(sk_bsr_gemm_desc), "desc", "sk_bsr_gemm_desc_init"));
    SK_TRY(sk_check_backend(d->backend, "desc->backend"));
    if (sk_dtype_size(d->ab_dtype) == 0)
        return sk_error(SK_STATUS_BAD_PARAM_DTYPE, "desc->ab_dtype = %d is not an sk_dtype",
                        (int)d->ab_dtype);
    if (sk_dtype_size(d->c_dtype) == 0)
        return sk_error(SK_STATUS_BAD_PARAM_DTYPE, "desc->c_dtype = %d is not an sk_dtype",
                        (int)d->c_dtype);
    if (d->ab_dtype == SK_DTYPE_F32 && d->backend != SK_BACKEND_CPU)
        return sk_error(SK_STATUS_BAD_PARAM_DTYPE,
                        "desc->ab_dtype = F32 is for the CPU backend only; the %s backend takes "
                        "F16 or BF16",
                        sk_backend_name(d->backend));
    if (d->m < 1 || d->n < 1 || d->k < 1)
        return sk_error(SK_STATUS_BAD_PARAM_SHAPE, "desc m = %lld, n = %lld, k = %lld must be >= 1",
                        (long long)d->m, (long long)d->n, (long long)d->k);
    if (d->b_order != SK_ORDER_ROW_MAJOR && d->b_order != SK_ORDER_COL_MAJOR)
        return sk_error(SK_STATUS_BAD_PARAM_VALUE,
                        "desc->b_order = %d is not an sk_order (ROW_MAJOR=1, COL_MAJOR=2)",
                        (int)d->b_order);
    if (!isfinite(d->alpha) || !isfinite(d->beta))
        return sk_error(SK_STATUS_BAD_PARAM_VALUE, "desc alpha = %g and beta = %g must be finite",
                        (double)d->alpha, (double)d->beta);

    memset(p, 0, sizeof *p);
    p->backend = d->backend;
    p->ab_dtype = d->ab_dtype;
    p->c_dtype = d->c_dtype;
    p->m = d->m;
    p->n = d->n;
    p->k = d->k;
    p->b_order = d->b_order;
    p->alpha = d->alpha;
    p->beta = d->beta;
    const int64_t b_inner = d->b_order == SK_ORDER_ROW_MAJOR ? d->n : d->k;
    const int64_t b_outer = d->b_order == SK_ORDER_ROW_MAJOR ? d->k : d->n;
    p->ldb = d->ldb != 0 ? d->ldb : b_inner;
    p->ldc = d->ldc != 0 ? d->ldc : d->n;
    if (p->ldb < b_inner)
        return sk_error(SK_STATUS_BAD_PARAM_STRIDE, "desc->ldb = %lld must be 0 or >= %lld",
                        (long long)d->ldb, (long long)b_inner);
    if (p->ldc < d->n)
        return sk_error(SK_STATUS_BAD_PARAM_STRIDE, "desc->ldc = %lld must be 0 or >= n = %lld",
                        (long long)d->ldc, (long long)d->n);
    int64_t span;
    if (!sk_mul_i64(b_outer, p->ldb, &span) || span > INT64_MAX / 4 ||
        !sk_mul_i64(d->m, p->ldc, &span) || span > INT64_MAX / 4)
        return sk_error(SK_STATUS_BAD_PARAM_OVERFLOW, "the sizes of B or C overflow int64 bytes");

    if (a == NULL)
        return sk_error(SK_STATUS_BAD_PARAM_NULL_POINTER, "a_layout must not be NULL");
    int32_t row_blocks, col_blocks;
    SK_TRY(sk_grid_check(&a->grid, &row_blocks, &col_blocks, NULL));
    if (a->grid.rows != d->m || a->grid.cols != d->k)
        return sk_error(SK_STATUS_BAD_LAYOUT_MISMATCH,
                        "a_layout grid is %lld x %lld, but A is m x k = %lld x %lld",
                        (long long)a->grid.rows, (long long)a->grid.cols, (long long)d->m,
                        (long long)d->k);
    if (a->grid.batch != 1 || a->grid.heads != 1)
        return sk_error(SK_STATUS_BAD_LAYOUT_MISMATCH,
                        "a_layout grid batch = %d and heads = %d must both be 1",
                        (int)a->grid.batch, (int)a->grid.heads);
    if (a->nnz < 0)
        return sk_error(SK_STATUS_BAD_LAYOUT_COUNT, "a_layout nnz = %d is negative", (int)a->nnz);
    if (a->row_offsets == NULL)
        return sk_error(SK_STATUS_BAD_PARAM_NULL_POINTER, "a_layout->row_offsets must not be NULL");
    if (a->col_indices == NULL && a->nnz > 0)
        return sk_error(SK_STATUS_BAD_PARAM_NULL_POINTER,
                        "a_layout->col_indices must not be NULL when nnz = %d > 0", (int)a->nnz);
    p->block_m = a->grid.block_rows;
    p->block_k = a->grid.block_cols;
    p->row_blocks = row_blocks;
    p->col_blocks = col_blocks;
    p->nnz = a->nnz;
    p->row_offsets = a->row_offsets;
    p->col_indices = a->col_indices;
    return SK_STATUS_SUCCESS;
}

static sk_status check_operands(sk_bsr_gemm_problem *p, const void *a_values, const void *b,
                                void *c) {
    if (p->nnz > 0) SK_CHECK_NOT_NULL(a_values);
    SK_CHECK_NOT_NULL(b);
    SK_CHECK_NOT_NULL(c);
    const size_t ab = sk_dtype_size(p->ab_dtype), cs = sk_dtype_size(p->c_dtype);
    const int64_t b_outer = p->b_order == SK_ORDER_ROW_MAJOR ? p->k : p->n;
    const int64_t b_inner = p->b_order == SK_ORDER_ROW_MAJOR ? p->n : p->k;
    const int64_t b_bytes = ((b_outer - 1) * p->ldb + b_inner) * (int64_t)ab;
    const int64_t c_bytes = ((p->m - 1) * p->ldc + p->n) * (int64_t)cs;
    const int64_t a_bytes = (int64_t)p->nnz * p->block_m * p->block_k * (int64_t)ab;
    SK_TRY(sk_check_disjoint(c, c_bytes, "c", b, b_bytes, "b"));
    if (p->nnz > 0) SK_TRY(sk_check_disjoint(c, c_bytes, "c", a_values, a_bytes, "a_values"));

    /* CUDA moves 16-byte vectors along rows: 16-byte pointers and leading
     * dimensions. */
    const int cuda = sk_backend_is_cuda(p->backend);
    if (p->nnz > 0) SK_TRY(sk_check_alignment(a_values, NULL, ab, cuda ? 16 : ab, 0, "a_values"));
    SK_TRY(sk_check_alignment(b, NULL, ab, cuda ? 16 : ab, 0, "b"));
    SK_TRY(sk_check_alignment(c, NULL, cs, cuda ? 16 : cs, 0, "c"));
    if (cuda && ((p->ldb * (int64_t)ab) % 16 != 0 || (p->ldc * (int64_t)cs) % 16 != 0))
        return sk_error(SK_STATUS_BAD_PARAM_ALIGNMENT,
                        "ldb = %lld and ldc = %lld must be multiples of 16 bytes for the CUDA "
                        "backend",
                        (long long)p->ldb, (long long)p->ldc);
    p->a_values = a_values;
    p->b = b;
    p->c = c;
    return SK_STATUS_SUCCESS;
}

sk_status sk_bsr_gemm_workspace_size(const sk_bsr_gemm_desc *desc, const sk_bsr *a_layout,
                                     size_t *workspace_bytes) {
    SK_ENTER("sk_bsr_gemm_workspace_size");
    SK_CHECK_NOT_NULL(workspace_bytes);
    sk_bsr_gemm_problem p;
    SK_TRY(build_problem(desc, a_layout, &p));
    if (p.backend == SK_BACKEND_CPU) {
        *workspace_bytes = 0;
        return SK_STATUS_SUCCESS;
    }
    return sk_cuda_bsr_gemm_workspace_size(&p, workspace_bytes);
}

static sk_status plan_checked(const sk_bsr_gemm_problem *p, const sk_bsr *a, void *workspace,
                              size_t workspace_size, struct CUstream_st *stream) {
    if (p->backend == SK_BACKEND_CPU) return sk_layout_check(a);
    return sk_cuda_bsr_gemm_plan(p, workspace, workspace_size, stream);
}

sk_status sk_bsr_gemm_plan(const sk_bsr_gemm_desc *desc, const sk_bsr *a_layout, void *workspace,
                           size_t workspace_size, struct CUstream_st *stream) {
    SK_ENTER("sk_bsr_gemm_plan");
    sk_bsr_gemm_problem p;
    SK_TRY(build_problem(desc, a_layout, &p));
    return plan_checked(&p, a_layout, workspace, workspace_size, stream);
}

sk_status sk_bsr_gemm_run(const sk_bsr_gemm_desc *desc, const sk_bsr *a_layout,
                          const void *a_values, const void *b, void *c, void *workspace,
                          size_t workspace_size, struct CUstream_st *stream) {
    SK_ENTER("sk_bsr_gemm_run");
    sk_bsr_gemm_problem p;
    SK_TRY(build_problem(desc, a_layout, &p));
    SK_TRY(check_operands(&p, a_values, b, c));
    if (p.backend == SK_BACKEND_CPU) {
        SK_TRY(sk_layout_check(a_layout));
        return sk_cpu_bsr_gemm_run(&p);
    }
    return sk_cuda_bsr_gemm_run(&p, workspace, workspace_size, stream);
}

sk_status sk_bsr_gemm(const sk_bsr_gemm_desc *desc, const sk_bsr *a_layout, const void *a_values,
                      const void *b, void *c, void *workspace, size_t workspace_size,
                      struct CUstream_st *stream) {
    SK_ENTER("sk_bsr_gemm");
    sk_bsr_gemm_problem p;
    SK_TRY(build_problem(desc, a_layout, &p));
    SK_TRY(check_operands(&p, a_values, b, c));
    SK_TRY(plan_checked(&p, a_layout, workspace, workspace_size, stream));
    if (p.backend == SK_BACKEND_CPU) return sk_cpu_bsr_gemm_run(&p);
    return sk_cuda_bsr_gemm_run(&p, workspace, workspace_size, stream);
}
