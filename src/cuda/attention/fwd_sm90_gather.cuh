/*
 * fwd_sm90_gather.cuh - the paged Hopper kernel's two additions of phase 3
 * (included by fwd_sm90_producer.cuh, after fwd_sm90_common.cuh; used only
 * in paged mode, sk90_pparams):
 *
 *   - The gather of small pages. Warp 2 of the producer warpgroup copies the
 *     K blocks, warp 3 the V blocks, with cp.async 16-byte vectors straight
 *     into the stage, in the 128-byte swizzle a TMA box writes (row r, 16-byte
 *     chunk c of 64-column slab s at s * 16 KB + sk_sw128_offset(r, c % 8)),
 *     so the consumers read the same bytes at the same places. The TMA warp
 *     keeps the walk, the page look-ahead, the stage waits and the block
 *     info / absent mask; per block it writes a record {hk, rows below len_k,
 *     pages} and arrives on the stage's record barrier. The gather warp
 *     copies rows of loaded pages below len_k and zero-fills (source size
 *     0) the others (a page not loaded, rows at or past len_k: rows the
 *     consumers mask and zero anyway), waits for its copies
 *     (cp.async.wait_group 0), orders them before wgmma's reads
 *     (fence.proxy.async: cp.async writes through the generic proxy, wgmma
 *     reads through the async one) and makes the one arrival the stage's
 *     full barrier expects (count 1, as the TMA path's). A record with hk <
 *     0 ends the warp. Record reuse: the TMA warp writes a stage's record
 *     only after that stage's empty wait, which follows the consumers'
 *     full wait, which follows the gather warp's reads of the previous
 *     record (before its arrival).
 *   - The TLB warm-up: a prefetch of each page of K and V of a block
 *     SK90_TLB_PREFETCH blocks ahead, through the path of the loads that
 *     will follow (the TMA unit's tensor prefetch of the page's first box,
 *     or an ordinary one-line L2 prefetch for the gather). Pages as the
 *     load path chooses them (sk90_page_of_lane): never an address outside
 *     the cache.
 */
#ifndef SK_CUDA_ATTENTION_FWD_SM90_GATHER_CUH
#define SK_CUDA_ATTENTION_FWD_SM90_GATHER_CUH

/* Paged, gather: the TMA warp's hand-off of block c to the gather warp (the
 * whole warp; after the lead's wait for the free stage). pg is lane j's
 * page of the block (-1: none), shared with the lead by shuffles. */
__device__ __forceinline__ void sk90_gather_post(uint32_t rec_bar, uint32_t rec, int pg, int hk,
                                                 int valid, bool lead) {
    volatile int32_t *r = sk90_shared_ptr<int32_t>(rec);
#pragma unroll
    for (int j = 0; j < kBlockN / 16; ++j) {
        const int pj = __shfl_sync(0xffffffffu, pg, j);
        if (lead) r[2 + j] = pj;
    }
    if (lead) {
        r[0] = hk;
        r[1] = valid;
        sk_mbar_arrive(rec_bar); /* release: the record, the block info, the absent mask */
    }
}

/* Paged, gather: the lead's last records (hk = -1) for both gather warps,
 * each in the next stage of its pipeline after that stage's empty wait. */
template <class L>
__device__ __forceinline__ void sk90_gather_end(uint32_t base, uint32_t ks, uint32_t kphase,
                                                uint32_t vs, uint32_t vphase) {
    sk_mbar_wait(base + L::kBarKEmpty + 8 * ks, kphase ^ 1, "K empty");
    *sk90_shared_ptr<volatile int32_t>(base + L::kPRec + L::kPRecBytes * ks) = -1;
    sk_mbar_arrive(base + L::kPBar + 8 * ks);
    sk_mbar_wait(base + L::kBarVEmpty + 8 * vs, vphase ^ 1, "V empty");
    const uint32_t v_at = L::kKStages + vs;
    *sk90_shared_ptr<volatile int32_t>(base + L::kPRec + L::kPRecBytes * v_at) = -1;
    sk_mbar_arrive(base + L::kPBar + 8 * v_at);
}

/* Paged, gather: warp 2 (K: IS_V false) or 3 (V), until the end record.
 * Lane l copies 16-byte chunk l % (HD / 8) of the rows l / (HD / 8) + k *
 * 32 / (HD / 8), so a warp instruction covers whole row segments (the
 * boxes' transactions). Rows of a page not loaded, or at or past len_k, are
 * zero-filled (source size 0, the cache base as address). */
template <class L, int HD, bool IS_V>
__device__ void sk90_gather_warp(const sk90_vparams &v, const sk90_pparams &g, uint32_t base) {
    constexpr int kChunks = HD / 8;     /* 16-byte chunks per row */
    constexpr int kRows = 32 / kChunks; /* rows per warp instruction: 2 (D 128) or 4 */
    constexpr int kStages = IS_V ? L::kVStages : L::kKStages;
    constexpr uint32_t kFirst = IS_V ? L::kKStages : 0; /* its records and record barriers */
    const int lane = threadIdx.x % 32;
    const int chunk = lane % kChunks, sub = lane / kChunks;
    const uint32_t dst0 = base + (IS_V ? L::kV : L::kK) + (chunk / 8) * L::kSlab128;
    uint32_t stage = 0, phase = 0;
    for (;;) {
        sk_mbar_wait(base + L::kPBar + 8 * (kFirst + stage), phase, "gather record");
        const volatile int32_t *r = sk90_shared_ptr<const volatile int32_t>(
            base + L::kPRec + L::kPRecBytes * (kFirst + stage));
        const int hk = r[0];
        if (hk < 0) break;
        const int valid = r[1];
        const uint32_t dst = dst0 + stage * L::kBlockBytes;
        const char *cache = IS_V ? g.v_cache : g.k_cache;
        const uint64_t policy = sk_policy_evict_last(); /* K/V: reread by the head's tiles */
        for (int row = sub; row < kBlockN; row += kRows) {
            const int pg = r[2 + (row >> v.page_shift)]; /* a broadcast read */
            const bool ok = (unsigned)pg < (unsigned)v.num_pages && row < valid;
            const char *src = cache;
            if (ok)
                src += pg * (IS_V ? g.v_page : g.k_page) + hk * (IS_V ? g.v_head : g.k_head) +
                       (row & (v.page_size - 1)) * (IS_V ? g.v_slot : g.k_slot) + chunk * 16;
            sk_cp_async_16_hint(dst + sk_sw128_offset(row, chunk % 8), src, ok ? 16u : 0u,
                                policy);
        }
        sk_cp_async_commit();
        sk_cp_async_wait<0>();
        sk_fence_proxy_async_smem(); /* the copies before wgmma's async-proxy reads */
        __syncwarp();
        if (lane == 0) sk_mbar_arrive(base + (IS_V ? L::kBarVFull : L::kBarKFull) + 8 * stage);
        if (++stage == (uint32_t)kStages) {
            stage = 0;
            phase ^= 1;
        }
    }
}

/* Paged, TLB warm-up: lane j's queued page (read a step earlier, so the
 * prefetch does not wait for the table read) prefetched in K and V at head
 * hk; a page outside [0, num_pages) or none (-1) is skipped. GATHER: the
 * line of slot 0 (prefetch.global.L2, the cp.async's path); TMA: the page's
 * first 64-column box through the same map (the TMA unit's translations;
 * its rows are the box the block's K / V load reads two steps later, so
 * the L2 gets them early too, and no 64-bit address is formed: the TMA
 * warp has no registers to spare at D = 128). */
template <bool GATHER>
__device__ __forceinline__ void sk90_tlb_prefetch(const sk90_params &p, const sk90_vparams &v,
                                                  const sk90_pparams &g, int pg, int hk) {
    if ((unsigned)pg >= (unsigned)v.num_pages) return;
    if constexpr (GATHER) {
        sk_prefetch_l2(g.k_cache + pg * g.k_page + hk * g.k_head);
        sk_prefetch_l2(g.v_cache + pg * g.v_page + hk * g.v_head);
    } else {
        (void)g;
        sk_tma_prefetch_4d(&p.tm_k, 0, hk, 0, pg);
        sk_tma_prefetch_4d(&p.tm_v, 0, hk, 0, pg);
    }
}

#endif /* SK_CUDA_ATTENTION_FWD_SM90_GATHER_CUH */
