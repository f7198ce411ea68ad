/*
 * attention.c - the public attention entry points: descriptor defaults, every
 * argument check, and dispatch to the CPU or CUDA backend.
 *
 * All checks run before any backend is called, so a failed call writes
 * nothing. The order is: descriptor, shapes, layout geometry, pointers,
 * strides and extents, overlap, alignment, layout content (CPU only: device
 * arrays cannot be read from here), then the backend's own checks (device,
 * supported combination, workspace).
 */
#include <math.h>
#include <string.h>

#include "core/check.h"
#include "core/internal.h"
#include "core/layout.h"
#include "core/attention_internal.h"
#include "core/problem.h"
#include "cpu/cpu_backend.h"
#include "cuda/backend.h"

sk_status sk_attention_desc_init(sk_attention_desc *desc, size_t struct_size) {
    SK_ENTER("sk_attention_desc_init");
    SK_CHECK_NOT_NULL(desc);
    SK_TRY(sk_check_init_struct_size(struct_size, sizeof(sk_attention_desc), "sk_attention_desc"));
    memset(desc, 0, sizeof *desc);
    desc->struct_size = sizeof *desc;
    desc->backend = SK_BACKEND_CUDA;
    desc->dtype = SK_DTYPE_F16;
    desc->scale = 0.0f;
    desc->mask = SK_MASK_NONE;
    return SK_STATUS_SUCCESS;
}

static sk_status check_desc(const sk_attention_desc *d) {
    if (d == NULL) return sk_error(SK_STATUS_BAD_PARAM_NULL_POINTER, "desc must not be NULL");
    SK_TRY(sk_check_desc_struct_size(d->struct_size, sizeof(sk_attention_desc), "desc", "sk_attention_desc_init"));
    const int64_t sizes[6] = {d->batch,   d->seq_q,    d->seq_k,
                              d->heads_q, d->heads_kv, d->head_dim};
    SK_TRY(sk_check_attention_shape(d->backend, d->dtype, sizes));
    if (!isfinite(d->scale))
        return sk_error(SK_STATUS_BAD_PARAM_VALUE, "desc->scale = %g must be finite",
                        (double)d->scale);
    if (d->mask != SK_MASK_NONE && d->mask != SK_MASK_CAUSAL)
        return sk_error(SK_STATUS_BAD_PARAM_VALUE,
                        "desc->mask = %d is not an sk_mask (NONE=0, CAUSAL=1)", (int)d->mask);
    return SK_STATUS_SUCCESS;
}

/* Layout geometry against the descriptor; fills the layout part of *p. */
static sk_status check_layout_geometry(const sk_attention_desc *d, const sk_bsr *layout,
                                       sk_attention_problem *p) {
    SK_CHECK_NOT_NULL(layout);
    int32_t row_blocks, col_blocks, slices;
    SK_TRY(sk_grid_check(&layout->grid, &row_blocks, &col_blocks, &slices));
    const sk_grid *g = &layout->grid;
    if (g->rows != d->seq_q || g->cols != d->seq_k)
        return sk_error(SK_STATUS_BAD_LAYOUT_MISMATCH,
                        "layout grid is %lld x %lld tokens, but seq_q = %lld and seq_k = %lld",
                        (long long)g->rows, (long long)g->cols, (long long)d->seq_q,
                        (long long)d->seq_k);
    if (g->batch != 1 && g->batch != d->batch)
        return sk_error(SK_STATUS_BAD_LAYOUT_MISMATCH,
                        "layout grid batch = %d must be 1 (broadcast) or batch = %lld",
                        (int)g->batch, (long long)d->batch);
    if (g->heads != 1 && g->heads != d->heads_kv && g->heads != d->heads_q)
        return sk_error(SK_STATUS_BAD_LAYOUT_MISMATCH,
                        "layout grid heads = %d must be 1, heads_kv = %lld or heads_q = %lld",
                        (int)g->heads, (long long)d->heads_kv, (long long)d->heads_q);
    if (layout->nnz < 0)
        return sk_error(SK_STATUS_BAD_LAYOUT_COUNT, "layout nnz = %d is negative", (int)layout->nnz);
    if (layout->row_offsets == NULL)
        return sk_error(SK_STATUS_BAD_PARAM_NULL_POINTER, "layout->row_offsets must not be NULL");
    if (layout->col_indices == NULL && layout->nnz > 0)
        return sk_error(SK_STATUS_BAD_PARAM_NULL_POINTER,
                        "layout->col_indices must not be NULL when nnz = %d > 0", (int)layout->nnz);
    p->block_q = g->block_rows;
    p->block_k = g->block_cols;
    p->row_blocks = row_blocks;
    p->col_blocks = col_blocks;
    p->layout_batch = g->batch;
    p->layout_heads = g->heads;
    /* Query head h reads head slice h / head_div. */
    if (g->heads == 1)
        p->head_div = (int32_t)d->heads_q;
    else if (g->heads == d->heads_q)
        p->head_div = 1;
    else
        p->head_div = (int32_t)(d->heads_q / d->heads_kv);
    p->nnz = layout->nnz;
    p->row_offsets = layout->row_offsets;
    p->col_indices = layout->col_indices;
    return SK_STATUS_SUCCESS;
}

/* Everything that needs no tensor pointer: descriptor, shapes, strides,
 * layout geometry. Fills *p except the tensor pointers. */
sk_status sk_attention_check_geometry(const sk_attention_desc *d, const sk_bsr *layout,
                                     sk_attention_problem *p) {
    SK_TRY(check_desc(d));
    memset(p, 0, sizeof *p);
    p->backend = d->backend;
    p->dtype = d->dtype;
    p->batch = d->batch;
    p->seq_q = d->seq_q;
    p->seq_k = d->seq_k;
    p->heads_q = d->heads_q;
    p->heads_kv = d->heads_kv;
    p->head_dim = d->head_dim;
    p->group = (int32_t)(d->heads_q / d->heads_kv);
    p->scale = d->scale != 0.0f ? d->scale : (float)(1.0 / sqrt((double)d->head_dim));
    p->causal = d->mask == SK_MASK_CAUSAL;
    SK_TRY(check_layout_geometry(d, layout, p));

    /* Packed strides are products of the sizes: check those first. */
    int64_t q_elems, kv_elems, t;
    if (!sk_mul_i64(d->batch, d->seq_q, &t) || !sk_mul_i64(t, d->heads_q, &t) ||
        !sk_mul_i64(t, d->head_dim, &q_elems) || !sk_mul_i64(d->batch, d->seq_k, &t) ||
        !sk_mul_i64(t, d->heads_kv, &t) || !sk_mul_i64(t, d->head_dim, &kv_elems) ||
        q_elems > INT64_MAX / 4 || kv_elems > INT64_MAX / 4)
        return sk_error(SK_STATUS_BAD_PARAM_OVERFLOW,
                        "the tensor sizes B x S x H x D overflow int64 bytes");
    sk_resolve_strides(d->q_strides, d->seq_q, d->heads_q, d->head_dim, p->q_stride);
    sk_resolve_strides(d->k_strides, d->seq_k, d->heads_kv, d->head_dim, p->k_stride);
    sk_resolve_strides(d->v_strides, d->seq_k, d->heads_kv, d->head_dim, p->v_stride);
    sk_resolve_strides(d->o_strides, d->seq_q, d->heads_q, d->head_dim, p->o_stride);
    return SK_STATUS_SUCCESS;
}

/* Pointer, extent, overlap and alignment checks of the run call. */
sk_status sk_attention_check_tensors(sk_attention_problem *p, const void *q, const void *k,
                                    const void *v, void *o, float *lse) {
    SK_CHECK_NOT_NULL(q);
    SK_CHECK_NOT_NULL(k);
    SK_CHECK_NOT_NULL(v);
    SK_CHECK_NOT_NULL(o);
    const size_t es = sk_dtype_size(p->dtype);
    sk_tensor_shape tq, tk, tv, to;
    sk_tensor_shape_init(&tq, p->batch, p->seq_q, p->heads_q, p->head_dim, p->q_stride);
    sk_tensor_shape_init(&tk, p->batch, p->seq_k, p->heads_kv, p->head_dim, p->k_stride);
    sk_tensor_shape_init(&tv, p->batch, p->seq_k, p->heads_kv, p->head_dim, p->v_stride);
    sk_tensor_shape_init(&to, p->batch, p->seq_q, p->heads_q, p->head_dim, p->o_stride);
    int64_t span_q, span_k, span_v, span_o;
    SK_TRY(sk_check_tensor_extent(&tq, "q", &span_q));
    SK_TRY(sk_check_tensor_extent(&tk, "k", &span_k));
    SK_TRY(sk_check_tensor_extent(&tv, "v", &span_v));
    SK_TRY(sk_check_tensor_extent(&to, "o", &span_o));
    if (span_q > INT64_MAX / 4 || span_k > INT64_MAX / 4 || span_v > INT64_MAX / 4 ||
        span_o > INT64_MAX / 4)
        return sk_error(SK_STATUS_BAD_PARAM_OVERFLOW, "a tensor's byte span overflows int64");
    SK_TRY(sk_check_no_self_overlap(&to, "o"));

    const int64_t o_bytes = span_o * (int64_t)es;
    SK_TRY(sk_check_disjoint(o, o_bytes, "o", q, span_q * (int64_t)es, "q"));
    SK_TRY(sk_check_disjoint(o, o_bytes, "o", k, span_k * (int64_t)es, "k"));
    SK_TRY(sk_check_disjoint(o, o_bytes, "o", v, span_v * (int64_t)es, "v"));
    if (lse != NULL) {
        /* [B, Hq, Sq] fp32: the element count fits, as B*Sq*Hq*D did. */
        const int64_t lse_bytes = p->batch * p->heads_q * p->seq_q * 4;
        SK_TRY(sk_check_disjoint(lse, lse_bytes, "lse", o, o_bytes, "o"));
        SK_TRY(sk_check_disjoint(lse, lse_bytes, "lse", q, span_q * (int64_t)es, "q"));
        SK_TRY(sk_check_alignment(lse, NULL, 4, 4, 0, "lse"));
    }

    /* The CUDA kernels move 16-byte vectors of one row; the CPU needs
     * element alignment only. */
    const int cuda = sk_backend_is_cuda(p->backend);
    const size_t align = cuda ? 16 : es, stride_align = cuda ? 16 : 0;
    if (cuda && (p->head_dim * (int64_t)es) % 16 != 0)
        return sk_error(SK_STATUS_BAD_PARAM_ALIGNMENT,
                        "head_dim = %lld rows are not a multiple of 16 bytes, as the CUDA backend "
                        "needs",
                        (long long)p->head_dim);
    SK_TRY(sk_check_alignment(q, &tq, es, align, stride_align, "q"));
    SK_TRY(sk_check_alignment(k, &tk, es, align, stride_align, "k"));
    SK_TRY(sk_check_alignment(v, &tv, es, align, stride_align, "v"));
    SK_TRY(sk_check_alignment(o, &to, es, align, stride_align, "o"));

    p->q = q;
    p->k = k;
    p->v = v;
    p->o = o;
    p->lse = lse;
    return SK_STATUS_SUCCESS;
}

/* Host layouts are checked in full; device ones cannot be read here. */
sk_status sk_attention_check_layout_content(const sk_attention_problem *p,
                                           const sk_bsr *layout) {
    if (p->backend == SK_BACKEND_CPU) return sk_layout_check(layout);
    return SK_STATUS_SUCCESS;
}

sk_status sk_attention_problem_workspace_size(const sk_attention_problem *p,
                                               size_t *workspace_bytes) {
    if (p->backend == SK_BACKEND_CPU) {
        *workspace_bytes = 0;
        return SK_STATUS_SUCCESS;
    }
    return sk_cuda_attention_workspace_size(p, workspace_bytes);
}

sk_status sk_attention_workspace_size(const sk_attention_desc *desc, const sk_bsr *layout,
                                      size_t *workspace_bytes) {
    SK_ENTER("sk_attention_workspace_size");
    SK_CHECK_NOT_NULL(workspace_bytes);
    sk_attention_problem p;
    SK_TRY(sk_attention_check_geometry(desc, layout, &p));
    return sk_attention_problem_workspace_size(&p, workspace_bytes);
}

static sk_status plan_checked(const sk_attention_problem *p, void *workspace,
                              size_t workspace_size, struct CUstream_st *stream) {
    if (p->backend == SK_BACKEND_CPU) return SK_STATUS_SUCCESS;
    return sk_cuda_attention_plan(p, workspace, workspace_size, stream);
}

sk_status sk_attention_plan(const sk_attention_desc *desc, const sk_bsr *layout, void *workspace,
                            size_t workspace_size, struct CUstream_st *stream) {
    SK_ENTER("sk_attention_plan");
    sk_attention_problem p;
    SK_TRY(sk_attention_check_geometry(desc, layout, &p));
    SK_TRY(sk_attention_check_layout_content(&p, layout));
    return plan_checked(&p, workspace, workspace_size, stream);
}

static sk_status run_checked(const sk_attention_problem *p, void *workspace,
                             size_t workspace_size, struct CUstream_st *stream) {
    if (p->backend == SK_BACKEND_CPU) return sk_cpu_attention_run(p);
    return sk_cuda_attention_run(p, workspace, workspace_size, stream);
}

sk_status sk_attention_run(const sk_attention_desc *desc, const sk_bsr *layout, const void *q,
                           const void *k, const void *v, void *o, float *lse, void *workspace,
                           size_t workspace_size, struct CUstream_st *stream) {
    SK_ENTER("sk_attention_run");
    sk_attention_problem p;
    SK_TRY(sk_attention_check_geometry(desc, layout, &p));
    SK_TRY(sk_attention_check_tensors(&p, q, k, v, o, lse));
    SK_TRY(sk_attention_check_layout_content(&p, layout));
    return run_checked(&p, workspace, workspace_size, stream);
}

sk_status sk_attention_forward(const sk_attention_desc *desc, const sk_bsr *layout, const void *q,
                               const void *k, const void *v, void *o, float *lse,
                               void *workspace, size_t workspace_size,
                               struct CUstream_st *stream) {
    SK_ENTER("sk_attention_forward");
    sk_attention_problem p;
    SK_TRY(sk_attention_check_geometry(desc, layout, &p));
    SK_TRY(sk_attention_check_tensors(&p, q, k, v, o, lse));
    SK_TRY(sk_attention_check_layout_content(&p, layout));
    return sk_attention_enqueue(&p, workspace, workspace_size, stream);
}

sk_status sk_attention_enqueue(const sk_attention_problem *p, void *workspace,
                               size_t workspace_size, struct CUstream_st *stream) {
    SK_TRY(plan_checked(p, workspace, workspace_size, stream));
    return run_checked(p, workspace, workspace_size, stream);
}
