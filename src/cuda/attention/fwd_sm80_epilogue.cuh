/*
 * fwd_sm80_epilogue.cuh - the portable attention kernel's epilogue (part of
 * fwd_sm80.cu, included there only): O / l and the LSE of a warp's rows,
 * packed to the dtype in registers, then staged through a free pipeline
 * stage and stored as coalesced 16-byte chunks.
 */
#ifndef SK_CUDA_ATTENTION_FWD_SM80_EPILOGUE_CUH
#define SK_CUDA_ATTENTION_FWD_SM80_EPILOGUE_CUH

/* A tile's epilogue, in two parts, for this warp's rows. Part 1: O / l in
 * the dtype, into registers (op[mt][ii][dt]: rows g + 8 ii of m-tile mt,
 * columns 8 dt + 2 t4, + 1), and LSE = ms ln 2 + ln l. */
template <int kDtype, int kD, int kMT, int kMode>
__device__ __forceinline__ void
sk_sm80_epilogue_pack(const sk_sm80_params &p, int32_t tile, int4 at,
                      const float (&o)[kMT][kD / 8][4], const float (&ms)[kMT][2],
                      const float (&l)[kMT][2], uint32_t (&op)[kMT][2][kD / 8]) {
    constexpr int kDTiles = kD / 8, kWarpRows = SK_SM80_MTILE * kMT;
    constexpr int kBq = kWarpRows * SK_SM80_WARPS;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
    float *lse = NULL;
    int rows = 0;
    if (kMode != SK_SM80_FIXED && p.lse != NULL) { /* at = {q token, h, i, len_q} */
        const int q0 = at.z * kBq + kWarpRows * warp;
        rows = at.w - q0;
        lse = p.lse + (int64_t)at.y * p.lse_hs + at.x + q0;
    } else if (p.lse != NULL) {
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
template <int kD, int kMT, int kMode>
__device__ __forceinline__ void
sk_sm80_epilogue_store(const sk_sm80_params &p, int32_t tile, int4 at,
                       const uint32_t (&op)[kMT][2][kD / 8], unsigned char *staged) {
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
    int32_t b, h, i, seq_q;
    if constexpr (kMode != SK_SM80_FIXED) { /* at = {first query token, h, i, len_q} */
        b = at.x;
        h = at.y;
        i = at.z;
        seq_q = at.w;
    } else {
        const int32_t bh = sk_sm80_div(tile, p.rb_mul, p.rb_shift);
        i = tile - bh * p.row_blocks;
        b = sk_sm80_div(bh, p.hq_mul, p.hq_shift);
        h = bh - b * p.heads_q;
        seq_q = p.seq_q;
    }
    const int q0 = i * kBq + kWarpRows * warp; /* this warp's first query row */
    const int rows = seq_q - q0;               /* of its rows, this many exist (may be <= 0) */
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
            const uint4 v =
                *(const uint4 *)(src +
                                 ((rl / kKRows) * SK_SM80_CHUNK_KEYS + rl % kKRows) * kRowBytes +
                                 ((cx ^ (uint32_t)(rl & 7)) << 4));
            *(uint4 *)(out + k * step) = v;
        }
    } else {
#pragma unroll
        for (int k = 0; k < kWarpRows / kRowsPerPass; ++k) {
            const int rl = k * kRowsPerPass;
            const uint4 v =
                *(const uint4 *)(src +
                                 ((rl / kKRows) * SK_SM80_CHUNK_KEYS + rl % kKRows) * kRowBytes +
                                 ((cx ^ (uint32_t)(rl & 7)) << 4));
            if (rl + r0 < rows) *(uint4 *)(out + k * step) = v;
        }
    }
    __syncwarp();
}

#endif /* SK_CUDA_ATTENTION_FWD_SM80_EPILOGUE_CUH */
