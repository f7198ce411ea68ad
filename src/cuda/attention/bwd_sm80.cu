/*
 * bwd_sm80.cu - the portable block-sparse attention backward (sm_80+):
 * FlashAttention-2 style recomputation with mma.sync tensor cores,
 * ldmatrix and cp.async, in three kernels on the run's stream:
 *
 *   pre-pass  one CTA per 64 query rows of a (batch, query head):
 *             Dl = rowsum(dO * O) in fp32 (a fixed-order sum) and
 *             lse2 = LSE log2(e), into the workspace rows padded to 64
 *             (0 past Sq), so that the other kernels load them as 16-byte
 *             chunks.
 *   dK/dV     one CTA per (batch, KV head, 64-key tile): its K and V stay
 *             in shared memory, its dK and dV in registers; it walks the
 *             transposed layout (bwd_kernels.h): for each query head of the
 *             group and each query block that selects the key block, the
 *             64-row query tiles that see a key of the tile (bwd_sm80_dkv.cuh).
 *   dQ        one CTA per (batch, query head, 64-row query tile), in the
 *             plan's longest-first order: Q, dO, lse2, Dl stay resident, dQ
 *             in registers; it walks the layout row's selected blocks in
 *             64-key chunks (bwd_sm80_dq.cuh).
 *   fused     bwd->deterministic = 0 off the Hopper kernels: the dK/dV
 *             kernel also adds each item's dQ into an fp32 dQaccum
 *             (bwd_sm80_fused.cuh), then a post-pass converts it; no dQ pass.
 * Both recompute S = s Q K^T, P = 2^(S log2(e) - lse2), dP = dO V^T and
 * dS = P (dP - Dl) for their pairs; dK/dV accumulates dV += P^T dO and
 * dK += dS^T Q, dQ accumulates dQ += dS K; the scale s multiplies dQ and dK
 * once, at the end. P and dS are rounded to the dtype only as MMA operands
 * (fp32 accumulation everywhere).
 *
 * CTA: 4 warps; each warp owns 16 rows of the CTA's tile (keys for dK/dV,
 * queries for dQ), whose A-operand rows in shared memory only it reads, and
 * whose accumulators it holds (2 x 16 x D and 16 x D fp32). Per warp step
 * S (or S^T) is a 16 x 64 tile (16 x 32 at D = 128 in dK/dV, to stay within
 * 255 registers); P and dS go from the accumulators straight into the A
 * fragments of the next MMA (no shared memory). The streamed operand (Q/dO
 * tiles for dK/dV, K/V chunks for dQ) is double-buffered with cp.async,
 * one CTA barrier per tile. Outputs are staged through the warp's own rows
 * and stored as 16-byte row chunks.
 *
 * Masks and NaN: a pair (q, k) counts iff q < Sq, k < Sk and, when causal,
 * k <= q + Sk - Sq (its blocks being selected). Rows that cannot count in a
 * tile are zero-filled by cp.async (src-size 0), never read: in dK/dV the
 * query rows past Sq or before the tile's first visible one (q + Sk - Sq <
 * first key), in dQ the keys past Sk or past the tile's last visible one.
 * Every other row of a tile has a counted pair, so it belongs to a row or
 * key with finite inputs (sparsek.h: only the inputs of empty rows and of
 * keys without pairs may be NaN). Masked entries are selected to 0, never
 * multiplied, so NaN in a masked logit, dP, LSE or Dl stays out.
 *
 * Determinism: each output element has one owner (CTA, warp, lane) that
 * accumulates in a fixed order (the layout's and T's entry order), so the
 * results are bitwise the same on every run whatever the schedule. The
 * fused form's dQ is the exception (fp32 atomics, any order); its dK and
 * dV are the same arithmetic, so the same bits.
 *
 * Invariants: nothing outside [0, Sq) x [0, Sk) of the inputs is read and
 * only dQ, dK, dV rows inside their extents are written; layout and plan
 * content is clamped, so any content stays in bounds. Index math inside
 * the loops is 32-bit (sequence strides are checked below 2^24 bytes).
 */
#include <math.h>
#include <stdint.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/attention/bwd_dqacc.cuh"
#include "cuda/attention/bwd_kernels.h"
#include "cuda/attention/bwd_params.h"
#include "cuda/attention/bwd_sm80_fused.h"
#include "cuda/attention/sm80_common.cuh"
#include "cuda/common/cuda_check.cuh"
#include "cuda/common/ptx.cuh"

enum {
    SK_BWD_WARPS = 4,
    SK_BWD_THREADS = 32 * SK_BWD_WARPS,
    SK_BWD_CTAS_PER_SM = 2,
    SK_BWD_WARP_ROWS = SK_BWD_TILE / SK_BWD_WARPS, /* 16: one m16 tile per warp */
    SK_BWD_SMEM_LIMIT = 227 * 1024,
    SK_BWD_MAX_SEQ_STRIDE_BYTES = 1 << 24,
    SK_BWD_MAX_SEQ = 0x7fffffff - 2 * 128
};


/* This warp's 16 accumulator rows (m16n8 fragments over D: acc[dt] holds
 * rows g, g + 8 and columns 8 dt + 2 t4, + 1) times `mul`, rounded to the
 * dtype, written to rows [0, valid) of dst (byte row stride `stride`),
 * staged through the warp's 16 swizzled shared rows at `staged`, which no
 * other warp reads meanwhile. */
template <int kDtype, int kD>
__device__ __forceinline__ void sk_bwd_store_rows_warp(const float (&acc)[kD / 8][4], float mul,
                                                       unsigned char *staged, char *dst,
                                                       int32_t stride, int valid) {
    constexpr int kRowBytes = kD * 2, kChunks = kD / 8, kStep = 32 / kChunks;
    const int lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int ii = 0; ii < 2; ++ii) {
        unsigned char *row = staged + (g + 8 * ii) * kRowBytes + 4 * t4; /* its swizzle is g */
#pragma unroll
        for (int dt = 0; dt < kChunks; ++dt)
            *(uint32_t *)(row + (((uint32_t)dt ^ (uint32_t)g) << 4)) =
                sk_sm80_pack<kDtype>(acc[dt][2 * ii] * mul, acc[dt][2 * ii + 1] * mul);
    }
    __syncwarp();
    const int c = lane % kChunks, r0 = lane / kChunks;
#pragma unroll
    for (int k = 0; k < SK_BWD_WARP_ROWS / kStep; ++k) {
        const int r = r0 + k * kStep;
        if (r < valid)
            *(uint4 *)(dst + (uint32_t)r * (uint32_t)stride + c * 16) =
                *(const uint4 *)(staged + r * kRowBytes + (((uint32_t)(c ^ (r & 7))) << 4));
    }
    __syncwarp();
}

/* Per-lane ldmatrix terms (fragment rows are multiples of 8 plus lane & 7,
 * so a row's swizzle is lane & 7): the A operand (row-major [m][k]), the B
 * operand from [n][k] rows (non-transposed) and from [k][n] rows
 * (transposed); *_row is the lane's row offset in bytes, *_y its chunk
 * XOR term. */
typedef struct sk_bwd_lane {
    uint32_t a_row, a_y, b_row, b_y, t_row, t_y;
} sk_bwd_lane;

template <int kD>
__device__ __forceinline__ sk_bwd_lane sk_bwd_lane_terms(void) {
    const int lane = threadIdx.x & 31;
    const int lrow = lane & 7, lsel8 = (lane >> 3) & 1, lsel16 = lane >> 4;
    sk_bwd_lane l;
    l.a_row = (uint32_t)((lrow + 8 * lsel8) * kD * 2);
    l.a_y = (uint32_t)(lsel16 ^ lrow);
    l.b_row = (uint32_t)((lrow + 8 * lsel16) * kD * 2);
    l.b_y = (uint32_t)(lsel8 ^ lrow);
    l.t_row = (uint32_t)((lrow + 8 * lsel8) * kD * 2);
    l.t_y = (uint32_t)(lsel16 ^ lrow);
    return l;
}

/* The first GEMM pair of both kernels, over D, for this warp's 16 rows:
 *   s  = A1 B1^T,  dp = A2 B2^T   (16 x 8 kNT each, fp32, zeroed here)
 * A1, A2: the warp's 16 rows (a1, a2: the lane's ldmatrix row address);
 * B1, B2: 8 kNT rows [n][D] (b1, b2: the lane's row address, from n = 0). */
template <int kDtype, int kD, int kNT>
__device__ __forceinline__ void sk_bwd_mma_pair(float (&s)[kNT][4], float (&dp)[kNT][4],
                                                uint32_t a1, uint32_t a2, uint32_t b1,
                                                uint32_t b2, const sk_bwd_lane &ln) {
    constexpr int kRowBytes = kD * 2;
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int r = 0; r < 4; ++r) s[nt][r] = dp[nt][r] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
        uint32_t x1[4], x2[4];
        sk_ldmatrix_x4(x1, a1 + (((uint32_t)(2 * kk) ^ ln.a_y) << 4));
        sk_ldmatrix_x4(x2, a2 + (((uint32_t)(2 * kk) ^ ln.a_y) << 4));
#pragma unroll
        for (int np2 = 0; np2 < kNT / 2; ++np2) {
            uint32_t bb[4];
            const uint32_t off =
                (uint32_t)(np2 * 16 * kRowBytes) + (((uint32_t)(2 * kk) ^ ln.b_y) << 4);
            sk_ldmatrix_x4(bb, b1 + off);
            sk_sm80_mma<kDtype>(s[2 * np2], x1, bb[0], bb[1]);
            sk_sm80_mma<kDtype>(s[2 * np2 + 1], x1, bb[2], bb[3]);
            sk_ldmatrix_x4(bb, b2 + off);
            sk_sm80_mma<kDtype>(dp[2 * np2], x2, bb[0], bb[1]);
            sk_sm80_mma<kDtype>(dp[2 * np2 + 1], x2, bb[2], bb[3]);
        }
    }
}

/* Accumulators of n8 tiles 2 kk and 2 kk + 1 as the A fragment of k16 step
 * kk (rows g, g + 8; columns 2 t4, + 1 and 8 + 2 t4, + 1): no shared memory. */
template <int kDtype, int kNT>
__device__ __forceinline__ void sk_bwd_to_a(const float (&s)[kNT][4], uint32_t (&a)[kNT / 2][4]) {
#pragma unroll
    for (int kk = 0; kk < kNT / 2; ++kk) {
        a[kk][0] = sk_sm80_pack<kDtype>(s[2 * kk][0], s[2 * kk][1]);
        a[kk][1] = sk_sm80_pack<kDtype>(s[2 * kk][2], s[2 * kk][3]);
        a[kk][2] = sk_sm80_pack<kDtype>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        a[kk][3] = sk_sm80_pack<kDtype>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
    }
}

/* acc (16 x D) += A (16 x 16 kPK, fragments) B, with B's 16 kPK rows [k][D]
 * in shared memory (b: the lane's transposed-ldmatrix row address). With
 * kN < kD, acc is the slab of columns c0 .. c0 + kN - 1 (c0 a multiple of
 * 16; the fused dQ product, bwd_sm80_fused.cuh). */
template <int kDtype, int kD, int kPK, int kN = kD>
__device__ __forceinline__ void sk_bwd_mma_rows(float (&acc)[kN / 8][4],
                                                const uint32_t (&a)[kPK][4], uint32_t b,
                                                const sk_bwd_lane &ln, int c0 = 0) {
#pragma unroll
    for (int kk = 0; kk < kPK; ++kk)
#pragma unroll
        for (int dp2 = 0; dp2 < kN / 16; ++dp2) {
            uint32_t bb[4];
            sk_ldmatrix_x4_trans(bb, b + (uint32_t)(kk * 16 * kD * 2) +
                                         (((uint32_t)(c0 / 8 + 2 * dp2) ^ ln.t_y) << 4));
            sk_sm80_mma<kDtype>(acc[2 * dp2], a[kk], bb[0], bb[1]);
            sk_sm80_mma<kDtype>(acc[2 * dp2 + 1], a[kk], bb[2], bb[3]);
        }
}

/* Varlen mode: *n = p narrowed to sequence b, whose layout rows start at
 * rs (its padded lse2 / Dl rows at rs * block_q): pointers at the
 * sequence's first query and key token, Sq = len_q (cut at the rows left
 * to it, so that a garbage plan stays inside the workspace), Sk = len_k,
 * the causal offset len_k - len_q, the column bound min(col_blocks, nb_k).
 * Lengths are clamped again here: any table content stays in bounds. */
__device__ __forceinline__ void sk_bwd_varlen_narrow(const sk_bwd_params &p, int32_t b,
                                                     int32_t rs, sk_bwd_params *n) {
    const int4 s = p.v_seqs[b]; /* {q0, len_q, k0, len_k} */
    const int32_t q0 = min(max(s.x, 0), p.seq_q), len_q = min(max(s.y, 0), p.seq_q - q0);
    const int32_t k0 = min(max(s.z, 0), p.seq_k), len_k = min(max(s.w, 0), p.seq_k - k0);
    rs = min(max(rs, 0), p.row_blocks);
    *n = p;
    n->q += (int64_t)q0 * p.q_ss;
    n->o += (int64_t)q0 * p.o_ss;
    n->dout += (int64_t)q0 * p.do_ss;
    n->dq += (int64_t)q0 * p.dq_ss;
    n->k += (int64_t)k0 * p.k_ss;
    n->v += (int64_t)k0 * p.v_ss;
    n->dk += (int64_t)k0 * p.dk_ss;
    n->dv += (int64_t)k0 * p.dv_ss;
    n->lse2 += (int64_t)rs * p.block_q;
    n->dl += (int64_t)rs * p.block_q;
    n->seq_q = min(len_q, (p.row_blocks - rs) * p.block_q);
    n->seq_k = len_k;
    n->diag = len_k - len_q;
    n->col_blocks = min(p.col_blocks, (len_k + p.block_k - 1) / p.block_k);
}

/* The kernels' parts: the fused dQ product, dK/dV (which calls it), then dQ. */
#include "cuda/attention/bwd_sm80_fused.cuh"
#include "cuda/attention/bwd_sm80_dkv.cuh"
#include "cuda/attention/bwd_sm80_dq.cuh"

/* ---------------------------------------------------------------------------
 * Pre-pass
 * ------------------------------------------------------------------------- */

/* The dot product of 8 dtype pairs, in a fixed order (widening is exact). */
template <int kDtype>
__device__ __forceinline__ float sk_bwd_dot8(uint4 a, uint4 b, float acc) {
    const uint32_t x[4] = {a.x, a.y, a.z, a.w}, y[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        float x0, x1, y0, y1;
        if constexpr (kDtype == SK_DTYPE_BF16) {
            x0 = __uint_as_float(x[e] << 16);
            x1 = __uint_as_float(x[e] & 0xffff0000u);
            y0 = __uint_as_float(y[e] << 16);
            y1 = __uint_as_float(y[e] & 0xffff0000u);
        } else {
            x0 = __half2float(__ushort_as_half((unsigned short)(x[e] & 0xffffu)));
            x1 = __half2float(__ushort_as_half((unsigned short)(x[e] >> 16)));
            y0 = __half2float(__ushort_as_half((unsigned short)(y[e] & 0xffffu)));
            y1 = __half2float(__ushort_as_half((unsigned short)(y[e] >> 16)));
        }
        acc = fmaf(x0, y0, acc);
        acc = fmaf(x1, y1, acc);
    }
    return acc;
}

/* One CTA per 64 rows of a (batch, query head): D / 8 threads per row,
 * each 16 bytes of dO and O, then a butterfly sum over those threads.
 * Varlen (kVarlen): the 64 padded rows qt of query head h lie in layout
 * row r = 64 qt / block_q, i.e. sequence b's query block i (the row
 * table), so rows past len_q(b) get 0. */
template <int kDtype, int kD, bool kVarlen>
__global__ void __launch_bounds__(SK_BWD_THREADS)
    sk_bwd_prepass_kernel(const __grid_constant__ sk_bwd_params p) {
    constexpr int kT = kD / 8, kRowsPerPass = SK_BWD_THREADS / kT;
    const int32_t qt = (int32_t)blockIdx.x % p.q_tiles, bh = (int32_t)blockIdx.x / p.q_tiles;
    const int32_t h = bh % p.heads_q, b = bh / p.heads_q;
    const int c = threadIdx.x % kT, r0 = threadIdx.x / kT;
    /* The tile's rows are tokens first .. first + count - 1 (count <= 0: none). */
    int32_t first = qt * SK_BWD_TILE, count = p.seq_q - first;
    if constexpr (kVarlen) {
        const int32_t r = qt * SK_BWD_TILE / p.block_q;
        const int2 row = p.v_rows[r];
        count = 0;
        if ((uint32_t)row.x < (uint32_t)p.v_batch && (uint32_t)row.y <= (uint32_t)r) {
            const int4 s = p.v_seqs[row.x];
            const int32_t q0 = min(max(s.x, 0), p.seq_q), len_q = min(max(s.y, 0), p.seq_q - q0);
            const int32_t local = row.y * p.block_q + (qt * SK_BWD_TILE - r * p.block_q);
            first = q0 + local;
            count = len_q - local;
        }
    }
    const char *o = p.o + b * p.o_sb + h * p.o_sh + c * 16;
    const char *d = p.dout + b * p.do_sb + h * p.do_sh + c * 16;
#pragma unroll 4
    for (int r = r0; r < SK_BWD_TILE; r += kRowsPerPass) {
        const int32_t q = first + r;
        const bool ok = r < count;
        float sum = 0.f;
        if (ok)
            sum = sk_bwd_dot8<kDtype>(*(const uint4 *)(o + (int64_t)q * p.o_ss),
                                      *(const uint4 *)(d + (int64_t)q * p.do_ss), 0.f);
#pragma unroll
        for (int off = kT / 2; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
        if (c == 0) {
            const int64_t at = (int64_t)bh * p.sq_pad + qt * SK_BWD_TILE + r;
            p.dl[at] = ok ? sum : 0.f;
            p.lse2[at] = ok ? p.lse[(int64_t)bh * p.seq_q + q] * SK_BWD_LOG2E : 0.f;
        }
    }
}

/* ---------------------------------------------------------------------------
 * dQ post-pass (bwd->deterministic = 0, after the fused Hopper pass)
 * ------------------------------------------------------------------------- */

/* dQ = s x dQaccum, rounded once to the dtype, at the caller's strides: one
 * thread per 8 elements of a row (two 16-byte loads, one 16-byte store),
 * grid-stride over the B * Hq * Sq rows; dQaccum's element order is
 * bwd_dqacc.cuh's. With GQA dQ is per query head:
 * nothing to reduce. Rows past Sq of dQaccum are padding, never read. */
template <int kDtype, int kD>
__global__ void __launch_bounds__(256)
    sk_bwd_dq_post_kernel(const __grid_constant__ sk_bwd_params p, const float *acc) {
    constexpr int kChunks = kD / 8;
    const int64_t total = (int64_t)p.dq_tiles / p.row_blocks * p.seq_q * kChunks;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int c = (int)(i % kChunks);
        const int64_t row = i / kChunks;
        const int32_t q = (int32_t)(row % p.seq_q), bh = (int32_t)(row / p.seq_q);
        const int32_t h = bh % p.heads_q, b = bh / p.heads_q;
#if SK_BWD90_DQ_BULK
        const float4 *src =
            (const float4 *)(acc + (int64_t)bh * p.sq_pad * kD + sk_bwd_dqacc_at<kD>(q, 8 * c));
#else
        const float4 *src = (const float4 *)(acc + ((int64_t)bh * p.sq_pad + q) * kD + 8 * c);
#endif
        const float4 x = src[0], y = src[1];
        uint4 out;
        out.x = sk_sm80_pack<kDtype>(x.x * p.scale, x.y * p.scale);
        out.y = sk_sm80_pack<kDtype>(x.z * p.scale, x.w * p.scale);
        out.z = sk_sm80_pack<kDtype>(y.x * p.scale, y.y * p.scale);
        out.w = sk_sm80_pack<kDtype>(y.z * p.scale, y.w * p.scale);
        *(uint4 *)(p.dq + b * p.dq_sb + h * p.dq_sh + (int64_t)q * p.dq_ss + 16 * c) = out;
    }
}

/* ---------------------------------------------------------------------------
 * Host side
 * ------------------------------------------------------------------------- */

static_assert(sk_bwd_dkv_smem_bytes<128>() <= SK_BWD_SMEM_LIMIT / SK_BWD_CTAS_PER_SM,
              "two dK/dV CTAs (K, V and two stages of Q, dO, lse2, Dl) must fit one SM");
static_assert(sk_bwd_dq_smem_bytes<128>() <= SK_BWD_SMEM_LIMIT / SK_BWD_CTAS_PER_SM,
              "two dQ CTAs (Q, dO and two stages of K, V) must fit one SM");
/* 2 x (115,712 + the 1 KB the runtime reserves a CTA) = 228 KB: an H100 SM exactly. */
static_assert(sk_bwd_dkv_smem_bytes<128, true>() + 1024 <= 228 * 1024 / SK_BWD_CTAS_PER_SM,
              "two fused dK/dV CTAs (the dK/dV kernel's + two dS^T buffers) must fit one SM");

sk_status sk_attention_bwd_sm80_check(const sk_attention_backward_problem *bp) {
    const sk_attention_problem *p = &bp->fwd;
    if (p->dtype != SK_DTYPE_F16 && p->dtype != SK_DTYPE_BF16)
        return sk_error(SK_STATUS_NOT_SUPPORTED,
                        "desc->dtype = %d: the CUDA backward takes F16 or BF16 only",
                        (int)p->dtype);
    if (p->head_dim != 64 && p->head_dim != 128)
        return sk_error(SK_STATUS_NOT_SUPPORTED,
                        "desc->head_dim = %lld is not supported by the CUDA backward (64 or 128)",
                        (long long)p->head_dim);
    if ((p->block_q != 64 && p->block_q != 128) || (p->block_k != 64 && p->block_k != 128))
        return sk_error(SK_STATUS_NOT_SUPPORTED,
                        "layout blocks %d x %d: the CUDA backward takes 64 or 128",
                        (int)p->block_q, (int)p->block_k);
    if (p->seq_q > SK_BWD_MAX_SEQ || p->seq_k > SK_BWD_MAX_SEQ)
        return sk_error(SK_STATUS_NOT_SUPPORTED,
                        "desc->seq_q = %lld, desc->seq_k = %lld: the CUDA backward takes at most "
                        "%d tokens",
                        (long long)p->seq_q, (long long)p->seq_k, (int)SK_BWD_MAX_SEQ);
    /* A sequence of one token never steps its stride. */
    const int64_t sq = p->seq_q > 1, sk = p->seq_k > 1;
    const int64_t ss[8] = {sq * p->q_stride[1],       sk * p->k_stride[1],
                           sk * p->v_stride[1],       sq * p->o_stride[1],
                           sq * bp->dout_stride[1],   sq * bp->dq_stride[1],
                           sk * bp->dk_stride[1],     sk * bp->dv_stride[1]};
    static const char *const names[8] = {"desc->q_strides[1]",     "desc->k_strides[1]",
                                         "desc->v_strides[1]",     "desc->o_strides[1]",
                                         "bwd->dout_strides[1]",   "bwd->dq_strides[1]",
                                         "bwd->dk_strides[1]",     "bwd->dv_strides[1]"};
    for (int i = 0; i < 8; ++i)
        if (ss[i] * 2 >= SK_BWD_MAX_SEQ_STRIDE_BYTES)
            return sk_error(SK_STATUS_NOT_SUPPORTED,
                            "%s = %lld elements: the CUDA backward needs sequence strides below "
                            "%d bytes",
                            names[i], (long long)ss[i], (int)SK_BWD_MAX_SEQ_STRIDE_BYTES);
    return SK_STATUS_SUCCESS;
}

/* dQ from dQaccum: the post-pass after a fused pass. */
template <int kDtype, int kD>
static sk_status sk_bwd_dq_post_launch(const sk_bwd_params &k, const sk_bwd_shape *s,
                                       const float *dqacc, cudaStream_t stream) {
    const int64_t chunks = (int64_t)(s->dq_tiles / k.row_blocks) * k.seq_q * (kD / 8);
    const int64_t blocks = (chunks + 255) / 256;
    const int grid = (int)(blocks < 65536 * 16 ? blocks : 65536 * 16);
    sk_bwd_dq_post_kernel<kDtype, kD><<<grid, 256, 0, stream>>>(k, dqacc);
    SK_CUDA_TRY(cudaGetLastError(), "backward dQ post-pass kernel launch");
    return SK_STATUS_SUCCESS;
}

static int64_t sk_bwd80_fused_count = 0;

extern "C" int64_t sk_bwd80_fused_launches(void) {
    return __atomic_load_n(&sk_bwd80_fused_count, __ATOMIC_RELAXED);
}

/* The portable fused pass (deterministic = 0 off the Hopper kernels):
 * dQaccum zeroed (a memset node when captured), the dK/dV kernel in its
 * fused form, then the post-pass. *launched = 0 and nothing enqueued where
 * a block cannot have its shared memory (113 KB at D = 128: compute
 * capability 8.6 / 8.9 give 99 KB): the deterministic passes run then. */
template <int kDtype, int kD>
static sk_status sk_bwd_fused_launch(const sk_bwd_params &k, const sk_bwd_shape *s, float *dqacc,
                                     size_t dqacc_bytes, cudaStream_t stream, int *launched) {
    *launched = 0;
    const int smem = (int)sk_bwd_dkv_smem_bytes<kD, true>();
    int device = 0, optin = 0;
    SK_CUDA_TRY(cudaGetDevice(&device), "cudaGetDevice");
    SK_CUDA_TRY(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
                "cudaDeviceGetAttribute");
    if (optin < smem) return SK_STATUS_SUCCESS;
    SK_CUDA_TRY(cudaMemsetAsync(dqacc, 0, dqacc_bytes, stream), "zeroing the backward's dQaccum");
    sk_bwd_params kf = k;
    kf.dqacc = dqacc;
    void (*dkv)(sk_bwd_params) = sk_bwd_dkv_kernel<kDtype, kD, false, true>;
    SK_CUDA_TRY(cudaFuncSetAttribute(dkv, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
                "cudaFuncSetAttribute (fused backward dK/dV/dQ)");
    dkv<<<s->dkv_tiles * (k.block_k / SK_BWD_TILE), SK_BWD_THREADS, smem, stream>>>(kf);
    SK_CUDA_TRY(cudaGetLastError(), "fused backward dK/dV/dQ kernel launch");
    SK_TRY((sk_bwd_dq_post_launch<kDtype, kD>(k, s, dqacc, stream)));
    __atomic_fetch_add(&sk_bwd80_fused_count, 1, __ATOMIC_RELAXED);
    *launched = 1;
    return SK_STATUS_SUCCESS;
}

/* The pre-pass, then the dK/dV and dQ passes on the stream: each pass on
 * the Hopper kernel when `hopper` and it covers the problem, else on the
 * portable kernel. With dqacc (deterministic = 0), first the fused Hopper
 * pass and the dQ post-pass, where it covers the problem; without the
 * Hopper kernels, the portable fused pass. */
template <int kDtype, int kD, bool kVarlen>
static sk_status sk_bwd_launch_typed(const sk_attention_backward_problem *bp,
                                     const sk_bwd_params &k, const sk_bwd_shape *s, int hopper,
                                     float *dqacc, size_t dqacc_bytes, cudaStream_t stream) {
    const int prepass = (s->dq_tiles / k.row_blocks) * k.q_tiles; /* B * Hq * q_tiles */
    sk_bwd_prepass_kernel<kDtype, kD, kVarlen><<<prepass, SK_BWD_THREADS, 0, stream>>>(k);
    SK_CUDA_TRY(cudaGetLastError(), "backward pre-pass kernel launch");

    int launched = 0;
    if (hopper && dqacc != NULL) {
        SK_TRY(sk_attention_bwd_sm90_fused_launch(bp, s, &k, dqacc, dqacc_bytes, stream,
                                                  &launched));
        if (launched) return sk_bwd_dq_post_launch<kDtype, kD>(k, s, dqacc, stream);
    }
    if constexpr (!kVarlen)
        if (!hopper && dqacc != NULL) {
            SK_TRY((sk_bwd_fused_launch<kDtype, kD>(k, s, dqacc, dqacc_bytes, stream, &launched)));
            if (launched) return SK_STATUS_SUCCESS;
        }
    if (hopper) SK_TRY(sk_attention_bwd_sm90_dkv_launch(bp, s, &k, stream, &launched));
    if (!launched) {
        void (*dkv)(sk_bwd_params) = sk_bwd_dkv_kernel<kDtype, kD, kVarlen>;
        const int dkv_smem = (int)sk_bwd_dkv_smem_bytes<kD>();
        SK_CUDA_TRY(cudaFuncSetAttribute(dkv, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         dkv_smem),
                    "cudaFuncSetAttribute (backward dK/dV)");
        const int dkv_grid = s->dkv_tiles * (k.block_k / SK_BWD_TILE);
        dkv<<<dkv_grid, SK_BWD_THREADS, dkv_smem, stream>>>(k);
        SK_CUDA_TRY(cudaGetLastError(), "backward dK/dV kernel launch");
    }

    launched = 0;
    if (hopper) SK_TRY(sk_attention_bwd_sm90_dq_launch(bp, s, &k, stream, &launched));
    if (!launched) {
        void (*dq)(sk_bwd_params) = sk_bwd_dq_kernel<kDtype, kD, kVarlen>;
        const int dq_smem = (int)sk_bwd_dq_smem_bytes<kD>();
        SK_CUDA_TRY(cudaFuncSetAttribute(dq, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         dq_smem),
                    "cudaFuncSetAttribute (backward dQ)");
        const int dq_grid = s->dq_tiles * (k.block_q / SK_BWD_TILE);
        dq<<<dq_grid, SK_BWD_THREADS, dq_smem, stream>>>(k);
        SK_CUDA_TRY(cudaGetLastError(), "backward dQ kernel launch");
    }
    return SK_STATUS_SUCCESS;
}

/* A tensor's element strides [batch, seq, head] as the kernels' byte
 * strides (F16 and BF16: 2 bytes). Axes of one element are never stepped,
 * so their strides may be anything: 0 here. */
static void sk_bwd_strides(const int64_t st[3], int nb, int nh, int ns, int64_t *sb, int64_t *sh,
                           int32_t *ss) {
    *sb = nb ? st[0] * 2 : 0;
    *sh = nh ? st[2] * 2 : 0;
    *ss = ns ? (int32_t)(st[1] * 2) : 0;
}

sk_status sk_attention_bwd_sm80_launch(const sk_attention_backward_problem *bp,
                                       const sk_bwd_shape *s, const sk_bwd_plan_view *v,
                                       cudaStream_t stream) {
    const sk_attention_problem *p = &bp->fwd;
    SK_TRY(sk_attention_bwd_sm80_check(bp));
    sk_bwd_params k;
    k.q = (const char *)p->q;
    k.k = (const char *)p->k;
    k.v = (const char *)p->v;
    k.o = (const char *)p->o;
    k.dout = (const char *)bp->dout;
    k.dq = (char *)bp->dq;
    k.dk = (char *)bp->dk;
    k.dv = (char *)bp->dv;
    k.lse = p->lse;
    k.lse2 = v->lse2;
    k.dl = v->dl;
    const int nb = p->batch > 1, nhq = p->heads_q > 1, nhk = p->heads_kv > 1;
    const int nsq = p->seq_q > 1, nsk = p->seq_k > 1;
    sk_bwd_strides(p->q_stride, nb, nhq, nsq, &k.q_sb, &k.q_sh, &k.q_ss);
    sk_bwd_strides(p->k_stride, nb, nhk, nsk, &k.k_sb, &k.k_sh, &k.k_ss);
    sk_bwd_strides(p->v_stride, nb, nhk, nsk, &k.v_sb, &k.v_sh, &k.v_ss);
    sk_bwd_strides(p->o_stride, nb, nhq, nsq, &k.o_sb, &k.o_sh, &k.o_ss);
    sk_bwd_strides(bp->dout_stride, nb, nhq, nsq, &k.do_sb, &k.do_sh, &k.do_ss);
    sk_bwd_strides(bp->dq_stride, nb, nhq, nsq, &k.dq_sb, &k.dq_sh, &k.dq_ss);
    sk_bwd_strides(bp->dk_stride, nb, nhk, nsk, &k.dk_sb, &k.dk_sh, &k.dk_ss);
    sk_bwd_strides(bp->dv_stride, nb, nhk, nsk, &k.dv_sb, &k.dv_sh, &k.dv_ss);
    k.seq_q = (int32_t)p->seq_q;
    k.seq_k = (int32_t)p->seq_k;
    k.diag = (int32_t)(p->seq_k - p->seq_q);
    k.sq_pad = (int32_t)s->sq_pad;
    k.q_tiles = (int32_t)(s->sq_pad / SK_BWD_TILE);
    k.heads_q = (int32_t)p->heads_q;
    k.heads_kv = (int32_t)p->heads_kv;
    k.group = p->group;
    k.block_q = p->block_q;
    k.block_k = p->block_k;
    k.row_blocks = p->row_blocks;
    k.col_blocks = p->col_blocks;
    k.nnz = p->nnz;
    k.causal = p->causal;
    k.col_indices = p->col_indices;
    k.dq_info = v->dq_info;
    k.dkv_info = v->dkv_info;
    k.t_entries = v->t_entries;
    k.dq_tiles = s->dq_tiles;
    k.dkv_tiles = s->dkv_tiles;
    k.t_group = s->t_group;
    k.t_reps = p->group / s->t_group;
    k.scale = p->scale;
    k.scale_log2 = p->scale * SK_BWD_LOG2E;
    /* Varlen mode: the varlen plan's tables; never the Hopper kernels. */
    k.v_seqs = v->seqs;
    k.v_row_start = v->row_start;
    k.v_rows = v->rows;
    k.v_cols = v->cols;
    k.v_batch = v->batch;
    k.v_col_cap = v->col_cap;
    k.dqacc = NULL; /* the portable fused pass sets its own copy's */
    if (v->seqs != NULL) {
        if (p->dtype == SK_DTYPE_F16)
            return p->head_dim == 64
                       ? sk_bwd_launch_typed<SK_DTYPE_F16, 64, true>(bp, k, s, 0, NULL, 0,
                                                                     stream)
                       : sk_bwd_launch_typed<SK_DTYPE_F16, 128, true>(bp, k, s, 0, NULL, 0,
                                                                      stream);
        return p->head_dim == 64
                   ? sk_bwd_launch_typed<SK_DTYPE_BF16, 64, true>(bp, k, s, 0, NULL, 0, stream)
                   : sk_bwd_launch_typed<SK_DTYPE_BF16, 128, true>(bp, k, s, 0, NULL, 0,
                                                                   stream);
    }
    const int h = v->hopper;
    float *acc = v->dqacc;
    const size_t ab = v->dqacc_bytes;
    if (p->dtype == SK_DTYPE_F16)
        return p->head_dim == 64
                   ? sk_bwd_launch_typed<SK_DTYPE_F16, 64, false>(bp, k, s, h, acc, ab, stream)
                   : sk_bwd_launch_typed<SK_DTYPE_F16, 128, false>(bp, k, s, h, acc, ab, stream);
    return p->head_dim == 64
               ? sk_bwd_launch_typed<SK_DTYPE_BF16, 64, false>(bp, k, s, h, acc, ab, stream)
               : sk_bwd_launch_typed<SK_DTYPE_BF16, 128, false>(bp, k, s, h, acc, ab, stream);
}
