/*
 * cp_plan.h - the context-parallel plan blob (sk_cp_plan) as the host code
 * reads it, and the sharding arithmetic shared by the plan and the run.
 *
 * The blob is one caller buffer: a header, then R x R pair records (what
 * rank src sends rank dst: a run of units), R rank records (chunks, local
 * layouts, remote buffer), the units, and the int32 arrays of the local
 * layouts. Offsets are in bytes from the blob's start, every section
 * 8-byte aligned, so the blob can be copied or moved as bytes (and, next
 * step, uploaded to a device as it is). The header repeats the geometry it
 * was made for, which the run checks against its descriptor.
 */
#ifndef SK_CORE_CP_PLAN_H
#define SK_CORE_CP_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "sparsek.h"

#define SK_CP_PLAN_MAGIC 0x504b4353u /* "SCKP" little endian */
#define SK_CP_PLAN_VERSION 1u

/* K and V rows of one (batch, KV head, key block) that dst needs from src:
 * the exchange's unit. slot is the block's place in dst's remote buffer. */
typedef struct sk_cp_unit {
    int32_t block; /* global key block j */
    int32_t batch; /* b */
    int32_t head;  /* KV head */
    int32_t slot;  /* dst's remote block index (remote keys slot * block ..) */
} sk_cp_unit;

/* Units of one ordered pair, index src * R + dst. */
typedef struct sk_cp_pair {
    int64_t unit_start; /* first unit (an index into the units section) */
    int64_t units;
    int64_t bytes; /* 2 x tokens x D x element size, summed over the units */
} sk_cp_pair;

/* One chunk of a rank: its query rows and the two local layouts over them.
 * Layout arrays are int32 element offsets into the ints section. */
typedef struct sk_cp_chunk_plan {
    int64_t q_start;       /* first local token of the chunk */
    int64_t tokens;        /* its tokens (S_c) */
    int64_t local_keys;    /* Sk of the local pass: a prefix of the shard */
    int32_t global_block;  /* its first global block */
    int32_t blocks;        /* its blocks (row blocks of both layouts) */
    int32_t local_nnz;     /* local layout: own key blocks, local indices */
    int32_t remote_nnz;    /* remote layout: received blocks, slot indices */
    int64_t local_offsets; /* [slices * blocks + 1] */
    int64_t local_indices; /* [local_nnz] */
    int64_t remote_offsets;
    int64_t remote_indices;
} sk_cp_chunk_plan;

typedef struct sk_cp_rank_plan {
    int64_t tokens;      /* S_r */
    int32_t chunks;      /* 1 or 2 */
    int32_t slots;       /* remote blocks in its receive buffer */
    int64_t remote_keys; /* tokens of those slots: Sk of the remote pass */
    int64_t send_bytes;  /* over every dst */
    int64_t recv_bytes;  /* over every src */
    sk_cp_chunk_plan chunk[2];
} sk_cp_rank_plan;

typedef struct sk_cp_plan_header {
    uint32_t magic;
    uint32_t version;
    int64_t total_bytes; /* the plan's size (sk_cp_plan_size) */
    /* The geometry it was made for. */
    int32_t ranks, sharding, block, causal;
    int32_t layout_batch, layout_heads, elem_bytes, pad_;
    int64_t batch, seq, heads_q, heads_kv, head_dim;
    /* Sections, byte offsets. */
    int64_t pairs, rank_plans, units, ints;
    int64_t unit_count, int_count;
} sk_cp_plan_header;

/* Sharding arithmetic (no checks): C chunks of nb blocks. */
static inline int32_t sk_cp_chunk_count(int32_t ranks, sk_cp_sharding sharding) {
    return sharding == SK_CP_SHARDING_ZIGZAG ? 2 * ranks : ranks;
}
/* First global block of chunk c (c = C gives nb). */
static inline int64_t sk_cp_chunk_start(int64_t nb, int32_t chunks, int32_t c) {
    return (int64_t)c * nb / chunks;
}
/* The rank holding chunk c. */
static inline int32_t sk_cp_chunk_rank(int32_t ranks, sk_cp_sharding sharding, int32_t c) {
    return sharding == SK_CP_SHARDING_ZIGZAG && c >= ranks ? 2 * ranks - 1 - c : c;
}
/* The chunks of rank r in local order (returns 1 or 2). */
static inline int32_t sk_cp_rank_chunks(int32_t ranks, sk_cp_sharding sharding, int32_t r,
                                        int32_t out[2]) {
    out[0] = r;
    if (sharding != SK_CP_SHARDING_ZIGZAG) return 1;
    out[1] = 2 * ranks - 1 - r;
    return 2;
}

/* The header of a plan blob after its checks: magic, version, size at
 * least header and total_bytes <= plan_bytes (BAD_PARAM_VALUE naming
 * "plan" otherwise: not a plan, or a truncated one). */
sk_status sk_cp_plan_open(const void *plan, size_t plan_bytes, const sk_cp_plan_header **out);

static inline const sk_cp_pair *sk_cp_plan_pairs(const sk_cp_plan_header *h) {
    return (const sk_cp_pair *)(const void *)((const char *)h + h->pairs);
}
static inline const sk_cp_rank_plan *sk_cp_plan_ranks(const sk_cp_plan_header *h) {
    return (const sk_cp_rank_plan *)(const void *)((const char *)h + h->rank_plans);
}
static inline const sk_cp_unit *sk_cp_plan_units(const sk_cp_plan_header *h) {
    return (const sk_cp_unit *)(const void *)((const char *)h + h->units);
}
static inline const int32_t *sk_cp_plan_ints(const sk_cp_plan_header *h) {
    return (const int32_t *)(const void *)((const char *)h + h->ints);
}

#endif /* SK_CORE_CP_PLAN_H */
