/*
 * sm80_common.cuh - what the portable (sm_80+) attention kernels share:
 * the mma.sync of a dtype, the packing of two floats into a dtype pair,
 * and the cp.async loaders of one warp's rows into swizzled shared memory
 * (fwd_sm80.cu, bwd_sm80.cu).
 *
 * Shared-memory tiles are rows of D fp16/bf16 values (D / 8 chunks of 16
 * bytes); chunk c of row r is stored at chunk c ^ (r % 8) of that row, so
 * that ldmatrix (8 rows, one chunk each), cp.async and 16-byte row stores
 * are free of bank conflicts.
 */
#ifndef SK_CUDA_ATTENTION_SM80_COMMON_CUH
#define SK_CUDA_ATTENTION_SM80_COMMON_CUH

#include <stdint.h>

#include "cuda/common/ptx.cuh"
#include "sparsek.h"

/* d += a * b for one m16n8k16 tile in the dtype (fp32 accumulation). */
template <int kDtype>
__device__ __forceinline__ void sk_sm80_mma(float d[4], const uint32_t a[4], const uint32_t b0,
                                            const uint32_t b1) {
    const uint32_t b[2] = {b0, b1};
    if constexpr (kDtype == SK_DTYPE_F16)
        sk_mma_m16n8k16_f16(d, a, b);
    else
        sk_mma_m16n8k16_bf16(d, a, b);
}

/* Two floats as the dtype's packed pair, `lo` in the low half. */
template <int kDtype>
__device__ __forceinline__ uint32_t sk_sm80_pack(float lo, float hi) {
    if constexpr (kDtype == SK_DTYPE_F16)
        return sk_cvt_f16x2(hi, lo);
    else
        return sk_cvt_bf16x2(hi, lo);
}

/* cp.async one warp's kRows rows of a tile into swizzled shared memory:
 * dst and src address the warp's first row, a multiple of 8 in the tile
 * (so its swizzle is that of row 0); rows at or past valid_rows (which may
 * be <= 0) are zero-filled from `safe` (an in-bounds address; src-size 0
 * reads nothing). Lane l copies 16-byte column l % (D / 8) of rows
 * l / (D / 8), + 32 / (D / 8), ...: 2 or 4 whole rows per instruction, as
 * coalesced as one CTA-wide row set. Only this warp touches these rows
 * until the next CTA barrier, so a warp may refill rows it alone has read
 * after a __syncwarp. */
template <int kD, int kRows>
__device__ __forceinline__ void sk_sm80_load_rows_warp(uint32_t dst, const char *src,
                                                       int32_t stride, int valid_rows,
                                                       const char *safe) {
    constexpr int kChunks = kD / 8, kStep = 32 / kChunks;
    static_assert(8 % kStep == 0 && kRows % kStep == 0, "loader rows must keep the swizzle");
    const int lane = threadIdx.x & 31;
    const int c = lane % kChunks, r0 = lane / kChunks;
    /* Row r0 + k kStep has swizzle (r0 + k kStep) & 7 = r0 ^ ((k kStep) & 7)
     * (r0 < kStep, both powers of two). */
    const uint32_t d0 = dst + (uint32_t)(r0 * kD * 2), cx = (uint32_t)(c ^ r0);
    const char *s0 = src + ((uint32_t)r0 * (uint32_t)stride + (uint32_t)c * 16u);
    const uint32_t step = (uint32_t)kStep * (uint32_t)stride;
    if (valid_rows >= kRows) { /* the common case: every row exists */
#pragma unroll
        for (int k = 0; k < kRows / kStep; ++k)
            sk_cp_async_16(d0 + (uint32_t)(k * kStep * kD * 2) +
                               ((cx ^ (uint32_t)((k * kStep) & 7)) << 4),
                           s0 + k * step, 16u);
        return;
    }
#pragma unroll
    for (int k = 0; k < kRows / kStep; ++k) {
        const bool ok = r0 + k * kStep < valid_rows;
        sk_cp_async_16(d0 + (uint32_t)(k * kStep * kD * 2) +
                           ((cx ^ (uint32_t)((k * kStep) & 7)) << 4),
                       ok ? s0 + k * step : safe, ok ? 16u : 0u);
    }
}

/* cp.async one warp's kRows rows into swizzled shared memory, as
 * sk_sm80_load_rows_warp, but only rows lo <= r < hi (either may lie
 * outside [0, kRows)) are read; the others are zero-filled from `safe`. */
template <int kD, int kRows>
__device__ __forceinline__ void sk_sm80_load_rows_range_warp(uint32_t dst, const char *src,
                                                             int32_t stride, int lo, int hi,
                                                             const char *safe) {
    if (lo <= 0) {
        sk_sm80_load_rows_warp<kD, kRows>(dst, src, stride, hi, safe);
        return;
    }
    constexpr int kChunks = kD / 8, kStep = 32 / kChunks;
    const int lane = threadIdx.x & 31;
    const int c = lane % kChunks, r0 = lane / kChunks;
    const uint32_t d0 = dst + (uint32_t)(r0 * kD * 2), cx = (uint32_t)(c ^ r0);
    const char *s0 = src + ((uint32_t)r0 * (uint32_t)stride + (uint32_t)c * 16u);
    const uint32_t step = (uint32_t)kStep * (uint32_t)stride;
#pragma unroll
    for (int k = 0; k < kRows / kStep; ++k) {
        const int r = r0 + k * kStep;
        const bool ok = r >= lo && r < hi;
        sk_cp_async_16(d0 + (uint32_t)(k * kStep * kD * 2) +
                           ((cx ^ (uint32_t)((k * kStep) & 7)) << 4),
                       ok ? s0 + k * step : safe, ok ? 16u : 0u);
    }
}

#endif /* SK_CUDA_ATTENTION_SM80_COMMON_CUH */
