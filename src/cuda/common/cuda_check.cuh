/*
 * cuda_check.cuh - turning CUDA runtime errors into SparseK statuses.
 * A failed CUDA call becomes SK_STATUS_EXECUTION_FAILED with a text that
 * keeps cudaGetErrorName, e.g. "sk_attention_run: kernel launch:
 * cudaErrorInvalidValue (invalid argument)".
 */
#ifndef SK_CUDA_CHECK_CUH
#define SK_CUDA_CHECK_CUH

#include <cuda_runtime.h>

#include "core/internal.h"

static inline sk_status sk_cuda_status(cudaError_t err, const char *what) {
    if (err == cudaSuccess) return SK_STATUS_SUCCESS;
    return sk_error(SK_STATUS_EXECUTION_FAILED, "%s: %s (%s)", what, cudaGetErrorName(err),
                    cudaGetErrorString(err));
}

#define SK_CUDA_TRY(call, what) SK_TRY(sk_cuda_status((call), (what)))

/* The current device's compute capability, or a status when there is no
 * usable device (SK_STATUS_NOT_SUPPORTED_BACKEND: nothing was enqueued). */
static inline sk_status sk_cuda_current_cc(int *device, int *major, int *minor) {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
        (void)cudaGetLastError(); /* clear the sticky no-device error */
        return sk_error(SK_STATUS_NOT_SUPPORTED_BACKEND, "no CUDA device is usable (%s)",
                        err != cudaSuccess ? cudaGetErrorName(err) : "device count 0");
    }
    SK_CUDA_TRY(cudaGetDevice(device), "cudaGetDevice");
    /* Bind the device's primary context to this thread: a thread that
     * never called cudaSetDevice has none current, and the driver calls
     * behind the kernels' choice (tensor-map encoding) then fail, which
     * silently took SK_BACKEND_CUDA to the portable kernel in such threads. */
    SK_CUDA_TRY(cudaSetDevice(*device), "cudaSetDevice");
    SK_CUDA_TRY(cudaDeviceGetAttribute(major, cudaDevAttrComputeCapabilityMajor, *device),
                "cudaDeviceGetAttribute");
    SK_CUDA_TRY(cudaDeviceGetAttribute(minor, cudaDevAttrComputeCapabilityMinor, *device),
                "cudaDeviceGetAttribute");
    return SK_STATUS_SUCCESS;
}

/* What the attention and GEMM dispatch both require of the current device:
 * compute capability 8.0 or later (else SK_STATUS_NOT_SUPPORTED_BACKEND),
 * and 9.0 when the backend forces the Hopper kernel (else
 * SK_STATUS_NOT_SUPPORTED). *hopper: whether the device is 9.0. */
static inline sk_status sk_cuda_check_arch(sk_backend backend, int *hopper) {
    int device = 0, major = 0, minor = 0;
    SK_TRY(sk_cuda_current_cc(&device, &major, &minor));
    if (major < 8)
        return sk_error(SK_STATUS_NOT_SUPPORTED_BACKEND,
                        "device %d has compute capability %d.%d; the CUDA backend needs 8.0 or "
                        "later",
                        device, major, minor);
    *hopper = major == 9 && minor == 0;
    if (backend == SK_BACKEND_CUDA_SM90 && !*hopper)
        return sk_error(SK_STATUS_NOT_SUPPORTED,
                        "backend SK_BACKEND_CUDA_SM90 needs compute capability 9.0; device "
                        "%d has %d.%d (use SK_BACKEND_CUDA)",
                        device, major, minor);
    return SK_STATUS_SUCCESS;
}

#endif /* SK_CUDA_CHECK_CUH */
