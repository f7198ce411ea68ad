/*
 * fz_bwd_ref.h - an attention backward result (dQ, dK, dV) against the
 * dense fp64 backward of tests/common/naive_bwd.c, masked as fz_attn_ref.h
 * masks the forward (the layout's blocks for each head's slice, tails,
 * bottom-right causality). GQA: the KV heads are repeated for the naive
 * backward, which then sums each group's dK and dV here.
 *
 * Tolerance rule (docs/DEVELOPING.md): |got - ref| <= 2 (u_dtype |ref| + E)
 * + 2^-24 with E the naive_bwd.h bound of a same-precision implementation
 * (summed over a group's heads for dK and dV).
 */
#ifndef SK_FUZZ_BWD_REF_H
#define SK_FUZZ_BWD_REF_H

#include "fz_attn_ref.h"
#include "fz_tensor.h"
#include "sparsek.h"

typedef struct fz_bwd {
    fz_attn a;                  /* the forward's problem */
    fz_tensor dout, dq, dk, dv; /* the backward descriptor's tensors */
} fz_bwd;

/* The problem of valid descriptors. */
void fz_bwd_from_desc(fz_bwd *p, const sk_attention_desc *d, const sk_attention_backward_desc *bwd);

/* Every element of dq, dk, dv against the reference under `layout`
 * (valid, geometry matching); a difference is a finding of `api`. Returns
 * 0 without comparing when the scores could leave the fp32 range (|scale|
 * |q| |k| above 2^100) or a reference gradient is near the dtype's
 * largest finite value, where the result is not specified. */
int fz_check_backward(const fz_bwd *p, const sk_bsr *layout, const void *q, const void *k,
                      const void *v, const void *dout, const void *dq, const void *dk,
                      const void *dv, const char *api);

#endif /* SK_FUZZ_BWD_REF_H */
