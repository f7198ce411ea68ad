/*
 * attention_varlen_backward.c - the public varlen attention backward entry
 * points (sparsek.h, "Varlen attention backward"): the descriptor's
 * defaults, every argument check, dispatch (CPU: src/cpu/
 * attention_varlen_bwd_ref.c; the CUDA backends: SK_STATUS_NOT_SUPPORTED
 * after the checks, until the kernels exist).
 *
 * The checks are the varlen forward's (attention_varlen.c's steps, shared
 * through attention_internal.h, so their messages are the same), then the
 * backward descriptor's (as attention_backward.c's), the forward's tensors
 * (O and LSE read here), dO, dQ, dK, dV, aliasing (the outputs against
 * every other buffer, layout and length arrays included), then on the CPU
 * the lengths' and the layout's content; on CUDA the workspace against
 * every buffer. All of them run before anything is written.
 */
#include <string.h>

#include "core/attention_internal.h"
#include "core/check.h"
#include "core/internal.h"
#include "core/problem.h"
#include "cpu/cpu_backend.h"
#include "cuda/backend.h"

sk_status sk_attention_varlen_backward_desc_init(sk_attention_varlen_backward_desc *bwd,
                                                 size_t struct_size) {
    SK_ENTER("sk_attention_varlen_backward_desc_init");
    SK_CHECK_NOT_NULL(bwd);
    SK_TRY(sk_check_init_struct_size(struct_size, sizeof(sk_attention_varlen_backward_desc),
                                     "sk_attention_varlen_backward_desc"));
    memset(bwd, 0, sizeof *bwd);
    bwd->struct_size = sizeof *bwd;
    bwd->deterministic = 1;
    return SK_STATUS_SUCCESS;
}

/* The forward's geometry, then the backward descriptor; fills *p but its
 * tensors and length arrays. */
static sk_status check_geometry(const sk_attention_varlen_desc *desc,
                                const sk_attention_varlen_backward_desc *bwd,
                                const sk_bsr *layout, sk_attention_varlen_backward_problem *p) {
    memset(p, 0, sizeof *p);
    SK_TRY(sk_varlen_check_geometry(desc, layout, &p->v));
    if (bwd == NULL) return sk_error(SK_STATUS_BAD_PARAM_NULL_POINTER, "bwd must not be NULL");
    SK_TRY(sk_backward_check_header(bwd->struct_size, bwd->deterministic,
                                    sizeof(sk_attention_varlen_backward_desc),
                                    "sk_attention_varlen_backward_desc_init"));
    p->deterministic = bwd->deterministic;
    const sk_attention_problem *f = &p->v.flat;
    sk_varlen_resolve_strides(bwd->dout_strides, f->heads_q, f->head_dim, p->dout_stride);
    sk_varlen_resolve_strides(bwd->dq_strides, f->heads_q, f->head_dim, p->dq_stride);
    sk_varlen_resolve_strides(bwd->dk_strides, f->heads_kv, f->head_dim, p->dk_stride);
    sk_varlen_resolve_strides(bwd->dv_strides, f->heads_kv, f->head_dim, p->dv_stride);
    return SK_STATUS_SUCCESS;
}

/* Every buffer of a run, outputs first (a message names the written one
 * first): dq, dk, dv, the forward's list (attention_internal.h; all read
 * here), dout, the two length arrays. */
enum {
    VB_DQ,
    VB_DK,
    VB_DV,
    VB_FWD,
    VB_DOUT = VB_FWD + SK_ATTN_BUFFERS,
    VB_CU,
    VB_BUFFERS = VB_CU + 2
};

/* Pointers, extents and alignment of every tensor; stores the pointers in
 * *p and the byte spans in buffers[VB_DQ .. VB_DOUT]. */
static sk_status check_tensors(sk_attention_varlen_backward_problem *p, const void *q,
                               const void *k, const void *v, const void *o, const void *dout,
                               const float *lse, void *dq, void *dk, void *dv,
                               sk_buffer buffers[VB_BUFFERS]) {
    sk_attention_problem *f = &p->v.flat;
    /* O and LSE are the forward's outputs, read here: the forward's checks
     * hold for them, then they are marked read; both pointers are only
     * read through (problem.h). */
    SK_TRY(sk_attention_check_tensors(f, q, k, v, (void *)o, (float *)lse, buffers + VB_FWD));
    buffers[VB_FWD + SK_ATTN_O].written = 0;
    buffers[VB_FWD + SK_ATTN_LSE].written = 0;
    SK_CHECK_NOT_NULL(dout);
    SK_CHECK_NOT_NULL(lse);
    SK_CHECK_NOT_NULL(dq);
    SK_CHECK_NOT_NULL(dk);
    SK_CHECK_NOT_NULL(dv);
    SK_TRY(sk_attention_check_tensor(f, dout, 1, f->seq_q, f->heads_q, p->dout_stride, 0, "dout",
                                     &buffers[VB_DOUT]));
    SK_TRY(sk_attention_check_tensor(f, dq, 1, f->seq_q, f->heads_q, p->dq_stride, 1, "dq",
                                     &buffers[VB_DQ]));
    SK_TRY(sk_attention_check_tensor(f, dk, 1, f->seq_k, f->heads_kv, p->dk_stride, 1, "dk",
                                     &buffers[VB_DK]));
    SK_TRY(sk_attention_check_tensor(f, dv, 1, f->seq_k, f->heads_kv, p->dv_stride, 1, "dv",
                                     &buffers[VB_DV]));
    p->dout = dout;
    p->dq = dq;
    p->dk = dk;
    p->dv = dv;
    return SK_STATUS_SUCCESS;
}

static sk_status problem_workspace_size(const sk_attention_varlen_backward_problem *p,
                                        size_t *bytes) {
    if (p->v.flat.backend == SK_BACKEND_CPU) {
        *bytes = 0;
        return SK_STATUS_SUCCESS;
    }
    return sk_cuda_attention_varlen_backward_workspace_size(p, bytes);
}

/* The CUDA workspace (written) against buffers[]; nothing on the CPU or
 * for a NULL workspace. */
static sk_status check_workspace_apart(const sk_attention_varlen_backward_problem *p,
                                       const void *workspace, size_t workspace_size,
                                       const sk_buffer *buffers, int count) {
    if (p->v.flat.backend == SK_BACKEND_CPU || workspace == NULL) return SK_STATUS_SUCCESS;
    size_t bytes;
    SK_TRY(problem_workspace_size(p, &bytes));
    return sk_check_workspace_apart(workspace, workspace_size, bytes, buffers, count);
}

/* Every check of run and of the one-shot call. */
static sk_status check_call(const sk_attention_varlen_desc *desc,
                            const sk_attention_varlen_backward_desc *bwd, const sk_bsr *layout,
                            const int32_t *cu_seqlens_q, const int32_t *cu_seqlens_k,
                            const void *q, const void *k, const void *v, const void *o,
                            const void *dout, const float *lse, void *dq, void *dk, void *dv,
                            const void *workspace, size_t workspace_size,
                            sk_attention_varlen_backward_problem *p) {
    SK_TRY(check_geometry(desc, bwd, layout, p));
    sk_buffer buffers[VB_BUFFERS];
    SK_TRY(sk_varlen_check_seqlens_arrays(&p->v, cu_seqlens_q, cu_seqlens_k, buffers + VB_CU));
    SK_TRY(check_tensors(p, q, k, v, o, dout, lse, dq, dk, dv, buffers));
    SK_TRY(sk_check_no_alias(buffers, VB_BUFFERS));
    SK_TRY(check_workspace_apart(p, workspace, workspace_size, buffers, VB_BUFFERS));
    return sk_varlen_check_content(&p->v, layout);
}

static sk_status plan_checked(const sk_attention_varlen_backward_problem *p, void *workspace,
                              size_t workspace_size, struct CUstream_st *stream) {
    if (p->v.flat.backend == SK_BACKEND_CPU) return SK_STATUS_SUCCESS;
    return sk_cuda_attention_varlen_backward_plan(p, workspace, workspace_size, stream);
}

static sk_status run_checked(const sk_attention_varlen_backward_problem *p, void *workspace,
                             size_t workspace_size, struct CUstream_st *stream) {
    if (p->v.flat.backend == SK_BACKEND_CPU) return sk_cpu_attention_varlen_backward_run(p);
    return sk_cuda_attention_varlen_backward_run(p, workspace, workspace_size, stream);
}

sk_status sk_attention_varlen_backward_workspace_size(const sk_attention_varlen_desc *desc,
                                                      const sk_attention_varlen_backward_desc *bwd,
                                                      const sk_bsr *layout,
                                                      size_t *workspace_bytes) {
    SK_ENTER("sk_attention_varlen_backward_workspace_size");
    SK_CHECK_NOT_NULL(workspace_bytes);
    sk_attention_varlen_backward_problem p;
    SK_TRY(check_geometry(desc, bwd, layout, &p));
    return problem_workspace_size(&p, workspace_bytes);
}

sk_status sk_attention_varlen_backward_plan(const sk_attention_varlen_desc *desc,
                                            const sk_attention_varlen_backward_desc *bwd,
                                            const sk_bsr *layout, const int32_t *cu_seqlens_q,
                                            const int32_t *cu_seqlens_k, void *workspace,
                                            size_t workspace_size, struct CUstream_st *stream) {
    SK_ENTER("sk_attention_varlen_backward_plan");
    sk_attention_varlen_backward_problem p;
    SK_TRY(check_geometry(desc, bwd, layout, &p));
    /* The plan writes the workspace and reads the layout and length arrays. */
    sk_buffer arrays[4];
    SK_TRY(sk_varlen_check_seqlens_arrays(&p.v, cu_seqlens_q, cu_seqlens_k, arrays + 2));
    sk_attention_layout_buffers(&p.v.flat, arrays);
    SK_TRY(check_workspace_apart(&p, workspace, workspace_size, arrays, 4));
    SK_TRY(sk_varlen_check_content(&p.v, layout));
    return plan_checked(&p, workspace, workspace_size, stream);
}

sk_status sk_attention_varlen_backward_run(const sk_attention_varlen_desc *desc,
                                           const sk_attention_varlen_backward_desc *bwd,
                                           const sk_bsr *layout, const int32_t *cu_seqlens_q,
                                           const int32_t *cu_seqlens_k, const void *q,
                                           const void *k, const void *v, const void *o,
                                           const void *dout, const float *lse, void *dq,
                                           void *dk, void *dv, void *workspace,
                                           size_t workspace_size, struct CUstream_st *stream) {
    SK_ENTER("sk_attention_varlen_backward_run");
    sk_attention_varlen_backward_problem p;
    SK_TRY(check_call(desc, bwd, layout, cu_seqlens_q, cu_seqlens_k, q, k, v, o, dout, lse, dq,
                      dk, dv, workspace, workspace_size, &p));
    return run_checked(&p, workspace, workspace_size, stream);
}

sk_status sk_attention_varlen_backward(const sk_attention_varlen_desc *desc,
                                       const sk_attention_varlen_backward_desc *bwd,
                                       const sk_bsr *layout, const int32_t *cu_seqlens_q,
                                       const int32_t *cu_seqlens_k, const void *q, const void *k,
                                       const void *v, const void *o, const void *dout,
                                       const float *lse, void *dq, void *dk, void *dv,
                                       void *workspace, size_t workspace_size,
                                       struct CUstream_st *stream) {
    SK_ENTER("sk_attention_varlen_backward");
    sk_attention_varlen_backward_problem p;
    SK_TRY(check_call(desc, bwd, layout, cu_seqlens_q, cu_seqlens_k, q, k, v, o, dout, lse, dq,
                      dk, dv, workspace, workspace_size, &p));
    SK_TRY(plan_checked(&p, workspace, workspace_size, stream));
    return run_checked(&p, workspace, workspace_size, stream);
}
