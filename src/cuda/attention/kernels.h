/*
 * kernels.h - the interface between the CUDA attention dispatch (fwd.cu:
 * workspace, plan, kernel choice) and the forward kernels (fwd_sm80.cu,
 * fwd_sm90.cu).
 *
 * Tiles. A tile is one layout row for one query head: tile id
 *     t = (b * heads_q + h) * row_blocks + i
 * covers query tokens [i * block_q, min((i + 1) * block_q, Sq)) of batch b,
 * query head h, and the key blocks of layout row
 *     g = slice(b, h) * row_blocks + i,
 *     slice(b, h) = (layout_batch == 1 ? 0 : b) * layout_heads + h / head_div.
 *
 * Schedule. sk_attention_plan writes into the workspace the tile order,
 * longest rows (most selected blocks) first, ties in tile-id order, so that
 * the query heads of one KV group and batch stay adjacent (their K/V is
 * shared in L2). A kernel may walk tile_order with a persistent grid and an
 * atomic counter (reset on the stream by the run, before the launch), or
 * launch one CTA per tile and read tile_order[blockIdx.x].
 */
#ifndef SK_CUDA_ATTENTION_KERNELS_H
#define SK_CUDA_ATTENTION_KERNELS_H

#include <cuda_runtime.h>

#include "core/problem.h"
#include "cuda/attention/varlen_plan.h"
#include "cuda/common/schedule.h"

typedef struct sk_attention_schedule {
    const int32_t *tile_order; /* [num_tiles] device; tile ids, longest rows first */
    int32_t *tile_counter;     /* [1] device; zero at kernel start */
    int32_t num_tiles;         /* batch * heads_q * row_blocks */
    const int4 *tile_info;     /* [num_tiles] device; per slot {tile, first position, end,
                                  first column}, written by the plan (sm80 kernel) */
    int32_t part_count;        /* 0: the whole order; else the Hopper fixed kernel takes
                                  this many tiles from tile_order on (a part of the run) */
} sk_attention_schedule;

/* The schedule's view of an attention problem (fwd.cu): one tile per
 * (batch, query head, query block); the backward's dQ pass sorts the same
 * tiles. */
sk_schedule_geometry sk_attention_schedule_geometry(const sk_attention_problem *p);

/* The portable kernel (mma.sync, cp.async), any compute capability >= 8.0.
 * Returns SK_STATUS_NOT_SUPPORTED (with a message) for a combination it
 * lacks, before enqueuing anything; check() is that test alone, which the
 * dispatch runs before its plan. */
sk_status sk_attention_sm80_check(const sk_attention_problem *p);
sk_status sk_attention_sm80_launch(const sk_attention_problem *p, const sk_attention_schedule *s,
                                   cudaStream_t stream);

/* The Hopper kernel (TMA, wgmma, warp specialisation), compute capability
 * 9.0 only. supports() says whether it covers the problem; when it does
 * not, the dispatch falls back to the portable kernel. */
int sk_attention_sm90_supports(const sk_attention_problem *p);
sk_status sk_attention_sm90_launch(const sk_attention_problem *p, const sk_attention_schedule *s,
                                   cudaStream_t stream);

/* The portable varlen (paged == NULL) and paged forwards: the fixed
 * kernel's body on the varlen plan's tiles (varlen_plan.h), each tile with
 * its sequence's lengths and token bases. The plan must have run on the
 * stream, and the tile counter be zero. */
sk_status sk_attention_sm80_varlen_launch(const sk_attention_varlen_problem *vp,
                                          const sk_attention_paged_problem *paged,
                                          const sk_varlen_plan_view *plan, cudaStream_t stream);

/* The FP8 Hopper kernel (fwd_sm90_fp8.cu): E4M3 Q, K, V, O in out_dtype,
 * head_dim 64 or 128, blocks 128 x 128, compute capability 9.0 only; no other
 * kernel takes E4M3. */
int sk_attention_sm90_fp8_supports(const sk_attention_problem *p);
sk_status sk_attention_sm90_fp8_launch(const sk_attention_problem *p,
                                       const sk_attention_schedule *s, cudaStream_t stream);

#endif /* SK_CUDA_ATTENTION_KERNELS_H */
