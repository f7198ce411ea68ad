/*
 * attention_sm80.cu - the portable block-sparse attention forward (sm_80+):
 * FlashAttention-2 style, mma.sync tensor cores, cp.async double buffering,
 * visiting only the selected key blocks of each layout row.
 *
 * Work. A tile is one layout row of one (batch, query head): block_q query
 * rows against the row's selected key blocks (attention_kernels.h). The grid
 * is persistent, two CTAs of 4 warps per SM; each CTA takes tiles in the
 * plan's order (longest first) through an atomic counter. The plan stores
 * per slot the tile's first visited entry (attention_sm80_sched.cuh), and
 * thread 0 keeps one grabbed slot and one tile_info copy (cp.async) ahead,
 * so a tile switch waits on no global load; the look-ahead entry is visible
 * to all threads since the tile start, so a non-empty next tile is taken
 * without a barrier. The next tile's first K/V chunk loads during the
 * current tile's last chunk, its Q right after the last chunk's softmax
 * (warmed in L2 when the tile enters its last block).
 *
 * CTA: 4 warps; warp w owns block_q / 4 query rows (kMT = block_q / 64 m16
 * tiles) and their O accumulators (fp32, registers). The Q tile stays
 * resident in shared memory for the whole tile (ldmatrix per use: with 32
 * rows per warp the registers hold O and S, not Q as well). The uniform
 * scheduling state (cursor: tile, row entry, column, chunk) lives in shared
 * memory, written by thread 0 and read after the next barrier, to leave the
 * registers to the accumulators (255 at D = 128, no spills).
 *
 * Per 64-key chunk of a selected block:
 *   S = Q K^T            mma.sync m16n8k16, K fragments by ldmatrix, each
 *                        used by all kMT m-tiles of the warp
 *   online softmax       base 2: p = 2^(s c - ms), c = |scale| log2(e). The
 *                        reference max ms of a row moves (rescaling O and l)
 *                        only when a score exceeds it by more than 8, decided
 *                        per warp by a vote on per-thread maxima; otherwise
 *                        p <= 2^8, no shuffles and no rescale (and none in
 *                        a tile's first chunk, where O and l are 0)
 *   O += P V             P repacked from the S accumulators as the A operand
 *                        (no shared memory), V fragments by ldmatrix.trans
 * The mask (tails k >= Sk; causal k > q + Sk - Sq) is applied only in the
 * chunks that need it; a chunk with no visible key for a warp's rows is
 * skipped by that warp, and chunks and blocks invisible to the whole tile
 * are never loaded.
 *
 * Pipeline. Shared memory: two stages of one chunk of K and V, and the Q
 * tile (96 KB at D = 128, block_q = 128: two CTAs per SM). Each warp loads
 * its own rows: 16 rows of K and of V per chunk, and its own Q rows, which
 * only it reads. One barrier per chunk: at its top, chunk c's K and V have
 * landed (wait_group 1) and every warp is done with the other stage, into
 * which chunk c+1 is then issued (one cp.async group); a second group [Q of
 * the next tile, usually empty] follows after the softmax: a warp reloads
 * its Q rows after its own softmax and a __syncwarp, no CTA barrier. A
 * tile's epilogue computes O / l (and LSE) in registers, then, after one
 * barrier, stages O through the last chunk's stage and writes it as 16-byte
 * row chunks; a tile switch costs that barrier and the tile start's. Rows
 * past Sk (or Sq) are zero-filled by cp.async with src-size 0: never read,
 * and 0 * V never makes NaN. Shared rows are 16-byte chunks XOR-swizzled by
 * row % 8: ldmatrix, cp.async and the O staging are free of bank conflicts.
 *
 * Invariants: nothing outside [0, Sq) x [0, Sk) of Q/K/V is read and
 * nothing outside the tile's O rows < Sq and LSE entries is written; layout
 * content is clamped (attention_sm80_sched.cuh) so any content stays in
 * bounds; a tile's result depends only on its inputs and the order of its
 * row's indices, so outputs are bitwise reproducible whatever CTA runs it.
 * Negative scales are handled exactly: Q's sign bits are flipped once per
 * tile in shared memory and the scale made positive. Index math inside the
 * loops is 32-bit (seq strides are checked below 2^24 bytes); base pointers
 * are 64-bit.
 */
#include <math.h>
#include <stdint.h>

#include "cuda/attention_kernels.h"
#include "cuda/attention_sm80_sched.cuh"
#include "cuda/cuda_check.cuh"
#include "cuda/ptx.cuh"

enum {
    SK_SM80_WARPS = 4,          /* per CTA */
    SK_SM80_THREADS = 32 * SK_SM80_WARPS,
    SK_SM80_CTAS_PER_SM = 2,    /* two CTAs per SM de-phase each other's barriers */
    SK_SM80_MTILE = 16,         /* rows of one m16 MMA tile; a warp owns block_q / 64 of them */
    SK_SM80_CHUNK_KEYS = 64,    /* keys per pipeline stage and softmax step */
    SK_SM80_MAX_BLOCK = 128,    /* largest block_q / block_k */
    SK_SM80_SMEM_LIMIT = 227 * 1024,
    /* Seq strides are used as 32-bit byte offsets of up to 128 rows. */
    SK_SM80_MAX_SEQ_STRIDE_BYTES = 1 << 24,
    SK_SM80_MAX_SEQ = 0x7fffffff - 2 * SK_SM80_MAX_BLOCK
};

static const float SK_LOG2E = 1.4426950408889634f;
#define SK_LN2 0.6931471805599453f
/* The reference max of a row moves only when exceeded by more than this
 * (log2 units): P stays <= 2^8, and O is rarely rescaled. */
#define SK_SM80_RESCALE_LOG2 8.0f

/* Kernel parameters: byte strides; seq strides fit 32 bits (checked). */
typedef struct sk_sm80_params {
    const char *q, *k, *v;
    char *o;
    float *lse; /* [B, Hq, Sq] or NULL */
    int64_t q_sb, q_sh, k_sb, k_sh, v_sb, v_sh, o_sb, o_sh; /* batch / head strides, bytes */
    int32_t q_ss, k_ss, v_ss, o_ss;                         /* seq strides, bytes */
    int32_t seq_q, seq_k, diag;                             /* diag = Sk - Sq */
    int32_t heads_q, group;
    uint32_t rb_mul, rb_shift, hq_mul, hq_shift; /* n / row_blocks, n / heads_q by multiply */
    uint32_t gq_mul, gq_shift;                   /* n / group (query head -> K/V head) */
    int32_t block_q, block_k, row_blocks, col_blocks;
    int32_t layout_batch, layout_heads, head_div, nnz;
    int32_t num_tiles;
    int32_t causal;
    const int32_t *row_offsets, *col_indices;
    const int4 *tile_info; /* [num_tiles] {tile, first pos, end, first col} */
    int32_t *tile_counter;
    float scale_abs, scale_log2; /* |scale|, |scale| * log2(e) */
    uint32_t q_sign;             /* 0x80008000 when scale < 0: Q negated exactly */
} sk_sm80_params;

/* Where the pipeline is: a tile (batch, query head, row block), the current
 * entry of its layout row, that entry's column, and the 64-key chunk of
 * that block. b = -1: nothing. */
typedef struct sk_sm80_cursor {
    int32_t b, h, i;
    int32_t pos, end, col; /* current entry, end of the row, its column */
    int32_t sub, tile; /* 64-key chunk of the block; tile id */
    int64_t koff, voff; /* byte offsets of the (b, h / group) slices of K and V */
} sk_sm80_cursor;

/* The CTA's scheduling state in shared memory. Uniform values live here
 * rather than in registers, which the accumulators need: thread 0 writes,
 * every thread reads after the next barrier. */
typedef struct sk_sm80_shared {
    int4 info[2];              /* published tile_info entries, by parity */
    int4 pending[2];           /* thread 0's look-ahead copies, by parity */
    sk_sm80_cursor cur[2];     /* the chunk in each stage */
    /* Per warp, written by its lane 0 at a tile's last chunk and read by its
     * lanes after a __syncwarp: {b, h, i, first key} of the next tile's
     * first chunk (b = -1: none), for the warp's own load of that tile's Q. */
    int4 wnext[SK_SM80_WARPS];
} sk_sm80_shared;

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

/* Flip the sign bits of the Q chunks this thread loaded (same mapping as
 * sk_sm80_load_rows_warp from `tile`), once its copies have completed. */
template <int kD, int kRows>
__device__ __forceinline__ void sk_sm80_negate_rows_warp(unsigned char *tile) {
    constexpr int kChunks = kD / 8, kStep = 32 / kChunks;
    const int lane = threadIdx.x & 31;
    const int c = lane % kChunks, r0 = lane / kChunks;
    unsigned char *q0 = tile + r0 * kD * 2;
    const uint32_t cx = (uint32_t)(c ^ r0);
#pragma unroll
    for (int k = 0; k < kRows / kStep; ++k) {
        uint4 *q = (uint4 *)(q0 + k * kStep * kD * 2 + ((cx ^ (uint32_t)((k * kStep) & 7)) << 4));
        uint4 v = *q;
        v.x ^= 0x80008000u;
        v.y ^= 0x80008000u;
        v.z ^= 0x80008000u;
        v.w ^= 0x80008000u;
        *q = v;
    }
}

/* n / d for 0 <= n < 2^31 with precomputed (mul, shift) (sk_sm80_magic). */
__device__ __forceinline__ int32_t sk_sm80_div(int32_t n, uint32_t mul, uint32_t shift) {
    return (int32_t)((__umulhi((uint32_t)n, mul) + (uint32_t)n) >> shift);
}

/* Decode and sanitise one tile_info entry into a cursor at the tile's first
 * visited entry; false when it names no tile. A tile with nothing to visit
 * gets pos = end. */
__device__ __forceinline__ bool sk_sm80_cursor_of(const sk_sm80_params &p, int4 info,
                                                  sk_sm80_cursor *c) {
    if (info.x < 0 || info.x >= p.num_tiles) return false;
    const int32_t bh = sk_sm80_div(info.x, p.rb_mul, p.rb_shift);
    c->i = info.x - bh * p.row_blocks;
    c->b = sk_sm80_div(bh, p.hq_mul, p.hq_shift);
    c->h = bh - c->b * p.heads_q;
    /* A stale plan must still stay in bounds: clamp to this layout. */
    c->end = min(max(info.z, 0), p.nnz);
    c->pos = info.y;
    c->col = info.w;
    c->sub = 0;
    c->tile = info.x;
    const int32_t hk = sk_sm80_div(c->h, p.gq_mul, p.gq_shift);
    c->koff = c->b * p.k_sb + hk * p.k_sh;
    c->voff = c->b * p.v_sb + hk * p.v_sh;
    if (c->pos < 0 || c->pos >= c->end || (uint32_t)c->col >= (uint32_t)p.col_blocks)
        c->pos = c->end; /* nothing to visit */
    return true;
}

/* O = 0 and LSE = -inf for the rows of an empty tile (all threads). */
template <int kD>
__device__ void sk_sm80_write_empty(const sk_sm80_params &p, const sk_sm80_cursor &t) {
    constexpr int kChunks = kD / 8;
    const int q0 = t.i * p.block_q;
    const int rows = min(p.block_q, p.seq_q - q0);
    char *o = p.o + t.b * p.o_sb + t.h * p.o_sh + (int64_t)q0 * p.o_ss;
    for (int idx = threadIdx.x; idx < rows * kChunks; idx += blockDim.x) {
        const int r = idx / kChunks, c = idx % kChunks;
        *(uint4 *)(o + (uint32_t)r * (uint32_t)p.o_ss + c * 16) = make_uint4(0, 0, 0, 0);
    }
    if (p.lse != NULL) {
        float *lse = p.lse + ((int64_t)t.b * p.heads_q + t.h) * p.seq_q + q0;
        for (int r = threadIdx.x; r < rows; r += blockDim.x) lse[r] = -INFINITY;
    }
}

/* Thread 0: start copying the tile_info entry of the slot grabbed last
 * time (slot_reg) into pending[next] and grab a new slot; past the last
 * tile, write the end marker there instead. */
static __device__ __forceinline__ void sk_sm80_prefetch_info(const sk_sm80_params &p,
                                                             sk_sm80_shared *sh, int next,
                                                             int &slot_reg) {
    if (slot_reg < p.num_tiles) {
        sk_cp_async_16((uint32_t)__cvta_generic_to_shared(&sh->pending[next]),
                       p.tile_info + slot_reg, 16u);
        slot_reg = atomicAdd(p.tile_counter, 1);
    } else {
        sh->pending[next] = make_int4(-1, 0, 0, -1);
    }
}

/* The CTA's next non-empty tile: true with its tile_info entry in *info
 * (decode it with sk_sm80_cursor_of), false when no tile is left. Writes
 * the outputs of the empty tiles it passes. Called by all threads alike.
 *
 * Thread 0 runs two steps ahead, so that nothing here waits on memory: the
 * tile_info that it copied into pending[parity] on the previous call
 * (cp.async) is complete and visible to every thread since the current tile
 * started (wait_group 0, then a barrier); it starts the copy for the slot
 * it grabbed on the previous call into pending[parity ^ 1] (read by the
 * others on the previous call, before that barrier) and grabs a new slot.
 * `fast`: pending[parity] is known to be visible. Then a non-empty tile or
 * the end costs no barrier. Otherwise (the first call, empty tiles, entries
 * that name no tile) thread 0 publishes the entry in info[parity] for a
 * barrier each; only when it skips empty tiles within one call does it wait
 * for its copy (an extra group of thread 0 alone only makes its later waits
 * stricter). */
template <int kD>
__device__ bool sk_sm80_acquire(const sk_sm80_params &p, sk_sm80_shared *sh, int &parity,
                                int &slot_reg, bool fast, int4 *info_out) {
    if (fast) {
        const int4 info = sh->pending[parity];
        if (info.x == -1) return false; /* the counter ran past the last tile */
        const int32_t end = min(max(info.z, 0), p.nnz);
        if (info.x >= 0 && info.x < p.num_tiles && info.y >= 0 && info.y < end &&
            (uint32_t)info.w < (uint32_t)p.col_blocks) {
            if (threadIdx.x == 0) sk_sm80_prefetch_info(p, sh, parity ^ 1, slot_reg);
            parity ^= 1;
            *info_out = info;
            return true;
        }
    }
    for (int pass = 0;; ++pass) {
        if (threadIdx.x == 0) {
            if (pass > 0) {
                sk_cp_async_commit();
                sk_cp_async_wait<0>();
            }
            sh->info[parity] = sh->pending[parity];
            sk_sm80_prefetch_info(p, sh, parity ^ 1, slot_reg);
        }
        __syncthreads();
        const int at = parity;
        parity ^= 1;
        const int4 info = sh->info[at];
        if (info.x == -1) return false; /* the counter ran past the last tile */
        if (info.x < 0 || info.x >= p.num_tiles) continue; /* not a tile */
        /* Non-empty exactly when sk_sm80_cursor_of finds an entry to visit. */
        const int32_t end = min(max(info.z, 0), p.nnz);
        if (info.y >= 0 && info.y < end && (uint32_t)info.w < (uint32_t)p.col_blocks) {
            *info_out = info;
            return true;
        }
        sk_sm80_cursor t;
        sk_sm80_cursor_of(p, info, &t);
        sk_sm80_write_empty<kD>(p, t);
    }
}

/* cp.async this warp's rows of the Q tile of tile (b, h, row block i)
 * (rows past Sq zero-filled). */
template <int kD, int kBq>
__device__ __forceinline__ void sk_sm80_load_q_warp(const sk_sm80_params &p, int b, int h, int i,
                                                    uint32_t q_smem) {
    constexpr int kWarpRows = kBq / SK_SM80_WARPS;
    const int warp = threadIdx.x >> 5;
    const int q0 = i * kBq, r0 = kWarpRows * warp;
    const char *tile = p.q + b * p.q_sb + h * p.q_sh + (int64_t)q0 * p.q_ss;
    sk_sm80_load_rows_warp<kD, kWarpRows>(q_smem + (uint32_t)(r0 * kD * 2),
                                          tile + (uint32_t)r0 * (uint32_t)p.q_ss, p.q_ss,
                                          p.seq_q - q0 - r0, tile);
}

/* cp.async this warp's 16 rows of the cursor's 64-key chunk of K and V
 * (first key key0) into one stage (keys past Sk zero-filled). */
template <int kD>
__device__ __forceinline__ void sk_sm80_load_chunk_warp(const sk_sm80_params &p,
                                                        const sk_sm80_cursor &c, int key0,
                                                        uint32_t dst) {
    constexpr int kRows = SK_SM80_CHUNK_KEYS / SK_SM80_WARPS;
    const int warp = threadIdx.x >> 5;
    const int r0 = kRows * warp;
    const int valid = min(SK_SM80_CHUNK_KEYS, p.seq_k - key0) - r0;
    const char *k = p.k + c.koff + (int64_t)key0 * p.k_ss;
    const char *v = p.v + c.voff + (int64_t)key0 * p.v_ss;
    dst += (uint32_t)(r0 * kD * 2);
    sk_sm80_load_rows_warp<kD, kRows>(dst, k + (uint32_t)r0 * (uint32_t)p.k_ss, p.k_ss, valid, k);
    sk_sm80_load_rows_warp<kD, kRows>(dst + SK_SM80_CHUNK_KEYS * kD * 2,
                                      v + (uint32_t)r0 * (uint32_t)p.v_ss, p.v_ss, valid, v);
}

/* The first key of the cursor's chunk. */
__device__ __forceinline__ int sk_sm80_key0(const sk_sm80_params &p, const sk_sm80_cursor &c) {
    return c.col * p.block_k + c.sub * SK_SM80_CHUNK_KEYS;
}

/* Warm L2 with the Q tile of the tile this CTA most likely takes next:
 * thread 0's look-ahead copy of its tile_info, complete and visible since
 * the current tile started. A hint only: any tile is a valid address. */
template <int kD, int kBq>
__device__ __forceinline__ void sk_sm80_prefetch_q(const sk_sm80_params &p, int4 info) {
    sk_sm80_cursor c;
    if (!sk_sm80_cursor_of(p, info, &c)) return;
    constexpr int kLines = kD * 2 / 128; /* 128-byte lines per row */
    const int q0 = c.i * kBq, rows = min(kBq, p.seq_q - q0);
    const char *q = p.q + c.b * p.q_sb + c.h * p.q_sh + (int64_t)q0 * p.q_ss;
#pragma unroll
    for (int k = 0; k < (kBq * kLines + SK_SM80_THREADS - 1) / SK_SM80_THREADS; ++k) {
        const int idx = threadIdx.x + k * SK_SM80_THREADS, row = idx / kLines;
        if (row < rows) sk_prefetch_l2(q + (uint32_t)row * (uint32_t)p.q_ss + (idx % kLines) * 128);
    }
}

/* Whether 64-key chunk `sub` of selected block `col` holds a key that the
 * tile may see (the block's first chunk always does: the visiting rule). */
__device__ __forceinline__ bool sk_sm80_chunk_ok(const sk_sm80_params &p, int col, int sub,
                                                 int kmax) {
    const int kb = col * p.block_k + sub * SK_SM80_CHUNK_KEYS;
    return kb < p.seq_k && (!p.causal || kb <= kmax);
}

/* A tile's epilogue, in two parts, for this warp's rows. Part 1: O / l in
 * the dtype, into registers (op[mt][ii][dt]: rows g + 8 ii of m-tile mt,
 * columns 8 dt + 2 t4, + 1), and LSE = ms ln 2 + ln l. */
template <int kDtype, int kD, int kMT>
__device__ __forceinline__ void sk_sm80_epilogue_pack(const sk_sm80_params &p, int32_t tile,
                                                      const float (&o)[kMT][kD / 8][4],
                                                      const float (&ms)[kMT][2],
                                                      const float (&l)[kMT][2],
                                                      uint32_t (&op)[kMT][2][kD / 8]) {
    constexpr int kDTiles = kD / 8, kWarpRows = SK_SM80_MTILE * kMT;
    constexpr int kBq = kWarpRows * SK_SM80_WARPS;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
    float *lse = NULL;
    int rows = 0;
    if (p.lse != NULL) {
        const int32_t bh = sk_sm80_div(tile, p.rb_mul, p.rb_shift);
        const int32_t i = tile - bh * p.row_blocks;
        const int32_t b = sk_sm80_div(bh, p.hq_mul, p.hq_shift), h = bh - b * p.heads_q;
        const int q0 = i * kBq + kWarpRows * warp; /* this warp's first query row */
        rows = p.seq_q - q0;                       /* of its rows, this many exist */
        lse = p.lse + ((int64_t)b * p.heads_q + h) * p.seq_q + q0;
    }
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int ii = 0; ii < 2; ++ii) {
            float sum = l[mt][ii];
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            /* sum >= 1 when a key was visible: the fast reciprocal and log
             * (a few ulp) are far below the output rounding. */
            const float inv = sum > 0.f ? __fdividef(1.f, sum) : 0.f;
#pragma unroll
            for (int dt = 0; dt < kDTiles; ++dt)
                op[mt][ii][dt] =
                    sk_sm80_pack<kDtype>(o[mt][dt][2 * ii] * inv, o[mt][dt][2 * ii + 1] * inv);
            const int r = SK_SM80_MTILE * mt + g + 8 * ii; /* the warp's row */
            if (lse != NULL && t4 == 0 && r < rows)
                lse[r] = sum > 0.f ? ms[mt][ii] * SK_LN2 + __logf(sum) : -INFINITY;
        }
}

/* Part 2: the packed rows through `staged`, a stage that no warp reads now
 * (the tile's last one, after a barrier; refilled only after the next tile
 * start's barrier), to global memory as whole 16-byte chunks, coalesced
 * along rows. m-tile mt of warp w uses rows 16 w .. 16 w + 15 of the
 * stage's K (mt = 0) or V (mt = 1) half, the rows that warp w loads
 * (sk_sm80_load_chunk_warp), swizzled like them (no bank conflicts). */
template <int kD, int kMT>
__device__ __forceinline__ void sk_sm80_epilogue_store(const sk_sm80_params &p, int32_t tile,
                                                       const uint32_t (&op)[kMT][2][kD / 8],
                                                       unsigned char *staged) {
    constexpr int kRowBytes = kD * 2, kDTiles = kD / 8, kWarpRows = SK_SM80_MTILE * kMT;
    constexpr int kBq = kWarpRows * SK_SM80_WARPS;
    constexpr int kKRows = SK_SM80_CHUNK_KEYS / SK_SM80_WARPS; /* a warp's rows of K or V */
    static_assert(kKRows == SK_SM80_MTILE, "an m-tile of O fills a warp's rows of K or V");
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
    unsigned char *st = staged + (kKRows * warp + g) * kRowBytes + 4 * t4;
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int ii = 0; ii < 2; ++ii) {
            /* staged row 64 mt + 16 warp + g + 8 ii: its swizzle is g */
            unsigned char *row = st + (mt * SK_SM80_CHUNK_KEYS + 8 * ii) * kRowBytes;
#pragma unroll
            for (int dt = 0; dt < kDTiles; ++dt)
                *(uint32_t *)(row + ((dt & 8) << 4) + ((((uint32_t)dt & 7u) ^ (uint32_t)g) << 4)) =
                    op[mt][ii][dt];
        }
    __syncwarp();
    const int32_t bh = sk_sm80_div(tile, p.rb_mul, p.rb_shift);
    const int32_t i = tile - bh * p.row_blocks;
    const int32_t b = sk_sm80_div(bh, p.hq_mul, p.hq_shift), h = bh - b * p.heads_q;
    const int q0 = i * kBq + kWarpRows * warp; /* this warp's first query row */
    const int rows = p.seq_q - q0;             /* of its rows, this many exist (may be <= 0) */
    constexpr int kChunks = kD / 8, kRowsPerPass = 32 / kChunks;
    static_assert(kKRows % kRowsPerPass == 0, "a pass stays within one m-tile");
    const int c = lane % kChunks, r0 = lane / kChunks;
    char *out = p.o + b * p.o_sb + h * p.o_sh + (int64_t)(q0 + r0) * p.o_ss + c * 16;
    const unsigned char *src = staged + (kKRows * warp + r0) * kRowBytes;
    const uint32_t cx = (uint32_t)(c ^ r0); /* row rl + r0 has swizzle (rl & 7) ^ r0 */
    const uint32_t step = (uint32_t)kRowsPerPass * (uint32_t)p.o_ss;
    if (rows >= kWarpRows) { /* the common case: every row exists, no branches */
#pragma unroll
        for (int k = 0; k < kWarpRows / kRowsPerPass; ++k) {
            const int rl = k * kRowsPerPass; /* the warp's row rl + r0 */
            const uint4 v = *(const uint4 *)(src +
                                             ((rl / kKRows) * SK_SM80_CHUNK_KEYS + rl % kKRows) *
                                                 kRowBytes +
                                             ((cx ^ (uint32_t)(rl & 7)) << 4));
            *(uint4 *)(out + k * step) = v;
        }
    } else {
#pragma unroll
        for (int k = 0; k < kWarpRows / kRowsPerPass; ++k) {
            const int rl = k * kRowsPerPass;
            const uint4 v = *(const uint4 *)(src +
                                             ((rl / kKRows) * SK_SM80_CHUNK_KEYS + rl % kKRows) *
                                                 kRowBytes +
                                             ((cx ^ (uint32_t)(rl & 7)) << 4));
            if (rl + r0 < rows) *(uint4 *)(out + k * step) = v;
        }
    }
    __syncwarp();
}

/* The kernel body for kMT m-tiles (16 query rows each) per warp:
 * block_q = 64 * kMT. */
template <int kDtype, int kD, int kMT>
__device__ __forceinline__ void sk_sm80_body(const sk_sm80_params &p, unsigned char *smem,
                                             sk_sm80_shared *sh) {
    constexpr int kRowBytes = kD * 2;
    constexpr int kKSteps = kD / 16;                    /* k16 steps of Q K^T */
    constexpr int kDTiles = kD / 8;                     /* n8 tiles of O */
    constexpr int kNT = SK_SM80_CHUNK_KEYS / 8;         /* n8 tiles of S per chunk */
    constexpr int kPK = SK_SM80_CHUNK_KEYS / 16;        /* k16 steps of P V per chunk */
    constexpr int kWarpRows = SK_SM80_MTILE * kMT;
    constexpr int kBq = kWarpRows * SK_SM80_WARPS;      /* block_q */
    constexpr uint32_t kStageBytes = 2u * SK_SM80_CHUNK_KEYS * kRowBytes; /* K then V */
    const int bk = p.block_k, subs = bk / SK_SM80_CHUNK_KEYS;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const uint32_t smem0 = (uint32_t)__cvta_generic_to_shared(smem);
    const uint32_t q_smem = smem0 + 2u * kStageBytes;

    /* Per-lane ldmatrix rows and swizzle terms (fragment rows are multiples
     * of 8 plus lane & 7, so the swizzle is chunk ^ (lane & 7)). */
    const int lrow = lane & 7, lsel8 = (lane >> 3) & 1, lsel16 = lane >> 4;
    const uint32_t q_lane =
        q_smem + (uint32_t)((kWarpRows * warp + lrow + 8 * lsel8) * kRowBytes);
    const uint32_t q_y = (uint32_t)(lsel16 ^ lrow);
    const uint32_t k_row = (uint32_t)((lrow + 8 * lsel16) * kRowBytes), k_y = (uint32_t)(lsel8 ^ lrow);
    const uint32_t v_row = (uint32_t)((lrow + 8 * lsel8) * kRowBytes), v_y = (uint32_t)(lsel16 ^ lrow);

    int parity = 0, slot_reg = 0;
    if (tid == 0) { /* the first slot's tile_info, then one slot ahead */
        slot_reg = atomicAdd(p.tile_counter, 1);
        if (slot_reg < p.num_tiles) {
            sh->pending[0] = p.tile_info[slot_reg];
            slot_reg = atomicAdd(p.tile_counter, 1);
        } else {
            sh->pending[0] = make_int4(-1, 0, 0, -1);
        }
    }
    /* The raw column of the row entry after the block being loaded, read one
     * chunk ahead so that finding the next visited block never waits. */
    int cand;
    {
        int4 info;
        if (!sk_sm80_acquire<kD>(p, sh, parity, slot_reg, false, &info)) {
            /* no work: drain thread 0's look-ahead copy first */
            sk_cp_async_commit();
            sk_cp_async_wait<0>();
            return;
        }
        sk_sm80_cursor c;
        sk_sm80_cursor_of(p, info, &c);
        /* Prologue: Q and the first chunk of the first tile (each warp its rows). */
        sk_sm80_load_q_warp<kD, kBq>(p, c.b, c.h, c.i, q_smem);
        sk_cp_async_commit();
        sk_sm80_load_chunk_warp<kD>(p, c, sk_sm80_key0(p, c), smem0);
        sk_cp_async_commit();
        cand = c.pos + 1 < c.end ? __ldg(p.col_indices + c.pos + 1) : -1;
        if (tid == 0) sh->cur[0] = c;
    }
    uint32_t stage = 0;

    for (;;) { /* tiles */
        /* The tile's Q and first chunk have landed (all groups), and the
         * cursor written by thread 0 is visible. */
        sk_cp_async_wait<0>();
        if (p.q_sign != 0u)
            sk_sm80_negate_rows_warp<kD, kWarpRows>(smem + 2u * kStageBytes +
                                                    kWarpRows * warp * kRowBytes);
        __syncthreads();
        /* A tile of one visited block: warm L2 with the next Q right away
         * (longer rows do it when they enter their last block). */
        if (sh->cur[stage].pos + 1 >= sh->cur[stage].end)
            sk_sm80_prefetch_q<kD, kBq>(p, sh->pending[parity]);
        const int ti = sh->cur[stage].i;
        const int q0 = ti * kBq;
        const int kmax = sk_sched_kmax(ti, kBq, p.seq_q, p.seq_k);
        const int qw = q0 + kWarpRows * warp; /* first query row of this warp */
        const bool warp_rows = qw < p.seq_q;  /* this warp has a real query row */
        float o[kMT][kDTiles][4];
        float ms[kMT][2], l[kMT][2]; /* reference max (scaled by c), sum of p */
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
            for (int dt = 0; dt < kDTiles; ++dt)
#pragma unroll
                for (int r = 0; r < 4; ++r) o[mt][dt][r] = 0.f;
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                ms[mt][i] = -INFINITY;
                l[mt][i] = 0.f;
            }
        }

        for (bool first = true;; first = false) { /* chunks of the tile */
            /* This chunk's K and V have landed, and every warp is done with
             * the other stage (at the tile's first chunk: done above). */
            if (!first) {
                sk_cp_async_wait<1>();
                __syncthreads();
            }
            /* The next chunk: the next one of this block, else the first of
             * the next visited block, else the first of the next tile. */
            int kb; /* first key of this chunk */
            bool same_tile = true;
            {
                const sk_sm80_cursor c = sh->cur[stage];
                kb = sk_sm80_key0(p, c);
                sk_sm80_cursor n = c;
                if (c.sub + 1 < subs && sk_sm80_chunk_ok(p, c.col, c.sub + 1, kmax)) {
                    n.sub = c.sub + 1;
                } else {
                    int np = c.pos + 1, nc = cand;
                    while (np < c.end && !sk_sched_visit(nc, p.col_blocks, p.causal, bk, kmax)) {
                        ++np;
                        nc = np < c.end ? __ldg(p.col_indices + np) : -1;
                    }
                    if (np < c.end) {
                        n.pos = np;
                        n.col = nc;
                        n.sub = 0;
                        cand = np + 1 < c.end ? __ldg(p.col_indices + np + 1) : -1;
                        /* The row's last entry: warm L2 with the next Q. */
                        if (np + 1 >= c.end) sk_sm80_prefetch_q<kD, kBq>(p, sh->pending[parity]);
                    } else {
                        same_tile = false;
                        int4 info;
                        if (sk_sm80_acquire<kD>(p, sh, parity, slot_reg, true, &info)) {
                            sk_sm80_cursor_of(p, info, &n);
                            cand = n.pos + 1 < n.end ? __ldg(p.col_indices + n.pos + 1) : -1;
                        } else {
                            n.b = -1; /* no chunk left */
                        }
                    }
                }
                const int nkey0 = sk_sm80_key0(p, n);
                if (n.b >= 0)
                    sk_sm80_load_chunk_warp<kD>(p, n, nkey0,
                                                smem0 + (stage ^ 1u) * kStageBytes);
                sk_cp_async_commit(); /* [K, V of the next chunk], possibly empty */
                if (tid == 0) sh->cur[stage ^ 1u] = n;
                if (!same_tile && lane == 0) sh->wnext[warp] = make_int4(n.b, n.h, n.i, nkey0);
            }

            const uint32_t ks = smem0 + stage * kStageBytes, vs = ks + SK_SM80_CHUNK_KEYS * kRowBytes;
            const bool active =
                warp_rows && !(p.causal && kb > qw + kWarpRows - 1 + p.diag);
            uint32_t pa[kMT][kPK][4];
            if (active) {
                /* S = Q K^T */
                float s[kMT][kNT][4];
#pragma unroll
                for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
                    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
                        for (int r = 0; r < 4; ++r) s[mt][nt][r] = 0.f;
                const uint32_t k_lane = ks + k_row;
#pragma unroll
                for (int kk = 0; kk < kKSteps; ++kk) {
                    uint32_t qa[kMT][4];
#pragma unroll
                    for (int mt = 0; mt < kMT; ++mt)
                        sk_ldmatrix_x4(qa[mt], q_lane + (uint32_t)(SK_SM80_MTILE * mt * kRowBytes) +
                                                   (((uint32_t)(2 * kk) ^ q_y) << 4));
#pragma unroll
                    for (int np2 = 0; np2 < kNT / 2; ++np2) {
                        uint32_t b[4];
                        sk_ldmatrix_x4(b, k_lane + (uint32_t)(np2 * 16 * kRowBytes) +
                                              (((uint32_t)(2 * kk) ^ k_y) << 4));
#pragma unroll
                        for (int mt = 0; mt < kMT; ++mt) {
                            sk_sm80_mma<kDtype>(s[mt][2 * np2], qa[mt], b[0], b[1]);
                            sk_sm80_mma<kDtype>(s[mt][2 * np2 + 1], qa[mt], b[2], b[3]);
                        }
                    }
                }
                /* Tails and the causal diagonal only. */
                if (kb + SK_SM80_CHUNK_KEYS > p.seq_k ||
                    (p.causal && kb + SK_SM80_CHUNK_KEYS - 1 > qw + p.diag)) {
#pragma unroll
                    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
                        for (int i = 0; i < 2; ++i) {
                            /* the last key row qw + 16 mt + g + 8 i may see */
                            const int q = qw + SK_SM80_MTILE * mt + g + 8 * i;
                            const int lim = p.causal ? min(p.seq_k - 1, q + p.diag) : p.seq_k - 1;
#pragma unroll
                            for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
                                for (int e = 0; e < 2; ++e)
                                    if (kb + nt * 8 + 2 * t4 + e > lim)
                                        s[mt][nt][2 * i + e] = -INFINITY;
                        }
                }
                /* Online softmax in base 2, two rows per m-tile and thread.
                 * ms is the row's reference maximum, scaled by c: it moves
                 * (and O and l are rescaled) only when a score exceeds it by
                 * more than SK_SM80_RESCALE_LOG2. Otherwise p = 2^(s c - ms)
                 * <= 2^8: fine in fp32, and P rounds to f16/bf16 with the same
                 * relative error. The common case costs one max per thread
                 * and a warp vote; the rare update redoes the row maxima over
                 * the quad, one row at a time (few live registers). In the
                 * tile's first chunk O and l are still zero: no rescale. */
                bool need = false;
#pragma unroll
                for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
                    for (int i = 0; i < 2; ++i) {
                        float x = fmaxf(s[mt][0][2 * i], s[mt][0][2 * i + 1]);
#pragma unroll
                        for (int nt = 1; nt < kNT; ++nt)
                            x = fmaxf(x, fmaxf(s[mt][nt][2 * i], s[mt][nt][2 * i + 1]));
                        need |= x * p.scale_log2 > ms[mt][i] + SK_SM80_RESCALE_LOG2;
                    }
                if (__any_sync(0xffffffffu, need)) {
#pragma unroll
                    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
                        for (int i = 0; i < 2; ++i) {
                            float x = fmaxf(s[mt][0][2 * i], s[mt][0][2 * i + 1]);
#pragma unroll
                            for (int nt = 1; nt < kNT; ++nt)
                                x = fmaxf(x, fmaxf(s[mt][nt][2 * i], s[mt][nt][2 * i + 1]));
                            x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
                            x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
                            const float xs = x * p.scale_log2; /* -inf: nothing visible */
                            if (xs > ms[mt][i] + SK_SM80_RESCALE_LOG2) { /* same in the quad */
                                if (!first) {
                                    const float alpha = sk_ex2(ms[mt][i] - xs); /* 0 if ms = -inf */
                                    l[mt][i] *= alpha;
#pragma unroll
                                    for (int dt = 0; dt < kDTiles; ++dt) {
                                        o[mt][dt][2 * i] *= alpha;
                                        o[mt][dt][2 * i + 1] *= alpha;
                                    }
                                }
                                ms[mt][i] = xs;
                            }
                        }
                }
#pragma unroll
                for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
                    for (int i = 0; i < 2; ++i) {
                        /* A row with no visible key yet keeps ms = -inf: use 0,
                         * so that 2^(-inf - 0) = 0 rather than NaN. */
                        const float off = ms[mt][i] == -INFINITY ? 0.f : ms[mt][i];
                        float sum = 0.f;
#pragma unroll
                        for (int nt = 0; nt < kNT; ++nt) {
                            s[mt][nt][2 * i] = sk_ex2(fmaf(s[mt][nt][2 * i], p.scale_log2, -off));
                            s[mt][nt][2 * i + 1] =
                                sk_ex2(fmaf(s[mt][nt][2 * i + 1], p.scale_log2, -off));
                            sum += s[mt][nt][2 * i] + s[mt][nt][2 * i + 1];
                        }
                        l[mt][i] += sum;
                    }
                /* P as the A operand of P V: the accumulators of two n8 tiles
                 * are the A fragment of one k16 step. */
#pragma unroll
                for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
                    for (int kk = 0; kk < kPK; ++kk) {
                        pa[mt][kk][0] = sk_sm80_pack<kDtype>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
                        pa[mt][kk][1] = sk_sm80_pack<kDtype>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
                        pa[mt][kk][2] =
                            sk_sm80_pack<kDtype>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
                        pa[mt][kk][3] =
                            sk_sm80_pack<kDtype>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
                    }
            }

            /* The tile's last chunk: this warp is done reading its Q rows,
             * which no other warp reads; it loads the next tile's. */
            if (!same_tile) {
                __syncwarp();
                const int4 w = sh->wnext[warp];
                if (w.x >= 0) sk_sm80_load_q_warp<kD, kBq>(p, w.x, w.y, w.z, q_smem);
            }
            sk_cp_async_commit(); /* [Q of the next tile], usually empty */

            if (active) { /* O += P V */
                const uint32_t v_lane = vs + v_row;
#pragma unroll
                for (int kk = 0; kk < kPK; ++kk)
#pragma unroll
                    for (int dp = 0; dp < kDTiles / 2; ++dp) {
                        uint32_t b[4];
                        sk_ldmatrix_x4_trans(b, v_lane + (uint32_t)(kk * 16 * kRowBytes) +
                                                    (((uint32_t)(2 * dp) ^ v_y) << 4));
#pragma unroll
                        for (int mt = 0; mt < kMT; ++mt) {
                            sk_sm80_mma<kDtype>(o[mt][2 * dp], pa[mt][kk], b[0], b[1]);
                            sk_sm80_mma<kDtype>(o[mt][2 * dp + 1], pa[mt][kk], b[2], b[3]);
                        }
                    }
            }
            if (!same_tile) break;
            stage ^= 1u;
        }

        /* The tile is done: its last chunk used `stage`; whether a next tile
         * follows is in wnext (written at that chunk's top, read after the
         * __syncwarp before the Q load). The epilogue's arithmetic (and
         * LSE) needs no barrier; its stores go through this stage once every
         * warp is done with its V. */
        {
            const int32_t tile = sh->cur[stage].tile;
            const bool more = sh->wnext[warp].x >= 0;
            uint32_t op[kMT][2][kDTiles];
            sk_sm80_epilogue_pack<kDtype, kD, kMT>(p, tile, o, ms, l, op);
            __syncthreads();
            sk_sm80_epilogue_store<kD, kMT>(p, tile, op, smem + stage * kStageBytes);
            if (!more) break;
        }
        stage ^= 1u;
    }
    sk_cp_async_wait<0>(); /* nothing is left in flight (only empty groups) */
}

template <int kDtype, int kD>
__global__ void __launch_bounds__(SK_SM80_THREADS, SK_SM80_CTAS_PER_SM)
    sk_attention_sm80_kernel(const __grid_constant__ sk_sm80_params p) {
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ sk_sm80_shared sh;
    if (p.block_q == 2 * SK_SM80_MTILE * SK_SM80_WARPS)
        sk_sm80_body<kDtype, kD, 2>(p, smem, &sh);
    else
        sk_sm80_body<kDtype, kD, 1>(p, smem, &sh);
}

/* ---------------------------------------------------------------------------
 * Host side
 * ------------------------------------------------------------------------- */

/* Two stages of one 64-key chunk of K and V, then the Q tile. */
static size_t sk_sm80_smem_bytes(int64_t d, int32_t bq) {
    return (size_t)(2 * 2 * SK_SM80_CHUNK_KEYS + bq) * (size_t)d * 2u;
}

static_assert((2 * 2 * SK_SM80_CHUNK_KEYS + SK_SM80_MAX_BLOCK) * 128 * 2 + 2 * 16 <=
                  SK_SM80_SMEM_LIMIT / SK_SM80_CTAS_PER_SM,
              "two CTAs of the largest shape (two K/V chunk stages and the Q tile) must fit "
              "one SM's shared memory");

sk_status sk_attention_sm80_check(const sk_attention_problem *p) {
    if (p->dtype != SK_DTYPE_F16 && p->dtype != SK_DTYPE_BF16)
        return sk_error(SK_STATUS_NOT_SUPPORTED,
                        "dtype = %d: the CUDA kernels take F16 or BF16 only", (int)p->dtype);
    if (p->head_dim != 64 && p->head_dim != 128)
        return sk_error(SK_STATUS_NOT_SUPPORTED,
                        "head_dim = %lld is not supported by the CUDA backend (64 or 128)",
                        (long long)p->head_dim);
    if ((p->block_q != 64 && p->block_q != 128) || (p->block_k != 64 && p->block_k != 128))
        return sk_error(SK_STATUS_NOT_SUPPORTED,
                        "layout blocks %d x %d: the CUDA kernels take 64 or 128", (int)p->block_q,
                        (int)p->block_k);
    if (p->seq_q > SK_SM80_MAX_SEQ || p->seq_k > SK_SM80_MAX_SEQ)
        return sk_error(SK_STATUS_NOT_SUPPORTED,
                        "seq_q = %lld, seq_k = %lld: the CUDA kernels take at most %d tokens",
                        (long long)p->seq_q, (long long)p->seq_k, (int)SK_SM80_MAX_SEQ);
    /* A sequence of one token never steps its stride (the core does not
     * check it then either). */
    const int64_t ss[4] = {p->seq_q > 1 ? p->q_stride[1] : 0, p->seq_k > 1 ? p->k_stride[1] : 0,
                           p->seq_k > 1 ? p->v_stride[1] : 0, p->seq_q > 1 ? p->o_stride[1] : 0};
    static const char *const names[4] = {"q_strides[1]", "k_strides[1]", "v_strides[1]",
                                         "o_strides[1]"};
    for (int i = 0; i < 4; ++i)
        if (ss[i] * 2 >= SK_SM80_MAX_SEQ_STRIDE_BYTES)
            return sk_error(SK_STATUS_NOT_SUPPORTED,
                            "%s = %lld elements: the CUDA kernels need sequence strides below "
                            "%d bytes",
                            names[i], (long long)ss[i], (int)SK_SM80_MAX_SEQ_STRIDE_BYTES);
    if (p->batch * p->heads_q * (int64_t)p->row_blocks > INT32_MAX)
        return sk_error(SK_STATUS_NOT_SUPPORTED,
                        "batch * heads_q * row_blocks = %lld tiles: the CUDA kernels take at most "
                        "2^31 - 1",
                        (long long)(p->batch * p->heads_q * (int64_t)p->row_blocks));
    return SK_STATUS_SUCCESS;
}

/* (mul, shift) such that n / d = (umulhi(n, mul) + n) >> shift for every
 * 0 <= n < 2^31 (round-up multiplier, as in Granlund and Montgomery). */
static void sk_sm80_magic(uint32_t d, uint32_t *mul, uint32_t *shift) {
    uint32_t l = 0;
    while (((uint64_t)1 << l) < d) ++l;
    *mul = (uint32_t)(((uint64_t)1 << 32) * (((uint64_t)1 << l) - d) / d + 1);
    *shift = l;
}

template <int kDtype, int kD>
static sk_status sk_sm80_launch_typed(const sk_sm80_params &params, int threads, size_t smem,
                                      int num_tiles, cudaStream_t stream) {
    void (*kernel)(sk_sm80_params) = sk_attention_sm80_kernel<kDtype, kD>;
    SK_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)smem),
                "cudaFuncSetAttribute");
    int device = 0, sms = 0, per_sm = 0;
    SK_CUDA_TRY(cudaGetDevice(&device), "cudaGetDevice");
    SK_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
                "cudaDeviceGetAttribute");
    SK_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem),
                "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    if (per_sm < 1) per_sm = 1;
    const int64_t resident = (int64_t)sms * per_sm;
    const int grid = (int)(resident < num_tiles ? resident : num_tiles);
    kernel<<<grid, threads, smem, stream>>>(params);
    SK_CUDA_TRY(cudaGetLastError(), "sm80 attention kernel launch");
    return SK_STATUS_SUCCESS;
}

sk_status sk_attention_sm80_launch(const sk_attention_problem *p, const sk_attention_schedule *s,
                                   cudaStream_t stream) {
    SK_TRY(sk_attention_sm80_check(p));
    const int64_t es = 2; /* F16 and BF16 */
    sk_sm80_params k;
    k.q = (const char *)p->q;
    k.k = (const char *)p->k;
    k.v = (const char *)p->v;
    k.o = (char *)p->o;
    k.lse = p->lse;
    /* Axes of one element are never stepped; their strides may be anything. */
    const int nb = p->batch > 1, nhq = p->heads_q > 1, nhk = p->heads_kv > 1;
    k.q_sb = nb ? p->q_stride[0] * es : 0;
    k.q_sh = nhq ? p->q_stride[2] * es : 0;
    k.k_sb = nb ? p->k_stride[0] * es : 0;
    k.k_sh = nhk ? p->k_stride[2] * es : 0;
    k.v_sb = nb ? p->v_stride[0] * es : 0;
    k.v_sh = nhk ? p->v_stride[2] * es : 0;
    k.o_sb = nb ? p->o_stride[0] * es : 0;
    k.o_sh = nhq ? p->o_stride[2] * es : 0;
    k.q_ss = p->seq_q > 1 ? (int32_t)(p->q_stride[1] * es) : 0;
    k.k_ss = p->seq_k > 1 ? (int32_t)(p->k_stride[1] * es) : 0;
    k.v_ss = p->seq_k > 1 ? (int32_t)(p->v_stride[1] * es) : 0;
    k.o_ss = p->seq_q > 1 ? (int32_t)(p->o_stride[1] * es) : 0;
    k.seq_q = (int32_t)p->seq_q;
    k.seq_k = (int32_t)p->seq_k;
    k.diag = (int32_t)(p->seq_k - p->seq_q);
    k.heads_q = (int32_t)p->heads_q;
    k.group = p->group;
    sk_sm80_magic((uint32_t)p->row_blocks, &k.rb_mul, &k.rb_shift);
    sk_sm80_magic((uint32_t)p->heads_q, &k.hq_mul, &k.hq_shift);
    sk_sm80_magic((uint32_t)p->group, &k.gq_mul, &k.gq_shift);
    k.block_q = p->block_q;
    k.block_k = p->block_k;
    k.row_blocks = p->row_blocks;
    k.col_blocks = p->col_blocks;
    k.layout_batch = p->layout_batch;
    k.layout_heads = p->layout_heads;
    k.head_div = p->head_div;
    k.nnz = p->nnz;
    k.num_tiles = s->num_tiles;
    k.causal = p->causal;
    k.row_offsets = p->row_offsets;
    k.col_indices = p->col_indices;
    k.tile_info = s->tile_info;
    k.tile_counter = s->tile_counter;
    k.scale_abs = fabsf(p->scale);
    k.scale_log2 = fabsf(p->scale) * SK_LOG2E;
    k.q_sign = p->scale < 0.f ? 0x80008000u : 0u;

    const int threads = SK_SM80_THREADS;
    const size_t smem = sk_sm80_smem_bytes(p->head_dim, p->block_q);
    const int tiles = s->num_tiles;
    if (p->dtype == SK_DTYPE_F16)
        return p->head_dim == 64
                   ? sk_sm80_launch_typed<SK_DTYPE_F16, 64>(k, threads, smem, tiles, stream)
                   : sk_sm80_launch_typed<SK_DTYPE_F16, 128>(k, threads, smem, tiles, stream);
    return p->head_dim == 64
               ? sk_sm80_launch_typed<SK_DTYPE_BF16, 64>(k, threads, smem, tiles, stream)
               : sk_sm80_launch_typed<SK_DTYPE_BF16, 128>(k, threads, smem, tiles, stream);
}
