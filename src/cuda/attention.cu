/* STUB */
#include "cuda/backend.h"
#include "cuda/cuda_check.cuh"
extern "C" sk_status sk_cuda_attention_workspace_size(const sk_attention_problem *p, size_t *bytes) { (void)p; *bytes = 0; return sk_error(SK_STATUS_NOT_SUPPORTED, "stub"); }
extern "C" sk_status sk_cuda_attention_plan(const sk_attention_problem *p, void *w, size_t n, cudaStream_t s) { (void)p, (void)w, (void)n, (void)s; return sk_error(SK_STATUS_NOT_SUPPORTED, "stub"); }
extern "C" sk_status sk_cuda_attention_run(const sk_attention_problem *p, void *w, size_t n, cudaStream_t s) { (void)p, (void)w, (void)n, (void)s; return sk_error(SK_STATUS_NOT_SUPPORTED, "stub"); }
