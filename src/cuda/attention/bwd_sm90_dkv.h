/*
 * bwd_sm90_dkv.h - what the GPU tests may ask of the Hopper dK/dV kernel
 * of the attention backward (bwd_sm90_dkv.cu): how many times it was
 * launched, so that a test can tell it ran rather than the portable
 * kernel it falls back to. C linkage: tests/gpu is C.
 */
#ifndef SK_CUDA_ATTENTION_BWD_SM90_DKV_H
#define SK_CUDA_ATTENTION_BWD_SM90_DKV_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Launches of the Hopper dK/dV kernel enqueued by this process so far
 * (counted when enqueued: a captured graph counts once, at capture). */
int64_t sk_bwd90_dkv_launches(void);

/* Of those, the launches of its fused form (bwd->deterministic = 0: dQ
 * added into the workspace's fp32 dQaccum in the same pass). */
int64_t sk_bwd90_fused_launches(void);

#ifdef __cplusplus
}
#endif

#endif /* SK_CUDA_ATTENTION_BWD_SM90_DKV_H */
