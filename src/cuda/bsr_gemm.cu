/*
 * bsr_gemm.cu - CUDA BSR GEMM dispatch. No GPU kernel yet (issue: BSR GEMM
 * on Hopper): every call reports SK_STATUS_NOT_SUPPORTED.
 */
#include "cuda/backend.h"
#include "cuda/cuda_check.cuh"

extern "C" sk_status sk_cuda_bsr_gemm_workspace_size(const sk_bsr_gemm_problem *p, size_t *bytes) {
    (void)p;
    (void)bytes;
    return sk_error(SK_STATUS_NOT_SUPPORTED, "the CUDA BSR GEMM is not implemented yet; use the CPU backend");
}

extern "C" sk_status sk_cuda_bsr_gemm_plan(const sk_bsr_gemm_problem *p, void *workspace,
                                           size_t workspace_size, cudaStream_t stream) {
    (void)p, (void)workspace, (void)workspace_size, (void)stream;
    return sk_error(SK_STATUS_NOT_SUPPORTED, "the CUDA BSR GEMM is not implemented yet; use the CPU backend");
}

extern "C" sk_status sk_cuda_bsr_gemm_run(const sk_bsr_gemm_problem *p, void *workspace,
                                          size_t workspace_size, cudaStream_t stream) {
    (void)p, (void)workspace, (void)workspace_size, (void)stream;
    return sk_error(SK_STATUS_NOT_SUPPORTED, "the CUDA BSR GEMM is not implemented yet; use the CPU backend");
}
