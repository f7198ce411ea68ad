/*
 * fwd_sm90_fp8.cu - the Hopper block-sparse attention forward on FP8 (e4m3)
 * Q, K and V, O in bf16 or fp16: the fp16/bf16 kernel (fwd_sm90.cu; its
 * header describes the persistent grid, the warp roles, the pipelines, the
 * ping-pong and the invariants, all kept here) with FP8 tensor-core GEMMs.
 * Head dim 64 or 128; blocks (block_q x block_k) 128 x 128, 128 x 64 (the
 * _k64 kernels: key blocks of 64, BN a template parameter of the body),
 * 64 x 128 and 64 x 64 (the _pair kernels: two 64-row query blocks a
 * tile, the fp16/bf16 pair kernels' scheduler, TMA warp and turns,
 * fwd_sm90_pair.cuh); NOT_SUPPORTED otherwise.
 *
 * What differs from the fp16/bf16 kernel (docs/perf/fp8.md):
 *   - Tiles are 128 rows of D bytes: Q, K and V move as one box each
 *     (128B swizzle at D = 128, 64B at D = 64); S = Q K^T is D / 32 wgmma
 *     m64n128k32.e4m3 (both K-major); P V is m64nDk32.
 *   - P V: FP8 wgmma reads B K-major only, so V (keys x dims in memory) is
 *     transposed in shared memory by warps 2 and 3 of the producer
 *     warpgroup (fwd_sm90_fp8_transposer.cuh) into Vt stages (dims x keys),
 *     an extra pipeline: TMA -> V stage -> transposer -> Vt stage ->
 *     consumers. (A pre-transposed V in the API would drop this stage; the
 *     in-kernel transpose keeps the [B, S, H, D] contract.)
 *   - P to e4m3 in registers: the fp32 accumulator of S gives thread (g, t)
 *     keys {2t, 2t+1} of each 8-key group, while the A fragment of a k32
 *     FP8 wgmma wants keys 4t .. 4t+3 and 16+4t .. 16+4t+3 of each 32. No
 *     shuffle re-lays it: P's registers are used where they are, which
 *     puts key sk98_key_of_pos(pos) at A position pos, and the transposer
 *     writes Vt's keys in that same order (a permutation of the sum).
 *   - Softmax row sums come from the fp32 P (before rounding to e4m3), as
 *     FlashAttention-3 does; P is offset by 2^8 (kF8MaxOffset) to keep small
 *     weights out of e4m3's subnormal range.
 *   - Descales: per tile q_descale[b, h] x k_descale[b, hk] multiplies the
 *     base-2 softmax factor (its sign is folded like a negative scale) and
 *     the LSE factor; v_descale[b, hk] multiplies 1 / rowsum in the
 *     epilogue. fp32 products: exact up to fp32 rounding.
 *   - V given pre-transposed (sk_attention_desc v_layout = VT_FP8, the
 *     quantizer's SK_QUANT_LAYOUT_VT_FP8: V^T rows already in P's key
 *     order): the template flag VT. V's TMA box is the Vt operand, the V
 *     stage's full barrier is the TMA's expect_tx, the consumers free it;
 *     no transposer warps, no Vt stages, the fp16/bf16 register split.
 *   - The TMA warp is the fp16/bf16 kernel's (sk90_producer on this
 *     layout); the transposer learns the end of the kernel from an extra V
 *     stage it publishes with a plain arrival and v_info = kVInfoEnd.
 *
 * Shared memory (all 1024-B aligned): 2 Q buffers, 2 K, 2 V, 2 Vt stages
 * of 128 x D bytes, O 2 x 64 x D x 2 bytes (as the fp16/bf16 kernel's),
 * barriers: about 161 KB at D = 128, 81 KB at D = 64 (VT: no Vt stages,
 * 129 KB and 65 KB). Blocks of 64 keys: 4 stages of each of half the
 * size, the same bytes; pairs add the scheduler slots' extension (256 B).
 */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/fp8_vt.h"
#include "cuda/attention/kernels.h"
#include "cuda/common/cuda_check.cuh"
#include "cuda/common/hopper.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/tensor_map.h"

#include "cuda/attention/fwd_sm90_common.cuh"

/* The shared warpgroup code: the TMA and scheduler warps; the masks, the
 * softmax, the K stage helpers and the O packing. */
#include "cuda/attention/fwd_sm90_producer.cuh"
#include "cuda/attention/fwd_sm90_consumer.cuh"
/* The turns of a pair tile (block_q = 64), sk90_pair_walk. */
#include "cuda/attention/fwd_sm90_pair.cuh"

enum {
    kF8Keys = 128, /* keys of a block: the Vt row in bytes */
    /* setmaxnreg: the transposer needs more than the fp16/bf16 producer's
     * 40 (64: its 16 loads in flight per j, hoisted store addresses; 56
     * spilled 8 bytes); the consumers hold 16 P registers, not 32. */
    kF8ProducerRegs = 64,
    kF8ConsumerRegs = 216,
    /* p = 2^(s' - m' + 8) in [0, 256] before it is rounded to e4m3 (FA3's
     * Max_offset): weights down to 2^-14 of the row max stay normal e4m3
     * numbers instead of subnormals or 0. Row sums carry the same 2^8, which
     * cancels in O = P V / l; the LSE subtracts 8 ln 2. */
    kF8MaxOffset = 8
};
static constexpr float kF8OffsetLn = 8.0f * 0.69314718055994531f; /* kF8MaxOffset x ln 2 */
static_assert(kF8ProducerRegs * 128 + kF8ConsumerRegs * 256 <= kThreads * 168, "register budget");

/* The shared layout at head dim HD (64 or 128) and key blocks of BN (128
 * or 64): Q tiles of 128 rows of HD bytes, K and V stages of BN rows (one
 * TMA box each: 128B swizzle at HD = 128, 64B at 64), Vt stages of HD rows
 * of BN keys (128B swizzle at BN = 128, 64B at 64), O as the fp16/bf16
 * kernel's. BN = 64 keeps the bytes in flight of BN = 128: twice the
 * stages of half the size (as the fp16/bf16 _k64 kernels).
 * VT (V given pre-transposed, SK_V_LAYOUT_VT_FP8): the V stages are Vt
 * tiles as TMA brings them (HD rows of BN keys, the same bytes as a V
 * stage), there is no Vt pipeline, and the P V GEMM reads the V stages
 * ("Pv" below names the stages it reads in either variant). */
template <int HD, bool VT, int BN = kF8Keys>
struct sk98_smem {
    static constexpr int kPerStage = kF8Keys / BN; /* stages per 128-key stage */
    static constexpr int kQBufs = 2, kKStages = 2 * kPerStage, kVStages = 2 * kPerStage;
    static constexpr int kVtStages = VT ? 0 : 2 * kPerStage;
    static constexpr uint32_t kRowBytes = HD;                    /* one e4m3 row */
    static constexpr uint32_t kTileBytes = 128 * kRowBytes;      /* a Q tile */
    static constexpr uint32_t kKVBytes = BN * kRowBytes;         /* a K or V stage */
    static constexpr uint32_t kVtBytes = HD * BN;                /* a Vt stage */
    static constexpr uint32_t kAtom = HD == 128 ? 1024 : 512;    /* 8 rows of the swizzle */
    /* What the shared TMA warp reads (fwd_sm90_producer.cuh): one box per
     * row, a V word per stage for the transposer. */
    static constexpr int kSlabs = 1, kBoxCols = HD;
    static constexpr uint32_t kSlab128 = kTileBytes, kBlockBytes = kKVBytes;
    static constexpr uint32_t kKVSlab = kKVBytes; /* K / V: blocks of kBN keys */
    static constexpr int kBN = BN;
    static constexpr uint32_t kQBytes = kTileBytes;
    static constexpr bool kTransposeV = !VT;
    static constexpr bool kVtDirect = VT;
    static constexpr int kOSlabs = HD / kSlabCols;                /* O: 2-byte, 64-column slabs */
    static constexpr uint32_t kOWgBytes = kWgRows * HD * 2;       /* one warpgroup's O */
    static constexpr uint32_t kOSlabBytes = kWgRows * kSlabRowBytes;
    static constexpr uint32_t kQ = 0;
    static constexpr uint32_t kK = kQ + kQBufs * kTileBytes;
    static constexpr uint32_t kV = kK + kKStages * kKVBytes;
    static constexpr uint32_t kVt = kV + kVStages * kKVBytes;
    static constexpr uint32_t kO = kVt + kVtStages * kVtBytes;
    static constexpr uint32_t kBarQFull = kO + 2 * kOWgBytes;
    static constexpr uint32_t kBarQEmpty = kBarQFull + 8 * kQBufs;
    static constexpr uint32_t kBarKFull = kBarQEmpty + 8 * kQBufs;
    static constexpr uint32_t kBarKEmpty = kBarKFull + 8 * kKStages;
    static constexpr uint32_t kBarVFull = kBarKEmpty + 8 * kKStages;
    static constexpr uint32_t kBarVEmpty = kBarVFull + 8 * kVStages;
    static constexpr uint32_t kBarVtFull = kBarVEmpty + 8 * kVStages;
    static constexpr uint32_t kBarVtEmpty = kBarVtFull + 8 * kVtStages;
    static constexpr uint32_t kBarTileFull = kBarVtEmpty + 8 * kVtStages;
    static constexpr uint32_t kBarTileEmpty = kBarTileFull + 8 * kTileSlots;
    static constexpr uint32_t kBarSchedFull = kBarTileEmpty + 8 * kTileSlots;
    static constexpr uint32_t kBarSchedEmpty = kBarSchedFull + 8 * kSchedSlots;
    static constexpr uint32_t kTileIds = kBarSchedEmpty + 8 * kSchedSlots;
    static constexpr uint32_t kBlockInfo = kTileIds + 4 * kTileSlots; /* per K stage */
    static constexpr uint32_t kVInfo = kBlockInfo + 4 * kKStages;     /* per V stage */
    static constexpr uint32_t kSched = kVInfo + 4 * kVStages;         /* {tile, start, end, -} */
    static constexpr uint32_t kUsed = kSched + 16 * kSchedSlots;
    static constexpr uint32_t kDynamicBytes = kUsed + kSwizzleAtom;
    /* Pairs (block_q = 64): the scheduler slots' extension the shared
     * scheduler writes the second row's range to (L::kVSched). */
    static constexpr uint32_t kVSched = kUsed;
    static constexpr uint32_t kVDynamicBytes = kVSched + 64 * kSchedSlots + kSwizzleAtom;
    /* What the P V GEMM reads: Vt stages (filled by the transposer), or
     * with VT the V stages (filled by TMA, freed by the consumers). */
    static constexpr int kPvStages = VT ? kVStages : kVtStages;
    static constexpr uint32_t kPv = VT ? kV : kVt, kPvBytes = kVtBytes;
    static constexpr uint32_t kBarPvFull = VT ? kBarVFull : kBarVtFull;
    static constexpr uint32_t kBarPvEmpty = VT ? kBarVEmpty : kBarVtEmpty;
    static_assert(kVtBytes == kKVBytes, "a V^T box fills a V stage");

    static_assert(HD == 64 || HD == 128, "head dim 64 or 128");
    static_assert(BN == 64 || BN == 128, "key blocks of 64 or 128");
    static_assert(kK % kSwizzleAtom == 0 && kV % kSwizzleAtom == 0 && kVt % kSwizzleAtom == 0 &&
                      kO % kSwizzleAtom == 0 && kOSlabBytes % kSwizzleAtom == 0 &&
                      kTileBytes % kSwizzleAtom == 0 && kKVBytes % kSwizzleAtom == 0 &&
                      kVtBytes % kSwizzleAtom == 0,
                  "swizzled tiles must be 1024-B aligned");
    static_assert((kWgRows * kRowBytes) % kAtom == 0, "a warpgroup's Q rows start on an atom");
    static_assert(kBarQFull % 8 == 0 && kSched % 4 == 0, "barrier and slot alignment");
    static_assert(kVDynamicBytes <= 227 * 1024, "shared memory budget of one sm_90 CTA");
};

/* The fp16/bf16 kernel's parameters (maps over e4m3 Q, K, V, O in out_dtype)
 * and the descales. */
struct sk98_params {
    sk90_params base;
    const float *q_descale; /* [B, Hq] or NULL */
    const float *k_descale; /* [B, Hkv] or NULL */
    const float *v_descale; /* [B, Hkv] or NULL */
};

/* The varlen mode's parameters the shared producer takes, never read here. */
static __constant__ sk90_vparams sk98_no_vparams;

#include "cuda/attention/fwd_sm90_fp8_transposer.cuh"
#include "cuda/attention/fwd_sm90_fp8_consumer.cuh"

/* The kernel body for key blocks of BN (128 or 64) keys; PAIR: tiles of
 * two 64-row query blocks (block_q = 64). */
template <sk_dtype OT, int HD, bool VT, int BN, bool PAIR = false>
__device__ __forceinline__ void sk98_kernel_body(const sk98_params &p) {
    using L = sk98_smem<HD, VT, BN>;
    extern __shared__ uint8_t sk98_smem_raw[];
    const uint32_t raw = (uint32_t)__cvta_generic_to_shared(sk98_smem_raw);
    const uint32_t base = (raw + kSwizzleAtom - 1) & ~(uint32_t)(kSwizzleAtom - 1);
    uint8_t *gbase = sk98_smem_raw + (base - raw);
    int32_t *tile_ids = (int32_t *)(gbase + L::kTileIds);
    volatile int32_t *block_info = (volatile int32_t *)(gbase + L::kBlockInfo);
    volatile int32_t *v_info = (volatile int32_t *)(gbase + L::kVInfo);
    volatile int32_t *sched = (volatile int32_t *)(gbase + L::kSched);

    if (threadIdx.x == 0) sk90_init_barriers<L>(base);
    __syncthreads();

    const int wg = threadIdx.x / 128;
    /* VT: no transposer, so the fp16/bf16 kernel's register split. */
    constexpr int kProdRegs = VT ? kProducerRegs : kF8ProducerRegs;
    constexpr int kConsRegs = VT ? kConsumerRegs : kF8ConsumerRegs;
    if (wg == 0) {
        sk_setmaxnreg_dec<kProdRegs>();
        const int warp = threadIdx.x / 32;
        if (warp == 0)
            sk90_producer<L, kSk90Fixed, PAIR>(p.base, sk98_no_vparams, base, tile_ids,
                                               block_info, v_info, sched);
        if (warp == 1) sk90_scheduler<L, kSk90Fixed, PAIR>(p.base, sk98_no_vparams, base, sched);
        if constexpr (!VT)
            if (warp >= 2) sk98_transposer<HD, BN>(base, v_info, warp - 2);
    } else {
        sk_setmaxnreg_inc<kConsRegs>();
        sk98_consumer<OT, HD, VT, BN, PAIR>(p, base, tile_ids, block_info, wg - 1);
    }
}

template <sk_dtype OT, int HD, bool VT>
__global__ void __launch_bounds__(kThreads, 1)
    sk_attention_sm90_fp8_kernel(const __grid_constant__ sk98_params p) {
    sk98_kernel_body<OT, HD, VT, kF8Keys>(p);
}

/* Layouts with block_k = 64 (block_q = 128): the same body on blocks of 64
 * keys (K / V boxes of 64 rows, S as m64n64k32, P V with k = 64 on Vt
 * stages of 64-byte rows, twice the stages of half the size). A kernel of
 * its own, so that the name and the code of the 128-key kernel stay as
 * they were. */
template <sk_dtype OT, int HD, bool VT>
__global__ void __launch_bounds__(kThreads, 1)
    sk_attention_sm90_fp8_k64_kernel(const __grid_constant__ sk98_params p) {
    sk98_kernel_body<OT, HD, VT, 64>(p);
}

/* Layouts with block_q = 64 (key blocks of BN = 128 or 64): a tile is two
 * consecutive 64-row query blocks of one (batch, head), warpgroup h
 * computing block 2i + h over the blocks its row selected, out of the
 * union the shared scheduler and TMA warp stream (fwd_sm90_common.cuh,
 * "Pairs"; the turns: fwd_sm90_pair.cuh). */
template <sk_dtype OT, int HD, bool VT, int BN>
__global__ void __launch_bounds__(kThreads, 1)
    sk_attention_sm90_fp8_pair_kernel(const __grid_constant__ sk98_params p) {
    sk98_kernel_body<OT, HD, VT, BN, true>(p);
}

/* ---------------------------------------------------------------------------
 * Host side
 * ------------------------------------------------------------------------- */

/* V^T [B, Hkv, D, Sk_pad] bytes (core/fp8_vt.h): boxes of bn (128 or 64)
 * key columns x D rows, 128B swizzle (64B for 64-byte rows): the Vt stage
 * the transposer would write. Key columns up to Sk rounded up to 32 exist:
 * the permutation stays inside each 32-key chunk, so the last chunk's keys
 * are all inside, and the columns past it load as zeros (never read from
 * memory). */
static CUresult sk98_encode_vt(CUtensorMap *map, const sk_attention_problem *p, const void *v,
                               int bn) {
    const int64_t pad = sk_vt_seq_pad(p->seq_k), d = p->head_dim;
    const cuuint64_t dims[4] = {(cuuint64_t)((p->seq_k + 31) / 32 * 32), (cuuint64_t)d,
                                (cuuint64_t)p->heads_kv, (cuuint64_t)p->batch};
    const cuuint64_t strides[3] = {(cuuint64_t)pad, (cuuint64_t)(d * pad),
                                   (cuuint64_t)(p->heads_kv * d * pad)};
    const cuuint32_t box[4] = {(cuuint32_t)bn, (cuuint32_t)d, 1, 1};
    return sk_tensor_map_encode_swizzled(map, SK_DTYPE_E4M3, 4, v, dims, strides, box,
                                         bn == 64 ? 64 : 128);
}

static CUresult sk98_encode_all(sk90_params *prm, const sk_attention_problem *p, const void *q,
                                const void *k, const void *v, const void *o) {
    /* One box per row: head_dim bytes (64B swizzle at 64, 128B at 128); K
     * and V boxes of one key block (64 rows when block_k is 64). */
    const sk_dtype in = SK_DTYPE_E4M3;
    const int row = (int)p->head_dim, bn = p->block_k == 64 ? 64 : kBlockN;
    CUresult r = sk90_encode(&prm->tm_q, p, in, row, q, p->seq_q, p->heads_q, p->q_stride, kBlockM);
    if (r == CUDA_SUCCESS)
        r = sk90_encode(&prm->tm_k, p, in, row, k, p->seq_k, p->heads_kv, p->k_stride, bn);
    if (r == CUDA_SUCCESS)
        r = p->v_layout == SK_V_LAYOUT_VT_FP8
                ? sk98_encode_vt(&prm->tm_v, p, v, bn)
                : sk90_encode(&prm->tm_v, p, in, row, v, p->seq_k, p->heads_kv, p->v_stride,
                              bn);
    if (r == CUDA_SUCCESS)
        r = sk90_encode(&prm->tm_o, p, p->out_dtype, kSlabCols, o, p->seq_q, p->heads_q,
                        p->o_stride, kWgRows);
    return r;
}

int sk_attention_sm90_fp8_supports(const sk_attention_problem *p) {
    if (p->dtype != SK_DTYPE_E4M3) return 0;
    if (p->out_dtype != SK_DTYPE_F16 && p->out_dtype != SK_DTYPE_BF16) return 0;
    if (p->head_dim != 64 && p->head_dim != 128) return 0;
    if (!sk90_blocks_ok(p)) return 0;
    if (!sk90_limits_ok(p, 1, 2)) return 0;
    sk90_params prm;
    const void *dummy = (const void *)(uintptr_t)(1u << 20);
    return sk98_encode_all(&prm, p, dummy, dummy, dummy, dummy) == CUDA_SUCCESS;
}

/* BN: keys per block (the kernel of that block width). */
template <sk_dtype OT, int HD, bool VT, int BN>
static sk_status sk98_launch_vt(const sk98_params &prm, int grid, cudaStream_t stream) {
    using L = sk98_smem<HD, VT, BN>;
    void (*kernel)(const sk98_params) = BN == 64 ? sk_attention_sm90_fp8_k64_kernel<OT, HD, VT>
                                                 : sk_attention_sm90_fp8_kernel<OT, HD, VT>;
    SK_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)L::kDynamicBytes),
                "cudaFuncSetAttribute");
    kernel<<<grid, kThreads, L::kDynamicBytes, stream>>>(prm);
    return sk_cuda_status(cudaGetLastError(), "sm90 FP8 attention kernel launch");
}

/* Pairs of 64-row query blocks: their kernel, with the scheduler slots'
 * extension (kVDynamicBytes). */
template <sk_dtype OT, int HD, bool VT, int BN>
static sk_status sk98_launch_pair(const sk98_params &prm, int grid, cudaStream_t stream) {
    using L = sk98_smem<HD, VT, BN>;
    SK_CUDA_TRY(cudaFuncSetAttribute(sk_attention_sm90_fp8_pair_kernel<OT, HD, VT, BN>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)L::kVDynamicBytes),
                "cudaFuncSetAttribute");
    sk_attention_sm90_fp8_pair_kernel<OT, HD, VT, BN>
        <<<grid, kThreads, L::kVDynamicBytes, stream>>>(prm);
    return sk_cuda_status(cudaGetLastError(), "sm90 FP8 attention kernel launch (block_q 64)");
}

/* Both V layouts are compiled (rows: the transposer; VT: V^T by TMA), at
 * both key block widths, with query blocks of 128 or 64 (pairs). */
template <sk_dtype OT, int HD>
static sk_status sk98_launch(const sk98_params &prm, bool vt, int block_q, int block_k,
                             int grid, cudaStream_t stream) {
    if (block_q == 64 && block_k == 64)
        return vt ? sk98_launch_pair<OT, HD, true, 64>(prm, grid, stream)
                  : sk98_launch_pair<OT, HD, false, 64>(prm, grid, stream);
    if (block_q == 64)
        return vt ? sk98_launch_pair<OT, HD, true, kF8Keys>(prm, grid, stream)
                  : sk98_launch_pair<OT, HD, false, kF8Keys>(prm, grid, stream);
    if (block_k == 64)
        return vt ? sk98_launch_vt<OT, HD, true, 64>(prm, grid, stream)
                  : sk98_launch_vt<OT, HD, false, 64>(prm, grid, stream);
    return vt ? sk98_launch_vt<OT, HD, true, kF8Keys>(prm, grid, stream)
              : sk98_launch_vt<OT, HD, false, kF8Keys>(prm, grid, stream);
}

sk_status sk_attention_sm90_fp8_launch(const sk_attention_problem *p,
                                       const sk_attention_schedule *s, cudaStream_t stream) {
    if (!sk_attention_sm90_fp8_supports(p))
        return sk_error(SK_STATUS_NOT_SUPPORTED,
                        "the FP8 Hopper kernel does not cover this problem (head_dim = %lld, "
                        "blocks %d x %d, strides)",
                        (long long)p->head_dim, (int)p->block_q, (int)p->block_k);
    sk98_params prm;
    memset(&prm, 0, sizeof prm);
    const CUresult r = sk98_encode_all(&prm.base, p, p->q, p->k, p->v, p->o);
    if (r != CUDA_SUCCESS)
        return sk_error(SK_STATUS_EXECUTION_FAILED, "cuTensorMapEncodeTiled failed (CUresult %d)",
                        (int)r);
    int grid = 0;
    SK_TRY(sk90_fill_params(&prm.base, p, s, &grid));
    if (grid <= 0) return SK_STATUS_SUCCESS;
    prm.q_descale = p->q_descale;
    prm.k_descale = p->k_descale;
    prm.v_descale = p->v_descale;
    const bool bf16 = p->out_dtype == SK_DTYPE_BF16;
    const bool vt = p->v_layout == SK_V_LAYOUT_VT_FP8;
    const int bq = p->block_q, bk = p->block_k;
    if (p->head_dim == 128)
        return bf16 ? sk98_launch<SK_DTYPE_BF16, 128>(prm, vt, bq, bk, grid, stream)
                    : sk98_launch<SK_DTYPE_F16, 128>(prm, vt, bq, bk, grid, stream);
    return bf16 ? sk98_launch<SK_DTYPE_BF16, 64>(prm, vt, bq, bk, grid, stream)
                : sk98_launch<SK_DTYPE_F16, 64>(prm, vt, bq, bk, grid, stream);
}
