/*
 * kernels.h - the interface between the CUDA BSR GEMM dispatch (gemm.cu:
 * workspace, plan, kernel choice) and the kernels (gemm_sm80.cu,
 * gemm_sm90.cu). C = alpha * A * B + beta * C.
 *
 * Rows. The plan (common/schedule.h, one tile per block row of A) writes into the
 * workspace the block rows of A in descending order of visited blocks, ties
 * in row order, and per slot {row, first visited entry, end, its column}.
 *
 * Visiting rule (robustness, as for attention): block row r reads entries
 * [start, end) with start = clamp(row_offsets[r], 0, nnz) and
 * end = max(start, clamp(row_offsets[r + 1], 0, nnz)); entry e is visited
 * iff its column c = col_indices[e] is in [0, col_blocks); its values are
 * a_values + e * block_m * block_k. A row with no visited entry gets
 * C = beta * C (C = 0 when beta = 0, C unread).
 *
 * Tails. Elements of a block past m (rows) or past k (columns) are never
 * read, nor are rows of B past k: rows of C past m are not written, and
 * the k tail contributes nothing.
 *
 * An output tile is (block row, range of N columns); each kernel family
 * chooses its N width and how it walks the tiles (the schedule's rows
 * first, so long rows start first).
 */
#ifndef SK_CUDA_GEMM_KERNELS_H
#define SK_CUDA_GEMM_KERNELS_H

#include <cuda_runtime.h>

#include "core/problem.h"

typedef struct sk_bsr_gemm_schedule {
    const int32_t *row_order; /* [row_blocks] device; block rows, longest first */
    const int4 *row_info;     /* [row_blocks] device; per slot {row, first visited entry, end,
                                 first visited column (-1: none)} */
    int32_t *counter;         /* [1] device; zero at kernel start (the run resets it) */
    int32_t row_blocks;
} sk_bsr_gemm_schedule;

/* The portable kernel (mma.sync), any compute capability >= 8.0, every
 * problem the CUDA backend accepts (F16/BF16 A and B; F16/BF16/F32 C; blocks
 * 64 or 128 each way; row- or column-major B). */
sk_status sk_bsr_gemm_sm80_launch(const sk_bsr_gemm_problem *p, const sk_bsr_gemm_schedule *s,
                                  cudaStream_t stream);

/* The Hopper kernel (TMA, wgmma, warp specialisation, persistent), compute
 * capability 9.0 only. supports() says whether it covers the problem; when
 * it does not, SK_BACKEND_CUDA falls back to the portable kernel. */
int sk_bsr_gemm_sm90_supports(const sk_bsr_gemm_problem *p);
sk_status sk_bsr_gemm_sm90_launch(const sk_bsr_gemm_problem *p, const sk_bsr_gemm_schedule *s,
                                  cudaStream_t stream);

#endif /* SK_CUDA_GEMM_KERNELS_H */
