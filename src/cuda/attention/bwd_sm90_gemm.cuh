/*
 * bwd_sm90_gemm.cuh - the two wgmma products of both Hopper backward
 * kernels (bwd_sm90_dkv.cu, bwd_sm90_dq_kernel.cuh), on 64-row tiles
 * stored as 64-column slabs of 128-byte rows, 128B-swizzled (the TMA box
 * layout): acc = A B^T with both operands in shared memory (S, dP and
 * their transposes) and acc += A B with A in registers and B read N-major
 * (dV, dK, dQ; as the forward's P V); and the fused kernel's dQ = dS K with
 * both operands in shared memory, read MN-major.
 */
#ifndef SK_CUDA_ATTENTION_BWD_SM90_GEMM_CUH
#define SK_CUDA_ATTENTION_BWD_SM90_GEMM_CUH

#include <stdint.h>

#include "cuda/common/hopper.cuh" /* sk_wgmma_desc_sw128 */
#include "cuda/common/ptx.cuh"
#include "sparsek.h"

/* acc (64 x 64, fp32) = A (64 rows x kD) B^T (64 rows x kD), both K-major
 * in shared memory, their slabs a_slab and b_slab bytes apart: kD / 16
 * wgmma m64n64k16, not committed. Step kk: +32 B inside the swizzle atom,
 * the next slab every 4 steps. */
template <int kDtype, int kD>
__device__ __forceinline__ void sk_bwd90_gemm_ss(float acc[32], uint32_t a_base, uint32_t a_slab,
                                                 uint32_t b_base, uint32_t b_slab) {
    const uint64_t da0 = sk_wgmma_desc_sw128(a_base, 16, 1024);
    const uint64_t db0 = sk_wgmma_desc_sw128(b_base, 16, 1024);
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
        const uint64_t da = da0 + (((kk / 4) * a_slab + (kk % 4) * 32) >> 4);
        const uint64_t db = db0 + (((kk / 4) * b_slab + (kk % 4) * 32) >> 4);
        if constexpr (kDtype == SK_DTYPE_BF16) {
            if (kk == 0)
                sk_wgmma_m64n64k16_ss_bf16_zero(acc, da, db);
            else
                sk_wgmma_m64n64k16_ss_bf16(acc, da, db, 1);
        } else {
            if (kk == 0)
                sk_wgmma_m64n64k16_ss_f16_zero(acc, da, db);
            else
                sk_wgmma_m64n64k16_ss_f16(acc, da, db, 1);
        }
    }
}

/* acc (64 x kD, fp32) += A (64 x 64: register fragments, those of columns
 * 16 kk .. 16 kk + 15 at a + 4 kk) B (64 rows x kD in shared memory, read
 * N-major, slabs b_slab bytes apart): 4 wgmma m64n{kD}k16, not committed.
 * 16 rows of B: two 1024-byte swizzle atoms. */
template <int kDtype, int kD>
__device__ __forceinline__ void sk_bwd90_gemm_rs(float acc[kD / 2], const uint32_t a[16],
                                                 uint32_t b_base, uint32_t b_slab) {
    const uint64_t db0 = sk_wgmma_desc_sw128(b_base, b_slab, 1024);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
        const uint64_t db = db0 + ((kk * 2 * 1024) >> 4);
        if constexpr (kD == 128) {
            if constexpr (kDtype == SK_DTYPE_BF16)
                sk_wgmma_m64n128k16_rs_bf16(acc, a + 4 * kk, db, 1);
            else
                sk_wgmma_m64n128k16_rs_f16(acc, a + 4 * kk, db, 1);
        } else {
            if constexpr (kDtype == SK_DTYPE_BF16)
                sk_wgmma_m64n64k16_rs_bf16(acc, a + 4 * kk, db, 1);
            else
                sk_wgmma_m64n64k16_rs_f16(acc, a + 4 * kk, db, 1);
        }
    }
}

/* The fused kernel's dQ product (bwd_sm90_dkv_dq.cuh): acc (64 queries x 64
 * columns, fp32) = dS K over 16 kSteps keys, with dS^T stored as keys x 64
 * queries (128-byte rows, 128B-swizzled: A read MN-major, transposed) at
 * a_base and one 64-column slab of K (keys x 64, the TMA layout: B read
 * N-major, as gemm_rs reads dO) at b_base; both advance 16 rows (two
 * 1024-byte atoms) a step. Not committed. */
template <int kDtype, int kSteps>
__device__ __forceinline__ void sk_bwd90_gemm_dq(float acc[32], uint32_t a_base, uint32_t b_base) {
    const uint64_t da0 = sk_wgmma_desc_sw128(a_base, 8192, 1024);
    const uint64_t db0 = sk_wgmma_desc_sw128(b_base, 8192, 1024);
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk) {
        const uint64_t step = (uint64_t)((kk * 2 * 1024) >> 4);
        if constexpr (kDtype == SK_DTYPE_BF16) {
            if (kk == 0)
                sk_wgmma_m64n64k16_ss_tt_bf16_zero(acc, da0, db0);
            else
                sk_wgmma_m64n64k16_ss_tt_bf16(acc, da0 + step, db0 + step, 1);
        } else {
            if (kk == 0)
                sk_wgmma_m64n64k16_ss_tt_f16_zero(acc, da0, db0);
            else
                sk_wgmma_m64n64k16_ss_tt_f16(acc, da0 + step, db0 + step, 1);
        }
    }
}

#endif /* SK_CUDA_ATTENTION_BWD_SM90_GEMM_CUH */
