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
 * Kernels: SK_BACKEND_CUDA and SK_BACKEND_CUDA_SM80 run the portable
 * kernels (fwd_sm80.cu in varlen / paged mode, any compute capability >=
 * 8.0). SK_BACKEND_CUDA_SM90 answers SK_STATUS_NOT_SUPPORTED from all
 * three calls until the Hopper varlen kernel exists: sk_varlen_choose is
 * the one place where it will be chosen (and SK_BACKEND_CUDA take it on
 * compute capability 9.0).
 *
 * Run: checks first (nothing is enqueued on failure), then the tile counter
 * is reset with cudaMemsetAsync on the stream and the kernel launched.
 */
#include "core/internal.h"
#include "cuda/attention/kernels.h"
#include "cuda/attention/varlen_plan.h"
#include "cuda/backend.h"
#include "cuda/common/cuda_check.cuh"
#include "cuda/common/schedule.h"

typedef enum sk_varlen_kernel { SK_VARLEN_SM80 = 0 } sk_varlen_kernel;

/* The Hopper varlen kernel's absence, told the same way by every call. */
static sk_status sk_varlen_no_sm90(const sk_attention_problem *f) {
    if (f->backend != SK_BACKEND_CUDA_SM90) return SK_STATUS_SUCCESS;
    return sk_error(SK_STATUS_NOT_SUPPORTED,
                    "backend SK_BACKEND_CUDA_SM90: the Hopper varlen / paged kernel is not built "
                    "yet (issue 30); use SK_BACKEND_CUDA or SK_BACKEND_CUDA_SM80 (the portable "
                    "kernel)");
}

/* Device present and new enough, and the kernel that serves the problem:
 * the one dispatch point of the varlen and paged forwards. */
static sk_status sk_varlen_choose(const sk_attention_problem *f, sk_varlen_kernel *kernel) {
    SK_TRY(sk_varlen_no_sm90(f));
    int hopper = 0;
    SK_TRY(sk_cuda_check_arch(f->backend, &hopper));
    SK_TRY(sk_attention_sm80_check(f));
    *kernel = SK_VARLEN_SM80;
    return SK_STATUS_SUCCESS;
}

static sk_status sk_varlen_workspace(const sk_attention_varlen_problem *v, size_t *bytes) {
    SK_TRY(sk_varlen_no_sm90(&v->flat));
    sk_varlen_plan_layout w;
    SK_TRY(sk_varlen_plan_layout_of(v, &w));
    *bytes = w.total;
    return SK_STATUS_SUCCESS;
}

/* The checks plan and run both make before enqueuing anything, and the
 * workspace's parts. */
static sk_status sk_varlen_prepare(const sk_attention_varlen_problem *v, void *workspace,
                                   size_t workspace_size, const char *size_fn,
                                   sk_varlen_plan_layout *w, sk_varlen_kernel *kernel,
                                   char **base) {
    SK_TRY(sk_varlen_plan_layout_of(v, w));
    SK_TRY(sk_varlen_choose(&v->flat, kernel));
    sk_plan_layout sized; /* the workspace check speaks of total bytes only */
    sized.total = w->total;
    SK_TRY(sk_schedule_check_workspace(&sized, workspace, workspace_size, size_fn));
    *base = sk_schedule_base(workspace);
    return SK_STATUS_SUCCESS;
}

static sk_status sk_varlen_plan(const sk_attention_varlen_problem *v, const int32_t *seq_lens_k,
                                void *workspace, size_t workspace_size, const char *size_fn,
                                cudaStream_t stream) {
    sk_varlen_plan_layout w;
    sk_varlen_kernel kernel;
    char *base;
    SK_TRY(sk_varlen_prepare(v, workspace, workspace_size, size_fn, &w, &kernel, &base));
    sk_varlen_plan_source src;
    src.v = v;
    src.seq_lens_k = seq_lens_k;
    return sk_varlen_plan_enqueue(&src, &w, base, stream);
}

static sk_status sk_varlen_run(const sk_attention_varlen_problem *v,
                               const sk_attention_paged_problem *paged, void *workspace,
                               size_t workspace_size, const char *size_fn, cudaStream_t stream) {
    sk_varlen_plan_layout w;
    sk_varlen_kernel kernel;
    char *base;
    SK_TRY(sk_varlen_prepare(v, workspace, workspace_size, size_fn, &w, &kernel, &base));
    const sk_varlen_plan_view plan = sk_varlen_plan_view_of(&w, base);
    SK_CUDA_TRY(cudaMemsetAsync(plan.tile_counter, 0, sizeof(int32_t), stream),
                "cudaMemsetAsync (tile counter)");
    switch (kernel) {
    case SK_VARLEN_SM80:
    default:
        return sk_attention_sm80_varlen_launch(v, paged, &plan, stream);
    }
}

extern "C" sk_status sk_cuda_attention_varlen_workspace_size(const sk_attention_varlen_problem *p,
                                                             size_t *bytes) {
    return sk_varlen_workspace(p, bytes);
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
    return sk_varlen_workspace(&p->v, bytes);
}

extern "C" sk_status sk_cuda_attention_paged_plan(const sk_attention_paged_problem *p,
                                                  void *workspace, size_t workspace_size,
                                                  struct CUstream_st *stream) {
    return sk_varlen_plan(&p->v, p->seq_lens_k, workspace, workspace_size,
                          "sk_attention_paged_workspace_size", stream);
}

extern "C" sk_status sk_cuda_attention_paged_run(const sk_attention_paged_problem *p,
                                                 void *workspace, size_t workspace_size,
                                                 struct CUstream_st *stream) {
    return sk_varlen_run(&p->v, p, workspace, workspace_size, "sk_attention_paged_workspace_size",
                         stream);
}
