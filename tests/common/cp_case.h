/*
 * cp_case.h - what the context-parallel tests share (tests/cpu/test_cp.c,
 * the simulated CPU run; tests/gpu/test_cp_gpu.c, the CUDA run): the
 * layouts they shard, the copy of token rows between global tensors and a
 * rank's shard, and the slice a query head reads.
 */
#ifndef SK_TESTS_CP_CASE_H
#define SK_TESTS_CP_CASE_H

#include <stddef.h>
#include <stdint.h>

#include "sparsek.h"

/* One sharded problem: R ranks, the sharding, the mask, the layout kind
 * (below; test_cp.c adds top-k), the shapes, blocks, layout slices, seed. */
typedef struct cp_case {
    int32_t ranks;
    sk_cp_sharding sharding;
    int causal, kind;
    sk_dtype dtype;
    int64_t batch, seq, heads_q, heads_kv, head_dim;
    int32_t block, layout_batch, layout_heads;
    uint64_t seed;
    int starts; /* chunk boundaries: CPC_STARTS_* (0: equal) */
} cp_case;

/* The layout kinds both tests draw (test_cp.c adds top-k of its own). */
enum { CPC_WINDOW, CPC_SINKS_WINDOW, CPC_RANDOM, CPC_KINDS };
extern const char *const cpc_kind_names[CPC_KINDS];

/* A layout of kind over grid g (window: left 150 causal, else 100 left and
 * 130 right; sinks 40 + window 200; random: 3 blocks a row over every
 * block, so with causal some lie above the diagonal and some rows are
 * empty). NULL when the builder fails (sk_last_error says why). */
sk_layout_t cpc_layout(int kind, int causal, const sk_grid *g, uint64_t seed);

/* A top-k layout over grid g: 2 blocks a row by seeded normal scores,
 * plus 1 sink and the diagonal (causal as given). NULL when it fails. */
sk_layout_t cpc_layout_topk(int causal, const sk_grid *g, uint64_t seed);

/* Case idx of the tests' sweep over ranks x sharding x causal x kind:
 * dtype F16 / BF16 / F32 in turn, B 2, Hq 4, Hkv 2, D 16, blocks of 64
 * (128 every 7th), 2R + 2 .. 2R + 4 blocks (a tail most of the time),
 * layouts broadcast, per batch, per KV head or per query head; seed. */
void cpc_sweep_case(int idx, int32_t ranks, int zigzag, int causal, int kind, uint64_t seed,
                    cp_case *c);
/* The sweep: run(idx, case) for every R in {1, 2, 3, 4, 8}, contiguous
 * and zigzag, non-causal and causal, kind 0 .. kinds - 1, case idx from
 * cpc_sweep_case with seed base + idx; stops after a failing case. */
void cpc_sweep(uint64_t base, int kinds, void (*run)(int idx, cp_case *c));
/* "R=.. zigzag causal window bf16 S=.. block .. H ../.. slices ..x.. seed
 * .." then extra; kind_name names kind (the caller's kinds include top-k). */
void cpc_case_name(char *name, size_t n, const cp_case *c, const char *kind_name,
                   const char *extra);

/* Token rows [t0, t0 + n) of a global [B, S, H, D] tensor (row_elems = H
 * x D elements of esize bytes) to rows [l0, l0 + n) of a shard [B, Sr, H,
 * D], or back when to_global. */
void cpc_rows(void *dst, const void *src, int64_t esize, int64_t B, int64_t S, int64_t Sr,
              int64_t row_elems, int64_t t0, int64_t l0, int64_t n, int to_global);

/* The layout slice head that query head hq reads (slices per batch:
 * layout heads 1, heads_kv or heads_q). */
int64_t cpc_slice_head(const sk_bsr *L, int64_t heads_q, int64_t heads_kv, int64_t hq);

/* Chunk boundaries of a case (desc->chunk_starts): equal (NULL), from
 * sk_cp_balance (with a remote block 4x a local one and no tile cost, so
 * that small problems move too), or skewed by hand (chunks of one block
 * then a long last one, or a long first one, by the seed). */
enum { CPC_STARTS_EQUAL, CPC_STARTS_BALANCED, CPC_STARTS_SKEWED };
/* Fill starts [C + 1] for c over the global layout L with d's geometry;
 * returns starts for desc->chunk_starts, NULL for equal chunks (or on a
 * failure, with *ok = 0 and sk_last_error saying why). */
const int32_t *cpc_chunk_starts(const cp_case *c, const sk_cp_desc *d, const sk_bsr *L,
                                int32_t *starts, int *ok);
/* The sweep restricted to R = 2, 3, 4, each case with balanced or skewed
 * boundaries in turn (CPC_STARTS_BALANCED when idx is even). */
void cpc_sweep_starts(uint64_t base, int kinds, void (*run)(int idx, cp_case *c));

#endif /* SK_TESTS_CP_CASE_H */
