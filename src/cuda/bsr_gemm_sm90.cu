/*
 * bsr_gemm_sm90.cu - the Hopper BSR GEMM kernel (placeholder).
 */
#include "cuda/bsr_gemm_kernels.h"
#include "cuda/cuda_check.cuh"

int sk_bsr_gemm_sm90_supports(const sk_bsr_gemm_problem *p) {
    (void)p;
    return 0;
}

sk_status sk_bsr_gemm_sm90_launch(const sk_bsr_gemm_problem *p, const sk_bsr_gemm_schedule *s,
                                  cudaStream_t stream) {
    (void)p, (void)s, (void)stream;
    return sk_error(SK_STATUS_NOT_SUPPORTED, "the Hopper BSR GEMM is not built yet");
}
