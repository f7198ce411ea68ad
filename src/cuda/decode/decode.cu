/* decode.cu - placeholder (replaced by the kernel dispatch in the next commit). */
#include "core/internal.h"
#include "cuda/backend.h"

#define SK_DECODE_NOT_BUILT "the CUDA decode kernel is not built yet"

extern "C" sk_status sk_cuda_decode_splits(const sk_decode_problem *, int32_t *) {
    return sk_error(SK_STATUS_NOT_SUPPORTED, SK_DECODE_NOT_BUILT);
}
extern "C" sk_status sk_cuda_decode_workspace_size(const sk_decode_problem *, size_t *) {
    return sk_error(SK_STATUS_NOT_SUPPORTED, SK_DECODE_NOT_BUILT);
}
extern "C" sk_status sk_cuda_decode_plan(const sk_decode_problem *, void *, size_t,
                                         struct CUstream_st *) {
    return sk_error(SK_STATUS_NOT_SUPPORTED, SK_DECODE_NOT_BUILT);
}
extern "C" sk_status sk_cuda_decode_run(const sk_decode_problem *, void *, size_t,
                                        struct CUstream_st *) {
    return sk_error(SK_STATUS_NOT_SUPPORTED, SK_DECODE_NOT_BUILT);
}
