/*
 * fwd_sm90_common.cuh - what the Hopper attention kernels (fwd_sm90.cu, the
 * fp16 / bf16 kernel; fwd_sm90_fp8.cu, the e4m3 one; fwd_sm90_varlen.cu,
 * the fp16 / bf16 kernel in varlen / paged mode) share, included by their
 * .cu files only: the tile shapes and the fp16 / bf16 shared-memory layout,
 * the kernel parameters, the tile decode and the block visibility rule,
 * the pipeline position, the host-side helpers; and the varlen / paged
 * mode's additions (its second parameter sk90_vparams, the compile-time
 * MODE, the per-sequence tile view). The algorithm is described in
 * fwd_sm90.cu's header, the varlen / paged mode in fwd_sm90_varlen.cu's.
 * Every varlen addition in the shared code sits behind `if constexpr (MODE
 * ...)`, so the fixed kernels' code is unchanged
 * (tests/bitwise/sass_compare.sh).
 */
#ifndef SK_CUDA_ATTENTION_FWD_SM90_COMMON_CUH
#define SK_CUDA_ATTENTION_FWD_SM90_COMMON_CUH

#include <cuda.h>
#include <math.h>
#include <stdint.h>

#include "cuda/attention/kernels.h"
#include "cuda/common/cuda_check.cuh"
#include "cuda/common/hopper.cuh"
#include "cuda/common/tensor_map.h"

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
    kBarZeroV = 5,         /* varlen: both consumers zeroed a V stage's masked rows */
    kTileEnd = -1,         /* tile slot: no more tiles */
    kTileSkip = -2,        /* tile slot: a schedule entry out of range, skipped */
    kTileEmptyBase = -3,   /* tile slot kTileEmptyBase - t: tile t has no visible block */
    kInfoMore = (int)0x80000000u, /* block info: another block follows in this tile */
    kVInfoEnd = -1               /* FP8 kernel's v_info: no more V stages */
};
static_assert(kProducerRegs * 128 + kConsumerRegs * 256 <= kThreads * 168, "register budget");
static_assert(kBlockM == 2 * kWgRows, "two consumer warpgroups of 64 rows");

/* Byte offsets inside the 1024-aligned dynamic shared memory, per head dim;
 * KS, VS: the K and V stages (the defaults are every kernel's but the paged
 * one's, sk90_layout below); BN: the keys of a K / V block, the layout's
 * block_k (128, or 64: issue 28's blocks of 64; a K / V stage then holds
 * 64 rows, so its 64-column slabs are 8 KB apart instead of 16 KB). */
template <int HD, int KS = (HD == 128 ? SK90_KSTAGES_D128 : SK90_STAGES_D64),
          int VS = (HD == 128 ? SK90_VSTAGES_D128 : SK90_STAGES_D64), int BN = kBlockN>
struct sk90_smem {
    static constexpr int kSlabs = HD / kSlabCols;
    static constexpr int kKStages = KS;
    static constexpr int kVStages = VS;
    static constexpr int kBN = BN;
    /* With 2, the next tile's Q loads while this tile runs; with 1, once
     * both consumers' last S GEMMs of this tile are done. */
    static constexpr int kQBufs = HD == 128 ? SK90_QBUFS_D128 : 2;
    /* Rescale O for the previous block's max while the next S GEMM runs
     * (measured: +1-2.5% at D = 128, -2% at D = 64, docs/perf/hopper.md). */
    static constexpr bool kRescaleEarly = HD == 128;
    static constexpr uint32_t kBlockBytes = BN * HD * 2;      /* one K or V block */
    static constexpr uint32_t kQBytes = kBlockM * HD * 2;     /* one of kQBufs Q tiles */
    static constexpr uint32_t kSlab128 = 128 * kSlabRowBytes;  /* a slab of 128 rows (Q) */
    static constexpr uint32_t kKVSlab = BN * kSlabRowBytes;    /* a slab of a K / V block */
    static constexpr int kBoxCols = kSlabCols;                  /* a TMA box's width, elements */
    static constexpr bool kTransposeV = false;                  /* see the FP8 layout */
    static constexpr bool kVtDirect = false; /* FP8 layout <VT>: V^T boxes (sk90_load_vt) */
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
    /* Varlen / paged mode only, past the fixed kernel's part: the scheduler
     * slots widened to {tile, start, end, b, i, q0, len_q, k0, len_k} (16
     * ints each), the sequence of each tile slot for the consumers {q0,
     * len_q, len_k, i}, and per K stage the boxes of the block not loaded
     * (paged: pages absent or past len_k; a bit per page_size rows). */
    static constexpr uint32_t kVSched = kUsed;
    static constexpr uint32_t kVTile = kVSched + 64 * kSchedSlots;
    static constexpr uint32_t kVAbsent = kVTile + 16 * kTileSlots;
    static constexpr uint32_t kVUsed = kVAbsent + 4 * kKStages;
    static constexpr uint32_t kVDynamicBytes = kVUsed + kSwizzleAtom;
    /* What the P V GEMM reads, under the FP8 layout's names (sk98_smem:
     * its Vt stages, or V^T in the V stages), for the code both kernels
     * share (fwd_sm90_pair.cuh): here the V stages. */
    static constexpr int kPvStages = kVStages;
    static constexpr uint32_t kPv = kV, kPvBytes = kBlockBytes;
    static constexpr uint32_t kBarPvFull = kBarVFull, kBarPvEmpty = kBarVEmpty;

    static_assert(HD == 64 || HD == 128, "head dim 64 or 128");
    static_assert(BN == 64 || BN == 128, "key blocks of 64 or 128");
    static_assert(kKStages >= 2 && kVStages >= 2 && (kQBufs == 1 || kQBufs == 2),
                  "pipeline depths");
    static_assert(kK % kSwizzleAtom == 0 && kV % kSwizzleAtom == 0 && kO % kSwizzleAtom == 0,
                  "swizzled tiles must be 1024-B aligned");
    static_assert(kBlockBytes % kSwizzleAtom == 0 && kOSlabBytes % kSwizzleAtom == 0,
                  "stages and slabs keep 1024-B alignment");
    static_assert(kDynamicBytes <= 227 * 1024, "shared memory budget of one sm_90 CTA");
    static_assert(kVDynamicBytes <= 227 * 1024, "shared memory budget (varlen mode)");
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
    int32_t num_tiles;   /* tile ids are below it */
    int32_t order_count; /* positions of tile_order this launch takes (fixed modes) */
    int32_t seq_q, seq_k, heads_q, group;
    int32_t row_blocks, col_blocks;
    int32_t layout_batch, layout_heads, head_div, nnz;
    int32_t causal;
    int32_t negate;   /* the scale is negative: scores are negated, |scale| used */
    float scale;      /* |softmax scale|, for the LSE */
    float scale_log2; /* |scale| * log2(e), folded into the exponent */
};

/* Varlen / paged mode only (fwd_sm90_varlen.cu), a second kernel parameter
 * (sk90_params unchanged keeps the fixed kernels' resources unchanged; they
 * pass sk90_no_vparams, never read). sk90_params' maps then cover the
 * packed tensors as batch 1 ({D, H, total, 1}), or the caches ({D, Hkv,
 * page_size, num_pages}, box page_size rows); num_tiles is the plan's Hq *
 * R. The plan's parts: varlen_plan.h. */
struct sk90_vparams {
    const int4 *tile_info;     /* [num_tiles] {t, first, end, first column} */
    const int2 *rows;          /* [row_blocks] {b, i} */
    const int4 *seqs;          /* [batch] {q0, len_q, k0, len_k}, clamped */
    const int32_t *page_table; /* paged: [batch, table_stride] */
    void *o;                   /* packed O, for the per-row stores of tail tiles */
    int64_t o_token_stride, o_head_stride; /* elements */
    int64_t table_stride;
    int32_t batch, total_q, num_pages, page_size, page_shift;
    /* The fixed kernel's carry-in variant only (sk_attention_sm90_launch
     * with p->lse_carry): each tile starts from the partial result of an
     * earlier pass over other keys, O in o (the output, updated in place;
     * element strides o_batch_stride, o_token_stride, o_head_stride) and
     * its LSE [B, Hq, Sq]. */
    const float *lse_carry;
    int64_t o_batch_stride;
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

/* Whether block c (of BN keys) is loaded and computed: an index in range
 * and, when causal, with at least one key some row of the tile can see. */
template <int BN = kBlockN>
__device__ __forceinline__ bool sk90_block_visible(const sk90_params &p, const sk90_tile &t,
                                                   int c) {
    if ((unsigned)c >= (unsigned)p.col_blocks) return false;
    return !p.causal || c * BN <= t.key_limit;
}

/* K stage release: lane 0 of every consumer warp arrives (2 warpgroups x 4
 * warps; fwd_sm90_consumer.cuh, sk90_release_k). */
static constexpr int kKEmptyArrivals = 8;

/* Thread 0 initialises the barriers of layout L (the fp16/bf16 kernel's or
 * the FP8 one's, which adds the Vt stages: full when both transposer
 * warps arrived, empty when both consumer leaders did). V stages are freed
 * by two arrivals in both kernels (the consumer leaders, or the two
 * transposer warps). */
template <class L>
__device__ __forceinline__ void sk90_init_barriers(uint32_t base) {
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
    if constexpr (L::kTransposeV) {
        for (int s = 0; s < L::kVtStages; ++s) {
            sk_mbar_init(base + L::kBarVtFull + 8 * s, 2);
            sk_mbar_init(base + L::kBarVtEmpty + 8 * s, 2);
        }
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
 * Varlen / paged mode (fwd_sm90_varlen.cu)
 * ------------------------------------------------------------------------- */

/* The kernels' modes, compile-time: the fixed kernels carry none of the
 * varlen code. */
enum { kSk90Fixed = 0, kSk90Varlen = 1, kSk90Paged = 2 };

/* Tuning knobs of the paged mode only (compile-time, an A/B build for the
 * measurement; docs/perf/varlen_paged.md, "A third V stage for pages"):
 * its K and V stages. At D = 128 a third V stage (7 tiles of 32 KB with
 * one Q buffer: 224 KB) lets the TMA warp issue V_j half a consumer step
 * earlier (consumer step j: S_j with P_{j-1} V_{j-1}; it waits for K_j and
 * V_{j-1}): with two, V_j waits for the release of V_{j-2} at the end of
 * step j - 1 and is needed at the start of step j + 1 (one step to land);
 * with three, it goes out with K_{j+1} (one and a half steps), and a
 * block's boxes and their L2 / TLB latency get that much more room. 2 / 2
 * is the phase-1 build (SK90_PAGE_LOOKAHEAD); D = 64 keeps the fixed
 * kernel's stages unless told otherwise. */
#ifndef SK90_PAGED_KSTAGES_D128
#define SK90_PAGED_KSTAGES_D128 SK90_KSTAGES_D128
#endif
#ifndef SK90_PAGED_VSTAGES_D128
#define SK90_PAGED_VSTAGES_D128 3
#endif
#ifndef SK90_PAGED_STAGES_D64
#define SK90_PAGED_STAGES_D64 SK90_STAGES_D64
#endif

/* The K and V stages of a kernel of head dim HD in mode MODE: the paged
 * mode's, or sk90_smem's defaults (the other kernels' code is unchanged:
 * sk90_layout<HD, MODE> is then the type sk90_smem<HD>). */
__host__ __device__ constexpr int sk90_kstages(int hd, int mode) {
    return mode != kSk90Paged ? (hd == 128 ? SK90_KSTAGES_D128 : SK90_STAGES_D64)
                              : (hd == 128 ? SK90_PAGED_KSTAGES_D128 : SK90_PAGED_STAGES_D64);
}
__host__ __device__ constexpr int sk90_vstages(int hd, int mode) {
    return mode != kSk90Paged ? (hd == 128 ? SK90_VSTAGES_D128 : SK90_STAGES_D64)
                              : (hd == 128 ? SK90_PAGED_VSTAGES_D128 : SK90_PAGED_STAGES_D64);
}
/* Blocks of BN = 64 keys (fixed mode only) keep the bytes in flight of
 * BN = 128: twice the stages of half the size (kKStages counts blocks). */
template <int HD, int MODE, int BN = kBlockN>
using sk90_layout = sk90_smem<HD, sk90_kstages(HD, MODE) * (kBlockN / BN),
                              sk90_vstages(HD, MODE) * (kBlockN / BN), BN>;

/* A generic pointer to a shared-memory address (the varlen parts of the
 * layout, reached from `base`). */
template <class T>
__device__ __forceinline__ T *sk90_shared_ptr(uint32_t addr) {
    return (T *)__cvta_shared_to_generic((size_t)addr);
}

/* Varlen / paged: a tile's sequence and its clamped lengths (the plan's
 * seqs). Kept apart from sk90_tile: the fixed kernel's code depends on
 * that one's layout (a field more changed its SASS). */
struct sk90_seq {
    int seq, q0, len_q, k0, len_k;
};

/* The visiting rule of the mode: the fixed one, or varlen_plan.h's. In
 * varlen mode t.key_limit is the last key the tile may see: the sequence's
 * bottom-right causal limit, or len_k - 1 (c * 128 <= len_k - 1 is c <
 * ceil(len_k / 128)), so one comparison covers both. */
template <int MODE, int BN = kBlockN>
__device__ __forceinline__ bool sk90_visit(const sk90_params &p, const sk90_tile &t, int c) {
    if constexpr (MODE == kSk90Fixed) {
        return sk90_block_visible<BN>(p, t, c);
    } else {
        if ((unsigned)c >= (unsigned)p.col_blocks) return false;
        return c * kBlockN <= t.key_limit;
    }
}

/* A varlen tile's sequence from the plan's clamped {q0, len_q, k0, len_k},
 * and its key limit (sk90_visit; t.i must be the sequence's query block). */
__device__ __forceinline__ sk90_seq sk90_tile_seq(const sk90_params &p, sk90_tile &t, int seq,
                                                  int q0, int len_q, int k0, int len_k) {
    sk90_seq sq;
    sq.seq = seq;
    sq.q0 = q0;
    sq.len_q = len_q;
    sq.k0 = k0;
    sq.len_k = len_k;
    t.key_limit = p.causal ? min((t.i + 1) * kBlockM, len_q) - 1 + (len_k - len_q) : len_k - 1;
    return sq;
}

/* ---------------------------------------------------------------------------
 * Pairs of 64-row query blocks (block_q = 64, the fixed mode only;
 * fwd_sm90_pair.cuh)
 * ------------------------------------------------------------------------- */

/* With block_q = 64 a tile is two consecutive query blocks 2i and 2i + 1 of
 * one (batch, head): the 128 rows of a block_q = 128 tile i, consumer
 * warpgroup h owning block 2i + h. The plan's order lists the 64-row
 * blocks; the scheduler takes the even ones as pairs (an odd one comes
 * with its partner) and decodes both rows. The producer merges the two
 * sorted column lists and each K stage's block info carries which row
 * selected the block (kInfoSel0 / kInfoSel1; the block index stays below
 * kSk90MaxSeq / 64 = 2^24). An odd last block has no partner: row 2i + 1
 * is an empty range. The second row's range {start, end} travels in the
 * scheduler slot's extension at L::kVSched (16 ints a slot, unused in the
 * fixed mode otherwise). */
enum {
    kInfoSel0 = 1 << 29,        /* block info: query block 2i selected it */
    kInfoSel1 = 1 << 30,        /* block info: query block 2i + 1 selected it */
    kInfoBlock = (1 << 29) - 1  /* block info: the block index */
};

/* The key limit (sk90_tile::key_limit, causal) of 64-row query block i. */
__device__ __forceinline__ int sk90_key_limit64(const sk90_params &p, int i) {
    return min((i + 1) * 64, p.seq_q) - 1 + (p.seq_k - p.seq_q);
}

/* ---------------------------------------------------------------------------
 * Host side shared by the kernels
 * ------------------------------------------------------------------------- */

/* Largest extent, coordinate and byte stride the kernel and TMA handle. */
static const int64_t kSk90MaxSeq = (int64_t)1 << 30;
static const int64_t kSk90MaxCount = INT32_MAX;
/* Tiles: a tile slot encodes an empty tile t as kTileEmptyBase - t, an int. */
static const int64_t kSk90MaxTiles = (int64_t)INT32_MAX + kTileEmptyBase + 1;
static const int64_t kSk90MaxStrideBytes = (int64_t)1 << 40;

/* A 4-D map {D, H, S, B} over a [B, S, H, D] tensor with element strides
 * stride[3] = {b, s, h}. A stride of a dimension of extent 1 is never used:
 * it is replaced by a valid one. */
static inline CUresult sk90_encode(CUtensorMap *map, const sk_attention_problem *p, sk_dtype dtype,
                            int box_cols, const void *ptr, int64_t seq, int64_t heads,
                            const int64_t stride[3], int box_rows) {
    const int64_t es = dtype == SK_DTYPE_E4M3 ? 1 : 2, row_bytes = p->head_dim * es;
    const cuuint64_t dims[4] = {(cuuint64_t)p->head_dim, (cuuint64_t)heads, (cuuint64_t)seq,
                                (cuuint64_t)p->batch};
    const int64_t sh = heads == 1 ? row_bytes : stride[2] * es;
    const int64_t ss = seq == 1 ? row_bytes * heads : stride[1] * es;
    const int64_t sb = p->batch == 1 ? row_bytes * heads * seq : stride[0] * es;
    const cuuint64_t strides[3] = {(cuuint64_t)sh, (cuuint64_t)ss, (cuuint64_t)sb};
    const cuuint32_t box[4] = {(cuuint32_t)box_cols, 1, (cuuint32_t)box_rows, 1};
    /* 64B swizzle for boxes of 64-byte rows (the FP8 kernel at D = 64). */
    return sk_tensor_map_encode_swizzled(map, dtype, 4, ptr, dims, strides, box,
                                         box_cols * es == 64 ? 64 : 128);
}

/* An element stride of `es`-byte elements: a positive multiple of 16 bytes
 * (TMA), below the byte limit. */
static inline bool sk90_stride_ok(int64_t stride, int64_t extent, int64_t es) {
    if (extent == 1) return true;
    return stride > 0 && (stride * es) % 16 == 0 && stride * es < kSk90MaxStrideBytes;
}

/* The block shapes both kernels (fp16/bf16 and FP8) cover: query blocks
 * of 128 rows (the tile) or 64 (pairs of them: the _pair kernels), key
 * blocks of 128 or 64 (the _k64 kernels). Pairs take no carry-in and no
 * part of the order (a part of a 64-row order would split pairs): context
 * parallel keeps the portable kernel there (fwd.cu,
 * sk_cuda_attention_carry_supported). */
static inline bool sk90_blocks_ok(const sk_attention_problem *p) {
    if (p->block_q != kBlockM && p->block_q != 64) return false;
    if (p->block_k != kBlockN && p->block_k != 64) return false;
    const bool pair = p->block_q == 64;
    return !(pair && (p->lse_carry != NULL || p->tile_count > 0 || p->reserve_sms > 0));
}

/* The size and stride limits both kernels share; in_es and out_es are the
 * element bytes of Q, K, V and of O. */
static inline bool sk90_limits_ok(const sk_attention_problem *p, int64_t in_es, int64_t out_es) {
    if (p->scale == 0.0f || !isfinite(p->scale)) return false; /* resolved: never 0 */
    if (p->seq_q > kSk90MaxSeq || p->seq_k > kSk90MaxSeq) return false;
    if (p->batch > kSk90MaxCount || p->heads_q > kSk90MaxCount) return false;
    if (p->batch * p->heads_q * (int64_t)p->row_blocks > kSk90MaxTiles) return false;
    return sk90_stride_ok(p->q_stride[0], p->batch, in_es) &&
           sk90_stride_ok(p->q_stride[1], p->seq_q, in_es) &&
           sk90_stride_ok(p->q_stride[2], p->heads_q, in_es) &&
           sk90_stride_ok(p->o_stride[0], p->batch, out_es) &&
           sk90_stride_ok(p->o_stride[1], p->seq_q, out_es) &&
           sk90_stride_ok(p->o_stride[2], p->heads_q, out_es) &&
           sk90_stride_ok(p->k_stride[0], p->batch, in_es) &&
           sk90_stride_ok(p->k_stride[1], p->seq_k, in_es) &&
           sk90_stride_ok(p->k_stride[2], p->heads_kv, in_es) &&
           sk90_stride_ok(p->v_stride[0], p->batch, in_es) &&
           sk90_stride_ok(p->v_stride[1], p->seq_k, in_es) &&
           sk90_stride_ok(p->v_stride[2], p->heads_kv, in_es);
}

/* The fp16 / bf16 kernel's four maps; pointers may be placeholders
 * (supports() only asks whether the driver accepts the geometry). */
static inline CUresult sk90_encode_all(sk90_params *prm, const sk_attention_problem *p, const void *q,
                                const void *k, const void *v, const void *o) {
    const sk_dtype dt = p->dtype;
    CUresult r = sk90_encode(&prm->tm_q, p, dt, kSlabCols, q, p->seq_q, p->heads_q, p->q_stride, kBlockM);
    /* K / V boxes of one key block: 64 rows when block_k is 64. */
    const int bn = p->block_k == 64 ? 64 : kBlockN;
    if (r == CUDA_SUCCESS) r = sk90_encode(&prm->tm_k, p, dt, kSlabCols, k, p->seq_k, p->heads_kv, p->k_stride, bn);
    if (r == CUDA_SUCCESS) r = sk90_encode(&prm->tm_v, p, dt, kSlabCols, v, p->seq_k, p->heads_kv, p->v_stride, bn);
    if (r == CUDA_SUCCESS) r = sk90_encode(&prm->tm_o, p, dt, kSlabCols, o, p->seq_q, p->heads_q, p->o_stride, kWgRows);
    return r;
}

/* The scalar and layout parameters from the checked problem, and the
 * schedule's (tile order, counter, count, rows: the fixed schedule's or the
 * varlen plan's); the maps are the caller's. */
static inline void sk90_params_fill(sk90_params *prm, const sk_attention_problem *p,
                                    const int32_t *tile_order, int32_t *tile_counter,
                                    int32_t num_tiles, int32_t row_blocks) {
    prm->lse = p->lse;
    prm->row_offsets = p->row_offsets;
    prm->col_indices = p->col_indices;
    prm->tile_order = tile_order;
    prm->tile_counter = tile_counter;
    prm->num_tiles = num_tiles;
    prm->order_count = num_tiles;
    prm->seq_q = (int32_t)p->seq_q;
    prm->seq_k = (int32_t)p->seq_k;
    prm->heads_q = (int32_t)p->heads_q;
    prm->group = p->group;
    prm->row_blocks = row_blocks;
    prm->col_blocks = p->col_blocks;
    prm->layout_batch = p->layout_batch;
    prm->layout_heads = p->layout_heads;
    prm->head_div = p->head_div;
    prm->nnz = p->nnz;
    prm->causal = p->causal;
    prm->negate = p->scale < 0.0f;
    prm->scale = fabsf(p->scale);
    prm->scale_log2 = prm->scale * 1.4426950408889634f; /* log2(e) */
}

/* The persistent grid: one CTA per SM, at most one per tile (0: none). */
static inline sk_status sk90_grid(int32_t num_tiles, int *grid) {
    int device = 0, sms = 0;
    SK_CUDA_TRY(cudaGetDevice(&device), "cudaGetDevice");
    SK_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
                "cudaDeviceGetAttribute");
    *grid = num_tiles < sms ? num_tiles : sms;
    return SK_STATUS_SUCCESS;
}

/* Every parameter but the tensor maps, from the fixed schedule, and the
 * persistent grid (0: nothing to run). */
static inline sk_status sk90_fill_params(sk90_params *prm, const sk_attention_problem *p,
                                         const sk_attention_schedule *s, int *grid) {
    sk90_params_fill(prm, p, s->tile_order, s->tile_counter, s->num_tiles, p->row_blocks);
    if (s->part_count > 0) prm->order_count = s->part_count; /* a part of the run */
    SK_TRY(sk90_grid(prm->order_count, grid));
    /* A part of the run (p->reserve_sms): that many SMs stay free. */
    if (p->reserve_sms > 0 && *grid > 1)
        *grid = *grid - p->reserve_sms > 1 ? *grid - p->reserve_sms : 1;
    return SK_STATUS_SUCCESS;
}


#endif /* SK_CUDA_ATTENTION_FWD_SM90_COMMON_CUH */
