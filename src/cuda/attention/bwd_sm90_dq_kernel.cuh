/*
 * bwd_sm90_dq_kernel.cuh - the Hopper dQ kernel of the attention backward
 * (part of bwd_sm90_dq.cu, included there only; its header is the
 * design): the shared-memory layout, the producer warp (TMA), the
 * consumer warpgroups (wgmma) and the kernel.
 */
#ifndef SK_CUDA_ATTENTION_BWD_SM90_DQ_KERNEL_CUH
#define SK_CUDA_ATTENTION_BWD_SM90_DQ_KERNEL_CUH

#include "cuda/attention/bwd_dq_visit.cuh"
#include "cuda/attention/bwd_sm90_gemm.cuh"

enum {
    kDqThreads = 384, /* producer warpgroup + two consumer warpgroups */
    kDqRows = 128,    /* query rows of a tile (the layout's block_q) */
    kDqWgRows = 64,   /* query rows per consumer warpgroup */
    kDqKeys = 64,     /* keys per stage (SK_BWD_TILE: the walk's chunks) */
    kDqReleases = 8,  /* a stage is freed by lane 0 of each consumer warp */
    kDqBarZeroK = 1,  /* named barrier: both consumers zeroed a stage's hidden K rows */
    kDqFlagMore = 1,  /* stage info: another stage of the same tile follows */
    kDqFlagEmpty = 2  /* stage info: the tile has no chunk (no bytes loaded) */
};
static_assert((int)kDqKeys == (int)SK_BWD_TILE, "a stage is one chunk of the walk");

/* Byte offsets inside the 1024-aligned dynamic shared memory. Q and dO:
 * 128 rows in 64-column slabs of 128-byte rows (16 KB a slab, the forward's
 * Q layout); a stage: K then V, 64 keys in slabs of 8 KB. All 128B-swizzled
 * (the TMA box layout). */
template <int HD> struct sk_bwd90_dq_smem {
    static constexpr int kSlabs = HD / 64;
    /* 4 at both head dims: the consumers hold two stages at a time (a
     * chunk's dQ product crosses into the next chunk), so 4 keeps the
     * producer two chunks ahead; 193 KB at D = 128, one CTA an SM either
     * way. */
    static constexpr int kStages = 4;
    static constexpr uint32_t kSlabQ = kDqRows * 128;  /* 16 KB */
    static constexpr uint32_t kSlabKV = kDqKeys * 128; /* 8 KB */
    static constexpr uint32_t kQBytes = kSlabs * kSlabQ;
    static constexpr uint32_t kKVBytes = kSlabs * kSlabKV; /* one K or V chunk */
    static constexpr uint32_t kQ = 0;
    static constexpr uint32_t kDO = kQ + kQBytes;
    static constexpr uint32_t kKV = kDO + kQBytes; /* stage s: K at + 2 s kKVBytes, V after */
    static constexpr uint32_t kBarFull = kKV + 2 * kStages * kKVBytes;
    static constexpr uint32_t kBarEmpty = kBarFull + 8 * kStages;
    static constexpr uint32_t kBarQFull = kBarEmpty + 8 * kStages;
    static constexpr uint32_t kBarQEmpty = kBarQFull + 8;
    static constexpr uint32_t kInfo = kBarQEmpty + 8; /* per stage {first key, flags} */
    static constexpr uint32_t kUsed = kInfo + 8 * kStages;
    static constexpr uint32_t kDynamicBytes = kUsed + 1024; /* + alignment slack */
    static_assert(kDynamicBytes <= 227 * 1024, "shared memory of one sm_90 CTA");
    static_assert(kSlabKV % 1024 == 0 && kSlabQ % 1024 == 0, "swizzle atoms stay aligned");
};

/* The kernel's parameters: the portable kernels' block (pointers, byte
 * strides, sizes, the plan's arrays) and the TMA maps, boxes of 64 columns
 * x 64 rows over {D, H, S, B}. __grid_constant__: TMA reads the maps in
 * parameter space. */
struct sk_bwd90_dq_params {
    CUtensorMap tm_q, tm_do, tm_k, tm_v;
    sk_bwd_params p;
};

/* A dQ tile as both roles decode it from the plan's schedule (slot: the
 * position in dq_info). Same values on both sides: same reads. */
struct sk_bwd90_dq_tile {
    int32_t valid;       /* 0: a stale plan's entry, skipped by everyone */
    int32_t b, h, i, bh; /* batch, query head, query block, b * Hq + h */
    int32_t start, end;  /* clamped entry range of the layout row */
    int32_t kmax;        /* the last key any row of the tile may see */
};

__device__ __forceinline__ sk_bwd90_dq_tile sk_bwd90_dq_decode(const sk_bwd_params &p,
                                                               int32_t slot) {
    sk_bwd90_dq_tile t;
    const int4 info = __ldg(p.dq_info + slot);
    t.valid = info.x >= 0 && info.x < p.dq_tiles;
    const int32_t id = t.valid ? info.x : 0;
    t.i = id % p.row_blocks;
    t.bh = id / p.row_blocks;
    t.h = t.bh % p.heads_q;
    t.b = t.bh / p.heads_q;
    t.end = min(max(info.z, 0), p.nnz);
    t.start = min(max(info.y, 0), t.end);
    t.kmax = min((t.i + 1) * kDqRows, p.seq_q) - 1 + p.diag;
    return t;
}

/* ---------------------------------------------------------------------------
 * Producer: one thread walks the tiles and issues every TMA load
 * ------------------------------------------------------------------------- */

template <int HD>
__device__ __forceinline__ void sk_bwd90_dq_producer(const sk_bwd90_dq_params &prm, uint32_t base,
                                                     volatile int32_t *info) {
    using L = sk_bwd90_dq_smem<HD>;
    const sk_bwd_params &p = prm.p;
    sk_prefetch_tensormap(&prm.tm_q);
    sk_prefetch_tensormap(&prm.tm_do);
    sk_prefetch_tensormap(&prm.tm_k);
    sk_prefetch_tensormap(&prm.tm_v);
    sk90_pipe<L::kStages> kv = {0, 0};
    uint32_t q_phase = 0;
    for (int32_t slot = (int32_t)blockIdx.x; slot < p.dq_tiles; slot += (int32_t)gridDim.x) {
        const sk_bwd90_dq_tile t = sk_bwd90_dq_decode(p, slot);
        if (!t.valid) continue;
        const int32_t hk = t.h / p.group;
        int32_t pos = t.start - 1, col = 0, ks = p.block_k / SK_BWD_TILE;
        bool have = sk_bwd_dq_next(p, t.end, t.kmax, &pos, &col, &ks);
        if (!have) { /* one stage with no bytes tells the consumers: dQ = 0 */
            sk_mbar_wait(base + L::kBarEmpty + 8 * kv.stage, kv.phase ^ 1, "dq kv empty");
            info[2 * kv.stage] = 0;
            info[2 * kv.stage + 1] = kDqFlagEmpty;
            sk_mbar_arrive(base + L::kBarFull + 8 * kv.stage);
            kv.advance();
            continue;
        }
        /* Q and dO of the tile, once both consumers are done with the last
         * tile's. A half of rows all past Sq is not loaded: those rows are
         * masked, whatever the buffer holds. */
        const int32_t q0 = t.i * kDqRows;
        const int halves = q0 + kDqWgRows < p.seq_q ? 2 : 1;
        sk_mbar_wait(base + L::kBarQEmpty, q_phase ^ 1, "dq q empty");
        /* A half is kQBytes / 2 of Q and as much of dO. */
        sk_mbar_arrive_expect_tx(base + L::kBarQFull, (uint32_t)halves * L::kQBytes);
        const uint64_t once = sk_policy_evict_first(); /* Q, dO: read once */
        for (int hh = 0; hh < halves; ++hh)
#pragma unroll
            for (int s = 0; s < L::kSlabs; ++s) {
                const uint32_t off = s * L::kSlabQ + hh * kDqWgRows * 128;
                sk_tma_load_4d(base + L::kQ + off, &prm.tm_q, s * 64, t.h, q0 + hh * kDqWgRows, t.b,
                               base + L::kBarQFull, once);
                sk_tma_load_4d(base + L::kDO + off, &prm.tm_do, s * 64, t.h, q0 + hh * kDqWgRows,
                               t.b, base + L::kBarQFull, once);
            }
        q_phase ^= 1;
        while (have) {
            const int32_t kb = col * p.block_k + ks * SK_BWD_TILE;
            have = sk_bwd_dq_next(p, t.end, t.kmax, &pos, &col, &ks);
            sk_mbar_wait(base + L::kBarEmpty + 8 * kv.stage, kv.phase ^ 1, "dq kv empty");
            info[2 * kv.stage] = kb;
            info[2 * kv.stage + 1] = have ? kDqFlagMore : 0;
            const uint32_t bar = base + L::kBarFull + 8 * kv.stage;
            const uint32_t dst = base + L::kKV + kv.stage * 2u * L::kKVBytes;
            /* K, V: kept in L2, the other query tiles of the head reread them. */
            const uint64_t keep = sk_policy_evict_last();
            sk_mbar_arrive_expect_tx(bar, 2u * L::kKVBytes);
#pragma unroll
            for (int s = 0; s < L::kSlabs; ++s) {
                sk_tma_load_4d(dst + s * L::kSlabKV, &prm.tm_k, s * 64, hk, kb, t.b, bar, keep);
                sk_tma_load_4d(dst + L::kKVBytes + s * L::kSlabKV, &prm.tm_v, s * 64, hk, kb, t.b,
                               bar, keep);
            }
            kv.advance();
        }
    }
}

/* ---------------------------------------------------------------------------
 * Consumers: two warpgroups of 64 query rows
 * ------------------------------------------------------------------------- */

/* Zero the stage's K rows of keys past klim (the tile's last visible key
 * + 1) that TMA loaded (keys below Sk): dS is 0 there, but 0 times a NaN
 * key row is NaN, and such keys may be NaN (sparsek.h). V needs no zeroing:
 * its rows only reach dP's masked columns, selected away. Both consumers
 * share the rows and meet at a named barrier; the condition depends on the
 * tile and the stage only, so both take it or neither does. */
template <int HD>
__device__ __forceinline__ void sk_bwd90_dq_zero_k(const sk_bwd_params &p, uint32_t k_stage,
                                                   int32_t kb, int32_t klim) {
    using L = sk_bwd90_dq_smem<HD>;
    constexpr int kChunks = HD / 8;
    const int32_t from = klim - kb, to = min(p.seq_k - kb, kDqKeys);
    if (from >= to) return;
    for (int k = (int)threadIdx.x - 128; k < kDqKeys * kChunks; k += 256) {
        const int r = k / kChunks, ch = k % kChunks;
        if (r >= from && r < to)
            *sk90_shared_ptr<uint4>(k_stage + (ch / 8) * L::kSlabKV + sk_sw128_offset(r, ch % 8)) =
                make_uint4(0u, 0u, 0u, 0u);
    }
    sk_fence_proxy_async_smem(); /* generic writes before wgmma's reads */
    sk_bar_sync(kDqBarZeroK, 256);
}

/* Accumulator layout (m64nN fp32): register i of lane (g = lane / 4,
 * t4 = lane % 4) holds row 16 warp + g + 8 ((i >> 1) & 1), column
 * 8 (i >> 2) + 2 t4 + (i & 1); the register-A fragment of keys 16 kk ..
 * 16 kk + 15 is registers 8 kk .. 8 kk + 7, pairwise (fwd_sm90_consumer.cuh). */

/* P = 2^(S s log2(e) - lse2) in place of S, masked entries selected to 0
 * (never multiplied: NaN in a masked S or lse2 stays out). Run while dP's
 * group is still in flight. q: the thread's two rows. */
__device__ __forceinline__ void sk_bwd90_dq_p(const sk_bwd_params &p, float s[32], int32_t kb,
                                              int32_t wg_row0, const int32_t q[2],
                                              const float lse2[2], int t4) {
    const bool edge = kb + kDqKeys > p.seq_k || wg_row0 + kDqWgRows > p.seq_q ||
                      (p.causal && kb + kDqKeys - 1 > wg_row0 + p.diag);
#pragma unroll
    for (int i = 0; i < 32; ++i) {
        const int r = (i >> 1) & 1;
        const int32_t key = kb + 8 * (i >> 2) + 2 * t4 + (i & 1);
        const bool ok =
            !edge || (q[r] < p.seq_q && key < p.seq_k && (!p.causal || key <= q[r] + p.diag));
        const float pv = sk_ex2(fmaf(s[i], p.scale_log2, -lse2[r]));
        s[i] = ok ? pv : 0.f;
    }
}

/* dS = P (dP - Dl), packed to the dtype as dQ's A operand. P is 0 exactly
 * where the pair does not count (and maybe where it underflowed: dS is
 * +-0 there anyway): those entries are selected to 0, never multiplied
 * (NaN in a masked dP or Dl stays out). */
template <sk_dtype DT>
__device__ __forceinline__ void sk_bwd90_dq_ds(const float s[32], const float dp[32],
                                               uint32_t a[16], const float dl[2]) {
    float ds[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) ds[i] = s[i] != 0.f ? s[i] * (dp[i] - dl[(i >> 1) & 1]) : 0.f;
#pragma unroll
    for (int j = 0; j < 16; ++j) a[j] = sk90_pack<DT>(ds[2 * j], ds[2 * j + 1]);
}

/* The warpgroup's dQ rows below Sq, times s, rounded to the dtype: one
 * 4-byte store per column pair. */
template <sk_dtype DT, int HD>
__device__ __forceinline__ void sk_bwd90_dq_store(const sk_bwd_params &p, const sk_bwd90_dq_tile &t,
                                                  const float acc[HD / 2], const int32_t q[2],
                                                  int t4) {
    char *out = p.dq + t.b * p.dq_sb + t.h * p.dq_sh;
#pragma unroll
    for (int i = 0; i < HD / 2; i += 2) {
        const int r = (i >> 1) & 1;
        const int col = 8 * (i >> 2) + 2 * t4;
        if (q[r] < p.seq_q)
            *(uint32_t *)(out + (int64_t)q[r] * p.dq_ss + col * 2) =
                sk90_pack<DT>(acc[i] * p.scale, acc[i + 1] * p.scale);
    }
}

/* Wait until at most kPending wgmma groups are in flight, which completes
 * the previous chunk's dQ product: acc and a are the program's again, and
 * that chunk's stage (`empty`, if `pending`) is freed by lane 0 of each
 * warp. */
template <int kPending, int HD>
__device__ __forceinline__ void sk_bwd90_dq_retire(float (&acc)[HD / 2], uint32_t (&a)[16],
                                                   bool pending, uint32_t empty, int lane) {
    sk_wgmma_wait<kPending>();
#pragma unroll
    for (int i = 0; i < HD / 2; ++i) sk_reg_fence(acc[i]);
#pragma unroll
    for (int j = 0; j < 16; ++j) sk_reg_fence_u32(a[j]);
    if (pending) {
        __syncwarp();
        if (lane == 0) sk_mbar_arrive(empty);
    }
}

template <sk_dtype DT, int HD>
__device__ __forceinline__ void sk_bwd90_dq_consumer(const sk_bwd90_dq_params &prm, uint32_t base,
                                                     const volatile int32_t *info, int wg) {
    using L = sk_bwd90_dq_smem<HD>;
    const sk_bwd_params &p = prm.p;
    const int wtid = threadIdx.x % 128, warp = wtid / 32, lane = wtid % 32;
    const int g = lane / 4, t4 = lane % 4;
    const bool leader = wtid == 0;
    const uint32_t q_wg = base + L::kQ + wg * kDqWgRows * 128;
    const uint32_t do_wg = base + L::kDO + wg * kDqWgRows * 128;
    sk90_pipe<L::kStages> kv = {0, 0};
    uint32_t q_phase = 0;
    for (int32_t slot = (int32_t)blockIdx.x; slot < p.dq_tiles; slot += (int32_t)gridDim.x) {
        const sk_bwd90_dq_tile t = sk_bwd90_dq_decode(p, slot);
        if (!t.valid) continue;
        const int32_t wg_row0 = t.i * kDqRows + wg * kDqWgRows;
        const int32_t q[2] = {wg_row0 + 16 * warp + g, wg_row0 + 16 * warp + g + 8};
        const int32_t klim = p.causal ? min(p.seq_k, t.kmax + 1) : p.seq_k;
        float lse2[2], dl[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) { /* rows past Sq: past the padded rows too, not read */
            const int64_t at = (int64_t)t.bh * p.sq_pad + q[r];
            lse2[r] = q[r] < p.seq_q ? p.lse2[at] : 0.f;
            dl[r] = q[r] < p.seq_q ? p.dl[at] : 0.f;
        }
        float acc[HD / 2];
#pragma unroll
        for (int i = 0; i < HD / 2; ++i) acc[i] = 0.f;
        float s[32], dp[32];
#pragma unroll
        for (int i = 0; i < 32; ++i) s[i] = dp[i] = 0.f;
        uint32_t a[16];
        bool first = true;
        /* The previous chunk's dQ product stays in flight while this one's
         * S and dP are issued; its stage is freed once it completed. */
        bool pending = false;
        uint32_t pending_empty = 0;
        for (;;) {
            sk_mbar_wait(base + L::kBarFull + 8 * kv.stage, kv.phase, "dq kv full");
            /* Lane 0 reads the stage's info and releases the stage later. */
            int32_t kb = 0, flags = 0;
            if (lane == 0) {
                kb = info[2 * kv.stage];
                flags = info[2 * kv.stage + 1];
            }
            kb = __shfl_sync(0xffffffffu, kb, 0);
            flags = __shfl_sync(0xffffffffu, flags, 0);
            const uint32_t k_stage = base + L::kKV + kv.stage * 2u * L::kKVBytes;
            const uint32_t empty = base + L::kBarEmpty + 8 * kv.stage;
            if (flags & kDqFlagEmpty) {
                __syncwarp();
                if (lane == 0) sk_mbar_arrive(empty);
                kv.advance();
                break;
            }
            if (first) {
                sk_mbar_wait(base + L::kBarQFull, q_phase, "dq q full");
                q_phase ^= 1;
                first = false;
            }
            if (p.causal && kb + kDqKeys > klim) sk_bwd90_dq_zero_k<HD>(p, k_stage, kb, klim);
            /* S = Q K^T and dP = dO V^T, two commit groups behind the
             * previous chunk's dQ product: P's exponentials run while dP
             * does. No register fences on s / dp before the issue: with a
             * group in flight ptxas would read them as definitions inside
             * its pipeline stage and serialise every wgmma (C7513). */
            sk_wgmma_fence();
            sk_bwd90_gemm_ss<DT, HD>(s, q_wg, L::kSlabQ, k_stage, L::kSlabKV);
            sk_wgmma_commit();
            sk_bwd90_gemm_ss<DT, HD>(dp, do_wg, L::kSlabQ, k_stage + L::kKVBytes, L::kSlabKV);
            sk_wgmma_commit();
            /* The previous chunk's dQ product (unconditional: with nothing
             * older it waits for nothing, and ptxas sees every path retire
             * it); then its stage is free. */
            sk_bwd90_dq_retire<2, HD>(acc, a, pending, pending_empty, lane);
            sk_wgmma_wait<1>(); /* S */
#pragma unroll
            for (int i = 0; i < 32; ++i) sk_reg_fence(s[i]);
            sk_bwd90_dq_p(p, s, kb, wg_row0, q, lse2, t4);
            sk_wgmma_wait<0>(); /* dP */
#pragma unroll
            for (int i = 0; i < 32; ++i) {
                sk_reg_fence(s[i]);
                sk_reg_fence(dp[i]);
            }
            /* The tile's last chunk: this warpgroup is done with Q and dO. */
            if (leader && !(flags & kDqFlagMore)) sk_mbar_arrive(base + L::kBarQEmpty);
            sk_bwd90_dq_ds<DT>(s, dp, a, dl);
#pragma unroll
            for (int j = 0; j < 16; ++j) sk_reg_fence_u32(a[j]);
#pragma unroll
            for (int i = 0; i < HD / 2; ++i) sk_reg_fence(acc[i]);
            sk_wgmma_fence();
            sk_bwd90_gemm_rs<DT, HD>(acc, a, k_stage, L::kSlabKV); /* dQ += dS K */
            sk_wgmma_commit();
            pending = true;
            pending_empty = empty;
            kv.advance();
            if (!(flags & kDqFlagMore)) break;
        }
        sk_bwd90_dq_retire<0, HD>(acc, a, pending, pending_empty, lane); /* the tile's last */
        sk_bwd90_dq_store<DT, HD>(p, t, acc, q, t4);
    }
}

/* ---------------------------------------------------------------------------
 * The kernel
 * ------------------------------------------------------------------------- */

template <sk_dtype DT, int HD>
__global__ void __launch_bounds__(kDqThreads, 1)
    sk_bwd90_dq_kernel(const __grid_constant__ sk_bwd90_dq_params prm) {
    using L = sk_bwd90_dq_smem<HD>;
    extern __shared__ uint8_t sk_bwd90_dq_raw[];
    const uint32_t raw = (uint32_t)__cvta_generic_to_shared(sk_bwd90_dq_raw);
    const uint32_t base = (raw + 1023u) & ~1023u;
    volatile int32_t *info = sk90_shared_ptr<int32_t>(base + L::kInfo);
    if (threadIdx.x == 0) {
        for (int s = 0; s < L::kStages; ++s) {
            sk_mbar_init(base + L::kBarFull + 8 * s, 1);
            sk_mbar_init(base + L::kBarEmpty + 8 * s, kDqReleases);
        }
        sk_mbar_init(base + L::kBarQFull, 1);
        sk_mbar_init(base + L::kBarQEmpty, 2);
        sk_fence_mbar_init();
    }
    __syncthreads();
    const int wg = threadIdx.x / 128;
    if (wg == 0) {
        sk_setmaxnreg_dec<kProducerRegs>();
        if (threadIdx.x == 0) sk_bwd90_dq_producer<HD>(prm, base, info);
    } else {
        sk_setmaxnreg_inc<kConsumerRegs>();
        sk_bwd90_dq_consumer<DT, HD>(prm, base, info, wg - 1);
    }
}

#endif /* SK_CUDA_ATTENTION_BWD_SM90_DQ_KERNEL_CUH */
