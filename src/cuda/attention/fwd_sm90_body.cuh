/*
 * fwd_sm90_body.cuh - the fp16 / bf16 Hopper attention kernel's body for
 * every mode (fwd_sm90_common.cuh: kSk90Fixed, kSk90Varlen, kSk90Paged):
 * the barriers, then the warpgroups' roles (fwd_sm90_producer.cuh,
 * fwd_sm90_consumer.cuh). Included by fwd_sm90.cu (the fixed kernel) and
 * fwd_sm90_varlen.cu (the varlen / paged kernels) only, after
 * fwd_sm90_common.cuh.
 */
#ifndef SK_CUDA_ATTENTION_FWD_SM90_BODY_CUH
#define SK_CUDA_ATTENTION_FWD_SM90_BODY_CUH

/* The warpgroups' code: the producer (scheduler and TMA warps), then the
 * consumers (GEMMs, softmax, epilogue). */
#include "cuda/attention/fwd_sm90_producer.cuh"
#include "cuda/attention/fwd_sm90_consumer.cuh"
#include "cuda/attention/fwd_sm90_pair.cuh"

/* v: the varlen mode's parameters (the fixed kernel passes one never read);
 * BN: keys per K / V block (64 in the fixed mode only); PAIR: tiles of two
 * 64-row query blocks (block_q = 64, fixed mode, fwd_sm90_pair.cuh). */
template <sk_dtype DT, int HD, int MODE, bool CARRY = false, int BN = kBlockN, bool PAIR = false>
__device__ __forceinline__ void sk90_kernel_body(const sk90_params &p, const sk90_vparams &v) {
    using L = sk90_layout<HD, MODE, BN>;
    extern __shared__ uint8_t sk90_smem_raw[];
    const uint32_t raw = (uint32_t)__cvta_generic_to_shared(sk90_smem_raw);
    const uint32_t base = (raw + kSwizzleAtom - 1) & ~(uint32_t)(kSwizzleAtom - 1);
    int32_t *tile_ids = (int32_t *)(sk90_smem_raw + (base - raw) + L::kTileIds);
    volatile int32_t *block_info = (volatile int32_t *)(sk90_smem_raw + (base - raw) + L::kBlockInfo);
    volatile int32_t *sched = (volatile int32_t *)(sk90_smem_raw + (base - raw) + L::kSched);

    if (threadIdx.x == 0) sk90_init_barriers<L>(base);
    __syncthreads();

    const int wg = threadIdx.x / 128;
    if (wg == 0) {
        sk_setmaxnreg_dec<kProducerRegs>();
        const int warp = threadIdx.x / 32;
        if (warp == 0)
            sk90_producer<L, MODE, PAIR>(p, v, base, tile_ids, block_info, nullptr, sched);
        if (warp == 1) sk90_scheduler<L, MODE, PAIR>(p, v, base, sched);
    } else {
        sk_setmaxnreg_inc<kConsumerRegs>();
        sk90_consumer<DT, HD, MODE, CARRY, BN, PAIR>(p, v, base, tile_ids, block_info, wg - 1);
    }
}

#endif /* SK_CUDA_ATTENTION_FWD_SM90_BODY_CUH */
