/*
 * gpu_bwd.h - the GPU test suite's attention-backward machinery: one case
 * (inputs, the CPU references, the GPU runs, the comparison) on top of the
 * forward's (gpu_util.h).
 *
 * A case is run as follows:
 *   1. The forward's case machinery draws Q, K, V, the block mask and the
 *      layout (gt_inst_create: stride padding and every key block that no
 *      row reading it selects are NaN). dO gets random values, dQ, dK, dV
 *      their own stride modes; everything outside the logical tensors NaN.
 *   2. The CPU backend's forward gives O and LSE (the backward's inputs,
 *      "as the forward wrote them").
 *   3. Every input no gradient may read becomes NaN: the Q, dO, O and LSE
 *      rows of empty rows (no admissible key: empty layout rows, causally
 *      empty rows), the K and V rows of keys that no admissible pair of
 *      their KV head reaches (sparsek.h, "Attention backward").
 *   4. References: the CPU backend's backward on the same host buffers, and
 *      the naive fp64 backward (tests/common/naive_bwd.h) with its error
 *      bound for an implementation that rounds P and dS to the dtype as MMA
 *      operands, as the kernels do.
 *   5. On the GPU, twice: dQ, dK, dV filled with NaN, the workspace with a
 *      different byte each time; plan + run (or the one-shot call); the two
 *      runs must agree bitwise, the padding of the outputs stay NaN.
 *   6. Every element within 2 (u_dtype |ref| + E) + 2^-24 of the reference
 *      (E: the naive bound, summed over the query heads of a KV head),
 *      and finite.
 * With gb_case.nondet (bwd->deterministic = 0) step 5 differs: see there.
 */
#ifndef SK_TESTS_GPU_BWD_H
#define SK_TESTS_GPU_BWD_H

#include <stddef.h>
#include <stdint.h>

#include "gpu/gpu_util.h"
#include "sparsek.h"

/* One backward case. Zero-initialise, then set. */
typedef struct gb_case {
    gt_case f;          /* shapes, layout draw, Q/K/V/O stride modes, scale, seed */
    int grad_stride[4]; /* dout, dq, dk, dv: stride modes as gt_case.stride_mode */
    int plan_run;       /* plan + run instead of the one-shot sk_attention_backward */
    int keep_unread;    /* leave the inputs no gradient reads finite (step 3 off), for a
                           GPU forward, which does read the K, V of keys no pair reaches */
    int nondet;         /* bwd->deterministic = 0 (a fused pass): step 5's two
                           runs must agree bitwise in dK and dV only (dQ: each within the
                           tolerance), and a third run with deterministic = 1 must give
                           the same dK and dV bits */
} gb_case;

/* A materialised case. */
typedef struct gb_inst {
    gt_inst x; /* Q, K, V (host, device: x.dq, x.dk, x.dv), layout; O in x.o_ref (host), x.dout
                  (device); LSE in x.lse_ref (host), x.dlse (device) */
    gb_case c;
    gt_tensor dout, dq, dk, dv; /* hosts: dO's values; the NaN fill of dq, dk, dv */
    void *dq_ref, *dk_ref, *dv_ref;     /* the CPU backend's gradients */
    double *ref[3], *bound[3];          /* naive dQ, dK, dV per query head, and bounds */
    int64_t empty_rows, idle_keys;      /* (b, h, q) rows and (b, hk, k) keys that count nothing */
    void *d_dout, *d_dq, *d_dk, *d_dv, *d_ws;
    size_t ws_bytes;
} gb_inst;

/* Build a case; 0 on success (else a message was printed). */
int gb_inst_create(gb_inst *b, const gb_case *c);
void gb_inst_destroy(gb_inst *b);
void gb_inst_desc(const gb_inst *b, sk_backend backend, sk_attention_desc *d,
                  sk_attention_backward_desc *bd);
/* Device dQ, dK, dV back to the NaN fill; the workspace to byte `fill`. */
int gb_inst_poison(gb_inst *b, int fill);
/* The backward on the device buffers (plan + run, or the one-shot call). */
sk_status gb_inst_backward(gb_inst *b, sk_backend backend, struct CUstream_st *stream);
/* dQ, dK, dV to the host, each at its tensor's size. */
int gb_inst_fetch(const gb_inst *b, void *dq, void *dk, void *dv);
/* Whether device dQ, dK, dV still hold the NaN fill, bit for bit. */
int gb_inst_untouched(const gb_inst *b);
/* Errors of GPU gradients against the reference (printed, at most a few). */
int gb_inst_compare(const gb_inst *b, const void *dq, const void *dk, const void *dv,
                    const char *what);

/* The whole protocol for one case; 0 when it passed. counts (may be NULL)
 * receives the empty rows and idle keys, for tests that must not be
 * vacuous. */
int gb_run_case(const gb_case *c, int64_t counts[2]);
/* Backward cases run and failed so far; declined by the forced backend
 * (SK_STATUS_NOT_SUPPORTED checked, nothing written). */
extern int gb_cases_run, gb_cases_failed, gb_cases_declined;
/* Runs whose dK/dV pass was the Hopper kernel (bwd_sm90_dkv.cu); of those,
 * runs of its fused form (deterministic = 0). */
extern int64_t gb_hopper_dkv_runs, gb_hopper_fused_runs;
/* Runs of the portable fused pass (deterministic = 0 off the Hopper
 * kernels: bwd_sm80_fused.cuh). */
extern int64_t gb_portable_fused_runs;

void gb_case_describe(const gb_case *c, char *buf, size_t len);

/* A hand-picked case: batch 1, Hq 2 over one KV head, a slice per query
 * head, dense layout, packed strides, a seed from the shape (the tests
 * then change what they need). */
gb_case gb_case_base(sk_dtype dtype, int64_t d, int64_t sq, int64_t sk, int32_t bq, int32_t bk,
                     int causal);

#endif /* SK_TESTS_GPU_BWD_H */
