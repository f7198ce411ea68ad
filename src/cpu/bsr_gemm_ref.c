/* STUB */
#include "core/internal.h"
#include "cpu/cpu_backend.h"
sk_status sk_cpu_bsr_gemm_run(const sk_bsr_gemm_problem *p) { (void)p; return sk_error(SK_STATUS_INTERNAL_ERROR, "stub"); }
