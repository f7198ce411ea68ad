/* STUB */
#include "core/internal.h"
#include "cpu/cpu_backend.h"
sk_status sk_cpu_attention_run(const sk_attention_problem *p) { (void)p; return sk_error(SK_STATUS_INTERNAL_ERROR, "stub"); }
