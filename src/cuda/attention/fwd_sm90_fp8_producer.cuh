/*
 * fwd_sm90_fp8_producer.cuh - the FP8 Hopper kernel's producer warpgroup
 * (part of fwd_sm90_fp8.cu, included there only): the TMA warp (warp 0;
 * warp 1 is the fp16/bf16 kernel's scheduler, shared) and the V transposer
 * (warps 2 and 3).
 *
 * TMA warp: as the fp16/bf16 kernel's (fwd_sm90_producer.cuh): per tile Q,
 * then K_0, K_1, V_0, K_2, V_1, ...; every tile of FP8 rows is one
 * 128-byte-wide box (D = 128 bytes: one 128B-swizzle slab). Each V stage
 * carries a word for the transposer: 0, or kVInfoEnd on the extra stage
 * the warp publishes (a plain arrival, no bytes) after the last tile, which
 * is how the transposer, who sees no tiles, learns that the kernel ends.
 *
 * Transposer: FP8 wgmma reads B K-major only, so P V needs V^T (rows d,
 * 128 keys each) where TMA brings V (rows of keys). Per V stage, the 64
 * threads rebuild it into a Vt stage: each thread moves 4 x 4-byte blocks
 * (4 keys x 4 dims) with 4 shared loads, 8 byte permutes and 4 shared
 * stores, 16 blocks per stage. The keys are written in the order the
 * consumers' P registers hold them (sk98_key_of_pos, the permutation
 * documented in fwd_sm90_fp8.cu), so P needs no shuffles. Then a
 * proxy fence (generic writes, async-proxy wgmma reads), the Vt stage's
 * full barrier and the V stage's empty barrier, one arrival per warp.
 * Lanes are laid out so that the loads and the stores are two-way bank
 * conflicts at most: lane = t + 4 h + 8 bl (see sk98_transpose).
 */
#ifndef SK_CUDA_ATTENTION_FWD_SM90_FP8_PRODUCER_CUH
#define SK_CUDA_ATTENTION_FWD_SM90_FP8_PRODUCER_CUH

/* One K, V or Q block: 128 rows of 128 bytes, one swizzled slab. */
__device__ __forceinline__ void sk98_load(const CUtensorMap *tm, uint32_t dst, uint32_t bar, int h,
                                          int row, int b, uint64_t policy) {
    sk_mbar_arrive_expect_tx(bar, kF8BlockBytes);
    sk_tma_load_4d(dst, tm, 0, h, row, b, bar, policy);
}

/* The TMA warp; the whole warp walks the layout, one elected lane issues. */
__device__ void sk98_producer(const sk98_params &p8, uint32_t base, int32_t *tile_ids,
                              volatile int32_t *block_info, volatile int32_t *v_info,
                              const volatile int32_t *sched) {
    using L = sk98_smem;
    const sk90_params &p = p8.base;
    const bool lead = sk_elect_one();
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
        sk_mbar_wait(base + L::kBarSchedFull + 8 * sslot, sphase, "sched full");
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
        const int slot_value = tile >= 0 && !has0 ? kTileEmptyBase - tile : tile;
        const uint32_t slot = n % kTileSlots, slot_phase = (n / kTileSlots) & 1;
        if (lead) {
            sk_mbar_wait(base + L::kBarTileEmpty + 8 * slot, slot_phase ^ 1, "tile empty");
            *(volatile int32_t *)(tile_ids + slot) = slot_value;
            sk_mbar_arrive(base + L::kBarTileFull + 8 * slot);
        }
        __syncwarp();
        if (tile == kTileEnd) {
            /* The transposer's end: one more V stage, no bytes, marked. */
            if (lead) {
                sk_mbar_wait(base + L::kBarVEmpty + 8 * vp.stage, vp.phase ^ 1, "V empty");
                v_info[vp.stage] = kVInfoEnd;
                sk_mbar_arrive(base + L::kBarVFull + 8 * vp.stage);
            }
            __syncwarp();
            break;
        }
        if (slot_value < 0) continue;
        const int hk = t.h / p.group;

        if (lead) {
            sk_mbar_wait(base + L::kBarQEmpty + 8 * qp.stage, qp.phase ^ 1, "Q empty");
            sk98_load(&p.tm_q, base + L::kQ + qp.stage * kF8BlockBytes,
                      base + L::kBarQFull + 8 * qp.stage, t.h, t.i * kBlockM, t.b,
                      sk_policy_evict_first());
        }
        qp.advance();

        bool has1 = sk90_cursor_next(p, t, cur, &c1);
        if (lead) {
            sk_mbar_wait(base + L::kBarKEmpty + 8 * kp.stage, kp.phase ^ 1, "K empty");
            block_info[kp.stage] = c0 | (has1 ? kInfoMore : 0);
            sk98_load(&p.tm_k, base + L::kK + kp.stage * kF8BlockBytes,
                      base + L::kBarKFull + 8 * kp.stage, hk, c0 * kBlockN, t.b,
                      sk_policy_evict_last());
        }
        kp.advance();
        for (;;) {
            int c2 = 0;
            bool has2 = false;
            if (has1) {
                has2 = sk90_cursor_next(p, t, cur, &c2);
                if (lead) {
                    sk_mbar_wait(base + L::kBarKEmpty + 8 * kp.stage, kp.phase ^ 1, "K empty");
                    block_info[kp.stage] = c1 | (has2 ? kInfoMore : 0);
                    sk98_load(&p.tm_k, base + L::kK + kp.stage * kF8BlockBytes,
                              base + L::kBarKFull + 8 * kp.stage, hk, c1 * kBlockN, t.b,
                              sk_policy_evict_last());
                }
                kp.advance();
            }
            if (lead) {
                sk_mbar_wait(base + L::kBarVEmpty + 8 * vp.stage, vp.phase ^ 1, "V empty");
                v_info[vp.stage] = 0;
                sk98_load(&p.tm_v, base + L::kV + vp.stage * kF8BlockBytes,
                          base + L::kBarVFull + 8 * vp.stage, hk, c0 * kBlockN, t.b,
                          sk_policy_evict_last());
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

/* Position `pos` (0..127) of a Vt row holds key sk98_key_of_pos(pos) of the
 * block: inside each 32-key chunk, positions 16 h + 4 t + i hold key
 * 16 h + 2 t + i (i < 2) or 16 h + 8 + 2 t + i - 2 (i >= 2). */
__device__ __forceinline__ int sk98_key_of_pos(int pos) {
    const int chunk = pos & ~31, h = (pos >> 4) & 1, t = (pos >> 2) & 3, i = pos & 3;
    return chunk + 16 * h + (i < 2 ? 2 * t + i : 8 + 2 * t + i - 2);
}

/* Byte offset of (row, byte col) in a 128 x 128-byte 128B-swizzled tile. */
__device__ __forceinline__ uint32_t sk98_sw_byte(int row, int col) {
    return sk_sw128_offset(row, col >> 4) + (col & 15);
}

/* V (keys x dims) at v into Vt (dims x permuted keys) at vt, by the 64
 * threads of warps 2-3 (w = 0, 1). Thread (w, lane): t = lane & 3, h =
 * (lane >> 2) & 1, bl = lane >> 3; blocks (kk, bh) for kk < 4, bh in
 * 4w .. 4w + 3: keys 32 kk + 16 h + {2t, 2t + 1, 8 + 2t, 9 + 2t} (in
 * sk98_key_of_pos order: Vt positions 32 kk + 16 h + 4t .. + 3) x dims
 * 4 (4 bh + bl) .. + 3. */
__device__ __forceinline__ void sk98_transpose(uint32_t v, uint32_t vt, int w, int lane) {
    const int t = lane & 3, h = (lane >> 2) & 1, bl = lane >> 3;
    /* Not unrolled: the producer warpgroup runs on kF8ProducerRegs registers
     * (unrolling j spills at 56). */
#pragma unroll 1
    for (int kk = 0; kk < 4; ++kk) {
        const int key0 = 32 * kk + 16 * h + 2 * t, pos = 32 * kk + 16 * h + 4 * t;
#pragma unroll 1
        for (int j = 0; j < 4; ++j) {
            const int d = 4 * (4 * (4 * w + j) + bl); /* dim quad 4 bh + bl, bh = 4w + j */
            const uint32_t x0 = sk_ld_shared_u32(v + sk98_sw_byte(key0, d));
            const uint32_t x1 = sk_ld_shared_u32(v + sk98_sw_byte(key0 + 1, d));
            const uint32_t x2 = sk_ld_shared_u32(v + sk98_sw_byte(key0 + 8, d));
            const uint32_t x3 = sk_ld_shared_u32(v + sk98_sw_byte(key0 + 9, d));
            /* 4 x 4 byte transpose: out_e holds byte e of x0, x1, x2, x3. */
            const uint32_t lo01 = __byte_perm(x0, x1, 0x5140), hi01 = __byte_perm(x0, x1, 0x7362);
            const uint32_t lo23 = __byte_perm(x2, x3, 0x5140), hi23 = __byte_perm(x2, x3, 0x7362);
            sk_st_shared_u32(vt + sk98_sw_byte(d + 0, pos), __byte_perm(lo01, lo23, 0x5410));
            sk_st_shared_u32(vt + sk98_sw_byte(d + 1, pos), __byte_perm(lo01, lo23, 0x7632));
            sk_st_shared_u32(vt + sk98_sw_byte(d + 2, pos), __byte_perm(hi01, hi23, 0x5410));
            sk_st_shared_u32(vt + sk98_sw_byte(d + 3, pos), __byte_perm(hi01, hi23, 0x7632));
        }
    }
}

/* Warps 2 and 3: every V stage into a Vt stage, until the end mark. */
__device__ void sk98_transposer(uint32_t base, const volatile int32_t *v_info, int w) {
    using L = sk98_smem;
    const int lane = threadIdx.x % 32;
    sk90_pipe<L::kVStages> vp = {0, 0};
    sk90_pipe<L::kVtStages> tp = {0, 0};
    for (;;) {
        sk_mbar_wait(base + L::kBarVFull + 8 * vp.stage, vp.phase, "V full (transposer)");
        /* Lane 0 reads the mark and is the lane that releases the stage. */
        int info = 0;
        if (lane == 0) info = v_info[vp.stage];
        info = __shfl_sync(0xffffffffu, info, 0);
        if (info == kVInfoEnd) break;
        sk_mbar_wait(base + L::kBarVtEmpty + 8 * tp.stage, tp.phase ^ 1, "Vt empty");
        sk98_transpose(base + L::kV + vp.stage * kF8BlockBytes,
                       base + L::kVt + tp.stage * kF8BlockBytes, w, lane);
        sk_fence_proxy_async_smem(); /* Vt: generic writes, then wgmma reads */
        __syncwarp();
        if (lane == 0) {
            sk_mbar_arrive(base + L::kBarVtFull + 8 * tp.stage);
            sk_mbar_arrive(base + L::kBarVEmpty + 8 * vp.stage);
        }
        vp.advance();
        tp.advance();
    }
}

#endif /* SK_CUDA_ATTENTION_FWD_SM90_FP8_PRODUCER_CUH */
