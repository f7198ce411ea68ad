/*
 * attention_sm90.cu - placeholder until the Hopper kernel lands: it covers
 * nothing, so the dispatch always picks the portable kernel.
 */
#include "cuda/attention_kernels.h"
#include "cuda/cuda_check.cuh"

int sk_attention_sm90_supports(const sk_attention_problem *p) {
    (void)p;
    return 0;
}

sk_status sk_attention_sm90_launch(const sk_attention_problem *p, const sk_attention_schedule *s,
                                   cudaStream_t stream) {
    (void)p, (void)s, (void)stream;
    return sk_error(SK_STATUS_NOT_SUPPORTED, "the Hopper kernel is not built yet");
}
