/*
 * bench_check.h - the error checks of the benchmark programs (the .c and
 * .cu files in bench/): a failed CUDA or SparseK call prints where and why
 * on stderr and exits with BENCH_ERROR_EXIT, which a program may define
 * before including this file (default 1). SK_OK exists where sparsek.h was
 * included first.
 */
#ifndef SK_BENCH_CHECK_H
#define SK_BENCH_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#ifndef BENCH_ERROR_EXIT
#define BENCH_ERROR_EXIT 1
#endif

#define CUDA_OK(call)                                                                              \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorName(e_));   \
            exit(BENCH_ERROR_EXIT);                                                                \
        }                                                                                          \
    } while (0)

#ifdef SPARSEK_H
#define SK_OK(call)                                                                                \
    do {                                                                                           \
        sk_status s_ = (call);                                                                     \
        if (s_ != SK_STATUS_SUCCESS) {                                                             \
            fprintf(stderr, "%s:%d: %s: %s: %s\n", __FILE__, __LINE__, #call,                      \
                    sk_status_name(s_), sk_last_error());                                          \
            exit(BENCH_ERROR_EXIT);                                                                \
        }                                                                                          \
    } while (0)
#endif

#endif /* SK_BENCH_CHECK_H */
