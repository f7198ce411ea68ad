/*
 * cuda_api.h - the CUDA runtime API for the C99 test suite. The header uses
 * unnamed unions, which -Wpedantic rejects in C99: silence that for the
 * include only.
 */
#ifndef SK_TESTS_GPU_CUDA_API_H
#define SK_TESTS_GPU_CUDA_API_H

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpedantic"
#include <cuda_runtime_api.h>
#pragma GCC diagnostic pop

#endif /* SK_TESTS_GPU_CUDA_API_H */
