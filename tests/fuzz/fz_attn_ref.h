/*
 * fz_attn_ref.h - an attention result against the dense fp64 reference
 * (tests/common/naive_ref.c's nr_attention_row), masked token by token as
 * sparsek.h's semantics say: the key blocks the layout row selects for the
 * head's slice, keys below Sk (tails), and with causal k <= q + Sk - Sq. A
 * row with no admissible key must give O = 0 and LSE = -inf exactly.
 *
 * Tolerance rule (docs/DEVELOPING.md): |got - ref| <= 2 E + 2^-24 with E
 * the error of a naive implementation of the same precision (fp32 scores
 * and sums from inputs in the dtype, O rounded once to it):
 *   E(O)   = u_dtype |ref| + u_32 sqrt(D) smag vmax + u_32 sqrt(n) vmax
 *   E(LSE) = u_32 (|ref| + sqrt(D) smag + sqrt(n))
 * smag = |scale| |q|_2 max |k|_2 over the row's admissible keys, vmax = the
 * largest |v| among them, n = their count.
 */
#ifndef SK_FUZZ_ATTN_REF_H
#define SK_FUZZ_ATTN_REF_H

#include "fz_tensor.h"
#include "sparsek.h"

typedef struct fz_attn {
    int64_t batch, seq_q, seq_k, heads_q, heads_kv, head_dim;
    double scale; /* as resolved: 0 in the descriptor means (float)(1 / sqrt(D)) */
    int causal;
    fz_tensor q, k, v, o;
} fz_attn;

/* The attention's scale rule (issue 27 defect 8, as the fix documents it
 * in sparsek.h, "Scale"): a scale that is not finite, or whose
 * |s| * log2(e) is not below FLT_MAX in fp32, is refused. 1: must be
 * refused; 0: must be accepted; -1: within rounding of the edge, either. */
int fz_scale_refused(float scale);

/* The problem of a descriptor whose fields are valid. */
void fz_attn_from_desc(fz_attn *a, const sk_attention_desc *d);

/* Work of the reference, for the harnesses' time caps: B Hq Sq Sk D. */
double fz_attn_work(const fz_attn *a);

/* Every O element and LSE entry (lse NULL: O only) against the reference
 * under `layout` (valid, geometry matching); a difference is a finding of
 * `api`. Returns 0 without comparing when the scores could leave the fp32
 * range (|scale| |q| |k| above 2^100), where the result is not specified. */
int fz_check_attention(const fz_attn *a, const sk_bsr *layout, const void *q, const void *k,
                       const void *v, const void *o, const float *lse, const char *api);

#endif /* SK_FUZZ_ATTN_REF_H */
