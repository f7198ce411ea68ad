/*
 * dsel.cuh - what the decode selection kernels share (included by the .cu
 * files of src/cuda/decode_select/ only): 16-byte loads and stores of
 * eight fp16 / bf16 channels as fp32, and the device check.
 */
#ifndef SK_CUDA_DECODE_SELECT_DSEL_CUH
#define SK_CUDA_DECODE_SELECT_DSEL_CUH

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "core/decode_select.h"
#include "cuda/common/cuda_check.cuh"

/* One 16-bit value of the dtype as fp32 (exact). */
static __device__ __forceinline__ float dsel_to_f32(uint32_t bits, int bf16) {
    return bf16 ? __uint_as_float(bits << 16) : __half2float(__ushort_as_half((unsigned short)bits));
}

/* A value of the dtype held in fp32 back to its 16 bits (exact: the
 * summaries hold only values of the dtype and +-inf). */
static __device__ __forceinline__ uint32_t dsel_to_bits(float x, int bf16) {
    return bf16 ? __float_as_uint(x) >> 16 : (uint32_t)__half_as_ushort(__float2half_rn(x));
}

/* Eight channels from 16-byte aligned memory. */
static __device__ __forceinline__ void dsel_load8(const uint16_t *src, int bf16, float out[8]) {
    const uint4 v = *reinterpret_cast<const uint4 *>(src);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        out[2 * i] = dsel_to_f32(w[i] & 0xffffu, bf16);
        out[2 * i + 1] = dsel_to_f32(w[i] >> 16, bf16);
    }
}

static __device__ __forceinline__ void dsel_store8(uint16_t *dst, int bf16, const float in[8]) {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
        w[i] = dsel_to_bits(in[2 * i], bf16) | (dsel_to_bits(in[2 * i + 1], bf16) << 16);
    *reinterpret_cast<uint4 *>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
}

/* A usable device of compute capability 8.0 or later (9.0 for CUDA_SM90). */
static inline sk_status dsel_check_device(sk_backend backend) {
    int hopper = 0;
    return sk_cuda_check_arch(backend, &hopper);
}

#endif /* SK_CUDA_DECODE_SELECT_DSEL_CUH */
