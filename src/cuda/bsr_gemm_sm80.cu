/*
 * bsr_gemm_sm80.cu - the portable BSR GEMM kernel (placeholder until the
 * kernel lands: every call reports SK_STATUS_NOT_SUPPORTED).
 */
#include "cuda/bsr_gemm_kernels.h"
#include "cuda/cuda_check.cuh"

sk_status sk_bsr_gemm_sm80_launch(const sk_bsr_gemm_problem *p, const sk_bsr_gemm_schedule *s,
                                  cudaStream_t stream) {
    (void)p, (void)s, (void)stream;
    return sk_error(SK_STATUS_NOT_SUPPORTED, "the portable CUDA BSR GEMM is not built yet");
}
