/*
 * fwd_sm90_consumer.cuh - the fp16 / bf16 Hopper attention kernel's
 * consumer warpgroups (included by fwd_sm90_body.cuh, and by fwd_sm90_fp8.cu
 * for its helpers): the wgmma GEMMs S = Q K^T and O += P V, masking, the
 * base-2 online softmax, the turn taking between the two warpgroups, and
 * the epilogue. MODE: the varlen / paged mode adds per-sequence masks, the
 * zeroing of masked V rows, and per-row stores of tail tiles; the fixed
 * mode's code is unchanged.
 */
#ifndef SK_CUDA_ATTENTION_FWD_SM90_CONSUMER_CUH
#define SK_CUDA_ATTENTION_FWD_SM90_CONSUMER_CUH

#include <cuda_fp16.h> /* sk90_unpack: fp16 to fp32 */

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

/* The inverse of sk90_pack: two elements (low half first) to fp32. */
template <sk_dtype DT>
__device__ __forceinline__ void sk90_unpack(uint32_t w, float &lo, float &hi) {
    if constexpr (DT == SK_DTYPE_BF16) {
        lo = __uint_as_float(w << 16);
        hi = __uint_as_float(w & 0xffff0000u);
    } else {
        lo = __half2float(__ushort_as_half((unsigned short)(w & 0xffffu)));
        hi = __half2float(__ushort_as_half((unsigned short)(w >> 16)));
    }
}

/* S (64 x BN, fp32) = Q (64 x D) K^T: D/16 wgmma, one commit group. The
 * descriptors are made once; a K step adds its byte offset >> 4 to the start
 * address field (no carry: shared addresses stay below 2^18). BN = 64: K's
 * slabs hold 64 rows, so its slab step differs from Q's. */
template <sk_dtype DT, int HD, int BN = kBlockN>
__device__ __forceinline__ void sk90_gemm_qk(float s[BN / 2], uint32_t q_base, uint32_t k_base) {
    using L = sk90_smem<HD, 2, 2, BN>;
    const uint64_t da0 = sk_wgmma_desc_sw128(q_base, 16, kSwizzleAtom);
    const uint64_t db0 = sk_wgmma_desc_sw128(k_base, 16, kSwizzleAtom);
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
        /* K step of 16 columns: +32 B inside the swizzle atom, a new slab every 4. */
        const uint32_t off = ((kk / 4) * L::kSlab128 + (kk % 4) * 32) >> 4;
        const uint64_t da = da0 + off;
        if constexpr (BN == 64) {
            const uint64_t db = db0 + (((kk / 4) * L::kKVSlab + (kk % 4) * 32) >> 4);
            if constexpr (DT == SK_DTYPE_BF16) {
                if (kk == 0)
                    sk_wgmma_m64n64k16_ss_bf16_zero(s, da, db);
                else
                    sk_wgmma_m64n64k16_ss_bf16(s, da, db, 1);
            } else {
                if (kk == 0)
                    sk_wgmma_m64n64k16_ss_f16_zero(s, da, db);
                else
                    sk_wgmma_m64n64k16_ss_f16(s, da, db, 1);
            }
            continue;
        }
        const uint64_t db = db0 + off;
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

/* O (64 x D) += P (64 x BN, registers) V (BN x D, N-major): BN/16 wgmma. */
template <sk_dtype DT, int HD, int BN = kBlockN>
__device__ __forceinline__ void sk90_gemm_pv(float o[HD / 2], const uint32_t pf[BN / 4],
                                             uint32_t v_base) {
    using L = sk90_smem<HD, 2, 2, BN>;
    /* The 64-column slabs of V are kKVSlab apart (the leading byte offset). */
    const uint64_t db0 = sk_wgmma_desc_sw128(v_base, L::kKVSlab, kSwizzleAtom);
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
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
 * of the thread's two rows. NS: scores per thread (a block of 2 NS keys). */
template <int NS = 64>
__device__ __forceinline__ void sk90_mask(float s[NS], int lim0, int lim1, int t4) {
#pragma unroll
    for (int i = 0; i < NS; ++i) {
        const int col = 8 * (i >> 2) + 2 * t4 + (i & 1);
        const int lim = ((i >> 1) & 1) ? lim1 : lim0;
        if (col > lim) s[i] = -INFINITY;
    }
}

/* Prepare the scores of block c for the softmax: negated when the scale is
 * negative (the max trick needs a positive scale: s * scale = (-s) * |scale|),
 * then the masks block c needs for this warpgroup: the key tail (keys past
 * Sk) and, when causal, the diagonal. Blocks needing none are untouched.
 * (sk90_mask_block_seq is the same with a sequence's lengths; one shared
 * helper changed this kernel's SASS, so the fixed one stays as it was.) */
template <int BN = kBlockN>
__device__ __forceinline__ void sk90_mask_block(float s[BN / 2], const sk90_params &p, int c,
                                                int wg_first_row, int row0, int t4) {
    if (p.negate) {
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) s[i] = -s[i];
    }
    const int kbase = c * BN, diag = p.seq_k - p.seq_q;
    const bool tail = kbase + BN > p.seq_k;
    const bool cross = p.causal && kbase + BN - 1 > wg_first_row + diag;
    if (!tail && !cross) return;
    int lim0 = p.seq_k - 1 - kbase, lim1 = lim0;
    if (p.causal) {
        lim0 = min(lim0, row0 + diag - kbase);
        lim1 = min(lim1, row0 + 8 + diag - kbase);
    }
    sk90_mask<BN / 2>(s, lim0, lim1, t4);
}

/* Online softmax of one block, in place: new row maxima, p = 2^(s *
 * scale_log2 - m'), per-thread row sums, and corr[r] = 2^(m_old' - m_new'),
 * the factor for O and the row sum. (Measured and dropped: FA4's lazy
 * rescaling and tree reductions of the max, docs/perf/hopper.md.) */
/* kOffset: the FP8 kernel's p = 2^(... + kOffset), see fwd_sm90_fp8.cu; NS:
 * scores per thread (64 for blocks of 128 keys, 32 for 64). */
template <int kOffset = 0, int NS = 64>
__device__ __forceinline__ void sk90_softmax(float s[NS], float m[2], float l[2], float corr[2],
                                             float scale_log2) {
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int i = 0; i < NS; ++i) mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], s[i]);
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
    for (int i = 0; i < NS; ++i) {
        const int r = (i >> 1) & 1;
        if constexpr (kOffset == 0)
            s[i] = sk_ex2(fmaf(s[i], scale_log2, -ms[r]));
        else
            s[i] = sk_ex2(fmaf(s[i], scale_log2, (float)kOffset - ms[r]));
        sum[r] += s[i];
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) l[r] = l[r] * corr[r] + sum[r];
}

template <sk_dtype DT, int NS = 64>
__device__ __forceinline__ void sk90_pack_p(uint32_t pf[NS / 2], const float s[NS]) {
    /* The register-A fragment of keys 16kk..16kk+15 is accumulator registers
     * 8kk..8kk+7, pairwise. */
#pragma unroll
    for (int j = 0; j < NS / 2; ++j) pf[j] = sk90_pack<DT>(s[2 * j], s[2 * j + 1]);
}

/* Compiler barriers on the P*V operands: before the wgmma fence, so that the
 * O rescale and the P packing are complete when the wgmma reads them; after
 * its wait, so that nothing reuses P's registers or reads O while the wgmma
 * is in flight. */
template <int HD, int NP = 32>
__device__ __forceinline__ void sk90_fence_operands(float o[HD / 2], uint32_t pf[NP]) {
#pragma unroll
    for (int i = 0; i < HD / 2; ++i) sk_reg_fence(o[i]);
#pragma unroll
    for (int i = 0; i < NP; ++i) sk_reg_fence_u32(pf[i]);
}

/* K stage release: lane 0 of every consumer warp arrives, after the warp
 * has converged (one thread per warpgroup after a named barrier is correct
 * too, but compute-sanitizer racecheck does not follow that chain). */
/* kKEmptyArrivals (fwd_sm90_common.cuh): 2 consumer warpgroups x 4 warps. */

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

/* Varlen / paged: sk90_mask_block with the tile's sequence lengths
 * (bottom-right causal per sequence), then the boxes of the block that were
 * not loaded (paged; a bit per page_size keys). */
__device__ __forceinline__ void sk90_mask_block_seq(float s[64], const sk90_params &p,
                                                    const sk90_vparams &v,
                                                    const sk90_seq &t, int c, uint32_t absent,
                                                    int wg_first_row, int row0, int t4) {
    if (p.negate) {
#pragma unroll
        for (int i = 0; i < 64; ++i) s[i] = -s[i];
    }
    const int kbase = c * kBlockN, diag = t.len_k - t.len_q;
    const bool tail = kbase + kBlockN > t.len_k;
    const bool cross = p.causal && kbase + kBlockN - 1 > wg_first_row + diag;
    if (tail || cross) {
        int lim0 = t.len_k - 1 - kbase, lim1 = lim0;
        if (p.causal) {
            lim0 = min(lim0, row0 + diag - kbase);
            lim1 = min(lim1, row0 + 8 + diag - kbase);
        }
        sk90_mask(s, lim0, lim1, t4);
    }
    if (absent != 0) {
#pragma unroll
        for (int i = 0; i < 64; ++i) {
            const int col = 8 * (i >> 2) + 2 * t4 + (i & 1);
            if ((absent >> (col >> v.page_shift)) & 1u) s[i] = -INFINITY;
        }
    }
}

/* The masks of block c, by mode (blocks of BN = 64 keys: fixed mode only). */
template <int MODE, int BN = kBlockN>
__device__ __forceinline__ void sk90_mask_tile(float s[BN / 2], const sk90_params &p,
                                               const sk90_vparams &v,
                                               const sk90_seq &sq, int c, uint32_t absent,
                                               int wg_first_row, int row0, int t4) {
    if constexpr (MODE == kSk90Fixed)
        sk90_mask_block<BN>(s, p, c, wg_first_row, row0, t4);
    else
        sk90_mask_block_seq(s, p, v, sq, c, MODE == kSk90Paged ? absent : 0u, wg_first_row, row0, t4);
}

/* Varlen / paged: before a P V GEMM reads V block c, zero its rows of keys
 * that must not reach the product: keys at or past len_k (the packed
 * tensors continue with the next sequence's tokens, a page's slots past
 * len_k hold anything: P = 0 times NaN is NaN) and the boxes not loaded
 * (stale data). Both consumer warpgroups share the rows, then meet at a
 * named barrier; the condition is the same for both (same tile, same
 * block), so both take it or neither does. Fixed mode: nothing. */
template <int HD, int MODE>
__device__ __forceinline__ void sk90_zero_v(const sk90_vparams &p, const sk90_seq &t,
                                            uint32_t v_stage, int c, uint32_t absent) {
    if constexpr (MODE != kSk90Fixed) {
        using L = sk90_smem<HD>;
        constexpr int kChunks = HD / 8; /* 16-byte chunks per row */
        const int valid = t.len_k - c * kBlockN;
        if (MODE == kSk90Varlen) absent = 0;
        if (valid >= kBlockN && absent == 0) return;
        for (int k = (int)threadIdx.x - 128; k < kBlockN * kChunks; k += 256) {
            const int r = k / kChunks, ch = k % kChunks;
            const bool zero = r >= valid || ((absent >> (r >> p.page_shift)) & 1u);
            if (zero)
                *sk90_shared_ptr<uint4>(v_stage + (ch / 8) * L::kSlab128 + sk_sw128_offset(r, ch % 8)) =
                    make_uint4(0u, 0u, 0u, 0u);
        }
        sk_fence_proxy_async_smem(); /* generic writes before wgmma's reads */
        sk_bar_sync(kBarZeroV, 256);
    } else {
        (void)p;
        (void)t;
        (void)v_stage;
        (void)c;
        (void)absent;
    }
}

/* Varlen / paged epilogue of a warpgroup whose 64 rows pass the sequence's
 * end: rows below len_q copied from the swizzled O tile to the packed O, 16
 * bytes per thread and step (the next sequence's rows are never written; a
 * TMA store cannot stop at a sequence end). */
template <int HD>
__device__ __forceinline__ void sk90_store_rows(const sk90_vparams &p, const sk90_tile &t,
                                                const sk90_seq &sq, uint32_t o_base, int wg_first_row, int rows,
                                                int wtid) {
    using L = sk90_smem<HD>;
    constexpr int kChunks = HD / 8;
    char *o = (char *)p.o;
    for (int k = wtid; k < rows * kChunks; k += 128) {
        const int r = k / kChunks, ch = k % kChunks;
        const uint4 val = *sk90_shared_ptr<uint4>(o_base + (ch / 8) * L::kOSlabBytes +
                                                  r * kSlabRowBytes + (((ch % 8) ^ (r % 8)) << 4));
        const int64_t elem = (int64_t)(sq.q0 + wg_first_row + r) * p.o_token_stride +
                             (int64_t)t.h * p.o_head_stride + ch * 8;
        *(uint4 *)(o + 2 * elem) = val;
    }
}

/* Carry-in (context parallel's remote pass, sk90_vparams): the tile
 * continues a partial result over other keys, O (in the output, rounded to
 * the dtype) and its LSE. At the start only the row state: m = LSE /
 * |scale| (so that m |scale| + log l gives LSE back) and l = 1 on the
 * quad's first thread (the epilogue sums the quad); the online softmax
 * then rescales l like any earlier block's. The carried O joins at the
 * end, scaled by the same total factor 2^((m_start - m_end) scale log2 e)
 * (sk90_carry_end): loading it at the start would keep 64 more registers
 * live through the first S and spill. A row with LSE -inf (no key before)
 * starts and ends as a plain tile's. */
__device__ __forceinline__ float sk90_carry_lse(const sk90_params &p, const sk90_vparams &v,
                                                const sk90_tile &t, int row) {
    return row < p.seq_q ? v.lse_carry[((int64_t)t.b * p.heads_q + t.h) * p.seq_q + row]
                         : -INFINITY;
}

__device__ __forceinline__ void sk90_carry_start(float m[2], float l[2], const sk90_params &p,
                                                 const sk90_vparams &v, const sk90_tile &t,
                                                 int row0, int t4) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const float lse = sk90_carry_lse(p, v, t, row0 + 8 * r);
        if (lse == -INFINITY) continue;
        m[r] = lse / p.scale;
        l[r] = t4 == 0 ? 1.0f : 0.0f;
    }
}

/* o[4 nb + 2 r + e] is row r's column 8 nb + 2 t4 + e. */
template <sk_dtype DT, int HD>
__device__ __forceinline__ void sk90_carry_end(float o[HD / 2], const float m[2],
                                               const sk90_params &p, const sk90_vparams &v,
                                               const sk90_tile &t, int row0, int t4) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = row0 + 8 * r;
        const float lse = sk90_carry_lse(p, v, t, row);
        if (lse == -INFINITY) continue;
        const float f = sk_ex2((lse / p.scale) * p.scale_log2 - m[r] * p.scale_log2);
        /* Two elements per 4-byte load (even columns, 16-byte rows). */
        const uint32_t *src = (const uint32_t *)((const uint16_t *)v.o + t.b * v.o_batch_stride +
                                                 row * v.o_token_stride + t.h * v.o_head_stride +
                                                 2 * t4);
#pragma unroll
        for (int nb = 0; nb < HD / 8; ++nb) {
            float lo, hi;
            sk90_unpack<DT>(src[4 * nb], lo, hi);
            o[4 * nb + 2 * r] = fmaf(lo, f, o[4 * nb + 2 * r]);
            o[4 * nb + 2 * r + 1] = fmaf(hi, f, o[4 * nb + 2 * r + 1]);
        }
    }
}

/* The block steps of a tile of two 64-row query blocks (fwd_sm90_pair.cuh,
 * included after this file). */
template <sk_dtype DT, int HD, int BN>
__device__ __forceinline__ void sk90_pair_steps(
    const sk90_params &p, uint32_t base, const volatile int32_t *block_info, int wg,
    uint32_t q_base, uint32_t q_empty, sk90_pipe<sk90_layout<HD, kSk90Fixed, BN>::kKStages> &kp,
    sk90_pipe<sk90_layout<HD, kSk90Fixed, BN>::kVStages> &vp, float o[HD / 2], float m[2],
    float l[2], int wg_first_row, int row0);

/* A consumer warpgroup (wg 0 or 1: query rows 64 wg .. 64 wg + 63 of each
 * tile): per tile, the first S alone, the steady steps (S_j with
 * P_{j-1} V_{j-1}), the last P V alone, then the epilogue. CARRY: each
 * tile continues a carried partial result (sk90_carry_start / _end). BN:
 * keys per block (64: the fixed mode only). PAIR: a tile is two 64-row
 * query blocks (block_q = 64, fixed mode, no carry), t.i the pair. */
template <sk_dtype DT, int HD, int MODE, bool CARRY = false, int BN = kBlockN, bool PAIR = false>
__device__ void sk90_consumer(const sk90_params &p, const sk90_vparams &v, uint32_t base, const int32_t *tile_ids,
                              const volatile int32_t *block_info, int wg) {
    static_assert(MODE == kSk90Fixed || BN == kBlockN, "varlen / paged: blocks of 128 keys");
    static_assert(!PAIR || (MODE == kSk90Fixed && !CARRY), "pairs: fixed mode, no carry-in");
    using L = sk90_layout<HD, MODE, BN>; /* the paged mode's stages (fwd_sm90_common.cuh) */
    constexpr int kOAcc = HD / 2; /* O accumulator registers per thread */
    constexpr int kS = BN / 2;    /* S / P fp32 registers per thread */
    constexpr int kP = BN / 4;    /* P as packed pairs (the P V GEMM's A fragments) */
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
        sk_mbar_wait(base + L::kBarTileFull + 8 * slot, slot_phase, "tile full");
        const int slot_value = *(volatile const int32_t *)(tile_ids + slot);
        int vt[4] = {0, 0, 0, 0}; /* varlen: {q0, len_q, len_k, i} */
        if constexpr (MODE != kSk90Fixed) {
            const volatile int32_t *src = sk90_shared_ptr<int32_t>(base + L::kVTile) + 4 * slot;
#pragma unroll
            for (int k = 0; k < 4; ++k) vt[k] = src[k];
        }
        sk_mbar_arrive(base + L::kBarTileEmpty + 8 * slot);
        if (slot_value == kTileEnd) break;
        if (slot_value == kTileSkip) continue;
        const bool has_blocks = slot_value >= 0;
        sk90_tile t = sk90_tile_coords(p, has_blocks ? slot_value : kTileEmptyBase - slot_value);
        sk90_seq sq = {0, vt[0], vt[1], 0, vt[2]}; /* varlen: seq and k0 unused here */
        if constexpr (MODE != kSk90Fixed) t.i = vt[3];
        if constexpr (PAIR) t.i >>= 1; /* the tile id names the pair's first block */
        const int row0 = t.i * kBlockM + wg * kWgRows + 16 * warp + g; /* query of o[i], (i>>1)&1 == 0 */
        const int row1 = row0 + 8;
        const int wg_first_row = t.i * kBlockM + wg * kWgRows;

        float o[kOAcc];
#pragma unroll
        for (int i = 0; i < kOAcc; ++i) o[i] = 0.0f;
        float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
        if constexpr (CARRY) sk90_carry_start(m, l, p, v, t, row0, t4);

        if (has_blocks) {
            const uint32_t q_base = q_wg + qp.stage * L::kQBytes;
            const uint32_t q_empty = base + L::kBarQEmpty + 8 * qp.stage;
            sk_mbar_wait(base + L::kBarQFull + 8 * qp.stage, qp.phase, "Q full");
            qp.advance();
            if constexpr (PAIR) {
                /* Two query blocks: each warpgroup computes the blocks its
                 * own row selected (fwd_sm90_pair.cuh). */
                sk90_pair_steps<DT, HD, BN>(p, base, block_info, wg, q_base, q_empty, kp, vp, o,
                                            m, l, wg_first_row, row0);
            } else {
                float s[kS];
                uint32_t pf[kP];
                float corr[2];

                /* Prologue: S_0 alone. (The three phases are written out: ptxas
                 * serializes wgmma issued under run-time conditions.) The block
                 * index and whether another block follows come with the K stage. */
                sk_mbar_wait(base + L::kBarKFull + 8 * kp.stage, kp.phase, "K full");
                int info = sk90_read_info(block_info, kp.stage, lane);
                int absent = 0; /* paged: the boxes of the block not loaded */
                if constexpr (MODE == kSk90Paged)
                    absent = sk90_read_info(sk90_shared_ptr<int32_t>(base + L::kVAbsent), kp.stage, lane);
                sk_bar_sync(bar_mine, 256);
                sk_wgmma_fence();
                sk90_gemm_qk<DT, HD, BN>(s, q_base, base + L::kK + kp.stage * L::kBlockBytes);
                sk_bar_arrive(bar_other, 256);
                sk_wgmma_wait<0>();
#pragma unroll
                for (int i = 0; i < kS; ++i) sk_reg_fence(s[i]);
                sk90_release_k(base + L::kBarKEmpty + 8 * kp.stage, lane);
                if (leader && !(info & kInfoMore)) sk_mbar_arrive(q_empty); /* last use of Q */
                kp.advance();
                sk90_mask_tile<MODE, BN>(s, p, v, sq, info & ~kInfoMore, absent, wg_first_row, row0, t4);
                sk90_softmax<0, kS>(s, m, l, corr, scale_log2); /* O = 0: nothing to rescale */
                sk90_pack_p<DT, kS>(pf, s);

                /* Steady state: S_j and P_{j-1} V_{j-1} in flight together. */
                while (info & kInfoMore) {
                    /* V_{j-1} was loaded right after K_j: waiting for both before
                     * the issue keeps the two GEMMs in one fenced sequence. */
                    sk_mbar_wait(base + L::kBarKFull + 8 * kp.stage, kp.phase, "K full");
                    sk_mbar_wait(base + L::kBarVFull + 8 * vp.stage, vp.phase, "V full");
                    sk90_zero_v<HD, MODE>(v, sq, base + L::kV + vp.stage * L::kBlockBytes,
                                          info & ~kInfoMore, absent);
                    info = sk90_read_info(block_info, kp.stage, lane);
                    if constexpr (MODE == kSk90Paged)
                        absent = sk90_read_info(sk90_shared_ptr<int32_t>(base + L::kVAbsent), kp.stage,
                                                lane);
                    sk_bar_sync(bar_mine, 256);
                    sk90_fence_operands<HD, kP>(o, pf);
                    sk_wgmma_fence();
                    sk90_gemm_qk<DT, HD, BN>(s, q_base, base + L::kK + kp.stage * L::kBlockBytes);
                    if constexpr (L::kRescaleEarly) {
                        /* O is not in flight: rescale it for the previous block's
                         * max while S_j runs, off the softmax's critical path. */
#pragma unroll
                        for (int i = 0; i < kOAcc; ++i) o[i] *= corr[(i >> 1) & 1];
                        sk90_fence_operands<HD, kP>(o, pf);
                        sk_wgmma_fence();
                    }
                    sk90_gemm_pv<DT, HD, BN>(o, pf, base + L::kV + vp.stage * L::kBlockBytes);
                    sk_bar_arrive(bar_other, 256);
                    sk_wgmma_wait<1>(); /* S_j done; P V still running */
#pragma unroll
                    for (int i = 0; i < kS; ++i) sk_reg_fence(s[i]);
                    sk90_release_k(base + L::kBarKEmpty + 8 * kp.stage, lane);
                    if (leader && !(info & kInfoMore)) sk_mbar_arrive(q_empty);
                    kp.advance();
                    sk90_mask_tile<MODE, BN>(s, p, v, sq, info & ~kInfoMore, absent, wg_first_row, row0, t4);
                    sk90_softmax<0, kS>(s, m, l, corr, scale_log2);
                    sk_wgmma_wait<0>(); /* P_{j-1} V_{j-1} done */
                    sk90_fence_operands<HD, kP>(o, pf);
                    if (leader) sk_mbar_arrive(base + L::kBarVEmpty + 8 * vp.stage);
                    vp.advance();
                    if constexpr (!L::kRescaleEarly) {
#pragma unroll
                        for (int i = 0; i < kOAcc; ++i) o[i] *= corr[(i >> 1) & 1];
                    }
                    sk90_pack_p<DT, kS>(pf, s);
                }

                /* Tail: the last P V. */
                sk_mbar_wait(base + L::kBarVFull + 8 * vp.stage, vp.phase, "V full");
                sk90_zero_v<HD, MODE>(v, sq, base + L::kV + vp.stage * L::kBlockBytes, info & ~kInfoMore,
                                      absent);
                sk_bar_sync(bar_mine, 256);
                if constexpr (L::kRescaleEarly) {
#pragma unroll
                    for (int i = 0; i < kOAcc; ++i) o[i] *= corr[(i >> 1) & 1];
                }
                sk90_fence_operands<HD, kP>(o, pf);
                sk_wgmma_fence();
                sk90_gemm_pv<DT, HD, BN>(o, pf, base + L::kV + vp.stage * L::kBlockBytes);
                sk_bar_arrive(bar_other, 256);
                sk_wgmma_wait<0>();
                sk90_fence_operands<HD, kP>(o, pf);
                if (leader) sk_mbar_arrive(base + L::kBarVEmpty + 8 * vp.stage);
                vp.advance();
            }
        }

        /* Epilogue. Row sums: reduce over the quad holding each row. */
        if constexpr (CARRY) sk90_carry_end<DT, HD>(o, m, p, v, t, row0, t4);
        float inv[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
            l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
            inv[r] = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
        }
        if constexpr (MODE != kSk90Fixed) {
            /* LSE [Hq, total_q]; rows past the sequence are the next one's. */
            const int64_t lse_row = (int64_t)t.h * v.total_q + sq.q0;
            if (p.lse != NULL && t4 == 0 && row0 < sq.len_q)
                p.lse[lse_row + row0] = l[0] > 0.0f ? m[0] * p.scale + logf(l[0]) : -INFINITY;
            if (p.lse != NULL && t4 == 0 && row1 < sq.len_q)
                p.lse[lse_row + row1] = l[1] > 0.0f ? m[1] * p.scale + logf(l[1]) : -INFINITY;
        } else if (p.lse != NULL && t4 == 0) {
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
        if constexpr (MODE != kSk90Fixed) {
            /* Whole warpgroups inside the sequence: the TMA store; the one
             * that passes its end: per-row stores of the rows below it. */
            const int rows = sq.len_q - wg_first_row;
            if (rows >= kWgRows) {
                if (leader) {
#pragma unroll
                    for (int s = 0; s < L::kSlabs; ++s)
                        sk_tma_store_4d(&p.tm_o, o_base + s * L::kOSlabBytes, s * kSlabCols, t.h,
                                        sq.q0 + wg_first_row, 0);
                    sk_bulk_commit();
                }
            } else if (rows > 0) {
                sk90_store_rows<HD>(v, t, sq, o_base, wg_first_row, rows, wtid);
            }
        } else if (leader) {
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

#endif /* SK_CUDA_ATTENTION_FWD_SM90_CONSUMER_CUH */
