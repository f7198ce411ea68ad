/*
 * fwd_sm90_pair.cuh - the block steps of a consumer warpgroup when a tile
 * is two 64-row query blocks (block_q = 64; fwd_sm90_common.cuh, "Pairs"):
 * warpgroup h owns query block 2i + h and computes only the key blocks its
 * own row selected, out of the sorted union of both rows' blocks that the
 * producer streams. Included by fwd_sm90_body.cuh after
 * fwd_sm90_consumer.cuh (whose helpers it uses and whose sk90_consumer
 * calls it, the tile intake and the epilogue being the same), and by
 * fwd_sm90_fp8.cu, whose consumer runs the same turns (sk90_pair_walk)
 * with its own GEMMs and P packing (sk98_pair_ops).
 *
 * Why every step is a turn. The two warpgroups take turns issuing GEMMs
 * (kBarTurn0 / kBarTurn1), strictly alternating, so both must take the
 * same number of turns per tile: one per union block j, and one after the
 * last, n + 1 in all (as the 128-row kernel's prologue, steady steps and
 * tail). Turn j of a warpgroup issues S_j = Q K_j^T if its row selected
 * block j, and O += P_{j-1} V_{j-1} if its row selected block j - 1:
 *   both     the steady step (S_j with P_{j-1} V_{j-1} in flight);
 *   S only   the prologue's S alone (O keeps its earlier blocks);
 *   PV only  the tail's last P V alone;
 *   neither  an empty turn (the barriers only).
 * Each variant is written out and waits for all its GEMMs before the turn
 * ends (ptxas serializes wgmma issued under run-time conditions inside one
 * sequence; here no wgmma is in flight across the branch). O is rescaled
 * for the previous block's max right before each P V (the D = 128 order of
 * sk90_consumer, at both head dims). Every K and V stage is released by
 * both warpgroups, used or not (a stage skipped is released once its load
 * landed, so no TMA write can overlap the next load into it), and the Q
 * buffer once per tile at the last block, so the producer's barriers see
 * the same arrivals as in the 128-row kernel. A row that selects nothing
 * keeps m = -inf, l = 0: its O = 0 and LSE = -inf, as an empty tile's.
 *
 * The skipped V stage. A V stage is freed by one arrival per warpgroup,
 * its leader's, while every thread waits for the stage's phase itself.
 * Where the P V GEMM reads the stage, that wait comes before the turn's
 * bar.sync, which holds all four warps, so the leader's later arrival
 * follows every warp's wait. A stage this row skips is waited for after
 * the turn; were the leader to free it at once, a warp still behind (its
 * softmax, a scheduling gap) could reach its own wait after the producer
 * had refilled the stage and that load had landed: the barrier then
 * stands two phases past the one the warp waits for, its parity reads
 * "not yet", and the warp waits for good, holding its next K release,
 * so the producer stops too (the hang of 64 x 128, docs/perf/hopper.md,
 * "The pair kernel's hang"). So the warpgroup meets at its own barrier
 * between the waits and the leader's arrival. python/tests/
 * test_fwd90_pair_protocol.py models the protocol with lagging warps.
 */
#ifndef SK_CUDA_ATTENTION_FWD_SM90_PAIR_CUH
#define SK_CUDA_ATTENTION_FWD_SM90_PAIR_CUH

/* The GEMMs and register steps of a block, by kernel: the fp16 / bf16
 * kernel's (here) or the FP8 one's (sk98_pair_ops, fwd_sm90_fp8_consumer.cuh),
 * so that one walk of the turns (sk90_pair_walk) serves both. kS, kP: S
 * and P registers per thread; kOffset: the softmax's 2^kOffset. */
template <sk_dtype DT, int HD, int BN>
struct sk90_pair_ops {
    static constexpr int kS = BN / 2, kP = BN / 4, kOffset = 0;
    __device__ __forceinline__ void qk(float *s, uint32_t q, uint32_t k) const {
        sk90_gemm_qk<DT, HD, BN>(s, q, k);
    }
    __device__ __forceinline__ void pv(float *o, const uint32_t *pf, uint32_t v) const {
        sk90_gemm_pv<DT, HD, BN>(o, pf, v);
    }
    __device__ __forceinline__ void prepare(float *s, const sk90_params &p, int c,
                                            int wg_first_row, int row0, int t4) const {
        sk90_mask_block<BN>(s, p, c, wg_first_row, row0, t4);
    }
    __device__ __forceinline__ void pack(uint32_t *pf, const float *s) const {
        sk90_pack_p<DT, kS>(pf, s);
    }
    __device__ __forceinline__ void fence(float *o, uint32_t *pf) const {
        sk90_fence_operands<HD, kP>(o, pf);
    }
};

/* O rescaled for block j - 1's max, then O += P_{j-1} V_{j-1} issued (after
 * the fences that order the rescale and P before the wgmma reads them). */
template <int HD, class OPS>
__device__ __forceinline__ void sk90_pair_issue_pv(const OPS &ops, float o[HD / 2], uint32_t *pf,
                                                   const float corr[2], uint32_t v_stage) {
#pragma unroll
    for (int i = 0; i < HD / 2; ++i) o[i] *= corr[(i >> 1) & 1];
    ops.fence(o, pf);
    sk_wgmma_fence();
    ops.pv(o, pf, v_stage);
}

/* The turns of one tile (the header) on layout L: K stages at L::kK, the
 * P V operand's stages at L::kPv (V, or the FP8 kernel's Vt). */
template <class L, int HD, class OPS>
__device__ __forceinline__ void sk90_pair_walk(
    const sk90_params &p, const OPS &ops, float scale_log2, uint32_t base,
    const volatile int32_t *block_info, int wg, uint32_t q_base, uint32_t q_empty,
    sk90_pipe<L::kKStages> &kp, sk90_pipe<L::kPvStages> &vp, float o[HD / 2], float m[2],
    float l[2], int wg_first_row, int row0) {
    constexpr int kS = OPS::kS, kP = OPS::kP;
    const int wtid = threadIdx.x % 128, lane = wtid % 32, t4 = lane % 4;
    const bool leader = wtid == 0;
    const uint32_t bar_mine = wg == 0 ? kBarTurn0 : kBarTurn1;
    const uint32_t bar_other = wg == 0 ? kBarTurn1 : kBarTurn0;
    /* The warpgroup's own barrier: its epilogue's (both are syncs of its
     * four warps in program order, so they share the id safely). */
    const uint32_t bar_wg = wg == 0 ? kBarEpilogue0 : kBarEpilogue1;
    const int32_t sel = wg == 0 ? kInfoSel0 : kInfoSel1;
    float s[kS];
    uint32_t pf[kP];
    float corr[2] = {1.0f, 1.0f};
    bool more = true;       /* block j exists (a tile with blocks has block 0) */
    bool prev_mine = false; /* this row selected block j - 1: P_{j-1} waits in pf */
    bool has_prev = false;  /* block j - 1 exists: its V stage is to release */
    for (;;) {
        int info = 0;
        bool mine = false;
        if (more) {
            sk_mbar_wait(base + L::kBarKFull + 8 * kp.stage, kp.phase, "K full");
            info = sk90_read_info(block_info, kp.stage, lane);
            mine = (info & sel) != 0;
        }
        if (prev_mine) sk_mbar_wait(base + L::kBarPvFull + 8 * vp.stage, vp.phase, "V full");
        const uint32_t k_stage = base + L::kK + kp.stage * L::kBlockBytes;
        const uint32_t v_stage = base + L::kPv + vp.stage * L::kPvBytes;
        const bool last = more && !(info & kInfoMore);
        const int c = info & kInfoBlock;
        sk_bar_sync(bar_mine, 256);
        if (mine && prev_mine) {
            ops.fence(o, pf);
            sk_wgmma_fence();
            ops.qk(s, q_base, k_stage);
            sk90_pair_issue_pv<HD>(ops, o, pf, corr, v_stage);
            sk_bar_arrive(bar_other, 256);
            sk_wgmma_wait<1>(); /* S_j done; P V still running */
#pragma unroll
            for (int i = 0; i < kS; ++i) sk_reg_fence(s[i]);
            sk90_release_k(base + L::kBarKEmpty + 8 * kp.stage, lane);
            if (leader && last) sk_mbar_arrive(q_empty);
            ops.prepare(s, p, c, wg_first_row, row0, t4);
            sk90_softmax<OPS::kOffset, kS>(s, m, l, corr, scale_log2);
            sk_wgmma_wait<0>(); /* P_{j-1} V_{j-1} done */
            ops.fence(o, pf);
            if (leader) sk_mbar_arrive(base + L::kBarPvEmpty + 8 * vp.stage);
            ops.pack(pf, s);
        } else if (mine) {
            sk_wgmma_fence();
            ops.qk(s, q_base, k_stage);
            sk_bar_arrive(bar_other, 256);
            sk_wgmma_wait<0>();
#pragma unroll
            for (int i = 0; i < kS; ++i) sk_reg_fence(s[i]);
            sk90_release_k(base + L::kBarKEmpty + 8 * kp.stage, lane);
            if (leader && last) sk_mbar_arrive(q_empty);
            ops.prepare(s, p, c, wg_first_row, row0, t4);
            sk90_softmax<OPS::kOffset, kS>(s, m, l, corr, scale_log2); /* corr: at its P V */
            ops.pack(pf, s);
        } else if (prev_mine) {
            sk90_pair_issue_pv<HD>(ops, o, pf, corr, v_stage);
            sk_bar_arrive(bar_other, 256);
            sk_wgmma_wait<0>();
            ops.fence(o, pf);
            if (leader) sk_mbar_arrive(base + L::kBarPvEmpty + 8 * vp.stage);
        } else {
            sk_bar_arrive(bar_other, 256);
        }
        /* The stages this row did not read: released once loaded. */
        if (more && !mine) {
            sk90_release_k(base + L::kBarKEmpty + 8 * kp.stage, lane);
            if (leader && last) sk_mbar_arrive(q_empty);
        }
        if (has_prev && !prev_mine) {
            sk_mbar_wait(base + L::kBarPvFull + 8 * vp.stage, vp.phase, "V full");
            /* Every warp of the warpgroup waits before its leader frees the
             * stage (the header, "The skipped V stage"). */
            sk_bar_sync(bar_wg, 128);
            if (leader) sk_mbar_arrive(base + L::kBarPvEmpty + 8 * vp.stage);
        }
        if (has_prev) vp.advance();
        if (!more) break;
        kp.advance();
        has_prev = true;
        prev_mine = mine;
        more = (info & kInfoMore) != 0;
    }
}

template <sk_dtype DT, int HD, int BN>
__device__ __forceinline__ void sk90_pair_steps(
    const sk90_params &p, uint32_t base, const volatile int32_t *block_info, int wg,
    uint32_t q_base, uint32_t q_empty, sk90_pipe<sk90_layout<HD, kSk90Fixed, BN>::kKStages> &kp,
    sk90_pipe<sk90_layout<HD, kSk90Fixed, BN>::kVStages> &vp, float o[HD / 2], float m[2],
    float l[2], int wg_first_row, int row0) {
    const sk90_pair_ops<DT, HD, BN> ops;
    sk90_pair_walk<sk90_layout<HD, kSk90Fixed, BN>, HD>(p, ops, p.scale_log2, base, block_info,
                                                        wg, q_base, q_empty, kp, vp, o, m, l,
                                                        wg_first_row, row0);
}

#endif /* SK_CUDA_ATTENTION_FWD_SM90_PAIR_CUH */
