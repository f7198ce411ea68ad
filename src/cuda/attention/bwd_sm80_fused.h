/*
 * bwd_sm80_fused.h - what the GPU tests may ask of the portable fused
 * attention backward (bwd->deterministic = 0 off the Hopper kernels;
 * bwd_sm80.cu, bwd_sm80_fused.cuh): how many times it was launched, so
 * that a test can tell it ran rather than the two deterministic passes.
 * C linkage: tests/gpu is C.
 */
#ifndef SK_CUDA_ATTENTION_BWD_SM80_FUSED_H
#define SK_CUDA_ATTENTION_BWD_SM80_FUSED_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Launches of the portable fused pass enqueued by this process so far
 * (counted when enqueued: a captured graph counts once, at capture). */
int64_t sk_bwd80_fused_launches(void);

#ifdef __cplusplus
}
#endif

#endif /* SK_CUDA_ATTENTION_BWD_SM80_FUSED_H */
