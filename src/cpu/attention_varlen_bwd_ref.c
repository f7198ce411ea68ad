/*
 * attention_varlen_bwd_ref.c - the CPU reference of the varlen attention
 * backward: each packed sequence becomes a fixed-batch backward problem of
 * its own (batch 1, Sq = len_q(b), Sk = len_k(b)), whose forward part is
 * the varlen forward's (sk_cpu_varlen_sequence: Q, O and LSE from token /
 * column cu_seqlens_q[b] on, K and V from cu_seqlens_k[b] on, the layout
 * from row row_start(b) on), and attention_bwd_ref.c runs them one after
 * the other with one scratch allocation, so the gradient code is the fixed
 * batch's, unchanged, and deterministic.
 *
 * Sequence b's dO and dQ start at token cu_seqlens_q[b], its dK and dV at
 * cu_seqlens_k[b] (strides unchanged). A sequence with no query has no dQ
 * unit, and its keys get dK = dV = 0 (no row selects them); one with no
 * key has every row empty (the core's layout check let no index through),
 * so dQ = 0. Every sequence's rows and keys are disjoint, so every element
 * of dQ, dK and dV is written exactly once.
 */
#include <stdlib.h>

#include "core/internal.h"
#include "cpu/cpu_backend.h"
#include "cpu/half.h"

sk_status sk_cpu_attention_varlen_backward_run(const sk_attention_varlen_backward_problem *p) {
    const sk_attention_varlen_problem *v = &p->v;
    const sk_attention_problem *f = &v->flat;
    const int32_t count = v->batch;
    sk_attention_backward_problem *probs = (sk_attention_backward_problem *)malloc(
        (size_t)count * sizeof(sk_attention_backward_problem));
    if (probs == NULL)
        return sk_error(SK_STATUS_ALLOC_FAILED,
                        "the CPU backend could not allocate the backward problems of %d sequences",
                        (int)count);
    int64_t row = 0;
    for (int32_t b = 0; b < count; ++b) {
        sk_attention_backward_problem *s = &probs[b];
        sk_cpu_varlen_sequence(&s->fwd, v, b, row);
        row += s->fwd.row_blocks;
        s->deterministic = p->deterministic;
        for (int x = 0; x < 3; ++x) {
            s->dout_stride[x] = p->dout_stride[x];
            s->dq_stride[x] = p->dq_stride[x];
            s->dk_stride[x] = p->dk_stride[x];
            s->dv_stride[x] = p->dv_stride[x];
        }
        /* Pointers move only to tokens that exist (an empty sequence at
         * the end would point past the tensor); unmoved ones are never
         * read or written, the sequence having no such token. */
        s->dout = p->dout;
        s->dq = p->dq;
        s->dk = p->dk;
        s->dv = p->dv;
        const int64_t q0 = v->cu_seqlens_q[b], k0 = v->cu_seqlens_k[b];
        if (s->fwd.seq_q > 0) {
            s->dout = sk_cpu_elem(p->dout, f->dtype, q0 * p->dout_stride[1]);
            s->dq = sk_cpu_elem_mut(p->dq, f->dtype, q0 * p->dq_stride[1]);
        }
        if (s->fwd.seq_k > 0) {
            s->dk = sk_cpu_elem_mut(p->dk, f->dtype, k0 * p->dk_stride[1]);
            s->dv = sk_cpu_elem_mut(p->dv, f->dtype, k0 * p->dv_stride[1]);
        }
    }
    const sk_status st = sk_cpu_attention_backward_run_problems(probs, count);
    free(probs);
    return st;
}
