/*
 * bwd_sm90_dkv_dq.cuh - the fused dQ of the Hopper dK/dV kernel
 * (bwd_sm90_dkv.cu with kFuse; bwd->deterministic = 0): per tile, each
 * consumer warpgroup stores its dS^T to shared memory, and dQ of the tile's
 * 64 queries, dQ = dS K summed over the tile's keys, is added into the fp32
 * dQaccum [B * Hq, sq_pad, D] of the workspace (element order:
 * bwd_dqacc.cuh), by bulk reduce-adds of staged 64 x 64 tiles
 * (SK_BWD90_DQ_BULK, except at 64-key blocks with D = 128) or by
 * red.global.add.v2.f32 (scale and dtype come later: the post-pass in
 * bwd_sm80.cu). Only bwd_sm90_dkv.cu includes it, after the consumer
 * helpers it uses.
 *
 * Split of a tile's dQ between the warpgroups:
 *   merged (128-key blocks, D = 128): both warpgroups take every tile;
 *     warpgroup w computes the 64 columns of slab w over all 128 keys
 *     (8 steps of m64n64k16, A = both warpgroups' dS^T, B = K slab w), so
 *     each dQaccum element gets one add a tile. The warpgroups meet at a
 *     named barrier of 256 threads between the dS^T stores and the product.
 *   own keys (otherwise): each warpgroup computes its tile's dQ over its own
 *     64 keys (4 steps, A = its dS^T, B = its K rows), a slab at a time
 *     (one 32-float accumulator: dK and dV hold 2 x D / 2 registers), and
 *     meets only its own warps (128-thread named barrier). At 128-key blocks
 *     and D = 64 that is two adds an element a tile (the N = 32 halves a
 *     merged split would need start mid swizzle atom).
 * SK_BWD90_DQ_OWN = 1 (bwd_dqacc.cuh): the own-keys split at 128-key
 * blocks and D = 128 as well (an A/B: no pair barrier, twice the adds).
 * Bulk reduce-add (SK_BWD90_DQ_BULK = 1, the default): the red form's 16
 * red.global.add.v2 a thread a tile are issued back to back after
 * wait_group 0, and the warps wait for the LSU to drain 32 KB a CTA a tile
 * into L2 before the stage is freed and the next tile starts (merged: both
 * warpgroups at once, in phase by the pair barrier; docs/perf/backward.md,
 * "Fused, measured; why slower"). Instead each warpgroup stores a 64 x 64
 * fp32 tile to its own 16 KB of shared memory in dQaccum's fragment order
 * (conflict-free), fences, meets its own warps, and one thread issues one
 * cp.reduce.async.bulk .add.f32 of the tile's contiguous 16 KB and commits:
 * the adds drain while the next tile runs. Before the staged tile is
 * written again that thread waits for the bulk group's reads
 * (wait_group.read 0, before a barrier the warpgroup passes after it), and
 * before the CTA ends for the whole group. The two staged tiles take
 * 32 KB: at 128-key blocks and D = 128 beside K, V, the 3-stage ring and
 * the two dS^T buffers (232,048 of 232,448 bytes); at 64-key blocks and
 * D = 128 the 4-stage ring leaves too little, and red stays (in fragment
 * order: a warp's pair of adds, 256 contiguous bytes).
 *
 * dS^T buffers: two, alternating per tile (a warpgroup's tile t uses buffer
 * t % 2): a store of tile t + 2 comes after the barrier of tile t + 1,
 * which every reader of tile t passed after its product retired.
 *
 * NaN: dS^T is exactly 0 for every pair that does not count (selected, never
 * multiplied), so rows past Sq, causally hidden rows and keys past Sk add 0
 * (keys past Sk are TMA's zero fill). Keys < Sk that no pair of the CTA's
 * walk reaches (causal: past the diagonal of the last query row walked) may
 * be NaN by the contract, and 0 x NaN is NaN: before the first tile, all
 * consumer threads zero those K rows in shared memory (the walk's last row
 * is computed from T, with the producer's rules), then meet at an mbarrier.
 * Those keys count in no pair of the CTA, so S^T, dK and dV do not change.
 */
#ifndef SK_CUDA_ATTENTION_BWD_SM90_DKV_DQ_CUH
#define SK_CUDA_ATTENTION_BWD_SM90_DKV_DQ_CUH

/* A warpgroup's dS^T fragments (the A operand of dK += dS^T Q: key rows
 * 16 warp + g + 8 (m & 1), query columns 8 (m >> 1) + 2 t4, + 1) stored to
 * its 64 key rows of a dS^T buffer at dst (128-byte swizzled rows). */
__device__ __forceinline__ void sk_bwd90kv_store_ds(const uint32_t (&dsa)[16], uint32_t dst) {
    const int wtid = threadIdx.x % 128, warp = wtid / 32, lane = wtid % 32;
    const int g = lane / 4, t4 = lane % 4;
#pragma unroll
    for (int m = 0; m < 16; ++m)
        *sk90_shared_ptr<uint32_t>(dst + sk_sw128_offset(16 * warp + g + 8 * (m & 1), m >> 1) +
                                   4 * t4) = dsa[m];
}

/* Causal only, by all 256 consumer threads before their first tile: zero
 * the K rows of keys that no pair of the walk reaches (maybe NaN). The
 * walk has a tile iff some valid entry's query block starts below Sq and
 * its last row sees key kt; its last row is the largest such block's last
 * row (bwd_sm90_dkv.cu, sk_bwd90kv_produce: the same rules). Every thread
 * reads the whole T row (broadcast loads), so both warpgroups agree on
 * whether to meet at the mbarrier. */
template <int kD, int kKeyWgs>
__device__ void sk_bwd90kv_clean_keys(const sk_bwd_params &p, uint32_t base, int32_t kt,
                                      int32_t start, int32_t end) {
    using L = sk_bwd90kv_smem<kD, kKeyWgs, true>;
    const int32_t entries = p.t_group * p.row_blocks;
    int32_t last = -1; /* the walk's last query row */
    for (int32_t pos = start; pos < end; ++pos) {
        const int32_t e = __ldg(p.t_entries + pos);
        if ((uint32_t)e >= (uint32_t)entries) continue;
        const int32_t i = e % p.row_blocks;
        if (i * p.block_q >= p.seq_q) continue;
        const int32_t q_last = min(i * p.block_q + p.block_q, p.seq_q) - 1;
        if (kt <= q_last + p.diag) last = max(last, q_last);
    }
    if (last < 0) return; /* no tile: K is never loaded, nothing reads it */
    const int32_t z0 = max(last + p.diag + 1 - kt, 0), z1 = min(L::kKeys, p.seq_k - kt);
    if (z0 >= z1) return;
    sk_mbar_wait(base + L::kBarKv, 0, "dkv K/V");
    const int tid = (int)threadIdx.x - 128;
    for (int k = tid; k < (z1 - z0) * 8 * L::kSlabs; k += 256) {
        const int r = z0 + k / (8 * L::kSlabs), rest = k % (8 * L::kSlabs);
        *sk90_shared_ptr<uint4>(base + L::kK + (rest / 8) * L::kKvSlab + r * 128 +
                                (rest % 8) * 16) = make_uint4(0u, 0u, 0u, 0u);
    }
    sk_fence_proxy_async_smem(); /* generic writes before wgmma's reads */
    sk_mbar_arrive(base + L::kBarClean);
    sk_mbar_wait(base + L::kBarClean, 0, "dkv K clean");
}

/* acc (queries q0 + 16 warp + g + 8 ii, columns col0 + 8 j + 2 t4, + 1)
 * added into dQaccum rows `rows` (query head's [sq_pad, kD] block, in
 * bwd_dqacc.cuh's order); rows past Sq are skipped (they would add 0 to
 * the padding). */
template <int kD>
__device__ __forceinline__ void sk_bwd90kv_add_dq(const float (&acc)[32], float *rows, int32_t q0,
                                                  int32_t seq_q, int col0) {
    const int wtid = threadIdx.x % 128, warp = wtid / 32, lane = wtid % 32;
    const int g = lane / 4, t4 = lane % 4;
#pragma unroll
    for (int ii = 0; ii < 2; ++ii) {
        const int32_t q = q0 + 16 * warp + g + 8 * ii;
        if (q >= seq_q) continue;
#if SK_BWD90_DQ_BULK
        float *row = rows + sk_bwd_dqacc_at<kD>(q, col0 + 2 * t4);
        constexpr int kStep = 128; /* columns c and c + 8 of a slab (bwd_dqacc.cuh) */
#else
        float *row = rows + (int64_t)q * kD + col0 + 2 * t4; /* row-major */
        constexpr int kStep = 8;
#endif
#pragma unroll
        for (int j = 0; j < 8; ++j) sk_red_add_v2_f32(row + kStep * j, acc[4 * j + 2 * ii],
                                                      acc[4 * j + 2 * ii + 1]);
    }
}

/* acc (as sk_bwd90kv_add_dq's) stored to a staged 64 x 64 tile at
 * `staged` in bwd_dqacc.cuh's order: each warp writes 256 contiguous bytes
 * a register pair (no bank conflicts). */
__device__ __forceinline__ void sk_bwd90kv_stage_dq(const float (&acc)[32], uint32_t staged) {
    const int wtid = threadIdx.x % 128, warp = wtid / 32, lane = wtid % 32;
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int ii = 0; ii < 2; ++ii)
            *sk90_shared_ptr<float2>(staged + 4u * (uint32_t)sk_bwd_dqacc_pair(warp, j, ii, lane)) =
                make_float2(acc[4 * j + 2 * ii], acc[4 * j + 2 * ii + 1]);
}

/* Bulk form: acc staged at `staged` (free: the caller saw the previous
 * reduce-add's reads done), fenced for the async proxy, the warpgroup met,
 * and one thread adds the 64 x 64 tile into dst (its contiguous 16 KB in
 * dQaccum) with one bulk reduce-add, committed as its own group. The whole
 * tile, rows past Sq included: there dS^T is 0 and K finite, so they add 0
 * to the padding. */
template <int kD>
__device__ __forceinline__ void sk_bwd90kv_bulk_dq(const float (&acc)[32], uint32_t staged,
                                                   float *dst, int wg, uint32_t bytes) {
    sk_bwd90kv_stage_dq(acc, staged);
    sk_fence_proxy_async_smem(); /* generic writes before the bulk copy's reads */
    sk_bar_sync(kBkvBarDq + wg, 128);
    if (threadIdx.x % 128 == 0) {
        sk_bulk_reduce_add_f32(dst, staged, bytes);
        sk_bulk_commit();
    }
}

/* A tile's dQ, after sk_bwd90kv_finish stored this warpgroup's dS^T at
 * ds_own (and fenced it) with the dV and dK groups in flight: meet, issue
 * the product(s), retire everything (dk, dv, pa, dsa are free again), add.
 * ds_buf: the tile's dS^T buffer (both warpgroups' rows); k_wg: this
 * warpgroup's K rows; rows: dQaccum of the tile's query head. */
template <int kDtype, int kD, int kKeyWgs>
__device__ __forceinline__ void
sk_bwd90kv_dq_tile(const sk_bwd_params &p, uint32_t base, int wg, uint32_t ds_buf, uint32_t ds_own,
                   uint32_t k_wg, float *rows, int32_t q0, float (&dk)[kD / 2],
                   float (&dv)[kD / 2], uint32_t (&pa)[16], uint32_t (&dsa)[16]) {
    using L = sk_bwd90kv_smem<kD, kKeyWgs, true>;
    float acc[32];
    if constexpr (L::kMerged) {
        const int wtid = threadIdx.x % 128;
        const uint32_t staged = base + L::kDq + (uint32_t)wg * L::kDqStage;
        /* Bulk: this warpgroup's previous reduce-add has read its staged
         * tile before any thread passes the barrier and rewrites it. */
        if constexpr (L::kBulk)
            if (wtid == 0) sk_bulk_wait_read<0>();
        sk_bar_sync(kBkvBarPair, 256); /* both warpgroups' dS^T are in shared memory */
        sk_wgmma_fence();
        sk_bwd90_gemm_dq<kDtype, 8>(acc, ds_buf, base + L::kK + (uint32_t)wg * L::kKvSlab);
        sk_wgmma_commit();
        sk_bwd90kv_retire<0, kD>(dk, dv, pa, dsa);
        sk_bwd90kv_fence_f(acc);
        if constexpr (L::kBulk)
            sk_bwd90kv_bulk_dq<kD>(acc, staged, rows + sk_bwd_dqacc_at<kD>(q0, 64 * wg), wg,
                                   L::kDqStage);
        else
            sk_bwd90kv_add_dq<kD>(acc, rows, q0, p.seq_q, 64 * wg);
    } else {
        const int wtid = threadIdx.x % 128;
        const uint32_t staged = base + L::kDq + (uint32_t)wg * L::kDqStage;
        if constexpr (L::kBulk) /* as the merged form's */
            if (wtid == 0) sk_bulk_wait_read<0>();
        sk_bar_sync(kBkvBarDs + wg, 128); /* this warpgroup's dS^T is in shared memory */
#pragma unroll
        for (int c = 0; c < kD / 64; ++c) {
            sk_wgmma_fence(); /* acc was read by the previous slab's adds */
            sk_bwd90_gemm_dq<kDtype, 4>(acc, ds_own, k_wg + (uint32_t)c * L::kKvSlab);
            sk_wgmma_commit();
            sk_bwd90kv_retire<0, kD>(dk, dv, pa, dsa);
            sk_bwd90kv_fence_f(acc);
            if constexpr (L::kBulk) {
                if (c > 0) { /* slab c - 1's reduce-add has read the staged tile */
                    if (wtid == 0) sk_bulk_wait_read<0>();
                    sk_bar_sync(kBkvBarDq + wg, 128);
                }
                sk_bwd90kv_bulk_dq<kD>(acc, staged, rows + sk_bwd_dqacc_at<kD>(q0, 64 * c), wg,
                                       L::kDqStage);
            } else {
                sk_bwd90kv_add_dq<kD>(acc, rows, q0, p.seq_q, 64 * c);
            }
        }
    }
}

#endif /* SK_CUDA_ATTENTION_BWD_SM90_DKV_DQ_CUH */
