/*
 * gemm.cu - the dispatch of the CUDA BSR GEMM (the sk_cuda_bsr_gemm_* calls
 * of backend.h): workspace size, the plan (block rows of A, longest first,
 * on the GPU: common/schedule.h), and the choice of kernel (gemm_sm80.cu,
 * gemm_sm90.cu; their interface is kernels.h).
 *
 * Run. Checks device, kernel support and workspace first (nothing is
 * enqueued on failure), resets the tile counter with cudaMemsetAsync on the
 * stream, then launches the chosen kernel: SK_BACKEND_CUDA takes the
 * Hopper kernel on compute capability 9.0 when it covers the problem, else
 * the portable one; SK_BACKEND_CUDA_SM80 / _SM90 force one.
 */
#include <stdint.h>

#include "cuda/backend.h"
#include "cuda/common/cuda_check.cuh"
#include "cuda/common/schedule.h"
#include "cuda/gemm/kernels.h"

/* The schedule's view of a GEMM: one tile per block row of A. */
static sk_schedule_geometry sk_gemm_geometry(const sk_bsr_gemm_problem *p) {
    sk_schedule_geometry g;
    g.row_offsets = p->row_offsets;
    g.col_indices = p->col_indices;
    g.nnz = p->nnz;
    g.tiles = p->row_blocks;
    g.row_blocks = p->row_blocks;
    g.col_blocks = p->col_blocks;
    g.heads_q = 1;
    g.layout_batch = 1;
    g.layout_heads = 1;
    g.head_div = 1;
    g.block_q = p->block_m;
    g.block_k = p->block_k;
    g.seq_q = p->m > INT32_MAX ? INT32_MAX : (int32_t)p->m; /* unused: not causal */
    g.seq_k = p->k > INT32_MAX ? INT32_MAX : (int32_t)p->k;
    g.causal = 0;
    g.group_tiles = 0; /* one group: every tile reads the same B */
    return g;
}

typedef enum sk_gemm_kernel { SK_GEMM_SM80 = 0, SK_GEMM_SM90 = 1 } sk_gemm_kernel;

/* Device present and new enough, and which kernel serves the problem. */
static sk_status sk_gemm_choose(const sk_bsr_gemm_problem *p, sk_gemm_kernel *choice) {
    int hopper = 0;
    SK_TRY(sk_cuda_check_arch(p->backend, &hopper));
    if (p->backend == SK_BACKEND_CUDA_SM90) {
        if (!sk_bsr_gemm_sm90_supports(p))
            return sk_error(SK_STATUS_NOT_SUPPORTED,
                            "backend SK_BACKEND_CUDA_SM90: the Hopper GEMM kernel does not cover "
                            "this problem (blocks %d x %d, n = %lld; it takes block_rows 128, "
                            "block_cols 64 or 128, and n * sizeof(C) a multiple of 16 bytes); "
                            "use SK_BACKEND_CUDA",
                            (int)p->block_m, (int)p->block_k, (long long)p->n);
        *choice = SK_GEMM_SM90;
        return SK_STATUS_SUCCESS;
    }
    if (p->backend == SK_BACKEND_CUDA && hopper && sk_bsr_gemm_sm90_supports(p)) {
        *choice = SK_GEMM_SM90;
        return SK_STATUS_SUCCESS;
    }
    *choice = SK_GEMM_SM80;
    return SK_STATUS_SUCCESS;
}

/* The checks the plan and the run both make before enqueuing anything, and
 * the aligned workspace base. */
static sk_status sk_gemm_prepare(const sk_bsr_gemm_problem *p, void *workspace,
                                 size_t workspace_size, sk_plan_layout *w, sk_gemm_kernel *choice,
                                 char **base) {
    const sk_schedule_geometry g = sk_gemm_geometry(p);
    SK_TRY(sk_schedule_layout_of(&g, w));
    SK_TRY(sk_gemm_choose(p, choice));
    SK_TRY(sk_schedule_check_workspace(w, workspace, workspace_size,
                                       "sk_bsr_gemm_workspace_size"));
    *base = sk_schedule_base(workspace);
    return SK_STATUS_SUCCESS;
}

extern "C" sk_status sk_cuda_bsr_gemm_workspace_size(const sk_bsr_gemm_problem *p,
                                                     size_t *bytes) {
    sk_plan_layout w;
    const sk_schedule_geometry g = sk_gemm_geometry(p);
    SK_TRY(sk_schedule_layout_of(&g, &w));
    *bytes = w.total;
    return SK_STATUS_SUCCESS;
}

extern "C" sk_status sk_cuda_bsr_gemm_plan(const sk_bsr_gemm_problem *p, void *workspace,
                                           size_t workspace_size, cudaStream_t stream) {
    sk_plan_layout w;
    sk_gemm_kernel choice;
    char *base;
    SK_TRY(sk_gemm_prepare(p, workspace, workspace_size, &w, &choice, &base));
    const sk_schedule_geometry g = sk_gemm_geometry(p);
    return sk_schedule_enqueue(&g, &w, base, stream);
}

extern "C" sk_status sk_cuda_bsr_gemm_run(const sk_bsr_gemm_problem *p, void *workspace,
                                          size_t workspace_size, cudaStream_t stream) {
    sk_plan_layout w;
    sk_gemm_kernel choice;
    char *base;
    SK_TRY(sk_gemm_prepare(p, workspace, workspace_size, &w, &choice, &base));
    sk_bsr_gemm_schedule s;
    s.row_order = (const int32_t *)(base + w.order);
    s.row_info = (const int4 *)(base + w.info);
    s.counter = (int32_t *)(base + w.counter);
    s.row_blocks = w.tiles;
    SK_CUDA_TRY(cudaMemsetAsync(s.counter, 0, sizeof(int32_t), stream),
                "cudaMemsetAsync (tile counter)");
    if (choice == SK_GEMM_SM90) return sk_bsr_gemm_sm90_launch(p, &s, stream);
    return sk_bsr_gemm_sm80_launch(p, &s, stream);
}
