/*
 * fwd_sm90_producer.cuh - the Hopper attention kernel's producer warpgroup
 * (part of fwd_sm90.cu, included there only, after its shapes, shared
 * layout, parameters and pipeline types): the scheduler warp, which takes
 * and decodes tiles, and the TMA warp, which walks each row's selected
 * blocks and issues the Q, K and V loads.
 */
#ifndef SK_CUDA_ATTENTION_FWD_SM90_PRODUCER_CUH
#define SK_CUDA_ATTENTION_FWD_SM90_PRODUCER_CUH

/* ---------------------------------------------------------------------------
 * Producer warpgroup: the scheduler warp and the TMA warp
 * ------------------------------------------------------------------------- */

/* L: the shared layout (sk90_smem<HD>, or the FP8 kernel's sk98_smem). */
template <class L>
__device__ __forceinline__ void sk90_load_kv(const CUtensorMap *tm, uint32_t dst, uint32_t bar,
                                             int hk, int c, int b) {
    /* K/V: kept in L2, the head's other query tiles reread them. Made at the
     * point of use: the producer has few registers to hold it. */
    const uint64_t policy = sk_policy_evict_last();
    sk_mbar_arrive_expect_tx(bar, L::kBlockBytes);
#pragma unroll
    for (int s = 0; s < L::kSlabs; ++s)
        sk_tma_load_4d(dst + s * L::kSlab128, tm, s * L::kBoxCols, hk, c * kBlockN, b, bar, policy);
}

/* The scheduler warp: takes tiles from the schedule and decodes them (tile
 * id, clamped block range) up to kSchedSlots ahead of the TMA warp, so that
 * the chain of dependent global reads (counter, tile order, row offsets)
 * never sits between two tiles' loads. Lane 0 works; the warp stays
 * converged. */
template <class L> /* the shared layout: its kBarSched* barriers */
__device__ void sk90_scheduler(const sk90_params &p, uint32_t base, volatile int32_t *sched) {
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
            sk_mbar_wait(base + L::kBarSchedEmpty + 8 * slot, phase ^ 1, "sched empty");
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
 * on the barriers and issues the copies; the whole warp reads the layout.
 * With L::kTransposeV (the FP8 kernel), each V stage also carries a word
 * for the transposer warps in v_info (0), and after the last tile one more
 * V stage, a plain arrival with no bytes, carries kVInfoEnd: the
 * transposer sees no tiles, so that is how it learns the end. */
template <class L>
__device__ void sk90_producer(const sk90_params &p, uint32_t base, int32_t *tile_ids,
                              volatile int32_t *block_info, volatile int32_t *v_info,
                              const volatile int32_t *sched) {
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
        /* every lane: acquire */
        sk_mbar_wait(base + L::kBarSchedFull + 8 * sslot, sphase, "sched full");
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
            sk_mbar_wait(base + L::kBarTileEmpty + 8 * slot, slot_phase ^ 1, "tile empty");
            *(volatile int32_t *)(tile_ids + slot) = slot_value;
            sk_mbar_arrive(base + L::kBarTileFull + 8 * slot); /* release */
        }
        __syncwarp();
        if (tile == kTileEnd) {
            if constexpr (L::kTransposeV) {
                if (lead) {
                    sk_mbar_wait(base + L::kBarVEmpty + 8 * vp.stage, vp.phase ^ 1, "V empty");
                    v_info[vp.stage] = kVInfoEnd;
                    sk_mbar_arrive(base + L::kBarVFull + 8 * vp.stage);
                }
                __syncwarp();
            }
            break;
        }
        if (slot_value < 0) continue; /* skipped, or nothing to load (O = 0) */
        const int hk = t.h / p.group;

        /* Q first. With two buffers, its buffer was freed by the tile before
         * the previous one, so this load runs while that tile finishes; with
         * one, it waits for the previous tile's last S GEMMs. */
        if (lead) {
            sk_mbar_wait(base + L::kBarQEmpty + 8 * qp.stage, qp.phase ^ 1, "Q empty");
            sk_mbar_arrive_expect_tx(base + L::kBarQFull + 8 * qp.stage, L::kQBytes);
            const uint64_t stream = sk_policy_evict_first(); /* Q: read once */
#pragma unroll
            for (int s = 0; s < L::kSlabs; ++s)
                sk_tma_load_4d(base + L::kQ + qp.stage * L::kQBytes + s * L::kSlab128, &p.tm_q,
                               s * L::kBoxCols, t.h, t.i * kBlockM, t.b,
                               base + L::kBarQFull + 8 * qp.stage, stream);
        }
        qp.advance();

        /* K_0, then K_{j+1} before V_j: a consumer's step j needs K_{j+1}
         * for its S GEMM before V_j for its P V GEMM. Each K stage carries
         * its block index and whether another block follows (written before
         * the stage's arrival, which releases it). */
        bool has1 = sk90_cursor_next(p, t, cur, &c1);
        if (lead) {
            sk_mbar_wait(base + L::kBarKEmpty + 8 * kp.stage, kp.phase ^ 1, "K empty");
            block_info[kp.stage] = c0 | (has1 ? kInfoMore : 0);
            sk90_load_kv<L>(&p.tm_k, base + L::kK + kp.stage * L::kBlockBytes,
                             base + L::kBarKFull + 8 * kp.stage, hk, c0, t.b);
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
                    sk90_load_kv<L>(&p.tm_k, base + L::kK + kp.stage * L::kBlockBytes,
                                     base + L::kBarKFull + 8 * kp.stage, hk, c1, t.b);
                }
                kp.advance();
            }
            if (lead) {
                sk_mbar_wait(base + L::kBarVEmpty + 8 * vp.stage, vp.phase ^ 1, "V empty");
                if constexpr (L::kTransposeV) v_info[vp.stage] = 0;
                sk90_load_kv<L>(&p.tm_v, base + L::kV + vp.stage * L::kBlockBytes,
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

#endif /* SK_CUDA_ATTENTION_FWD_SM90_PRODUCER_CUH */
