/*
 * bsr_gemm.c - the public BSR GEMM entry points: descriptor defaults, every
 * argument check, dispatch. C = alpha * A_bsr * B + beta * C.
 * As for attention, every check runs before a backend is called.
 */
#include <math.h>
#include <stdbool.h>
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

/* Byte span of `outer` rows of `inner` elements, `ld` apart:
 * ((outer - 1) x ld + inner) x elem_size; false when it overflows int64. */
static bool matrix_bytes(int64_t outer, int64_t ld, int64_t inner, size_t elem_size,
                         int64_t *bytes) {
    int64_t elems;
    return sk_mul_i64(outer - 1, ld, &elems) && sk_add_i64(elems, inner, &elems) &&
           sk_mul_i64(elems, (int64_t)elem_size, bytes);
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
    if (d->ab_dtype == SK_DTYPE_E4M3 || d->c_dtype == SK_DTYPE_E4M3)
        return sk_error(SK_STATUS_BAD_PARAM_DTYPE,
                        "desc->%s = E4M3: the BSR GEMM takes F16 or BF16 (F32 on the CPU)",
                        d->ab_dtype == SK_DTYPE_E4M3 ? "ab_dtype" : "c_dtype");
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
    int64_t bytes;
    if (!matrix_bytes(b_outer, p->ldb, b_inner, sk_dtype_size(d->ab_dtype), &bytes))
        return sk_error(SK_STATUS_BAD_PARAM_OVERFLOW,
                        "b: %lld rows of desc->ldb = %lld elements overflow int64 bytes",
                        (long long)b_outer, (long long)p->ldb);
    if (!matrix_bytes(d->m, p->ldc, d->n, sk_dtype_size(d->c_dtype), &bytes))
        return sk_error(SK_STATUS_BAD_PARAM_OVERFLOW,
                        "c: m = %lld rows of desc->ldc = %lld elements overflow int64 bytes",
                        (long long)d->m, (long long)p->ldc);

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
    /* int32 arrays on every backend (the CUDA kernels load them as such). */
    SK_TRY(sk_check_alignment(a->row_offsets, NULL, 4, 4, 0, "a_layout->row_offsets"));
    if (a->col_indices != NULL)
        SK_TRY(sk_check_alignment(a->col_indices, NULL, 4, 4, 0, "a_layout->col_indices"));
    p->block_m = a->grid.block_rows;
    p->block_k = a->grid.block_cols;
    p->row_blocks = row_blocks;
    p->col_blocks = col_blocks;
    p->nnz = a->nnz;
    p->row_offsets = a->row_offsets;
    p->col_indices = a->col_indices;
    return SK_STATUS_SUCCESS;
}

/* A's layout arrays as read buffers: row_blocks + 1 offsets, nnz indices. */
static void layout_buffers(const sk_bsr_gemm_problem *p, sk_buffer out[2]) {
    sk_layout_array_buffers(out, "a_layout->row_offsets", "a_layout->col_indices", p->row_offsets,
                            p->row_blocks, p->col_indices, p->nnz, 0);
}

/* The CUDA workspace (written by plan and run) against `buffers`. */
static sk_status check_workspace_apart(const sk_bsr_gemm_problem *p, const void *workspace,
                                       size_t workspace_size, const sk_buffer *buffers, int count) {
    if (p->backend == SK_BACKEND_CPU || workspace == NULL) return SK_STATUS_SUCCESS;
    size_t bytes;
    SK_TRY(sk_cuda_bsr_gemm_workspace_size(p, &bytes));
    return sk_check_workspace_apart(workspace, workspace_size, bytes, buffers, count);
}

static sk_status check_operands(sk_bsr_gemm_problem *p, const void *a_values, const void *b,
                                void *c, const void *workspace, size_t workspace_size) {
    if (p->nnz > 0) SK_CHECK_NOT_NULL(a_values);
    SK_CHECK_NOT_NULL(b);
    SK_CHECK_NOT_NULL(c);
    const size_t ab = sk_dtype_size(p->ab_dtype), cs = sk_dtype_size(p->c_dtype);
    const int64_t b_outer = p->b_order == SK_ORDER_ROW_MAJOR ? p->k : p->n;
    const int64_t b_inner = p->b_order == SK_ORDER_ROW_MAJOR ? p->n : p->k;

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

    /* The aliasing rule: C (and the workspace) against every other buffer.
     * The spans fit: build_problem checked B and C, and A's blocks are at
     * most 2^31 x 128 x 128 x 4 bytes. */
    int64_t b_bytes = 0, c_bytes = 0;
    (void)matrix_bytes(b_outer, p->ldb, b_inner, ab, &b_bytes);
    (void)matrix_bytes(p->m, p->ldc, p->n, cs, &c_bytes);
    const int64_t a_bytes = (int64_t)p->nnz * p->block_m * p->block_k * (int64_t)ab;
    sk_buffer buffers[5] = {{"c", c, c_bytes, 1},
                            {"a_values", a_values, p->nnz > 0 ? a_bytes : 0, 0},
                            {"b", b, b_bytes, 0}};
    layout_buffers(p, buffers + 3);
    SK_TRY(sk_check_no_alias(buffers, 5));
    SK_TRY(check_workspace_apart(p, workspace, workspace_size, buffers, 5));
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
    sk_buffer arrays[2]; /* the plan writes the workspace, reads the layout */
    layout_buffers(&p, arrays);
    SK_TRY(check_workspace_apart(&p, workspace, workspace_size, arrays, 2));
    return plan_checked(&p, a_layout, workspace, workspace_size, stream);
}

sk_status sk_bsr_gemm_run(const sk_bsr_gemm_desc *desc, const sk_bsr *a_layout,
                          const void *a_values, const void *b, void *c, void *workspace,
                          size_t workspace_size, struct CUstream_st *stream) {
    SK_ENTER("sk_bsr_gemm_run");
    sk_bsr_gemm_problem p;
    SK_TRY(build_problem(desc, a_layout, &p));
    SK_TRY(check_operands(&p, a_values, b, c, workspace, workspace_size));
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
    SK_TRY(check_operands(&p, a_values, b, c, workspace, workspace_size));
    SK_TRY(plan_checked(&p, a_layout, workspace, workspace_size, stream));
    if (p.backend == SK_BACKEND_CPU) return sk_cpu_bsr_gemm_run(&p);
    return sk_cuda_bsr_gemm_run(&p, workspace, workspace_size, stream);
}
