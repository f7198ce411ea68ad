/*
 * fwd_sm90_varlen.cu - the Hopper varlen and paged attention forward: the
 * fixed Hopper kernel (fwd_sm90.cu; the code in fwd_sm90_common.cuh,
 * fwd_sm90_body.cuh and the producer / consumer parts) compiled in varlen
 * or paged mode, its
 * checks, tensor maps and launch (varlen_sm90.h).
 *
 * What the mode changes (docs/perf/varlen_paged_sm90.md says why):
 *   - Tiles: the scheduler warp takes slots of the varlen plan in order
 *     (tile_info[slot] = {t, first entry, end, ...}, stopping at the first
 *     absent one), and reads the tile's row {b, i} and sequence {q0, len_q,
 *     k0, len_k} (clamped by the plan) ahead of the TMA warp. The visiting
 *     rule is varlen_plan.h's: columns below min(col_blocks, nb_k(b)),
 *     causal bottom-right per sequence.
 *   - Q: a TMA box of 128 rows at token q0 + 128 i of the packed Q (batch
 *     1). Rows past the sequence are the next sequence's queries: computed,
 *     never stored.
 *   - K / V, varlen: 128 rows at token k0 + 128 c. Paged: 128 / page_size
 *     boxes of page_size rows, one per page of the block, pages from the
 *     sequence's table row (one 4-D map over the cache); a page index
 *     outside [0, num_pages), or a box past len_k, is not loaded (the
 *     expected bytes count only the boxes issued).
 *   - Keys past len_k (the next sequence's tokens, or a page's unused
 *     slots) and boxes not loaded: their scores are masked to -inf (which
 *     overwrites a NaN from Q K^T), and their V rows are zeroed in shared
 *     memory by both consumer warpgroups before the P V product that reads
 *     them (P = 0 times NaN would be NaN). Only a sequence's last block (or
 *     one with a missing page) pays for it.
 *   - Outputs: a consumer warpgroup whose 64 rows lie inside the sequence
 *     stores them with TMA; the one that crosses the sequence's end copies
 *     its rows below len_q from shared memory with 16-byte stores; rows past
 *     the end are never written. LSE at h * total_q + q0 + q, likewise.
 */
#include "cuda/attention/fwd_sm90_common.cuh"
#include "cuda/attention/fwd_sm90_body.cuh"
#include "cuda/attention/varlen_sm90.h"
#include "cuda/common/schedule.h"

#include <stdio.h>

#include "core/internal.h"

template <sk_dtype DT, int HD, int MODE>
__global__ void __launch_bounds__(kThreads, 1)
    sk_attention_sm90_varlen_kernel(const __grid_constant__ sk90_params p,
                                    const __grid_constant__ sk90_vparams v) {
    sk90_kernel_body<DT, HD, MODE>(p, v);
}

/* ---------------------------------------------------------------------------
 * Host side
 * ------------------------------------------------------------------------- */

/* A 4-D map {D, Hkv, page_size, num_pages} over a cache with element
 * strides {page, slot, head}, box page_size rows (sk90_encode's rule for
 * extents of 1). */
static CUresult sk90v_encode_cache(CUtensorMap *map, const sk_attention_problem *f,
                                   const void *ptr, const int64_t stride[3], int64_t num_pages,
                                   int page_size) {
    const int64_t es = 2, row_bytes = f->head_dim * es;
    const cuuint64_t dims[4] = {(cuuint64_t)f->head_dim, (cuuint64_t)f->heads_kv,
                                (cuuint64_t)page_size, (cuuint64_t)num_pages};
    const int64_t sh = f->heads_kv == 1 ? row_bytes : stride[2] * es;
    const int64_t ss = stride[1] * es;
    const int64_t sp = num_pages == 1 ? ss * page_size : stride[0] * es;
    const cuuint64_t strides[3] = {(cuuint64_t)sh, (cuuint64_t)ss, (cuuint64_t)sp};
    const cuuint32_t box[4] = {kSlabCols, 1, (cuuint32_t)page_size, 1};
    return sk_tensor_map_encode_sw128(map, f->dtype, 4, ptr, dims, strides, box);
}

/* The four maps (pointers may be placeholders: the check asks whether the
 * driver accepts the geometry). */
static CUresult sk90v_encode(sk90_params *prm, const sk_attention_varlen_problem *v,
                             const sk_attention_paged_problem *pg, const void *q, const void *k,
                             const void *vv, const void *o) {
    const sk_attention_problem *f = &v->flat;
    if (pg == NULL) return sk90_encode_all(prm, f, q, k, vv, o);
    const sk_dtype dt = f->dtype;
    CUresult r = sk90_encode(&prm->tm_q, f, dt, kSlabCols, q, f->seq_q, f->heads_q, f->q_stride,
                             kBlockM);
    if (r == CUDA_SUCCESS)
        r = sk90_encode(&prm->tm_o, f, dt, kSlabCols, o, f->seq_q, f->heads_q, f->o_stride,
                        kWgRows);
    if (r == CUDA_SUCCESS)
        r = sk90v_encode_cache(&prm->tm_k, f, k, f->k_stride, pg->num_pages, pg->page_size);
    if (r == CUDA_SUCCESS)
        r = sk90v_encode_cache(&prm->tm_v, f, vv, f->v_stride, pg->num_pages, pg->page_size);
    return r;
}

static int sk90v_page_shift(int32_t page_size) {
    switch (page_size) {
    case 16: return 4;
    case 32: return 5;
    case 64: return 6;
    case 128: return 7;
    default: return -1;
    }
}

/* Why the kernel declines the call (into msg), or 0 when it covers it. */
#define SK90V_WHY(...) (snprintf(msg, size, __VA_ARGS__), 1)
static int sk90v_decline(const sk_attention_varlen_problem *v, const sk_attention_paged_problem *pg,
                         char *msg, size_t size) {
    const sk_attention_problem *f = &v->flat;
    if (f->dtype != SK_DTYPE_F16 && f->dtype != SK_DTYPE_BF16)
        return SK90V_WHY("dtype F16 or BF16 only");
    if (f->head_dim != 64 && f->head_dim != 128)
        return SK90V_WHY("head_dim 64 or 128 only (got %lld)", (long long)f->head_dim);
    if (f->block_q != kBlockM || f->block_k != kBlockN)
        return SK90V_WHY("layout blocks 128 x 128 only (got %d x %d); the portable kernel covers 64",
                         (int)f->block_q, (int)f->block_k);
    if (f->scale == 0.0f || !isfinite(f->scale)) return SK90V_WHY("scale must be finite, != 0");
    if (f->seq_q > kSk90MaxSeq || f->seq_k > kSk90MaxSeq)
        return SK90V_WHY("total_q / total_k (or the cache's slots) above 2^30");
    if (f->heads_q * (int64_t)f->row_blocks > kSk90MaxTiles)
        return SK90V_WHY("heads_q x layout rows above the tile range");
    /* Q and O: token and head strides (16-byte multiples). */
    if (!sk90_stride_ok(f->q_stride[1], f->seq_q, 2) ||
        !sk90_stride_ok(f->q_stride[2], f->heads_q, 2) ||
        !sk90_stride_ok(f->o_stride[1], f->seq_q, 2) ||
        !sk90_stride_ok(f->o_stride[2], f->heads_q, 2))
        return SK90V_WHY("Q / O token and head strides must be positive 16-byte multiples");
    if (pg == NULL) {
        if (!sk90_stride_ok(f->k_stride[1], f->seq_k, 2) ||
            !sk90_stride_ok(f->k_stride[2], f->heads_kv, 2) ||
            !sk90_stride_ok(f->v_stride[1], f->seq_k, 2) ||
            !sk90_stride_ok(f->v_stride[2], f->heads_kv, 2))
            return SK90V_WHY("K / V token and head strides must be positive 16-byte multiples");
    } else {
        if (sk90v_page_shift(pg->page_size) < 0)
            return SK90V_WHY("page_size 16, 32, 64 or 128 only (got %d)", (int)pg->page_size);
        if (pg->num_pages > INT32_MAX) return SK90V_WHY("num_pages above INT32_MAX");
        for (int t = 0; t < 2; ++t) {
            const int64_t *st = t == 0 ? f->k_stride : f->v_stride;
            if (!sk90_stride_ok(st[0], pg->num_pages, 2) || !sk90_stride_ok(st[1], 2, 2) ||
                !sk90_stride_ok(st[2], f->heads_kv, 2))
                return SK90V_WHY("cache page, slot and head strides must be positive 16-byte "
                                 "multiples");
        }
    }
    /* The per-row stores of tail tiles write 16 bytes at a time. */
    if (f->o != NULL && ((uintptr_t)f->o & 15u) != 0) return SK90V_WHY("O must be 16-byte aligned");
    sk90_params prm;
    const void *dummy = (const void *)(uintptr_t)(1u << 20);
    if (sk90v_encode(&prm, v, pg, dummy, dummy, dummy, dummy) != CUDA_SUCCESS)
        return SK90V_WHY("the driver refused the tensor-map geometry");
    return 0;
}
#undef SK90V_WHY

extern "C" int sk_attention_sm90_varlen_supports(const sk_attention_varlen_problem *v,
                                                 const sk_attention_paged_problem *pg) {
    char msg[160];
    return !sk90v_decline(v, pg, msg, sizeof msg);
}

extern "C" sk_status sk_attention_sm90_varlen_check(const sk_attention_varlen_problem *v,
                                                    const sk_attention_paged_problem *pg) {
    char msg[160];
    if (sk90v_decline(v, pg, msg, sizeof msg))
        return sk_error(SK_STATUS_NOT_SUPPORTED, "the Hopper varlen / paged kernel: %s", msg);
    return SK_STATUS_SUCCESS;
}

template <sk_dtype DT, int HD, int MODE>
static sk_status sk90v_launch_as(const sk90_params &prm, const sk90_vparams &vp, int grid,
                                 cudaStream_t stream) {
    using L = sk90_layout<HD, MODE>;
    SK_CUDA_TRY(cudaFuncSetAttribute(sk_attention_sm90_varlen_kernel<DT, HD, MODE>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)L::kVDynamicBytes),
                "cudaFuncSetAttribute");
    sk_attention_sm90_varlen_kernel<DT, HD, MODE><<<grid, kThreads, L::kVDynamicBytes, stream>>>(prm, vp);
    return sk_cuda_status(cudaGetLastError(), "sm90 varlen attention kernel launch");
}

template <int MODE>
static sk_status sk90v_launch_mode(const sk90_params &prm, const sk90_vparams &vp,
                                   const sk_attention_problem *f, int grid, cudaStream_t stream) {
    const bool bf16 = f->dtype == SK_DTYPE_BF16;
    if (f->head_dim == 128)
        return bf16 ? sk90v_launch_as<SK_DTYPE_BF16, 128, MODE>(prm, vp, grid, stream)
                    : sk90v_launch_as<SK_DTYPE_F16, 128, MODE>(prm, vp, grid, stream);
    return bf16 ? sk90v_launch_as<SK_DTYPE_BF16, 64, MODE>(prm, vp, grid, stream)
                : sk90v_launch_as<SK_DTYPE_F16, 64, MODE>(prm, vp, grid, stream);
}

extern "C" sk_status sk_attention_sm90_varlen_launch(const sk_attention_varlen_problem *v,
                                                     const sk_attention_paged_problem *pg,
                                                     const sk_varlen_plan_view *plan,
                                                     struct CUstream_st *stream) {
    SK_TRY(sk_attention_sm90_varlen_check(v, pg));
    const sk_attention_problem *f = &v->flat;
    sk90_params prm;
    sk90_vparams vp;
    memset(&prm, 0, sizeof prm);
    memset(&vp, 0, sizeof vp);
    const CUresult r = sk90v_encode(&prm, v, pg, f->q, f->k, f->v, f->o);
    if (r != CUDA_SUCCESS)
        return sk_error(SK_STATUS_EXECUTION_FAILED, "cuTensorMapEncodeTiled failed (CUresult %d)",
                        (int)r);
    /* Tile t = h * R + r (R = plan->row_blocks); the plan gives each tile's
     * entries, so row_offsets is not read. */
    sk90_params_fill(&prm, f, plan->tile_order, plan->tile_counter, plan->num_tiles,
                     plan->row_blocks);
    vp.tile_info = plan->tile_info;
    vp.rows = plan->rows;
    vp.seqs = plan->seqs;
    vp.o = f->o;
    vp.o_token_stride = f->o_stride[1];
    vp.o_head_stride = f->o_stride[2];
    vp.batch = plan->batch;
    vp.total_q = (int32_t)f->seq_q;
    if (pg != NULL) {
        vp.page_table = pg->page_table;
        vp.table_stride = pg->page_table_stride;
        vp.num_pages = (int32_t)pg->num_pages;
        vp.page_size = pg->page_size;
        vp.page_shift = sk90v_page_shift(pg->page_size);
    }

    int grid = 0;
    SK_TRY(sk90_grid(plan->num_tiles, &grid));
    if (grid <= 0) return SK_STATUS_SUCCESS;
    return pg != NULL ? sk90v_launch_mode<kSk90Paged>(prm, vp, f, grid, stream)
                      : sk90v_launch_mode<kSk90Varlen>(prm, vp, f, grid, stream);
}

extern "C" sk_status sk_attention_sm90_varlen_test_workspace(const sk_attention_varlen_problem *v,
                                                             size_t *bytes) {
    sk_varlen_plan_layout w;
    SK_TRY(sk_varlen_plan_layout_of(v, &w));
    *bytes = w.total;
    return SK_STATUS_SUCCESS;
}

extern "C" sk_status sk_attention_sm90_varlen_test_run(const sk_attention_varlen_problem *v,
                                                       const sk_attention_paged_problem *pg,
                                                       void *workspace, size_t workspace_size,
                                                       struct CUstream_st *stream) {
    sk_varlen_plan_layout w;
    SK_TRY(sk_varlen_plan_layout_of(v, &w));
    SK_TRY(sk_attention_sm90_varlen_check(v, pg));
    if (workspace == NULL || workspace_size < w.total)
        return sk_error(SK_STATUS_BAD_PARAM_WORKSPACE, "workspace_size = %zu is below %zu",
                        workspace_size, w.total);
    char *base = sk_schedule_base(workspace);
    sk_varlen_plan_source src;
    src.v = v;
    src.seq_lens_k = pg != NULL ? pg->seq_lens_k : NULL;
    SK_TRY(sk_varlen_plan_enqueue(&src, &w, base, stream));
    const sk_varlen_plan_view plan = sk_varlen_plan_view_of(&w, base);
    SK_CUDA_TRY(cudaMemsetAsync(plan.tile_counter, 0, sizeof(int32_t), stream),
                "cudaMemsetAsync (tile counter)");
    return sk_attention_sm90_varlen_launch(v, pg, &plan, stream);
}
