/*
 * cp_gpu.h - what the GPU context-parallel tests share (test_cp_gpu.c, the
 * forward; test_cp_bwd_gpu.c, the backward): a case's name, descriptor and
 * shapes, and the NaN poison of the K / V units no layout slice selects.
 */
#ifndef SK_TESTS_GPU_CP_GPU_H
#define SK_TESTS_GPU_CP_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "common/cp_case.h"
#include "cuda_api.h"
#include "sparsek.h"

/* "<prefix>R.. zigzag random causal bf16 B.. S.. H../.. D.. blk.. slices
 * ..x.. seed .." */
void cpg_name(char *name, size_t n, const cp_case *c, const char *prefix);
/* The sweep's case number `idx` for the loop variables: F16 / BF16, B 1 or
 * 2, Hq 2 or 4 over Hkv 2, D 64 or 128, blocks 64 or 128, 2R + 3 blocks
 * (+ a 37-token tail), broadcast / per-batch, per-KV-head / per-query-head
 * slices, the given seed. */
void cpg_sweep_case(int idx, int32_t ranks, int zigzag, int causal, int kind, uint64_t seed,
                    cp_case *c);
/* The context-parallel descriptor of case c on the suite's backend, and
 * the single-GPU attention descriptor of its global problem. */
void cpg_desc(const cp_case *c, sk_cp_desc *d);
void cpg_attention_desc(const cp_case *c, sk_attention_desc *a);
/* The plan of d over layout L (malloc'ed into *plan) and d->ranks
 * simulated device communicators; 0 on success. */
int cpg_plan(const sk_cp_desc *d, const sk_bsr *L, void **plan, size_t *plan_bytes,
             sk_comm_t *comms);
/* Case c's global layout (owned; NULL when the builder fails) and its
 * view in *L. */
sk_layout_t cpg_layout(const cp_case *c, sk_bsr *L);
/* Whether layout slice s holds the rows of (batch b, query head hq). */
int cpg_slice_covers(const cp_case *c, const sk_bsr *L, int64_t s, int64_t b, int64_t hq);
/* used[(b * Hkv + h) * nb + j] = 1 where some row of a slice covering (b,
 * KV head h) selects key block j (used: B x Hkv x nb bytes, zeroed). */
void cpg_used_units(const cp_case *c, const sk_bsr *L, uint8_t *used);
/* NaN into the K and V rows of every unit `used` does not mark. */
void cpg_poison_unused(const cp_case *c, const uint8_t *used, void *k, void *v);

/* What every rank of a run has, whichever call it makes (the tests' rank
 * records start with it). */
typedef struct cpg_rank {
    sk_cp_desc desc;
    const void *plan;
    size_t plan_bytes;
    sk_comm_t comm;
    void *ws;
    size_t ws_bytes;
    cudaStream_t stream;
    int64_t tokens;
    int32_t chunks;
    int64_t starts[2], lengths[2];
    sk_status status;
    char error[512];
} cpg_rank;

/* Rank r of case c (descriptor d): its shard, the workspace of the
 * forward (backward = 0) or the backward on the device, a non-blocking
 * stream. 0 on success, else a check failed naming `name`. */
int cpg_rank_init(cpg_rank *x, const cp_case *c, const sk_cp_desc *d, int32_t r, const void *plan,
                  size_t plan_bytes, sk_comm_t comm, int backward, const char *name);
void cpg_rank_free(cpg_rank *x);
/* NaN bytes into the workspace on the rank's stream (a non-blocking
 * stream does not wait for the legacy default one), then sk_cp_prepare or
 * sk_cp_backward_prepare; `bad`: the caller's uploads failed. 0 on
 * success. */
int cpg_rank_prepare(cpg_rank *x, int bad, int backward, int32_t r, const char *name);
/* On the rank's thread, after its call returned st: wait for its stream,
 * keep the message. */
void cpg_rank_done(cpg_rank *x, sk_status st);
/* fn(item) on a thread per rank (items `stride` bytes apart, each starting
 * with its cpg_rank), joined; each status checked. 0 when all succeeded. */
int cpg_run_threads(int32_t ranks, void *(*fn)(void *), void *items, size_t stride,
                    const char *name);

#endif /* SK_TESTS_GPU_CP_GPU_H */
