/*
 * varlen.cu - the dispatch of the CUDA varlen and paged attention forwards
 * (the sk_cuda_attention_varlen_* and sk_cuda_attention_paged_* calls of
 * backend.h).
 *
 * Not built yet (issue 30, step 1): the API, the core's checks
 * (src/core/attention_varlen.c, attention_paged.c), the CPU reference and
 * the layout builders exist; these answer SK_STATUS_NOT_SUPPORTED and
 * touch nothing. The core calls them only after every argument check, so
 * a bad argument gets the same status on every backend.
 * docs/perf/varlen_paged.md is the design their bodies will follow: the
 * plan's per-sequence row starts (a prefix sum of ceil(len_q / block_q) on
 * the GPU) and tile order, the kernels' clamped reads of the length arrays
 * and page table.
 */
#include "core/internal.h"
#include "cuda/backend.h"

#define SK_VARLEN_NOT_BUILT                                                                        \
    "the CUDA varlen and paged attention is not built yet (issue 30); use SK_BACKEND_CPU for the " \
    "reference"

extern "C" sk_status sk_cuda_attention_varlen_workspace_size(const sk_attention_varlen_problem *,
                                                             size_t *) {
    return sk_error(SK_STATUS_NOT_SUPPORTED, SK_VARLEN_NOT_BUILT);
}

extern "C" sk_status sk_cuda_attention_varlen_plan(const sk_attention_varlen_problem *, void *,
                                                   size_t, struct CUstream_st *) {
    return sk_error(SK_STATUS_NOT_SUPPORTED, SK_VARLEN_NOT_BUILT);
}

extern "C" sk_status sk_cuda_attention_varlen_run(const sk_attention_varlen_problem *, void *,
                                                  size_t, struct CUstream_st *) {
    return sk_error(SK_STATUS_NOT_SUPPORTED, SK_VARLEN_NOT_BUILT);
}

extern "C" sk_status sk_cuda_attention_paged_workspace_size(const sk_attention_paged_problem *,
                                                            size_t *) {
    return sk_error(SK_STATUS_NOT_SUPPORTED, SK_VARLEN_NOT_BUILT);
}

extern "C" sk_status sk_cuda_attention_paged_plan(const sk_attention_paged_problem *, void *,
                                                  size_t, struct CUstream_st *) {
    return sk_error(SK_STATUS_NOT_SUPPORTED, SK_VARLEN_NOT_BUILT);
}

extern "C" sk_status sk_cuda_attention_paged_run(const sk_attention_paged_problem *, void *,
                                                 size_t, struct CUstream_st *) {
    return sk_error(SK_STATUS_NOT_SUPPORTED, SK_VARLEN_NOT_BUILT);
}
