/*
 * bwd_sm80_dkv.cuh - the portable backward's dK/dV kernel (part of
 * bwd_sm80.cu, included there only; its header is the design). One CTA
 * per (batch b, KV head hk, 64-key tile of key block j): the tile's items
 * are the (query head, 64-row query tile) pairs of the transposed layout's
 * row, in its order, each repeated G / t_group times (bwd_kernels.h). In
 * varlen mode a tile is (KV head, key column of the varlen plan), the
 * parameters narrowed to the column's sequence: the same body.
 *
 * Shared memory: K and V of the tile (warp w loads and alone reads rows
 * 16 w .. 16 w + 15: its keys, the A operand), then two stages of an item:
 * Q and dO [64, D] (the B operands, read by every warp) and its 64 lse2 and
 * Dl values. Per item and warp, per step of kQN queries (64; 32 at D = 128
 * for registers): S^T = K Q^T and dP^T = V dO^T (16 x kQN), then P^T and
 * dS^T in registers as A fragments: dV += P^T dO, dK += dS^T Q.
 */
#ifndef SK_CUDA_ATTENTION_BWD_SM80_DKV_CUH
#define SK_CUDA_ATTENTION_BWD_SM80_DKV_CUH

/* Bytes of one item stage: Q, dO, then lse2 and Dl (64 floats each). */
template <int kD>
__host__ __device__ constexpr uint32_t sk_bwd_dkv_stage_bytes(void) {
    return 2u * SK_BWD_TILE * kD * 2u + 2u * SK_BWD_TILE * 4u;
}

/* K, V, then two item stages; kFuse: then two dS^T buffers. */
template <int kD, bool kFuse = false>
__host__ __device__ constexpr uint32_t sk_bwd_dkv_smem_bytes(void) {
    return 2u * SK_BWD_TILE * kD * 2u + 2u * sk_bwd_dkv_stage_bytes<kD>() +
           (kFuse ? 2u * SK_BWD_DS_BYTES : 0u);
}

/* Where the item walk is: repetition, T entry, 64-row query tile of that
 * entry's query block; and the item's query head and first row. */
typedef struct sk_bwd_item {
    int32_t rep, pos, qt;
    int32_t h, q0;
} sk_bwd_item;

/* Advance *it to the next item of key tile [kt, kt + 64) of KV head hk in
 * T entries [start, end) that has a pair to count (a query tile below Sq
 * whose last row sees key kt when causal); false at the end. Start with
 * rep = 0, pos = start, qt = -1. Entries outside [0, t_group * row_blocks)
 * are skipped (a stale or corrupt plan stays in bounds). */
__device__ __forceinline__ bool sk_bwd_dkv_next(const sk_bwd_params &p, int32_t hk, int32_t kt,
                                                int32_t start, int32_t end, sk_bwd_item *it) {
    const int32_t qsubs = p.block_q / SK_BWD_TILE;
    for (;;) {
        if (++it->qt >= qsubs) {
            it->qt = 0;
            if (++it->pos >= end) {
                it->pos = start;
                if (++it->rep >= p.t_reps) return false;
            }
        }
        if (it->pos >= end) return false; /* an empty T row */
        const int32_t e = __ldg(p.t_entries + it->pos);
        if ((uint32_t)e >= (uint32_t)(p.t_group * p.row_blocks)) {
            it->qt = qsubs; /* not an entry: the next one */
            continue;
        }
        const int32_t hl = e / p.row_blocks, i = e - hl * p.row_blocks;
        const int32_t q0 = i * p.block_q + it->qt * SK_BWD_TILE;
        if (q0 >= p.seq_q) {
            it->qt = qsubs;
            continue;
        }
        if (p.causal && kt > min(q0 + SK_BWD_TILE, p.seq_q) - 1 + p.diag) continue;
        it->h = hk * p.group + it->rep * p.t_group + hl;
        it->q0 = q0;
        return true;
    }
}

/* cp.async an item's Q and dO rows (this warp's 16 of each; rows that can
 * count no pair in key tile kt zero-filled) and, by warp 0, its lse2 and Dl
 * chunks, into `stage`. */
template <int kD>
__device__ __forceinline__ void sk_bwd_dkv_load_item(const sk_bwd_params &p, int32_t b,
                                                     const sk_bwd_item &it, int32_t kt,
                                                     uint32_t stage) {
    constexpr uint32_t kTileBytes = SK_BWD_TILE * kD * 2;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, r0 = SK_BWD_WARP_ROWS * warp;
    /* Rows [lo, hi) of the tile have a key of the tile they may see. */
    const int lo = p.causal ? kt - p.diag - it.q0 : 0, hi = p.seq_q - it.q0;
    const char *q = p.q + b * p.q_sb + it.h * p.q_sh + (int64_t)it.q0 * p.q_ss;
    const char *d = p.dout + b * p.do_sb + it.h * p.do_sh + (int64_t)it.q0 * p.do_ss;
    const uint32_t dst = stage + (uint32_t)(r0 * kD * 2);
    sk_sm80_load_rows_range_warp<kD, SK_BWD_WARP_ROWS>(dst, q + (uint32_t)r0 * (uint32_t)p.q_ss,
                                                       p.q_ss, lo - r0, hi - r0, q);
    sk_sm80_load_rows_range_warp<kD, SK_BWD_WARP_ROWS>(dst + kTileBytes,
                                                       d + (uint32_t)r0 * (uint32_t)p.do_ss,
                                                       p.do_ss, lo - r0, hi - r0, d);
    if (warp == 0) { /* 16 chunks of lse2, then 16 of Dl; rows padded to 64 */
        const int64_t row = ((int64_t)b * p.heads_q + it.h) * p.sq_pad + it.q0;
        const float *src = (lane < 16 ? p.lse2 : p.dl) + row + 4 * (lane & 15);
        sk_cp_async_16(stage + 2u * kTileBytes + 16u * (uint32_t)lane, src, 16u);
    }
}

/* The fused form (bwd_sm80_fused.cuh): this warp's packed dS^T A fragments
 * of kPK 16-query groups from query c0 of the item (keys 16 w + g, + 8;
 * queries c0 + 16 kk + 2 t4, + 1 and + 8) as 32-bit words into the dS^T
 * buffer at ds: [64 keys][64 queries] of the dtype, 128-byte rows, 16-byte
 * chunk c of row r at c ^ (r & 7) (conflict-free stores and ldmatrix). */
template <int kPK>
__device__ __forceinline__ void sk_bwd_ds_store(const uint32_t (&a)[kPK][4], unsigned char *ds,
                                                int c0) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int ii = 0; ii < 2; ++ii) {
        unsigned char *row = ds + (SK_BWD_WARP_ROWS * warp + g + 8 * ii) * 128 + 4 * t4;
#pragma unroll
        for (int kk = 0; kk < kPK; ++kk)
#pragma unroll
            for (int x = 0; x < 2; ++x)
                *(uint32_t *)(row + (((uint32_t)(c0 / 8 + 2 * kk + x) ^ (uint32_t)g) << 4)) =
                    a[kk][2 * x + ii];
    }
}

/* One item for this warp (keys kw .. kw + 15 of the tile): dK and dV
 * accumulate its pairs. kFuse (bwd_sm80_fused.cuh): also its dS^T rows
 * into the item's dS^T buffer at ds_buf, zeros for the query steps it skips
 * as causally hidden (a step past Sq is read by no dQ warp). */
template <int kDtype, int kD, bool kFuse = false>
__device__ __forceinline__ void sk_bwd_dkv_item(const sk_bwd_params &p, const sk_bwd_lane &ln,
                                                uint32_t kv, uint32_t stage,
                                                const unsigned char *stage_ptr, int32_t kw,
                                                int32_t q0, float (&dk)[kD / 8][4],
                                                float (&dv)[kD / 8][4],
                                                unsigned char *ds_buf = nullptr) {
    constexpr int kRowBytes = kD * 2;
    constexpr int kQN = kD == 128 ? 32 : 64; /* queries per step */
    constexpr int kNT = kQN / 8, kPK = kQN / 16;
    constexpr uint32_t kTileBytes = SK_BWD_TILE * kRowBytes;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
    const uint32_t k_lane = kv + (uint32_t)(SK_BWD_WARP_ROWS * warp) * kRowBytes + ln.a_row;
    const uint32_t q_st = stage, do_st = stage + kTileBytes;
    const float *lse2 = (const float *)(stage_ptr + 2 * kTileBytes);
    const float *dl = lse2 + SK_BWD_TILE;
#pragma unroll
    for (int half = 0; half < SK_BWD_TILE / kQN; ++half) {
        const int32_t qh = q0 + half * kQN; /* first query of the step */
        if (qh >= p.seq_q) break;
        if (p.causal && kw > min(qh + kQN, p.seq_q) - 1 + p.diag) {
            if constexpr (kFuse) {
                const uint32_t zero[kPK][4] = {};
                sk_bwd_ds_store<kPK>(zero, ds_buf, half * kQN);
            }
            continue;
        }
        float s[kNT][4], dp[kNT][4];
        const uint32_t qs = q_st + (uint32_t)(half * kQN) * kRowBytes;
        const uint32_t ds = do_st + (uint32_t)(half * kQN) * kRowBytes;
        sk_bwd_mma_pair<kDtype, kD, kNT>(s, dp, k_lane, k_lane + kTileBytes, qs + ln.b_row,
                                         ds + ln.b_row, ln);
        /* P^T and dS^T: entry (key kw + g + 8 ii, query qh + 8 nt + 2 t4 + e). */
        const bool edge = kw + SK_BWD_WARP_ROWS > p.seq_k || qh + kQN > p.seq_q ||
                          (p.causal && kw + SK_BWD_WARP_ROWS - 1 > qh + p.diag);
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
            const int qc = half * kQN + nt * 8 + 2 * t4; /* the item's row */
            const float2 l2 = *(const float2 *)(lse2 + qc), d2 = *(const float2 *)(dl + qc);
#pragma unroll
            for (int ii = 0; ii < 2; ++ii)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int32_t key = kw + g + 8 * ii, q = q0 + qc + e;
                    const bool ok = !edge || (key < p.seq_k && q < p.seq_q &&
                                              (!p.causal || key <= q + p.diag));
                    const float pv =
                        sk_ex2(fmaf(s[nt][2 * ii + e], p.scale_log2, -(e ? l2.y : l2.x)));
                    s[nt][2 * ii + e] = ok ? pv : 0.f;
                    dp[nt][2 * ii + e] = ok ? pv * (dp[nt][2 * ii + e] - (e ? d2.y : d2.x)) : 0.f;
                }
        }
        uint32_t pa[kPK][4], dsa[kPK][4];
        sk_bwd_to_a<kDtype, kNT>(s, pa);
        sk_bwd_to_a<kDtype, kNT>(dp, dsa);
        if constexpr (kFuse) sk_bwd_ds_store<kPK>(dsa, ds_buf, half * kQN);
        /* dV += P^T dO, dK += dS^T Q: B from [query][D] rows, transposed. */
        sk_bwd_mma_rows<kDtype, kD, kPK>(dv, pa, ds + ln.t_row, ln);
        sk_bwd_mma_rows<kDtype, kD, kPK>(dk, dsa, qs + ln.t_row, ln);
    }
}

/* The key tile [kt, kt + 64) of (batch b, KV head hk) over T entries
 * [start, end): the whole CTA's work once its tile is known. kFuse
 * (bwd_sm80_fused.cuh): each item's dQ too, added into dqacc one item
 * late (after the barrier that opens the next item, or the one after the
 * loop), from the two dS^T buffers after the item stages. */
template <int kDtype, int kD, bool kFuse = false>
__device__ __forceinline__ void sk_bwd_dkv_tile(const sk_bwd_params &p, unsigned char *smem,
                                                int32_t b, int32_t hk, int32_t kt, int32_t start,
                                                int32_t end, float *dqacc = nullptr) {
    constexpr int kRowBytes = kD * 2, kDTiles = kD / 8;
    constexpr uint32_t kTileBytes = SK_BWD_TILE * kRowBytes;
    constexpr uint32_t kStageBytes = sk_bwd_dkv_stage_bytes<kD>();
    if (kt >= p.seq_k) return;
    const int warp = threadIdx.x >> 5;
    const int32_t kw = kt + SK_BWD_WARP_ROWS * warp; /* this warp's first key */
    const uint32_t smem0 = (uint32_t)__cvta_generic_to_shared(smem);
    const sk_bwd_lane ln = sk_bwd_lane_terms<kD>();

    float dk[kDTiles][4], dv[kDTiles][4];
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt)
#pragma unroll
        for (int r = 0; r < 4; ++r) dk[dt][r] = dv[dt][r] = 0.f;

    sk_bwd_item it = {0, start, -1, 0, 0};
    bool have = sk_bwd_dkv_next(p, hk, kt, start, end, &it);
    /* kFuse: keys from klim on have no pair (their K may be NaN): zero-filled. */
    int32_t klim = p.seq_k;
    if constexpr (kFuse)
        if (have) klim = sk_bwd_fused_klim(p, start, end);
    if (have) { /* K and V of this warp's keys (past Sk zero), the first item */
        const char *k = p.k + b * p.k_sb + hk * p.k_sh + (int64_t)kt * p.k_ss;
        const char *v = p.v + b * p.v_sb + hk * p.v_sh + (int64_t)kt * p.v_ss;
        const int r0 = SK_BWD_WARP_ROWS * warp, valid = p.seq_k - kw;
        sk_sm80_load_rows_warp<kD, SK_BWD_WARP_ROWS>(
            smem0 + (uint32_t)(r0 * kRowBytes), k + (uint32_t)r0 * (uint32_t)p.k_ss, p.k_ss,
            kFuse ? klim - kw : valid, k);
        sk_sm80_load_rows_warp<kD, SK_BWD_WARP_ROWS>(
            smem0 + kTileBytes + (uint32_t)(r0 * kRowBytes), v + (uint32_t)r0 * (uint32_t)p.v_ss,
            p.v_ss, valid, v);
        sk_bwd_dkv_load_item<kD>(p, b, it, kt, smem0 + 2u * kTileBytes);
        sk_cp_async_commit();
    }
    constexpr uint32_t kDsAt = 2u * kTileBytes + 2u * kStageBytes; /* kFuse: dS^T buffers */
    sk_bwd_item prev = it; /* kFuse: the item whose dQ is pending */
    bool pending = false;
    uint32_t stage = 0;
    while (have) {
        sk_bwd_item next = it;
        const bool more = sk_bwd_dkv_next(p, hk, kt, start, end, &next);
        /* This item has landed, and every warp is done with the other stage. */
        sk_cp_async_wait<0>();
        __syncthreads();
        const uint32_t here = 2u * kTileBytes + stage * kStageBytes;
        const uint32_t other = 2u * kTileBytes + (stage ^ 1u) * kStageBytes;
        if (more) sk_bwd_dkv_load_item<kD>(p, b, next, kt, smem0 + other);
        sk_cp_async_commit();
        const uint32_t ds_here = kDsAt + stage * SK_BWD_DS_BYTES;
        if constexpr (kFuse)
            if (pending)
                sk_bwd_fused_dq<kDtype, kD>(p, ln, smem0,
                                            smem0 + kDsAt + (stage ^ 1u) * SK_BWD_DS_BYTES, b,
                                            prev.h, prev.q0, kt, klim, dqacc);
        if (kw < p.seq_k && !(p.causal && kw > min(it.q0 + SK_BWD_TILE, p.seq_q) - 1 + p.diag))
            sk_bwd_dkv_item<kDtype, kD, kFuse>(p, ln, smem0, smem0 + here, smem + here, kw,
                                               it.q0, dk, dv, smem + ds_here);
        else if constexpr (kFuse) { /* no pair: zeros for the other warps' dQ */
            const uint32_t zero[SK_BWD_TILE / 16][4] = {};
            sk_bwd_ds_store<SK_BWD_TILE / 16>(zero, smem + ds_here, 0);
        }
        prev = it;
        pending = kFuse;
        it = next;
        have = more;
        stage ^= 1u;
    }
    sk_cp_async_wait<0>();
    if constexpr (kFuse)
        if (pending) { /* the last item's dQ; then K is free for the staging below */
            __syncthreads();
            sk_bwd_fused_dq<kDtype, kD>(p, ln, smem0,
                                        smem0 + kDsAt + (stage ^ 1u) * SK_BWD_DS_BYTES, b,
                                        prev.h, prev.q0, kt, klim, dqacc);
            __syncthreads();
        }
    __syncwarp();
    /* dK = s dS^T Q and dV through this warp's K and V rows (its own). */
    const int valid = p.seq_k - kw;
    char *dko = p.dk + b * p.dk_sb + hk * p.dk_sh + (int64_t)kt * p.dk_ss;
    char *dvo = p.dv + b * p.dv_sb + hk * p.dv_sh + (int64_t)kt * p.dv_ss;
    const int r0 = SK_BWD_WARP_ROWS * warp;
    sk_bwd_store_rows_warp<kDtype, kD>(dk, p.scale, smem + r0 * kRowBytes,
                                       dko + (uint32_t)r0 * (uint32_t)p.dk_ss, p.dk_ss, valid);
    sk_bwd_store_rows_warp<kDtype, kD>(dv, 1.f, smem + kTileBytes + r0 * kRowBytes,
                                       dvo + (uint32_t)r0 * (uint32_t)p.dv_ss, p.dv_ss, valid);
}

/* One CTA per (plan slot, 64-key part of the block). Fixed: tile (b, hk,
 * key block j). Varlen (kVarlen): tile (hk, key column c), c = (b, j) by
 * the column table, the parameters narrowed to sequence b. kFuse (fixed
 * only): the fused one-pass form, dQ added into p.dqacc. */
template <int kDtype, int kD, bool kVarlen, bool kFuse = false>
__global__ void __launch_bounds__(SK_BWD_THREADS, SK_BWD_CTAS_PER_SM)
    sk_bwd_dkv_kernel(const __grid_constant__ sk_bwd_params p) {
    static_assert(!(kVarlen && kFuse), "the varlen backward has no fused form");
    extern __shared__ __align__(128) unsigned char smem[];
    const int32_t ksubs = p.block_k / SK_BWD_TILE;
    const int32_t slot = (int32_t)blockIdx.x / ksubs, ksub = (int32_t)blockIdx.x - slot * ksubs;
    const int4 info = p.dkv_info[slot];
    if (info.x < 0 || info.x >= p.dkv_tiles) return; /* a stale plan: no tile */
    const int32_t end = min(max(info.z, 0), p.nnz), start = min(max(info.y, 0), end);
    const int32_t cols = kVarlen ? p.v_col_cap : p.col_blocks;
    const int32_t j = info.x % cols, bh = info.x / cols;
    const int32_t hk = bh % p.heads_kv, b = bh / p.heads_kv;
    if constexpr (kVarlen) {
        const int2 cb = p.v_cols[j];
        if ((uint32_t)cb.x >= (uint32_t)p.v_batch) return; /* no sequence */
        sk_bwd_params n;
        sk_bwd_varlen_narrow(p, cb.x, __ldg(p.v_row_start + cb.x), &n);
        /* kt below len_k, so no int32 overflow on garbage columns. */
        if (cb.y < 0 || (int64_t)cb.y * p.block_k + ksub * SK_BWD_TILE >= n.seq_k) return;
        sk_bwd_dkv_tile<kDtype, kD>(n, smem, 0, hk, cb.y * p.block_k + ksub * SK_BWD_TILE,
                                    start, end);
    } else {
        sk_bwd_dkv_tile<kDtype, kD, kFuse>(p, smem, b, hk, j * p.block_k + ksub * SK_BWD_TILE,
                                           start, end, p.dqacc);
    }
}

#endif /* SK_CUDA_ATTENTION_BWD_SM80_DKV_CUH */
