/*
 * fwd_sm90_producer.cuh - the Hopper attention kernels' producer warpgroup
 * (included by fwd_sm90.cu, fwd_sm90_fp8.cu and, through fwd_sm90_body.cuh,
 * fwd_sm90_varlen.cu, after fwd_sm90_common.cuh): the scheduler warp, which
 * takes and decodes tiles, and the TMA warp, which walks each row's
 * selected blocks and issues the Q, K and V loads. MODE (kSk90Fixed,
 * kSk90Varlen, kSk90Paged): the varlen / paged mode's tiles come from the
 * varlen plan with their sequences, and its K / V blocks from packed
 * tokens or pages; the fixed mode's code is unchanged.
 */
#ifndef SK_CUDA_ATTENTION_FWD_SM90_PRODUCER_CUH
#define SK_CUDA_ATTENTION_FWD_SM90_PRODUCER_CUH

/* ---------------------------------------------------------------------------
 * Producer warpgroup: the scheduler warp and the TMA warp
 * ------------------------------------------------------------------------- */

/* L: the shared layout (sk90_smem<HD, ...>, or the FP8 kernel's
 * sk98_smem); its block of L::kBN keys c, slabs L::kKVSlab apart. */
template <class L>
__device__ __forceinline__ void sk90_load_kv(const CUtensorMap *tm, uint32_t dst, uint32_t bar,
                                             int hk, int c, int b) {
    /* K/V: kept in L2, the head's other query tiles reread them. Made at the
     * point of use: the producer has few registers to hold it. */
    const uint64_t policy = sk_policy_evict_last();
    sk_mbar_arrive_expect_tx(bar, L::kBlockBytes);
#pragma unroll
    for (int s = 0; s < L::kSlabs; ++s)
        sk_tma_load_4d(dst + s * L::kKVSlab, tm, s * L::kBoxCols, hk, c * L::kBN, b, bar, policy);
}

/* The FP8 kernel's pre-transposed V (L::kVtDirect, sparsek.h
 * SK_V_LAYOUT_VT_FP8): block c is one box of L::kBN key columns x HD rows
 * of the map over V^T [B, Hkv, HD, Sk_pad] bytes, at (c kBN, 0, hk, b);
 * it lands as the K-major P V operand (128B swizzle). */
template <class L>
__device__ __forceinline__ void sk90_load_vt(const CUtensorMap *tm, uint32_t dst, uint32_t bar,
                                             int hk, int c, int b) {
    const uint64_t policy = sk_policy_evict_last();
    sk_mbar_arrive_expect_tx(bar, L::kBlockBytes);
    sk_tma_load_4d(dst, tm, c * L::kBN, 0, hk, b, bar, policy);
}

/* Tuning knob (compile-time, an A/B build for the measurement): 1, the
 * default, reads a block's pages one block ahead of its K load (below); 0
 * reads them after the wait for the stage, the order before this change
 * (docs/perf/varlen_paged.md, "Page indices off the issue path"). */
#ifndef SK90_PAGE_LOOKAHEAD
#define SK90_PAGE_LOOKAHEAD 1
#endif

/* Paged: lane j's page of block c (box j: keys c * 128 + j * page_size
 * on), or -1 when box j does not exist or starts at or past len_k (so a
 * table entry past the sequence is never read). Every lane of the TMA warp
 * calls it one block ahead of the block's K load (two ahead of its V
 * load), before the waits for free stages: the table read, a dependent
 * global load, is in flight while the warp waits, not between a stage
 * becoming free and its TMA issue (docs/perf/varlen_paged.md, "Page indices
 * off the issue path"). */
__device__ __forceinline__ int sk90_page_of_lane(const sk90_vparams &p, const sk90_seq &t, int c) {
    const int lane = threadIdx.x % 32;
    const int key = c * kBlockN + lane * p.page_size;
    if (lane >= (kBlockN >> p.page_shift) || key >= t.len_k) return -1;
    return __ldg(p.page_table + (int64_t)t.seq * p.table_stride + (key >> p.page_shift));
}

/* Paged: block c's K or V into the stage at dst, the whole TMA warp; pg is
 * lane j's page of the block (sk90_page_of_lane; read here, after the
 * wait, when SK90_PAGE_LOOKAHEAD is 0). The lead waits for the
 * stage; lane j issues box j (page_size rows per 64-column slab, landing at
 * row j * page_size: a multiple of 8 rows, so the 128-byte swizzle is the
 * one a single 128-row box gives) when its page is in [0, num_pages). The
 * others are never read (a garbage table cannot send a load out of the
 * cache); their rows are masked and, in V, zeroed by the consumers
 * (sk90_zero_v). K only (info_out non-NULL): the lead writes the stage's
 * block info and the mask of boxes not loaded before its arrival, which
 * releases them. The expected bytes count the boxes issued (0 completes
 * the phase at once). */
template <class L>
__device__ __forceinline__ void sk90_issue_pages(const sk90_vparams &p, const CUtensorMap *tm,
                                                 uint32_t dst, uint32_t full, uint32_t empty,
                                                 uint32_t phase, int pg, const sk90_seq &sq,
                                                 int c, int hk, bool lead,
                                                 volatile int32_t *info_out, int32_t info,
                                                 volatile int32_t *absent_out, const char *what) {
    const int lane = threadIdx.x % 32;
    if (lead) sk_mbar_wait(empty, phase ^ 1, what);
    __syncwarp();
    if constexpr (!SK90_PAGE_LOOKAHEAD) pg = sk90_page_of_lane(p, sq, c);
    const bool load = (unsigned)pg < (unsigned)p.num_pages; /* -1: no box */
    const uint32_t loaded = __ballot_sync(0xffffffffu, load);
    if (lead) {
        if (info_out != NULL) {
            *info_out = info;
            *absent_out = (int32_t)(~loaded & ((1u << (kBlockN >> p.page_shift)) - 1u));
        }
        sk_mbar_arrive_expect_tx(
            full, (uint32_t)(__popc(loaded) * p.page_size * L::kSlabs * kSlabRowBytes));
    }
    __syncwarp(); /* the expected bytes before any of them arrive */
    if (load) {
        const uint64_t policy = sk_policy_evict_last(); /* K/V: reread by the head's tiles */
#pragma unroll
        for (int s = 0; s < L::kSlabs; ++s)
            sk_tma_load_4d(dst + s * L::kSlab128 + lane * p.page_size * kSlabRowBytes, tm,
                           s * L::kBoxCols, hk, 0, pg, full, policy);
    }
}

/* Varlen: block c of a tile's sequence, K or V: 128 packed rows from token
 * k0 + 128 c (batch 0). (The fixed mode calls sk90_load_kv directly: a
 * common wrapper changed its SASS; the paged mode, sk90_issue_pages.) */
template <class L>
__device__ __forceinline__ void sk90_load_seq_block(const CUtensorMap *tm, uint32_t dst,
                                                    uint32_t bar, const sk90_seq &sq, int hk,
                                                    int c) {
    const uint64_t policy = sk_policy_evict_last();
    sk_mbar_arrive_expect_tx(bar, L::kBlockBytes);
#pragma unroll
    for (int s = 0; s < L::kSlabs; ++s)
        sk_tma_load_4d(dst + s * L::kSlab128, tm, s * L::kBoxCols, hk, sq.k0 + c * kBlockN, 0, bar,
                       policy);
}

/* Varlen scheduler step (lane 0): the next slot of the plan's order, its
 * row {b, i} and sequence {q0, len_q, k0, len_k}, written to the widened
 * scheduler slot. The plan puts the absent entries (x = -1) last, so the
 * first one ends this CTA's tiles. */
template <class L>
__device__ __forceinline__ int sk90_schedule_varlen(const sk90_params &p, const sk90_vparams &v,
                                                    uint32_t base, uint32_t slot,
                                                    uint32_t phase) {
    int w[9] = {kTileEnd, 0, 0, 0, 0, 0, 0, 0, 0};
    const int idx = atomicAdd(p.tile_counter, 1);
    if (idx < p.num_tiles) {
        const int4 info = __ldg(v.tile_info + idx);
        w[0] = info.x < 0 ? kTileEnd : info.x >= p.num_tiles ? kTileSkip : info.x;
        if (w[0] >= 0) {
            const int2 rw = __ldg(v.rows + w[0] % p.row_blocks);
            if ((unsigned)rw.x >= (unsigned)v.batch || rw.y < 0) {
                w[0] = kTileSkip;
            } else {
                const int4 sq = __ldg(v.seqs + rw.x);
                w[1] = min(max(info.y, 0), p.nnz);
                w[2] = max(min(max(info.z, 0), p.nnz), w[1]);
                w[3] = rw.x;
                w[4] = rw.y;
                w[5] = sq.x;
                w[6] = sq.y;
                w[7] = sq.z;
                w[8] = sq.w;
            }
        }
    }
    volatile int32_t *vs = sk90_shared_ptr<int32_t>(base + L::kVSched) + 16 * slot;
    sk_mbar_wait(base + L::kBarSchedEmpty + 8 * slot, phase ^ 1, "sched empty");
#pragma unroll
    for (int k = 0; k < 9; ++k) vs[k] = w[k];
    sk_mbar_arrive(base + L::kBarSchedFull + 8 * slot); /* release */
    return w[0];
}

/* Pairs (block_q = 64) scheduler step (lane 0): the next even query block
 * of the plan's order (an odd one is skipped: it runs with its partner),
 * both rows' clamped ranges decoded, the second row's into the slot's
 * extension at L::kVSched (fwd_sm90_common.cuh, "Pairs"). */
template <class L>
__device__ __forceinline__ int sk90_schedule_pair(const sk90_params &p, uint32_t base,
                                                  uint32_t slot, uint32_t phase,
                                                  volatile int32_t *sched) {
    int tile;
    do {
        tile = kTileEnd;
        const int idx = atomicAdd(p.tile_counter, 1);
        if (idx < p.order_count) {
            tile = __ldg(p.tile_order + idx);
            if (tile < 0 || tile >= p.num_tiles) tile = kTileSkip;
        }
    } while (tile >= 0 && (tile % p.row_blocks) % 2 != 0);
    int r[4] = {0, 0, 0, 0};
    if (tile >= 0) {
        const sk90_tile a = sk90_decode(p, tile);
        r[0] = a.start;
        r[1] = a.end;
        if (a.i + 1 < p.row_blocks) { /* the partner: same slice, next layout row */
            const sk90_tile b = sk90_decode(p, tile + 1);
            r[2] = b.start;
            r[3] = b.end;
        }
    }
    volatile int32_t *ext = sk90_shared_ptr<int32_t>(base + L::kVSched) + 16 * slot;
    sk_mbar_wait(base + L::kBarSchedEmpty + 8 * slot, phase ^ 1, "sched empty");
    sched[4 * slot + 0] = tile;
    sched[4 * slot + 1] = r[0];
    sched[4 * slot + 2] = r[1];
    ext[0] = r[2];
    ext[1] = r[3];
    sk_mbar_arrive(base + L::kBarSchedFull + 8 * slot); /* release */
    return tile;
}

/* The scheduler warp: takes tiles from the schedule and decodes them (tile
 * id, clamped block range) up to kSchedSlots ahead of the TMA warp, so that
 * the chain of dependent global reads (counter, tile order, row offsets)
 * never sits between two tiles' loads. Lane 0 works; the warp stays
 * converged. L: the shared layout (its kBarSched* barriers); v: the varlen
 * mode's parameters (never read in the fixed mode). */
template <class L, int MODE, bool PAIR = false>
__device__ void sk90_scheduler(const sk90_params &p, const sk90_vparams &v, uint32_t base,
                               volatile int32_t *sched) {
    const int lane = threadIdx.x % 32;
    for (uint32_t n = 0;; ++n) {
        const uint32_t slot = n % kSchedSlots, phase = (n / kSchedSlots) & 1;
        int tile = kTileEnd, start = 0, end = 0;
        if constexpr (MODE != kSk90Fixed) {
            (void)start;
            (void)end;
            if (lane == 0) tile = sk90_schedule_varlen<L>(p, v, base, slot, phase);
        } else if constexpr (PAIR) {
            (void)start;
            (void)end;
            if (lane == 0) tile = sk90_schedule_pair<L>(p, base, slot, phase, sched);
        } else if (lane == 0) {
            const int idx = atomicAdd(p.tile_counter, 1);
            if (idx < p.order_count) {
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

template <int MODE, int BN = kBlockN>
__device__ __forceinline__ bool sk90_cursor_next(const sk90_params &p, const sk90_tile &t,
                                                 sk90_cursor &cur, int *c) {
    const int lane = threadIdx.x % 32;
    while (cur.mask == 0) {
        if (cur.pos >= cur.end) return false;
        const int k = cur.pos + lane;
        cur.cval = k < cur.end ? __ldg(p.col_indices + k) : -1;
        cur.mask = __ballot_sync(0xffffffffu, k < cur.end && sk90_visit<MODE, BN>(p, t, cur.cval));
        cur.pos += 32;
    }
    const int bit = __ffs(cur.mask) - 1;
    cur.mask &= cur.mask - 1;
    *c = __shfl_sync(0xffffffffu, cur.cval, bit);
    return true;
}

/* Pairs: the sorted union of the two rows' visible blocks (each row's
 * cursor, its own causal key limit), each block with the rows that select
 * it (kInfoSel0 / kInfoSel1). Each row's blocks come out in its own order
 * whatever the layout holds, so a warpgroup sees exactly its row's
 * sequence. */
struct sk90_pair_cursor {
    sk90_cursor a, b;
    sk90_tile ta, tb; /* the rows' views: start, end, key limit */
    int ca, cb;       /* each row's next block, when va / vb */
    bool va, vb;
};

template <int BN>
__device__ __forceinline__ void sk90_pair_start(const sk90_params &p, sk90_pair_cursor &pc) {
    pc.a = {pc.ta.start, pc.ta.end, 0u, 0};
    pc.b = {pc.tb.start, pc.tb.end, 0u, 0};
    pc.va = sk90_cursor_next<kSk90Fixed, BN>(p, pc.ta, pc.a, &pc.ca);
    pc.vb = sk90_cursor_next<kSk90Fixed, BN>(p, pc.tb, pc.b, &pc.cb);
}

template <int BN>
__device__ __forceinline__ bool sk90_pair_next(const sk90_params &p, sk90_pair_cursor &pc,
                                               int *c) {
    if (!pc.va && !pc.vb) return false;
    const int k = !pc.vb ? pc.ca : !pc.va ? pc.cb : min(pc.ca, pc.cb);
    const bool in_a = pc.va && pc.ca == k, in_b = pc.vb && pc.cb == k;
    *c = k | (in_a ? kInfoSel0 : 0) | (in_b ? kInfoSel1 : 0);
    if (in_a) pc.va = sk90_cursor_next<kSk90Fixed, BN>(p, pc.ta, pc.a, &pc.ca);
    if (in_b) pc.vb = sk90_cursor_next<kSk90Fixed, BN>(p, pc.tb, pc.b, &pc.cb);
    return true;
}

/* The TMA warp: per tile, Q, then K_0, K_1, V_0, K_2, V_1, ... Lane 0 waits
 * on the barriers and issues the copies; the whole warp reads the layout.
 * With L::kTransposeV (the FP8 kernel), each V stage also carries a word
 * for the transposer warps in v_info (0), and after the last tile one more
 * V stage, a plain arrival with no bytes, carries kVInfoEnd: the
 * transposer sees no tiles, so that is how it learns the end. v: the
 * varlen mode's parameters (never read in the fixed mode). */
template <class L, int MODE, bool PAIR = false>
__device__ void sk90_producer(const sk90_params &p, const sk90_vparams &v, uint32_t base,
                              int32_t *tile_ids,
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
    /* Paged: per K stage, the boxes not loaded (read by the consumers). */
    volatile int32_t *absent = nullptr;
    if constexpr (MODE == kSk90Paged) absent = sk90_shared_ptr<int32_t>(base + L::kVAbsent);
    (void)absent;
    for (uint32_t n = 0;; ++n) {
        const uint32_t sslot = n % kSchedSlots, sphase = (n / kSchedSlots) & 1;
        /* every lane: acquire */
        sk_mbar_wait(base + L::kBarSchedFull + 8 * sslot, sphase, "sched full");
        /* The lane that releases the slot reads it and shares it, so the
         * read is ordered before the scheduler's next write by that lane's
         * own arrival (which racecheck can follow). */
        int v0 = 0, v1 = 0, v2 = 0;
        if (lead) {
            if constexpr (MODE == kSk90Fixed) {
                v0 = sched[4 * sslot + 0];
                v1 = sched[4 * sslot + 1];
                v2 = sched[4 * sslot + 2];
            } else {
                const volatile int32_t *vs =
                    sk90_shared_ptr<int32_t>(base + L::kVSched) + 16 * sslot;
                v0 = vs[0];
                v1 = vs[1];
                v2 = vs[2];
            }
        }
        const int tile = __shfl_sync(0xffffffffu, v0, lead_lane);
        sk90_tile t = sk90_tile_coords(p, tile >= 0 ? tile : 0);
        t.start = __shfl_sync(0xffffffffu, v1, lead_lane);
        t.end = __shfl_sync(0xffffffffu, v2, lead_lane);
        t.key_limit = min((t.i + 1) * kBlockM, p.seq_q) - 1 + (p.seq_k - p.seq_q);
        sk90_seq sq = {0, 0, 0, 0, 0}; /* varlen / paged only */
        (void)sq;
        if constexpr (MODE != kSk90Fixed) {
            /* The sequence, read by the same lane before the same release. */
            const volatile int32_t *vs = sk90_shared_ptr<int32_t>(base + L::kVSched) + 16 * sslot;
            int w[6] = {0, 0, 0, 0, 0, 0};
            if (lead) {
#pragma unroll
                for (int k = 0; k < 6; ++k) w[k] = vs[3 + k];
            }
#pragma unroll
            for (int k = 0; k < 6; ++k) w[k] = __shfl_sync(0xffffffffu, w[k], lead_lane);
            t.i = w[1];
            sq = sk90_tile_seq(p, t, w[0], w[2], w[3], w[4], w[5]);
        }
        /* Pairs: the second row's range, read by the same lane before the
         * same release; the rows' key limits; t.i becomes the pair (the Q
         * load's 128 rows from 128 t.i). */
        sk90_pair_cursor pc;
        (void)pc;
        if constexpr (PAIR) {
            const volatile int32_t *ext = sk90_shared_ptr<int32_t>(base + L::kVSched) + 16 * sslot;
            int e0 = 0, e1 = 0;
            if (lead) {
                e0 = ext[0];
                e1 = ext[1];
            }
            pc.ta = t;
            pc.ta.key_limit = sk90_key_limit64(p, t.i);
            pc.tb = t;
            pc.tb.start = __shfl_sync(0xffffffffu, e0, lead_lane);
            pc.tb.end = __shfl_sync(0xffffffffu, e1, lead_lane);
            pc.tb.key_limit = sk90_key_limit64(p, t.i + 1);
            if (tile < 0) pc.ta.end = pc.ta.start, pc.tb.end = pc.tb.start;
            t.i >>= 1;
        }
        __syncwarp();
        if (lead) sk_mbar_arrive(base + L::kBarSchedEmpty + 8 * sslot);

        sk90_cursor cur = {t.start, tile >= 0 ? t.end : t.start, 0u, 0};
        (void)cur; /* pairs: pc instead */
        int c0 = 0, c1 = 0;
        bool has0;
        if constexpr (PAIR) {
            sk90_pair_start<L::kBN>(p, pc);
            has0 = sk90_pair_next<L::kBN>(p, pc, &c0);
        } else {
            has0 = sk90_cursor_next<MODE, L::kBN>(p, t, cur, &c0);
        }
        /* Paged: lane j's pages of blocks c0, c1 and c2 (sk90_page_of_lane),
         * each read a block before its K load; c0's under the tile-slot and
         * Q waits. */
        int pg0 = -1, pg1 = -1, pg2 = -1;
        (void)pg0, (void)pg1, (void)pg2;
        if constexpr (MODE == kSk90Paged && SK90_PAGE_LOOKAHEAD)
            if (has0) pg0 = sk90_page_of_lane(v, sq, c0);
        /* The consumers learn from the slot whether the tile has blocks, and
         * later each block's index from its K stage: they read no layout. */
        const int slot_value = tile >= 0 && !has0 ? kTileEmptyBase - tile : tile;
        const uint32_t slot = n % kTileSlots, slot_phase = (n / kTileSlots) & 1;
        if (lead) {
            sk_mbar_wait(base + L::kBarTileEmpty + 8 * slot, slot_phase ^ 1, "tile empty");
            *(volatile int32_t *)(tile_ids + slot) = slot_value;
            if constexpr (MODE != kSk90Fixed) {
                /* The consumers' view of the sequence: {q0, len_q, len_k, i}. */
                volatile int32_t *vt = sk90_shared_ptr<int32_t>(base + L::kVTile) + 4 * slot;
                vt[0] = sq.q0;
                vt[1] = sq.len_q;
                vt[2] = sq.len_k;
                vt[3] = t.i;
            }
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
                               s * L::kBoxCols, t.h,
                               MODE == kSk90Fixed ? t.i * kBlockM : sq.q0 + t.i * kBlockM, t.b,
                               base + L::kBarQFull + 8 * qp.stage, stream);
        }
        qp.advance();

        /* K_0, then K_{j+1} before V_j: a consumer's step j needs K_{j+1}
         * for its S GEMM before V_j for its P V GEMM. Each K stage carries
         * its block index and whether another block follows (written before
         * the stage's arrival, which releases it). */
        bool has1;
        if constexpr (PAIR)
            has1 = sk90_pair_next<L::kBN>(p, pc, &c1);
        else
            has1 = sk90_cursor_next<MODE, L::kBN>(p, t, cur, &c1);
        if constexpr (MODE == kSk90Paged) {
            if (SK90_PAGE_LOOKAHEAD && has1) pg1 = sk90_page_of_lane(v, sq, c1);
            sk90_issue_pages<L>(v, &p.tm_k, base + L::kK + kp.stage * L::kBlockBytes,
                                base + L::kBarKFull + 8 * kp.stage,
                                base + L::kBarKEmpty + 8 * kp.stage, kp.phase, pg0, sq, c0, hk,
                                lead,
                                block_info + kp.stage, c0 | (has1 ? kInfoMore : 0),
                                absent + kp.stage, "K empty");
        } else if (lead) {
            sk_mbar_wait(base + L::kBarKEmpty + 8 * kp.stage, kp.phase ^ 1, "K empty");
            block_info[kp.stage] = c0 | (has1 ? kInfoMore : 0);
            if constexpr (MODE == kSk90Fixed)
                sk90_load_kv<L>(&p.tm_k, base + L::kK + kp.stage * L::kBlockBytes,
                                base + L::kBarKFull + 8 * kp.stage, hk,
                                PAIR ? c0 & kInfoBlock : c0, t.b);
            else
                sk90_load_seq_block<L>(&p.tm_k, base + L::kK + kp.stage * L::kBlockBytes,
                                       base + L::kBarKFull + 8 * kp.stage, sq, hk, c0);
        }
        kp.advance();
        for (;;) {
            int c2 = 0;
            bool has2 = false;
            if (has1) {
                if constexpr (PAIR)
                    has2 = sk90_pair_next<L::kBN>(p, pc, &c2);
                else
                    has2 = sk90_cursor_next<MODE, L::kBN>(p, t, cur, &c2);
                if constexpr (MODE == kSk90Paged) {
                    if (SK90_PAGE_LOOKAHEAD && has2) pg2 = sk90_page_of_lane(v, sq, c2);
                    sk90_issue_pages<L>(v, &p.tm_k, base + L::kK + kp.stage * L::kBlockBytes,
                                        base + L::kBarKFull + 8 * kp.stage,
                                        base + L::kBarKEmpty + 8 * kp.stage, kp.phase, pg1, sq,
                                        c1, hk, lead, block_info + kp.stage,
                                        c1 | (has2 ? kInfoMore : 0), absent + kp.stage,
                                        "K empty");
                } else if (lead) {
                    sk_mbar_wait(base + L::kBarKEmpty + 8 * kp.stage, kp.phase ^ 1, "K empty");
                    block_info[kp.stage] = c1 | (has2 ? kInfoMore : 0);
                    if constexpr (MODE == kSk90Fixed)
                        sk90_load_kv<L>(&p.tm_k, base + L::kK + kp.stage * L::kBlockBytes,
                                        base + L::kBarKFull + 8 * kp.stage, hk,
                                        PAIR ? c1 & kInfoBlock : c1, t.b);
                    else
                        sk90_load_seq_block<L>(&p.tm_k, base + L::kK + kp.stage * L::kBlockBytes,
                                               base + L::kBarKFull + 8 * kp.stage, sq, hk, c1);
                }
                kp.advance();
            }
            if constexpr (MODE == kSk90Paged) {
                sk90_issue_pages<L>(v, &p.tm_v, base + L::kV + vp.stage * L::kBlockBytes,
                                    base + L::kBarVFull + 8 * vp.stage,
                                    base + L::kBarVEmpty + 8 * vp.stage, vp.phase, pg0, sq, c0,
                                    hk, lead, NULL, 0, NULL, "V empty");
            } else if (lead) {
                sk_mbar_wait(base + L::kBarVEmpty + 8 * vp.stage, vp.phase ^ 1, "V empty");
                if constexpr (L::kTransposeV) v_info[vp.stage] = 0;
                if constexpr (MODE == kSk90Fixed && L::kVtDirect)
                    sk90_load_vt<L>(&p.tm_v, base + L::kV + vp.stage * L::kBlockBytes,
                                    base + L::kBarVFull + 8 * vp.stage, hk,
                                    PAIR ? c0 & kInfoBlock : c0, t.b);
                else if constexpr (MODE == kSk90Fixed)
                    sk90_load_kv<L>(&p.tm_v, base + L::kV + vp.stage * L::kBlockBytes,
                                    base + L::kBarVFull + 8 * vp.stage, hk,
                                    PAIR ? c0 & kInfoBlock : c0, t.b);
                else
                    sk90_load_seq_block<L>(&p.tm_v, base + L::kV + vp.stage * L::kBlockBytes,
                                           base + L::kBarVFull + 8 * vp.stage, sq, hk, c0);
            }
            vp.advance();
            __syncwarp();
            if (!has1) break;
            c0 = c1;
            c1 = c2;
            has1 = has2;
            if constexpr (MODE == kSk90Paged) {
                pg0 = pg1; /* the block's V still to load */
                pg1 = pg2;
                pg2 = -1;
            }
        }
    }
}

#endif /* SK_CUDA_ATTENTION_FWD_SM90_PRODUCER_CUH */
