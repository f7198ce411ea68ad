/*
 * device_info.cu - device queries and the build text of the CUDA backend.
 * These are the only backend calls that may talk to the driver outside a
 * stream; none of them allocates device memory.
 */
#include <stdio.h>
#include <string.h>

#include "cuda/backend.h"
#include "cuda/common/cuda_check.cuh"

#define SK_STR2(x) #x
#define SK_STR(x) SK_STR2(x)

extern "C" const char *sk_cuda_build_info(void) {
    return "CUDA " SK_STR(__CUDACC_VER_MAJOR__) "." SK_STR(__CUDACC_VER_MINOR__)
           ", kernels for sm_80 and sm_90a";
}

extern "C" sk_status sk_cuda_device_count(int32_t *count) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError(); /* no driver or no GPU: zero devices, not an error */
        n = 0;
    }
    *count = n;
    return SK_STATUS_SUCCESS;
}

extern "C" sk_status sk_cuda_device_get_info(int32_t device, sk_device_info *info) {
    int32_t count = 0;
    sk_cuda_device_count(&count);
    if (device < 0 || device >= count)
        return sk_error(SK_STATUS_BAD_PARAM_VALUE, "device = %d is not in [0, %d)", (int)device,
                        (int)count);
    cudaDeviceProp prop;
    SK_CUDA_TRY(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
    memset(info, 0, sizeof *info);
    snprintf(info->name, sizeof info->name, "%s", prop.name);
    info->cc_major = prop.major;
    info->cc_minor = prop.minor;
    info->sm_count = prop.multiProcessorCount;
    info->memory_bytes = (int64_t)prop.totalGlobalMem;
    info->l2_bytes = (int64_t)prop.l2CacheSize;
    return SK_STATUS_SUCCESS;
}
