/*
 * bwd_dq_visit.cuh - the dQ passes' walk over a layout row (the portable
 * kernel, bwd_sm80_dq.cuh, and the Hopper one, bwd_sm90_dq_kernel.cuh):
 * the selected blocks in layout order, each in 64-key chunks, skipping
 * the entries and chunks that the visiting rule of
 * common/plan_contract.cuh drops (column out of range; causal: no key a
 * row of the tile may see) and the chunks past Sk. One function, so that
 * both kernels visit the same chunks in the same order.
 */
#ifndef SK_CUDA_ATTENTION_BWD_DQ_VISIT_CUH
#define SK_CUDA_ATTENTION_BWD_DQ_VISIT_CUH

#include "cuda/attention/bwd_kernels.h"
#include "cuda/attention/bwd_params.h"

/* The 64-key chunk after (pos, col, ks) in entries (.., end) that a query
 * row up to kmax may see (causal): the next chunk of block col, else the
 * first of the next visited entry. Start with ks = block_k / 64 and pos
 * one before the first entry. False at the end. */
__device__ __forceinline__ bool sk_bwd_dq_next(const sk_bwd_params &p, int32_t end, int32_t kmax,
                                               int32_t *pos, int32_t *col, int32_t *ks) {
    const int32_t subs = p.block_k / SK_BWD_TILE;
    if (*ks + 1 < subs) {
        const int32_t kb = *col * p.block_k + (*ks + 1) * SK_BWD_TILE;
        if (kb < p.seq_k && (!p.causal || kb <= kmax)) {
            ++*ks;
            return true;
        }
    }
    for (++*pos; *pos < end; ++*pos) {
        const int32_t c = __ldg(p.col_indices + *pos);
        if ((uint32_t)c < (uint32_t)p.col_blocks && (!p.causal || c * p.block_k <= kmax)) {
            *col = c;
            *ks = 0;
            return true;
        }
    }
    return false;
}

#endif /* SK_CUDA_ATTENTION_BWD_DQ_VISIT_CUH */
