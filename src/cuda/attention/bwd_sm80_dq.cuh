/*
 * bwd_sm80_dq.cuh - the portable backward's dQ kernel (part of
 * bwd_sm80.cu, included there only; its header is the design). One CTA per
 * (batch b, query head h, 64-row query tile of query block i), taken in
 * the plan's longest-first order of the layout rows: it walks row i of
 * slice(b, h) in order, each selected block in 64-key chunks, skipping the
 * chunks no row of the tile sees (causal) and those past Sk. In varlen
 * mode a tile is (query head, layout row of the varlen plan), the
 * parameters narrowed to the row's sequence: the same body.
 *
 * Shared memory: Q and dO of the tile (warp w loads and alone reads rows
 * 16 w .. 16 w + 15, its A operands), then two stages of a chunk's K and V
 * [64, D] (the B operands, read by every warp). Per chunk and warp:
 * S = Q K^T and dP = dO V^T (16 x 64), dS in registers as the A fragment
 * of dQ += dS K.
 */
#ifndef SK_CUDA_ATTENTION_BWD_SM80_DQ_CUH
#define SK_CUDA_ATTENTION_BWD_SM80_DQ_CUH

#include "cuda/attention/bwd_dq_visit.cuh"

/* Q, dO, then two stages of K and V. */
template <int kD>
__host__ __device__ constexpr uint32_t sk_bwd_dq_smem_bytes(void) {
    return 6u * SK_BWD_TILE * kD * 2u;
}

/* cp.async this warp's 16 rows of the chunk's K and V (first key kb; keys
 * past klim - 1, the last one the tile may see, zero-filled) into `stage`. */
template <int kD>
__device__ __forceinline__ void sk_bwd_dq_load_chunk(const sk_bwd_params &p, int32_t b,
                                                     int32_t hk, int32_t kb, int32_t klim,
                                                     uint32_t stage) {
    const int warp = threadIdx.x >> 5, r0 = SK_BWD_WARP_ROWS * warp;
    const int valid = klim - kb - r0;
    const char *k = p.k + b * p.k_sb + hk * p.k_sh + (int64_t)kb * p.k_ss;
    const char *v = p.v + b * p.v_sb + hk * p.v_sh + (int64_t)kb * p.v_ss;
    const uint32_t dst = stage + (uint32_t)(r0 * kD * 2);
    sk_sm80_load_rows_warp<kD, SK_BWD_WARP_ROWS>(dst, k + (uint32_t)r0 * (uint32_t)p.k_ss, p.k_ss,
                                                 valid, k);
    sk_sm80_load_rows_warp<kD, SK_BWD_WARP_ROWS>(dst + SK_BWD_TILE * kD * 2,
                                                 v + (uint32_t)r0 * (uint32_t)p.v_ss, p.v_ss,
                                                 valid, v);
}

/* One chunk (keys kb .. kb + 63) for this warp's rows qw .. qw + 15:
 * dQ accumulates dS K. lse2 and dl: the thread's rows qw + g, qw + g + 8. */
template <int kDtype, int kD>
__device__ __forceinline__ void sk_bwd_dq_chunk(const sk_bwd_params &p, const sk_bwd_lane &ln,
                                                uint32_t q_lane, uint32_t do_lane, uint32_t ks,
                                                int32_t qw, int32_t kb, const float (&lse2)[2],
                                                const float (&dl)[2], float (&acc)[kD / 8][4]) {
    constexpr int kNT = SK_BWD_TILE / 8, kPK = SK_BWD_TILE / 16;
    constexpr uint32_t kTileBytes = SK_BWD_TILE * kD * 2;
    const int lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    float s[kNT][4], dp[kNT][4];
    sk_bwd_mma_pair<kDtype, kD, kNT>(s, dp, q_lane, do_lane, ks + ln.b_row,
                                     ks + kTileBytes + ln.b_row, ln);
    /* dS: entry (query qw + g + 8 ii, key kb + 8 nt + 2 t4 + e). */
    const bool edge = kb + SK_BWD_TILE > p.seq_k || qw + SK_BWD_WARP_ROWS > p.seq_q ||
                      (p.causal && kb + SK_BWD_TILE - 1 > qw + p.diag);
#pragma unroll
    for (int ii = 0; ii < 2; ++ii) {
        const int32_t q = qw + g + 8 * ii;
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int32_t key = kb + nt * 8 + 2 * t4 + e;
                const bool ok = !edge || (q < p.seq_q && key < p.seq_k &&
                                          (!p.causal || key <= q + p.diag));
                const float pv = sk_ex2(fmaf(s[nt][2 * ii + e], p.scale_log2, -lse2[ii]));
                s[nt][2 * ii + e] = ok ? pv * (dp[nt][2 * ii + e] - dl[ii]) : 0.f;
            }
    }
    uint32_t dsa[kPK][4];
    sk_bwd_to_a<kDtype, kNT>(s, dsa);
    /* dQ += dS K: B from the chunk's [key][D] rows, transposed. */
    sk_bwd_mma_rows<kDtype, kD, kPK>(acc, dsa, ks + ln.t_row, ln);
}

/* The query tile [q0, q0 + 64) of (batch b, query head h; bh = b Hq + h)
 * over the layout entries from info_y to info_z: the whole CTA's work once
 * its tile is known. */
template <int kDtype, int kD>
__device__ __forceinline__ void sk_bwd_dq_tile(const sk_bwd_params &p, unsigned char *smem,
                                               int32_t b, int32_t h, int32_t q0, int32_t info_y,
                                               int32_t info_z) {
    constexpr int kRowBytes = kD * 2, kDTiles = kD / 8;
    constexpr uint32_t kTileBytes = SK_BWD_TILE * kRowBytes;
    const int32_t bh = b * p.heads_q + h, hk = h / p.group;
    if (q0 >= p.seq_q) return;
    /* The last key any row of the tile sees (+ 1), for the causal skips. */
    const int32_t kmax = min(q0 + SK_BWD_TILE, p.seq_q) - 1 + p.diag;
    const int32_t klim = p.causal ? min(p.seq_k, kmax + 1) : p.seq_k;
    const int32_t end = min(max(info_z, 0), p.nnz);
    int32_t pos = min(max(info_y, 0), end) - 1, col = 0, ks = p.block_k / SK_BWD_TILE;
    bool have = sk_bwd_dq_next(p, end, kmax, &pos, &col, &ks);

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2;
    const int r0 = SK_BWD_WARP_ROWS * warp;
    const int32_t qw = q0 + r0; /* this warp's first query */
    const uint32_t smem0 = (uint32_t)__cvta_generic_to_shared(smem);
    const sk_bwd_lane ln = sk_bwd_lane_terms<kD>();
    const uint32_t q_lane = smem0 + (uint32_t)(r0 * kRowBytes) + ln.a_row;
    const uint32_t do_lane = q_lane + kTileBytes;
    float acc[kDTiles][4];
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt)
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[dt][r] = 0.f;
    float lse2[2] = {0.f, 0.f}, dl[2] = {0.f, 0.f};
    if (have) { /* this warp's Q and dO rows (past Sq zero), the first chunk */
        const char *q = p.q + b * p.q_sb + h * p.q_sh + (int64_t)q0 * p.q_ss;
        const char *d = p.dout + b * p.do_sb + h * p.do_sh + (int64_t)q0 * p.do_ss;
        sk_sm80_load_rows_warp<kD, SK_BWD_WARP_ROWS>(smem0 + (uint32_t)(r0 * kRowBytes),
                                                     q + (uint32_t)r0 * (uint32_t)p.q_ss, p.q_ss,
                                                     p.seq_q - qw, q);
        sk_sm80_load_rows_warp<kD, SK_BWD_WARP_ROWS>(
            smem0 + kTileBytes + (uint32_t)(r0 * kRowBytes), d + (uint32_t)r0 * (uint32_t)p.do_ss,
            p.do_ss, p.seq_q - qw, d);
        sk_bwd_dq_load_chunk<kD>(p, b, hk, col * p.block_k + ks * SK_BWD_TILE, klim,
                                 smem0 + 2u * kTileBytes);
        sk_cp_async_commit();
        const int64_t row = (int64_t)bh * p.sq_pad + qw + g; /* rows are padded to 64 */
        lse2[0] = p.lse2[row];
        lse2[1] = p.lse2[row + 8];
        dl[0] = p.dl[row];
        dl[1] = p.dl[row + 8];
    }
    uint32_t stage = 0;
    while (have) {
        int32_t npos = pos, ncol = col, nks = ks;
        const bool more = sk_bwd_dq_next(p, end, kmax, &npos, &ncol, &nks);
        /* This chunk has landed, and every warp is done with the other stage. */
        sk_cp_async_wait<0>();
        __syncthreads();
        const uint32_t here = smem0 + 2u * kTileBytes + stage * 2u * kTileBytes;
        const uint32_t other = smem0 + 2u * kTileBytes + (stage ^ 1u) * 2u * kTileBytes;
        if (more) sk_bwd_dq_load_chunk<kD>(p, b, hk, ncol * p.block_k + nks * SK_BWD_TILE, klim, other);
        sk_cp_async_commit();
        const int32_t kb = col * p.block_k + ks * SK_BWD_TILE;
        if (qw < p.seq_q && !(p.causal && kb > qw + SK_BWD_WARP_ROWS - 1 + p.diag))
            sk_bwd_dq_chunk<kDtype, kD>(p, ln, q_lane, do_lane, here, qw, kb, lse2, dl, acc);
        pos = npos;
        col = ncol;
        ks = nks;
        have = more;
        stage ^= 1u;
    }
    sk_cp_async_wait<0>();
    __syncwarp();
    /* dQ = s dS K through this warp's Q rows (its own). */
    char *out = p.dq + b * p.dq_sb + h * p.dq_sh + (int64_t)qw * p.dq_ss;
    sk_bwd_store_rows_warp<kDtype, kD>(acc, p.scale, smem + r0 * kRowBytes, out, p.dq_ss,
                                       p.seq_q - qw);
}

/* One CTA per (plan slot, 64-row part of the block). Fixed: tile (b, h,
 * query block i). Varlen (kVarlen): tile (h, layout row r), r = (b, i) by
 * the row table, the parameters narrowed to sequence b. */
template <int kDtype, int kD, bool kVarlen>
__global__ void __launch_bounds__(SK_BWD_THREADS, SK_BWD_CTAS_PER_SM)
    sk_bwd_dq_kernel(const __grid_constant__ sk_bwd_params p) {
    extern __shared__ __align__(128) unsigned char smem[];
    const int32_t qsubs = p.block_q / SK_BWD_TILE;
    const int32_t slot = (int32_t)blockIdx.x / qsubs, qsub = (int32_t)blockIdx.x - slot * qsubs;
    const int4 info = p.dq_info[slot];
    if (info.x < 0 || info.x >= p.dq_tiles) return; /* a stale plan: no tile */
    const int32_t i = info.x % p.row_blocks, bh = info.x / p.row_blocks;
    const int32_t h = bh % p.heads_q, b = bh / p.heads_q;
    if constexpr (kVarlen) {
        const int2 row = p.v_rows[i]; /* {sequence, its query block} */
        if ((uint32_t)row.x >= (uint32_t)p.v_batch || row.y < 0 || row.y > i) return;
        sk_bwd_params n;
        sk_bwd_varlen_narrow(p, row.x, i - row.y, &n);
        sk_bwd_dq_tile<kDtype, kD>(n, smem, 0, h, row.y * p.block_q + qsub * SK_BWD_TILE, info.y,
                                   info.z);
    } else {
        sk_bwd_dq_tile<kDtype, kD>(p, smem, b, h, i * p.block_q + qsub * SK_BWD_TILE, info.y,
                                   info.z);
    }
}

#endif /* SK_CUDA_ATTENTION_BWD_SM80_DQ_CUH */
