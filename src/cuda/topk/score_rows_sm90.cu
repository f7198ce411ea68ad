/*
 * score_rows_sm90.cu - the Hopper block scoring of the top-k selection
 * for head_dim <= 128: scores[slice, i, j] = scale * sum_d A[i, d] *
 * pooled_k[j, d] on the tensor cores. Two kernels:
 *
 *   split  (a CTA per 128-row tile of pooled K) every row of K, once:
 *          scaled by 2^e so that its largest finite |x| lies in
 *          [2^14, 2^15) (exact), then hi = fp16(x 2^e), lo = fp16(x 2^e -
 *          hi), stored as the scoring's 128B-swizzled shared-memory panels
 *          with each row's epilogue factor (split_operands in
 *          kernels.cuh). It waits for the pooling before it lets the
 *          scoring start (pdl_wait_then_release). Not launched when the
 *          pooling split both operands itself (sk_pool_select_topk:
 *          split.q_tiles set).
 *   score  one CTA per 128-row tile of a slice, the heaviest tiles first
 *          (with causal the last row tile of each slice has the most column
 *          tiles), so that the in-order CTA dispatch balances the SMs,
 *          1 CTA per SM (196 KB of shared memory). It loads and splits its
 *          own A rows the same way into shared memory (their only reader)
 *          before it waits for the split kernel, or bulk-copies them when
 *          the pooling split them (q_tiles), then bulk-copies two K tiles
 *          (cp.async.bulk, one thread, mbarrier). Per column tile
 *          each warpgroup (64 rows) issues 3 x D/16 wgmma m64n128k16 and
 *          waits; warpgroup 1 issues a tile's wgmma only once warpgroup
 *          0's are complete, so that one warpgroup's stores run under the
 *          other's wgmma rather than both at once; the tile after next is
 *          copied into the buffer just read (by warp 4, the first of the
 *          later warpgroup, once every warp has arrived at that buffer's
 *          named barrier; the other warps do not wait), and the fragments
 *          are scaled and stored (streaming: the selection reads the scores
 *          once). (Two accumulators, the next tile's wgmma under this
 *          tile's stores, measured slower: 54.7 against 47.7 us,
 *          docs/perf/topk_log.md step 12. Stores staged through shared memory
 *          as whole rows, slower: step 17.)
 *
 * Numbers: hi * hi + hi * lo + lo * hi carries about 22 bits (the dropped
 * lo * lo term is below 2^-22 |x y|, as with the 3xTF32 split of
 * score_sm90.cu) at twice the tf32 rate; the fp32 accumulator is
 * scaled back by scale 2^-(e_i + f_j): two multiplications (exact powers of
 * two, then one rounding) when every factor a thread holds is normal and
 * |e| <= SPLIT_FAST_EXP, else ldexpf (each thread decides for its 2 rows
 * and 32 columns). Entries far below their row's
 * largest (under 2^-24 of it) keep an absolute accuracy of ~2^-40 of that
 * largest rather than their own 22 bits; the fp32 dot-product tolerance is
 * relative to sum |terms|, which such entries do not dominate. Rows whose
 * largest |x| is below 2^-112 lose precision (the scale is clamped at
 * 2^126). Non-finite entries keep hi = x, lo = 0. Their hi * lo terms can
 * then be inf * 0 = NaN where the fp32 dot product gives +-inf, so a row
 * holding such an entry gets factor 0 (split_row_factor): its scores take
 * the general epilogue, which rewrites an inf or NaN score with the fp32
 * dot product's inf or NaN (sr_fix_nonfinite).
 *
 * Tiles past the candidates of the row tile's last row are skipped, as in
 * the other scoring kernels (those scores are never read).
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <float.h>
#include <stdint.h>

#include "cuda/common/cuda_check.cuh"
#include "cuda/common/hopper.cuh"
#include "cuda/topk/kernels.cuh"

enum {
    SPLIT_THREADS = 256,                     /* a CTA per 128-row tile */
    SPLIT_ROWS = 16,                         /* rows per warp */
    SR_THREADS = 256,                        /* two warpgroups of 64 rows */
    SR_ATOM = 1024,                          /* 8 rows x 128 B: the 128B-swizzle period */
    SR_OPERAND = 4 * ROWS_PANEL + ROWS_META, /* a split tile of up to 2 chunks: 65 KB */
    SR_SMEM = 3 * SR_OPERAND + SR_ATOM       /* A and two K tiles, + slack to align */
};

typedef struct split_params {
    const float *k; /* [kv_slices, col_blocks, D] */
    int32_t cb, dim, tiles_j;
    split_operands out;
} split_params;

/* Load this thread's part of a 128-row tile (rows first .. first + 127 of
 * src; rows past n and dims past D read zero): warp w takes rows w + 8 t
 * (t < 16), lane l dims 4 l .. 4 l + 3, all 16 loads in flight. */
static __device__ __forceinline__ void sr_load_tile(float4 x[SPLIT_ROWS], const float *src,
                                                    int32_t first, int32_t n, int32_t dim) {
    const int lane = (int)(threadIdx.x & 31), warp = (int)(threadIdx.x >> 5);
    const int in_d = 4 * lane < dim;
#pragma unroll
    for (int t = 0; t < SPLIT_ROWS; ++t) {
        const int32_t i = first + warp + 8 * t;
        x[t] = i < n && in_d ? __ldg((const float4 *)(src + (int64_t)i * dim) + lane)
                             : make_float4(0.f, 0.f, 0.f, 0.f);
    }
}

/* Split the tile loaded by sr_load_tile into a split block at `block`
 * (global or shared memory; layout in kernels.cuh): panels, and each
 * row's factor (mult 2^-e, or 0) and exponent (exp_out[row]). */
static __device__ __forceinline__ void sr_split_tile(const float4 x[SPLIT_ROWS], char *block,
                                                     int32_t chunks, float mult, int32_t *exp_out) {
    const int lane = (int)(threadIdx.x & 31), warp = (int)(threadIdx.x >> 5);
    const int32_t panel_bytes = (int32_t)split_panel_bytes(chunks);
    const int32_t chunk = lane >> 4;
    float *const factor_out = (float *)(block + panel_bytes);
#pragma unroll
    for (int t = 0; t < SPLIT_ROWS; ++t) {
        const int32_t r = warp + 8 * t;
        float m = split_abs_max4(x[t].x, x[t].y, x[t].z, x[t].w);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        const int bad =
            __any_sync(0xffffffffu, split_any_nonfinite4(x[t].x, x[t].y, x[t].z, x[t].w));
        const int32_t e = split_exponent(m);
        if (chunk < chunks) {
            const float f = split_pow2(e);
            uint2 hi, lo;
            split_pair(x[t].x * f, x[t].y * f, &hi.x, &lo.x);
            split_pair(x[t].z * f, x[t].w * f, &hi.y, &lo.y);
            const uint32_t off =
                chunk * ROWS_PANEL + sk_sw128_offset(r, (lane & 15) >> 1) + (lane & 1) * 8;
            *(uint2 *)(block + off) = hi;
            *(uint2 *)(block + chunks * ROWS_PANEL + off) = lo;
        }
        if (lane == 0) {
            exp_out[r] = e;
            factor_out[r] = split_row_factor(mult, e, bad);
        }
    }
}

/* One CTA per 128-row tile of pooled K (kv slice, column tile). It waits
 * for the pooling before it lets the scoring start, so that the scoring may
 * read pooled Q (or the group sums) before its own wait. */
__global__ void __launch_bounds__(SPLIT_THREADS, 2)
    sk_topk_split_rows_kernel(const __grid_constant__ split_params sp) {
    static_assert(SPLIT_THREADS / 32 * SPLIT_ROWS == SC_TM, "16 rows per warp");
    pdl_wait_then_release();
    const int64_t tile = (int64_t)blockIdx.x;
    const int64_t slice = tile / sp.tiles_j;
    const int32_t first = (int32_t)(tile - slice * sp.tiles_j) * SC_TN;
    float4 x[SPLIT_ROWS];
    sr_load_tile(x, sp.k + slice * sp.cb * sp.dim, first, sp.cb, sp.dim);
    sr_split_tile(x, sp.out.k_tiles + tile * (int64_t)split_tile_bytes(sp.out.chunks),
                  sp.out.chunks, 1.f, sp.out.k_exp + tile * SC_TN);
}

/* Thread 0: bulk-copy one split tile (bytes at src) into shared memory at
 * dst, counted on the mbarrier bar. */
static __device__ __forceinline__ void sr_copy_tile(uint32_t dst, const char *src, uint32_t bytes,
                                                    uint32_t bar) {
    sk_mbar_arrive_expect_tx(bar, bytes);
    for (uint32_t o = 0; o < bytes; o += ROWS_PANEL)
        sk_bulk_load(dst + o, src + o, bytes - o < ROWS_PANEL ? bytes - o : ROWS_PANEL, bar);
}

/* The hi value of dim d of row `row` of a split tile (panels as
 * pool_store_split and sr_split_tile write them): x 2^e in fp16, x itself
 * where x is not finite. */
static __device__ __forceinline__ float sr_hi(const char *tile, int32_t row, int32_t d) {
    const uint32_t off = (uint32_t)(d / ROWS_CHUNK) * ROWS_PANEL +
                         sk_sw128_offset(row, (d % ROWS_CHUNK) / 8) + (uint32_t)(d % 8) * 2;
    return __half2float(*(const __half *)(const void *)(tile + off));
}

/* A score whose split product came out inf or NaN: some operand entry is
 * not finite, so the hi * lo terms may hold inf * 0 = NaN where the fp32
 * dot product gives +-inf. Where the pooling split the operands itself
 * (no fp32 pooled blocks, and no group sums), the hi * hi products alone,
 * summed in fp32 over the dims of the two rows, give the fp32 dot
 * product's inf or NaN (signs kept; only entries under ~2^-39 of their
 * row's largest, zero in hi, would differ), scaled as the general
 * epilogue scales; else topk_nonfinite_score from the fp32 blocks. */
static __device__ float sr_nonfinite_score(const score_params *sp, int32_t slice, int32_t i,
                                           int32_t jj, const char *a_tile, int32_t a_row,
                                           const char *k_tile, int32_t k_row, int32_t dims,
                                           int32_t exps) {
    if (sp->split.q_tiles == NULL) return sp->p.scale * topk_nonfinite_score(&sp->p, slice, i, jj);
    float s = 0.f;
    for (int32_t d = 0; d < dims; ++d) s += sr_hi(a_tile, a_row, d) * sr_hi(k_tile, k_row, d);
    return sp->p.scale * ldexpf(s, -exps);
}

/* Rewrite the scores that sr_store_general found not finite (bit 2 (16 half
 * + n) + e of `bad`), one call per thread and tile, so that the common
 * path keeps its registers. Rare: only rows holding a value that is not
 * finite reach the general epilogue with such scores (their factor is 0,
 * split_row_factor). */
static __device__ __noinline__ void sr_fix_nonfinite(const score_params *sp, uint64_t bad,
                                                     int32_t slice, int32_t i, int32_t j,
                                                     int32_t re0, int32_t re1,
                                                     const int32_t *k_exp, const char *a_tile,
                                                     int32_t a_row, const char *k_tile,
                                                     int32_t k_col, int32_t dims) {
    const int32_t rb = sp->p.row_blocks, cb = sp->p.col_blocks;
    for (; bad != 0u; bad &= bad - 1u) {
        const int b = __ffsll((long long)bad) - 1, half = b >> 5, n = (b >> 1) & 15, e = b & 1;
        const int32_t jj = j + 8 * n + e;
        const int32_t exps = (half ? re1 : re0) + k_exp[8 * n + e];
        sp->scores[((int64_t)slice * rb + i + half * 8) * cb + jj] =
            sr_nonfinite_score(sp, slice, i + half * 8, jj, a_tile, a_row + half * 8, k_tile,
                               k_col + 8 * n + e, dims, exps);
    }
}

/* The epilogue's general case: row tails, column tails, odd column counts
 * and factors that are not exact (then ldexpf by the exponents), and rows
 * with values that are not finite (sr_fix_nonfinite). Rows a_row and
 * a_row + 8 of the CTA's tile (i = its first row), columns j + 8 n (+ 1) of
 * column tile k_tile (k_col = j's place in it); acc as the kernel's. Each
 * score takes the two multiplications when its own two factors are exact,
 * so that the factors of rows and columns past the end (unwritten when the
 * pooling split the operands) never change a stored score. */
static __device__ __forceinline__ void sr_store_general(const score_params *sp, const float acc[64],
                                                        int32_t slice, int32_t i, int32_t j,
                                                        float rf0, float rf1, int32_t re0,
                                                        int32_t re1, const float2 (&cf)[16],
                                                        const int32_t *k_exp, const char *a_tile,
                                                        int32_t a_row, const char *k_tile,
                                                        int32_t k_col, int32_t dims) {
    const int32_t rb = sp->p.row_blocks, cb = sp->p.col_blocks;
    uint64_t bad = 0u; /* bit 2 (16 half + n) + e: a stored score that is not finite */
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        if (i + half * 8 >= rb) continue;
        const float rf = half ? rf1 : rf0;
        const int32_t re = half ? re1 : re0;
        float *out = sp->scores + ((int64_t)slice * rb + i + half * 8) * cb;
#pragma unroll
        for (int n = 0; n < 16; ++n)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int32_t jj = j + 8 * n + e;
                if (jj >= cb) continue;
                const float v = acc[4 * n + 2 * half + e], c = e ? cf[n].y : cf[n].x;
                if (!(fabsf(v) <= FLT_MAX)) bad |= 1ull << (2 * (16 * half + n) + e);
                __stcs(out + jj, rf != 0.f && c != 0.f
                                     ? v * c * rf
                                     : sp->p.scale * ldexpf(v, -(re + k_exp[8 * n + e])));
            }
    }
    if (bad != 0u)
        sr_fix_nonfinite(sp, bad, slice, i, j, re0, re1, k_exp, a_tile, a_row, k_tile, k_col, dims);
}

template <int CHUNKS>
__global__ void __launch_bounds__(SR_THREADS, 1)
    sk_topk_score_rows_sm90_kernel(const __grid_constant__ score_params sp) {
    static_assert(SR_THREADS == TBL_THREADS, "the first CTA fills the row table");
    static_assert(SC_TM == 128 && SC_TN == 128, "two warpgroups of 64 rows, m64n128 wgmma");
    /* After the split kernel, this grid starts only once the pooling (and
     * group sums) completed, so A may be read and split before the wait for
     * the split K tiles. Pre-split A comes from the pooling itself, which
     * this grid follows directly: it is read after the wait. */
    pdl_release();
    const sk_topk_problem *p = &sp.p;
    if (blockIdx.x == 0) {
        sk_griddep_wait();
        fill_row_table(p, &sp.table);
        return;
    }
    const int32_t rb = p->row_blocks, cb = p->col_blocks;
    const int32_t unit = (int32_t)blockIdx.x - 1;
    const int32_t slice = unit % p->slices;
    const int32_t ti = sp.tiles_i - 1 - unit / p->slices; /* heaviest first */
    const int32_t i0 = ti * SC_TM;
    const int32_t b = slice / p->heads, hs = slice % p->heads;
    const int32_t hk = p->per_kv_head ? hs : hs / p->group;
    int32_t ntj = sp.tiles_j;
    if (p->causal) {
        const int32_t last = i0 + SC_TM - 1 < rb - 1 ? i0 + SC_TM - 1 : rb - 1;
        const int32_t n = sk_topk_row_rules(p, last).n_cand;
        ntj = min(ntj, (n + SC_TN - 1) / SC_TN);
    }
    if (ntj <= 0) {
        /* nothing is read or written; the grid still ends after its predecessor */
        sk_griddep_wait();
        return;
    }
    const split_operands *so = &sp.split;
    const uint32_t panel_bytes = (uint32_t)split_panel_bytes(CHUNKS);
    const uint32_t tile_bytes = (uint32_t)split_tile_bytes(CHUNKS);
    const int64_t k_tile0 = ((int64_t)b * p->heads_kv + hk) * sp.tiles_j;

    extern __shared__ __align__(16) char smem_raw[];
    char *const base =
        smem_raw +
        ((SR_ATOM - (__cvta_generic_to_shared(smem_raw) & (SR_ATOM - 1))) & (SR_ATOM - 1));
    __shared__ __align__(8) uint64_t bars[3]; /* K buffers 0 and 1, pre-split A */
    __shared__ int32_t a_exp[SC_TM];
    const uint32_t s_base = (uint32_t)__cvta_generic_to_shared(base);
    const uint32_t bar_k0 = (uint32_t)__cvta_generic_to_shared(&bars[0]), bar_a = bar_k0 + 16;
    const int32_t tid = (int32_t)threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int presplit_a = so->q_tiles != NULL;
    const int64_t a_tile = (int64_t)slice * sp.tiles_i + ti;

    /* This thread's rows of the accumulator: 16 w + lane / 4 (+ 8) of its
     * warpgroup's 64; the warpgroup as a value the compiler knows to be
     * warp-uniform. */
    const int32_t wg = __shfl_sync(0xffffffffu, tid >> 7, 0), w4 = warp & 3;
    const int32_t r0 = wg * 64 + w4 * 16 + (lane >> 2);

    /* A: this CTA's 128 rows. Unless the pooling split them, they are split
     * into shared memory here as the split kernel splits K (the only reader
     * of these rows): the loads are issued before the wait for the split
     * kernel and the first K copies, the split after them, so that the
     * three latencies overlap. */
    float4 x[SPLIT_ROWS];
    if (!presplit_a)
        sr_load_tile(x, sp.a + (int64_t)slice * sp.a_slice_stride, i0, rb, (int32_t)p->head_dim);
    sk_griddep_wait(); /* the split K (and A) tiles */
    if (tid == 0) {
        sk_mbar_init(bar_k0, 1);
        sk_mbar_init(bar_k0 + 8, 1);
        sk_mbar_init(bar_a, 1);
        sk_fence_mbar_init();
        if (presplit_a) sr_copy_tile(s_base, so->q_tiles + a_tile * tile_bytes, tile_bytes, bar_a);
        for (int32_t t = 0; t < 2 && t < ntj; ++t)
            sr_copy_tile(s_base + SR_OPERAND * (1 + t), so->k_tiles + (k_tile0 + t) * tile_bytes,
                         tile_bytes, bar_k0 + 8 * t);
    }
    int32_t re0, re1;
    if (presplit_a) {
        re0 = so->q_exp[a_tile * SC_TM + r0];
        re1 = so->q_exp[a_tile * SC_TM + r0 + 8];
        __syncthreads(); /* publishes the mbarriers' initialisation */
        sk_mbar_wait(bar_a, 0, "score A");
    } else {
        sr_split_tile(x, base, CHUNKS, p->scale, a_exp);
        sk_fence_proxy_async_smem(); /* the A panels' generic stores before wgmma reads them */
        __syncthreads();             /* A is split; the mbarriers are initialised */
        re0 = a_exp[r0];
        re1 = a_exp[r0 + 8];
    }
    const float *a_meta = (const float *)(base + panel_bytes);
    const float rf0 = a_meta[r0], rf1 = a_meta[r0 + 8];
    /* Both rows' factors exact (0 marks the others): each thread decides the
     * epilogue for its own rows and columns. */
    const int a_fast = rf0 != 0.f && rf1 != 0.f;

    /* Descriptors: this warpgroup's 64 rows of A, all 128 rows of a K buffer;
     * lo panels `chunks` panels after hi. */
    const uint64_t d_a = sk_wgmma_desc_sw128(s_base + wg * 64 * 128, 16, SR_ATOM);
    const uint64_t d_k = sk_wgmma_desc_sw128(s_base + SR_OPERAND, 16, SR_ATOM);
    const uint64_t panel = ROWS_PANEL >> 4, lo_off = CHUNKS * panel, buf_off = SR_OPERAND >> 4;
    const int even = (cb & 1) == 0;

    /* Column tile jt into acc: wait for its K buffer, issue the wgmma group.
     * (issue and finish stay lambdas: as device functions over a struct of
     * these locals the kernel executed 16 % more instructions, ncu,
     * docs/perf/topk_log.md step 21.) */
    auto issue = [&](float(&acc)[64], int32_t jt) {
        const int buf = jt & 1;
        uint32_t a_lo = (uint32_t)d_a; /* recomputed per tile, not held: registers */
        sk_reg_fence_u32(a_lo);
        const uint64_t da = (d_a & ~0xffffffffull) | a_lo;
        const uint64_t dk = d_k + buf * buf_off;
        /* Warpgroup 1 waits for warpgroup 0's wgmma of this tile (its
         * arrival after the wait in the loop below): the two then take
         * turns at the tensor cores and the stores (docs/perf/topk_log.md step
         * 17). One barrier per buffer parity: warpgroup 0 reaches its
         * arrival for tile jt + 2 only after this buffer's refill, which
         * waits for warpgroup 1's wgmma of jt. */
        if (wg == 1) sk_bar_sync(3 + buf, SR_THREADS);
        sk_mbar_wait(bar_k0 + 8 * buf, (uint32_t)(jt >> 1) & 1u, "score K");
#pragma unroll
        for (int e = 0; e < 64; ++e) acc[e] = 0.f;
        sk_wgmma_fence();
#pragma unroll
        for (int c = 0; c < CHUNKS; ++c) {
#pragma unroll
            for (int s = 0; s < ROWS_CHUNK / 16; ++s) {
                /* small terms first; a K step of 16 fp16 is 32 B inside the swizzle row */
                const uint64_t step = c * panel + (uint64_t)((s * 32) >> 4);
                sk_wgmma_m64n128k16_ss_f16(acc, da + lo_off + step, dk + step, 1);
                sk_wgmma_m64n128k16_ss_f16(acc, da + step, dk + lo_off + step, 1);
                sk_wgmma_m64n128k16_ss_f16(acc, da + step, dk + step, 1);
            }
        }
        sk_wgmma_commit();
    };
    /* Column tile jt done (its wgmma group complete): refill its K buffer
     * with tile jt + 2 once both warpgroups are past it, then scale and store. */
    auto finish = [&](float(&acc)[64], int32_t jt) {
#pragma unroll
        for (int e = 0; e < 64; ++e) sk_reg_fence(acc[e]); /* no read of acc above the wait */
        /* this thread's column factors, read before the buffer is refilled */
        const int buf = jt & 1;
        const char *k_meta = base + SR_OPERAND * (1 + buf) + panel_bytes;
        float2 cf[16];
        int fast = a_fast;
#pragma unroll
        for (int n = 0; n < 16; ++n) {
            cf[n] = *(const float2 *)(k_meta + 4 * (2 * (lane & 3) + 8 * n));
            fast &= cf[n].x != 0.f && cf[n].y != 0.f;
        }
        /* This thread is done with K buffer `buf` (its wgmma group complete,
         * its factors read). Only warp 4, which refills the buffer, waits
         * for the others; the rest go straight on to their stores. Warp 4 is
         * in warpgroup 1, the later of the two, so that warpgroup 0 never
         * waits here. One named barrier per buffer: a warp reaches its next
         * arrival at a buffer's barrier only after the refill that follows
         * this one. */
        if (jt + 2 < ntj) {
            if (warp == 4) {
                sk_bar_sync(1 + buf, SR_THREADS);
                if (lane == 0)
                    sr_copy_tile(s_base + SR_OPERAND * (1 + buf),
                                 so->k_tiles + (k_tile0 + jt + 2) * tile_bytes, tile_bytes,
                                 bar_k0 + 8 * buf);
            } else {
                sk_bar_arrive(1 + buf, SR_THREADS);
            }
        }
        const int32_t j0 = jt * SC_TN + 2 * (lane & 3);
        /* Every factor of this thread exact, and the tile inside the row
         * with float2-aligned rows: the common case, straight-line. acc[4 n + e]:
         * row r0 (+ 8 for e >= 2), column 8 n + 2 (lane % 4) + e % 2. */
        if (fast && even && jt * SC_TN + SC_TN <= cb) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int32_t i = i0 + r0 + half * 8;
                if (i >= rb) continue;
                const float rf = half ? rf1 : rf0;
                float *out = sp.scores + ((int64_t)slice * rb + i) * cb + j0;
#pragma unroll
                for (int n = 0; n < 16; ++n) /* exact powers of two, then one rounding */
                    __stcs((float2 *)(out + 8 * n),
                           make_float2(acc[4 * n + 2 * half] * cf[n].x * rf,
                                       acc[4 * n + 2 * half + 1] * cf[n].y * rf));
            }
        } else {
            sr_store_general(&sp, acc, slice, i0 + r0, j0, rf0, rf1, re0, re1, cf,
                             so->k_exp + (k_tile0 + jt) * SC_TN + 2 * (lane & 3), base, r0,
                             so->k_tiles + (k_tile0 + jt) * tile_bytes, 2 * (lane & 3),
                             CHUNKS * ROWS_CHUNK);
        }
    };

    float acc[64];
    for (int32_t jt = 0; jt < ntj; ++jt) {
        issue(acc, jt);
        sk_wgmma_wait<0>();
        if (wg == 0) sk_bar_arrive(3 + (jt & 1), SR_THREADS); /* warpgroup 1 may issue jt */
        finish(acc, jt);
    }
}

sk_status sk_topk_score_rows_sm90(const score_params *sp, cudaStream_t stream) {
    const sk_topk_problem *p = &sp->p;
    split_params s;
    s.k = sp->pooled_k;
    s.cb = p->col_blocks;
    s.dim = (int32_t)p->head_dim;
    s.tiles_j = sp->tiles_j;
    s.out = sp->split;
    const int64_t k_tiles = (int64_t)p->batch * p->heads_kv * sp->tiles_j;
    if (k_tiles > INT32_MAX)
        return sk_error(SK_STATUS_NOT_SUPPORTED, "too many tiles for the Hopper split kernel");
    launch_cfg l;
    if (sp->split.q_tiles == NULL) /* else the pooling split K too */
        SK_CUDA_TRY(
            cudaLaunchKernelEx(launch_config(&l, (unsigned)k_tiles, SPLIT_THREADS, 0, stream, 1),
                               sk_topk_split_rows_kernel, s),
            "Hopper split kernel launch");
    const int64_t units = (int64_t)p->slices * sp->tiles_i;
    void (*kernel)(score_params) = sp->split.chunks == 1 ? sk_topk_score_rows_sm90_kernel<1>
                                                         : sk_topk_score_rows_sm90_kernel<2>;
    SK_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SR_SMEM),
                "cudaFuncSetAttribute");
    return sk_cuda_status(
        cudaLaunchKernelEx(launch_config(&l, (unsigned)units + 1, SR_THREADS, SR_SMEM, stream, 1),
                           kernel, *sp),
        "Hopper row scoring kernel launch");
}
