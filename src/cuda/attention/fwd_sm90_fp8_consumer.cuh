/*
 * fwd_sm90_fp8_consumer.cuh - the FP8 Hopper kernel's consumer warpgroups
 * (part of fwd_sm90_fp8.cu, included there only, after the fp16/bf16
 * consumer whose masks, softmax and stage helpers it reuses): the FP8
 * GEMMs S = Q K^T and O += P V (wgmma m64n128k32 e4m3), P to e4m3 in
 * registers, the descales, and the epilogue. The step structure (turns,
 * the first S alone, S_j with P_{j-1} V_{j-1}, the last P V alone, O
 * rescaled between the GEMM issues) is the fp16/bf16 consumer's at
 * D = 128 (fwd_sm90_consumer.cuh), at both head dims. VT: P V reads the
 * V stages (pre-transposed V by TMA) instead of the transposer's Vt stages;
 * nothing else differs (L::kPv*, fwd_sm90_fp8.cu).
 */
#ifndef SK_CUDA_ATTENTION_FWD_SM90_FP8_CONSUMER_CUH
#define SK_CUDA_ATTENTION_FWD_SM90_FP8_CONSUMER_CUH

/* wgmma descriptor of a Q or K tile: rows of HD bytes, 128B swizzle at
 * HD = 128, 64B at 64 (8-row atoms of 1024 / 512 B). */
template <int HD>
__device__ __forceinline__ uint64_t sk98_desc_rows(uint32_t addr) {
    if constexpr (HD == 128)
        return sk_wgmma_desc_sw128(addr, 16, kSwizzleAtom);
    else
        return sk_wgmma_desc_sw64(addr, 16, 512);
}

/* S (64 x BN, fp32) = Q (64 x HD bytes) K^T: HD / 32 wgmma k32, one
 * commit group. K steps of 32 bytes: +32 B inside the swizzle atom (the
 * descriptor's address field counts 16 B), as CUTLASS advances K-major
 * swizzled operands. A K stage of BN = 64 rows has the rows of a
 * 128-row one (same swizzle, same SBO): only N differs (m64n64k32). */
template <int HD, int BN = kF8Keys>
__device__ __forceinline__ void sk98_gemm_qk(float s[BN / 2], uint32_t q_base, uint32_t k_base) {
    const uint64_t da = sk98_desc_rows<HD>(q_base);
    const uint64_t db = sk98_desc_rows<HD>(k_base);
    if constexpr (BN == 64) {
        sk_wgmma_m64n64k32_ss_e4m3_zero(s, da, db);
#pragma unroll
        for (int kk = 1; kk < HD / 32; ++kk)
            sk_wgmma_m64n64k32_ss_e4m3(s, da + 2 * kk, db + 2 * kk, 1);
    } else {
        sk_wgmma_m64n128k32_ss_e4m3_zero(s, da, db);
#pragma unroll
        for (int kk = 1; kk < HD / 32; ++kk)
            sk_wgmma_m64n128k32_ss_e4m3(s, da + 2 * kk, db + 2 * kk, 1);
    }
    sk_wgmma_commit();
}

/* O (64 x HD) += P (64 x BN keys, e4m3 registers) Vt (HD dims x BN
 * permuted keys, K-major): BN / 32 wgmma k32. BN = 128: rows of 128 bytes,
 * 128B swizzle (SBO: 8 rows = 1024 B); BN = 64: rows of 64 bytes, 64B
 * swizzle (SBO 512 B), the form of the K tile at HD = 64 (sk98_desc_rows);
 * the second k32 step is +32 B inside the 64-byte row, as there. */
template <int HD, int BN = kF8Keys>
__device__ __forceinline__ void sk98_gemm_pv(float o[HD / 2], const uint32_t pf[BN / 8],
                                             uint32_t vt_base) {
    const uint64_t db = BN == 64 ? sk_wgmma_desc_sw64(vt_base, 16, 512)
                                 : sk_wgmma_desc_sw128(vt_base, 16, kSwizzleAtom);
#pragma unroll
    for (int kk = 0; kk < BN / 32; ++kk) {
        if constexpr (HD == 128)
            sk_wgmma_m64n128k32_rs_e4m3(o, pf + 4 * kk, db + 2 * kk, 1);
        else
            sk_wgmma_m64n64k32_rs_e4m3(o, pf + 4 * kk, db + 2 * kk, 1);
    }
    sk_wgmma_commit();
}

/* Four fp32 to four e4m3 in one word, a first (lowest byte). */
__device__ __forceinline__ uint32_t sk98_pack4(float a, float b, float c, float d) {
    return (uint32_t)sk_cvt_e4m3x2(b, a) | ((uint32_t)sk_cvt_e4m3x2(d, c) << 16);
}

/* P to the A fragments of the k32 steps (NS / 16: four for 128 keys, two
 * for 64; the same packing per 32-key chunk). The accumulator's register
 * i (row g + 8 ((i >> 1) & 1), key 8 (i >> 2) + 2t + (i & 1)) is used where
 * it lies: fragment register r of step kk takes accumulators 16 kk +
 * {0,1,4,5} (r = 0), {2,3,6,7} (1), {8,9,12,13} (2), {10,11,14,15} (3),
 * which the A layout reads as positions 4t .. 4t+3 (r = 0, 1) and 16 + 4t ..
 * (r = 2, 3) of rows g, g + 8. Key and position differ
 * (sk98_key_of_pos); the transposer wrote Vt in that order, so the sum
 * over keys is the same. */
template <int NS = 64>
__device__ __forceinline__ void sk98_pack_p(uint32_t pf[NS / 4], const float s[NS]) {
#pragma unroll
    for (int kk = 0; kk < NS / 16; ++kk) {
        const float *x = s + 16 * kk;
        pf[4 * kk + 0] = sk98_pack4(x[0], x[1], x[4], x[5]);
        pf[4 * kk + 1] = sk98_pack4(x[2], x[3], x[6], x[7]);
        pf[4 * kk + 2] = sk98_pack4(x[8], x[9], x[12], x[13]);
        pf[4 * kk + 3] = sk98_pack4(x[10], x[11], x[14], x[15]);
    }
}

template <int HD, int NP = 16>
__device__ __forceinline__ void sk98_fence_operands(float o[HD / 2], uint32_t pf[NP]) {
#pragma unroll
    for (int i = 0; i < HD / 2; ++i) sk_reg_fence(o[i]);
#pragma unroll
    for (int i = 0; i < NP; ++i) sk_reg_fence_u32(pf[i]);
}

/* The tile's descale factors (NULL arrays: 1). */
struct sk98_tile_scale {
    float qk;   /* q_descale x k_descale */
    float v;    /* v_descale */
};

__device__ __forceinline__ sk98_tile_scale sk98_scales(const sk98_params &p8, const sk90_tile &t) {
    const sk90_params &p = p8.base;
    const int hk = t.h / p.group;
    const int64_t bq = (int64_t)t.b * p.heads_q + t.h;
    const int64_t bk = (int64_t)t.b * (p.heads_q / p.group) + hk;
    sk98_tile_scale f;
    f.qk = (p8.q_descale != NULL ? __ldg(p8.q_descale + bq) : 1.0f) *
           (p8.k_descale != NULL ? __ldg(p8.k_descale + bk) : 1.0f);
    f.v = p8.v_descale != NULL ? __ldg(p8.v_descale + bk) : 1.0f;
    return f;
}

/* Scores of block c before the softmax: the sign of q_descale x k_descale
 * folded like a negative scale (the max trick needs a positive factor),
 * then the shared masks (which apply the scale's own sign). */
template <int BN = kF8Keys>
__device__ __forceinline__ void sk98_prepare(float s[BN / 2], const sk90_params &p, bool flip,
                                             int c, int wg_first_row, int row0, int t4) {
    if (flip) {
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) s[i] = -s[i];
    }
    sk90_mask_block<BN>(s, p, c, wg_first_row, row0, t4);
}

/* The FP8 block steps for the turns of a pair tile (sk90_pair_walk,
 * fwd_sm90_pair.cuh): this kernel's GEMMs, P packing and score
 * preparation (the descales' sign in flip), 2^kF8MaxOffset in the softmax. */
template <int HD, int BN>
struct sk98_pair_ops {
    static constexpr int kS = BN / 2, kP = BN / 8, kOffset = kF8MaxOffset;
    bool flip;
    __device__ __forceinline__ void qk(float *s, uint32_t q, uint32_t k) const {
        sk98_gemm_qk<HD, BN>(s, q, k);
    }
    __device__ __forceinline__ void pv(float *o, const uint32_t *pf, uint32_t v) const {
        sk98_gemm_pv<HD, BN>(o, pf, v);
    }
    __device__ __forceinline__ void prepare(float *s, const sk90_params &p, int c,
                                            int wg_first_row, int row0, int t4) const {
        sk98_prepare<BN>(s, p, flip, c, wg_first_row, row0, t4);
    }
    __device__ __forceinline__ void pack(uint32_t *pf, const float *s) const {
        sk98_pack_p<kS>(pf, s);
    }
    __device__ __forceinline__ void fence(float *o, uint32_t *pf) const {
        sk98_fence_operands<HD, kP>(o, pf);
    }
};

/* BN: keys per block (128, or 64: S is 32 registers, P 8). PAIR: a tile
 * is two 64-row query blocks (block_q = 64), warpgroup h computing block
 * 2i + h over the blocks its row selected (sk90_pair_walk); t.i the pair. */
template <sk_dtype OT, int HD, bool VT, int BN = kF8Keys, bool PAIR = false>
__device__ void sk98_consumer(const sk98_params &p8, uint32_t base, const int32_t *tile_ids,
                              const volatile int32_t *block_info, int wg) {
    using L = sk98_smem<HD, VT, BN>;
    constexpr int kOAcc = HD / 2; /* O accumulator registers per thread */
    constexpr int kS = BN / 2;    /* S / P fp32 registers per thread */
    constexpr int kP = BN / 8;    /* P as e4m3, four a register */
    const sk90_params &p = p8.base;
    const int wtid = threadIdx.x % 128;
    const int warp = wtid / 32, lane = wtid % 32;
    const int g = lane / 4, t4 = lane % 4;
    const bool leader = wtid == 0;
    const uint32_t bar_mine = wg == 0 ? kBarTurn0 : kBarTurn1;
    const uint32_t bar_other = wg == 0 ? kBarTurn1 : kBarTurn0;
    const uint32_t bar_epi = wg == 0 ? kBarEpilogue0 : kBarEpilogue1;
    const uint32_t q_wg = base + L::kQ + wg * kWgRows * L::kRowBytes;
    const uint32_t o_base = base + L::kO + wg * L::kOWgBytes;

    sk90_pipe<L::kKStages> kp = {0, 0};
    sk90_pipe<L::kPvStages> vp = {0, 0};
    sk90_pipe<L::kQBufs> qp = {0, 0};
    if (wg == 1) sk_bar_arrive(kBarTurn0, 256);

    for (uint32_t n = 0;; ++n) {
        const uint32_t slot = n % kTileSlots, slot_phase = (n / kTileSlots) & 1;
        sk_mbar_wait(base + L::kBarTileFull + 8 * slot, slot_phase, "tile full");
        const int slot_value = *(volatile const int32_t *)(tile_ids + slot);
        sk_mbar_arrive(base + L::kBarTileEmpty + 8 * slot);
        if (slot_value == kTileEnd) break;
        if (slot_value == kTileSkip) continue;
        const bool has_blocks = slot_value >= 0;
        sk90_tile t = sk90_tile_coords(p, has_blocks ? slot_value : kTileEmptyBase - slot_value);
        if constexpr (PAIR) t.i >>= 1; /* the tile id names the pair's first block */
        const int row0 = t.i * kBlockM + wg * kWgRows + 16 * warp + g;
        const int row1 = row0 + 8;
        const int wg_first_row = t.i * kBlockM + wg * kWgRows;
        /* Scores are raw Q8 K8 products: the real logit is s x scale x
         * q_descale x k_descale, folded into the base-2 factor. */
        const sk98_tile_scale f = sk98_scales(p8, t);
        const bool flip = f.qk < 0.0f;
        const float scale_log2 = p.scale_log2 * fabsf(f.qk);
        const float scale_lse = p.scale * fabsf(f.qk);

        float o[kOAcc];
#pragma unroll
        for (int i = 0; i < kOAcc; ++i) o[i] = 0.0f;
        float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

        if (has_blocks) {
            const uint32_t q_base = q_wg + qp.stage * L::kTileBytes;
            const uint32_t q_empty = base + L::kBarQEmpty + 8 * qp.stage;
            sk_mbar_wait(base + L::kBarQFull + 8 * qp.stage, qp.phase, "Q full");
            qp.advance();
            if constexpr (PAIR) {
                const sk98_pair_ops<HD, BN> ops = {flip};
                sk90_pair_walk<L, HD>(p, ops, scale_log2, base, block_info, wg, q_base, q_empty,
                                      kp, vp, o, m, l, wg_first_row, row0);
            } else {
                float s[kS];
                uint32_t pf[kP];
                float corr[2];

                sk_mbar_wait(base + L::kBarKFull + 8 * kp.stage, kp.phase, "K full");
                int info = sk90_read_info(block_info, kp.stage, lane);
                sk_bar_sync(bar_mine, 256);
                sk_wgmma_fence();
                sk98_gemm_qk<HD, BN>(s, q_base, base + L::kK + kp.stage * L::kKVBytes);
                sk_bar_arrive(bar_other, 256);
                sk_wgmma_wait<0>();
#pragma unroll
                for (int i = 0; i < kS; ++i) sk_reg_fence(s[i]);
                sk90_release_k(base + L::kBarKEmpty + 8 * kp.stage, lane);
                if (leader && !(info & kInfoMore)) sk_mbar_arrive(q_empty);
                kp.advance();
                sk98_prepare<BN>(s, p, flip, info & ~kInfoMore, wg_first_row, row0, t4);
                sk90_softmax<kF8MaxOffset, kS>(s, m, l, corr, scale_log2);
                sk98_pack_p<kS>(pf, s);

                while (info & kInfoMore) {
                    sk_mbar_wait(base + L::kBarKFull + 8 * kp.stage, kp.phase, "K full");
                    sk_mbar_wait(base + L::kBarPvFull + 8 * vp.stage, vp.phase, "Vt full");
                    info = sk90_read_info(block_info, kp.stage, lane);
                    sk_bar_sync(bar_mine, 256);
                    sk98_fence_operands<HD, kP>(o, pf);
                    sk_wgmma_fence();
                    sk98_gemm_qk<HD, BN>(s, q_base, base + L::kK + kp.stage * L::kKVBytes);
#pragma unroll
                    for (int i = 0; i < kOAcc; ++i) o[i] *= corr[(i >> 1) & 1];
                    sk98_fence_operands<HD, kP>(o, pf);
                    sk_wgmma_fence();
                    sk98_gemm_pv<HD, BN>(o, pf, base + L::kPv + vp.stage * L::kPvBytes);
                    sk_bar_arrive(bar_other, 256);
                    sk_wgmma_wait<1>();
#pragma unroll
                    for (int i = 0; i < kS; ++i) sk_reg_fence(s[i]);
                    sk90_release_k(base + L::kBarKEmpty + 8 * kp.stage, lane);
                    if (leader && !(info & kInfoMore)) sk_mbar_arrive(q_empty);
                    kp.advance();
                    sk98_prepare<BN>(s, p, flip, info & ~kInfoMore, wg_first_row, row0, t4);
                    sk90_softmax<kF8MaxOffset, kS>(s, m, l, corr, scale_log2);
                    sk_wgmma_wait<0>();
                    sk98_fence_operands<HD, kP>(o, pf);
                    if (leader) sk_mbar_arrive(base + L::kBarPvEmpty + 8 * vp.stage);
                    vp.advance();
                    sk98_pack_p<kS>(pf, s);
                }

                sk_mbar_wait(base + L::kBarPvFull + 8 * vp.stage, vp.phase, "Vt full");
                sk_bar_sync(bar_mine, 256);
#pragma unroll
                for (int i = 0; i < kOAcc; ++i) o[i] *= corr[(i >> 1) & 1];
                sk98_fence_operands<HD, kP>(o, pf);
                sk_wgmma_fence();
                sk98_gemm_pv<HD, BN>(o, pf, base + L::kPv + vp.stage * L::kPvBytes);
                sk_bar_arrive(bar_other, 256);
                sk_wgmma_wait<0>();
                sk98_fence_operands<HD, kP>(o, pf);
                if (leader) sk_mbar_arrive(base + L::kBarPvEmpty + 8 * vp.stage);
                vp.advance();
            }
        }

        /* Epilogue: O x v_descale / rowsum. */
        float inv[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
            l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
            inv[r] = l[r] > 0.0f ? f.v / l[r] : 0.0f;
        }
        if (p.lse != NULL && t4 == 0) {
            const int64_t lse_row = ((int64_t)t.b * p.heads_q + t.h) * p.seq_q;
            if (row0 < p.seq_q)
                p.lse[lse_row + row0] =
                    l[0] > 0.0f ? m[0] * scale_lse + (logf(l[0]) - kF8OffsetLn) : -INFINITY;
            if (row1 < p.seq_q)
                p.lse[lse_row + row1] =
                    l[1] > 0.0f ? m[1] * scale_lse + (logf(l[1]) - kF8OffsetLn) : -INFINITY;
        }
        if (leader) sk_bulk_wait_read<0>();
        sk_bar_sync(bar_epi, 128);
        const int st_row = 16 * warp + (lane % 8) + 8 * ((lane / 8) % 2);
#pragma unroll
        for (int mb = 0; mb < HD / 8; mb += 2) {
            const int grp = mb + lane / 16;
            const int slab = grp / 8, chunk = grp % 8;
            const uint32_t addr = o_base + slab * L::kOSlabBytes + st_row * kSlabRowBytes +
                                  ((chunk ^ (st_row % 8)) << 4);
            sk_stmatrix_x4(addr, sk90_pack<OT>(o[4 * mb + 0] * inv[0], o[4 * mb + 1] * inv[0]),
                           sk90_pack<OT>(o[4 * mb + 2] * inv[1], o[4 * mb + 3] * inv[1]),
                           sk90_pack<OT>(o[4 * mb + 4] * inv[0], o[4 * mb + 5] * inv[0]),
                           sk90_pack<OT>(o[4 * mb + 6] * inv[1], o[4 * mb + 7] * inv[1]));
        }
        sk_fence_proxy_async_smem();
        sk_bar_sync(bar_epi, 128);
        if (leader) {
#pragma unroll
            for (int sl = 0; sl < L::kOSlabs; ++sl)
                sk_tma_store_4d(&p.tm_o, o_base + sl * L::kOSlabBytes, sl * kSlabCols, t.h,
                                wg_first_row, t.b);
            sk_bulk_commit();
        }
    }
    if (wg == 0) sk_bar_sync(kBarTurn0, 256);
    if (leader) sk_bulk_wait<0>();
}

#endif /* SK_CUDA_ATTENTION_FWD_SM90_FP8_CONSUMER_CUH */
