/*
 * cp_balance.c - context parallel: chunk boundaries balanced by a cost
 * model (sk_cp_cost_default, sk_cp_predict, sk_cp_balance).
 *
 * The model (include/sparsek.h): a rank's time is its rows' local blocks
 * x local_block + remote blocks x remote_block + tiles x tile, a block
 * being one query block against one key block for one (batch, query head)
 * and a tile one (query block, batch, query head) row of a pass with at
 * least one block. A row's cost depends on who owns its key blocks, so
 * moving one boundary changes other chunks' costs whenever remote_block
 * != local_block. The balance, in two steps over one state (per row its
 * local blocks, per chunk its integer counts, kept exact as blocks move):
 *   - the cuts: every row block's cost w[i] under the current owners,
 *     then the starts that cut the prefix sums of w nearest to c W / C,
 *     each chunk at least one block; repeat until the starts stop moving
 *     (at most kRounds). With remote == local this settles in 2-4 rounds;
 *     with remote > local it can settle off balance or cycle, because the
 *     cut does not see that its own move changes the owners.
 *   - the walk, from the best cut: each boundary k in turn moves one
 *     block at a time while the cost of chunks 0 .. k - 1 gets closer to
 *     k / C of the total, every step re-evaluated exactly (the moved
 *     block's readers found by the layout's transpose); sweeps alternate
 *     in direction until none moves (at most kSweeps).
 * Every state is scored by its slowest rank, then its spread; the best is
 * returned (ties: the earlier), so the answer is never predicted slower
 * than equal chunks. Deterministic: integer counts, fixed order.
 *
 * Why per chunk, also for zigzag: rank r's time is chunk r's cost plus
 * chunk 2R - 1 - r's, so equal chunk costs give equal rank times for any
 * pairing, with one rule for both shardings and no free parameter (moving
 * only some boundaries leaves R - 1 degrees of freedom the model does not
 * fix). It also keeps a rank's two local passes alike, and the first one
 * is what hides the exchange. Why the walk targets prefix sums and not
 * its two neighbours' difference: a chunk can only be balanced to within
 * one block's step, and pairwise equalisation lets those steps add up
 * along the chunks (a staircase of costs, each pair within a step).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/cp_internal.h"
#include "core/internal.h"

/* Rounds of the cut at most (it settles in 2-4 when remote == local; a
 * cycle ends here). */
enum { kRounds = 16 };

/* Sweeps of the walk at most (each moves every boundary while that helps;
 * it settles in 1-3 on the layouts tried). */
enum { kSweeps = 64 };

/* The defaults (docs/perf/context_parallel.md section 10): the local
 * block and tile fitted to the 1M zigzag run of section 9 on 2 x H200 (B1
 * H32/8 D128 bf16, blocks of 128); the remote block from the first 2 x
 * H100 run, where 20.1 ns predicted both ranks within 1.3 % and gave the
 * fastest run (1M zigzag, 106.66 ms against 107.78 with 13.25). */
static const sk_cp_cost kDefaultCost = {13.25, 20.1, 61.4};

typedef struct bal {
    const sk_bsr *L;
    sk_cp_cost cost;
    sk_cp_sharding sharding;
    int32_t R, C;
    int causal;
    int64_t nb, slices, pairs; /* pairs: (batch, query head) pairs per slice */
} bal;

/* Per rank: predicted ns, local and remote blocks, tiles. */
typedef struct bal_ranks {
    double *ns;
    int64_t *local, *remote, *tiles;
} bal_ranks;

sk_status sk_cp_cost_default(sk_cp_cost *cost) {
    SK_ENTER("sk_cp_cost_default");
    SK_CHECK_NOT_NULL(cost);
    *cost = kDefaultCost;
    return SK_STATUS_SUCCESS;
}

static sk_status check_cost(const sk_cp_cost *c) {
    const double v[3] = {c->local_block, c->remote_block, c->tile};
    static const char *const names[3] = {"local_block", "remote_block", "tile"};
    for (int i = 0; i < 3; ++i)
        if (!(v[i] >= 0) || !isfinite(v[i]))
            return sk_error(SK_STATUS_BAD_PARAM_VALUE, "cost->%s = %g must be finite and >= 0",
                            names[i], v[i]);
    if (v[0] + v[1] + v[2] <= 0)
        return sk_error(SK_STATUS_BAD_PARAM_VALUE,
                        "cost's local_block, remote_block and tile are all 0: nothing to balance");
    return SK_STATUS_SUCCESS;
}

/* desc, the layout against it, the cost (NULL: the defaults). */
static sk_status open_bal(const sk_cp_desc *d, const sk_bsr *layout, const sk_cp_cost *cost,
                          bal *b) {
    int32_t block;
    memset(b, 0, sizeof *b);
    SK_TRY(sk_cp_check_layout(d, layout, &block, &b->nb));
    b->cost = cost != NULL ? *cost : kDefaultCost;
    SK_TRY(check_cost(&b->cost));
    b->L = layout;
    b->sharding = d->sharding;
    b->R = d->ranks;
    b->C = sk_cp_chunk_count(d->ranks, d->sharding);
    b->causal = d->mask == SK_MASK_CAUSAL;
    b->slices = (int64_t)layout->grid.batch * layout->grid.heads;
    b->pairs = d->batch * d->heads_q / b->slices;
    return SK_STATUS_SUCCESS;
}

static void owners(const bal *b, const int32_t *starts, int32_t *owner) {
    for (int32_t c = 0; c < b->C; ++c)
        for (int64_t j = starts[c]; j < starts[c + 1]; ++j)
            owner[j] = sk_cp_chunk_rank(b->R, b->sharding, c);
}

/* The time of local and remote blocks and tiles (all pairs counted):
 * from the integer totals, so the prediction and the balance's scores of
 * the same starts agree bitwise. */
static double ns_of(const bal *b, int64_t local, int64_t remote, int64_t tiles) {
    return (double)local * b->cost.local_block + (double)remote * b->cost.remote_block +
           (double)tiles * b->cost.tile;
}

/* The ranks' totals under owner. */
static void costs(const bal *b, const int32_t *owner, const bal_ranks *out) {
    const int32_t *off = b->L->row_offsets, *col = b->L->col_indices;
    for (int32_t r = 0; r < b->R; ++r) {
        out->ns[r] = 0;
        out->local[r] = out->remote[r] = out->tiles[r] = 0;
    }
    for (int64_t s = 0; s < b->slices; ++s)
        for (int64_t i = 0; i < b->nb; ++i) {
            const int64_t row = s * b->nb + i;
            const int32_t r = owner[i];
            int64_t nl = 0, nr = 0;
            for (int32_t e = off[row]; e < off[row + 1]; ++e) {
                const int32_t j = col[e];
                if (b->causal && j > i) continue;
                if (owner[j] == r)
                    ++nl;
                else
                    ++nr;
            }
            out->local[r] += b->pairs * nl;
            out->remote[r] += b->pairs * nr;
            out->tiles[r] += b->pairs * ((nl > 0) + (nr > 0));
        }
    for (int32_t r = 0; r < b->R; ++r)
        out->ns[r] = ns_of(b, out->local[r], out->remote[r], out->tiles[r]);
}

/* Starts cutting the prefix sums of w nearest to c W / C (p: [nb + 1]
 * scratch), each chunk at least one block. */
static void cut(const bal *b, const double *w, double *p, int32_t *starts) {
    p[0] = 0;
    for (int64_t i = 0; i < b->nb; ++i) p[i + 1] = p[i] + w[i];
    const double total = p[b->nb];
    starts[0] = 0;
    starts[b->C] = (int32_t)b->nb;
    int64_t i = 0;
    for (int32_t c = 1; c < b->C; ++c) {
        const double target = total * c / b->C;
        while (i < b->nb && p[i] < target) ++i;
        int64_t at = i > 0 && target - p[i - 1] <= p[i] - target ? i - 1 : i;
        const int64_t lo = (int64_t)starts[c - 1] + 1, hi = b->nb - (b->C - c);
        at = at < lo ? lo : at > hi ? hi : at;
        starts[c] = (int32_t)at;
    }
}

static double slowest(const bal *b, const double *ns) {
    double m = 0;
    for (int32_t r = 0; r < b->R; ++r) m = ns[r] > m ? ns[r] : m;
    return m;
}

/* Host scratch of one call: owner [nb], w and p [nb + 1], the ranks'
 * arrays [R], three start arrays [C + 1]. */
typedef struct bal_scratch {
    int32_t *owner, *cur, *next, *best;
    double *w, *p;
    bal_ranks ranks;
} bal_scratch;

static void scratch_free(bal_scratch *x) {
    free(x->owner), free(x->cur), free(x->next), free(x->best);
    free(x->w), free(x->p);
    free(x->ranks.ns), free(x->ranks.local), free(x->ranks.remote), free(x->ranks.tiles);
}

static sk_status scratch_alloc(const bal *b, bal_scratch *x) {
    const size_t nb = (size_t)b->nb + 1, R = (size_t)b->R, C = (size_t)b->C + 1;
    memset(x, 0, sizeof *x);
    x->owner = malloc(nb * sizeof(int32_t));
    x->cur = malloc(C * sizeof(int32_t));
    x->next = malloc(C * sizeof(int32_t));
    x->best = malloc(C * sizeof(int32_t));
    x->w = malloc(nb * sizeof(double));
    x->p = malloc(nb * sizeof(double));
    x->ranks.ns = malloc(R * sizeof(double));
    x->ranks.local = malloc(R * sizeof(int64_t));
    x->ranks.remote = malloc(R * sizeof(int64_t));
    x->ranks.tiles = malloc(R * sizeof(int64_t));
    if (!x->owner || !x->cur || !x->next || !x->best || !x->w || !x->p || !x->ranks.ns ||
        !x->ranks.local || !x->ranks.remote || !x->ranks.tiles) {
        scratch_free(x);
        return sk_error(SK_STATUS_ALLOC_FAILED, "host scratch of the balance (%lld blocks)",
                        (long long)b->nb);
    }
    return SK_STATUS_SUCCESS;
}

/* The balance's state under the current chunks: when a block changes
 * owner, the local count of every row reading it changes (those rows are
 * found by the layout's transpose) and so does its own row's. The counts
 * are integers, so a move and its undo restore the state exactly and no
 * score depends on the order of the moves. Host scratch: 4 bytes per
 * layout entry (the transpose) and 8 per row. */
typedef struct walk {
    const bal *b;
    int32_t *chunk, *owner;   /* per block [nb] */
    int32_t *tr_off, *tr_row; /* transpose: per slice, per key block, the rows reading it */
    int32_t *nl, *n;          /* per row (slice x nb): local and all blocks */
    int64_t *cl, *cr, *ct;    /* per chunk: local, remote blocks, tiles (per pair) */
} walk;

static void walk_free(walk *w) {
    free(w->chunk), free(w->owner), free(w->tr_off), free(w->tr_row);
    free(w->nl), free(w->n), free(w->cl), free(w->cr), free(w->ct);
}

static double chunk_ns(const walk *w, int32_t c) {
    const int64_t p = w->b->pairs;
    return ns_of(w->b, p * w->cl[c], p * w->cr[c], p * w->ct[c]);
}

/* Every rank's time (rank_ns [R]); returns the slowest. */
static double walk_slowest(const walk *w, double *rank_ns) {
    const bal *b = w->b;
    for (int32_t r = 0; r < b->R; ++r) {
        int64_t l = 0, m = 0, t = 0;
        for (int32_t c = 0; c < b->C; ++c)
            if (sk_cp_chunk_rank(b->R, b->sharding, c) == r)
                l += w->cl[c], m += w->cr[c], t += w->ct[c];
        rank_ns[r] = ns_of(b, b->pairs * l, b->pairs * m, b->pairs * t);
    }
    return slowest(b, rank_ns);
}

/* Whether the current state beats best (its slowest rank, then its
 * spread: two states can share the slowest rank, a chunk whole blocks
 * long, and the closer ranks are the better answer), best updated. */
static int walk_better(const walk *w, double *rank_ns, double *best) {
    const double m = walk_slowest(w, rank_ns);
    double lo = m;
    for (int32_t r = 0; r < w->b->R; ++r) lo = rank_ns[r] < lo ? rank_ns[r] : lo;
    if (!(m < best[0] || (m == best[0] && m - lo < best[1]))) return 0;
    best[0] = m;
    best[1] = m - lo;
    return 1;
}

/* Adds (sign 1) or removes (-1) row (s, i)'s counts from its chunk's. */
static void row_add(walk *w, int64_t s, int64_t i, int sign) {
    const int64_t row = s * w->b->nb + i;
    const int64_t nl = w->nl[row], nr = w->n[row] - nl;
    const int32_t c = w->chunk[i];
    w->cl[c] += sign * nl;
    w->cr[c] += sign * nr;
    w->ct[c] += sign * ((nl > 0) + (nr > 0));
}

/* Row (s, i)'s local blocks under the current owners. */
static int32_t row_local(const walk *w, int64_t s, int64_t i) {
    const int64_t row = s * w->b->nb + i;
    const int32_t *col = w->b->L->col_indices;
    int32_t nl = 0;
    for (int32_t e = w->b->L->row_offsets[row]; e < w->b->L->row_offsets[row + 1]; ++e)
        if (!(w->b->causal && col[e] > i)) nl += w->owner[col[e]] == w->owner[i];
    return nl;
}

/* Block j into chunk c, every count updated. */
static void walk_set(walk *w, int64_t j, int32_t c) {
    const bal *b = w->b;
    const int32_t from = w->owner[j], to = sk_cp_chunk_rank(b->R, b->sharding, c);
    for (int64_t s = 0; s < b->slices; ++s) row_add(w, s, j, -1);
    w->chunk[j] = c;
    w->owner[j] = to;
    if (from != to)
        for (int64_t s = 0; s < b->slices; ++s) {
            const int32_t *at = w->tr_off + s * (b->nb + 1);
            for (int32_t e = at[j]; e < at[j + 1]; ++e) {
                const int32_t i = w->tr_row[e];
                const int32_t r = w->owner[i];
                if (i == j || (r != from && r != to)) continue;
                row_add(w, s, i, -1);
                w->nl[s * b->nb + i] += r == to ? 1 : -1;
                row_add(w, s, i, 1);
            }
        }
    for (int64_t s = 0; s < b->slices; ++s) {
        w->nl[s * b->nb + j] = row_local(w, s, j);
        row_add(w, s, j, 1);
    }
}

static sk_status walk_open(const bal *b, const int32_t *starts, walk *w) {
    const int64_t nb = b->nb, rows = b->slices * nb;
    const int32_t *off = b->L->row_offsets, *col = b->L->col_indices;
    memset(w, 0, sizeof *w);
    w->b = b;
    w->chunk = malloc((size_t)nb * sizeof(int32_t));
    w->owner = malloc((size_t)nb * sizeof(int32_t));
    w->tr_off = calloc((size_t)(b->slices * (nb + 1)), sizeof(int32_t));
    w->tr_row = malloc((size_t)(off[rows] > 0 ? off[rows] : 1) * sizeof(int32_t));
    w->nl = malloc((size_t)rows * sizeof(int32_t));
    w->n = malloc((size_t)rows * sizeof(int32_t));
    w->cl = calloc((size_t)b->C, sizeof(int64_t));
    w->cr = calloc((size_t)b->C, sizeof(int64_t));
    w->ct = calloc((size_t)b->C, sizeof(int64_t));
    if (!w->chunk || !w->owner || !w->tr_off || !w->tr_row || !w->nl || !w->n || !w->cl || !w->cr ||
        !w->ct) {
        walk_free(w);
        return sk_error(SK_STATUS_ALLOC_FAILED, "host scratch of the balance's walk (%lld entries)",
                        (long long)off[rows]);
    }
    for (int32_t c = 0; c < b->C; ++c)
        for (int64_t j = starts[c]; j < starts[c + 1]; ++j) w->chunk[j] = c;
    owners(b, starts, w->owner);
    /* The transpose, counted then filled (rows ascending per key block). */
    int32_t total = 0;
    for (int64_t s = 0; s < b->slices; ++s) {
        int32_t *at = w->tr_off + s * (nb + 1);
        for (int64_t i = 0; i < nb; ++i)
            for (int32_t e = off[s * nb + i]; e < off[s * nb + i + 1]; ++e)
                if (!(b->causal && col[e] > i)) ++at[col[e] + 1];
        at[0] = total;
        for (int64_t j = 0; j < nb; ++j) at[j + 1] += at[j];
        total = at[nb];
        for (int64_t i = 0; i < nb; ++i) {
            int32_t n = 0;
            for (int32_t e = off[s * nb + i]; e < off[s * nb + i + 1]; ++e)
                if (!(b->causal && col[e] > i)) w->tr_row[at[col[e]]++] = (int32_t)i, ++n;
            w->n[s * nb + i] = n;
        }
        for (int64_t j = nb; j > 0; --j) at[j] = at[j - 1];
        at[0] = s > 0 ? w->tr_off[s * (nb + 1) - 1] : 0;
    }
    for (int64_t s = 0; s < b->slices; ++s)
        for (int64_t i = 0; i < nb; ++i) {
            w->nl[s * nb + i] = row_local(w, s, i);
            row_add(w, s, i, 1);
        }
    return SK_STATUS_SUCCESS;
}

/* Every row block's cost under the current owners (summed over slices). */
static void walk_weights(const walk *w, double *out) {
    const bal *b = w->b;
    for (int64_t i = 0; i < b->nb; ++i) {
        int64_t nl = 0, nr = 0, t = 0;
        for (int64_t s = 0; s < b->slices; ++s) {
            const int64_t l = w->nl[s * b->nb + i], r = w->n[s * b->nb + i] - l;
            nl += l, nr += r, t += (l > 0) + (r > 0);
        }
        out[i] = ns_of(b, b->pairs * nl, b->pairs * nr, b->pairs * t);
    }
}

/* The state of starts: every block whose chunk differs moved. */
static void walk_apply(walk *w, const int32_t *starts) {
    for (int32_t c = 0; c < w->b->C; ++c)
        for (int64_t j = starts[c]; j < starts[c + 1]; ++j)
            if (w->chunk[j] != c) walk_set(w, j, c);
}

/* How far chunks 0 .. k - 1 are from k / C of the total cost. */
static double walk_excess(const walk *w, int32_t k) {
    double before = 0, all = 0;
    for (int32_t c = 0; c < w->b->C; ++c) {
        const double ns = chunk_ns(w, c);
        all += ns;
        if (c < k) before += ns;
    }
    return before - all * k / w->b->C;
}

/* Moves boundary k (between chunks k - 1 and k) block by block while the
 * cost before it gets closer to k / C of the total (the cut's target,
 * re-evaluated after every block); returns the blocks moved. */
static int64_t walk_boundary(walk *w, int32_t *starts, int32_t k) {
    int64_t moved = 0;
    double d = walk_excess(w, k);
    for (;;) {
        const int left = d > 0;
        if (d == 0 || (left ? starts[k] - 1 <= starts[k - 1] : starts[k] + 1 >= starts[k + 1]))
            break;
        const int64_t j = left ? starts[k] - 1 : starts[k];
        walk_set(w, j, left ? k : k - 1);
        const double e = walk_excess(w, k);
        if (fabs(e) >= fabs(d)) {
            walk_set(w, j, left ? k - 1 : k);
            break;
        }
        starts[k] += left ? -1 : 1;
        d = e;
        ++moved;
    }
    return moved;
}

sk_status sk_cp_predict(const sk_cp_desc *desc, const sk_bsr *layout, const sk_cp_cost *cost,
                        double *rank_ns, int64_t *local_blocks, int64_t *remote_blocks,
                        int64_t *tiles) {
    SK_ENTER("sk_cp_predict");
    bal b;
    SK_TRY(open_bal(desc, layout, cost, &b));
    bal_scratch x;
    SK_TRY(scratch_alloc(&b, &x));
    for (int32_t c = 0; c <= b.C; ++c) x.cur[c] = (int32_t)sk_cp_first_block(desc, b.nb, c);
    owners(&b, x.cur, x.owner);
    costs(&b, x.owner, &x.ranks);
    const size_t R = (size_t)b.R;
    if (rank_ns != NULL) memcpy(rank_ns, x.ranks.ns, R * sizeof(double));
    if (local_blocks != NULL) memcpy(local_blocks, x.ranks.local, R * sizeof(int64_t));
    if (remote_blocks != NULL) memcpy(remote_blocks, x.ranks.remote, R * sizeof(int64_t));
    if (tiles != NULL) memcpy(tiles, x.ranks.tiles, R * sizeof(int64_t));
    scratch_free(&x);
    return SK_STATUS_SUCCESS;
}

sk_status sk_cp_balance(const sk_cp_desc *desc, const sk_bsr *layout, const sk_cp_cost *cost,
                        int32_t *chunk_starts, int32_t count) {
    SK_ENTER("sk_cp_balance");
    SK_TRY(sk_cp_check_desc(desc));
    /* desc's own boundaries are ignored: a copy without them (a V1
     * descriptor has none). */
    sk_cp_desc d;
    memset(&d, 0, sizeof d);
    memcpy(&d, desc, SK_CP_DESC_V1_SIZE);
    d.struct_size = sizeof d;
    d.chunk_starts = NULL;
    d.reserve_sms = SK_CP_RESERVE_SMS_DEFAULT;
    bal b;
    SK_TRY(open_bal(&d, layout, cost, &b));
    SK_CHECK_NOT_NULL(chunk_starts);
    if (count < b.C + 1)
        return sk_error(SK_STATUS_BAD_PARAM_VALUE,
                        "count = %d: chunk_starts needs C + 1 = %d entries (%d ranks, %s)",
                        (int)count, (int)(b.C + 1), (int)b.R,
                        b.sharding == SK_CP_SHARDING_ZIGZAG ? "zigzag" : "contiguous");
    bal_scratch x;
    SK_TRY(scratch_alloc(&b, &x));
    const size_t cb = (size_t)(b.C + 1) * sizeof(int32_t);
    for (int32_t c = 0; c <= b.C; ++c) x.cur[c] = (int32_t)sk_cp_chunk_start(b.nb, b.C, c);
    walk w;
    const sk_status st = walk_open(&b, x.cur, &w);
    if (st != SK_STATUS_SUCCESS) {
        scratch_free(&x);
        return st;
    }
    /* The cuts, from equal chunks, then the walk from the best of them;
     * every state scored by its slowest rank, then its spread, the best
     * kept (ties: the earlier). */
    double best[2] = {INFINITY, INFINITY};
    for (int round = 0; round < kRounds; ++round) {
        if (walk_better(&w, x.ranks.ns, best)) memcpy(x.best, x.cur, cb);
        walk_weights(&w, x.w);
        cut(&b, x.w, x.p, x.next);
        if (memcmp(x.next, x.cur, cb) == 0) break;
        memcpy(x.cur, x.next, cb);
        walk_apply(&w, x.cur);
    }
    memcpy(x.cur, x.best, cb);
    walk_apply(&w, x.cur);
    for (int sweep = 0; sweep < kSweeps; ++sweep) {
        int64_t moved = 0;
        for (int32_t t = 1; t < b.C; ++t) {
            const int32_t k = sweep % 2 ? b.C - t : t;
            moved += walk_boundary(&w, x.cur, k);
            if (walk_better(&w, x.ranks.ns, best)) memcpy(x.best, x.cur, cb);
        }
        if (moved == 0) break;
    }
    walk_free(&w);
    memcpy(chunk_starts, x.best, cb);
    scratch_free(&x);
    return SK_STATUS_SUCCESS;
}
