/*
 * attention_varlen.c - the public varlen attention entry points (sparsek.h,
 * "Varlen batches"): descriptor defaults, every argument check, dispatch
 * (CPU: src/cpu/attention_varlen_ref.c; CUDA: src/cuda/attention/varlen.cu).
 *
 * The packed call is checked as one fixed-batch problem of batch 1 (the
 * "flat" problem of problem.h: Q [1, total_q, Hq, D], LSE [Hq, total_q],
 * the layout's R rows per slice), with attention.c's own steps
 * (attention_internal.h), so the tensor, stride, alignment and aliasing
 * rules and their messages are the fixed batch's. The order: descriptor,
 * shapes, layout geometry (batch 1), cu_seqlens pointers, tensors,
 * aliasing (o and lse against every other buffer, the length arrays
 * included; then the CUDA workspace), then on the CPU only, the length
 * arrays' content and the layout's (host arrays), then the backend.
 */
#include <string.h>

#include "core/attention_internal.h"
#include "core/check.h"
#include "core/internal.h"
#include "core/layout.h"
#include "core/problem.h"
#include "cpu/cpu_backend.h"
#include "cuda/backend.h"

sk_status sk_attention_varlen_desc_init(sk_attention_varlen_desc *desc, size_t struct_size) {
    SK_ENTER("sk_attention_varlen_desc_init");
    SK_CHECK_NOT_NULL(desc);
    SK_TRY(sk_check_init_struct_size(struct_size, sizeof(sk_attention_varlen_desc),
                                     "sk_attention_varlen_desc"));
    memset(desc, 0, sizeof *desc);
    desc->struct_size = sizeof *desc;
    desc->backend = SK_BACKEND_CUDA;
    desc->dtype = SK_DTYPE_F16;
    desc->scale = 0.0f;
    desc->mask = SK_MASK_NONE;
    return SK_STATUS_SUCCESS;
}

sk_status sk_varlen_check_count(int64_t value, const char *name) {
    if (value < 1)
        return sk_error(SK_STATUS_BAD_PARAM_SHAPE, "desc->%s = %lld must be >= 1", name,
                        (long long)value);
    if (value > INT32_MAX)
        return sk_error(SK_STATUS_BAD_PARAM_OVERFLOW,
                        "desc->%s = %lld must fit int32, as cu_seqlens does", name,
                        (long long)value);
    return SK_STATUS_SUCCESS;
}

/* d is not NULL; sizes are its six sizes. */
static sk_status check_desc(const sk_attention_varlen_desc *d, const int64_t sizes[6]) {
    static const char *const names[6] = {"batch",   "total_q",  "total_k",
                                         "heads_q", "heads_kv", "head_dim"};
    SK_TRY(sk_check_desc_struct_size(d->struct_size, sizeof(sk_attention_varlen_desc), "desc",
                                     "sk_attention_varlen_desc_init"));
    SK_TRY(sk_check_attention_shape_named(d->backend, d->dtype, sizes, names));
    SK_TRY(sk_varlen_check_count(d->total_q, "total_q"));
    SK_TRY(sk_varlen_check_count(d->total_k, "total_k"));
    SK_TRY(sk_varlen_check_count(d->max_seqlen_q, "max_seqlen_q"));
    SK_TRY(sk_varlen_check_count(d->max_seqlen_k, "max_seqlen_k"));
    return sk_attention_check_scale_mask(d->scale, d->mask);
}

void sk_varlen_resolve_strides(const int64_t in[2], int64_t heads, int64_t dim, int64_t out[3]) {
    out[0] = 0;
    out[1] = in[0] == 0 && in[1] == 0 ? heads * dim : in[0];
    out[2] = in[0] == 0 && in[1] == 0 ? dim : in[1];
}

sk_status sk_varlen_check_queries(sk_attention_problem *p, sk_backend backend, sk_dtype dtype,
                                  const int64_t flat[6], float scale, sk_mask mask,
                                  const sk_bsr *layout, const char *kv_dims,
                                  const int64_t q_strides[2], const int64_t o_strides[2]) {
    sk_attention_problem_init(p, backend, dtype, flat, scale, mask);
    SK_CHECK_NOT_NULL(layout);
    int32_t row_blocks, col_blocks;
    SK_TRY(sk_grid_check(&layout->grid, &row_blocks, &col_blocks, NULL));
    if (layout->grid.batch != 1)
        return sk_error(SK_STATUS_BAD_LAYOUT_MISMATCH,
                        "layout grid batch = %d must be 1 in a varlen call (the sequences are "
                        "its rows)",
                        (int)layout->grid.batch);
    SK_TRY(sk_attention_layout_slices(layout, row_blocks, col_blocks, p));
    SK_TRY(sk_attention_check_sizes(p, "total_q", kv_dims, "heads_q x total_q"));
    sk_varlen_resolve_strides(q_strides, p->heads_q, p->head_dim, p->q_stride);
    sk_varlen_resolve_strides(o_strides, p->heads_q, p->head_dim, p->o_stride);
    return SK_STATUS_SUCCESS;
}

/* Everything that needs no pointer but the layout's: fills *vp but the
 * tensors and the length arrays. */
static sk_status check_geometry(const sk_attention_varlen_desc *d, const sk_bsr *layout,
                                sk_attention_varlen_problem *vp) {
    if (d == NULL) return sk_error(SK_STATUS_BAD_PARAM_NULL_POINTER, "desc must not be NULL");
    const int64_t sizes[6] = {d->batch,   d->total_q,  d->total_k,
                              d->heads_q, d->heads_kv, d->head_dim};
    SK_TRY(check_desc(d, sizes));
    memset(vp, 0, sizeof *vp);
    const int64_t flat[6] = {1, d->total_q, d->total_k, d->heads_q, d->heads_kv, d->head_dim};
    sk_attention_problem *p = &vp->flat;
    SK_TRY(sk_varlen_check_queries(p, d->backend, d->dtype, flat, d->scale, d->mask, layout,
                                   "total_k", d->q_strides, d->o_strides));
    sk_varlen_resolve_strides(d->k_strides, d->heads_kv, d->head_dim, p->k_stride);
    sk_varlen_resolve_strides(d->v_strides, d->heads_kv, d->head_dim, p->v_stride);
    vp->batch = (int32_t)d->batch;
    vp->max_seqlen_q = d->max_seqlen_q;
    vp->max_seqlen_k = d->max_seqlen_k;
    return SK_STATUS_SUCCESS;
}

/* The length arrays: present, int32-aligned; stored in *vp, and their
 * spans (B + 1 entries each, read) into out[2]. */
static sk_status check_seqlens_arrays(sk_attention_varlen_problem *vp, const int32_t *cu_seqlens_q,
                                      const int32_t *cu_seqlens_k, sk_buffer out[2]) {
    SK_CHECK_NOT_NULL(cu_seqlens_q);
    SK_CHECK_NOT_NULL(cu_seqlens_k);
    SK_TRY(sk_check_alignment(cu_seqlens_q, NULL, 4, 4, 0, "cu_seqlens_q"));
    SK_TRY(sk_check_alignment(cu_seqlens_k, NULL, 4, 4, 0, "cu_seqlens_k"));
    const int64_t bytes = ((int64_t)vp->batch + 1) * 4;
    const sk_buffer arrays[2] = {{"cu_seqlens_q", cu_seqlens_q, bytes, 0},
                                 {"cu_seqlens_k", cu_seqlens_k, bytes, 0}};
    memcpy(out, arrays, sizeof arrays);
    vp->cu_seqlens_q = cu_seqlens_q;
    vp->cu_seqlens_k = cu_seqlens_k;
    return SK_STATUS_SUCCESS;
}

static sk_status problem_workspace_size(const sk_attention_varlen_problem *vp, size_t *bytes) {
    if (vp->flat.backend == SK_BACKEND_CPU) {
        *bytes = 0;
        return SK_STATUS_SUCCESS;
    }
    return sk_cuda_attention_varlen_workspace_size(vp, bytes);
}

/* The CUDA workspace (written) against buffers[]; nothing on the CPU or
 * for a NULL workspace. */
static sk_status check_workspace_apart(const sk_attention_varlen_problem *vp, const void *workspace,
                                       size_t workspace_size, const sk_buffer *buffers, int count) {
    if (vp->flat.backend == SK_BACKEND_CPU || workspace == NULL) return SK_STATUS_SUCCESS;
    size_t bytes;
    SK_TRY(problem_workspace_size(vp, &bytes));
    return sk_check_workspace_apart(workspace, workspace_size, bytes, buffers, count);
}

/* Host arrays (CPU backend): the lengths against the descriptor, the
 * layout in full, then the layout against the lengths. Device arrays
 * cannot be read here (see "Varlen batches" in sparsek.h). */
static sk_status check_content(const sk_attention_varlen_problem *vp, const sk_bsr *layout) {
    if (vp->flat.backend != SK_BACKEND_CPU) return SK_STATUS_SUCCESS;
    SK_TRY(sk_varlen_check_seqlens(vp->cu_seqlens_q, vp->batch, vp->flat.seq_q, vp->max_seqlen_q,
                                   'q'));
    SK_TRY(sk_varlen_check_seqlens(vp->cu_seqlens_k, vp->batch, vp->flat.seq_k, vp->max_seqlen_k,
                                   'k'));
    SK_TRY(sk_layout_check(layout));
    return sk_varlen_check_layout(layout, vp->batch, vp->cu_seqlens_q, vp->cu_seqlens_k + 1,
                                  vp->cu_seqlens_k);
}

/* Every buffer of a run: the forward's list (attention_internal.h), then
 * the two length arrays. */
enum { VARLEN_CU = SK_ATTN_BUFFERS, VARLEN_BUFFERS = SK_ATTN_BUFFERS + 2 };

/* Every check of run and of the one-shot call. */
static sk_status check_call(const sk_attention_varlen_desc *desc, const sk_bsr *layout,
                            const int32_t *cu_seqlens_q, const int32_t *cu_seqlens_k, const void *q,
                            const void *k, const void *v, void *o, float *lse,
                            const void *workspace, size_t workspace_size,
                            sk_attention_varlen_problem *vp) {
    SK_TRY(check_geometry(desc, layout, vp));
    sk_buffer buffers[VARLEN_BUFFERS];
    SK_TRY(check_seqlens_arrays(vp, cu_seqlens_q, cu_seqlens_k, buffers + VARLEN_CU));
    SK_TRY(sk_attention_check_tensors(&vp->flat, q, k, v, o, lse, buffers));
    SK_TRY(sk_check_no_alias(buffers, VARLEN_BUFFERS));
    SK_TRY(check_workspace_apart(vp, workspace, workspace_size, buffers, VARLEN_BUFFERS));
    return check_content(vp, layout);
}

static sk_status plan_checked(const sk_attention_varlen_problem *vp, void *workspace,
                              size_t workspace_size, struct CUstream_st *stream) {
    if (vp->flat.backend == SK_BACKEND_CPU) return SK_STATUS_SUCCESS;
    return sk_cuda_attention_varlen_plan(vp, workspace, workspace_size, stream);
}

static sk_status run_checked(const sk_attention_varlen_problem *vp, void *workspace,
                             size_t workspace_size, struct CUstream_st *stream) {
    if (vp->flat.backend == SK_BACKEND_CPU) return sk_cpu_attention_varlen_run(vp);
    return sk_cuda_attention_varlen_run(vp, workspace, workspace_size, stream);
}

sk_status sk_attention_varlen_workspace_size(const sk_attention_varlen_desc *desc,
                                             const sk_bsr *layout, size_t *workspace_bytes) {
    SK_ENTER("sk_attention_varlen_workspace_size");
    SK_CHECK_NOT_NULL(workspace_bytes);
    sk_attention_varlen_problem vp;
    SK_TRY(check_geometry(desc, layout, &vp));
    return problem_workspace_size(&vp, workspace_bytes);
}

sk_status sk_attention_varlen_plan(const sk_attention_varlen_desc *desc, const sk_bsr *layout,
                                   const int32_t *cu_seqlens_q, const int32_t *cu_seqlens_k,
                                   void *workspace, size_t workspace_size,
                                   struct CUstream_st *stream) {
    SK_ENTER("sk_attention_varlen_plan");
    sk_attention_varlen_problem vp;
    SK_TRY(check_geometry(desc, layout, &vp));
    /* The plan writes the workspace and reads the layout and length arrays. */
    sk_buffer arrays[4];
    SK_TRY(check_seqlens_arrays(&vp, cu_seqlens_q, cu_seqlens_k, arrays + 2));
    sk_attention_layout_buffers(&vp.flat, arrays);
    SK_TRY(check_workspace_apart(&vp, workspace, workspace_size, arrays, 4));
    SK_TRY(check_content(&vp, layout));
    return plan_checked(&vp, workspace, workspace_size, stream);
}

sk_status sk_attention_varlen_run(const sk_attention_varlen_desc *desc, const sk_bsr *layout,
                                  const int32_t *cu_seqlens_q, const int32_t *cu_seqlens_k,
                                  const void *q, const void *k, const void *v, void *o, float *lse,
                                  void *workspace, size_t workspace_size,
                                  struct CUstream_st *stream) {
    SK_ENTER("sk_attention_varlen_run");
    sk_attention_varlen_problem vp;
    SK_TRY(check_call(desc, layout, cu_seqlens_q, cu_seqlens_k, q, k, v, o, lse, workspace,
                      workspace_size, &vp));
    return run_checked(&vp, workspace, workspace_size, stream);
}

sk_status sk_attention_varlen_forward(const sk_attention_varlen_desc *desc, const sk_bsr *layout,
                                      const int32_t *cu_seqlens_q, const int32_t *cu_seqlens_k,
                                      const void *q, const void *k, const void *v, void *o,
                                      float *lse, void *workspace, size_t workspace_size,
                                      struct CUstream_st *stream) {
    SK_ENTER("sk_attention_varlen_forward");
    sk_attention_varlen_problem vp;
    SK_TRY(check_call(desc, layout, cu_seqlens_q, cu_seqlens_k, q, k, v, o, lse, workspace,
                      workspace_size, &vp));
    SK_TRY(plan_checked(&vp, workspace, workspace_size, stream));
    return run_checked(&vp, workspace, workspace_size, stream);
}

/* The steps the varlen backward (attention_varlen_backward.c) shares,
 * messages included (attention_internal.h). */
sk_status sk_varlen_check_geometry(const sk_attention_varlen_desc *desc, const sk_bsr *layout,
                                   sk_attention_varlen_problem *vp) {
    return check_geometry(desc, layout, vp);
}

sk_status sk_varlen_check_seqlens_arrays(sk_attention_varlen_problem *vp,
                                         const int32_t *cu_seqlens_q,
                                         const int32_t *cu_seqlens_k, sk_buffer out[2]) {
    return check_seqlens_arrays(vp, cu_seqlens_q, cu_seqlens_k, out);
}

sk_status sk_varlen_check_content(const sk_attention_varlen_problem *vp, const sk_bsr *layout) {
    return check_content(vp, layout);
}
