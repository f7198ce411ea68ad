/*
 * bwd_sm80_fused.cuh - the dQ half of the portable fused backward
 * (bwd->deterministic = 0; part of bwd_sm80.cu, included there only,
 * before the dK/dV kernel that calls it: bwd_sm80_dkv.cuh with kFuse).
 * docs/perf/backward_sm80.md, "Fused one-pass", is the design.
 *
 * The dK/dV CTA owns 64 keys; for each item (query head, 64-row query
 * tile) its warps store their dS^T (16 keys x 64 queries each) into a
 * [64 keys][64 queries] buffer; one item later, after a CTA barrier, warp
 * w computes dQ rows 16 w .. 16 w + 15 of that item over the 64 keys,
 * dQ_part = dS K (A: dS by ldmatrix.trans of the buffer, B: the K tile by
 * ldmatrix.trans), in 64-column slabs of fp32 registers, and adds each
 * accumulator pair into the workspace's fp32 dQaccum (element order:
 * bwd_dqacc.cuh, shared with the Hopper path and its post-pass) with
 * red.global.add (v2 in the sm_90a build). So dQ is a sum in no fixed
 * order (not bitwise repeatable); dK and dV are untouched.
 */
#ifndef SK_CUDA_ATTENTION_BWD_SM80_FUSED_CUH
#define SK_CUDA_ATTENTION_BWD_SM80_FUSED_CUH

#include "cuda/attention/bwd_dqacc.cuh"

enum {
    SK_BWD_DS_BYTES = SK_BWD_TILE * SK_BWD_TILE * 2 /* one dS^T buffer: 64 x 64 of the dtype */
};

/* a[0] += x, a[1] += y in L2 (a 8-byte aligned): one vector red on sm_90,
 * two scalar ones in the sm_80 build. */
__device__ __forceinline__ void sk_bwd_red_add2(float *a, float x, float y) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    sk_red_add_v2_f32(a, x, y);
#else
    sk_red_add_f32(a, x);
    sk_red_add_f32(a + 1, y);
#endif
}

/* One past the last key of the tile's (b, hk) that a pair of the walk over
 * T entries [start, end) can reach: Sk, or when causal the last row of the
 * largest query block in the T row, + Sk - Sq (+ 1). Keys from there on
 * count in no pair at all (each key's pairs are all in its CTA's walk), so
 * their K rows may be NaN and are zero-filled for the dQ product. Every
 * warp scans the row (32 entries a step) and reduces it itself: no barrier. */
__device__ __forceinline__ int32_t sk_bwd_fused_klim(const sk_bwd_params &p, int32_t start,
                                                     int32_t end) {
    if (!p.causal) return p.seq_k;
    const int lane = threadIdx.x & 31;
    int32_t imax = -1;
    for (int32_t pos = start + lane; pos < end; pos += 32) {
        const int32_t e = __ldg(p.t_entries + pos);
        if ((uint32_t)e < (uint32_t)(p.t_group * p.row_blocks)) imax = max(imax, e % p.row_blocks);
    }
    imax = __reduce_max_sync(0xffffffffu, imax);
    if (imax < 0) return 0;
    const int32_t last = min((imax + 1) * p.block_q, p.seq_q) - 1;
    return max(0, min(p.seq_k, last + p.diag + 1));
}

/* This warp's dQ rows of an item (query head h, queries q0 + 16 w ..)
 * over keys kt .. kt + 63, added into dqacc: dS from the dS^T buffer at
 * ds (shared address), K from the K tile at kbase (all 64 rows: the
 * barrier before this call orders them); keys from klim on and the 16-key
 * groups that no row of the warp sees are skipped, rows past Sq add
 * nothing. */
template <int kDtype, int kD>
__device__ __forceinline__ void sk_bwd_fused_dq(const sk_bwd_params &p, const sk_bwd_lane &ln,
                                                uint32_t kbase, uint32_t ds, int32_t b,
                                                int32_t h, int32_t q0, int32_t kt,
                                                int32_t klim, float *dqacc) {
    constexpr int kRowBytes = kD * 2, kGroups = SK_BWD_TILE / 16, kSlab = 64;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
    const int lrow = lane & 7, lsel8 = (lane >> 3) & 1, lsel16 = lane >> 4;
    const int32_t qw = q0 + SK_BWD_WARP_ROWS * warp;
    if (qw >= p.seq_q) return;
    int32_t kend = min(klim, kt + SK_BWD_TILE); /* keys kt .. kend - 1 may count */
    if (p.causal) kend = min(kend, min(qw + SK_BWD_WARP_ROWS, p.seq_q) + p.diag);
    if (kend <= kt) return;
    const int groups = (kend - kt + 15) / 16;
    /* A fragments of dS (queries qw.., keys 16 kk..): the buffer holds
     * [key][query] rows, so ldmatrix.trans; matrix m = 2 lsel16 + lsel8 is
     * keys 16 kk + 8 lsel16 .., queries 16 w + 8 lsel8 .. */
    uint32_t a[kGroups][1][4];
#pragma unroll
    for (int kk = 0; kk < kGroups; ++kk)
        if (kk < groups)
            sk_ldmatrix_x4_trans(a[kk][0], ds + (uint32_t)(16 * kk + lrow + 8 * lsel16) * 128u +
                                               ((uint32_t)((2 * warp + lsel8) ^ lrow) << 4));
    float *blk = dqacc + ((int64_t)b * p.heads_q + h) * p.sq_pad * kD;
#pragma unroll
    for (int c0 = 0; c0 < kD; c0 += kSlab) {
        float acc[kSlab / 8][4];
#pragma unroll
        for (int j = 0; j < kSlab / 8; ++j)
#pragma unroll
            for (int r = 0; r < 4; ++r) acc[j][r] = 0.f;
#pragma unroll
        for (int kk = 0; kk < kGroups; ++kk)
            if (kk < groups)
                sk_bwd_mma_rows<kDtype, kD, 1, kSlab>(
                    acc, a[kk], kbase + (uint32_t)(16 * kk * kRowBytes) + ln.t_row, ln, c0);
#pragma unroll
        for (int ii = 0; ii < 2; ++ii) {
            const int32_t r = qw + g + 8 * ii;
            if (r >= p.seq_q) continue;
#pragma unroll
            for (int j = 0; j < kSlab / 8; ++j)
                sk_bwd_red_add2(blk + sk_bwd_dqacc_at<kD>(r, c0 + 8 * j + 2 * t4),
                                acc[j][2 * ii], acc[j][2 * ii + 1]);
        }
    }
}

#endif /* SK_CUDA_ATTENTION_BWD_SM80_FUSED_CUH */
