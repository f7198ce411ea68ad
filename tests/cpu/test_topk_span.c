/*
 * test_topk_span.c - sk_topk_score_span, the library-internal rule that
 * tells the CUDA sk_pool_select_topk which pooled blocks it may leave
 * unread: nothing of it reaches a CPU output, so it is tested here directly,
 * the one top-k test that includes a header of src/: the span as the core
 * computes it for a descriptor (sk_topk_build_problem, which keeps it per
 * shape), against the brute force over token positions of
 * tests/common/topk_naive.h.
 */
#include <string.h>

#include "common/harness.h"
#include "common/test_util.h"
#include "common/topk_naive.h"
#include "core/topk_internal.h"
#include "sparsek.h"

/* The core's span against brute force over token positions
 * (tk_score_span_naive): the rows with a block to pick by score, and the
 * hull of those blocks, exactly. */
SK_TEST(topk_score_span_is_the_hull_of_the_pickable_blocks) {
    tu_rng rng;
    tu_rng_seed(&rng, tu_base_seed() ^ 0x510);
    int nonempty = 0, narrower = 0;
    for (int c = 0; c < 60; ++c) {
        tk_problem t;
        tk_problem_init(&t, SK_BACKEND_CPU, SK_DTYPE_BF16, 1, tu_rng_range(&rng, 1, 2000),
                        tu_rng_range(&rng, 1, 2000), 4, 2, 64, (c & 1) ? 64 : 128,
                        (c & 2) ? 64 : 128);
        t.desc.k = (int32_t)tu_rng_range(&rng, 0, 6);
        t.desc.sink_blocks = (int32_t)tu_rng_range(&rng, 0, 4);
        t.desc.local_blocks = (int32_t)tu_rng_range(&rng, 0, 12);
        t.desc.mask = (c & 4) ? SK_MASK_CAUSAL : SK_MASK_NONE;
        sk_topk_problem p;
        REQUIRE(sk_topk_build_problem(&t.desc, &p) == SK_STATUS_SUCCESS, "%s", sk_last_error());
        const int32_t *rows = p.score_rows, *cols = p.score_cols;
        const int32_t cb = tk_col_blocks(&t);
        int32_t er[2], ec[2];
        REQUIRE(tk_score_span_naive(&t, er, ec), "no memory");
        const int any = er[1] > er[0];
        char name[160];
        tk_describe(&t, name, sizeof name);
        CHECK(rows[0] == er[0] && rows[1] == er[1] && cols[0] == ec[0] && cols[1] == ec[1],
              "%s: span rows [%d, %d) cols [%d, %d), brute force [%d, %d) [%d, %d)", name,
              (int)rows[0], (int)rows[1], (int)cols[0], (int)cols[1], (int)er[0], (int)er[1],
              (int)ec[0], (int)ec[1]);
        nonempty += any;
        narrower += any && (er[0] > 0 || ec[0] > 0 || ec[1] < cb);
        tk_problem_free(&t);
    }
    /* the draws must reach both kinds of case, or the check above is idle */
    CHECK(nonempty >= 20 && narrower >= 10, "%d non-empty spans, %d narrower than the grid",
          nonempty, narrower);
}
