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
/* The context-parallel descriptor of case c on the suite's backend. */
void cpg_desc(const cp_case *c, sk_cp_desc *d);
/* Whether layout slice s holds the rows of (batch b, query head hq). */
int cpg_slice_covers(const cp_case *c, const sk_bsr *L, int64_t s, int64_t b, int64_t hq);
/* used[(b * Hkv + h) * nb + j] = 1 where some row of a slice covering (b,
 * KV head h) selects key block j (used: B x Hkv x nb bytes, zeroed). */
void cpg_used_units(const cp_case *c, const sk_bsr *L, uint8_t *used);
/* NaN into the K and V rows of every unit `used` does not mark. */
void cpg_poison_unused(const cp_case *c, const uint8_t *used, void *k, void *v);

#endif /* SK_TESTS_GPU_CP_GPU_H */
