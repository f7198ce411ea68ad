/*
 * gemm_sm90.cu - the Hopper BSR GEMM: C = alpha * A * B + beta * C with
 * A block-sparse (BSR, 128-row blocks), on TMA, wgmma, warp specialisation
 * and a persistent grid.
 *
 * Algorithm. A CTA of 384 threads (one per SM) runs output tiles of
 * 128 rows (one block row of A) x 256 columns of C.
 *   - Tiles. Tile s of the sequence (s = atomicAdd(counter, 1)) is
 *     block-row slot r and N tile j, walked in groups of kGroupN N tiles:
 *     all block rows (longest first: the plan's order) of one group, then
 *     the next group. Within a group, tiles of one row are adjacent (its A
 *     blocks stay in L2), and the ~132 tiles in flight share a 256 * kGroupN
 *     column panel of B (kGroupN = 4: 16 MB of B at k = 8192, fp16, which
 *     stays in L2 while the rows pass over it).
 *   - Warpgroup 0 gives registers away (setmaxnreg). Its warp 1, the
 *     scheduler, takes tiles, counts each row's visited blocks (32 column
 *     indices per step) and hands {row, N tile, chunks, entry range} to the
 *     producer and the consumers through a ring of kTileSlots, up to four
 *     tiles ahead (the atomic and the layout reads stay off the load path).
 *     Its warp 0, the producer, walks the visited blocks (ballot over 32
 *     column indices) and one lane issues the TMA loads: per block,
 *     block_k / 64 chunks of 64 along K, each an A chunk (128 x 64, one box
 *     of the packed blocks) and the matching B chunk (64 x 256) into a
 *     kStages-deep ring with a "full" mbarrier (expect_tx = 48 KB) and an
 *     "empty" one (one arrival per consumer warp).
 *   - Warpgroups 1 and 2 are consumers of 64 rows each: per chunk, four
 *     wgmma m64n256k16 (A and B from shared memory) into 128 fp32
 *     accumulators per thread; one wgmma group stays in flight while the
 *     next chunk's barrier is awaited, and a stage is released as soon as
 *     the group reading it is done.
 *   - Epilogue (per consumer warpgroup, while the producer already loads the
 *     next tile): alpha * acc (+ beta * C, read from global memory only
 *     when beta != 0), converted to C's type and written into a 16 KB
 *     128B-swizzled staging buffer of the warpgroup's own (stmatrix for
 *     16-bit C with beta = 0, the common case; plain stores otherwise), then
 *     one thread stores it with TMA, 2 boxes per round (2 rounds of 128
 *     columns for 16-bit C, 4 of 64 for fp32). TMA clips rows past m and
 *     columns past n. The epilogue's instruction count matters: both
 *     consumer warpgroups run it at once, with the tensor cores idle
 *     (docs/perf/bsr_gemm.md: the stmatrix path took the issue's shape from
 *     615 to 655 TFLOPS).
 *
 * Layouts in shared memory (all 128B-swizzled, the TMA box layout):
 *   - A chunk: 128 rows x 64 columns (one 128-byte row each), K-major; the
 *     consumer w uses rows 64w..64w+63.
 *   - B chunk, row-major B ([k, n], N contiguous): four boxes of 64 k-rows
 *     x 64 columns, 8 KB apart: an N-major operand (imm-trans-b = 1) with
 *     the 64-column slabs as the leading byte offset.
 *   - B chunk, column-major B (N rows with K contiguous): one box of 256
 *     n-rows x 64 k: a K-major operand, like attention's K.
 *
 * Tails and robustness (kernels.h's contract):
 *   - The k tail: the last column block's A chunks are loaded through a
 *     second tensor map whose K extent ends at k, so TMA zero-fills the
 *     elements past k (they may hold anything, NaN included); B's map ends
 *     at row k, so its rows past k are zero too.
 *   - Rows of A past m only feed rows of C past m, which TMA never stores;
 *     beta * C reads are bounds-checked.
 *   - The producer alone reads the layout; entries outside [0, col_blocks)
 *     are skipped, offsets are clamped by the plan (row_info), so every
 *     mbarrier sees matching arrivals for any layout content.
 *   - The wgmma sequence of a chunk is issued unconditionally (ptxas would
 *     serialize wgmma under run-time conditions); the accumulators are
 *     zeroed per tile, so a tile without blocks stores beta * C.
 */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cuda/common/cuda_check.cuh"
#include "cuda/common/hopper.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/tensor_map.h"
#include "cuda/gemm/kernels.h"

/* Tuning knobs (compile-time; docs/perf/bsr_gemm.md): N tiles per group of
 * the tile order (4: +2.5 % over 8 at the issue's shape, 16: -6 %). */
#ifndef SK_G90_GROUP_N
#define SK_G90_GROUP_N 4
#endif
/* Pipeline stages of 48 KB; the shared memory left holds the epilogue's
 * staging: 4 stages leave 16 KB per consumer warpgroup (two 128-byte
 * slabs per store round), 3 leave 32 KB (four). */
#ifndef SK_G90_STAGES
#define SK_G90_STAGES 4
#endif

enum {
    kThreads = 384,       /* producer warpgroup + two consumer warpgroups */
    kTileM = 128,         /* rows of C per tile: one block row of A */
    kTileN = 256,         /* columns of C per tile */
    kChunkK = 64,         /* K per pipeline stage: one 128-byte swizzled row of 16-bit values */
    kWgRows = 64,         /* rows per consumer warpgroup */
    kStages = SK_G90_STAGES, /* A + B chunks in flight */
    kTileSlots = 4,       /* decoded tiles in flight between scheduler, producer and consumers */
    kGroupN = SK_G90_GROUP_N, /* N tiles per group of the tile order (L2 reuse of B) */
    kABytes = kTileM * kChunkK * 2,   /* 16 KB */
    kBBoxBytes = kChunkK * 64 * 2,    /* one 64 x 64 box of row-major B: 8 KB */
    kBBytes = kChunkK * kTileN * 2,   /* 32 KB */
    kStageBytes = kABytes + kBBytes,  /* 48 KB */
    kEpiSlabBytes = kWgRows * 128, /* 64 rows x 128 bytes */
    kEpiSlabs = kStages >= 4 ? 2 : 4, /* staging slabs per consumer warpgroup */
    kEpiBytes = kEpiSlabs * kEpiSlabBytes,
    kSwizzleAtom = 1024,  /* 8 rows x 128 B */
    kProducerRegs = 40,   /* setmaxnreg: 128 * 40 + 256 * 232 <= 65536 */
    kConsumerRegs = 232,
    kBarEpilogue0 = 1,    /* named barriers per consumer warpgroup; 0 is __syncthreads */
    kConsumerWarps = 8
};
static_assert(kProducerRegs * 128 + kConsumerRegs * 256 <= 65536, "register budget");

/* Byte offsets inside the 1024-aligned dynamic shared memory. */
enum : uint32_t {
    kOffStages = 0,
    kOffEpi = kStages * kStageBytes,              /* 2 x 16 KB */
    kOffBars = kOffEpi + 2 * kEpiBytes,           /* full[kStages], empty[kStages],
                                                     tile_full[kTileSlots], tile_empty[kTileSlots] */
    kOffTiles = kOffBars + (2 * kStages + 2 * kTileSlots) * 8, /* g90_tile[kTileSlots] */
    kSmemUsed = kOffTiles + kTileSlots * 32,
    kDynamicBytes = kSmemUsed + 1024 /* slack to align the base to 1024 */
};
static_assert(kDynamicBytes <= 232448, "227 KB of shared memory per block");

struct g90_params {
    CUtensorMap tm_a;      /* a_values as [nnz][128][block_k], box 64 x 128 x 1 */
    CUtensorMap tm_a_tail; /* the same with the K extent cut at the k tail */
    CUtensorMap tm_b;      /* row-major: {n, k}, box 64 x 64; column-major: {k, n}, box 64 x 256 */
    CUtensorMap tm_c;      /* {n, m}, box (128 B of columns) x 64 */
    const int32_t *col_indices;
    const int4 *row_info;
    int32_t *counter;
    const void *c;         /* for beta != 0 */
    int64_t ldc;
    int32_t m, n;
    int32_t row_blocks, col_blocks, n_tiles, num_tiles;
    int32_t chunks_per_block; /* block_k / 64 */
    int32_t tail_col;         /* the column block whose A is read through tm_a_tail, or -1 */
    int32_t tail_chunks;      /* chunks of that block holding columns before k */
    int32_t c_dtype;
    float alpha, beta;
};

/* ---------------------------------------------------------------------------
 * Device helpers
 * ------------------------------------------------------------------------- */

struct g90_smem {
    uint32_t base; /* shared address of the aligned base */
    __device__ uint32_t a(int s) const { return base + kOffStages + s * kStageBytes; }
    __device__ uint32_t b(int s) const { return a(s) + kABytes; }
    __device__ uint32_t full(int s) const { return base + kOffBars + 8 * s; }
    __device__ uint32_t empty(int s) const { return base + kOffBars + 8 * (kStages + s); }
    __device__ uint32_t tile_full(int t) const { return base + kOffBars + 8 * (2 * kStages + t); }
    __device__ uint32_t tile_empty(int t) const {
        return base + kOffBars + 8 * (2 * kStages + kTileSlots + t);
    }
};

/* Block-row slot and N tile of sequence position s (see the header). */
__device__ __forceinline__ void g90_tile_coords(const g90_params &p, int s, int *slot, int *nt) {
    const int per_group = p.row_blocks * kGroupN;
    const int group = s / per_group;
    const int within = s - group * per_group;
    const int width = min(kGroupN, p.n_tiles - group * kGroupN);
    *slot = within / width;
    *nt = group * kGroupN + (within - *slot * width);
}

/* Chunks loaded for column block c: none when out of range; at the k tail
 * only those holding columns before k (the rest would be all zeros). */
__device__ __forceinline__ int g90_block_chunks(const g90_params &p, int c) {
    if ((uint32_t)c >= (uint32_t)p.col_blocks) return 0;
    return c == p.tail_col ? p.tail_chunks : p.chunks_per_block;
}

/* ---------------------------------------------------------------------------
 * Producer: one warp
 * ------------------------------------------------------------------------- */

/* A decoded tile, as the scheduler hands it to the producer and consumers. */
struct g90_tile {
    int row;    /* block row of A; -1: no more tiles */
    int nt;     /* N tile */
    int chunks; /* 64-deep K chunks to load and multiply */
    int first;  /* the row's first visited entry */
    int end;    /* the row's end entry */
    int pad[3];
};

/* Warp 1: takes tiles from the counter and decodes them up to kTileSlots
 * ahead, so that the atomic and the layout reads (a few microseconds of
 * dependent latency) stay off the producer's path. */
__device__ void g90_scheduler(const g90_params &p, const g90_smem &sm, g90_tile *tiles) {
    const int lane = threadIdx.x & 31;
    int tslot = 0;
    uint32_t tphase = 0;
    for (;;) {
        int s = 0;
        if (lane == 0) s = atomicAdd(p.counter, 1);
        s = __shfl_sync(0xffffffffu, s, 0);
        g90_tile t = {-1, 0, 0, 0, 0, {0, 0, 0}};
        if (s < p.num_tiles) {
            int slot, nt;
            g90_tile_coords(p, s, &slot, &nt);
            const int4 ri = __ldg(p.row_info + slot); /* {row, first visited, end, column} */
            int chunks = 0;
            for (int e = ri.y + lane; e < ri.z; e += 32)
                chunks += g90_block_chunks(p, __ldg(p.col_indices + e));
#pragma unroll
            for (int o = 16; o > 0; o /= 2) chunks += __shfl_xor_sync(0xffffffffu, chunks, o);
            t.row = ri.x;
            t.nt = nt;
            t.chunks = chunks;
            t.first = ri.y;
            t.end = ri.z;
        }
        if (lane == 0) {
            sk_mbar_wait(sm.tile_empty(tslot), tphase ^ 1, "tile empty");
            tiles[tslot] = t;
            sk_mbar_arrive(sm.tile_full(tslot));
        }
        if (++tslot == kTileSlots) tslot = 0, tphase ^= 1;
        if (t.row < 0) break;
    }
}

/* Warp 0: the TMA loads of each tile's visited blocks. */
template <bool B_ROW_MAJOR>
__device__ void g90_producer(const g90_params &p, const g90_smem &sm, const g90_tile *tiles) {
    const int lane = threadIdx.x & 31;
    const uint64_t policy = sk_policy_evict_last();
    int stage = 0, tslot = 0;
    uint32_t phase = 0, tphase = 0;
    if (lane == 0) {
        sk_prefetch_tensormap(&p.tm_a);
        sk_prefetch_tensormap(&p.tm_a_tail);
        sk_prefetch_tensormap(&p.tm_b);
    }
    for (;;) {
        sk_mbar_wait(sm.tile_full(tslot), tphase, "tile full");
        const g90_tile t = tiles[tslot];
        __syncwarp();
        if (lane == 0) sk_mbar_arrive(sm.tile_empty(tslot));
        if (++tslot == kTileSlots) tslot = 0, tphase ^= 1;
        if (t.row < 0) break;

        const int n0 = t.nt * kTileN;
        for (int e0 = t.first; e0 < t.end; e0 += 32) {
            const int e = e0 + lane;
            const int col = e < t.end ? __ldg(p.col_indices + e) : -1;
            uint32_t mask = __ballot_sync(0xffffffffu, (uint32_t)col < (uint32_t)p.col_blocks);
            while (mask != 0) {
                const int l = __ffs(mask) - 1;
                mask &= mask - 1;
                const int c = __shfl_sync(0xffffffffu, col, l);
                if (lane == 0) {
                    const void *tm_a = c == p.tail_col ? &p.tm_a_tail : &p.tm_a;
                    const int chunks = g90_block_chunks(p, c);
                    for (int ch = 0; ch < chunks; ++ch) {
                        sk_mbar_wait(sm.empty(stage), phase ^ 1, "stage empty");
                        sk_mbar_arrive_expect_tx(sm.full(stage), kStageBytes);
                        sk_tma_load_3d(sm.a(stage), tm_a, ch * kChunkK, 0, e0 + l, sm.full(stage),
                                       policy);
                        const int k0 = c * p.chunks_per_block * kChunkK + ch * kChunkK;
                        if constexpr (B_ROW_MAJOR) {
#pragma unroll
                            for (int q = 0; q < kTileN / 64; ++q)
                                sk_tma_load_2d(sm.b(stage) + q * kBBoxBytes, &p.tm_b, n0 + 64 * q,
                                               k0, sm.full(stage), policy);
                        } else {
                            sk_tma_load_2d(sm.b(stage), &p.tm_b, k0, n0, sm.full(stage), policy);
                        }
                        if (++stage == kStages) stage = 0, phase ^= 1;
                    }
                }
            }
        }
        /* Lane 0 alone advanced the ring: share its position. */
        stage = __shfl_sync(0xffffffffu, stage, 0);
        phase = __shfl_sync(0xffffffffu, phase, 0);
    }
}

/* ---------------------------------------------------------------------------
 * Consumers: two warpgroups of 64 rows
 * ------------------------------------------------------------------------- */

/* Four wgmma m64n256k16 over one 64-deep chunk, one commit group. */
template <sk_dtype DT, bool B_ROW_MAJOR>
__device__ __forceinline__ void g90_mma_chunk(float acc[128], uint32_t a_base, uint32_t b_base) {
    const uint64_t da0 = sk_wgmma_desc_sw128(a_base, 16, kSwizzleAtom);
    /* Row-major B is N-major: its 64-column slabs (kBBoxBytes apart) are the
     * leading byte offset, 8-row groups of K the stride; K-major B as A. */
    const uint64_t db0 = B_ROW_MAJOR ? sk_wgmma_desc_sw128(b_base, kBBoxBytes, kSwizzleAtom)
                                     : sk_wgmma_desc_sw128(b_base, 16, kSwizzleAtom);
    sk_wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kChunkK / 16; ++kk) {
        /* 16 of K: +32 B inside A's (and K-major B's) 128-byte rows; two
         * 8-row atoms down N-major B. */
        const uint64_t da = da0 + ((kk * 32) >> 4);
        const uint64_t db = db0 + (B_ROW_MAJOR ? (kk * 2 * kSwizzleAtom) >> 4 : (kk * 32) >> 4);
        if constexpr (DT == SK_DTYPE_BF16)
            sk_wgmma_m64n256k16_ss_bf16<B_ROW_MAJOR ? 1 : 0>(acc, da, db);
        else
            sk_wgmma_m64n256k16_ss_f16<B_ROW_MAJOR ? 1 : 0>(acc, da, db);
    }
    sk_wgmma_commit();
}

__device__ __forceinline__ float g90_load_c(const g90_params &p, int64_t r, int64_t c) {
    if (r >= p.m || c >= p.n) return 0.0f;
    const int64_t i = r * p.ldc + c;
    if (p.c_dtype == SK_DTYPE_F32) return ((const float *)p.c)[i];
    if (p.c_dtype == SK_DTYPE_BF16) return __bfloat162float(((const __nv_bfloat16 *)p.c)[i]);
    return __half2float(((const __half *)p.c)[i]);
}

/* A store round's two ends, around the threads' writes into the warpgroup's
 * staging buffer. acquire: the previous round's (or tile's) TMA stores must
 * have read the buffer. store: the writes made visible to TMA, then one
 * thread stores the kEpiSlabs slabs of slab_cols columns from (col, row0). */
__device__ __forceinline__ void g90_staging_acquire(int wg) {
    if ((threadIdx.x & 127) == 0) sk_bulk_wait_read<0>();
    sk_bar_sync(kBarEpilogue0 + wg, 128);
}

__device__ __forceinline__ void g90_staging_store(const g90_params &p, uint32_t stage_addr, int col,
                                                  int slab_cols, int row0, int wg) {
    sk_fence_proxy_async_smem();
    sk_bar_sync(kBarEpilogue0 + wg, 128);
    if ((threadIdx.x & 127) == 0) {
#pragma unroll
        for (int s = 0; s < kEpiSlabs; ++s)
            sk_tma_store_2d(&p.tm_c, stage_addr + s * kEpiSlabBytes, col + s * slab_cols, row0);
        sk_bulk_commit();
    }
}

/* Accumulator layout (m64nN fp32): register i of lane (g = lane / 4,
 * t = lane % 4) of warp w holds row 16 w + g + 8 ((i >> 1) & 1), column
 * 8 (i >> 2) + 2 t + (i & 1).
 *
 * ES: bytes per C element (2 or 4). A round covers kEpiSlabs 128-byte
 * slabs: 128 / ES * kEpiSlabs columns; TMA stores each slab as one box. */
template <int ES>
__device__ __forceinline__ void g90_epilogue_generic(const g90_params &p, const float acc[128],
                                             uint8_t *stage_ptr, uint32_t stage_addr, int row0,
                                             int col0, int wg) {
    constexpr int kSlabCols = 128 / ES, kRoundCols = kEpiSlabs * kSlabCols;
    constexpr int kRounds = kTileN / kRoundCols;
    const int tid = threadIdx.x & 127, warp = tid / 32, lane = tid & 31;
    const int g = lane / 4, t = lane % 4;
    const bool read_c = p.beta != 0.0f;
#pragma unroll
    for (int round = 0; round < kRounds; ++round) {
        g90_staging_acquire(wg);
#pragma unroll
        for (int j = 0; j < kRoundCols / 8; ++j) {
            const int jj = round * (kRoundCols / 8) + j; /* 8-column group within the tile */
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int i = 4 * jj + 2 * h;
                const int rr = 16 * warp + g + 8 * h;    /* row within the warpgroup's 64 */
                const int cc = 8 * j + 2 * t;            /* column within the round */
                float v0 = p.alpha * acc[i], v1 = p.alpha * acc[i + 1];
                if (read_c) {
                    const int64_t r = (int64_t)row0 + rr, c = (int64_t)col0 + round * kRoundCols + cc;
                    v0 += p.beta * g90_load_c(p, r, c);
                    v1 += p.beta * g90_load_c(p, r, c + 1);
                }
                const int slab = cc / kSlabCols, byte = (cc % kSlabCols) * ES;
                const uint32_t off = slab * kEpiSlabBytes + rr * 128 +
                                     ((((byte >> 4) ^ (rr & 7))) << 4) + (byte & 15);
                if constexpr (ES == 4) {
                    *(float2 *)(stage_ptr + off) = make_float2(v0, v1);
                } else {
                    const uint32_t packed = p.c_dtype == SK_DTYPE_BF16 ? sk_cvt_bf16x2(v1, v0)
                                                                       : sk_cvt_f16x2(v1, v0);
                    *(uint32_t *)(stage_ptr + off) = packed;
                }
            }
        }
        g90_staging_store(p, stage_addr, col0 + round * kRoundCols, kSlabCols, row0, wg);
    }
}

/* The common case, 16-bit C and beta = 0, with stmatrix: one instruction
 * stores four 8 x 8 matrices (8 values per thread), a quarter of the
 * instructions of the generic path. Lane l gives the address of row l % 8
 * of matrix l / 8; matrices 0-3 are (rows 0-7, columns 8jj..), (rows 8-15,
 * 8jj..), (rows 0-7, 8jj+8..), (rows 8-15, 8jj+8..) of the warp's 16 rows.
 * In a 128B-swizzled slab the 16-byte chunk of that row is
 * (column chunk) ^ (row & 7) = 2q ^ ((l >> 4) ^ (l & 7)) for the q-th pair
 * of 8-column groups: four addresses per thread, made once. */
template <bool BF16>
__device__ __forceinline__ void g90_epilogue_16(const g90_params &p, const float acc[128],
                                                uint32_t stage_addr, int row0, int col0, int wg) {
    constexpr int kRoundCols = kEpiSlabs * 64, kRounds = kTileN / kRoundCols;
    const int tid = threadIdx.x & 127, warp = tid / 32, lane = tid & 31;
    const uint32_t lrow = 16 * warp + (lane & 7) + 8 * ((lane >> 3) & 1);
    const uint32_t lswz = (uint32_t)((lane >> 4) ^ (lane & 7));
    uint32_t addr[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) addr[q] = stage_addr + lrow * 128 + (((2u * q) ^ lswz) << 4);
#pragma unroll
    for (int round = 0; round < kRounds; ++round) {
        g90_staging_acquire(wg);
#pragma unroll
        for (int jp = 0; jp < kRoundCols / 16; ++jp) {
            const int jj = round * (kRoundCols / 8) + 2 * jp; /* first 8-column group */
            uint32_t m[4];
#pragma unroll
            for (int x = 0; x < 4; ++x) {
                const int i = 4 * (jj + (x >> 1)) + 2 * (x & 1);
                const float v0 = p.alpha * acc[i], v1 = p.alpha * acc[i + 1];
                m[x] = BF16 ? sk_cvt_bf16x2(v1, v0) : sk_cvt_f16x2(v1, v0);
            }
            sk_stmatrix_x4(addr[jp % 4] + (jp / 4) * kEpiSlabBytes, m[0], m[1], m[2], m[3]);
        }
        g90_staging_store(p, stage_addr, col0 + round * kRoundCols, 64, row0, wg);
    }
}

template <sk_dtype DT, bool B_ROW_MAJOR>
__device__ void g90_consumer(const g90_params &p, const g90_smem &sm, uint8_t *base_ptr,
                             const g90_tile *tiles, int wg) {
    const int lane = threadIdx.x & 31;
    const uint32_t epi_addr = sm.base + kOffEpi + wg * kEpiBytes;
    uint8_t *epi_ptr = base_ptr + kOffEpi + wg * kEpiBytes;
    int stage = 0, tslot = 0;
    uint32_t phase = 0, tphase = 0;
    float acc[128];
    for (;;) {
        sk_mbar_wait(sm.tile_full(tslot), tphase, "tile full");
        const g90_tile t = tiles[tslot];
        sk_mbar_arrive(sm.tile_empty(tslot));
        if (++tslot == kTileSlots) tslot = 0, tphase ^= 1;
        if (t.row < 0) break;

#pragma unroll
        for (int i = 0; i < 128; ++i) acc[i] = 0.0f;
        int prev = 0;
        for (int c = 0; c < t.chunks; ++c) {
            sk_mbar_wait(sm.full(stage), phase, "stage full");
            g90_mma_chunk<DT, B_ROW_MAJOR>(acc, sm.a(stage) + wg * (kWgRows * 128), sm.b(stage));
            sk_wgmma_wait<1>();
            if (c > 0 && lane == 0) sk_mbar_arrive(sm.empty(prev));
            prev = stage;
            if (++stage == kStages) stage = 0, phase ^= 1;
        }
        sk_wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < 128; ++i) sk_reg_fence(acc[i]);
        if (t.chunks > 0 && lane == 0) sk_mbar_arrive(sm.empty(prev));

        const int row0 = t.row * kTileM + wg * kWgRows, col0 = t.nt * kTileN;
        if (p.c_dtype == SK_DTYPE_F32)
            g90_epilogue_generic<4>(p, acc, epi_ptr, epi_addr, row0, col0, wg);
        else if (p.beta != 0.0f)
            g90_epilogue_generic<2>(p, acc, epi_ptr, epi_addr, row0, col0, wg);
        else if (p.c_dtype == SK_DTYPE_BF16)
            g90_epilogue_16<true>(p, acc, epi_addr, row0, col0, wg);
        else
            g90_epilogue_16<false>(p, acc, epi_addr, row0, col0, wg);
    }
    /* Every store must be done before the CTA's shared memory goes away. */
    if ((threadIdx.x & 127) == 0) sk_bulk_wait<0>();
}

template <sk_dtype DT, bool B_ROW_MAJOR>
__global__ void __launch_bounds__(kThreads, 1)
    sk_bsr_gemm_sm90_kernel(const __grid_constant__ g90_params p) {
    extern __shared__ __align__(1024) uint8_t smem_raw[];
    const uint32_t raw = (uint32_t)__cvta_generic_to_shared(smem_raw);
    const uint32_t pad = (1024 - (raw & 1023)) & 1023;
    uint8_t *base_ptr = smem_raw + pad;
    g90_smem sm;
    sm.base = raw + pad;
    g90_tile *tiles = (g90_tile *)(base_ptr + kOffTiles);

    if (threadIdx.x == 0) {
        for (int s = 0; s < kStages; ++s) {
            sk_mbar_init(sm.full(s), 1);
            sk_mbar_init(sm.empty(s), kConsumerWarps);
        }
        for (int t = 0; t < kTileSlots; ++t) {
            sk_mbar_init(sm.tile_full(t), 1);
            sk_mbar_init(sm.tile_empty(t), 256 + 1); /* consumer threads + producer */
        }
        sk_fence_mbar_init();
    }
    __syncthreads();

    const int wg = threadIdx.x / 128;
    if (wg == 0) {
        sk_setmaxnreg_dec<kProducerRegs>();
        if (threadIdx.x / 32 == 0) g90_producer<B_ROW_MAJOR>(p, sm, tiles);
        if (threadIdx.x / 32 == 1) g90_scheduler(p, sm, tiles);
        return;
    }
    sk_setmaxnreg_inc<kConsumerRegs>();
    g90_consumer<DT, B_ROW_MAJOR>(p, sm, base_ptr, tiles, wg - 1);
}

/* ---------------------------------------------------------------------------
 * Host side
 * ------------------------------------------------------------------------- */

/* Fill the four maps; pointers may be placeholders (supports() only asks
 * whether the driver accepts the geometry). */
static CUresult g90_encode_all(g90_params *prm, const sk_bsr_gemm_problem *p, const void *a,
                               const void *b, const void *c) {
    const int64_t bk = p->block_k, es = 2;
    const int64_t k_tail = p->k - (int64_t)(p->col_blocks - 1) * bk; /* 1..bk */
    const cuuint64_t nnz = p->nnz > 0 ? (cuuint64_t)p->nnz : 1;
    const cuuint64_t a_dims[3] = {(cuuint64_t)bk, kTileM, nnz};
    const cuuint64_t a_tail_dims[3] = {(cuuint64_t)k_tail, kTileM, nnz};
    const cuuint64_t a_strides[2] = {(cuuint64_t)(bk * es), (cuuint64_t)(bk * es * kTileM)};
    const cuuint32_t a_box[3] = {kChunkK, kTileM, 1};
    CUresult r = sk_tensor_map_encode_sw128(&prm->tm_a, p->ab_dtype, 3, a, a_dims, a_strides, a_box);
    if (r == CUDA_SUCCESS)
        r = sk_tensor_map_encode_sw128(&prm->tm_a_tail, p->ab_dtype, 3, a, a_tail_dims, a_strides, a_box);
    if (r != CUDA_SUCCESS) return r;

    const cuuint64_t b_stride[1] = {(cuuint64_t)(p->ldb * es)};
    if (p->b_order == SK_ORDER_ROW_MAJOR) {
        const cuuint64_t dims[2] = {(cuuint64_t)p->n, (cuuint64_t)p->k};
        const cuuint32_t box[2] = {64, kChunkK};
        r = sk_tensor_map_encode_sw128(&prm->tm_b, p->ab_dtype, 2, b, dims, b_stride, box);
    } else {
        const cuuint64_t dims[2] = {(cuuint64_t)p->k, (cuuint64_t)p->n};
        const cuuint32_t box[2] = {kChunkK, kTileN};
        r = sk_tensor_map_encode_sw128(&prm->tm_b, p->ab_dtype, 2, b, dims, b_stride, box);
    }
    if (r != CUDA_SUCCESS) return r;

    const int64_t cs = p->c_dtype == SK_DTYPE_F32 ? 4 : 2;
    const cuuint64_t c_dims[2] = {(cuuint64_t)p->n, (cuuint64_t)p->m};
    const cuuint64_t c_stride[1] = {(cuuint64_t)(p->ldc * cs)};
    const cuuint32_t c_box[2] = {(cuuint32_t)(128 / cs), kWgRows};
    return sk_tensor_map_encode_sw128(&prm->tm_c, p->c_dtype, 2, c, c_dims, c_stride, c_box);
}

/* Largest extent and tile count the kernel's int32 coordinates handle. */
static const int64_t kG90MaxExtent = (int64_t)1 << 30;

int sk_bsr_gemm_sm90_supports(const sk_bsr_gemm_problem *p) {
    if (p->ab_dtype != SK_DTYPE_F16 && p->ab_dtype != SK_DTYPE_BF16) return 0;
    if (p->c_dtype != SK_DTYPE_F16 && p->c_dtype != SK_DTYPE_BF16 && p->c_dtype != SK_DTYPE_F32)
        return 0;
    if (p->block_m != kTileM || (p->block_k != 64 && p->block_k != 128)) return 0;
    if (p->m > kG90MaxExtent || p->n > kG90MaxExtent || p->k > kG90MaxExtent) return 0;
    /* TMA stores a row's last partial 16-byte chunk whole (measured on H200:
     * with n * sizeof(C) not a multiple of 16, the columns up to the next
     * 16 bytes, C's padding, were written): such n go to the portable kernel. */
    const int64_t cs = p->c_dtype == SK_DTYPE_F32 ? 4 : 2;
    if ((p->n * cs) % 16 != 0) return 0;
    const int64_t n_tiles = (p->n + kTileN - 1) / kTileN;
    if (n_tiles * p->row_blocks > INT32_MAX / 2) return 0;
    g90_params prm;
    const void *dummy = (const void *)(uintptr_t)(1u << 20);
    return g90_encode_all(&prm, p, dummy, dummy, dummy) == CUDA_SUCCESS;
}

template <sk_dtype DT, bool B_ROW_MAJOR>
static sk_status g90_launch(const g90_params &prm, int grid, cudaStream_t stream) {
    SK_CUDA_TRY(cudaFuncSetAttribute(sk_bsr_gemm_sm90_kernel<DT, B_ROW_MAJOR>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)kDynamicBytes),
                "cudaFuncSetAttribute");
    sk_bsr_gemm_sm90_kernel<DT, B_ROW_MAJOR><<<grid, kThreads, kDynamicBytes, stream>>>(prm);
    return sk_cuda_status(cudaGetLastError(), "sm90 BSR GEMM kernel launch");
}

sk_status sk_bsr_gemm_sm90_launch(const sk_bsr_gemm_problem *p, const sk_bsr_gemm_schedule *s,
                                  cudaStream_t stream) {
    if (!sk_bsr_gemm_sm90_supports(p))
        return sk_error(SK_STATUS_NOT_SUPPORTED,
                        "the Hopper GEMM kernel does not cover this problem (blocks %d x %d)",
                        (int)p->block_m, (int)p->block_k);
    g90_params prm;
    memset(&prm, 0, sizeof prm);
    const void *a = p->nnz > 0 ? p->a_values : (const void *)(uintptr_t)(1u << 20);
    const CUresult r = g90_encode_all(&prm, p, a, p->b, p->c);
    if (r != CUDA_SUCCESS)
        return sk_error(SK_STATUS_EXECUTION_FAILED, "cuTensorMapEncodeTiled failed (CUresult %d)",
                        (int)r);
    prm.col_indices = p->col_indices;
    prm.row_info = s->row_info;
    prm.counter = s->counter;
    prm.c = p->c;
    prm.ldc = p->ldc;
    prm.m = (int32_t)p->m;
    prm.n = (int32_t)p->n;
    prm.row_blocks = p->row_blocks;
    prm.col_blocks = p->col_blocks;
    prm.n_tiles = (int32_t)((p->n + kTileN - 1) / kTileN);
    prm.num_tiles = prm.n_tiles * p->row_blocks;
    prm.chunks_per_block = p->block_k / kChunkK;
    prm.tail_col = p->k % p->block_k != 0 ? p->col_blocks - 1 : -1;
    prm.tail_chunks = (int32_t)((p->k % p->block_k + kChunkK - 1) / kChunkK);
    prm.c_dtype = (int32_t)p->c_dtype;
    prm.alpha = p->alpha;
    prm.beta = p->beta;

    int device = 0, sms = 0;
    SK_CUDA_TRY(cudaGetDevice(&device), "cudaGetDevice");
    SK_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
                "cudaDeviceGetAttribute");
    const int grid = prm.num_tiles < sms ? prm.num_tiles : sms;
    if (grid <= 0) return SK_STATUS_SUCCESS;
    const bool bf16 = p->ab_dtype == SK_DTYPE_BF16;
    if (p->b_order == SK_ORDER_ROW_MAJOR)
        return bf16 ? g90_launch<SK_DTYPE_BF16, true>(prm, grid, stream)
                    : g90_launch<SK_DTYPE_F16, true>(prm, grid, stream);
    return bf16 ? g90_launch<SK_DTYPE_BF16, false>(prm, grid, stream)
                : g90_launch<SK_DTYPE_F16, false>(prm, grid, stream);
}
