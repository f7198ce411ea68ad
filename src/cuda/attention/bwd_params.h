/*
 * bwd_params.h - the parameter block that every CUDA attention backward
 * kernel takes (the portable ones in bwd_sm80.cu, the Hopper ones in
 * bwd_sm90_*.cu): pointers, byte strides, sizes and the plan's arrays,
 * filled once by sk_attention_bwd_sm80_launch (bwd_sm80.cu).
 */
#ifndef SK_CUDA_ATTENTION_BWD_PARAMS_H
#define SK_CUDA_ATTENTION_BWD_PARAMS_H

#include <stdint.h>

#include <cuda_runtime.h>

static const float SK_BWD_LOG2E = 1.4426950408889634f;

/* Kernel parameters: byte strides; seq strides fit 32 bits (checked). */
typedef struct sk_bwd_params {
    const char *q, *k, *v, *o, *dout;
    char *dq, *dk, *dv;
    const float *lse; /* [B, Hq, Sq] */
    float *lse2, *dl; /* [B * Hq, sq_pad] workspace */
    int64_t q_sb, q_sh, k_sb, k_sh, v_sb, v_sh, o_sb, o_sh, do_sb, do_sh;
    int64_t dq_sb, dq_sh, dk_sb, dk_sh, dv_sb, dv_sh;
    int32_t q_ss, k_ss, v_ss, o_ss, do_ss, dq_ss, dk_ss, dv_ss;
    int32_t seq_q, seq_k, diag, sq_pad, q_tiles; /* diag = Sk - Sq; q_tiles = sq_pad / 64 */
    int32_t heads_q, heads_kv, group;
    int32_t block_q, block_k, row_blocks, col_blocks, nnz, causal;
    const int32_t *col_indices;
    const int4 *dq_info, *dkv_info;               /* the plan's schedules */
    const int32_t *t_entries;                     /* the transposed layout's entries */
    int32_t dq_tiles, dkv_tiles, t_group, t_reps; /* t_reps = group / t_group */
    float scale, scale_log2;                      /* s and s log2(e), signed */
    /* Varlen mode (bwd_varlen.cu; NULL / 0 in the fixed backward): the
     * varlen plan's tables (varlen_plan.h). The problem is then the packed
     * call as batch 1 (seq_q = total_q, seq_k = total_k, row_blocks = R);
     * dQ tiles are the plan's (query head, layout row), dK/dV tiles (KV
     * head, key column c < v_col_cap); each tile narrows the parameters to
     * its sequence (sk_bwd_varlen_narrow in bwd_sm80.cu). lse2 and Dl are
     * then indexed by padded row: layout row r's queries at r * block_q. */
    const int4 *v_seqs;      /* [v_batch] {q0, len_q, k0, len_k} */
    const int32_t *v_row_start; /* [v_batch + 1] */
    const int2 *v_rows;      /* [row_blocks] {b, i} */
    const int2 *v_cols;      /* [v_col_cap] {b, j} */
    int32_t v_batch, v_col_cap;
    /* bwd->deterministic = 0 on the portable fused kernel (bwd_sm80_fused.cuh):
     * the workspace's fp32 dQaccum [B * Hq, sq_pad, D]; NULL otherwise. */
    float *dqacc;
} sk_bwd_params;

#endif /* SK_CUDA_ATTENTION_BWD_PARAMS_H */
