/*
 * topk_rules.h - the per-row selection rules of the top-k block selection,
 * one definition for the host (src/core/topk.c, the CPU reference) and the
 * device (the CUDA kernels tabulate them with the same function).
 *
 * Row rules (one layout row = query row block `row`, identical for every
 * slice). With q_last the row's last valid query token and
 * p = q_last + Sk - Sq its key position (bottom-right alignment):
 *   candidates  blocks 0 .. n_cand - 1: all col_blocks, or with causal the
 *               blocks holding a causal pair, n_cand = p < 0 ? 0 : p / bk + 1
 *   diagonal    d = clamp(p / bk, 0, col_blocks - 1)
 *   forced      sinks 0 .. min(sink_blocks, n_cand) - 1 and the local
 *               blocks max(0, d - local_blocks + 1) .. d (none when
 *               n_cand == 0 or local_blocks == 0)
 *   by score    the k best remaining candidates: score descending, ties to
 *               the lower block index; NaN and -inf never picked.
 *   bound       forced + min(k, n_cand - forced): the row's count when no
 *               remaining candidate has a NaN or -inf score, and its most.
 * The layout capacity is the sum of the bounds; the real count can be lower
 * only when NaN / -inf scores leave fewer than k pickable candidates.
 */
#ifndef SK_CORE_TOPK_RULES_H
#define SK_CORE_TOPK_RULES_H

#include <stdint.h>

#include "core/problem.h"

/* Compiled by nvcc, the rules are host and device functions. */
#if defined(__CUDACC__)
#define SK_TOPK_HD __host__ __device__
#else
#define SK_TOPK_HD
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* The rules of one row (see the file header). */
typedef struct sk_topk_row {
    int32_t n_cand;              /* candidates: blocks 0 .. n_cand - 1 */
    int32_t sink_end;            /* forced sinks: 0 .. sink_end - 1 */
    int32_t local_lo, local_hi;  /* forced local blocks: local_lo .. local_hi (empty if lo > hi) */
    int32_t forced;              /* number of forced blocks */
    int32_t bound;               /* forced + min(k, n_cand - forced) */
} sk_topk_row;

SK_TOPK_HD static inline sk_topk_row sk_topk_row_rules(const sk_topk_problem *p, int32_t row) {
    sk_topk_row r;
    int64_t q_end = (int64_t)(row + 1) * p->block_q;
    if (q_end > p->seq_q) q_end = p->seq_q;
    const int64_t pos = q_end - 1 + p->seq_k - p->seq_q; /* key position of the last query */
    const int64_t cb = p->col_blocks;
    int64_t d = pos < 0 ? 0 : pos / p->block_k;
    if (d > cb - 1) d = cb - 1;
    int64_t n = cb;
    if (p->causal) n = pos < 0 ? 0 : (pos / p->block_k + 1 < cb ? pos / p->block_k + 1 : cb);
    r.n_cand = (int32_t)n;
    r.sink_end = (int32_t)(p->sink_blocks < n ? p->sink_blocks : n);
    if (n > 0 && p->local_blocks > 0) {
        int64_t lo = d - (int64_t)p->local_blocks + 1;
        r.local_lo = (int32_t)(lo < 0 ? 0 : lo);
        r.local_hi = (int32_t)d; /* d < n: with causal d = n - 1 */
    } else {
        r.local_lo = 0;
        r.local_hi = -1;
    }
    int32_t forced = r.sink_end;
    if (r.local_lo <= r.local_hi) {
        forced += r.local_hi - r.local_lo + 1;
        int32_t ov_hi = r.sink_end - 1 < r.local_hi ? r.sink_end - 1 : r.local_hi;
        if (ov_hi >= r.local_lo) forced -= ov_hi - r.local_lo + 1;
    }
    r.forced = forced;
    const int32_t rest = r.n_cand - forced;
    r.bound = forced + (p->k < rest ? p->k : rest);
    return r;
}

SK_TOPK_HD static inline int sk_topk_is_forced(const sk_topk_row *r, int32_t j) {
    return j < r->sink_end || (j >= r->local_lo && j <= r->local_hi);
}

/* The blocks a row may pick by score: its candidates that are not forced,
 * and none when k == 0. Returns 0 when there are none; else *first and
 * *last are the lowest and highest such block (blocks in between may be
 * forced). The sinks are a prefix and the local blocks one run, so each end
 * steps over at most one of them. */
SK_TOPK_HD static inline int sk_topk_row_pickable(const sk_topk_problem *p, const sk_topk_row *r,
                                                  int32_t *first, int32_t *last) {
    if (p->k <= 0 || r->n_cand - r->forced <= 0) return 0;
    int32_t lo = r->sink_end, hi = r->n_cand - 1;
    if (lo >= r->local_lo && lo <= r->local_hi) lo = r->local_hi + 1;
    if (hi >= r->local_lo && hi <= r->local_hi) hi = r->local_lo - 1;
    *first = lo;
    *last = hi;
    return lo <= hi;
}

/* Which pooled blocks a selection's scores can depend on (the same for
 * every slice): query row blocks [rows[0], rows[1]) hold every row with a
 * block to pick by score, and key blocks [cols[0], cols[1]) every block some
 * row may pick. Outside them no score is ever read, so sk_pool_select_topk
 * does not pool those blocks (it writes zeros; docs/perf/topk_log.md step 21).
 * Both ranges are empty ([0, 0)) when no row picks by score. One rule per
 * row: src/core/topk.c keeps the result per shape with the row bounds. */
static inline void sk_topk_score_span(const sk_topk_problem *p, int32_t rows[2], int32_t cols[2]) {
    rows[0] = rows[1] = cols[0] = cols[1] = 0;
    int any = 0;
    for (int32_t i = 0; i < p->row_blocks; ++i) {
        const sk_topk_row r = sk_topk_row_rules(p, i);
        int32_t first, last;
        if (!sk_topk_row_pickable(p, &r, &first, &last)) continue;
        if (!any) {
            rows[0] = i;
            cols[0] = first;
            cols[1] = last + 1;
            any = 1;
        }
        rows[1] = i + 1;
        if (first < cols[0]) cols[0] = first;
        if (last + 1 > cols[1]) cols[1] = last + 1;
    }
}

#ifdef __cplusplus
}
#endif

#endif /* SK_CORE_TOPK_RULES_H */
