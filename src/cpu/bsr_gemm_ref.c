/*
 * bsr_gemm_ref.c - the CPU reference BSR x dense GEMM:
 *   C = alpha * A * B + beta * C,   A [m, k] in BSR with bm x bk blocks.
 *
 * Work unit ("tile"): one block row of A (bm rows of C) times one chunk of
 * up to SK_GEMM_NC columns of B and C. Tiles are independent and spread over
 * OpenMP threads (dynamic schedule: block rows differ in length).
 *
 * Per tile, for each stored block (row block r, column block j) in order:
 * the block's valid part (rows < m, columns < k: the rest is never read) is
 * widened to fp64, and so are the matching rows j*bk .. of B (row- or
 * column-major); acc += A_blk * B_blk in fp64 (products of two values exact
 * in fp32 are exact in fp64, so only the sums round). Finally
 *   C = alpha * acc + beta * C   in fp64, rounded once to C's dtype (RNE);
 * C is not read when beta == 0, so NaN in C does not propagate. A block row
 * with no stored block gets C = beta * C (0 when beta == 0).
 *
 * Only the tile's own C elements are written, by the thread that owns the
 * tile; results do not depend on the thread count. Scratch is allocated
 * before anything is written.
 */
#include <omp.h>
#include <stdlib.h>

#include "core/internal.h"
#include "cpu/cpu_backend.h"
#include "cpu/half.h"

enum { SK_GEMM_NC = 256 }; /* columns of B / C per tile */

typedef struct gemm_scratch {
    double *a;   /* [bm, bk]  one block of A (valid part, row stride kc) */
    double *b;   /* [bk, NC]  the matching rows of B (row stride nc) */
    double *acc; /* [bm, NC]  A * B of the tile (row stride nc) */
    double *c;   /* [NC]      one row of C's old values */
} gemm_scratch;

static int64_t min_i64(int64_t a, int64_t b) {
    return a < b ? a : b;
}

static void gemm_tile(const sk_bsr_gemm_problem *p, int64_t rb, int64_t chunk, gemm_scratch *w) {
    const int64_t bm = p->block_m, bk = p->block_k;
    const int64_t r0 = rb * bm, mr = min_i64(bm, p->m - r0);
    const int64_t c0 = chunk * SK_GEMM_NC, nc = min_i64(SK_GEMM_NC, p->n - c0);
    double *acc = w->acc;
    for (int64_t x = 0; x < mr * nc; ++x) acc[x] = 0.0;

    for (int32_t e = p->row_offsets[rb]; e < p->row_offsets[rb + 1]; ++e) {
        const int64_t k0 = (int64_t)p->col_indices[e] * bk, kc = min_i64(bk, p->k - k0);
        /* A's block e: [bm, bk] row-major at element e * bm * bk. */
        for (int64_t r = 0; r < mr; ++r)
            sk_cpu_load_f64(w->a + r * kc,
                            sk_cpu_elem(p->a_values, p->ab_dtype, ((int64_t)e * bm + r) * bk),
                            p->ab_dtype, kc);
        if (p->b_order == SK_ORDER_ROW_MAJOR) {
            for (int64_t kk = 0; kk < kc; ++kk)
                sk_cpu_load_f64(w->b + kk * nc,
                                sk_cpu_elem(p->b, p->ab_dtype, (k0 + kk) * p->ldb + c0),
                                p->ab_dtype, nc);
        } else { /* (row, col) at col * ldb + row: walk each column contiguously */
            for (int64_t c = 0; c < nc; ++c)
                for (int64_t kk = 0; kk < kc; ++kk)
                    w->b[kk * nc + c] =
                        (double)sk_cpu_load1_f32(p->b, p->ab_dtype, (c0 + c) * p->ldb + k0 + kk);
        }
        for (int64_t r = 0; r < mr; ++r) {
            double *acc_row = acc + r * nc;
            for (int64_t kk = 0; kk < kc; ++kk) {
                const double a = w->a[r * kc + kk];
                const double *b_row = w->b + kk * nc;
#pragma omp simd
                for (int64_t c = 0; c < nc; ++c) acc_row[c] += a * b_row[c];
            }
        }
    }

    const double alpha = p->alpha, beta = p->beta;
    for (int64_t r = 0; r < mr; ++r) {
        const int64_t row_off = (r0 + r) * p->ldc + c0;
        double *acc_row = acc + r * nc;
        if (beta != 0.0) {
            sk_cpu_load_f64(w->c, sk_cpu_elem(p->c, p->c_dtype, row_off), p->c_dtype, nc);
            for (int64_t c = 0; c < nc; ++c) acc_row[c] = alpha * acc_row[c] + beta * w->c[c];
        } else {
            for (int64_t c = 0; c < nc; ++c) acc_row[c] = alpha * acc_row[c];
        }
        sk_cpu_store_f64(sk_cpu_elem_mut(p->c, p->c_dtype, row_off), p->c_dtype, acc_row, nc);
    }
}

sk_status sk_cpu_bsr_gemm_run(const sk_bsr_gemm_problem *p) {
    const size_t bm = (size_t)p->block_m, bk = (size_t)p->block_k, nc = SK_GEMM_NC;
    const size_t slab = (bm * bk + bk * nc + bm * nc + nc) * sizeof(double); /* < 1 MiB */
    int threads = omp_get_max_threads();
    if (threads < 1) threads = 1;
    char *mem = (char *)malloc(slab * (size_t)threads);
    if (mem == NULL) {
        threads = 1;
        mem = (char *)malloc(slab);
    }
    if (mem == NULL)
        return sk_error(SK_STATUS_ALLOC_FAILED,
                        "the CPU backend could not allocate %zu bytes of scratch", slab);

    const int64_t chunks = sk_ceil_div_i64(p->n, SK_GEMM_NC);
    const int64_t tiles = (int64_t)p->row_blocks * chunks; /* <= m * n: fits */
#pragma omp parallel num_threads(threads)
    {
        double *base = (double *)(mem + slab * (size_t)omp_get_thread_num());
        gemm_scratch w;
        w.a = base;
        w.b = w.a + bm * bk;
        w.acc = w.b + bk * nc;
        w.c = w.acc + bm * nc;
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < tiles; ++t) gemm_tile(p, t / chunks, t % chunks, &w);
    }
    free(mem);
    return SK_STATUS_SUCCESS;
}
