/*
 * varlen.cu - the dispatch of the CUDA varlen and paged attention forwards
 * (the sk_cuda_attention_varlen_* and sk_cuda_attention_paged_* calls of
 * backend.h): workspace size, the plan (varlen_plan.h: row table and tile
 * order on the GPU) and the choice of kernel.
 *
 * The core calls these only after every argument check, so a bad argument
 * gets the same status on every backend; the length arrays, the page table
 * and the layout are device memory, never read here.
 *
 * Kernels (sk_varlen_choose, the one dispatch point): SK_BACKEND_CUDA_SM80
 * runs the portable kernels (fwd_sm80.cu in varlen / paged mode, any
 * compute capability >= 8.0); SK_BACKEND_CUDA_SM90 the Hopper kernel
 * (fwd_sm90_varlen.cu, varlen_sm90.h), or SK_STATUS_NOT_SUPPORTED with the
 * reason where it does not cover the call (blocks of 64, D other than 64 /
 * 128, strides not 16-byte multiples), from all three calls (the workspace
 * size asks the same host-only check); SK_BACKEND_CUDA the Hopper kernel
 * on compute capability 9.0 where it covers the call, else the portable
 * one.
 *
 * Run: checks first (nothing is enqueued on failure), then the tile counter
 * is reset with cudaMemsetAsync on the stream and the kernel launched.
 */
#include "core/internal.h"
#include "cuda/attention/kernels.h"
#include "cuda/attention/varlen_plan.h"
#include "cuda/attention/varlen_sm90.h"
#include "cuda/backend.h"
#include "cuda/common/cuda_check.cuh"
#include "cuda/common/schedule.h"

typedef enum sk_varlen_kernel { SK_VARLEN_SM80 = 0, SK_VARLEN_SM90 = 1 } sk_varlen_kernel;

/* Device present and new enough, and the kernel that serves the problem
 * (paged: the paged problem, v = &paged->v; varlen: NULL): the one
 * dispatch point of the varlen and paged forwards. */
static sk_status sk_varlen_choose(const sk_attention_varlen_problem *v,
                                  const sk_attention_paged_problem *paged,
                                  sk_varlen_kernel *kernel) {
    const sk_attention_problem *f = &v->flat;
    if (f->backend == SK_BACKEND_CUDA_SM90) SK_TRY(sk_attention_sm90_varlen_check(v, paged));
    int hopper = 0;
    SK_TRY(sk_cuda_check_arch(f->backend, &hopper));
    if (f->backend == SK_BACKEND_CUDA_SM90 ||
        (f->backend == SK_BACKEND_CUDA && hopper && sk_attention_sm90_varlen_supports(v, paged))) {
        *kernel = SK_VARLEN_SM90;
        return SK_STATUS_SUCCESS;
    }
    SK_TRY(sk_attention_sm80_check(f));
    *kernel = SK_VARLEN_SM80;
    return SK_STATUS_SUCCESS;
}

/* The workspace size: the plan's, whichever kernel runs (the forced Hopper
 * backend declines here already what it would decline at the run). */
static sk_status sk_varlen_workspace(const sk_attention_varlen_problem *v,
                                     const sk_attention_paged_problem *paged, size_t *bytes) {
    if (v->flat.backend == SK_BACKEND_CUDA_SM90) SK_TRY(sk_attention_sm90_varlen_check(v, paged));
    sk_varlen_plan_layout w;
    SK_TRY(sk_varlen_plan_layout_of(v, &w));
    *bytes = w.total;
    return SK_STATUS_SUCCESS;
}

/* The checks plan and run both make before enqueuing anything, and the
 * workspace's parts. */
static sk_status sk_varlen_prepare(const sk_attention_varlen_problem *v,
                                   const sk_attention_paged_problem *paged, void *workspace,
                                   size_t workspace_size, const char *size_fn,
                                   sk_varlen_plan_layout *w, sk_varlen_kernel *kernel,
                                   char **base) {
    SK_TRY(sk_varlen_plan_layout_of(v, w));
    SK_TRY(sk_varlen_choose(v, paged, kernel));
    sk_plan_layout sized; /* the workspace check speaks of total bytes only */
    sized.total = w->total;
    SK_TRY(sk_schedule_check_workspace(&sized, workspace, workspace_size, size_fn));
    *base = sk_schedule_base(workspace);
    return SK_STATUS_SUCCESS;
}

static sk_status sk_varlen_plan(const sk_attention_varlen_problem *v,
                                const sk_attention_paged_problem *paged, void *workspace,
                                size_t workspace_size, const char *size_fn, cudaStream_t stream) {
    sk_varlen_plan_layout w;
    sk_varlen_kernel kernel;
    char *base;
    SK_TRY(sk_varlen_prepare(v, paged, workspace, workspace_size, size_fn, &w, &kernel, &base));
    sk_varlen_plan_source src;
    src.v = v;
    src.seq_lens_k = paged != NULL ? paged->seq_lens_k : NULL;
    return sk_varlen_plan_enqueue(&src, &w, base, stream);
}

static sk_status sk_varlen_run(const sk_attention_varlen_problem *v,
                               const sk_attention_paged_problem *paged, void *workspace,
                               size_t workspace_size, const char *size_fn, cudaStream_t stream) {
    sk_varlen_plan_layout w;
    sk_varlen_kernel kernel;
    char *base;
    SK_TRY(sk_varlen_prepare(v, paged, workspace, workspace_size, size_fn, &w, &kernel, &base));
    const sk_varlen_plan_view plan = sk_varlen_plan_view_of(&w, base);
    SK_CUDA_TRY(cudaMemsetAsync(plan.tile_counter, 0, sizeof(int32_t), stream),
                "cudaMemsetAsync (tile counter)");
    switch (kernel) {
    case SK_VARLEN_SM90:
        return sk_attention_sm90_varlen_launch(v, paged, &plan, stream);
    case SK_VARLEN_SM80:
    default:
        return sk_attention_sm80_varlen_launch(v, paged, &plan, stream);
    }
}

extern "C" sk_status sk_cuda_attention_varlen_workspace_size(const sk_attention_varlen_problem *p,
                                                             size_t *bytes) {
    return sk_varlen_workspace(p, NULL, bytes);
}

extern "C" sk_status sk_cuda_attention_varlen_plan(const sk_attention_varlen_problem *p,
                                                   void *workspace, size_t workspace_size,
                                                   struct CUstream_st *stream) {
    return sk_varlen_plan(p, NULL, workspace, workspace_size, "sk_attention_varlen_workspace_size",
                          stream);
}

extern "C" sk_status sk_cuda_attention_varlen_run(const sk_attention_varlen_problem *p,
                                                  void *workspace, size_t workspace_size,
                                                  struct CUstream_st *stream) {
    return sk_varlen_run(p, NULL, workspace, workspace_size, "sk_attention_varlen_workspace_size",
                         stream);
}

extern "C" sk_status sk_cuda_attention_paged_workspace_size(const sk_attention_paged_problem *p,
                                                            size_t *bytes) {
    return sk_varlen_workspace(&p->v, p, bytes);
}

extern "C" sk_status sk_cuda_attention_paged_plan(const sk_attention_paged_problem *p,
                                                  void *workspace, size_t workspace_size,
                                                  struct CUstream_st *stream) {
    return sk_varlen_plan(&p->v, p, workspace, workspace_size,
                          "sk_attention_paged_workspace_size", stream);
}

extern "C" sk_status sk_cuda_attention_paged_run(const sk_attention_paged_problem *p,
                                                 void *workspace, size_t workspace_size,
                                                 struct CUstream_st *stream) {
    return sk_varlen_run(&p->v, p, workspace, workspace_size, "sk_attention_paged_workspace_size",
                         stream);
}
