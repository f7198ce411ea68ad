/*
 * cp_balance.c - context parallel: chunk boundaries balanced by a cost
 * model (sk_cp_cost_default, sk_cp_predict, sk_cp_balance).
 *
 * The model (include/sparsek.h): a rank's time is its rows' local blocks
 * x local_block + remote blocks x remote_block + tiles x tile, a block
 * being one query block against one key block for one (batch, query head)
 * and a tile one (query block, batch, query head) row of a pass with at
 * least one block. A row's cost depends on who owns its key blocks, so
 * the balance iterates: under the current owners, every row block's cost
 * w[i] (summed over slices and the (batch, head) pairs each covers); then
 * the chunk starts that cut the prefix sums of w nearest to c W / C, each
 * chunk at least one block; repeat until the starts stop moving (at most
 * kRounds). Every candidate, the equal chunks first, is scored by its
 * slowest rank under its own owners; the best is returned (ties: the
 * earlier), so the answer is never predicted slower than equal chunks.
 *
 * Why per chunk, also for zigzag: rank r's time is chunk r's cost plus
 * chunk 2R - 1 - r's, so equal chunk costs give equal rank times for any
 * pairing, with one rule for both shardings and no free parameter (moving
 * only some boundaries leaves R - 1 degrees of freedom the model does not
 * fix). It also keeps a rank's two local passes alike, and the first one
 * is what hides the exchange.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/cp_internal.h"
#include "core/internal.h"

/* Candidates scored at most (the iteration settles in 2-4 on the layouts
 * tried; a cycle ends here). */
enum { kRounds = 16 };

/* The defaults (docs/perf/context_parallel.md section 10): fitted to the
 * 1M zigzag run of section 9 on 2 x H200 (B1 H32/8 D128 bf16, blocks of
 * 128): the local passes' blocks, the remote passes' shorter rows. */
static const sk_cp_cost kDefaultCost = {13.25, 13.25, 61.4};

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

/* Row block costs w[i] (w may be NULL) and the ranks' totals under owner. */
static void costs(const bal *b, const int32_t *owner, double *w, const bal_ranks *out) {
    const int32_t *off = b->L->row_offsets, *col = b->L->col_indices;
    for (int32_t r = 0; r < b->R; ++r) {
        out->ns[r] = 0;
        out->local[r] = out->remote[r] = out->tiles[r] = 0;
    }
    if (w != NULL)
        for (int64_t i = 0; i < b->nb; ++i) w[i] = 0;
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
            const int64_t t = (nl > 0) + (nr > 0);
            const double ns =
                (double)b->pairs * ((double)nl * b->cost.local_block +
                                    (double)nr * b->cost.remote_block + (double)t * b->cost.tile);
            if (w != NULL) w[i] += ns;
            out->ns[r] += ns;
            out->local[r] += b->pairs * nl;
            out->remote[r] += b->pairs * nr;
            out->tiles[r] += b->pairs * t;
        }
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
    costs(&b, x.owner, NULL, &x.ranks);
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
    double best = INFINITY;
    for (int round = 0; round < kRounds; ++round) {
        owners(&b, x.cur, x.owner);
        costs(&b, x.owner, x.w, &x.ranks);
        const double m = slowest(&b, x.ranks.ns);
        if (m < best) {
            best = m;
            memcpy(x.best, x.cur, cb);
        }
        cut(&b, x.w, x.p, x.next);
        if (memcmp(x.next, x.cur, cb) == 0) break;
        memcpy(x.cur, x.next, cb);
    }
    memcpy(chunk_starts, x.best, cb);
    scratch_free(&x);
    return SK_STATUS_SUCCESS;
}
