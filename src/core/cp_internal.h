/*
 * cp_internal.h - what the context-parallel files share: descriptor and
 * block checks (cp_plan.c) for the run (cp_run.c), and the plan blob
 * (cp_plan.h).
 */
#ifndef SK_CORE_CP_INTERNAL_H
#define SK_CORE_CP_INTERNAL_H

#include "core/cp_plan.h"

/* The most ranks a descriptor may name (C = 2R chunks and R x R pair
 * records stay small). */
#define SK_CP_MAX_RANKS 65536

/* Every field of a context-parallel descriptor (messages "desc->..."). */
sk_status sk_cp_check_desc(const sk_cp_desc *d);
/* block 64 or 128, and S's blocks nb (into *blocks): at least one per
 * chunk, and fitting int32. */
sk_status sk_cp_check_block(const sk_cp_desc *d, int32_t block, int64_t *blocks);

/* Rank r's chunks (count, global token starts and lengths) for d's
 * ranks, sharding and S in blocks of `block` (nb of them); returns S_r. */
int64_t sk_cp_shard_of(const sk_cp_desc *d, int32_t block, int64_t nb, int32_t r,
                       int32_t *count, int64_t starts[2], int64_t lengths[2]);

/* An opened plan made for d's geometry, whole: every rank's shard against
 * the descriptor's sharding, its chunks' layout arrays inside the blob and
 * valid, every pair's units (a block of the sender; batch, head, slot in
 * range; bytes adding up). Every rank checks all of it, so ranks sharing a
 * plan agree on refusing it (none enters the exchange) or on using it.
 * BAD_PARAM_VALUE "plan is corrupt" otherwise. */
sk_status sk_cp_plan_check(const sk_cp_plan_header *h, const sk_cp_desc *d);

/* The local (remote == 0) or remote layout of chunk cp as a view into the
 * plan: rows = its tokens, cols = keys (local_keys or remote_keys). */
void sk_cp_chunk_layout(const sk_cp_plan_header *h, const sk_cp_chunk_plan *cp, int64_t keys,
                        int remote, sk_bsr *out);

#endif /* SK_CORE_CP_INTERNAL_H */
