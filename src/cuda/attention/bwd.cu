/*
 * bwd.cu - the dispatch of the CUDA attention backward (the
 * sk_cuda_attention_backward_* calls of backend.h).
 *
 * Not built yet (issue 29, step 1): the API, the core's checks and the CPU
 * reference exist; these three answer SK_STATUS_NOT_SUPPORTED and touch
 * nothing. The core calls them only after every argument check, so a bad
 * argument gets the same status on every backend. docs/perf/backward.md
 * is the design their bodies will follow: the workspace (the layout's
 * transpose, the per-row D = rowsum(dO * O), the tile orders), the plan
 * that fills it on the GPU, and the deterministic dQ and dK/dV passes.
 */
#include "core/internal.h"
#include "cuda/backend.h"

#define SK_BWD_NOT_BUILT                                                                           \
    "the CUDA attention backward is not built yet (issue 29); use SK_BACKEND_CPU for the "         \
    "reference backward"

extern "C" sk_status sk_cuda_attention_backward_workspace_size(const sk_attention_backward_problem *,
                                                               size_t *) {
    return sk_error(SK_STATUS_NOT_SUPPORTED, SK_BWD_NOT_BUILT);
}

extern "C" sk_status sk_cuda_attention_backward_plan(const sk_attention_backward_problem *, void *,
                                                     size_t, struct CUstream_st *) {
    return sk_error(SK_STATUS_NOT_SUPPORTED, SK_BWD_NOT_BUILT);
}

extern "C" sk_status sk_cuda_attention_backward_run(const sk_attention_backward_problem *, void *,
                                                    size_t, struct CUstream_st *) {
    return sk_error(SK_STATUS_NOT_SUPPORTED, SK_BWD_NOT_BUILT);
}
