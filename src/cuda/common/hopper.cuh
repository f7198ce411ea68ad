/*
 * hopper.cuh - small device helpers the Hopper kernels (attention/fwd_sm90.cu,
 * gemm/gemm_sm90.cu, the top-k scoring) share, built on ptx.cuh's wrappers
 * (no inline PTX here). The swizzle offset is plain arithmetic, also used
 * by the portable pooling kernel (topk/pool.cu) when it writes split
 * operands.
 */
#ifndef SK_CUDA_HOPPER_CUH
#define SK_CUDA_HOPPER_CUH

#include <stdint.h>

#include "cuda/common/ptx.cuh"

#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
#ifdef SK_MBAR_WATCHDOG
#include <stdio.h>
/* Debug builds (`make watchdog`): a wait that has not completed after
 * SK_MBAR_WATCHDOG_CYCLES (~4 s at 1.98 GHz; every legitimate wait of these
 * kernels lasts microseconds) prints which barrier, where, and traps, so a
 * producer / consumer disagreement fails the launch instead of hanging the
 * GPU. */
#ifndef SK_MBAR_WATCHDOG_CYCLES
#define SK_MBAR_WATCHDOG_CYCLES (1ll << 33)
#endif
/* The cold path, out of line so the waits stay small. */
static __device__ __noinline__ void sk_mbar_watchdog_fire(uint32_t bar, uint32_t parity,
                                                          const char *what) {
    printf("sparsek watchdog: mbarrier \"%s\" (shared 0x%x) never completed phase parity %u;"
           " block %d, thread %d\n",
           what, bar, parity, (int)blockIdx.x, (int)threadIdx.x);
    __trap();
}
__device__ __forceinline__ void sk_mbar_wait(uint32_t bar, uint32_t parity, const char *what) {
    const long long start = clock64();
    while (!sk_mbar_try_wait(bar, parity)) {
        if (clock64() - start > SK_MBAR_WATCHDOG_CYCLES) sk_mbar_watchdog_fire(bar, parity, what);
    }
}
#else
/* Wait until the mbarrier's phase with this parity has completed
 * (try_wait may time out, hence the loop). `what` names the barrier for
 * the watchdog of debug builds; release builds do not use it. */
__device__ __forceinline__ void sk_mbar_wait(uint32_t bar, uint32_t parity, const char *what) {
    (void)what;
    while (!sk_mbar_try_wait(bar, parity)) {
    }
}
#endif /* SK_MBAR_WATCHDOG */
#endif /* sm_90a: ptx.cuh's mbarrier wrappers */

/* Byte offset of 16-byte chunk c16 (0..7) of row `row` in a 128B-swizzled
 * K-major panel of 128-byte rows: 8-row atoms of 1024 B, the chunk index
 * XORed with the row in its atom (the layout wgmma's swizzle mode 1 reads;
 * the top-k scoring kernels write their panels with it). */
__device__ __forceinline__ uint32_t sk_sw128_offset(int32_t row, int32_t c16) {
    return (uint32_t)((row >> 3) * 1024 + (row & 7) * 128 + ((c16 ^ (row & 7)) << 4));
}

/* wgmma shared-memory descriptor for a 128B-swizzled operand: start
 * address, leading and stride byte offsets (all >> 4), swizzle mode 1 in
 * bits 62-63. A K step adds its byte offset >> 4 to the result (no carry:
 * shared addresses stay below 2^18). */
__device__ __forceinline__ uint64_t sk_wgmma_desc_sw128(uint32_t addr, uint32_t lbo,
                                                        uint32_t sbo) {
    return (uint64_t)((addr & 0x3FFFFu) >> 4) | ((uint64_t)(lbo >> 4) << 16) |
           ((uint64_t)(sbo >> 4) << 32) | (1ull << 62);
}

/* The same for a 64B-swizzled operand (swizzle mode 2): 8-row atoms of
 * 64-byte rows (512 B), the 16-byte chunk index XORed with (row / 2) % 4
 * (the layout TMA's SWIZZLE_64B writes; the FP8 kernel's 64-byte rows). */
__device__ __forceinline__ uint64_t sk_wgmma_desc_sw64(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((addr & 0x3FFFFu) >> 4) | ((uint64_t)(lbo >> 4) << 16) |
           ((uint64_t)(sbo >> 4) << 32) | (2ull << 62);
}

#endif /* SK_CUDA_HOPPER_CUH */
