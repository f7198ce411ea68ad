/*
 * bwd_sm90_dkv.cu - the Hopper (sm_90a) kernel of the attention backward's
 * dK/dV pass (bwd_kernels.h). Not written yet: it declines every
 * problem, so the portable kernel (bwd_sm80.cu) runs the pass.
 */
#include "cuda/attention/bwd_kernels.h"
#include "cuda/attention/bwd_params.h"

sk_status sk_attention_bwd_sm90_dkv_launch(const sk_attention_backward_problem *bp,
                                           const sk_bwd_shape *s, const struct sk_bwd_params *k,
                                           cudaStream_t stream, int *launched) {
    (void)bp;
    (void)s;
    (void)k;
    (void)stream;
    *launched = 0;
    return SK_STATUS_SUCCESS;
}
