/*
 * fwd.cu - the dispatch of the CUDA attention forward (the sk_cuda_attention_*
 * calls of backend.h): workspace size, the plan (tile order on the GPU), and
 * the choice of kernel (fwd_sm80.cu, fwd_sm90.cu; their interface is
 * kernels.h).
 *
 * Plan. The longest-first tile order within L2 groups of KV heads
 * (common/schedule.h: three small sort kernels, no host synchronisation),
 * one tile per (batch, query head, query block), plus the sm80 kernel's tile_info (first visited entry of each
 * slot; common/plan_contract.cuh).
 *
 * Run. Checks device, kernel support and workspace first (nothing is
 * enqueued on failure), resets the tile counter with cudaMemsetAsync on the
 * stream, then launches the chosen kernel: SK_BACKEND_CUDA takes the
 * Hopper kernel on compute capability 9.0 when it covers the problem, else
 * the portable one; SK_BACKEND_CUDA_SM80 / _SM90 force one. E4M3 inputs
 * take the FP8 Hopper kernel (fwd_sm90_fp8.cu) or are NOT_SUPPORTED.
 */
#include <stdint.h>

#include "cuda/attention/kernels.h"
#include "cuda/backend.h"
#include "cuda/common/cuda_check.cuh"
#include "cuda/common/schedule.h"

sk_schedule_geometry sk_attention_schedule_geometry(const sk_attention_problem *p) {
    sk_schedule_geometry g;
    g.row_offsets = p->row_offsets;
    g.col_indices = p->col_indices;
    g.nnz = p->nnz;
    g.tiles = p->batch * p->heads_q * (int64_t)p->row_blocks;
    g.row_blocks = p->row_blocks;
    g.col_blocks = p->col_blocks;
    g.heads_q = (int32_t)p->heads_q;
    g.layout_batch = p->layout_batch;
    g.layout_heads = p->layout_heads;
    g.head_div = p->head_div;
    g.block_q = p->block_q;
    g.block_k = p->block_k;
    g.seq_q = (int32_t)p->seq_q;
    g.seq_k = (int32_t)p->seq_k;
    g.causal = p->causal;
    /* L2 groups of whole KV heads (schedule.h): a slice reads K and V of
     * seq_k x head_dim elements each (fp16 / bf16 on CUDA: 2 bytes). */
    g.group_tiles = sk_schedule_l2_group_tiles(p->batch * p->heads_q, p->row_blocks, p->group,
                                               2 * p->seq_k * p->head_dim * 2);
    return g;
}

/* ---------------------------------------------------------------------------
 * Checks shared by plan and run
 * ------------------------------------------------------------------------- */

typedef enum sk_kernel_choice {
    SK_KERNEL_SM80 = 0,
    SK_KERNEL_SM90 = 1,
    SK_KERNEL_SM90_FP8 = 2
} sk_kernel_choice;

/* E4M3 inputs: the FP8 Hopper kernel or nothing. */
static sk_status sk_choose_fp8(const sk_attention_problem *p, int hopper,
                               sk_kernel_choice *choice) {
    if (p->backend == SK_BACKEND_CUDA_SM80)
        return sk_error(SK_STATUS_NOT_SUPPORTED,
                        "desc->dtype = E4M3: the portable kernel (SK_BACKEND_CUDA_SM80) has no "
                        "FP8 path; use SK_BACKEND_CUDA on a compute capability 9.0 device, or "
                        "SK_BACKEND_CPU");
    if (!hopper)
        return sk_error(SK_STATUS_NOT_SUPPORTED,
                        "desc->dtype = E4M3 runs on the Hopper kernel only (compute capability "
                        "9.0); this device has none, use SK_BACKEND_CPU");
    if (!sk_attention_sm90_fp8_supports(p))
        return sk_error(SK_STATUS_NOT_SUPPORTED,
                        "desc->dtype = E4M3: the FP8 Hopper kernel covers head_dim 64 and 128, "
                        "block_q and block_k 64 or 128, strides of 16-byte multiples (this "
                        "problem: head_dim %lld, blocks %d x %d)",
                        (long long)p->head_dim, (int)p->block_q, (int)p->block_k);
    *choice = SK_KERNEL_SM90_FP8;
    return SK_STATUS_SUCCESS;
}

/* Device present and new enough, and which kernel serves the problem. */
static sk_status sk_choose_kernel(const sk_attention_problem *p, sk_kernel_choice *choice) {
    int hopper = 0;
    SK_TRY(sk_cuda_check_arch(p->backend, &hopper));
    if (p->dtype == SK_DTYPE_E4M3) return sk_choose_fp8(p, hopper, choice);
    switch (p->backend) {
    case SK_BACKEND_CUDA_SM90:
        if (!sk_attention_sm90_supports(p))
            return sk_error(SK_STATUS_NOT_SUPPORTED,
                            "backend SK_BACKEND_CUDA_SM90: the Hopper kernel does not cover this "
                            "problem (dtype %d, head_dim %lld, blocks %d x %d, %lld tiles: at "
                            "most 2^31 - 3%s); use SK_BACKEND_CUDA",
                            (int)p->dtype, (long long)p->head_dim, (int)p->block_q,
                            (int)p->block_k, (long long)(p->batch * p->heads_q * p->row_blocks),
                            p->block_q == 64 && (p->lse_carry != NULL || p->tile_count > 0 ||
                                                 p->reserve_sms > 0)
                                ? "; block_q 64 (pairs of query blocks) takes no carried-in "
                                  "result and no part of the tiles"
                                : "");
        *choice = SK_KERNEL_SM90;
        return SK_STATUS_SUCCESS;
    case SK_BACKEND_CUDA:
        if (hopper && sk_attention_sm90_supports(p)) {
            *choice = SK_KERNEL_SM90;
            return SK_STATUS_SUCCESS;
        }
        break;
    default:
        break;
    }
    SK_TRY(sk_attention_sm80_check(p));
    *choice = SK_KERNEL_SM80;
    return SK_STATUS_SUCCESS;
}

/* ---------------------------------------------------------------------------
 * Entry points
 * ------------------------------------------------------------------------- */

extern "C" sk_status sk_cuda_attention_workspace_size(const sk_attention_problem *p,
                                                      size_t *bytes) {
    sk_plan_layout w;
    const sk_schedule_geometry g = sk_attention_schedule_geometry(p);
    SK_TRY(sk_schedule_layout_of(&g, &w));
    *bytes = w.total;
    return SK_STATUS_SUCCESS;
}

/* The checks the plan and the run both make before enqueuing anything
 * (workspace parts, kernel choice, workspace size), and the aligned base. */
static sk_status sk_prepare_enqueue(const sk_attention_problem *p, void *workspace,
                                    size_t workspace_size, sk_plan_layout *w,
                                    sk_kernel_choice *choice, char **base) {
    const sk_schedule_geometry g = sk_attention_schedule_geometry(p);
    SK_TRY(sk_schedule_layout_of(&g, w));
    SK_TRY(sk_choose_kernel(p, choice));
    SK_TRY(
        sk_schedule_check_workspace(w, workspace, workspace_size, "sk_attention_workspace_size"));
    *base = sk_schedule_base(workspace);
    return SK_STATUS_SUCCESS;
}

extern "C" sk_status sk_cuda_attention_plan(const sk_attention_problem *p, void *workspace,
                                            size_t workspace_size, cudaStream_t stream) {
    sk_plan_layout w;
    sk_kernel_choice choice;
    char *base;
    SK_TRY(sk_prepare_enqueue(p, workspace, workspace_size, &w, &choice, &base));
    const sk_schedule_geometry g = sk_attention_schedule_geometry(p);
    return sk_schedule_enqueue(&g, &w, base, stream);
}

extern "C" sk_status sk_cuda_attention_carry_supported(const sk_attention_problem *p,
                                                       int *supported) {
    sk_kernel_choice choice;
    SK_TRY(sk_choose_kernel(p, &choice));
    /* block_q 64 on the Hopper kernel runs pairs of query blocks, which
     * take no carry-in and no part (sk_attention_sm90_supports). */
    *supported = choice == SK_KERNEL_SM90 && p->block_q == 128;
    return SK_STATUS_SUCCESS;
}

extern "C" sk_status sk_cuda_attention_run(const sk_attention_problem *p, void *workspace,
                                           size_t workspace_size, cudaStream_t stream) {
    sk_plan_layout w;
    sk_kernel_choice choice;
    char *base;
    SK_TRY(sk_prepare_enqueue(p, workspace, workspace_size, &w, &choice, &base));
    sk_attention_schedule s;
    s.tile_order = (const int32_t *)(base + w.order);
    s.tile_counter = (int32_t *)(base + w.counter);
    s.num_tiles = w.tiles;
    s.tile_info = (const int4 *)(base + w.info);
    s.part_count = 0;
    if ((p->lse_carry != NULL || p->tile_count > 0 || p->reserve_sms > 0) &&
        choice != SK_KERNEL_SM90)
        return sk_error(SK_STATUS_NOT_SUPPORTED,
                        "a carried-in partial result or a part of the tiles needs the Hopper "
                        "kernel (this problem: the portable one)");
    if (p->tile_count > 0) { /* a part of the plan's order (problem.h) */
        if (p->tile_first < 0 || p->tile_first + p->tile_count > s.num_tiles)
            return sk_error(SK_STATUS_INTERNAL_ERROR, "tiles %lld + %lld of %d",
                            (long long)p->tile_first, (long long)p->tile_count, (int)s.num_tiles);
        s.tile_order += p->tile_first;
        s.part_count = (int32_t)p->tile_count;
    }
    SK_CUDA_TRY(cudaMemsetAsync(s.tile_counter, 0, sizeof(int32_t), stream),
                "cudaMemsetAsync (tile counter)");
    if (choice == SK_KERNEL_SM90_FP8) return sk_attention_sm90_fp8_launch(p, &s, stream);
    if (choice == SK_KERNEL_SM90) return sk_attention_sm90_launch(p, &s, stream);
    return sk_attention_sm80_launch(p, &s, stream);
}
