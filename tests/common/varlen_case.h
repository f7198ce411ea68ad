/*
 * varlen_case.h - seeded varlen attention cases for the tests (CPU now, the
 * GPU suite later): lengths, per-sequence block masks per layout head
 * slice, the varlen BSR made from them here (never the library's
 * builders), packed Q/K/V rounded to the dtype with NaN wherever no query
 * may read (stride padding, keys no query of the sequence's KV head
 * attends; key blocks no row visits under vc_case.kernel_rules), their
 * fp64 copies, and the comparison of a run's O and LSE with the naive
 * fp64 reference on each sequence's unpacked rows (tests/common/naive_ref.h)
 * under the tolerance rule of test_util.h (plus the P rounding term under
 * kernel_rules).
 */
#ifndef SK_TESTS_VARLEN_CASE_H
#define SK_TESTS_VARLEN_CASE_H

#include <stddef.h>
#include <stdint.h>

#include "common/test_util.h"
#include "sparsek.h"

enum { VC_MAXB = 12 };

typedef enum vc_call { VC_FORWARD, VC_PLAN_RUN, VC_RUN } vc_call;

typedef struct vc_case {
    sk_dtype dtype;
    int32_t batch;
    int32_t len_q[VC_MAXB], len_k[VC_MAXB];
    int64_t heads_q, heads_kv, head_dim;
    int32_t bq, bk;
    int causal;
    float scale;          /* 0: 1/sqrt(D) */
    int32_t layout_heads; /* 1, heads_kv or heads_q */
    double density;       /* probability that a block is selected */
    int padded;           /* token and head strides with gaps: 1 odd, 2 16-byte aligned (CUDA) */
    int with_lse;
    vc_call call;
    int32_t extra_rows; /* layout rows past the sequences' (a capacity) */
    /* window_blocks > 0: instead of random blocks, each row selects its
     * sink_blocks first key blocks and the window_blocks blocks ending at
     * its bottom-right diagonal block (a sinks + window pattern). */
    int32_t window_blocks, sink_blocks;
    /* kernel_rules: the case runs on the CUDA kernels (the GPU suite sets
     * it; 0 = the CPU backend's stricter rules). Two differences:
     *  - NaN keys: per key block rather than per key. A kernel reads every
     *    key (< len_k) of each 64-key chunk of a block it visits and masks
     *    the invisible ones with P = 0, but 0 x NaN = NaN in P V; so K/V
     *    are NaN only outside the blocks that some row of the KV head's
     *    query heads visits (selected and, when causal, its first key <=
     *    the row's last visible key: plan_contract.cuh's visiting rule),
     *    as the fixed-batch GPU suite poisons (gpu_util.c).
     *  - O tolerance: the kernels round P to the dtype before P V, which
     *    adds 2 u sum_k p_k |v_kd| per element (the term of gpu_util.h's
     *    rule and of decode_case.c); the CPU computes P V in fp32. */
    int kernel_rules;
} vc_case;

/* What a run leaves for the tests that look further. */
typedef struct vc_outcome {
    int64_t empty_rows; /* (query, head) rows with no admissible key */
    int64_t checked;
    int bitwise_sequences; /* sequences compared bit for bit with the fixed batch */
    void *o;               /* copies of the outputs when asked for */
    float *lse;
    size_t o_bytes;
} vc_outcome;

/* The case's arrays: lengths, masks, the varlen BSR, the tensors. */
typedef struct vc_data {
    int32_t cu_q[VC_MAXB + 1], cu_k[VC_MAXB + 1];
    int64_t nbq[VC_MAXB], nbk[VC_MAXB], row_start[VC_MAXB], mask_at[VC_MAXB];
    int64_t R, total_q, total_k;
    uint8_t *masks; /* sequence b: [layout_heads, nbq, nbk] at mask_at[b] */
    sk_bsr layout;
    int64_t ts_q, ts_k, hs; /* token strides (Q/O and K/V), head stride */
    void *q, *k, *v, *o;
    float *lse;
    int64_t q_span, k_span;
    double *qd, *kd, *vd; /* packed [total, H, D] copies in fp64 */
} vc_data;

size_t vc_elem_size(sk_dtype t);

/* A case of `batch` sequences of lq[b] x lk[b] tokens: one head each,
 * D 32, blocks 64, a full layout, LSE, sk_attention_varlen_forward. */
vc_case vc_base_case(sk_dtype dtype, int32_t batch, const int32_t *lq, const int32_t *lk);

/* A case with every option at random: 1 .. max_batch sequences, query
 * lengths mostly up to max_len_q / 2, now and then up to max_len_q or 0,
 * key lengths 1 .. max_len_k or 0 (totals at least 1), GQA 1 to 8, D odd
 * or 64 or 128, blocks, causal, density, layout heads, strides, LSE, the
 * call, spare layout rows, the scale. */
vc_case vc_random_case(tu_rng *rng, int32_t max_batch, int32_t max_len_q, int32_t max_len_k);

/* The longest query and key sequences (at least 1): the max_seqlen_q /
 * max_seqlen_k of a descriptor. */
void vc_max_lengths(const vc_case *c, int64_t *max_q, int64_t *max_k);

/* *x (zeroed first): lengths, masks and the BSR (rows s * R +
 * row_start[b] + i), then the tensors (NaN first), drawn from rng. 0 when
 * out of memory (free *x with vc_data_free either way). */
int vc_make(const vc_case *c, tu_rng *rng, vc_data *x);
void vc_data_free(vc_data *x);

/* The case through the varlen entry point of c->call (CPU backend), into
 * x->o and x->lse (NULL when !c->with_lse). */
sk_status vc_call_varlen(const vc_case *c, vc_data *x);

/* Every query row of x->o (and x->lse) against the naive reference, the
 * padding of O untouched, LSE untouched when not asked for; records
 * failures under `label` (at most 3 lines) and counts empty rows and
 * checked elements into *out. Returns the mismatches. */
int64_t vc_compare_reference(const vc_case *c, vc_data *x, const char *label, vc_outcome *out);

/* "[seed S: F16 B=3 ... lens 5x7 0x3]" into label. */
void vc_label(const vc_case *c, uint64_t seed, char *label, size_t size);

/* Query q of sequence b, query head h may see key k of the sequence (the
 * case's block mask and bottom-right causal rule): for the backward tests. */
int vc_allowed(const vc_case *c, const vc_data *x, int32_t b, int64_t h, int64_t q, int64_t k);

#endif /* SK_TESTS_VARLEN_CASE_H */
