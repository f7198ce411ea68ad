/*
 * varlen_bwd_case.h - what the varlen backward tests share (the CPU test
 * and the GPU test): the backward's buffers for a varlen case
 * (varlen_case.h), its descriptors, and the check of gradients against the
 * naive fp64 chain-rule backward (naive_bwd.h) on each sequence's unpacked
 * copy, under the fixed backward test's rule (2 x the naive bound + the
 * output rounding).
 */
#ifndef SK_TESTS_VARLEN_BWD_CASE_H
#define SK_TESTS_VARLEN_BWD_CASE_H

#include <stdint.h>

#include "common/test_util.h"
#include "common/varlen_case.h"
#include "sparsek.h"

/* The backward's buffers, in the forward's memory layout (x->ts_q, ts_k,
 * hs): dO and dQ as Q, dK and dV as K. */
typedef struct vbc_bufs {
    void *dout, *dq, *dk, *dv;
    double *doutd; /* packed [total_q, Hq, D] fp64 copy of dO (0 where NaN) */
} vbc_bufs;

void vbc_bufs_free(vbc_bufs *t);

/* Row (sequence b, query qq, head h) has an admissible key. */
int vbc_row_has_key(const vc_case *c, const vc_data *x, int32_t b, int64_t h, int64_t qq);

/* Allocate and fill: dO random (rounded to the dtype) on rows with a key,
 * NaN elsewhere; the gradients NaN. 0 when out of memory. */
int vbc_bufs_make(const vc_case *c, const vc_data *x, tu_rng *rng, vbc_bufs *t);

/* The case's descriptors (CPU backend; the tests change what they test). */
void vbc_descs(const vc_case *c, const vc_data *x, sk_attention_varlen_desc *desc,
               sk_attention_varlen_backward_desc *bwd);

/* |got - ref| within twice the naive bound plus the output rounding. 1 on
 * a mismatch (or a non-finite got). */
int vbc_mismatch(sk_dtype dt, double got, double ref, double bound);

/* One sequence's unpacked problem for nr_attention_backward (heads = Hq,
 * the KV heads repeated): scratch sized for the longest sequence. */
typedef struct vbc_seq_ref {
    double *q, *k, *v, *dout, *dq, *dk, *dv, *eq, *ek, *ev;
    uint8_t *allow;
} vbc_seq_ref;

/* Sequence b's gradients in t against the naive reference; failures
 * recorded under label (at most 3 lines). mma: the bound of an
 * implementation that rounds P and dS to the dtype as MMA operands (the
 * CUDA kernels; nr_attention_backward_mma), else the CPU backend's.
 * Returns the mismatches. */
int64_t vbc_compare_sequence(const vc_case *c, const vc_data *x, const vbc_bufs *t, int32_t b,
                             vbc_seq_ref *r, int mma, const char *label);

/* Elements of buf outside the rows of `rows` tokens x heads x D (token
 * stride ts, head stride hs) that are not NaN. */
int64_t vbc_padding_written(const void *buf, sk_dtype dt, int64_t span, int64_t rows, int64_t heads,
                            int64_t D, int64_t ts, int64_t hs);

/* Every sequence of t against the naive reference (mma as above) and
 * every padding element still NaN, failures recorded under label. Returns
 * the mismatches (0: passed). */
int64_t vbc_check(const vc_case *c, const vc_data *x, const vbc_bufs *t, int mma,
                  const char *label);

#endif /* SK_TESTS_VARLEN_BWD_CASE_H */
