/*
 * bwd_sm90_dq.h - what the outside may ask of the Hopper backward dQ
 * kernel (bwd_sm90_dq.cu): a test query, so that the GPU suite can tell
 * that the Hopper pass ran rather than the portable one (a silent fallback
 * would pass the comparisons). C linkage: tests/gpu/ calls it from C.
 */
#ifndef SK_CUDA_ATTENTION_BWD_SM90_DQ_H
#define SK_CUDA_ATTENTION_BWD_SM90_DQ_H

#ifdef __cplusplus
extern "C" {
#endif

/* How many times the Hopper dQ pass has been enqueued in this process
 * (every backward run that took it, CUDA graph captures included; replays
 * are not counted). */
int sk_bwd90_dq_launches(void);

#ifdef __cplusplus
}
#endif

#endif /* SK_CUDA_ATTENTION_BWD_SM90_DQ_H */
