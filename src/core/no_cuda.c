/*
 * no_cuda.c - the CUDA backend's stand-in for builds without nvcc (and for
 * the sanitizer build): every call of src/cuda/backend.h reports that the
 * backend is absent, and the device count is 0.
 */
#include "core/internal.h"
#include "cuda/backend.h"

#ifdef SK_NO_CUDA

#define SK_NO_CUDA_TEXT "this SparseK was built without CUDA (no nvcc at build time)"

sk_status sk_cuda_device_count(int32_t *count) {
    *count = 0;
    return SK_STATUS_SUCCESS;
}

sk_status sk_cuda_device_get_info(int32_t device, sk_device_info *info) {
    (void)info;
    return sk_error(SK_STATUS_BAD_PARAM_VALUE, "device = %d: there are no devices; %s", (int)device,
                    SK_NO_CUDA_TEXT);
}

const char *sk_cuda_build_info(void) { return "no CUDA"; }

sk_status sk_cuda_attention_workspace_size(const sk_attention_problem *p, size_t *bytes) {
    (void)p;
    (void)bytes;
    return sk_error(SK_STATUS_NOT_SUPPORTED_BACKEND, SK_NO_CUDA_TEXT);
}

sk_status sk_cuda_attention_plan(const sk_attention_problem *p, void *workspace,
                                 size_t workspace_size, struct CUstream_st *stream) {
    (void)p, (void)workspace, (void)workspace_size, (void)stream;
    return sk_error(SK_STATUS_NOT_SUPPORTED_BACKEND, SK_NO_CUDA_TEXT);
}

sk_status sk_cuda_attention_run(const sk_attention_problem *p, void *workspace,
                                size_t workspace_size, struct CUstream_st *stream) {
    (void)p, (void)workspace, (void)workspace_size, (void)stream;
    return sk_error(SK_STATUS_NOT_SUPPORTED_BACKEND, SK_NO_CUDA_TEXT);
}

sk_status sk_cuda_attention_carry_supported(const sk_attention_problem *p, int *supported) {
    (void)p, (void)supported;
    return sk_error(SK_STATUS_NOT_SUPPORTED_BACKEND, SK_NO_CUDA_TEXT);
}

sk_status sk_cuda_attention_backward_workspace_size(const sk_attention_backward_problem *p,
                                                    size_t *bytes) {
    (void)p, (void)bytes;
    return sk_error(SK_STATUS_NOT_SUPPORTED_BACKEND, SK_NO_CUDA_TEXT);
}

sk_status sk_cuda_attention_backward_plan(const sk_attention_backward_problem *p, void *workspace,
                                          size_t workspace_size, struct CUstream_st *stream) {
    (void)p, (void)workspace, (void)workspace_size, (void)stream;
    return sk_error(SK_STATUS_NOT_SUPPORTED_BACKEND, SK_NO_CUDA_TEXT);
}

sk_status sk_cuda_attention_backward_run(const sk_attention_backward_problem *p, void *workspace,
                                         size_t workspace_size, struct CUstream_st *stream) {
    (void)p, (void)workspace, (void)workspace_size, (void)stream;
    return sk_error(SK_STATUS_NOT_SUPPORTED_BACKEND, SK_NO_CUDA_TEXT);
}

sk_status sk_cuda_attention_varlen_workspace_size(const sk_attention_varlen_problem *p,
                                                  size_t *bytes) {
    (void)p, (void)bytes;
    return sk_error(SK_STATUS_NOT_SUPPORTED_BACKEND, SK_NO_CUDA_TEXT);
}

sk_status sk_cuda_attention_varlen_plan(const sk_attention_varlen_problem *p, void *workspace,
                                        size_t workspace_size, struct CUstream_st *stream) {
    (void)p, (void)workspace, (void)workspace_size, (void)stream;
    return sk_error(SK_STATUS_NOT_SUPPORTED_BACKEND, SK_NO_CUDA_TEXT);
}

sk_status sk_cuda_attention_varlen_run(const sk_attention_varlen_problem *p, void *workspace,
                                       size_t workspace_size, struct CUstream_st *stream) {
    (void)p, (void)workspace, (void)workspace_size, (void)stream;
    return sk_error(SK_STATUS_NOT_SUPPORTED_BACKEND, SK_NO_CUDA_TEXT);
}

sk_status sk_cuda_attention_paged_workspace_size(const sk_attention_paged_problem *p,
                                                 size_t *bytes) {
    (void)p, (void)bytes;
    return sk_error(SK_STATUS_NOT_SUPPORTED_BACKEND, SK_NO_CUDA_TEXT);
}

sk_status sk_cuda_attention_paged_plan(const sk_attention_paged_problem *p, void *workspace,
                                       size_t workspace_size, struct CUstream_st *stream) {
    (void)p, (void)workspace, (void)workspace_size, (void)stream;
    return sk_error(SK_STATUS_NOT_SUPPORTED_BACKEND, SK_NO_CUDA_TEXT);
}

sk_status sk_cuda_attention_paged_run(const sk_attention_paged_problem *p, void *workspace,
                                      size_t workspace_size, struct CUstream_st *stream) {
    (void)p, (void)workspace, (void)workspace_size, (void)stream;
    return sk_error(SK_STATUS_NOT_SUPPORTED_BACKEND, SK_NO_CUDA_TEXT);
}

sk_status sk_cuda_bsr_gemm_workspace_size(const sk_bsr_gemm_problem *p, size_t *bytes) {
    (void)p;
    (void)bytes;
    return sk_error(SK_STATUS_NOT_SUPPORTED_BACKEND, SK_NO_CUDA_TEXT);
}

sk_status sk_cuda_bsr_gemm_plan(const sk_bsr_gemm_problem *p, void *workspace,
                                size_t workspace_size, struct CUstream_st *stream) {
    (void)p, (void)workspace, (void)workspace_size, (void)stream;
    return sk_error(SK_STATUS_NOT_SUPPORTED_BACKEND, SK_NO_CUDA_TEXT);
}

sk_status sk_cuda_bsr_gemm_run(const sk_bsr_gemm_problem *p, void *workspace,
                               size_t workspace_size, struct CUstream_st *stream) {
    (void)p, (void)workspace, (void)workspace_size, (void)stream;
    return sk_error(SK_STATUS_NOT_SUPPORTED_BACKEND, SK_NO_CUDA_TEXT);
}

sk_status sk_cuda_topk_workspace_size(const sk_topk_problem *p, int with_scores, size_t *bytes) {
    (void)p, (void)with_scores, (void)bytes;
    return sk_error(SK_STATUS_NOT_SUPPORTED_BACKEND, SK_NO_CUDA_TEXT);
}

sk_status sk_cuda_topk_pool(const sk_topk_problem *p, struct CUstream_st *stream) {
    (void)p, (void)stream;
    return sk_error(SK_STATUS_NOT_SUPPORTED_BACKEND, SK_NO_CUDA_TEXT);
}

sk_status sk_cuda_topk_select(const sk_topk_problem *p, void *workspace, size_t workspace_size,
                              struct CUstream_st *stream) {
    (void)p, (void)workspace, (void)workspace_size, (void)stream;
    return sk_error(SK_STATUS_NOT_SUPPORTED_BACKEND, SK_NO_CUDA_TEXT);
}

sk_status sk_cuda_topk_pool_select_workspace_size(const sk_topk_problem *p, size_t *bytes) {
    (void)p, (void)bytes;
    return sk_error(SK_STATUS_NOT_SUPPORTED_BACKEND, SK_NO_CUDA_TEXT);
}

sk_status sk_cuda_topk_pool_select(const sk_topk_problem *p, void *workspace,
                                   size_t workspace_size, struct CUstream_st *stream) {
    (void)p, (void)workspace, (void)workspace_size, (void)stream;
    return sk_error(SK_STATUS_NOT_SUPPORTED_BACKEND, SK_NO_CUDA_TEXT);
}

sk_status sk_cuda_topk_varlen_workspace_size(const sk_topk_varlen_problem *p, size_t *bytes) {
    (void)p, (void)bytes;
    return sk_error(SK_STATUS_NOT_SUPPORTED_BACKEND, SK_NO_CUDA_TEXT);
}

sk_status sk_cuda_topk_varlen_select(const sk_topk_varlen_problem *p, void *workspace,
                                     size_t workspace_size, struct CUstream_st *stream) {
    (void)p, (void)workspace, (void)workspace_size, (void)stream;
    return sk_error(SK_STATUS_NOT_SUPPORTED_BACKEND, SK_NO_CUDA_TEXT);
}

sk_status sk_cuda_decode_splits(const sk_decode_problem *p, int32_t *num_splits) {
    (void)p, (void)num_splits;
    return sk_error(SK_STATUS_NOT_SUPPORTED_BACKEND, SK_NO_CUDA_TEXT);
}

sk_status sk_cuda_decode_workspace_size(const sk_decode_problem *p, size_t *bytes) {
    (void)p, (void)bytes;
    return sk_error(SK_STATUS_NOT_SUPPORTED_BACKEND, SK_NO_CUDA_TEXT);
}

sk_status sk_cuda_decode_plan(const sk_decode_problem *p, void *workspace, size_t workspace_size,
                              struct CUstream_st *stream) {
    (void)p, (void)workspace, (void)workspace_size, (void)stream;
    return sk_error(SK_STATUS_NOT_SUPPORTED_BACKEND, SK_NO_CUDA_TEXT);
}

sk_status sk_cuda_decode_run(const sk_decode_problem *p, void *workspace, size_t workspace_size,
                             struct CUstream_st *stream) {
    (void)p, (void)workspace, (void)workspace_size, (void)stream;
    return sk_error(SK_STATUS_NOT_SUPPORTED_BACKEND, SK_NO_CUDA_TEXT);
}

sk_status sk_cuda_dsel_summary(const sk_dsel_problem *p, int append, struct CUstream_st *stream) {
    (void)p, (void)append, (void)stream;
    return sk_error(SK_STATUS_NOT_SUPPORTED_BACKEND, SK_NO_CUDA_TEXT);
}

sk_status sk_cuda_dsel_workspace_size(const sk_dsel_problem *p, size_t *bytes) {
    (void)p, (void)bytes;
    return sk_error(SK_STATUS_NOT_SUPPORTED_BACKEND, SK_NO_CUDA_TEXT);
}

sk_status sk_cuda_dsel_select(const sk_dsel_problem *p, void *workspace, size_t workspace_size,
                              struct CUstream_st *stream) {
    (void)p, (void)workspace, (void)workspace_size, (void)stream;
    return sk_error(SK_STATUS_NOT_SUPPORTED_BACKEND, SK_NO_CUDA_TEXT);
}

sk_status sk_cuda_quantize_e4m3_workspace_size(const sk_quantize_problem *p, size_t *bytes) {
    (void)p, (void)bytes;
    return sk_error(SK_STATUS_NOT_SUPPORTED_BACKEND, SK_NO_CUDA_TEXT);
}

sk_status sk_cuda_quantize_e4m3(const sk_quantize_problem *p, void *workspace,
                                size_t workspace_size, struct CUstream_st *stream) {
    (void)p, (void)workspace, (void)workspace_size, (void)stream;
    return sk_error(SK_STATUS_NOT_SUPPORTED_BACKEND, SK_NO_CUDA_TEXT);
}

sk_status sk_cuda_cp_streams_create(void **out) {
    (void)out;
    return sk_error(SK_STATUS_NOT_SUPPORTED_BACKEND, SK_NO_CUDA_TEXT);
}

void sk_cuda_cp_streams_destroy(void *streams) { (void)streams; }

sk_status sk_cuda_cp_fork(void *streams, struct CUstream_st *stream, struct CUstream_st **side) {
    (void)streams, (void)stream, (void)side;
    return sk_error(SK_STATUS_NOT_SUPPORTED_BACKEND, SK_NO_CUDA_TEXT);
}

sk_status sk_cuda_cp_join(void *streams, struct CUstream_st *stream) {
    (void)streams, (void)stream;
    return sk_error(SK_STATUS_NOT_SUPPORTED_BACKEND, SK_NO_CUDA_TEXT);
}

sk_status sk_cuda_copy_async(void *dst, const void *src, size_t bytes, struct CUstream_st *stream) {
    (void)dst, (void)src, (void)bytes, (void)stream;
    return sk_error(SK_STATUS_NOT_SUPPORTED_BACKEND, SK_NO_CUDA_TEXT);
}

sk_status sk_cuda_stream_sync(struct CUstream_st *stream) {
    (void)stream;
    return sk_error(SK_STATUS_NOT_SUPPORTED_BACKEND, SK_NO_CUDA_TEXT);
}

sk_status sk_cuda_cp_copy_units(const sk_cp_copy_problem *p, struct CUstream_st *stream) {
    (void)p, (void)stream;
    return sk_error(SK_STATUS_NOT_SUPPORTED_BACKEND, SK_NO_CUDA_TEXT);
}

sk_status sk_cuda_cp_merge(const sk_cp_merge_problem *p, struct CUstream_st *stream) {
    (void)p, (void)stream;
    return sk_error(SK_STATUS_NOT_SUPPORTED_BACKEND, SK_NO_CUDA_TEXT);
}

sk_status sk_cuda_cp_rows(const sk_cp_rows_problem *p, struct CUstream_st *stream) {
    (void)p, (void)stream;
    return sk_error(SK_STATUS_NOT_SUPPORTED_BACKEND, SK_NO_CUDA_TEXT);
}

sk_status sk_cuda_cp_sum(const sk_cp_sum_problem *p, struct CUstream_st *stream) {
    (void)p, (void)stream;
    return sk_error(SK_STATUS_NOT_SUPPORTED_BACKEND, SK_NO_CUDA_TEXT);
}

sk_status sk_cuda_cp_grad_units(const sk_cp_grad_problem *p, struct CUstream_st *stream) {
    (void)p, (void)stream;
    return sk_error(SK_STATUS_NOT_SUPPORTED_BACKEND, SK_NO_CUDA_TEXT);
}

sk_status sk_cuda_cp_zero(void *ptr, size_t bytes, struct CUstream_st *stream) {
    (void)ptr, (void)bytes, (void)stream;
    return sk_error(SK_STATUS_NOT_SUPPORTED_BACKEND, SK_NO_CUDA_TEXT);
}

sk_status sk_cuda_attention_varlen_backward_workspace_size(
    const sk_attention_varlen_backward_problem *p, size_t *bytes) {
    (void)p, (void)bytes;
    return sk_error(SK_STATUS_NOT_SUPPORTED_BACKEND, SK_NO_CUDA_TEXT);
}

sk_status sk_cuda_attention_varlen_backward_plan(const sk_attention_varlen_backward_problem *p,
                                                 void *workspace, size_t workspace_size,
                                                 struct CUstream_st *stream) {
    (void)p, (void)workspace, (void)workspace_size, (void)stream;
    return sk_error(SK_STATUS_NOT_SUPPORTED_BACKEND, SK_NO_CUDA_TEXT);
}

sk_status sk_cuda_attention_varlen_backward_run(const sk_attention_varlen_backward_problem *p,
                                                void *workspace, size_t workspace_size,
                                                struct CUstream_st *stream) {
    (void)p, (void)workspace, (void)workspace_size, (void)stream;
    return sk_error(SK_STATUS_NOT_SUPPORTED_BACKEND, SK_NO_CUDA_TEXT);
}

#else
/* Built with CUDA: src/cuda/ provides these. ISO C wants a declaration. */
typedef int sk_no_cuda_unused;
#endif
