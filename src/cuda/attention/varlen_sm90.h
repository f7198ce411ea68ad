/*
 * varlen_sm90.h - the Hopper varlen and paged attention forward
 * (fwd_sm90_varlen.cu): the fixed Hopper kernel (fwd_sm90.cu) in varlen /
 * paged mode, tiles from the varlen plan (varlen_plan.h).
 *
 * What it covers: fp16 / bf16, head_dim 64 or 128, layout blocks 128 x 128,
 * token and head strides (16-byte multiples), GQA, causal (bottom-right per
 * sequence), page_size 16 / 32 / 64 / 128. Anything else gets
 * SK_STATUS_NOT_SUPPORTED with a message, before anything is enqueued: the
 * dispatch (varlen.cu) then runs the portable kernel under SK_BACKEND_CUDA
 * and reports the status under SK_BACKEND_CUDA_SM90. Blocks of 64 are
 * declined: the kernel's tiles are 128 x 128 (docs/perf/varlen_paged_sm90.md
 * says why they are not padded).
 *
 * C linkage: the GPU test suite (tests/gpu/test_attention_varlen_sm90_gpu.c)
 * calls the test entry below from C.
 */
#ifndef SK_CUDA_ATTENTION_VARLEN_SM90_H
#define SK_CUDA_ATTENTION_VARLEN_SM90_H

#include <stddef.h>

#include "core/problem.h"
#include "cuda/attention/varlen_plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* SK_STATUS_SUCCESS when the Hopper kernel covers the call (paged: `paged`
 * non-NULL, v = &paged->v; varlen: paged NULL), else
 * SK_STATUS_NOT_SUPPORTED with the reason. Host only, no device access;
 * the device's compute capability is the caller's to check. */
sk_status sk_attention_sm90_varlen_check(const sk_attention_varlen_problem *v,
                                         const sk_attention_paged_problem *paged);

/* The same test without a message (1: covered, 0: declined): what the
 * dispatch of SK_BACKEND_CUDA asks before falling back to the portable
 * kernel, leaving the thread's last-error text alone. */
int sk_attention_sm90_varlen_supports(const sk_attention_varlen_problem *v,
                                      const sk_attention_paged_problem *paged);

/* Enqueue the kernel on the stream. The plan (sk_varlen_plan_enqueue) must
 * precede it on the stream, and the tile counter (plan->tile_counter) be
 * zero when it starts: the caller zeroes it (varlen.cu's run does, with
 * cudaMemsetAsync). Checks first (as above); nothing is enqueued on
 * failure. Graph safe: no allocation, no synchronisation, no device read
 * on the host. */
sk_status sk_attention_sm90_varlen_launch(const sk_attention_varlen_problem *v,
                                          const sk_attention_paged_problem *paged,
                                          const sk_varlen_plan_view *plan,
                                          struct CUstream_st *stream);

/* Test entry (the GPU suite, test_attention_varlen_sm90_gpu.c: the kernel
 * alone, whatever the dispatch would choose): the plan's workspace size,
 * and plan + counter reset + launch in one call on the workspace (at least
 * that size; any alignment). */
sk_status sk_attention_sm90_varlen_test_workspace(const sk_attention_varlen_problem *v,
                                                  size_t *bytes);
sk_status sk_attention_sm90_varlen_test_run(const sk_attention_varlen_problem *v,
                                            const sk_attention_paged_problem *paged,
                                            void *workspace, size_t workspace_size,
                                            struct CUstream_st *stream);

#ifdef __cplusplus
}
#endif

#endif /* SK_CUDA_ATTENTION_VARLEN_SM90_H */
