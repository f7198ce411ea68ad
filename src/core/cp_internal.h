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

#endif /* SK_CORE_CP_INTERNAL_H */
