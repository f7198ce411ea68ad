/*
 * topk_internal.h - the top-k entry points' steps (src/core/topk.c), for
 * other entry points that run a selection inside them (sk_attention_topk,
 * src/core/attention_topk.c). None calls SK_ENTER, so messages keep the
 * caller's name. Order of use: build_problem, the checks, select_bytes,
 * run_select.
 */
#ifndef SK_CORE_TOPK_INTERNAL_H
#define SK_CORE_TOPK_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "core/problem.h"

/* The descriptor alone: every field, the grid, the capacity. Fills *p
 * (pointers NULL). */
sk_status sk_topk_build_problem(const sk_topk_desc *d, sk_topk_problem *p);

/* The CUDA kernels read and write 16-byte vectors of one row. */
sk_status sk_topk_check_cuda_head_dim(const sk_topk_problem *p);

/* Q and K of the pooling: extents and alignment; their byte spans out. */
sk_status sk_topk_check_qk(const sk_topk_problem *p, const void *q, const void *k,
                           int64_t *q_bytes, int64_t *k_bytes);

/* The caller's output layout arrays: present and aligned (their aliasing
 * is checked with the call's other buffers). */
sk_status sk_topk_check_layout_out(const sk_topk_problem *p, const sk_bsr *layout);

/* A CUDA workspace of at least `need` bytes, 16-byte aligned. */
sk_status sk_topk_check_workspace(const void *workspace, size_t workspace_size, size_t need);

/* The selections, by the workspace each needs. */
typedef enum { SK_TOPK_FROM_SCORES, SK_TOPK_SCORED, SK_TOPK_POOLED } sk_topk_select_kind;

/* Workspace bytes of a selection (0 on the CPU, which needs none):
 * sk_layout_from_scores' (SK_TOPK_FROM_SCORES), sk_select_topk's
 * (SK_TOPK_SCORED) or sk_pool_select_topk's (SK_TOPK_POOLED). */
sk_status sk_topk_select_bytes(const sk_topk_problem *p, sk_topk_select_kind kind, size_t *bytes);

/* The checked selection on its backend, writing into `layout`; with
 * `pool`, the pooling first (p->q, p->k_in; sk_pool_select_topk's
 * workspace). */
sk_status sk_topk_run_select(sk_topk_problem *p, int pool, sk_bsr *layout, void *workspace,
                             size_t workspace_size, struct CUstream_st *stream);

#endif /* SK_CORE_TOPK_INTERNAL_H */
