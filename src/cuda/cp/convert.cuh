/*
 * convert.cuh - the element conversions of the context-parallel kernels
 * (cp.cu, cp_bwd.cu): F16 / BF16 widened to fp32 and fp32 rounded back to
 * nearest even.
 */
#ifndef SK_CUDA_CP_CONVERT_CUH
#define SK_CUDA_CP_CONVERT_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>

template <typename T> __device__ __forceinline__ float sk_cp_to_f32(T x);
template <> __device__ __forceinline__ float sk_cp_to_f32<__half>(__half x) {
    return __half2float(x);
}
template <> __device__ __forceinline__ float sk_cp_to_f32<__nv_bfloat16>(__nv_bfloat16 x) {
    return __bfloat162float(x);
}
template <typename T> __device__ __forceinline__ T sk_cp_from_f32(float x);
template <> __device__ __forceinline__ __half sk_cp_from_f32<__half>(float x) {
    return __float2half_rn(x);
}
template <> __device__ __forceinline__ __nv_bfloat16 sk_cp_from_f32<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}

#endif /* SK_CUDA_CP_CONVERT_CUH */
