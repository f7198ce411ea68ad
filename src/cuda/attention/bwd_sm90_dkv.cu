/*
 * bwd_sm90_dkv.cu - the Hopper (sm_90a) kernel of the attention backward's
 * dK/dV pass (bwd_kernels.h): TMA, mbarriers, wgmma, warp specialisation.
 * Same walk, masks, NaN rules and determinism as the portable pass
 * (bwd_sm80.cu's header, bwd_sm80_dkv.cuh); docs/perf/backward.md, "Hopper
 * dK/dV kernel", has the design and its expected speed.
 *
 * One CTA per (batch b, KV head hk, key block j) of the plan's dkv_info
 * order (non-persistent), 384 threads:
 *   producer   warpgroup 0; its first lane walks T row j (bwd_kernels.h:
 *              repetitions, then entries, then the 64-row query tiles of
 *              each entry's block, skipping tiles whose last row sees no
 *              key of the block when causal) and streams each tile's Q and
 *              dO (TMA, 128B swizzle, rows past Sq zero) and its 64 lse2
 *              and Dl values (bulk copies from the pre-pass rows) through
 *              a kStages ring of mbarriers; the block's K and V (TMA, keys
 *              past Sk zero) once, before the first tile. After the last
 *              tile, a stage carrying the end mark (-1) and no bytes.
 *   consumers  warpgroups 1 and 2, keys as the wgmma M dimension. Block of
 *              128 keys: warpgroup w owns keys 64 w .. 64 w + 63 and both
 *              take every tile. Block of 64 keys: both own the 64 keys and
 *              take alternate tiles (w takes tiles n with n % 2 == w, so
 *              with an even kStages each has its own stages), and at the
 *              end each adds the other's partial sums of one of dK, dV in
 *              a fixed order (a + b, the same bits on every run).
 * Per tile and warpgroup (64 keys x 64 queries), four commit groups:
 *   S^T = K Q^T, dP^T = V dO^T    wgmma m64n64k16, A and B K-major in smem
 *   P^T = 2^(S^T s log2(e) - lse2)   in registers, while dP^T runs
 *   dV += P^T dO                 wgmma m64nDk16, P^T the register A operand
 *                                (rounded to the dtype), dO the N-major B
 *                                operand (as the forward's P V)
 *   dS^T = P^T (dP^T - Dl)       in registers, while dV runs
 *   dK += dS^T Q                 as dV
 * and dK is scaled by s once, at the end; dK and dV go out through the
 * warp's own rows of the K / V tiles (16-byte row stores below Sk).
 *
 * Masks and NaN: a pair (q, k) counts iff q < Sq, k < Sk and, when causal,
 * k <= q + Sk - Sq. Entries that do not count are selected to 0, never
 * multiplied. Q / dO rows of a tile that see no key of the block (causal:
 * q < first key - (Sk - Sq)) may belong to empty rows whose inputs are NaN,
 * and 0 x NaN in dV += P^T dO is NaN: the consumers zero those rows in
 * shared memory before the tile's GEMMs (the forward's varlen V rows are
 * zeroed the same way). Rows past Sq and keys past Sk are TMA's zero fill;
 * every other row of a tile has a counted pair, so its inputs are finite.
 *
 * Declined (*launched = 0, the portable kernel runs the pass): strides TMA
 * cannot take (a stepped axis with a stride <= 0 or not a multiple of 16
 * bytes), no tensor-map encoder in the driver.
 *
 * Fused form (sk_bwd90kv_fused_kernel, kFuse; bwd->deterministic = 0):
 * the same walk, plus each tile's dQ added into an fp32 dQaccum with a bulk
 * reduce-add or red.global.add (bwd_sm90_dkv_dq.cuh has its design; the
 * switch SK_BWD90_DQ_BULK is bwd_dqacc.cuh's); the dQ pass is not
 * run, a post-pass scales and converts dQaccum. The D = 64 cross-tile
 * overlap is off in it (each tile retires its groups before its adds), and
 * at 128-key blocks with D = 128 its ring has 3 stages (the dS^T buffers
 * take the fourth's shared memory, the staged dQ tiles the rest). Where
 * it declines (as above), the deterministic two passes run. The kernels without kFuse are the same
 * instruction for instruction as before the fused form existed.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <cuda.h>
#include <cuda_runtime.h>

#include "cuda/attention/bwd_dqacc.cuh"
#include "cuda/attention/bwd_kernels.h"
#include "cuda/attention/bwd_params.h"
#include "cuda/attention/bwd_sm90_dkv.h"
#include "cuda/attention/bwd_sm90_gemm.cuh"
#include "cuda/attention/fwd_sm90_common.cuh" /* sk90_encode, sk90_stride_ok, sk90_pipe */
#include "cuda/attention/sm80_common.cuh"     /* sk_sm80_pack: two floats as a dtype pair */

enum {
    kBkvThreads = 384, /* producer warpgroup + two consumer warpgroups */
    kBkvRows = 64,     /* query rows of a tile; keys of a warpgroup */
    kBkvStages = 4,    /* Q / dO ring; even (alternating warpgroups at 64-key blocks) */
    kBkvProducerRegs = 40,
    kBkvConsumerRegs = 232,
    kBkvBarZero = 1, /* named barriers (0 is __syncthreads); +wg at 64-key blocks */
    kBkvEnd = -1,    /* a stage's query row: no more tiles */
    kBkvBarDs = 3,   /* fused dQ: a warpgroup's dS^T stored (+wg; bwd_sm90_dkv_dq.cuh) */
    kBkvBarPair = 5, /* fused dQ, merged: both warpgroups' dS^T stored */
    kBkvBarDq = 6    /* fused dQ, bulk: a warpgroup's dQ tile staged (+wg) */
};
static_assert(kBkvProducerRegs * 128 + kBkvConsumerRegs * 256 <= kBkvThreads * 168,
              "register budget");
static_assert(kBkvStages % 2 == 0, "alternating warpgroups need an even ring");

/* Shared memory, byte offsets from the 1024-aligned base. Tiles are 64-column
 * slabs of 128-byte swizzled rows (TMA's SWIZZLE_128B, wgmma's mode 1). */
template <int kD, int kKeyWgs, bool kFuse = false> struct sk_bwd90kv_smem {
    /* kFuse (bwd_sm90_dkv_dq.cuh): merged dQ split at 128-key blocks and
     * D = 128 (unless SK_BWD90_DQ_OWN), with a ring of 3 so that the dS^T
     * buffers and the staged dQ tiles fit. */
    static constexpr bool kMerged = kFuse && kKeyWgs == 2 && kD == 128 && !SK_BWD90_DQ_OWN;
    static constexpr int kStages = kFuse && kKeyWgs == 2 && kD == 128 ? 3 : kBkvStages;
    /* SK_BWD90_DQ_BULK: each warpgroup stages its fp32 dQ tiles (64 x 64,
     * bwd_dqacc.cuh's order) for bulk reduce-adds; not at 64-key blocks
     * and D = 128, whose 4-stage ring leaves no 32 KB (red there). */
    static constexpr bool kBulk = kFuse && SK_BWD90_DQ_BULK && !(kKeyWgs == 1 && kD == 128);
    static constexpr uint32_t kDqStage = kBkvRows * 64 * 4; /* a warpgroup's dQ tile */
    static constexpr uint32_t kDsBuf = 2 * kBkvRows * 128; /* a dS^T buffer: 128 key rows */
    static constexpr int kSlabs = kD / 64;
    static constexpr int kKeys = kBkvRows * kKeyWgs; /* the block's keys */
    static constexpr uint32_t kKvSlab = kKeys * 128; /* a slab of K or V */
    static constexpr uint32_t kKvBytes = kKvSlab * kSlabs;
    static constexpr uint32_t kQSlab = kBkvRows * 128; /* a slab of a Q or dO tile */
    static constexpr uint32_t kTileBytes = kQSlab * kSlabs;
    static constexpr uint32_t kStageBytes = 2 * kTileBytes; /* Q, then dO */
    static constexpr uint32_t kRowBytes = 2 * kBkvRows * 4; /* lse2, then Dl */
    static constexpr uint32_t kK = 0;
    static constexpr uint32_t kV = kK + kKvBytes;
    static constexpr uint32_t kStage0 = kV + kKvBytes;
    static constexpr uint32_t kDs = kStage0 + kStages * kStageBytes; /* kFuse: 2 dS^T buffers */
    static constexpr uint32_t kDq = kDs + (kFuse ? 2 * kDsBuf : 0); /* kBulk: 2 dQ tiles */
    static constexpr uint32_t kRows = kDq + (kBulk ? 2 * kDqStage : 0);
    static constexpr uint32_t kBarFull = kRows + kStages * kRowBytes;
    static constexpr uint32_t kBarEmpty = kBarFull + 8 * kStages;
    static constexpr uint32_t kBarKv = kBarEmpty + 8 * kStages;
    /* 64-key blocks: "both left the ring", then "both gave their sums". */
    static constexpr uint32_t kBarSwap = kBarKv + 8;
    /* kFuse: "unreached K rows zeroed", then (merged) "both products done" */
    static constexpr uint32_t kBarClean = kBarSwap + 16;
    static constexpr uint32_t kBarDone = kBarClean + 8;
    /* per stage: first query row, or kBkvEnd; then (kFuse) the query head */
    static constexpr uint32_t kInfo = kBarClean + (kFuse ? 16 : 0);
    static constexpr uint32_t kInfoH = kInfo + 4 * kStages;
    static constexpr uint32_t kUsed = kInfoH + (kFuse ? 4 * kStages : 0);
    static constexpr uint32_t kDynamicBytes = kUsed + 1024; /* + the base's alignment */
    /* 64-key blocks: the partial sums swapped at the end, fp32, over the ring. */
    static constexpr uint32_t kSwapBytes = kBkvRows * kD * 4;
    /* Every thread that reads a stage arrives on its empty barrier after its
     * last read (sk_bwd90kv_consume): both warpgroups at 128-key blocks,
     * the one that took the stage at 64-key blocks. */
    static constexpr int kEmptyArrivals = 128 * kKeyWgs;
    static constexpr int kSwapArrivals = 256; /* both consumer warpgroups */

    static_assert(kD == 64 || kD == 128, "head dim 64 or 128");
    static_assert(kKeyWgs == 1 || kKeyWgs == 2, "64- or 128-key blocks");
    static_assert(kV % 1024 == 0 && kStage0 % 1024 == 0 && kStageBytes % 1024 == 0 &&
                      kTileBytes % 1024 == 0,
                  "swizzled tiles must be 1024-B aligned");
    static_assert(2 * kSwapBytes <= kStages * kStageBytes, "the swap fits the ring");
    static_assert(kKeyWgs == 2 || kStages % 2 == 0, "alternating warpgroups need an even ring");
    static_assert(kDynamicBytes <= 227 * 1024, "shared memory budget of one sm_90 CTA");
};

/* The kernel's parameters: the tensor maps (in parameter space, where TMA
 * reads them) and the portable kernels' block. */
struct sk_bwd90kv_params {
    CUtensorMap tm_q;  /* [B, Sq, Hq, D] as {D, Hq, Sq, B}, box {64, 1, 64, 1} */
    CUtensorMap tm_do; /* dO, the same */
    CUtensorMap tm_k;  /* [B, Sk, Hkv, D] as {D, Hkv, Sk, B}, box {64, 1, keys, 1} */
    CUtensorMap tm_v;  /* V, the same */
    sk_bwd_params p;
};

/* The producer: the walk and the loads (its own part). */
#include "cuda/attention/bwd_sm90_dkv_producer.cuh"

/* ---------------------------------------------------------------------------
 * Consumers
 * ------------------------------------------------------------------------- */

/* Zero rows [0, lo) of a stage's Q and dO tiles (lo <= 63): rows that see
 * no key of the block, maybe NaN. `threads` consumer threads share the
 * rows, from thread index `tid`, then meet at named barrier `bar`. */
template <int kD, int kKeyWgs>
__device__ __forceinline__ void sk_bwd90kv_zero_rows(uint32_t q_st, int lo, int tid, int threads,
                                                     uint32_t bar) {
    using L = sk_bwd90kv_smem<kD, kKeyWgs>;
    constexpr int kChunks = kD / 8;
    for (int k = tid; k < 2 * lo * kChunks; k += threads) {
        const int t = k / (lo * kChunks), rest = k - t * lo * kChunks;
        const int r = rest / kChunks, c = rest % kChunks;
        *sk90_shared_ptr<uint4>(q_st + t * L::kTileBytes + (c / 8) * L::kQSlab +
                                sk_sw128_offset(r, c % 8)) = make_uint4(0u, 0u, 0u, 0u);
    }
    sk_fence_proxy_async_smem(); /* generic writes before wgmma's reads */
    sk_bar_sync(bar, (uint32_t)threads);
}

/* Compiler barriers: register operands complete before a wgmma fence, and
 * nothing reads or reuses them before the wgmma's wait. */
template <int kN> __device__ __forceinline__ void sk_bwd90kv_fence_f(float (&r)[kN]) {
#pragma unroll
    for (int i = 0; i < kN; ++i) sk_reg_fence(r[i]);
}
__device__ __forceinline__ void sk_bwd90kv_fence_u(uint32_t (&r)[16]) {
#pragma unroll
    for (int i = 0; i < 16; ++i) sk_reg_fence_u32(r[i]);
}

/* A tile's products, split so that each warpgroup overlaps its own
 * exponentials and dS math with its GEMMs (on top of the two warpgroups
 * overlapping each other). Accumulator register i of lane (g, t4) in warp
 * `warp` is key kw + 16 warp + g + 8 ((i >> 1) & 1), query q0 + 8 (i >> 2)
 * + 2 t4 + (i & 1); the A fragment of queries 16 kk .. 16 kk + 15 is
 * registers 8 kk .. 8 kk + 7, pairwise. Per tile, four commit groups in
 * this order: S^T, dP^T (sk_bwd90kv_issue_sdp), then dV, dK
 * (sk_bwd90kv_finish). At D = 64 (kCross in
 * sk_bwd90kv_consume) the last two stay in flight
 * into the next tile, whose S^T and dP^T are issued behind them, and are
 * retired there (sk_bwd90kv_retire) before the older stage is freed: the
 * tensor cores get the next tile's work while the dK product drains. At
 * D = 128 the registers do not allow it (ptxas serialises every wgmma,
 * C7512), and each tile retires its own groups. */

/* Issue S^T = K Q^T and dP^T = V dO^T of the tile at q_st: two commit
 * groups, S^T first, not waited for. */
template <int kDtype, int kD, int kKeyWgs>
__device__ __forceinline__ void sk_bwd90kv_issue_sdp(uint32_t k_wg, uint32_t v_wg, uint32_t q_st,
                                                     float (&s)[32], float (&dp)[32]) {
    using L = sk_bwd90kv_smem<kD, kKeyWgs>;
    /* No register fences on s / dp here: with the previous tile's groups
     * in flight ptxas reads them as definitions inside a wgmma pipeline
     * stage and serialises every wgmma (C7513). */
    sk_wgmma_fence();
    sk_bwd90_gemm_ss<kDtype, kD>(s, k_wg, L::kKvSlab, q_st, L::kQSlab);
    sk_wgmma_commit();
    sk_bwd90_gemm_ss<kDtype, kD>(dp, v_wg, L::kKvSlab, q_st + L::kTileBytes, L::kQSlab);
    sk_wgmma_commit();
}

/* Wait until at most kPending groups are in flight, which completes a
 * tile's dV and dK groups (older than the kPending newest): dk, dv, pa and
 * dsa are the program's again, and that tile's stage may be freed. */
template <int kPending, int kD>
__device__ __forceinline__ void sk_bwd90kv_retire(float (&dk)[kD / 2], float (&dv)[kD / 2],
                                                  uint32_t (&pa)[16], uint32_t (&dsa)[16]) {
    sk_wgmma_wait<kPending>();
    sk_bwd90kv_fence_f(dk);
    sk_bwd90kv_fence_f(dv);
    sk_bwd90kv_fence_u(pa);
    sk_bwd90kv_fence_u(dsa);
}

/* Whether pair (key, q) counts (the tile-wide `all` skips the tests). */
__device__ __forceinline__ bool sk_bwd90kv_counts(const sk_bwd_params &p, bool all, int32_t key,
                                                  int32_t q) {
    return all || (key < p.seq_k && q < p.seq_q && (!p.causal || key <= q + p.diag));
}

/* The fused dQ's parts (kFuse): dS^T store, K clean-up, dQ product and adds. */
#include "cuda/attention/bwd_sm90_dkv_dq.cuh"

/* The rest of a tile whose S^T and dP^T groups are the only ones in
 * flight: P^T = 2^(S^T s log2(e) - lse2) as soon as S^T lands (under
 * dP^T), dV += P^T dO issued, dS^T = P^T (dP^T - Dl) under it, dK += dS^T
 * Q issued. Keys kw .. kw + 63, queries q0 .. q0 + 63 (Q, dO at q_st;
 * lse2, Dl at rows). Masked entries are selected to 0, never multiplied.
 * Returns with the dV and dK groups in flight: pa and dsa are their A
 * operands until sk_bwd90kv_retire. kFuse: dS^T also goes to ds_st
 * (fenced for wgmma) before dK is issued. */
template <int kDtype, int kD, int kKeyWgs, bool kFuse>
__device__ __forceinline__ void
sk_bwd90kv_finish(const sk_bwd_params &p, uint32_t q_st, const float *rows, int32_t kw, int32_t q0,
                  float (&s)[32], float (&dp)[32], uint32_t (&pa)[16], uint32_t (&dsa)[16],
                  float (&dk)[kD / 2], float (&dv)[kD / 2], uint32_t ds_st) {
    using L = sk_bwd90kv_smem<kD, kKeyWgs>;
    const int wtid = threadIdx.x % 128, warp = wtid / 32, lane = wtid % 32;
    const int g = lane / 4, t4 = lane % 4;
    /* Every pair counts unless the tile crosses Sk, Sq or the diagonal. */
    const bool all = kw + kBkvRows <= p.seq_k && q0 + kBkvRows <= p.seq_q &&
                     (!p.causal || kw + kBkvRows - 1 <= q0 + p.diag);
    const int32_t key0 = kw + 16 * warp + g;

    sk_wgmma_wait<1>(); /* S^T */
    sk_bwd90kv_fence_f(s);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const int col = 8 * j + 2 * t4;
        const float2 l2 = *(const float2 *)(rows + col);
#pragma unroll
        for (int ii = 0; ii < 2; ++ii)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int i = 4 * j + 2 * ii + e;
                const float pv = sk_ex2(fmaf(s[i], p.scale_log2, -(e ? l2.y : l2.x)));
                s[i] = sk_bwd90kv_counts(p, all, key0 + 8 * ii, q0 + col + e) ? pv : 0.f;
            }
    }
#pragma unroll
    for (int m = 0; m < 16; ++m) pa[m] = sk_sm80_pack<kDtype>(s[2 * m], s[2 * m + 1]);
    sk_bwd90kv_fence_f(dv);
    sk_bwd90kv_fence_u(pa);
    sk_wgmma_fence();
    sk_bwd90_gemm_rs<kDtype, kD>(dv, pa, q_st + L::kTileBytes, L::kQSlab);
    sk_wgmma_commit();

    sk_wgmma_wait<1>(); /* dP^T; dV may still run */
    sk_bwd90kv_fence_f(dp);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const int col = 8 * j + 2 * t4;
        const float2 d2 = *(const float2 *)(rows + kBkvRows + col);
#pragma unroll
        for (int ii = 0; ii < 2; ++ii)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int i = 4 * j + 2 * ii + e;
                /* P^T is 0 exactly where the pair does not count (and
                 * maybe where it underflowed: then dS^T is +-0 anyway). */
                dp[i] = s[i] != 0.f ? s[i] * (dp[i] - (e ? d2.y : d2.x)) : 0.f;
            }
    }
#pragma unroll
    for (int m = 0; m < 16; ++m) dsa[m] = sk_sm80_pack<kDtype>(dp[2 * m], dp[2 * m + 1]);
    if constexpr (kFuse) {
        sk_bwd90kv_store_ds(dsa, ds_st);
        sk_fence_proxy_async_smem(); /* generic writes before the dQ product's reads */
    }
    sk_bwd90kv_fence_f(dk);
    sk_bwd90kv_fence_u(dsa);
    sk_wgmma_fence();
    sk_bwd90_gemm_rs<kDtype, kD>(dk, dsa, q_st, L::kQSlab);
    sk_wgmma_commit();
}

/* A warp's 16 accumulator rows (of the warpgroup's 64) times `mul`, rounded
 * to the dtype, written to rows below `valid` of dst (the warpgroup's
 * first key; byte row stride `stride`), staged through the same rows of a
 * K or V tile (slabs `slab` bytes apart), which only this warp uses now. */
template <int kDtype, int kD>
__device__ __forceinline__ void sk_bwd90kv_store(const float (&acc)[kD / 2], float mul,
                                                 uint32_t tile, uint32_t slab, char *dst,
                                                 int32_t stride, int valid) {
    constexpr int kChunks = kD / 8;
    const int wtid = threadIdx.x % 128, warp = wtid / 32, lane = wtid % 32;
    const int g = lane / 4, t4 = lane % 4;
#pragma unroll
    for (int j = 0; j < kChunks; ++j)
#pragma unroll
        for (int ii = 0; ii < 2; ++ii) {
            const int r = 16 * warp + g + 8 * ii;
            *sk90_shared_ptr<uint32_t>(tile + (j / 8) * slab + sk_sw128_offset(r, j % 8) + 4 * t4) =
                sk_sm80_pack<kDtype>(acc[4 * j + 2 * ii] * mul, acc[4 * j + 2 * ii + 1] * mul);
        }
    __syncwarp();
#pragma unroll
    for (int k = lane; k < 16 * kChunks; k += 32) {
        const int r = 16 * warp + k / kChunks, c = k % kChunks;
        if (r < valid)
            *(uint4 *)(dst + (int64_t)r * stride + c * 16) =
                *sk90_shared_ptr<const uint4>(tile + (c / 8) * slab + sk_sw128_offset(r, c % 8));
    }
}

/* Free a stage: each thread arrives after its own last read of it (the
 * lse2 / Dl rows are read by every lane). A lane-0 arrival after
 * __syncwarp orders the other lanes' reads too, but racecheck does not
 * follow that chain and reports the producer's next bulk copy into the
 * rows as a race (docs/perf/backward.md). */
__device__ __forceinline__ void sk_bwd90kv_release(uint32_t empty) {
    sk_mbar_arrive(empty);
}

/* A consumer warpgroup (wg 0 or 1): its tiles, then its part of the
 * epilogue. kFuse: each tile's dQ is added into dqacc as well
 * (bwd_sm90_dkv_dq.cuh); start, end: the walk's T row, for the K clean-up. */
template <int kDtype, int kD, int kKeyWgs, bool kFuse>
__device__ void sk_bwd90kv_consume(const sk_bwd_params &p, uint32_t base, int wg, int32_t b,
                                   int32_t hk, int32_t kt, [[maybe_unused]] float *dqacc,
                                   [[maybe_unused]] int32_t start, [[maybe_unused]] int32_t end) {
    using L = sk_bwd90kv_smem<kD, kKeyWgs, kFuse>;
    const int wtid = threadIdx.x % 128;
    const int32_t kw = kt + (kKeyWgs == 2 ? kBkvRows * wg : 0); /* this warpgroup's first key */
    const uint32_t own = kKeyWgs == 2 ? (uint32_t)(wg * kBkvRows * 128) : 0u;
    const uint32_t k_wg = base + L::kK + own, v_wg = base + L::kV + own;
    const volatile int32_t *info = sk90_shared_ptr<volatile int32_t>(base + L::kInfo);
    float dk[kD / 2], dv[kD / 2];
#pragma unroll
    for (int i = 0; i < kD / 2; ++i) dk[i] = dv[i] = 0.f;

    /* Both warpgroups take every stage, or each every other one. A tile's
     * stage is freed once its last GEMM completed: at the next tile when
     * the groups cross tiles (kCross; not with the fused dQ, which retires
     * every group of its tile), else at its own end. */
    constexpr bool kCross = kD == 64 && !kFuse;
    if constexpr (kFuse)
        if (p.causal) sk_bwd90kv_clean_keys<kD, kKeyWgs>(p, base, kt, start, end);
    [[maybe_unused]] uint32_t tiles = 0; /* kFuse: this warpgroup's tiles so far */
    const uint32_t first = kKeyWgs == 2 ? 0u : (uint32_t)wg, step = kKeyWgs == 2 ? 1u : 2u;
    float s[32], dp[32];
    uint32_t pa[16], dsa[16];
    bool kv_ready = false;
    [[maybe_unused]] bool pending = false; /* kCross: a tile's groups are in flight */
    [[maybe_unused]] uint32_t pending_stage = 0;
    for (uint32_t n = first;; n += step) {
        const uint32_t stage = n % L::kStages, phase = (n / L::kStages) & 1u;
        sk_mbar_wait(base + L::kBarFull + 8 * stage, phase, "dkv full");
        const int32_t q0 = info[stage]; /* every reader releases the stage */
        if (q0 < 0) break;
        if (!kv_ready) {
            sk_mbar_wait(base + L::kBarKv, 0, "dkv K/V");
            kv_ready = true;
        }
        const uint32_t q_st = base + L::kStage0 + stage * L::kStageBytes;
        const int lo = p.causal ? kt - p.diag - q0 : 0; /* rows before lo see no key */
        if (lo > 0) {
            if constexpr (kKeyWgs == 2)
                sk_bwd90kv_zero_rows<kD, kKeyWgs>(q_st, lo, (int)threadIdx.x - 128, 256,
                                                  kBkvBarZero);
            else
                sk_bwd90kv_zero_rows<kD, kKeyWgs>(q_st, lo, wtid, 128, kBkvBarZero + wg);
        }
        sk_bwd90kv_issue_sdp<kDtype, kD, kKeyWgs>(k_wg, v_wg, q_st, s, dp);
        if constexpr (kCross) {
            /* The previous tile's dV and dK groups, older than this S^T and
             * dP^T. Unconditional: with nothing older it waits for nothing,
             * and ptxas sees every path retire them. */
            sk_bwd90kv_retire<2, kD>(dk, dv, pa, dsa);
            if (pending) sk_bwd90kv_release(base + L::kBarEmpty + 8 * pending_stage);
        }
        const uint32_t ds_buf = base + L::kDs + (tiles & 1u) * L::kDsBuf;
        const uint32_t ds_own = ds_buf + (uint32_t)wg * (kBkvRows * 128);
        sk_bwd90kv_finish<kDtype, kD, kKeyWgs, kFuse>(
            p, q_st, sk90_shared_ptr<const float>(base + L::kRows + stage * L::kRowBytes), kw, q0,
            s, dp, pa, dsa, dk, dv, ds_own);
        if constexpr (kFuse) {
            const int32_t h = sk90_shared_ptr<volatile int32_t>(base + L::kInfoH)[stage];
            float *rows = dqacc + ((int64_t)b * p.heads_q + h) * p.sq_pad * kD;
            sk_bwd90kv_dq_tile<kDtype, kD, kKeyWgs>(p, base, wg, ds_buf, ds_own, k_wg, rows, q0,
                                                    dk, dv, pa, dsa);
            sk_bwd90kv_release(base + L::kBarEmpty + 8 * stage);
            ++tiles;
        } else if constexpr (!kCross) {
            sk_bwd90kv_retire<0, kD>(dk, dv, pa, dsa);
            sk_bwd90kv_release(base + L::kBarEmpty + 8 * stage);
        }
        pending = true;
        pending_stage = stage;
    }
    if constexpr (kCross) { /* the last tile's groups (nothing in flight when none ran) */
        sk_bwd90kv_retire<0, kD>(dk, dv, pa, dsa);
        if (pending) sk_bwd90kv_release(base + L::kBarEmpty + 8 * pending_stage);
    }
    /* Bulk dQ: the last reduce-add read its staged tile (which must outlive
     * it) and landed, before the CTA ends. */
    if constexpr (L::kBulk)
        if (wtid == 0) sk_bulk_wait<0>();

    char *dko = p.dk + b * p.dk_sb + hk * p.dk_sh + (int64_t)kw * p.dk_ss;
    char *dvo = p.dv + b * p.dv_sb + hk * p.dv_sh + (int64_t)kw * p.dv_ss;
    const int valid = p.seq_k - kw;
    /* Merged fused dQ: the other warpgroup's last product may still read
     * this warpgroup's K rows, which the epilogue overwrites. An mbarrier
     * each thread arrives on and waits for (as the 64-key swap: the chain
     * racecheck follows). */
    if constexpr (L::kMerged) {
        sk_mbar_arrive(base + L::kBarDone);
        sk_mbar_wait(base + L::kBarDone, 0, "dkv dQ done");
    }
    if constexpr (kKeyWgs == 2) {
        /* Only this warpgroup reads its K and V rows: they stage its outputs. */
        sk_bwd90kv_store<kDtype, kD>(dk, p.scale, k_wg, L::kKvSlab, dko, p.dk_ss, valid);
        sk_bwd90kv_store<kDtype, kD>(dv, 1.f, v_wg, L::kKvSlab, dvo, p.dv_ss, valid);
    } else {
        /* Both warpgroups hold partial sums of the same keys: warpgroup 0
         * gives its dV and completes dK, warpgroup 1 the reverse. Each
         * thread swaps with the same thread of the other warpgroup (same
         * register layout), through the ring (no tile is in flight once
         * both saw their end marks). Every thread arrives and waits on two
         * mbarriers: "left the ring" before the writes, "gave" before the
         * reads (each thread's own arrival orders its accesses, which
         * racecheck follows; it reported the named-barrier version). */
        float *swap = sk90_shared_ptr<float>(base + L::kStage0);
        float *give = swap + (wg == 0 ? 0 : kBkvRows * kD),
              *take = swap + (wg == 0 ? kBkvRows * kD : 0);
        sk_mbar_arrive(base + L::kBarSwap);
        sk_mbar_wait(base + L::kBarSwap, 0, "dkv swap ready");
#pragma unroll
        for (int i = 0; i < kD / 2; ++i) give[i * 128 + wtid] = wg == 0 ? dv[i] : dk[i];
        sk_mbar_arrive(base + L::kBarSwap + 8);
        sk_mbar_wait(base + L::kBarSwap + 8, 0, "dkv swap given");
        if (wg == 0) {
#pragma unroll
            for (int i = 0; i < kD / 2; ++i) dk[i] += take[i * 128 + wtid];
            sk_bwd90kv_store<kDtype, kD>(dk, p.scale, k_wg, L::kKvSlab, dko, p.dk_ss, valid);
        } else {
#pragma unroll
            for (int i = 0; i < kD / 2; ++i) dv[i] = take[i * 128 + wtid] + dv[i];
            sk_bwd90kv_store<kDtype, kD>(dv, 1.f, v_wg, L::kKvSlab, dvo, p.dv_ss, valid);
        }
    }
}

/* ---------------------------------------------------------------------------
 * Kernel
 * ------------------------------------------------------------------------- */

/* The fused kernel's parameters: the dK/dV kernel's and the fp32 dQaccum
 * [B * Hq, sq_pad, D] (zeroed on the stream before the launch). */
struct sk_bwd90kv_fused_params {
    sk_bwd90kv_params k;
    float *dqacc;
};

/* The kernel body, for both kernels below (P: a __grid_constant__
 * parameter, where TMA reads the maps). */
template <int kDtype, int kD, int kKeyWgs, bool kFuse>
__device__ __forceinline__ void sk_bwd90kv_body(const sk_bwd90kv_params &P, float *dqacc,
                                                unsigned char *smem_raw) {
    using L = sk_bwd90kv_smem<kD, kKeyWgs, kFuse>;
    const sk_bwd_params &p = P.p;
    const int4 info = p.dkv_info[blockIdx.x];
    if (info.x < 0 || info.x >= p.dkv_tiles) return; /* a stale plan: no tile */
    const int32_t j = info.x % p.col_blocks, bh = info.x / p.col_blocks;
    const int32_t hk = bh % p.heads_kv, b = bh / p.heads_kv;
    const int32_t kt = j * p.block_k; /* the block's first key */
    if (kt >= p.seq_k) return;
    const int32_t end = min(max(info.z, 0), p.nnz), start = min(max(info.y, 0), end);
    const uint32_t base = ((uint32_t)__cvta_generic_to_shared(smem_raw) + 1023u) & ~1023u;

    if (threadIdx.x == 0) {
        for (int s = 0; s < L::kStages; ++s) {
            sk_mbar_init(base + L::kBarFull + 8 * s, 1);
            sk_mbar_init(base + L::kBarEmpty + 8 * s, L::kEmptyArrivals);
        }
        sk_mbar_init(base + L::kBarKv, 1);
        sk_mbar_init(base + L::kBarSwap, L::kSwapArrivals);
        sk_mbar_init(base + L::kBarSwap + 8, L::kSwapArrivals);
        if constexpr (kFuse) {
            sk_mbar_init(base + L::kBarClean, 256);
            sk_mbar_init(base + L::kBarDone, 256);
        }
        sk_fence_mbar_init();
    }
    __syncthreads();

    if (threadIdx.x < 128) {
        sk_setmaxnreg_dec<kBkvProducerRegs>();
        if (threadIdx.x == 0) {
            sk_prefetch_tensormap(&P.tm_q);
            sk_prefetch_tensormap(&P.tm_do);
            sk_prefetch_tensormap(&P.tm_k);
            sk_prefetch_tensormap(&P.tm_v);
            sk_bwd90kv_produce<kD, kKeyWgs, kFuse>(P, base, b, hk, kt, start, end);
        }
        return;
    }
    sk_setmaxnreg_inc<kBkvConsumerRegs>();
    sk_bwd90kv_consume<kDtype, kD, kKeyWgs, kFuse>(p, base, (int)threadIdx.x / 128 - 1, b, hk, kt,
                                                   dqacc, start, end);
}

template <int kDtype, int kD, int kKeyWgs>
__global__ void __launch_bounds__(kBkvThreads, 1)
    sk_bwd90kv_kernel(const __grid_constant__ sk_bwd90kv_params P) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    sk_bwd90kv_body<kDtype, kD, kKeyWgs, false>(P, nullptr, smem_raw);
}

/* bwd->deterministic = 0: the same walk, and each tile's dQ added into
 * P.dqacc (bwd_sm90_dkv_dq.cuh). */
template <int kDtype, int kD, int kKeyWgs>
__global__ void __launch_bounds__(kBkvThreads, 1)
    sk_bwd90kv_fused_kernel(const __grid_constant__ sk_bwd90kv_fused_params P) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    sk_bwd90kv_body<kDtype, kD, kKeyWgs, true>(P.k, P.dqacc, smem_raw);
}

/* ---------------------------------------------------------------------------
 * Host side
 * ------------------------------------------------------------------------- */

static int64_t sk_bwd90kv_count = 0;

extern "C" int64_t sk_bwd90_dkv_launches(void) {
    return __atomic_load_n(&sk_bwd90kv_count, __ATOMIC_RELAXED);
}

/* Whether TMA takes the tensors this kernel loads (Q, dO, K, V). */
static bool sk_bwd90kv_covers(const sk_attention_backward_problem *bp) {
    const sk_attention_problem *p = &bp->fwd;
    if ((p->dtype != SK_DTYPE_F16 && p->dtype != SK_DTYPE_BF16) ||
        (p->head_dim != 64 && p->head_dim != 128) || (p->block_k != 64 && p->block_k != 128) ||
        (p->block_q != 64 && p->block_q != 128))
        return false;
    const int64_t *st[4] = {p->q_stride, bp->dout_stride, p->k_stride, p->v_stride};
    for (int t = 0; t < 4; ++t) {
        const int64_t seq = t < 2 ? p->seq_q : p->seq_k, heads = t < 2 ? p->heads_q : p->heads_kv;
        if (!sk90_stride_ok(st[t][0], p->batch, 2) || !sk90_stride_ok(st[t][1], seq, 2) ||
            !sk90_stride_ok(st[t][2], heads, 2))
            return false;
    }
    return true;
}

template <int kDtype, int kD, int kKeyWgs, bool kFuse>
static sk_status sk_bwd90kv_launch_typed(const sk_bwd90kv_fused_params &prm, int grid,
                                         cudaStream_t stream) {
    using L = sk_bwd90kv_smem<kD, kKeyWgs, kFuse>;
    if constexpr (kFuse) {
        void (*kernel)(sk_bwd90kv_fused_params) = sk_bwd90kv_fused_kernel<kDtype, kD, kKeyWgs>;
        SK_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)L::kDynamicBytes),
                    "cudaFuncSetAttribute (Hopper fused backward)");
        kernel<<<grid, kBkvThreads, L::kDynamicBytes, stream>>>(prm);
        SK_CUDA_TRY(cudaGetLastError(), "Hopper fused backward kernel launch");
    } else {
        void (*kernel)(sk_bwd90kv_params) = sk_bwd90kv_kernel<kDtype, kD, kKeyWgs>;
        SK_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)L::kDynamicBytes),
                    "cudaFuncSetAttribute (Hopper backward dK/dV)");
        kernel<<<grid, kBkvThreads, L::kDynamicBytes, stream>>>(prm.k);
        SK_CUDA_TRY(cudaGetLastError(), "Hopper backward dK/dV kernel launch");
    }
    return SK_STATUS_SUCCESS;
}

/* The instance for the problem's dtype, head dim and key block. */
template <bool kFuse>
static sk_status sk_bwd90kv_dispatch(const sk_attention_problem *p,
                                     const sk_bwd90kv_fused_params &prm, int grid,
                                     cudaStream_t stream) {
    const bool f16 = p->dtype == SK_DTYPE_F16, d64 = p->head_dim == 64, k64 = p->block_k == 64;
    if (f16 && d64)
        return k64 ? sk_bwd90kv_launch_typed<SK_DTYPE_F16, 64, 1, kFuse>(prm, grid, stream)
                   : sk_bwd90kv_launch_typed<SK_DTYPE_F16, 64, 2, kFuse>(prm, grid, stream);
    if (f16)
        return k64 ? sk_bwd90kv_launch_typed<SK_DTYPE_F16, 128, 1, kFuse>(prm, grid, stream)
                   : sk_bwd90kv_launch_typed<SK_DTYPE_F16, 128, 2, kFuse>(prm, grid, stream);
    if (d64)
        return k64 ? sk_bwd90kv_launch_typed<SK_DTYPE_BF16, 64, 1, kFuse>(prm, grid, stream)
                   : sk_bwd90kv_launch_typed<SK_DTYPE_BF16, 64, 2, kFuse>(prm, grid, stream);
    return k64 ? sk_bwd90kv_launch_typed<SK_DTYPE_BF16, 128, 1, kFuse>(prm, grid, stream)
               : sk_bwd90kv_launch_typed<SK_DTYPE_BF16, 128, 2, kFuse>(prm, grid, stream);
}

/* The parameters of either kernel: false when the kernel does not cover
 * the problem or a tensor map cannot be encoded (then nothing runs). */
static bool sk_bwd90kv_prepare(const sk_attention_backward_problem *bp, const sk_bwd_shape *s,
                               const struct sk_bwd_params *k, sk_bwd90kv_params *prm) {
    const sk_attention_problem *p = &bp->fwd;
    if (s->dkv_tiles <= 0 || !sk_bwd90kv_covers(bp)) return false;
    memset(prm, 0, sizeof *prm);
    prm->p = *k;
    const int keys = p->block_k;
    CUresult r =
        sk90_encode(&prm->tm_q, p, p->dtype, 64, p->q, p->seq_q, p->heads_q, p->q_stride, kBkvRows);
    if (r == CUDA_SUCCESS)
        r = sk90_encode(&prm->tm_do, p, p->dtype, 64, bp->dout, p->seq_q, p->heads_q,
                        bp->dout_stride, kBkvRows);
    if (r == CUDA_SUCCESS)
        r = sk90_encode(&prm->tm_k, p, p->dtype, 64, p->k, p->seq_k, p->heads_kv, p->k_stride,
                        keys);
    if (r == CUDA_SUCCESS)
        r = sk90_encode(&prm->tm_v, p, p->dtype, 64, p->v, p->seq_k, p->heads_kv, p->v_stride,
                        keys);
    return r == CUDA_SUCCESS;
}

sk_status sk_attention_bwd_sm90_dkv_launch(const sk_attention_backward_problem *bp,
                                           const sk_bwd_shape *s, const struct sk_bwd_params *k,
                                           cudaStream_t stream, int *launched) {
    *launched = 0;
    sk_bwd90kv_fused_params prm;
    if (!sk_bwd90kv_prepare(bp, s, k, &prm.k)) return SK_STATUS_SUCCESS; /* the portable kernel runs */
    prm.dqacc = NULL;
    SK_TRY(sk_bwd90kv_dispatch<false>(&bp->fwd, prm, s->dkv_tiles, stream));
    __atomic_fetch_add(&sk_bwd90kv_count, 1, __ATOMIC_RELAXED);
    *launched = 1;
    return SK_STATUS_SUCCESS;
}

static int64_t sk_bwd90kv_fused_count = 0;

extern "C" int64_t sk_bwd90_fused_launches(void) {
    return __atomic_load_n(&sk_bwd90kv_fused_count, __ATOMIC_RELAXED);
}

sk_status sk_attention_bwd_sm90_fused_launch(const sk_attention_backward_problem *bp,
                                             const sk_bwd_shape *s, const struct sk_bwd_params *k,
                                             float *dqacc, size_t dqacc_bytes,
                                             cudaStream_t stream, int *launched) {
    *launched = 0;
    sk_bwd90kv_fused_params prm;
    if (dqacc == NULL || !sk_bwd90kv_prepare(bp, s, k, &prm.k)) return SK_STATUS_SUCCESS;
    prm.dqacc = dqacc;
    /* Every add lands on zeros; a memset node when captured. */
    SK_CUDA_TRY(cudaMemsetAsync(dqacc, 0, dqacc_bytes, stream), "zeroing the backward's dQaccum");
    SK_TRY(sk_bwd90kv_dispatch<true>(&bp->fwd, prm, s->dkv_tiles, stream));
    /* It is the dK/dV kernel too (the GPU tests count that). */
    __atomic_fetch_add(&sk_bwd90kv_count, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&sk_bwd90kv_fused_count, 1, __ATOMIC_RELAXED);
    *launched = 1;
    return SK_STATUS_SUCCESS;
}
