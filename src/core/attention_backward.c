/*
 * attention_backward.c - the public attention backward entry points: the
 * backward descriptor's defaults, every argument check, and dispatch (CPU:
 * the reference, src/cpu/attention_bwd_ref.c; CUDA: src/cuda/attention/
 * bwd.cu: the plan on the GPU and the portable kernels).
 *
 * All checks run before any backend is called, so a failed call writes
 * nothing, and they are the same on every backend. The order is: the
 * forward's descriptor, shapes and layout geometry (attention.c's step,
 * attention_internal.h), the backward descriptor, then pointers, extents
 * and alignment of the forward's tensors (attention.c's step: q, k, v, o,
 * lse, here all read) and of dout, dq, dk, dv; aliasing (dq, dk, dv against
 * every other buffer, layout arrays included; then the CUDA workspace
 * against all of them); the layout content (CPU only); then the backend.
 */
#include <string.h>

#include "core/attention_internal.h"
#include "core/check.h"
#include "core/internal.h"
#include "core/problem.h"
#include "cpu/cpu_backend.h"
#include "cuda/backend.h"

sk_status sk_attention_backward_desc_init(sk_attention_backward_desc *bwd, size_t struct_size) {
    SK_ENTER("sk_attention_backward_desc_init");
    SK_CHECK_NOT_NULL(bwd);
    SK_TRY(sk_check_init_struct_size(struct_size, sizeof(sk_attention_backward_desc),
                                     "sk_attention_backward_desc"));
    memset(bwd, 0, sizeof *bwd);
    bwd->struct_size = sizeof *bwd;
    bwd->deterministic = 1;
    return SK_STATUS_SUCCESS;
}

sk_status sk_backward_check_header(size_t struct_size, int32_t deterministic, size_t size,
                                   const char *init) {
    SK_TRY(sk_check_desc_struct_size(struct_size, size, "bwd", init));
    if (deterministic != 0 && deterministic != 1)
        return sk_error(SK_STATUS_BAD_PARAM_VALUE,
                        "bwd->deterministic = %d must be 1 (bitwise repeatable) or 0 (fp32 atomics allowed)",
                        (int)deterministic);
    return SK_STATUS_SUCCESS;
}

/* The forward's geometry, then the backward descriptor; fills *p but its
 * tensor pointers. */
static sk_status check_geometry(const sk_attention_desc *desc,
                                const sk_attention_backward_desc *bwd, const sk_bsr *layout,
                                sk_attention_backward_problem *p) {
    memset(p, 0, sizeof *p);
    SK_TRY(sk_attention_check_geometry(desc, layout, &p->fwd));
    if (p->fwd.dtype == SK_DTYPE_E4M3)
        return sk_error(SK_STATUS_BAD_PARAM_DTYPE,
                        "desc->dtype = E4M3: the backward takes F16 or BF16 (F32 on the CPU); "
                        "FP8 is a forward-only input type");
    if (bwd == NULL) return sk_error(SK_STATUS_BAD_PARAM_NULL_POINTER, "bwd must not be NULL");
    SK_TRY(sk_backward_check_header(bwd->struct_size, bwd->deterministic,
                                    sizeof(sk_attention_backward_desc),
                                    "sk_attention_backward_desc_init"));
    p->deterministic = bwd->deterministic;
    /* The packed sizes of dO, dQ (as Q) and dK, dV (as K) were checked, in
     * bytes, with Q's and K's by sk_attention_check_geometry. */
    const sk_attention_problem *f = &p->fwd;
    sk_resolve_strides(bwd->dout_strides, f->seq_q, f->heads_q, f->head_dim, p->dout_stride);
    sk_resolve_strides(bwd->dq_strides, f->seq_q, f->heads_q, f->head_dim, p->dq_stride);
    sk_resolve_strides(bwd->dk_strides, f->seq_k, f->heads_kv, f->head_dim, p->dk_stride);
    sk_resolve_strides(bwd->dv_strides, f->seq_k, f->heads_kv, f->head_dim, p->dv_stride);
    return SK_STATUS_SUCCESS;
}

/* Every buffer of a backward run, in the order of its aliasing check: the
 * outputs first, so a message names the written one first. */
enum {
    BWD_DQ,
    BWD_DK,
    BWD_DV,
    BWD_FWD, /* the forward's list (attention_internal.h), all read here */
    BWD_DOUT = BWD_FWD + SK_ATTN_BUFFERS,
    BWD_BUFFERS
};

/* Pointers, extents and alignment of every tensor; stores the pointers in
 * *p and the byte spans in buffers[]. */
static sk_status check_tensors(sk_attention_backward_problem *p, const void *q, const void *k,
                               const void *v, const void *o, const void *dout, const float *lse,
                               void *dq, void *dk, void *dv, sk_buffer buffers[BWD_BUFFERS]) {
    sk_attention_problem *f = &p->fwd;
    /* O and LSE are the forward's outputs, read here: the forward's checks
     * hold for them (O's strides are an output's), then they are marked
     * read. Both pointers are only read through (problem.h). */
    SK_TRY(sk_attention_check_tensors(f, q, k, v, (void *)o, (float *)lse, buffers + BWD_FWD));
    buffers[BWD_FWD + SK_ATTN_O].written = 0;
    buffers[BWD_FWD + SK_ATTN_LSE].written = 0;
    SK_CHECK_NOT_NULL(dout);
    SK_CHECK_NOT_NULL(lse);
    SK_CHECK_NOT_NULL(dq);
    SK_CHECK_NOT_NULL(dk);
    SK_CHECK_NOT_NULL(dv);
    SK_TRY(sk_attention_check_tensor(f, dout, f->batch, f->seq_q, f->heads_q, p->dout_stride, 0,
                                     "dout", &buffers[BWD_DOUT]));
    SK_TRY(sk_attention_check_tensor(f, dq, f->batch, f->seq_q, f->heads_q, p->dq_stride, 1, "dq",
                                     &buffers[BWD_DQ]));
    SK_TRY(sk_attention_check_tensor(f, dk, f->batch, f->seq_k, f->heads_kv, p->dk_stride, 1, "dk",
                                     &buffers[BWD_DK]));
    SK_TRY(sk_attention_check_tensor(f, dv, f->batch, f->seq_k, f->heads_kv, p->dv_stride, 1, "dv",
                                     &buffers[BWD_DV]));
    p->dout = dout;
    p->dq = dq;
    p->dk = dk;
    p->dv = dv;
    return SK_STATUS_SUCCESS;
}

static sk_status problem_workspace_size(const sk_attention_backward_problem *p, size_t *bytes) {
    if (p->fwd.backend == SK_BACKEND_CPU) {
        *bytes = 0;
        return SK_STATUS_SUCCESS;
    }
    return sk_cuda_attention_backward_workspace_size(p, bytes);
}

/* The CUDA workspace (written) against buffers[]; nothing on the CPU or
 * for a NULL workspace. */
static sk_status check_workspace_apart(const sk_attention_backward_problem *p,
                                       const void *workspace, size_t workspace_size,
                                       const sk_buffer *buffers, int count) {
    if (p->fwd.backend == SK_BACKEND_CPU || workspace == NULL) return SK_STATUS_SUCCESS;
    size_t bytes;
    SK_TRY(problem_workspace_size(p, &bytes));
    return sk_check_workspace_apart(workspace, workspace_size, bytes, buffers, count);
}

/* Every check of run and of the one-shot call. */
static sk_status check_call(const sk_attention_desc *desc, const sk_attention_backward_desc *bwd,
                            const sk_bsr *layout, const void *q, const void *k, const void *v,
                            const void *o, const void *dout, const float *lse, void *dq, void *dk,
                            void *dv, const void *workspace, size_t workspace_size,
                            sk_attention_backward_problem *p) {
    SK_TRY(check_geometry(desc, bwd, layout, p));
    sk_buffer buffers[BWD_BUFFERS];
    SK_TRY(check_tensors(p, q, k, v, o, dout, lse, dq, dk, dv, buffers));
    SK_TRY(sk_check_no_alias(buffers, BWD_BUFFERS));
    SK_TRY(check_workspace_apart(p, workspace, workspace_size, buffers, BWD_BUFFERS));
    return sk_attention_check_layout_content(&p->fwd, layout);
}

static sk_status plan_checked(const sk_attention_backward_problem *p, void *workspace,
                              size_t workspace_size, struct CUstream_st *stream) {
    if (p->fwd.backend == SK_BACKEND_CPU) return SK_STATUS_SUCCESS;
    return sk_cuda_attention_backward_plan(p, workspace, workspace_size, stream);
}

static sk_status run_checked(const sk_attention_backward_problem *p, void *workspace,
                             size_t workspace_size, struct CUstream_st *stream) {
    if (p->fwd.backend == SK_BACKEND_CPU) return sk_cpu_attention_backward_run(p);
    return sk_cuda_attention_backward_run(p, workspace, workspace_size, stream);
}

sk_status sk_attention_backward_workspace_size(const sk_attention_desc *desc,
                                               const sk_attention_backward_desc *bwd,
                                               const sk_bsr *layout, size_t *workspace_bytes) {
    SK_ENTER("sk_attention_backward_workspace_size");
    SK_CHECK_NOT_NULL(workspace_bytes);
    sk_attention_backward_problem p;
    SK_TRY(check_geometry(desc, bwd, layout, &p));
    return problem_workspace_size(&p, workspace_bytes);
}

sk_status sk_attention_backward_plan(const sk_attention_desc *desc,
                                     const sk_attention_backward_desc *bwd, const sk_bsr *layout,
                                     void *workspace, size_t workspace_size,
                                     struct CUstream_st *stream) {
    SK_ENTER("sk_attention_backward_plan");
    sk_attention_backward_problem p;
    SK_TRY(check_geometry(desc, bwd, layout, &p));
    /* The plan writes the workspace and reads the layout arrays. */
    sk_buffer arrays[2];
    sk_attention_layout_buffers(&p.fwd, arrays);
    SK_TRY(check_workspace_apart(&p, workspace, workspace_size, arrays, 2));
    SK_TRY(sk_attention_check_layout_content(&p.fwd, layout));
    return plan_checked(&p, workspace, workspace_size, stream);
}

sk_status sk_attention_backward_run(const sk_attention_desc *desc,
                                    const sk_attention_backward_desc *bwd, const sk_bsr *layout,
                                    const void *q, const void *k, const void *v, const void *o,
                                    const void *dout, const float *lse, void *dq, void *dk,
                                    void *dv, void *workspace, size_t workspace_size,
                                    struct CUstream_st *stream) {
    SK_ENTER("sk_attention_backward_run");
    sk_attention_backward_problem p;
    SK_TRY(check_call(desc, bwd, layout, q, k, v, o, dout, lse, dq, dk, dv, workspace,
                      workspace_size, &p));
    return run_checked(&p, workspace, workspace_size, stream);
}

sk_status sk_attention_backward(const sk_attention_desc *desc,
                                const sk_attention_backward_desc *bwd, const sk_bsr *layout,
                                const void *q, const void *k, const void *v, const void *o,
                                const void *dout, const float *lse, void *dq, void *dk, void *dv,
                                void *workspace, size_t workspace_size,
                                struct CUstream_st *stream) {
    SK_ENTER("sk_attention_backward");
    sk_attention_backward_problem p;
    SK_TRY(check_call(desc, bwd, layout, q, k, v, o, dout, lse, dq, dk, dv, workspace,
                      workspace_size, &p));
    SK_TRY(plan_checked(&p, workspace, workspace_size, stream));
    return run_checked(&p, workspace, workspace_size, stream);
}
