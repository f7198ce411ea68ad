/*
 * gemm_sm80.cu - the portable BSR x dense GEMM (sm_80+):
 *   C = alpha * A * B + beta * C,  A [m, k] in BSR (bm x bk blocks),
 * mma.sync tensor cores, ldmatrix, a cp.async pipeline of three stages.
 *
 * Work. One CTA per output tile: block row `row` of A (bm = 64 or 128 rows
 * of C) times 128 columns of B and C. CTA t takes schedule slot t / n_tiles
 * and column tile t % n_tiles: the plan lists the block rows longest first
 * (kernels.h), and the hardware starts CTAs in index order, so the
 * long rows start first and the CTAs of one row (sharing its A blocks in
 * L2) run side by side. The tile's K loop walks the row's visited entries
 * (the visiting rule: clamped range, columns outside [0, col_blocks)
 * skipped) in 64-column chunks of K: bk / 64 chunks per block, fewer in the
 * last block column when k ends inside it.
 *
 * CTA: 8 warps as 2 (M) x 4 (N); warp (wm, wn) owns rows wm * bm / 2 ..
 * of the tile and 32 columns, i.e. bm / 32 m16 tiles x 4 n8 tiles of fp32
 * accumulators in registers (64 per thread at bm = 128).
 *
 * Pipeline. Three shared-memory stages, each one 64-column chunk of the A
 * block [bm, 64] and the matching 64 rows of B [64, 128]. Chunk j lives in
 * stage j % 3 and is issued as one cp.async group two chunks ahead; one
 * barrier per chunk: at its top chunk j has landed (wait_group 1) and every
 * warp is done with chunk j - 1, whose stage then receives chunk j + 2.
 * Threads with nothing left to load commit empty groups, so the group count
 * stays uniform. The next entry's column index is loaded one entry ahead,
 * so the producer does not wait on it.
 *
 * Shared layouts (rows of 16-byte chunks; chunk c of row r stored at
 * (c & ~7) | ((c ^ r) & 7): ldmatrix and cp.async are free of bank
 * conflicts):
 *   A      [bm][64]   row-major, as stored        -> ldmatrix (A operand)
 *   B row  [64][128]  k rows of B, as stored      -> ldmatrix.trans (B operand)
 *   B col  [128][64]  n rows (B's columns), k contiguous -> ldmatrix
 *
 * Tails. Every 16-byte copy reads only the bytes inside the logical extent
 * (cp.async src-size 0..16, the rest zero-filled): block elements past m or
 * k, B's rows past k and columns past n are never read, and the zeros make
 * the k tail contribute exactly 0 (both factors are 0, never 0 * NaN). The
 * epilogue writes only rows < m and columns < n, straight from the
 * accumulator fragments: C = alpha * acc + beta * C in fp32 (C not read when
 * beta == 0), one rounding to C's dtype. A tile with no visited entry runs
 * no K loop and writes C = beta * C (0 when beta == 0).
 *
 * Invariants: nothing outside A's visited blocks, B's [k, n] and C's [m, n]
 * is read, nothing outside C's [m, n] is written; layout and plan content
 * are clamped, so any content stays in bounds. A tile's result depends only
 * on its inputs and the order of its row's entries: bitwise reproducible.
 * Address math is 64-bit where it scales with m, n, k or nnz.
 */
#include <stdint.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/common/cuda_check.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/gemm/kernels.h"

enum {
    SK_GEMM_WARPS = 8, /* per CTA: 2 along M, 4 along N */
    SK_GEMM_THREADS = 32 * SK_GEMM_WARPS,
    SK_GEMM_WARPS_N = 4,
    SK_GEMM_BN = 128,                          /* columns of C per tile */
    SK_GEMM_WN = SK_GEMM_BN / SK_GEMM_WARPS_N, /* columns per warp: 4 n8 tiles */
    SK_GEMM_NT = SK_GEMM_WN / 8,
    SK_GEMM_CHUNK = 64, /* columns of K per pipeline stage */
    SK_GEMM_STAGES = 3,
    SK_GEMM_CTAS_PER_SM = 2, /* register budget: 128 per thread */
    SK_GEMM_MAX_BM = 128,
    SK_GEMM_SMEM_LIMIT = 227 * 1024
};

/* Bytes of one stage: the A chunk [bm, 64] then the B chunk (64 x 128). */
__host__ __device__ constexpr int sk_gemm_a_bytes(int bm) {
    return bm * SK_GEMM_CHUNK * 2;
}
__host__ __device__ constexpr int sk_gemm_stage_bytes(int bm) {
    return sk_gemm_a_bytes(bm) + SK_GEMM_CHUNK * SK_GEMM_BN * 2;
}

static_assert(SK_GEMM_CTAS_PER_SM * SK_GEMM_STAGES * sk_gemm_stage_bytes(SK_GEMM_MAX_BM) <=
                  SK_GEMM_SMEM_LIMIT,
              "two CTAs of three stages (bm = 128) must fit one SM's shared memory");

/* Kernel parameters: byte strides; sizes as given (int64 where they scale). */
typedef struct sk_gemm_params {
    const char *a; /* a_values [nnz, bm, bk] */
    const char *b; /* [k, n] row-major or column-major */
    char *c;       /* [m, n] row-major */
    int64_t m, n, k;
    int64_t ldb_bytes, ldc_bytes;
    int32_t bk; /* block_k: 64 or 128 */
    int32_t col_blocks, row_blocks, nnz;
    int32_t n_tiles; /* ceil(n / 128) */
    int32_t b_col_major;
    int32_t c_dtype;
    float alpha, beta;
    const int32_t *col_indices;
    const int4 *row_info; /* [row_blocks] per slot {row, first visited entry, end, col} */
} sk_gemm_params;

/* Where the producer is: entry e of the row (column col), chunk sub of that
 * block; nxt_col the raw column of entry e + 1, loaded one entry ahead and
 * checked only when the producer gets there. e == end: done. */
typedef struct sk_gemm_cursor {
    int32_t e, end, col, sub, subs;
    int32_t nxt_col;
} sk_gemm_cursor;

/* ---------------------------------------------------------------------------
 * Small helpers
 * ------------------------------------------------------------------------- */

template <int kDtype>
__device__ __forceinline__ void sk_gemm_mma(float d[4], const uint32_t a[4], const uint32_t b[2]) {
    if constexpr (kDtype == SK_DTYPE_F16)
        sk_mma_m16n8k16_f16(d, a, b);
    else
        sk_mma_m16n8k16_bf16(d, a, b);
}

/* Byte offset of 16-byte chunk `c` of row `r` in a swizzled row. */
__device__ __forceinline__ uint32_t sk_gemm_swz(int r, int c) {
    return (uint32_t)((c & ~7) | ((c ^ r) & 7)) << 4;
}

/* Bytes of a 16-byte chunk starting `first` bytes into a run of `valid`
 * bytes that exist: 0..16 (cp.async reads these and zero-fills the rest). */
__device__ __forceinline__ uint32_t sk_gemm_bytes(int64_t valid, int first) {
    const int64_t v = valid - first;
    return v <= 0 ? 0u : v >= 16 ? 16u : (uint32_t)v;
}

/* 64-column chunks of K held by block column col (the last may hold fewer). */
__device__ __forceinline__ int32_t sk_gemm_subs(const sk_gemm_params &p, int32_t col) {
    const int64_t left = p.k - (int64_t)col * p.bk;
    const int64_t kc = left < p.bk ? left : p.bk;
    return (int32_t)((kc + SK_GEMM_CHUNK - 1) / SK_GEMM_CHUNK);
}

/* The first entry at or after e whose column is visited (end if none), and
 * its column. Only layouts with out-of-range columns loop more than once. */
__device__ __forceinline__ int32_t sk_gemm_next_visited(const sk_gemm_params &p, int32_t e,
                                                        int32_t end, int32_t *col) {
    for (; e < end; ++e) {
        const int32_t c = __ldg(p.col_indices + e);
        if ((uint32_t)c < (uint32_t)p.col_blocks) {
            *col = c;
            return e;
        }
    }
    *col = -1;
    return end;
}

/* Enter entry e (column col as loaded; end: done): skip it and what follows
 * while the column is not visited (only bad layouts wait on loads there),
 * then start the load of the next entry's column, needed one entry later. */
__device__ __forceinline__ void sk_gemm_enter(const sk_gemm_params &p, sk_gemm_cursor *c, int32_t e,
                                              int32_t col) {
    if (e < c->end && (uint32_t)col >= (uint32_t)p.col_blocks)
        e = sk_gemm_next_visited(p, e + 1, c->end, &col);
    c->e = e;
    c->col = col;
    c->sub = 0;
    c->subs = e < c->end ? sk_gemm_subs(p, col) : 0;
    c->nxt_col = e + 1 < c->end ? __ldg(p.col_indices + e + 1) : -1;
}

/* Step the cursor to the next chunk: within the block, else the next entry. */
__device__ __forceinline__ void sk_gemm_advance(const sk_gemm_params &p, sk_gemm_cursor *c) {
    if (++c->sub < c->subs) return;
    sk_gemm_enter(p, c, c->e + 1, c->nxt_col);
}

/* ---------------------------------------------------------------------------
 * Producer: one chunk into one stage (all threads, one cp.async group)
 * ------------------------------------------------------------------------- */

/* The A chunk [bm, 64] of entry c.e: thread t copies 16-byte chunk t % 8 of
 * rows t / 8 + 32 i. Rows past m and columns past k are zero-filled. */
template <int kBm>
__device__ __forceinline__ void sk_gemm_load_a(const sk_gemm_params &p, const sk_gemm_cursor &c,
                                               int32_t valid_rows, uint32_t dst) {
    constexpr int kPasses = kBm * 8 / SK_GEMM_THREADS;
    const int ch = threadIdx.x & 7, r0 = threadIdx.x >> 3;
    const int64_t k0 = (int64_t)c.col * p.bk + c.sub * SK_GEMM_CHUNK;
    const uint32_t bytes = sk_gemm_bytes((p.k - k0) * 2, ch * 16);
    const char *blk = p.a + (int64_t)c.e * kBm * p.bk * 2 + c.sub * (SK_GEMM_CHUNK * 2);
    const char *src = blk + (int64_t)r0 * p.bk * 2 + ch * 16;
    const int64_t step = (int64_t)(SK_GEMM_THREADS / 8) * p.bk * 2;
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
        const int r = r0 + i * (SK_GEMM_THREADS / 8);
        const bool ok = r < valid_rows && bytes > 0;
        sk_cp_async_16(dst + (uint32_t)(r * SK_GEMM_CHUNK * 2) + sk_gemm_swz(r, ch),
                       ok ? src + i * step : blk, ok ? bytes : 0u);
    }
}

/* The B chunk for K rows k0 .. k0 + 63 and the tile's 128 columns.
 * Row-major B: thread t copies chunk t % 16 of K rows t / 16 + 16 i.
 * Column-major B: thread t copies chunk t % 8 of columns t / 8 + 32 i.
 * bt: the tile's B at (row 0, column n0), in the B's own order. */
__device__ __forceinline__ void sk_gemm_load_b(const sk_gemm_params &p, const char *bt, int64_t k0,
                                               int32_t valid_cols, uint32_t dst) {
    if (!p.b_col_major) {
        const int ch = threadIdx.x & 15, r0 = threadIdx.x >> 4;
        const uint32_t bytes = sk_gemm_bytes((int64_t)valid_cols * 2, ch * 16);
        const char *src = bt + (k0 + r0) * p.ldb_bytes + ch * 16;
        const int64_t step = (int64_t)(SK_GEMM_THREADS / 16) * p.ldb_bytes;
#pragma unroll
        for (int i = 0; i < SK_GEMM_CHUNK * 16 / SK_GEMM_THREADS; ++i) {
            const int r = r0 + i * (SK_GEMM_THREADS / 16);
            const bool ok = k0 + r < p.k && bytes > 0;
            sk_cp_async_16(dst + (uint32_t)(r * SK_GEMM_BN * 2) + sk_gemm_swz(r, ch),
                           ok ? src + i * step : bt, ok ? bytes : 0u);
        }
    } else {
        const int ch = threadIdx.x & 7, r0 = threadIdx.x >> 3;
        const uint32_t bytes = sk_gemm_bytes((p.k - k0) * 2, ch * 16);
        const char *src = bt + (int64_t)r0 * p.ldb_bytes + k0 * 2 + ch * 16;
        const int64_t step = (int64_t)(SK_GEMM_THREADS / 8) * p.ldb_bytes;
#pragma unroll
        for (int i = 0; i < SK_GEMM_BN * 8 / SK_GEMM_THREADS; ++i) {
            const int r = r0 + i * (SK_GEMM_THREADS / 8);
            const bool ok = r < valid_cols && bytes > 0;
            sk_cp_async_16(dst + (uint32_t)(r * SK_GEMM_CHUNK * 2) + sk_gemm_swz(r, ch),
                           ok ? src + i * step : bt, ok ? bytes : 0u);
        }
    }
}

/* ---------------------------------------------------------------------------
 * Consumer: one stage's 64 columns of K into the accumulators
 * ------------------------------------------------------------------------- */

/* Per-thread ldmatrix offsets, fixed for the whole tile (bytes within a
 * stage's A or B part, before the k16 step's own XOR). */
typedef struct sk_gemm_frag_offsets {
    uint32_t a;    /* row wm * bm / 2 + lane % 16; the step's chunk is 2 kk ^ ax */
    uint32_t ax;   /* (lane / 16) ^ (lane % 8) */
    uint32_t b[2]; /* per pair of n8 tiles */
    uint32_t bx;   /* column-major B: (matrix & 1) ^ (lane % 8) */
} sk_gemm_frag_offsets;

template <int kBm>
__device__ __forceinline__ sk_gemm_frag_offsets sk_gemm_offsets(int b_col_major) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int wm = warp / SK_GEMM_WARPS_N, wn = warp % SK_GEMM_WARPS_N;
    const int l8 = lane & 7, mi = lane >> 3; /* the ldmatrix matrix this lane addresses */
    sk_gemm_frag_offsets o;
    o.a = (uint32_t)((wm * (kBm / 2) + (lane & 15)) * SK_GEMM_CHUNK * 2);
    o.ax = (uint32_t)((lane >> 4) ^ l8);
    o.bx = (uint32_t)((mi & 1) ^ l8);
#pragma unroll
    for (int jj = 0; jj < SK_GEMM_NT / 2; ++jj) {
        /* Matrices: (n8 tile 2 jj, k 0-7), (2 jj, k 8-15), (2 jj + 1, k 0-7), (2 jj + 1, k 8-15).
         */
        const int nchunk = wn * SK_GEMM_NT + 2 * jj + (mi >> 1); /* 8-column group of the tile */
        if (!b_col_major) /* K row (mi & 1) * 8 + l8 of the k16 step; its swizzle is l8 */
            o.b[jj] = (uint32_t)(((mi & 1) * 8 + l8) * SK_GEMM_BN * 2) + sk_gemm_swz(l8, nchunk);
        else /* column nchunk * 8 + l8 (a row of the stage) */
            o.b[jj] = (uint32_t)((nchunk * 8 + l8) * SK_GEMM_CHUNK * 2);
    }
    return o;
}

template <int kDtype, int kBm>
__device__ __forceinline__ void sk_gemm_compute(const sk_gemm_frag_offsets &o, uint32_t stage,
                                                int b_col_major,
                                                float (&acc)[kBm / 32][SK_GEMM_NT][4]) {
    constexpr int kMT = kBm / 32;
    const uint32_t sa = stage, sb = stage + (uint32_t)sk_gemm_a_bytes(kBm);
#pragma unroll
    for (int kk = 0; kk < SK_GEMM_CHUNK / 16; ++kk) {
        uint32_t af[kMT][4], bf[SK_GEMM_NT][2];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
            sk_ldmatrix_x4(af[mt], sa + o.a + (uint32_t)(mt * 16 * SK_GEMM_CHUNK * 2) +
                                       (((uint32_t)(2 * kk) ^ o.ax) << 4));
#pragma unroll
        for (int jj = 0; jj < SK_GEMM_NT / 2; ++jj) {
            uint32_t r[4];
            if (!b_col_major)
                sk_ldmatrix_x4_trans(r, sb + o.b[jj] + (uint32_t)(kk * 16 * SK_GEMM_BN * 2));
            else
                sk_ldmatrix_x4(r, sb + o.b[jj] + (((uint32_t)(2 * kk) ^ o.bx) << 4));
            bf[2 * jj][0] = r[0];
            bf[2 * jj][1] = r[1];
            bf[2 * jj + 1][0] = r[2];
            bf[2 * jj + 1][1] = r[3];
        }
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
            for (int nt = 0; nt < SK_GEMM_NT; ++nt)
                sk_gemm_mma<kDtype>(acc[mt][nt], af[mt], bf[nt]);
    }
}

/* ---------------------------------------------------------------------------
 * Epilogue: C = alpha * acc + beta * C for rows < m, columns < n
 * ------------------------------------------------------------------------- */

__device__ __forceinline__ float sk_gemm_load_c(const char *c, int dtype) {
    if (dtype == SK_DTYPE_F32) return *(const float *)c;
    const unsigned short h = *(const unsigned short *)c;
    return dtype == SK_DTYPE_F16 ? __half2float(__ushort_as_half(h))
                                 : __bfloat162float(__ushort_as_bfloat16(h));
}

/* Two adjacent elements (v0 at column col, v1 at col + 1), packed into one
 * store; col is even and C's rows are 16-byte aligned. */
__device__ __forceinline__ void sk_gemm_store_pair(char *c, int dtype, float v0, float v1) {
    if (dtype == SK_DTYPE_F32)
        *(float2 *)c = make_float2(v0, v1);
    else if (dtype == SK_DTYPE_F16)
        *(uint32_t *)c = sk_cvt_f16x2(v1, v0);
    else
        *(uint32_t *)c = sk_cvt_bf16x2(v1, v0);
}

__device__ __forceinline__ void sk_gemm_store_one(char *c, int dtype, float v) {
    if (dtype == SK_DTYPE_F32)
        *(float *)c = v;
    else if (dtype == SK_DTYPE_F16)
        *(unsigned short *)c = __half_as_ushort(__float2half_rn(v));
    else
        *(unsigned short *)c = __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

/* One thread's two elements of one row; col0 even. */
__device__ __forceinline__ void sk_gemm_out_pair(const sk_gemm_params &p, char *crow, int64_t col,
                                                 float a0, float a1) {
    const int es = p.c_dtype == SK_DTYPE_F32 ? 4 : 2;
    char *c = crow + col * es;
    float v0 = p.alpha * a0, v1 = p.alpha * a1;
    const bool both = col + 1 < p.n;
    if (p.beta != 0.f) { /* beta == 0: C is not read, NaN there does not propagate */
        v0 = fmaf(p.beta, sk_gemm_load_c(c, p.c_dtype), v0);
        if (both) v1 = fmaf(p.beta, sk_gemm_load_c(c + es, p.c_dtype), v1);
    }
    if (both)
        sk_gemm_store_pair(c, p.c_dtype, v0, v1);
    else
        sk_gemm_store_one(c, p.c_dtype, v0);
}

template <int kBm>
__device__ __forceinline__ void sk_gemm_epilogue(const sk_gemm_params &p, int64_t r0, int64_t n0,
                                                 const float (&acc)[kBm / 32][SK_GEMM_NT][4]) {
    constexpr int kMT = kBm / 32;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int wm = warp / SK_GEMM_WARPS_N, wn = warp % SK_GEMM_WARPS_N;
    const int g = lane >> 2, t4 = lane & 3;
    const int64_t col0 = n0 + wn * SK_GEMM_WN + 2 * t4;
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int ii = 0; ii < 2; ++ii) {
            const int64_t row = r0 + wm * (kBm / 2) + mt * 16 + g + 8 * ii;
            if (row >= p.m) continue;
            char *crow = p.c + row * p.ldc_bytes;
#pragma unroll
            for (int nt = 0; nt < SK_GEMM_NT; ++nt) {
                const int64_t col = col0 + nt * 8;
                if (col < p.n)
                    sk_gemm_out_pair(p, crow, col, acc[mt][nt][2 * ii], acc[mt][nt][2 * ii + 1]);
            }
        }
}

/* ---------------------------------------------------------------------------
 * The kernel
 * ------------------------------------------------------------------------- */

/* One output tile: schedule slot `slot`, column tile `nt`. */
/* The cursor's next chunk (when one is left) into the stage at dst, then
 * the commit that closes this step's cp.async group (empty past the end, so
 * the group count per step stays fixed); returns 1 when a chunk was issued. */
template <int kBm>
__device__ __forceinline__ int32_t sk_gemm_issue(const sk_gemm_params &p, sk_gemm_cursor *c,
                                                 const char *bt, int32_t valid_rows,
                                                 int32_t valid_cols, uint32_t dst) {
    int32_t n = 0;
    if (c->e < c->end) {
        sk_gemm_load_a<kBm>(p, *c, valid_rows, dst);
        sk_gemm_load_b(p, bt, (int64_t)c->col * p.bk + c->sub * SK_GEMM_CHUNK, valid_cols,
                       dst + (uint32_t)sk_gemm_a_bytes(kBm));
        sk_gemm_advance(p, c);
        n = 1;
    }
    sk_cp_async_commit();
    return n;
}

template <int kDtype, int kBm>
__device__ __forceinline__ void sk_gemm_tile(const sk_gemm_params &p, int32_t slot, int32_t nt,
                                             uint32_t smem) {
    constexpr int kMT = kBm / 32;
    const int4 info = __ldg(p.row_info + slot);
    const int32_t row = info.x;
    if ((uint32_t)row >= (uint32_t)p.row_blocks) return; /* not a block row: a stale plan */
    const int64_t r0 = (int64_t)row * kBm, n0 = (int64_t)nt * SK_GEMM_BN;
    const int64_t rows_left = p.m - r0, cols_left = p.n - n0;
    const int32_t valid_rows = (int32_t)(rows_left < kBm ? rows_left : kBm);
    const int32_t valid_cols = (int32_t)(cols_left < SK_GEMM_BN ? cols_left : SK_GEMM_BN);
    const char *bt = p.b + (p.b_col_major ? n0 * p.ldb_bytes : n0 * 2);

    /* The plan's first visited entry, clamped like the range itself. */
    sk_gemm_cursor c;
    c.end = min(max(info.z, 0), p.nnz);
    const int32_t first = min(max(info.y, 0), c.end);
    sk_gemm_enter(p, &c, first, first < c.end ? __ldg(p.col_indices + first) : -1);

    float acc[kMT][SK_GEMM_NT][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int j = 0; j < SK_GEMM_NT; ++j)
#pragma unroll
            for (int x = 0; x < 4; ++x) acc[mt][j][x] = 0.f;

    const sk_gemm_frag_offsets o = sk_gemm_offsets<kBm>(p.b_col_major);
    constexpr uint32_t kStage = (uint32_t)sk_gemm_stage_bytes(kBm);
    int32_t issued = 0; /* chunks issued so far; chunk j sits in stage j % 3 */
#pragma unroll
    for (int s = 0; s < SK_GEMM_STAGES - 1; ++s) {
        issued += sk_gemm_issue<kBm>(p, &c, bt, valid_rows, valid_cols, smem + (uint32_t)s * kStage);
    }
    int stage = 0, fill = SK_GEMM_STAGES - 1; /* stages of chunk j and of chunk j + 2 */
    for (int32_t j = 0; j < issued; ++j) {
        sk_cp_async_wait<SK_GEMM_STAGES - 2>();
        __syncthreads(); /* chunk j visible to all; everyone is done with chunk j - 1 */
        issued += sk_gemm_issue<kBm>(p, &c, bt, valid_rows, valid_cols,
                                     smem + (uint32_t)fill * kStage);
        sk_gemm_compute<kDtype, kBm>(o, smem + (uint32_t)stage * kStage, p.b_col_major, acc);
        stage = stage == SK_GEMM_STAGES - 1 ? 0 : stage + 1;
        fill = fill == SK_GEMM_STAGES - 1 ? 0 : fill + 1;
    }
    sk_cp_async_wait<0>(); /* only empty groups are left */
    sk_gemm_epilogue<kBm>(p, r0, n0, acc);
}

template <int kDtype, int kBm>
__global__ void __launch_bounds__(SK_GEMM_THREADS, SK_GEMM_CTAS_PER_SM)
    sk_bsr_gemm_sm80_kernel(const __grid_constant__ sk_gemm_params p) {
    extern __shared__ __align__(128) unsigned char smem[];
    const uint32_t base = (uint32_t)__cvta_generic_to_shared(smem);
    const int64_t tiles = (int64_t)p.row_blocks * p.n_tiles;
    /* One tile per CTA unless the grid was capped at 2^31 - 1 CTAs. */
    for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
        sk_gemm_tile<kDtype, kBm>(p, (int32_t)(t / p.n_tiles), (int32_t)(t % p.n_tiles), base);
        if (t + gridDim.x < tiles) __syncthreads(); /* the stages are refilled next */
    }
}

/* ---------------------------------------------------------------------------
 * Host side
 * ------------------------------------------------------------------------- */

template <int kDtype, int kBm>
static sk_status sk_gemm_launch_typed(const sk_gemm_params &params, int64_t tiles,
                                      cudaStream_t stream) {
    void (*kernel)(sk_gemm_params) = sk_bsr_gemm_sm80_kernel<kDtype, kBm>;
    const int smem = SK_GEMM_STAGES * sk_gemm_stage_bytes(kBm);
    SK_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
                "cudaFuncSetAttribute");
    const int grid = (int)(tiles < INT32_MAX ? tiles : INT32_MAX);
    kernel<<<grid, SK_GEMM_THREADS, smem, stream>>>(params);
    SK_CUDA_TRY(cudaGetLastError(), "sm80 BSR GEMM kernel launch");
    return SK_STATUS_SUCCESS;
}

sk_status sk_bsr_gemm_sm80_launch(const sk_bsr_gemm_problem *p, const sk_bsr_gemm_schedule *s,
                                  cudaStream_t stream) {
    if (p->ab_dtype != SK_DTYPE_F16 && p->ab_dtype != SK_DTYPE_BF16)
        return sk_error(SK_STATUS_NOT_SUPPORTED,
                        "ab_dtype = %d: the CUDA BSR GEMM takes F16 or BF16", (int)p->ab_dtype);
    if ((p->block_m != 64 && p->block_m != 128) || (p->block_k != 64 && p->block_k != 128))
        return sk_error(SK_STATUS_NOT_SUPPORTED,
                        "blocks %d x %d: the CUDA BSR GEMM takes 64 or 128", (int)p->block_m,
                        (int)p->block_k);
    sk_gemm_params k;
    k.a = (const char *)p->a_values;
    k.b = (const char *)p->b;
    k.c = (char *)p->c;
    k.m = p->m;
    k.n = p->n;
    k.k = p->k;
    k.ldb_bytes = p->ldb * 2;
    k.ldc_bytes = p->ldc * (p->c_dtype == SK_DTYPE_F32 ? 4 : 2);
    k.bk = p->block_k;
    k.col_blocks = p->col_blocks;
    k.row_blocks = s->row_blocks;
    k.nnz = p->nnz;
    const int64_t n_tiles = (p->n + SK_GEMM_BN - 1) / SK_GEMM_BN;
    if (n_tiles > INT32_MAX)
        return sk_error(SK_STATUS_NOT_SUPPORTED, "n = %lld: the CUDA BSR GEMM takes n < 2^38",
                        (long long)p->n);
    k.n_tiles = (int32_t)n_tiles;
    k.b_col_major = p->b_order == SK_ORDER_COL_MAJOR;
    k.c_dtype = (int32_t)p->c_dtype;
    k.alpha = p->alpha;
    k.beta = p->beta;
    k.col_indices = p->col_indices;
    k.row_info = s->row_info;
    const int64_t tiles = (int64_t)s->row_blocks * n_tiles;
    if (p->ab_dtype == SK_DTYPE_F16)
        return p->block_m == 64 ? sk_gemm_launch_typed<SK_DTYPE_F16, 64>(k, tiles, stream)
                                : sk_gemm_launch_typed<SK_DTYPE_F16, 128>(k, tiles, stream);
    return p->block_m == 64 ? sk_gemm_launch_typed<SK_DTYPE_BF16, 64>(k, tiles, stream)
                            : sk_gemm_launch_typed<SK_DTYPE_BF16, 128>(k, tiles, stream);
}
