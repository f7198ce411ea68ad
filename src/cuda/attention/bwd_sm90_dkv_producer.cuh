/*
 * bwd_sm90_dkv_producer.cuh - the producer of the Hopper dK/dV kernel
 * (bwd_sm90_dkv.cu, which alone includes it, after its shared-memory
 * layout and parameters): the walk of the key block's T row and the TMA
 * loads of each 64-row query tile (Q, dO, lse2, Dl) through the ring, then
 * the end marks. The walk's rules are the ones the fused form's K
 * clean-up repeats (bwd_sm90_dkv_dq.cuh).
 */
#ifndef SK_CUDA_ATTENTION_BWD_SM90_DKV_PRODUCER_CUH
#define SK_CUDA_ATTENTION_BWD_SM90_DKV_PRODUCER_CUH

/* ---------------------------------------------------------------------------
 * Producer
 * ------------------------------------------------------------------------- */

/* One stage: the tile's first row for the consumers, then its Q, dO, lse2
 * and Dl, all counted on the stage's full barrier. Lead lane only. */
template <int kD, int kKeyWgs, bool kFuse>
__device__ __forceinline__ void sk_bwd90kv_load_tile(const sk_bwd90kv_params &P, uint32_t base,
                                                     uint32_t stage, int32_t b, int32_t h,
                                                     int32_t q0) {
    using L = sk_bwd90kv_smem<kD, kKeyWgs, kFuse>;
    const sk_bwd_params &p = P.p;
    const uint32_t full = base + L::kBarFull + 8 * stage;
    const uint32_t q_dst = base + L::kStage0 + stage * L::kStageBytes;
    const uint32_t rows = base + L::kRows + stage * L::kRowBytes;
    /* Q and dO: every key block of the KV head rereads them. */
    const uint64_t keep = sk_policy_evict_last();
    sk90_shared_ptr<volatile int32_t>(base + L::kInfo)[stage] = q0;
    if constexpr (kFuse) sk90_shared_ptr<volatile int32_t>(base + L::kInfoH)[stage] = h;
    sk_mbar_arrive_expect_tx(full, L::kStageBytes + L::kRowBytes);
#pragma unroll
    for (int s = 0; s < L::kSlabs; ++s) {
        sk_tma_load_4d(q_dst + s * L::kQSlab, &P.tm_q, s * 64, h, q0, b, full, keep);
        sk_tma_load_4d(q_dst + L::kTileBytes + s * L::kQSlab, &P.tm_do, s * 64, h, q0, b, full,
                       keep);
    }
    /* The pre-pass rows, padded to 64 (256-byte aligned: sq_pad and q0 are
     * multiples of 64, the workspace parts of 256). */
    const int64_t row = ((int64_t)b * p.heads_q + h) * p.sq_pad + q0;
    sk_bulk_load(rows, p.lse2 + row, kBkvRows * 4, full);
    sk_bulk_load(rows + kBkvRows * 4, p.dl + row, kBkvRows * 4, full);
}

/* The walk of T row [start, end) for key block kt .. (bwd_kernels.h), in
 * the portable kernel's order: repetition, entry, 64-row query tile.
 * Entries outside [0, t_group * row_blocks) are skipped (a stale plan stays
 * in bounds). Lead lane only. */
template <int kD, int kKeyWgs, bool kFuse>
__device__ void sk_bwd90kv_produce(const sk_bwd90kv_params &P, uint32_t base, int32_t b, int32_t hk,
                                   int32_t kt, int32_t start, int32_t end) {
    using L = sk_bwd90kv_smem<kD, kKeyWgs, kFuse>;
    const sk_bwd_params &p = P.p;
    const int32_t qsubs = p.block_q / kBkvRows, entries = p.t_group * p.row_blocks;
    sk90_pipe<L::kStages> pipe = {0, 0};
    bool kv = false;
    for (int32_t rep = 0; rep < p.t_reps; ++rep) {
        for (int32_t pos = start; pos < end; ++pos) {
            const int32_t e = __ldg(p.t_entries + pos);
            if ((uint32_t)e >= (uint32_t)entries) continue;
            const int32_t hl = e / p.row_blocks, i = e - hl * p.row_blocks;
            const int32_t h = hk * p.group + rep * p.t_group + hl;
            for (int32_t qt = 0; qt < qsubs; ++qt) {
                const int32_t q0 = i * p.block_q + qt * kBkvRows;
                if (q0 >= p.seq_q) break;
                if (p.causal && kt > min(q0 + kBkvRows, p.seq_q) - 1 + p.diag) continue;
                if (!kv) { /* K and V, once: read by this CTA alone */
                    const uint64_t once = sk_policy_evict_first();
                    const uint32_t bar = base + L::kBarKv;
                    sk_mbar_arrive_expect_tx(bar, 2 * L::kKvBytes);
#pragma unroll
                    for (int s = 0; s < L::kSlabs; ++s) {
                        sk_tma_load_4d(base + L::kK + s * L::kKvSlab, &P.tm_k, s * 64, hk, kt, b,
                                       bar, once);
                        sk_tma_load_4d(base + L::kV + s * L::kKvSlab, &P.tm_v, s * 64, hk, kt, b,
                                       bar, once);
                    }
                    kv = true;
                }
                sk_mbar_wait(base + L::kBarEmpty + 8 * pipe.stage, pipe.phase ^ 1, "dkv empty");
                sk_bwd90kv_load_tile<kD, kKeyWgs, kFuse>(P, base, pipe.stage, b, h, q0);
                pipe.advance();
            }
        }
    }
    /* The end mark, for each warpgroup's sequence of stages. */
    for (int k = 0; k < (kKeyWgs == 2 ? 1 : 2); ++k) {
        sk_mbar_wait(base + L::kBarEmpty + 8 * pipe.stage, pipe.phase ^ 1, "dkv empty");
        sk90_shared_ptr<volatile int32_t>(base + L::kInfo)[pipe.stage] = kBkvEnd;
        sk_mbar_arrive(base + L::kBarFull + 8 * pipe.stage); /* release, no bytes */
        pipe.advance();
    }
}

#endif /* SK_CUDA_ATTENTION_BWD_SM90_DKV_PRODUCER_CUH */
