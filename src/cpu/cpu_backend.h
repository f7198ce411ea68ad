/*
 * cpu_backend.h - the reference backend: plain loops, fp32 math with fp64
 * reductions, OpenMP threads. Problems arrive validated, with host arrays
 * and a layout that passed sk_layout_validate.
 */
#ifndef SK_CPU_BACKEND_H
#define SK_CPU_BACKEND_H

#include "core/decode_select.h"
#include "core/problem.h"
#include "core/topk_rules.h"

sk_status sk_cpu_attention_run(const sk_attention_problem *p);
/* Several problems of one head_dim and block shape in one parallel run:
 * problem c owns tiles tile_start[c] .. tile_start[c + 1] - 1 (B x Hq x
 * row_blocks of them, in that order); tile_start[count] is the total. */
sk_status sk_cpu_attention_run_problems(const sk_attention_problem *probs,
                                        const int64_t *tile_start, int32_t count);
/* A varlen call (attention_varlen_ref.c): one problem per sequence, run as
 * above. Allocates the problem list (SK_STATUS_ALLOC_FAILED, nothing
 * written, when that fails). */
sk_status sk_cpu_attention_varlen_run(const sk_attention_varlen_problem *p);
/* A paged call: the same, each sequence's keys read through its page
 * table row. */
sk_status sk_cpu_attention_paged_run(const sk_attention_paged_problem *p);
/* A decode call (decode_ref.c): one problem per sequence (q_len queries,
 * len_k(b) keys through its page table row, its slice rows of the decode
 * layout, or every block for the dense case), run as above. Allocates the
 * problem list (SK_STATUS_ALLOC_FAILED, nothing written, when that fails). */
sk_status sk_cpu_decode_run(const sk_decode_problem *p);
/* The backward (attention_bwd_ref.c): dQ, dK, dV, deterministic whatever
 * the thread count. Allocates host scratch (the layout's transpose and one
 * slab per thread) before writing: SK_STATUS_ALLOC_FAILED when that fails. */
sk_status sk_cpu_attention_backward_run(const sk_attention_backward_problem *p);
sk_status sk_cpu_bsr_gemm_run(const sk_bsr_gemm_problem *p);

/* Top-k block selection (topk_ref.c): block means and block scores in fp32
 * with fp64 sums, and the rules of src/core/topk_rules.h applied row by
 * row. Problems arrive validated (src/core/topk.c) with host pointers. */

/* p->q, p->k_in -> p->pooled_q_out, p->pooled_k_out:
 * pooled[b, h, i, :] = (float)(fp64 sum of the block's valid tokens / count). */
sk_status sk_cpu_topk_pool(const sk_topk_problem *p);

/* Block scores from p->pooled_q / p->pooled_k into scores
 * [slices, row_blocks, col_blocks] (every entry written):
 * scores = (float)(scale * fp64 sum over the group's query heads (per_kv_head)
 * or the one head, and over D, of pooled_q * pooled_k). */
void sk_cpu_topk_scores(const sk_topk_problem *p, float *scores);

/* Selection into p->row_offsets / p->col_indices, from p->scores or, when it
 * is NULL, from scores computed from p->pooled_q / p->pooled_k. Allocates
 * host scratch: SK_STATUS_ALLOC_FAILED (nothing written) when that fails. */
sk_status sk_cpu_topk_select(const sk_topk_problem *p);

/* One row: the selected blocks of row `r` (rules `rule`) in increasing
 * order into out[0 .. count), from its scores row[0 .. col_blocks); `pairs`
 * is scratch for col_blocks entries. Returns count (<= rule->bound). */
typedef struct sk_topk_pair {
    float score;
    int32_t index;
} sk_topk_pair;
int32_t sk_cpu_topk_select_row(const sk_topk_problem *p, const sk_topk_row *rule, const float *row,
                               sk_topk_pair *pairs, int32_t *out);

/* sk_cpu_topk_pool into fresh host buffers, then sk_cpu_topk_select: the
 * selection half of sk_attention_topk on the CPU (p->q, p->k_in set). */
sk_status sk_cpu_topk_pool_select(const sk_topk_problem *p);

/* The top-k selection on varlen / paged inputs (topk_varlen_ref.c): each
 * sequence as the fixed selection (sk_cpu_topk_pool_select with B = 1 on
 * its tokens; paged keys gathered from their pages first), its rows placed
 * at the sequence's layout rows. Host scratch: SK_STATUS_ALLOC_FAILED with
 * nothing written when it cannot be had. */
sk_status sk_cpu_topk_varlen_select(const sk_topk_varlen_problem *p);

/* Context parallel (cp_ref.c): the host side of a rank's run. */
#include "core/cp_plan.h"
/* Pack the K then V rows of n units (each block's tokens, D contiguous)
 * from rank plan `src`'s shard k, v [B, S_r, Hkv, D] (dtype, packed) into
 * dst, in unit order: exactly the bytes the plan counts. */
void sk_cpu_cp_pack(const sk_cp_plan_header *h, const sk_cp_rank_plan *src, sk_dtype dtype,
                    const sk_cp_unit *units, int64_t n, const void *k, const void *v, void *dst);
/* The inverse at the receiver: the units' rows into its remote buffers
 * k_remote, v_remote [B, remote_keys, Hkv, D] fp32 at their slots. */
void sk_cpu_cp_unpack(const sk_cp_plan_header *h, const sk_cp_rank_plan *dst, sk_dtype dtype,
                      const sk_cp_unit *units, int64_t n, const void *src, float *k_remote,
                      float *v_remote);

/* Backward: the fp32 dK then dV rows of n units (as sk_cpu_cp_pack lays
 * out K and V) from rank plan dst's remote gradient buffers [B,
 * remote_keys, Hkv, D] at their slots, into out. */
void sk_cpu_cp_grad_pack(const sk_cp_plan_header *h, const sk_cp_rank_plan *dst,
                         const sk_cp_unit *units, int64_t n, const float *dk_remote,
                         const float *dv_remote, float *out);
/* The inverse at the owner (rank plan src): each unit's rows of `in` added
 * to dk, dv [B, S_r, Hkv, D] fp32 at the block's shard rows. */
void sk_cpu_cp_grad_add(const sk_cp_plan_header *h, const sk_cp_rank_plan *src,
                        const sk_cp_unit *units, int64_t n, const float *in, float *dk, float *dv);

/* Merge two partial attentions of the same queries over disjoint key sets
 * by their LSE: with m = max(lse_a, lse_b), w = exp(lse - m),
 * O = (w_a O_a + w_b O_b) / (w_a + w_b), LSE = m + log(w_a + w_b), in fp64,
 * O rounded once to the dtype; both -inf gives O = 0, LSE = -inf. */
typedef struct sk_lse_merge {
    sk_dtype dtype; /* of o */
    int64_t batch, tokens, heads, dim;
    const float *o_a, *lse_a; /* [B, tokens, H, D], [B, H, tokens] fp32 packed */
    const float *o_b, *lse_b; /* the same; NULL: only part a */
    void *o;                  /* [B, o_seq, H, D] packed, rows o_start .. + tokens */
    float *lse;               /* [B, H, o_seq], the same rows; may be NULL */
    int64_t o_seq, o_start;
} sk_lse_merge;
void sk_cpu_lse_merge(const sk_lse_merge *m);

/* Decode page selection (decode_select_ref.c; problems checked by
 * src/core/decode_select.c, page indices and lengths included). */
/* Build (append == 0: every block) or append (the blocks holding keys
 * old_lens[b] .. seq_lens[b] - 1) into p->summary_out. */
sk_status sk_cpu_dsel_summary(const sk_dsel_problem *p, int append);
/* Scores and selection into p->row_offsets / p->col_indices. */
sk_status sk_cpu_dsel_select(const sk_dsel_problem *p);

/* The varlen backward (attention_varlen_bwd_ref.c): one fixed backward
 * problem per sequence (sk_cpu_varlen_sequence's forward part), all run by
 * attention_bwd_ref.c with one scratch allocation, so an allocation
 * failure writes nothing. */
sk_status sk_cpu_attention_varlen_backward_run(const sk_attention_varlen_backward_problem *p);
/* Sequence b's fixed-batch forward problem (batch 1) cut from p->flat,
 * whose layout rows start at `row` (attention_varlen_ref.c). */
void sk_cpu_varlen_sequence(sk_attention_problem *s, const sk_attention_varlen_problem *p,
                            int32_t b, int64_t row);
/* Fixed backward problems run one after the other with shared scratch;
 * each one deterministic (attention_bwd_ref.c). */
sk_status sk_cpu_attention_backward_run_problems(const sk_attention_backward_problem *probs,
                                                 int32_t count);

#endif /* SK_CPU_BACKEND_H */
