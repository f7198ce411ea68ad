/*
 * attention_sm90.cu - the Hopper block-sparse attention forward: TMA, wgmma,
 * warp specialisation, a persistent grid.
 *
 * Algorithm. A CTA of 384 threads (one per SM) runs tiles taken from the
 * plan's schedule (tile = tile_order[atomicAdd(tile_counter, 1)], longest
 * rows first). A tile is 128 query rows of one (batch, query head) and the
 * key blocks of one layout row, each 128 keys wide.
 *   - Warpgroup 0 is the producer; it gives registers away (setmaxnreg).
 *     Its warp 1 (the scheduler) takes tiles from the schedule and decodes
 *     them (clamped block range) up to kSchedSlots ahead. Its warp 0 reads
 *     each row's column indices 32 at a time and one elected thread issues
 *     every TMA load: Q (one buffer at D = 128, loaded once both consumers'
 *     last S GEMMs of the previous tile are done; two at D = 64, so the
 *     next tile's Q loads while this tile runs), then K_0, K_1, V_0, K_2,
 *     V_1, ... into two pipelines (K and V: 2 stages each at D = 128, 3 at
 *     D = 64), each stage with a "full" mbarrier (expect_tx = block bytes)
 *     and an "empty" one (arrivals from both consumer warpgroups). The TMA
 *     row coordinate of block c is c * 128; rows past Sq or Sk are
 *     zero-filled. Each K stage carries its block index and whether another
 *     block follows, so the consumers read no layout memory.
 *   - Warpgroups 1 and 2 are consumers of 64 query rows each. Step j issues
 *     S_j = Q K_j^T (wgmma, both operands in shared memory) and
 *     O += P_{j-1} V_{j-1} (wgmma, P from registers), then runs the online
 *     softmax of S_j while the P V GEMM is in flight (FA3's intra-warpgroup
 *     overlap). The two consumers take turns issuing their GEMMs (named
 *     barriers kBarTurn0/1): one warpgroup's softmax overlaps the other's
 *     GEMMs (ping-pong). At D = 128, O is rescaled for the previous block's
 *     max between the two GEMM issues, off the softmax's critical path.
 *   - Softmax is in fp32 and base 2: p = 2^(s * scale * log2(e) - m'), with
 *     the row max m' pre-scaled: one FFMA and one MUFU.EX2 per score. Row
 *     sums stay per thread until the epilogue.
 *   - Epilogue: O / rowsum, converted and written with stmatrix into a
 *     swizzled shared tile of the warpgroup's own, then one thread stores it
 *     with TMA (rows past Sq are clipped by TMA). LSE (natural log) is stored
 *     by the threads holding the rows, bounds-checked.
 *
 * Invariants.
 *   - Producer and consumers walk the same block sequence: positions
 *     [start, end) of the layout row, with the offsets clamped to [0, nnz]
 *     and made non-decreasing, skipping any index outside [0, col_blocks)
 *     and, when causal, any block no query row of the tile can see
 *     (sk90_block_visible). The producer alone reads the layout and hands
 *     the sequence over with the tiles and K stages, so every mbarrier sees
 *     matching arrivals and phases for any layout content; a tile with no
 *     visible block loads nothing and its rows get O = 0, LSE = -inf.
 *   - Rows every key of which is masked keep m = -inf; the exponent then
 *     subtracts 0 instead of -inf, so p = 0, the row sum stays 0, O = 0 and
 *     LSE = -inf, without NaN.
 *   - The masks (causal, key tail) run only on blocks that need them.
 *   - Every issue of a consumer's GEMMs is bracketed by
 *     bar.sync(own turn) / bar.arrive(other's turn). Both consumers issue the
 *     same number of times (same tiles, same blocks), so the turns alternate
 *     strictly; consumer 1 opens with one arrival and consumer 0 closes
 *     with one extra sync, which leaves no barrier half-arrived at exit.
 *   - wgmma sequences are never issued under run-time conditions (ptxas
 *     would serialize them): the first S, the steady steps and the last P V
 *     of a tile are written out.
 *   - Shared memory: kQBufs Q tiles 128 x D, kKStages K and kVStages V
 *     blocks 128 x D, O 128 x D, all in 128B-swizzled 64-column slabs (the
 *     TMA box layout), 1024-B aligned; at D = 128, 1 + 2 + 2 + 1 tiles of
 *     32 KB: 193 KB with the barriers and the alignment slack (227 KB
 *     allowed, static_assert below).
 */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cuda/attention_kernels.h"
#include "cuda/cuda_check.cuh"
#include "cuda/hopper.cuh"
#include "cuda/ptx.cuh"
#include "cuda/tensor_map.h"

/* ---------------------------------------------------------------------------
 * Tile shapes and shared-memory layout
 * ------------------------------------------------------------------------- */

/* Tuning knobs (compile-time; step 9 measured variants built with other values):
 * K and V pipeline stages and Q buffers at D = 128 (up to 7 tiles of 32 KB
 * fit, O's included; docs/perf/hopper.md, step 9: one Q buffer measured
 * +1.5..2.6 % over two, a third V or K stage +-0), K/V stages at D = 64 (with
 * 2 Q buffers). */
#ifndef SK90_KSTAGES_D128
#define SK90_KSTAGES_D128 2
#endif
#ifndef SK90_VSTAGES_D128
#define SK90_VSTAGES_D128 2
#endif
#ifndef SK90_QBUFS_D128
#define SK90_QBUFS_D128 1
#endif
#ifndef SK90_STAGES_D64
#define SK90_STAGES_D64 3
#endif

enum {
    kThreads = 384,        /* producer warpgroup + two consumer warpgroups */
    kBlockM = 128,         /* query rows per tile (the layout's block_q) */
    kBlockN = 128,         /* keys per block (the layout's block_k) */
    kWgRows = 64,          /* query rows per consumer warpgroup */
    kSlabCols = 64,        /* columns per 128-byte swizzled slab (2-byte elements) */
    kSlabRowBytes = 128,   /* one row of a slab */
    kSwizzleAtom = 1024,   /* 8 rows x 128 B: the 128B-swizzle period */
    kProducerRegs = 40,    /* setmaxnreg: 128 * 40 + 256 * 232 <= 384 * 168, the launch allocation */
    kConsumerRegs = 232,
    kTileSlots = 2,        /* tile ids in flight between producer and consumers */
    kSchedSlots = 4,       /* decoded tiles in flight between scheduler and producer warps */
    kBarTurn0 = 1,         /* named barriers; 0 is __syncthreads */
    kBarTurn1 = 2,
    kBarEpilogue0 = 3,
    kBarEpilogue1 = 4,
    kTileEnd = -1,         /* tile slot: no more tiles */
    kTileSkip = -2,        /* tile slot: a schedule entry out of range, skipped */
    kTileEmptyBase = -3,   /* tile slot kTileEmptyBase - t: tile t has no visible block */
    kInfoMore = (int)0x80000000u /* block info: another block follows in this tile */
};
static_assert(kProducerRegs * 128 + kConsumerRegs * 256 <= kThreads * 168, "register budget");
static_assert(kBlockM == 2 * kWgRows, "two consumer warpgroups of 64 rows");

/* Byte offsets inside the 1024-aligned dynamic shared memory, per head dim. */
template <int HD>
struct sk90_smem {
    static constexpr int kSlabs = HD / kSlabCols;
    static constexpr int kKStages = HD == 128 ? SK90_KSTAGES_D128 : SK90_STAGES_D64;
    static constexpr int kVStages = HD == 128 ? SK90_VSTAGES_D128 : SK90_STAGES_D64;
    /* With 2, the next tile's Q loads while this tile runs; with 1, once
     * both consumers' last S GEMMs of this tile are done. */
    static constexpr int kQBufs = HD == 128 ? SK90_QBUFS_D128 : 2;
    /* Rescale O for the previous block's max while the next S GEMM runs
     * (measured: +1-2.5% at D = 128, -2% at D = 64, docs/perf/hopper.md). */
    static constexpr bool kRescaleEarly = HD == 128;
    static constexpr uint32_t kBlockBytes = kBlockN * HD * 2; /* one K or V block */
    static constexpr uint32_t kQBytes = kBlockM * HD * 2;     /* one of kQBufs Q tiles */
    static constexpr uint32_t kSlab128 = 128 * kSlabRowBytes;  /* a slab of 128 rows */
    static constexpr uint32_t kOWgBytes = kWgRows * HD * 2;    /* one warpgroup's O */
    static constexpr uint32_t kOSlabBytes = kWgRows * kSlabRowBytes;
    static constexpr uint32_t kQ = 0;
    static constexpr uint32_t kK = kQ + kQBufs * kQBytes;
    static constexpr uint32_t kV = kK + kKStages * kBlockBytes;
    static constexpr uint32_t kO = kV + kVStages * kBlockBytes;
    /* mbarriers (8 B each), then the tile-id slots. */
    static constexpr uint32_t kBarQFull = kO + 2 * kOWgBytes;
    static constexpr uint32_t kBarQEmpty = kBarQFull + 8 * kQBufs;
    static constexpr uint32_t kBarKFull = kBarQEmpty + 8 * kQBufs;
    static constexpr uint32_t kBarKEmpty = kBarKFull + 8 * kKStages;
    static constexpr uint32_t kBarVFull = kBarKEmpty + 8 * kKStages;
    static constexpr uint32_t kBarVEmpty = kBarVFull + 8 * kVStages;
    static constexpr uint32_t kBarTileFull = kBarVEmpty + 8 * kVStages;
    static constexpr uint32_t kBarTileEmpty = kBarTileFull + 8 * kTileSlots;
    static constexpr uint32_t kBarSchedFull = kBarTileEmpty + 8 * kTileSlots;
    static constexpr uint32_t kBarSchedEmpty = kBarSchedFull + 8 * kSchedSlots;
    static constexpr uint32_t kTileIds = kBarSchedEmpty + 8 * kSchedSlots;
    static constexpr uint32_t kBlockInfo = kTileIds + 4 * kTileSlots; /* per K stage */
    static constexpr uint32_t kSched = kBlockInfo + 4 * kKStages; /* {tile, start, end, -} */
    static constexpr uint32_t kUsed = kSched + 16 * kSchedSlots;
    /* + slack to align the dynamic base up to 1024 B. */
    static constexpr uint32_t kDynamicBytes = kUsed + kSwizzleAtom;

    static_assert(HD == 64 || HD == 128, "head dim 64 or 128");
    static_assert(kKStages >= 2 && kVStages >= 2 && (kQBufs == 1 || kQBufs == 2),
                  "pipeline depths");
    static_assert(kK % kSwizzleAtom == 0 && kV % kSwizzleAtom == 0 && kO % kSwizzleAtom == 0,
                  "swizzled tiles must be 1024-B aligned");
    static_assert(kBlockBytes % kSwizzleAtom == 0 && kOSlabBytes % kSwizzleAtom == 0,
                  "stages and slabs keep 1024-B alignment");
    static_assert(kDynamicBytes <= 227 * 1024, "shared memory budget of one sm_90 CTA");
};

/* The kernel's parameters: one struct, passed as __grid_constant__ so the
 * tensor maps stay in parameter space (TMA reads them from there). */
struct sk90_params {
    CUtensorMap tm_q; /* [B, Sq, Hq, D] as dims {D, Hq, Sq, B}, box {64, 1, 128, 1} */
    CUtensorMap tm_k; /* [B, Sk, Hkv, D] as {D, Hkv, Sk, B}, box {64, 1, 128, 1} */
    CUtensorMap tm_v; /* same as K */
    CUtensorMap tm_o; /* [B, Sq, Hq, D] as {D, Hq, Sq, B}, box {64, 1, 64, 1} */
    float *lse;       /* [B, Hq, Sq] or NULL */
    const int32_t *row_offsets;
    const int32_t *col_indices;
    const int32_t *tile_order;
    int32_t *tile_counter;
    int32_t num_tiles;
    int32_t seq_q, seq_k, heads_q, group;
    int32_t row_blocks, col_blocks;
    int32_t layout_batch, layout_heads, head_div, nnz;
    int32_t causal;
    int32_t negate;   /* the scale is negative: scores are negated, |scale| used */
    float scale;      /* |softmax scale|, for the LSE */
    float scale_log2; /* |scale| * log2(e), folded into the exponent */
};

/* ---------------------------------------------------------------------------
 * Device helpers
 * ------------------------------------------------------------------------- */

/* A tile, decoded. Everything the producer and consumers must agree on. */
struct sk90_tile {
    int b, h, i;    /* batch, query head, query block */
    int start, end; /* positions in col_indices, clamped */
    int key_limit;  /* causal: the largest key any row of the tile may see */
};

/* Batch, head and query block of a tile id (no memory access). */
__device__ __forceinline__ sk90_tile sk90_tile_coords(const sk90_params &p, int tile) {
    sk90_tile t;
    t.i = tile % p.row_blocks;
    const int bh = tile / p.row_blocks;
    t.h = bh % p.heads_q;
    t.b = bh / p.heads_q;
    t.start = t.end = t.key_limit = 0;
    return t;
}

/* The tile with its clamped block range, read from the layout. */
__device__ __forceinline__ sk90_tile sk90_decode(const sk90_params &p, int tile) {
    sk90_tile t = sk90_tile_coords(p, tile);
    const int slice = (p.layout_batch == 1 ? 0 : t.b) * p.layout_heads + t.h / p.head_div;
    const int g = slice * p.row_blocks + t.i;
    /* Offsets clamped to [0, nnz] and non-decreasing: no layout content can
     * send a load out of col_indices. */
    const int lo = __ldg(p.row_offsets + g), hi = __ldg(p.row_offsets + g + 1);
    t.start = min(max(lo, 0), p.nnz);
    t.end = max(min(max(hi, 0), p.nnz), t.start);
    const int q_last = min((t.i + 1) * kBlockM, p.seq_q) - 1;
    t.key_limit = q_last + (p.seq_k - p.seq_q);
    return t;
}

/* Whether block c is loaded and computed: an index in range and, when
 * causal, with at least one key some row of the tile can see. */
__device__ __forceinline__ bool sk90_block_visible(const sk90_params &p, const sk90_tile &t,
                                                   int c) {
    if ((unsigned)c >= (unsigned)p.col_blocks) return false;
    return !p.causal || c * kBlockN <= t.key_limit;
}

/* Pipeline position: stage and phase parity of the n-th block of a pipeline. */
template <int STAGES>
struct sk90_pipe {
    uint32_t stage, phase;
    __device__ __forceinline__ void advance() {
        if (++stage == STAGES) {
            stage = 0;
            phase ^= 1;
        }
    }
};

/* ---------------------------------------------------------------------------
 * Producer warpgroup: the scheduler warp and the TMA warp
 * ------------------------------------------------------------------------- */

template <int HD>
__device__ __forceinline__ void sk90_load_kv(const CUtensorMap *tm, uint32_t dst, uint32_t bar,
                                             int hk, int c, int b) {
    using L = sk90_smem<HD>;
    /* K/V: kept in L2, the head's other query tiles reread them. Made at the
     * point of use: the producer has few registers to hold it. */
    const uint64_t policy = sk_policy_evict_last();
    sk_mbar_arrive_expect_tx(bar, L::kBlockBytes);
#pragma unroll
    for (int s = 0; s < L::kSlabs; ++s)
        sk_tma_load_4d(dst + s * L::kSlab128, tm, s * kSlabCols, hk, c * kBlockN, b, bar, policy);
}

/* The scheduler warp: takes tiles from the schedule and decodes them (tile
 * id, clamped block range) up to kSchedSlots ahead of the TMA warp, so that
 * the chain of dependent global reads (counter, tile order, row offsets)
 * never sits between two tiles' loads. Lane 0 works; the warp stays
 * converged. */
template <int HD>
__device__ void sk90_scheduler(const sk90_params &p, uint32_t base, volatile int32_t *sched) {
    using L = sk90_smem<HD>;
    const int lane = threadIdx.x % 32;
    for (uint32_t n = 0;; ++n) {
        const uint32_t slot = n % kSchedSlots, phase = (n / kSchedSlots) & 1;
        int tile = kTileEnd, start = 0, end = 0;
        if (lane == 0) {
            const int idx = atomicAdd(p.tile_counter, 1);
            if (idx < p.num_tiles) {
                tile = __ldg(p.tile_order + idx);
                if (tile < 0 || tile >= p.num_tiles) tile = kTileSkip;
            }
            if (tile >= 0) {
                const sk90_tile t = sk90_decode(p, tile);
                start = t.start;
                end = t.end;
            }
            sk_mbar_wait(base + L::kBarSchedEmpty + 8 * slot, phase ^ 1);
            sched[4 * slot + 0] = tile;
            sched[4 * slot + 1] = start;
            sched[4 * slot + 2] = end;
            sk_mbar_arrive(base + L::kBarSchedFull + 8 * slot); /* release */
        }
        tile = __shfl_sync(0xffffffffu, tile, 0);
        if (tile == kTileEnd) break;
    }
}

/* The visible blocks of a row, read 32 column indices at a time by the
 * whole warp (one global latency per 32 blocks): lane l holds index
 * pos - 32 + l of the last chunk, `mask` the visible ones not yet taken. */
struct sk90_cursor {
    int pos, end;
    uint32_t mask;
    int cval;
};

__device__ __forceinline__ bool sk90_cursor_next(const sk90_params &p, const sk90_tile &t,
                                                 sk90_cursor &cur, int *c) {
    const int lane = threadIdx.x % 32;
    while (cur.mask == 0) {
        if (cur.pos >= cur.end) return false;
        const int k = cur.pos + lane;
        cur.cval = k < cur.end ? __ldg(p.col_indices + k) : -1;
        cur.mask = __ballot_sync(0xffffffffu, k < cur.end && sk90_block_visible(p, t, cur.cval));
        cur.pos += 32;
    }
    const int bit = __ffs(cur.mask) - 1;
    cur.mask &= cur.mask - 1;
    *c = __shfl_sync(0xffffffffu, cur.cval, bit);
    return true;
}

/* The TMA warp: per tile, Q, then K_0, K_1, V_0, K_2, V_1, ... Lane 0 waits
 * on the barriers and issues the copies; the whole warp reads the layout. */
template <int HD>
__device__ void sk90_producer(const sk90_params &p, uint32_t base, int32_t *tile_ids,
                              volatile int32_t *block_info, const volatile int32_t *sched) {
    using L = sk90_smem<HD>;
    const bool lead = sk_elect_one(); /* the one thread that issues TMA */
    const int lead_lane = __ffs(__ballot_sync(0xffffffffu, lead)) - 1;
    if (lead) {
        sk_prefetch_tensormap(&p.tm_q);
        sk_prefetch_tensormap(&p.tm_k);
        sk_prefetch_tensormap(&p.tm_v);
        sk_prefetch_tensormap(&p.tm_o);
    }
    sk90_pipe<L::kKStages> kp = {0, 0};
    sk90_pipe<L::kVStages> vp = {0, 0};
    sk90_pipe<L::kQBufs> qp = {0, 0};
    for (uint32_t n = 0;; ++n) {
        const uint32_t sslot = n % kSchedSlots, sphase = (n / kSchedSlots) & 1;
        sk_mbar_wait(base + L::kBarSchedFull + 8 * sslot, sphase); /* every lane: acquire */
        /* The lane that releases the slot reads it and shares it, so the
         * read is ordered before the scheduler's next write by that lane's
         * own arrival (which racecheck can follow). */
        int v0 = 0, v1 = 0, v2 = 0;
        if (lead) {
            v0 = sched[4 * sslot + 0];
            v1 = sched[4 * sslot + 1];
            v2 = sched[4 * sslot + 2];
        }
        const int tile = __shfl_sync(0xffffffffu, v0, lead_lane);
        sk90_tile t = sk90_tile_coords(p, tile >= 0 ? tile : 0);
        t.start = __shfl_sync(0xffffffffu, v1, lead_lane);
        t.end = __shfl_sync(0xffffffffu, v2, lead_lane);
        t.key_limit = min((t.i + 1) * kBlockM, p.seq_q) - 1 + (p.seq_k - p.seq_q);
        __syncwarp();
        if (lead) sk_mbar_arrive(base + L::kBarSchedEmpty + 8 * sslot);

        sk90_cursor cur = {t.start, tile >= 0 ? t.end : t.start, 0u, 0};
        int c0 = 0, c1 = 0;
        const bool has0 = sk90_cursor_next(p, t, cur, &c0);
        /* The consumers learn from the slot whether the tile has blocks, and
         * later each block's index from its K stage: they read no layout. */
        const int slot_value = tile >= 0 && !has0 ? kTileEmptyBase - tile : tile;
        const uint32_t slot = n % kTileSlots, slot_phase = (n / kTileSlots) & 1;
        if (lead) {
            sk_mbar_wait(base + L::kBarTileEmpty + 8 * slot, slot_phase ^ 1);
            *(volatile int32_t *)(tile_ids + slot) = slot_value;
            sk_mbar_arrive(base + L::kBarTileFull + 8 * slot); /* release */
        }
        __syncwarp();
        if (tile == kTileEnd) break;
        if (slot_value < 0) continue; /* skipped, or nothing to load (O = 0) */
        const int hk = t.h / p.group;

        /* Q first. With two buffers, its buffer was freed by the tile before
         * the previous one, so this load runs while that tile finishes; with
         * one, it waits for the previous tile's last S GEMMs. */
        if (lead) {
            sk_mbar_wait(base + L::kBarQEmpty + 8 * qp.stage, qp.phase ^ 1);
            sk_mbar_arrive_expect_tx(base + L::kBarQFull + 8 * qp.stage, L::kQBytes);
            const uint64_t stream = sk_policy_evict_first(); /* Q: read once */
#pragma unroll
            for (int s = 0; s < L::kSlabs; ++s)
                sk_tma_load_4d(base + L::kQ + qp.stage * L::kQBytes + s * L::kSlab128, &p.tm_q,
                               s * kSlabCols, t.h, t.i * kBlockM, t.b,
                               base + L::kBarQFull + 8 * qp.stage, stream);
        }
        qp.advance();

        /* K_0, then K_{j+1} before V_j: a consumer's step j needs K_{j+1}
         * for its S GEMM before V_j for its P V GEMM. Each K stage carries
         * its block index and whether another block follows (written before
         * the stage's arrival, which releases it). */
        bool has1 = sk90_cursor_next(p, t, cur, &c1);
        if (lead) {
            sk_mbar_wait(base + L::kBarKEmpty + 8 * kp.stage, kp.phase ^ 1);
            block_info[kp.stage] = c0 | (has1 ? kInfoMore : 0);
            sk90_load_kv<HD>(&p.tm_k, base + L::kK + kp.stage * L::kBlockBytes,
                             base + L::kBarKFull + 8 * kp.stage, hk, c0, t.b);
        }
        kp.advance();
        for (;;) {
            int c2 = 0;
            bool has2 = false;
            if (has1) {
                has2 = sk90_cursor_next(p, t, cur, &c2);
                if (lead) {
                    sk_mbar_wait(base + L::kBarKEmpty + 8 * kp.stage, kp.phase ^ 1);
                    block_info[kp.stage] = c1 | (has2 ? kInfoMore : 0);
                    sk90_load_kv<HD>(&p.tm_k, base + L::kK + kp.stage * L::kBlockBytes,
                                     base + L::kBarKFull + 8 * kp.stage, hk, c1, t.b);
                }
                kp.advance();
            }
            if (lead) {
                sk_mbar_wait(base + L::kBarVEmpty + 8 * vp.stage, vp.phase ^ 1);
                sk90_load_kv<HD>(&p.tm_v, base + L::kV + vp.stage * L::kBlockBytes,
                                 base + L::kBarVFull + 8 * vp.stage, hk, c0, t.b);
            }
            vp.advance();
            __syncwarp();
            if (!has1) break;
            c0 = c1;
            c1 = c2;
            has1 = has2;
        }
    }
}

/* ---------------------------------------------------------------------------
 * Consumers: two warpgroups of 64 rows
 * ------------------------------------------------------------------------- */

template <sk_dtype DT>
__device__ __forceinline__ uint32_t sk90_pack(float lo, float hi) {
    if constexpr (DT == SK_DTYPE_BF16)
        return sk_cvt_bf16x2(hi, lo);
    else
        return sk_cvt_f16x2(hi, lo);
}

/* S (64 x 128, fp32) = Q (64 x D) K^T: D/16 wgmma, one commit group. The
 * descriptors are made once; a K step adds its byte offset >> 4 to the start
 * address field (no carry: shared addresses stay below 2^18). */
template <sk_dtype DT, int HD>
__device__ __forceinline__ void sk90_gemm_qk(float s[64], uint32_t q_base, uint32_t k_base) {
    using L = sk90_smem<HD>;
    const uint64_t da0 = sk_wgmma_desc_sw128(q_base, 16, kSwizzleAtom);
    const uint64_t db0 = sk_wgmma_desc_sw128(k_base, 16, kSwizzleAtom);
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
        /* K step of 16 columns: +32 B inside the swizzle atom, a new slab every 4. */
        const uint32_t off = ((kk / 4) * L::kSlab128 + (kk % 4) * 32) >> 4;
        const uint64_t da = da0 + off, db = db0 + off;
        if constexpr (DT == SK_DTYPE_BF16) {
            if (kk == 0)
                sk_wgmma_m64n128k16_ss_bf16_zero(s, da, db);
            else
                sk_wgmma_m64n128k16_ss_bf16(s, da, db, 1);
        } else {
            if (kk == 0)
                sk_wgmma_m64n128k16_ss_f16_zero(s, da, db);
            else
                sk_wgmma_m64n128k16_ss_f16(s, da, db, 1);
        }
    }
    sk_wgmma_commit();
}

/* O (64 x D) += P (64 x 128, registers) V (128 x D, N-major): 8 wgmma. */
template <sk_dtype DT, int HD>
__device__ __forceinline__ void sk90_gemm_pv(float o[HD / 2], const uint32_t pf[32],
                                             uint32_t v_base) {
    using L = sk90_smem<HD>;
    /* The 64-column slabs of V are kSlab128 apart (the leading byte offset). */
    const uint64_t db0 = sk_wgmma_desc_sw128(v_base, L::kSlab128, kSwizzleAtom);
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
        /* 16 keys = two 8-row groups of 1024 B. */
        const uint64_t db = db0 + ((kk * 2 * kSwizzleAtom) >> 4);
        if constexpr (HD == 128) {
            if constexpr (DT == SK_DTYPE_BF16)
                sk_wgmma_m64n128k16_rs_bf16(o, pf + 4 * kk, db, 1);
            else
                sk_wgmma_m64n128k16_rs_f16(o, pf + 4 * kk, db, 1);
        } else {
            if constexpr (DT == SK_DTYPE_BF16)
                sk_wgmma_m64n64k16_rs_bf16(o, pf + 4 * kk, db, 1);
            else
                sk_wgmma_m64n64k16_rs_f16(o, pf + 4 * kk, db, 1);
        }
    }
    sk_wgmma_commit();
}

/* Accumulator layout (m64nN fp32): register i of lane (g = lane / 4,
 * t = lane % 4) holds row 16 * warp + g + 8 * ((i >> 1) & 1), column
 * 8 * (i >> 2) + 2 * t + (i & 1). */

/* Set to -inf the scores of keys past Sk or, when causal, past a row's
 * diagonal. lim0/lim1: the last visible key column (relative to the block)
 * of the thread's two rows. */
__device__ __forceinline__ void sk90_mask(float s[64], int lim0, int lim1, int t4) {
#pragma unroll
    for (int i = 0; i < 64; ++i) {
        const int col = 8 * (i >> 2) + 2 * t4 + (i & 1);
        const int lim = ((i >> 1) & 1) ? lim1 : lim0;
        if (col > lim) s[i] = -INFINITY;
    }
}

/* Prepare the scores of block c for the softmax: negated when the scale is
 * negative (the max trick needs a positive scale: s * scale = (-s) * |scale|),
 * then the masks block c needs for this warpgroup: the key tail (keys past
 * Sk) and, when causal, the diagonal. Blocks needing none are untouched. */
__device__ __forceinline__ void sk90_mask_block(float s[64], const sk90_params &p, int c,
                                                int wg_first_row, int row0, int t4) {
    if (p.negate) {
#pragma unroll
        for (int i = 0; i < 64; ++i) s[i] = -s[i];
    }
    const int kbase = c * kBlockN, diag = p.seq_k - p.seq_q;
    const bool tail = kbase + kBlockN > p.seq_k;
    const bool cross = p.causal && kbase + kBlockN - 1 > wg_first_row + diag;
    if (!tail && !cross) return;
    int lim0 = p.seq_k - 1 - kbase, lim1 = lim0;
    if (p.causal) {
        lim0 = min(lim0, row0 + diag - kbase);
        lim1 = min(lim1, row0 + 8 + diag - kbase);
    }
    sk90_mask(s, lim0, lim1, t4);
}

/* Online softmax of one block, in place: new row maxima, p = 2^(s *
 * scale_log2 - m'), per-thread row sums, and corr[r] = 2^(m_old' - m_new'),
 * the factor for O and the row sum. (Measured and dropped: FA4's lazy
 * rescaling and tree reductions of the max, docs/perf/hopper.md.) */
__device__ __forceinline__ void sk90_softmax(float s[64], float m[2], float l[2], float corr[2],
                                             float scale_log2) {
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int i = 0; i < 64; ++i) mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], s[i]);
    float ms[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        /* A row with no visible key yet keeps m = -inf: subtract 0 so that
         * 2^(-inf - 0) = 0 instead of NaN. */
        ms[r] = mx[r] == -INFINITY ? 0.0f : mx[r] * scale_log2;
        corr[r] = sk_ex2(m[r] * scale_log2 - ms[r]);
        m[r] = mx[r];
    }
    float sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < 64; ++i) {
        const int r = (i >> 1) & 1;
        s[i] = sk_ex2(fmaf(s[i], scale_log2, -ms[r]));
        sum[r] += s[i];
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) l[r] = l[r] * corr[r] + sum[r];
}

template <sk_dtype DT>
__device__ __forceinline__ void sk90_pack_p(uint32_t pf[32], const float s[64]) {
    /* The register-A fragment of keys 16kk..16kk+15 is accumulator registers
     * 8kk..8kk+7, pairwise. */
#pragma unroll
    for (int j = 0; j < 32; ++j) pf[j] = sk90_pack<DT>(s[2 * j], s[2 * j + 1]);
}

/* Compiler barriers on the P*V operands: before the wgmma fence, so that the
 * O rescale and the P packing are complete when the wgmma reads them; after
 * its wait, so that nothing reuses P's registers or reads O while the wgmma
 * is in flight. */
template <int HD>
__device__ __forceinline__ void sk90_fence_operands(float o[HD / 2], uint32_t pf[32]) {
#pragma unroll
    for (int i = 0; i < HD / 2; ++i) sk_reg_fence(o[i]);
#pragma unroll
    for (int i = 0; i < 32; ++i) sk_reg_fence_u32(pf[i]);
}

/* K stage release: lane 0 of every consumer warp arrives, after the warp
 * has converged (one thread per warpgroup after a named barrier is correct
 * too, but compute-sanitizer racecheck does not follow that chain). */
static constexpr int kKEmptyArrivals = 8; /* 2 consumer warpgroups x 4 warps */

__device__ __forceinline__ void sk90_release_k(uint32_t bar, int lane) {
    __syncwarp();
    if (lane == 0) sk_mbar_arrive(bar);
}

/* A K stage's block info, read by lane 0 of each consumer warp (the lane
 * that releases the stage) and shared with the warp: the one thread that
 * reads is the one whose arrival orders the read before the producer's
 * next write, which racecheck can follow. */
__device__ __forceinline__ int sk90_read_info(const volatile int32_t *block_info, int stage,
                                              int lane) {
    int v = 0;
    if (lane == 0) v = block_info[stage];
    return __shfl_sync(0xffffffffu, v, 0);
}

/* A consumer warpgroup (wg 0 or 1: query rows 64 wg .. 64 wg + 63 of each
 * tile): per tile, the first S alone, the steady steps (S_j with
 * P_{j-1} V_{j-1}), the last P V alone, then the epilogue. */
template <sk_dtype DT, int HD>
__device__ void sk90_consumer(const sk90_params &p, uint32_t base, const int32_t *tile_ids,
                              const volatile int32_t *block_info, int wg) {
    using L = sk90_smem<HD>;
    constexpr int kOAcc = HD / 2; /* O accumulator registers per thread */
    const int wtid = threadIdx.x % 128;
    const int warp = wtid / 32, lane = wtid % 32;
    const int g = lane / 4, t4 = lane % 4;
    const bool leader = wtid == 0; /* arrives on the warpgroup's behalf */
    const uint32_t bar_mine = wg == 0 ? kBarTurn0 : kBarTurn1;
    const uint32_t bar_other = wg == 0 ? kBarTurn1 : kBarTurn0;
    const uint32_t bar_epi = wg == 0 ? kBarEpilogue0 : kBarEpilogue1;
    const uint32_t q_wg = base + L::kQ + wg * kWgRows * kSlabRowBytes;
    const uint32_t o_base = base + L::kO + wg * L::kOWgBytes;
    const float scale_log2 = p.scale_log2;

    sk90_pipe<L::kKStages> kp = {0, 0};
    sk90_pipe<L::kVStages> vp = {0, 0};
    sk90_pipe<L::kQBufs> qp = {0, 0};
    if (wg == 1) sk_bar_arrive(kBarTurn0, 256); /* consumer 0 issues first */

    for (uint32_t n = 0;; ++n) {
        const uint32_t slot = n % kTileSlots, slot_phase = (n / kTileSlots) & 1;
        sk_mbar_wait(base + L::kBarTileFull + 8 * slot, slot_phase);
        const int slot_value = *(volatile const int32_t *)(tile_ids + slot);
        sk_mbar_arrive(base + L::kBarTileEmpty + 8 * slot);
        if (slot_value == kTileEnd) break;
        if (slot_value == kTileSkip) continue;
        const bool has_blocks = slot_value >= 0;
        const sk90_tile t =
            sk90_tile_coords(p, has_blocks ? slot_value : kTileEmptyBase - slot_value);
        const int row0 = t.i * kBlockM + wg * kWgRows + 16 * warp + g; /* query of o[i], (i>>1)&1 == 0 */
        const int row1 = row0 + 8;
        const int wg_first_row = t.i * kBlockM + wg * kWgRows;

        float o[kOAcc];
#pragma unroll
        for (int i = 0; i < kOAcc; ++i) o[i] = 0.0f;
        float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

        if (has_blocks) {
            const uint32_t q_base = q_wg + qp.stage * L::kQBytes;
            const uint32_t q_empty = base + L::kBarQEmpty + 8 * qp.stage;
            sk_mbar_wait(base + L::kBarQFull + 8 * qp.stage, qp.phase);
            qp.advance();
            float s[64];
            uint32_t pf[32];
            float corr[2];

            /* Prologue: S_0 alone. (The three phases are written out: ptxas
             * serializes wgmma issued under run-time conditions.) The block
             * index and whether another block follows come with the K stage. */
            sk_mbar_wait(base + L::kBarKFull + 8 * kp.stage, kp.phase);
            int info = sk90_read_info(block_info, kp.stage, lane);
            sk_bar_sync(bar_mine, 256);
            sk_wgmma_fence();
            sk90_gemm_qk<DT, HD>(s, q_base, base + L::kK + kp.stage * L::kBlockBytes);
            sk_bar_arrive(bar_other, 256);
            sk_wgmma_wait<0>();
#pragma unroll
            for (int i = 0; i < 64; ++i) sk_reg_fence(s[i]);
            sk90_release_k(base + L::kBarKEmpty + 8 * kp.stage, lane);
            if (leader && !(info & kInfoMore)) sk_mbar_arrive(q_empty); /* last use of Q */
            kp.advance();
            sk90_mask_block(s, p, info & ~kInfoMore, wg_first_row, row0, t4);
            sk90_softmax(s, m, l, corr, scale_log2); /* O = 0: nothing to rescale */
            sk90_pack_p<DT>(pf, s);

            /* Steady state: S_j and P_{j-1} V_{j-1} in flight together. */
            while (info & kInfoMore) {
                /* V_{j-1} was loaded right after K_j: waiting for both before
                 * the issue keeps the two GEMMs in one fenced sequence. */
                sk_mbar_wait(base + L::kBarKFull + 8 * kp.stage, kp.phase);
                sk_mbar_wait(base + L::kBarVFull + 8 * vp.stage, vp.phase);
                info = sk90_read_info(block_info, kp.stage, lane);
                sk_bar_sync(bar_mine, 256);
                sk90_fence_operands<HD>(o, pf);
                sk_wgmma_fence();
                sk90_gemm_qk<DT, HD>(s, q_base, base + L::kK + kp.stage * L::kBlockBytes);
                if constexpr (L::kRescaleEarly) {
                    /* O is not in flight: rescale it for the previous block's
                     * max while S_j runs, off the softmax's critical path. */
#pragma unroll
                    for (int i = 0; i < kOAcc; ++i) o[i] *= corr[(i >> 1) & 1];
                    sk90_fence_operands<HD>(o, pf);
                    sk_wgmma_fence();
                }
                sk90_gemm_pv<DT, HD>(o, pf, base + L::kV + vp.stage * L::kBlockBytes);
                sk_bar_arrive(bar_other, 256);
                sk_wgmma_wait<1>(); /* S_j done; P V still running */
#pragma unroll
                for (int i = 0; i < 64; ++i) sk_reg_fence(s[i]);
                sk90_release_k(base + L::kBarKEmpty + 8 * kp.stage, lane);
                if (leader && !(info & kInfoMore)) sk_mbar_arrive(q_empty);
                kp.advance();
                sk90_mask_block(s, p, info & ~kInfoMore, wg_first_row, row0, t4);
                sk90_softmax(s, m, l, corr, scale_log2);
                sk_wgmma_wait<0>(); /* P_{j-1} V_{j-1} done */
                sk90_fence_operands<HD>(o, pf);
                if (leader) sk_mbar_arrive(base + L::kBarVEmpty + 8 * vp.stage);
                vp.advance();
                if constexpr (!L::kRescaleEarly) {
#pragma unroll
                    for (int i = 0; i < kOAcc; ++i) o[i] *= corr[(i >> 1) & 1];
                }
                sk90_pack_p<DT>(pf, s);
            }

            /* Tail: the last P V. */
            sk_mbar_wait(base + L::kBarVFull + 8 * vp.stage, vp.phase);
            sk_bar_sync(bar_mine, 256);
            if constexpr (L::kRescaleEarly) {
#pragma unroll
                for (int i = 0; i < kOAcc; ++i) o[i] *= corr[(i >> 1) & 1];
            }
            sk90_fence_operands<HD>(o, pf);
            sk_wgmma_fence();
            sk90_gemm_pv<DT, HD>(o, pf, base + L::kV + vp.stage * L::kBlockBytes);
            sk_bar_arrive(bar_other, 256);
            sk_wgmma_wait<0>();
            sk90_fence_operands<HD>(o, pf);
            if (leader) sk_mbar_arrive(base + L::kBarVEmpty + 8 * vp.stage);
            vp.advance();
        }

        /* Epilogue. Row sums: reduce over the quad holding each row. */
        float inv[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
            l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
            inv[r] = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
        }
        if (p.lse != NULL && t4 == 0) {
            const int64_t lse_row = ((int64_t)t.b * p.heads_q + t.h) * p.seq_q;
            if (row0 < p.seq_q)
                p.lse[lse_row + row0] = l[0] > 0.0f ? m[0] * p.scale + logf(l[0]) : -INFINITY;
            if (row1 < p.seq_q)
                p.lse[lse_row + row1] = l[1] > 0.0f ? m[1] * p.scale + logf(l[1]) : -INFINITY;
        }
        /* The previous tile's TMA store must have read the O tile. */
        if (leader) sk_bulk_wait_read<0>();
        sk_bar_sync(bar_epi, 128);
        /* stmatrix x4: 8-column groups mb, mb+1 of the warp's 16 rows. Lane l
         * addresses row (l % 8) + 8 * ((l / 8) % 2) of group mb + l / 16. */
        const int st_row = 16 * warp + (lane % 8) + 8 * ((lane / 8) % 2);
#pragma unroll
        for (int mb = 0; mb < HD / 8; mb += 2) {
            const int grp = mb + lane / 16;
            const int slab = grp / 8, chunk = grp % 8;
            const uint32_t addr = o_base + slab * L::kOSlabBytes + st_row * kSlabRowBytes +
                                  ((chunk ^ (st_row % 8)) << 4);
            sk_stmatrix_x4(addr, sk90_pack<DT>(o[4 * mb + 0] * inv[0], o[4 * mb + 1] * inv[0]),
                           sk90_pack<DT>(o[4 * mb + 2] * inv[1], o[4 * mb + 3] * inv[1]),
                           sk90_pack<DT>(o[4 * mb + 4] * inv[0], o[4 * mb + 5] * inv[0]),
                           sk90_pack<DT>(o[4 * mb + 6] * inv[1], o[4 * mb + 7] * inv[1]));
        }
        sk_fence_proxy_async_smem();
        sk_bar_sync(bar_epi, 128);
        if (leader) {
#pragma unroll
            for (int s = 0; s < L::kSlabs; ++s)
                sk_tma_store_4d(&p.tm_o, o_base + s * L::kOSlabBytes, s * kSlabCols, t.h,
                                wg_first_row, t.b);
            sk_bulk_commit();
        }
    }
    if (wg == 0) sk_bar_sync(kBarTurn0, 256); /* consumer 1's last arrival */
    if (leader) sk_bulk_wait<0>();
}

template <sk_dtype DT, int HD>
__global__ void __launch_bounds__(kThreads, 1) sk_attention_sm90_kernel(const __grid_constant__ sk90_params p) {
    using L = sk90_smem<HD>;
    extern __shared__ uint8_t sk90_smem_raw[];
    const uint32_t raw = (uint32_t)__cvta_generic_to_shared(sk90_smem_raw);
    const uint32_t base = (raw + kSwizzleAtom - 1) & ~(uint32_t)(kSwizzleAtom - 1);
    int32_t *tile_ids = (int32_t *)(sk90_smem_raw + (base - raw) + L::kTileIds);
    volatile int32_t *block_info = (volatile int32_t *)(sk90_smem_raw + (base - raw) + L::kBlockInfo);
    volatile int32_t *sched = (volatile int32_t *)(sk90_smem_raw + (base - raw) + L::kSched);

    if (threadIdx.x == 0) {
        for (int s = 0; s < L::kQBufs; ++s) {
            sk_mbar_init(base + L::kBarQFull + 8 * s, 1);
            sk_mbar_init(base + L::kBarQEmpty + 8 * s, 2);
        }
        for (int s = 0; s < L::kKStages; ++s) {
            sk_mbar_init(base + L::kBarKFull + 8 * s, 1);
            sk_mbar_init(base + L::kBarKEmpty + 8 * s, kKEmptyArrivals);
        }
        for (int s = 0; s < L::kVStages; ++s) {
            sk_mbar_init(base + L::kBarVFull + 8 * s, 1);
            sk_mbar_init(base + L::kBarVEmpty + 8 * s, 2);
        }
        for (int s = 0; s < kTileSlots; ++s) {
            sk_mbar_init(base + L::kBarTileFull + 8 * s, 1);
            sk_mbar_init(base + L::kBarTileEmpty + 8 * s, 256);
        }
        for (int s = 0; s < kSchedSlots; ++s) {
            sk_mbar_init(base + L::kBarSchedFull + 8 * s, 1);
            sk_mbar_init(base + L::kBarSchedEmpty + 8 * s, 1);
        }
        sk_fence_mbar_init();
    }
    __syncthreads();

    const int wg = threadIdx.x / 128;
    if (wg == 0) {
        sk_setmaxnreg_dec<kProducerRegs>();
        const int warp = threadIdx.x / 32;
        if (warp == 0) sk90_producer<HD>(p, base, tile_ids, block_info, sched);
        if (warp == 1) sk90_scheduler<HD>(p, base, sched);
    } else {
        sk_setmaxnreg_inc<kConsumerRegs>();
        sk90_consumer<DT, HD>(p, base, tile_ids, block_info, wg - 1);
    }
}

/* ---------------------------------------------------------------------------
 * Host side
 * ------------------------------------------------------------------------- */

/* Largest extent, coordinate and byte stride the kernel and TMA handle. */
static const int64_t kSk90MaxSeq = (int64_t)1 << 30;
static const int64_t kSk90MaxCount = INT32_MAX;
static const int64_t kSk90MaxStrideBytes = (int64_t)1 << 40;

/* A 4-D map {D, H, S, B} over a [B, S, H, D] tensor with element strides
 * stride[3] = {b, s, h}. A stride of a dimension of extent 1 is never used:
 * it is replaced by a valid one. */
static CUresult sk90_encode(CUtensorMap *map, const sk_attention_problem *p, const void *ptr,
                            int64_t seq, int64_t heads, const int64_t stride[3], int box_rows) {
    const int64_t es = 2, row_bytes = p->head_dim * es;
    const cuuint64_t dims[4] = {(cuuint64_t)p->head_dim, (cuuint64_t)heads, (cuuint64_t)seq,
                                (cuuint64_t)p->batch};
    const int64_t sh = heads == 1 ? row_bytes : stride[2] * es;
    const int64_t ss = seq == 1 ? row_bytes * heads : stride[1] * es;
    const int64_t sb = p->batch == 1 ? row_bytes * heads * seq : stride[0] * es;
    const cuuint64_t strides[3] = {(cuuint64_t)sh, (cuuint64_t)ss, (cuuint64_t)sb};
    const cuuint32_t box[4] = {kSlabCols, 1, (cuuint32_t)box_rows, 1};
    return sk_tensor_map_encode_sw128(map, p->dtype, 4, ptr, dims, strides, box);
}

static bool sk90_stride_ok(int64_t stride, int64_t extent) {
    if (extent == 1) return true;
    return stride > 0 && stride % 8 == 0 && stride * 2 < kSk90MaxStrideBytes;
}

/* Fill the four maps; pointers may be placeholders (supports() only asks
 * whether the driver accepts the geometry). */
static CUresult sk90_encode_all(sk90_params *prm, const sk_attention_problem *p, const void *q,
                                const void *k, const void *v, const void *o) {
    CUresult r = sk90_encode(&prm->tm_q, p, q, p->seq_q, p->heads_q, p->q_stride, kBlockM);
    if (r == CUDA_SUCCESS) r = sk90_encode(&prm->tm_k, p, k, p->seq_k, p->heads_kv, p->k_stride, kBlockN);
    if (r == CUDA_SUCCESS) r = sk90_encode(&prm->tm_v, p, v, p->seq_k, p->heads_kv, p->v_stride, kBlockN);
    if (r == CUDA_SUCCESS) r = sk90_encode(&prm->tm_o, p, o, p->seq_q, p->heads_q, p->o_stride, kWgRows);
    return r;
}

int sk_attention_sm90_supports(const sk_attention_problem *p) {
    if (p->dtype != SK_DTYPE_F16 && p->dtype != SK_DTYPE_BF16) return 0;
    if (p->head_dim != 64 && p->head_dim != 128) return 0;
    if (p->block_q != kBlockM || p->block_k != kBlockN) return 0;
    if (p->scale == 0.0f || !isfinite(p->scale)) return 0; /* resolved: never 0 */
    if (p->seq_q > kSk90MaxSeq || p->seq_k > kSk90MaxSeq) return 0;
    if (p->batch > kSk90MaxCount || p->heads_q > kSk90MaxCount) return 0;
    if (p->batch * p->heads_q * (int64_t)p->row_blocks > kSk90MaxCount) return 0;
    if (!sk90_stride_ok(p->q_stride[0], p->batch) || !sk90_stride_ok(p->q_stride[1], p->seq_q) ||
        !sk90_stride_ok(p->q_stride[2], p->heads_q) || !sk90_stride_ok(p->o_stride[0], p->batch) ||
        !sk90_stride_ok(p->o_stride[1], p->seq_q) || !sk90_stride_ok(p->o_stride[2], p->heads_q) ||
        !sk90_stride_ok(p->k_stride[0], p->batch) || !sk90_stride_ok(p->k_stride[1], p->seq_k) ||
        !sk90_stride_ok(p->k_stride[2], p->heads_kv) ||
        !sk90_stride_ok(p->v_stride[0], p->batch) || !sk90_stride_ok(p->v_stride[1], p->seq_k) ||
        !sk90_stride_ok(p->v_stride[2], p->heads_kv))
        return 0;
    /* Let the driver judge the geometry, with a placeholder 1024-B aligned address. */
    sk90_params prm;
    const void *dummy = (const void *)(uintptr_t)(1u << 20);
    return sk90_encode_all(&prm, p, dummy, dummy, dummy, dummy) == CUDA_SUCCESS;
}

template <sk_dtype DT, int HD>
static sk_status sk90_launch(const sk90_params &prm, int grid, cudaStream_t stream) {
    using L = sk90_smem<HD>;
    SK_CUDA_TRY(cudaFuncSetAttribute(sk_attention_sm90_kernel<DT, HD>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)L::kDynamicBytes),
                "cudaFuncSetAttribute");
    sk_attention_sm90_kernel<DT, HD><<<grid, kThreads, L::kDynamicBytes, stream>>>(prm);
    return sk_cuda_status(cudaGetLastError(), "sm90 attention kernel launch");
}

sk_status sk_attention_sm90_launch(const sk_attention_problem *p, const sk_attention_schedule *s,
                                   cudaStream_t stream) {
    if (!sk_attention_sm90_supports(p))
        return sk_error(SK_STATUS_NOT_SUPPORTED,
                        "the Hopper kernel does not cover this problem (dtype, head_dim = %lld, "
                        "blocks %d x %d, strides)",
                        (long long)p->head_dim, (int)p->block_q, (int)p->block_k);
    sk90_params prm;
    memset(&prm, 0, sizeof prm);
    const CUresult r = sk90_encode_all(&prm, p, p->q, p->k, p->v, p->o);
    if (r != CUDA_SUCCESS)
        return sk_error(SK_STATUS_EXECUTION_FAILED, "cuTensorMapEncodeTiled failed (CUresult %d)",
                        (int)r);
    prm.lse = p->lse;
    prm.row_offsets = p->row_offsets;
    prm.col_indices = p->col_indices;
    prm.tile_order = s->tile_order;
    prm.tile_counter = s->tile_counter;
    prm.num_tiles = s->num_tiles;
    prm.seq_q = (int32_t)p->seq_q;
    prm.seq_k = (int32_t)p->seq_k;
    prm.heads_q = (int32_t)p->heads_q;
    prm.group = p->group;
    prm.row_blocks = p->row_blocks;
    prm.col_blocks = p->col_blocks;
    prm.layout_batch = p->layout_batch;
    prm.layout_heads = p->layout_heads;
    prm.head_div = p->head_div;
    prm.nnz = p->nnz;
    prm.causal = p->causal;
    prm.negate = p->scale < 0.0f;
    prm.scale = fabsf(p->scale);
    prm.scale_log2 = prm.scale * 1.4426950408889634f; /* log2(e) */

    int device = 0, sms = 0;
    SK_CUDA_TRY(cudaGetDevice(&device), "cudaGetDevice");
    SK_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
                "cudaDeviceGetAttribute");
    const int grid = s->num_tiles < sms ? s->num_tiles : sms;
    if (grid <= 0) return SK_STATUS_SUCCESS;

    const bool bf16 = p->dtype == SK_DTYPE_BF16;
    if (p->head_dim == 128)
        return bf16 ? sk90_launch<SK_DTYPE_BF16, 128>(prm, grid, stream)
                    : sk90_launch<SK_DTYPE_F16, 128>(prm, grid, stream);
    return bf16 ? sk90_launch<SK_DTYPE_BF16, 64>(prm, grid, stream)
                : sk90_launch<SK_DTYPE_F16, 64>(prm, grid, stream);
}
