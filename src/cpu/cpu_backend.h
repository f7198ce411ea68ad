/*
 * cpu_backend.h - the reference backend: plain loops, fp32 math with fp64
 * reductions, OpenMP threads. Problems arrive validated, with host arrays
 * and a layout that passed sk_layout_validate.
 */
#ifndef SK_CPU_BACKEND_H
#define SK_CPU_BACKEND_H

#include "core/problem.h"

sk_status sk_cpu_attention_run(const sk_attention_problem *p);
sk_status sk_cpu_bsr_gemm_run(const sk_bsr_gemm_problem *p);

#endif /* SK_CPU_BACKEND_H */
