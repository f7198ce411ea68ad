/*
 * test_cp_balance.c - balanced context-parallel chunks (sk_cp_balance,
 * sk_cp_predict, desc->chunk_starts, desc->reserve_sms): the balance on
 * layouts whose answer is known (uniform without causal: equal chunks;
 * causal dense: later chunks shorter; all work in one region: the cuts
 * there), never predicted slower than equal chunks, the ranks within two
 * rows' cost of each other with the defaults (remote dearer than local)
 * for R = 2 .. 8 and both shardings, the prediction
 * against counts made here from the layout, and bad inputs (status,
 * message naming the argument, nothing written). The runs with given
 * boundaries against the single process are test_cp.c's and
 * test_cp_backward.c's *_given_chunk_starts_* tests.
 */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "common/cp_case.h"
#include "common/harness.h"
#include "common/test_util.h"
#include "sparsek.h"

enum { MAX_C = 2 * 8 + 1 };

static sk_cp_desc make_desc(int32_t ranks, sk_cp_sharding sh, int64_t seq, int causal) {
    sk_cp_desc d;
    sk_cp_desc_init(&d, sizeof d);
    d.ranks = ranks;
    d.sharding = sh;
    d.backend = SK_BACKEND_CPU;
    d.dtype = SK_DTYPE_BF16;
    d.batch = 2;
    d.seq = seq;
    d.heads_q = 4;
    d.heads_kv = 2;
    d.head_dim = 16;
    d.mask = causal ? SK_MASK_CAUSAL : SK_MASK_NONE;
    return d;
}

/* A layout over d's grid (blocks of 64, one slice per batch, `heads`
 * slices): create(&out, grid), e.g. sk_layout_create_causal; its view in
 * *L. */
static sk_layout_t grid_layout(const sk_cp_desc *d, int32_t heads,
                               sk_status (*create)(sk_layout_t *, const sk_grid *), sk_bsr *L) {
    const sk_grid g = tu_grid(d->seq, d->seq, 64, 64, 1, heads);
    sk_layout_t owned = NULL;
    if (create(&owned, &g) != SK_STATUS_SUCCESS) return NULL;
    sk_layout_view(owned, L);
    return owned;
}

static int32_t chunk_count(const sk_cp_desc *d) {
    return d->sharding == SK_CP_SHARDING_ZIGZAG ? 2 * d->ranks : d->ranks;
}

static double max_of(const double *x, int32_t n) {
    double m = x[0];
    for (int32_t i = 1; i < n; ++i) m = fmax(m, x[i]);
    return m;
}

static double min_of(const double *x, int32_t n) {
    double m = x[0];
    for (int32_t i = 1; i < n; ++i) m = fmin(m, x[i]);
    return m;
}

/* The rank of each block under starts (NULL: equal), by the sharding's
 * rule written out here. */
static void owners_of(const sk_cp_desc *d, const int32_t *starts, int64_t nb, int32_t *owner) {
    const int32_t R = d->ranks, C = chunk_count(d);
    for (int32_t c = 0; c < C; ++c) {
        const int64_t b0 = starts ? starts[c] : c * nb / C,
                      b1 = starts ? starts[c + 1] : (c + 1) * nb / C;
        for (int64_t j = b0; j < b1; ++j) owner[j] = c < R ? c : 2 * R - 1 - c;
    }
}

/* sk_cp_predict's counts made here: per rank local / remote blocks and
 * tiles, each layout entry weighted by the (batch, query head) pairs of
 * its slice; then the time under cost. */
static void count_here(const sk_cp_desc *d, const sk_bsr *L, const int32_t *starts,
                       const sk_cp_cost *cost, int64_t *loc, int64_t *rem, int64_t *til,
                       double *ns) {
    const int64_t nb = (d->seq + L->grid.block_rows - 1) / L->grid.block_rows;
    const int64_t slices = (int64_t)L->grid.batch * L->grid.heads;
    const int64_t pairs = d->batch * d->heads_q / slices;
    int32_t *owner = malloc((size_t)nb * sizeof(int32_t));
    owners_of(d, starts, nb, owner);
    for (int32_t r = 0; r < d->ranks; ++r) loc[r] = rem[r] = til[r] = 0;
    for (int64_t s = 0; s < slices; ++s)
        for (int64_t i = 0; i < nb; ++i) {
            int64_t a = 0, b = 0;
            for (int32_t e = L->row_offsets[s * nb + i]; e < L->row_offsets[s * nb + i + 1]; ++e) {
                const int32_t j = L->col_indices[e];
                if (d->mask == SK_MASK_CAUSAL && j > i) continue;
                if (owner[j] == owner[i])
                    ++a;
                else
                    ++b;
            }
            loc[owner[i]] += pairs * a;
            rem[owner[i]] += pairs * b;
            til[owner[i]] += pairs * ((a > 0) + (b > 0));
        }
    for (int32_t r = 0; r < d->ranks; ++r)
        ns[r] = (double)loc[r] * cost->local_block + (double)rem[r] * cost->remote_block +
                (double)til[r] * cost->tile;
    free(owner);
}

/* Balance d over L; the prediction for the answer and for equal chunks. */
static int balance(const sk_cp_desc *d, const sk_bsr *L, const sk_cp_cost *cost, int32_t *starts,
                   double *bal_ns, double *eq_ns) {
    sk_status st = sk_cp_balance(d, L, cost, starts, MAX_C);
    CHECK(st == SK_STATUS_SUCCESS, "balance: %s", sk_last_error());
    if (st != SK_STATUS_SUCCESS) return 0;
    sk_cp_desc e = *d;
    e.chunk_starts = NULL;
    st = sk_cp_predict(&e, L, cost, eq_ns, NULL, NULL, NULL);
    CHECK(st == SK_STATUS_SUCCESS, "predict equal: %s", sk_last_error());
    e.chunk_starts = starts;
    st = sk_cp_predict(&e, L, cost, bal_ns, NULL, NULL, NULL);
    CHECK(st == SK_STATUS_SUCCESS, "predict balanced: %s", sk_last_error());
    return st == SK_STATUS_SUCCESS;
}

/* Dense, no mask: every row costs the same under equal chunks, which are
 * then the answer (nb a multiple of C). */
SK_TEST(cp_balance_uniform_layout_gives_equal_chunks) {
    for (int32_t R = 1; R <= 4; ++R)
        for (int sh = 0; sh < 2; ++sh) {
            const sk_cp_desc d =
                make_desc(R, sh ? SK_CP_SHARDING_ZIGZAG : SK_CP_SHARDING_CONTIGUOUS, 64 * 48, 0);
            sk_bsr L;
            sk_layout_t owned = grid_layout(&d, 1, sk_layout_create_dense, &L);
            REQUIRE(owned != NULL, "layout: %s", sk_last_error());
            int32_t starts[MAX_C];
            double b[8], e[8];
            if (balance(&d, &L, NULL, starts, b, e)) {
                const int32_t C = chunk_count(&d);
                for (int32_t c = 0; c <= C; ++c)
                    CHECK(starts[c] == c * 48 / C, "R %d %s: starts[%d] = %d, want %d", (int)R,
                          sh ? "zigzag" : "contiguous", (int)c, (int)starts[c], (int)(c * 48 / C));
                CHECK(max_of(b, R) == min_of(b, R), "R %d: ranks predicted %g .. %g", (int)R,
                      min_of(b, R), max_of(b, R));
            }
            sk_layout_destroy(owned);
        }
}

/* Causal dense: row i holds i + 1 blocks, so equal cost puts fewer rows in
 * the later chunks; the ranks' predictions within a row's cost of each
 * other, and the slowest no slower than with equal chunks. With a remote
 * block dearer than a local one (the defaults) a row's cost is no longer
 * a function of i alone: the rows of zigzag's second-half chunk c >= R
 * also own chunk 2R - 1 - c, larger the later c is, so chunk c + 1's rows
 * can be cheaper than chunk c's and its equal share longer (R = 3: chunk
 * 5's rows own 117 blocks of chunk 0, chunk 4's 36 of chunk 1). There the
 * claim holds where a row's local blocks are only its own chunk's:
 * contiguous, and zigzag's first R chunks. */
SK_TEST(cp_balance_causal_dense_makes_later_chunks_shorter) {
    sk_cp_cost costs[2];
    sk_cp_cost_default(&costs[0]);
    costs[1] = costs[0];
    costs[1].remote_block = costs[1].local_block;
    for (int k = 0; k < 2; ++k)
        for (int32_t R = 2; R <= 4; ++R)
            for (int sh = 0; sh < 2; ++sh) {
                const sk_cp_desc d = make_desc(
                    R, sh ? SK_CP_SHARDING_ZIGZAG : SK_CP_SHARDING_CONTIGUOUS, 64 * 256 - 5, 1);
                const sk_cp_cost *cost = &costs[k];
                sk_bsr L;
                sk_layout_t owned = grid_layout(&d, 2, sk_layout_create_causal, &L);
                REQUIRE(owned != NULL, "layout: %s", sk_last_error());
                int32_t starts[MAX_C];
                double b[8], e[8];
                if (balance(&d, &L, k ? cost : NULL, starts, b, e)) {
                    const int32_t C = chunk_count(&d);
                    const int32_t last = k || !sh ? C - 1 : R - 1;
                    for (int32_t c = 1; c <= last; ++c)
                        CHECK(starts[c + 1] - starts[c] < starts[c] - starts[c - 1],
                              "remote %g R %d %s: chunk %d has %d blocks, chunk %d %d",
                              cost->remote_block, (int)R, sh ? "zigzag" : "contiguous", (int)c,
                              (int)(starts[c + 1] - starts[c]), (int)(c - 1),
                              (int)(starts[c] - starts[c - 1]));
                    /* One row block of the last rows: 256 blocks x 8 pairs. */
                    const double row =
                        8 * (256 * fmax(cost->local_block, cost->remote_block) + 2 * cost->tile);
                    CHECK(max_of(b, R) - min_of(b, R) <= 2 * row,
                          "remote %g R %d %s: predicted %g .. %g ns", cost->remote_block, (int)R,
                          sh ? "zigzag" : "contiguous", min_of(b, R), max_of(b, R));
                    CHECK(max_of(b, R) <= max_of(e, R), "R %d: balanced %g ns, equal %g", (int)R,
                          max_of(b, R), max_of(e, R));
                    if (!sh)
                        CHECK(max_of(b, R) < max_of(e, R), "R %d contiguous: balanced %g, equal %g",
                              (int)R, max_of(b, R), max_of(e, R));
                }
                sk_layout_destroy(owned);
            }
}

/* Work only in rows [nb/2, nb/2 + nb/8) (each selects every block, no
 * mask); the other rows are empty and cost nothing: every cut falls in
 * that region and the ranks' predictions are within two rows' cost. */
SK_TEST(cp_balance_work_in_one_region) {
    const int64_t nb = 512, r0 = nb / 2, r1 = nb / 2 + nb / 8;
    int32_t *off = malloc((size_t)(nb + 1) * sizeof(int32_t));
    int32_t *col = malloc((size_t)((r1 - r0) * nb) * sizeof(int32_t));
    REQUIRE(off && col, "alloc");
    int32_t n = 0;
    for (int64_t i = 0; i < nb; ++i) {
        off[i] = n;
        if (i >= r0 && i < r1)
            for (int32_t j = 0; j < nb; ++j) col[n++] = j;
    }
    off[nb] = n;
    sk_bsr raw;
    memset(&raw, 0, sizeof raw);
    raw.grid = tu_grid(nb * 64, nb * 64, 64, 64, 1, 1);
    raw.nnz = n;
    raw.row_offsets = off;
    raw.col_indices = col;
    sk_layout_t owned = NULL;
    REQUIRE(sk_layout_create_from_bsr(&owned, &raw) == SK_STATUS_SUCCESS, "%s", sk_last_error());
    sk_bsr L;
    sk_layout_view(owned, &L);
    sk_cp_cost cost;
    sk_cp_cost_default(&cost);
    const double row = 8 * (nb * fmax(cost.local_block, cost.remote_block) + 2 * cost.tile);
    for (int32_t R = 2; R <= 4; ++R)
        for (int sh = 0; sh < 2; ++sh) {
            const sk_cp_desc d =
                make_desc(R, sh ? SK_CP_SHARDING_ZIGZAG : SK_CP_SHARDING_CONTIGUOUS, nb * 64, 0);
            int32_t starts[MAX_C];
            double b[8], e[8];
            if (!balance(&d, &L, NULL, starts, b, e)) continue;
            const int32_t C = chunk_count(&d);
            for (int32_t c = 1; c < C; ++c)
                CHECK(starts[c] > r0 && starts[c] < r1, "R %d %s: starts[%d] = %d outside (%d, %d)",
                      (int)R, sh ? "zigzag" : "contiguous", (int)c, (int)starts[c], (int)r0,
                      (int)r1);
            CHECK(max_of(b, R) - min_of(b, R) <= 2 * row, "R %d %s: predicted %g .. %g ns", (int)R,
                  sh ? "zigzag" : "contiguous", min_of(b, R), max_of(b, R));
            CHECK(max_of(b, R) < max_of(e, R), "R %d: balanced %g, equal %g", (int)R, max_of(b, R),
                  max_of(e, R));
        }
    sk_layout_destroy(owned);
    free(off);
    free(col);
}

/* The costliest row block of L under cost: its blocks (causal: those at
 * or below the diagonal) all at the dearer block cost, two tiles a row. */
static double costliest_row(const sk_cp_desc *d, const sk_bsr *L, const sk_cp_cost *cost) {
    const int64_t nb = (d->seq + L->grid.block_rows - 1) / L->grid.block_rows;
    const int64_t slices = (int64_t)L->grid.batch * L->grid.heads;
    const double pairs = (double)(d->batch * d->heads_q / slices);
    double most = 0;
    for (int64_t i = 0; i < nb; ++i) {
        double ns = 0;
        for (int64_t s = 0; s < slices; ++s) {
            int64_t n = 0;
            for (int32_t e = L->row_offsets[s * nb + i]; e < L->row_offsets[s * nb + i + 1]; ++e)
                n += !(d->mask == SK_MASK_CAUSAL && L->col_indices[e] > i);
            ns +=
                pairs * ((double)n * fmax(cost->local_block, cost->remote_block) + 2 * cost->tile);
        }
        most = fmax(most, ns);
    }
    return most;
}

/* With the defaults (a remote block dearer than a local one, so moving a
 * boundary changes the other chunks' costs): the balanced ranks'
 * predictions within two of the costliest row blocks of each other, and
 * the slowest no slower than with equal chunks, for the shared layouts,
 * causal and not, R = 2 .. 8, both shardings. */
SK_TEST(cp_balance_spread_within_two_rows) {
    const uint64_t seed = tu_base_seed() ^ 0x5b2;
    sk_cp_cost cost;
    sk_cp_cost_default(&cost);
    int cases = 0;
    for (int kind = 0; kind < CPC_KINDS; ++kind)
        for (int causal = 0; causal < 2; ++causal)
            for (int32_t R = 2; R <= 8; ++R)
                for (int sh = 0; sh < 2; ++sh) {
                    const sk_cp_desc d =
                        make_desc(R, sh ? SK_CP_SHARDING_ZIGZAG : SK_CP_SHARDING_CONTIGUOUS,
                                  64 * 200 - 17, causal);
                    const sk_grid g = tu_grid(d.seq, d.seq, 64, 64, 1, 2);
                    sk_layout_t owned = cpc_layout(kind, causal, &g, seed + (uint64_t)cases++);
                    REQUIRE(owned != NULL, "layout: %s", sk_last_error());
                    sk_bsr L;
                    sk_layout_view(owned, &L);
                    int32_t starts[MAX_C];
                    double b[8], e[8];
                    if (balance(&d, &L, NULL, starts, b, e)) {
                        const double row = costliest_row(&d, &L, &cost);
                        CHECK(max_of(b, R) - min_of(b, R) <= 2 * row,
                              "%s %s R %d %s: predicted %g .. %g ns, a row %g",
                              cpc_kind_names[kind], causal ? "causal" : "", (int)R,
                              sh ? "zigzag" : "contiguous", min_of(b, R), max_of(b, R), row);
                        CHECK(max_of(b, R) <= max_of(e, R), "%s R %d: balanced %g, equal %g",
                              cpc_kind_names[kind], (int)R, max_of(b, R), max_of(e, R));
                    }
                    sk_layout_destroy(owned);
                }
}

/* The prediction against counts made here, for equal, skewed and balanced
 * boundaries, over the shared layouts (causal and not, per KV head and
 * per query head), with costs whose products are exact; and the balance
 * is never predicted slower than equal chunks. */
SK_TEST(cp_predict_matches_counts_from_the_layout) {
    const uint64_t seed = tu_base_seed() ^ 0x9ed;
    const sk_cp_cost cost = {1.0, 3.0, 16.0};
    int cases = 0;
    for (int kind = 0; kind < CPC_KINDS; ++kind)
        for (int causal = 0; causal < 2; ++causal)
            for (int32_t R = 2; R <= 4; ++R)
                for (int sh = 0; sh < 2; ++sh) {
                    sk_cp_desc d =
                        make_desc(R, sh ? SK_CP_SHARDING_ZIGZAG : SK_CP_SHARDING_CONTIGUOUS,
                                  64 * 40 - 17, causal);
                    const sk_grid g = tu_grid(d.seq, d.seq, 64, 64, 1 + (R % 2), R == 3 ? 4 : 2);
                    sk_layout_t owned = cpc_layout(kind, causal, &g, seed + (uint64_t)cases);
                    REQUIRE(owned != NULL, "layout: %s", sk_last_error());
                    sk_bsr L;
                    sk_layout_view(owned, &L);
                    int32_t starts[MAX_C], skew[MAX_C];
                    double b[8], e[8];
                    if (!balance(&d, &L, &cost, starts, b, e)) break;
                    CHECK(max_of(b, R) <= max_of(e, R), "%s R %d: balanced %g, equal %g",
                          cpc_kind_names[kind], (int)R, max_of(b, R), max_of(e, R));
                    const int32_t C = chunk_count(&d);
                    for (int32_t c = 0; c <= C; ++c) skew[c] = c < C ? c : 40;
                    const int32_t *sets[3] = {NULL, starts, skew};
                    for (int t = 0; t < 3; ++t) {
                        int64_t loc[8], rem[8], til[8], l2[8], r2[8], t2[8];
                        double ns[8], n2[8];
                        d.chunk_starts = sets[t];
                        const sk_status st = sk_cp_predict(&d, &L, &cost, ns, loc, rem, til);
                        CHECK(st == SK_STATUS_SUCCESS, "predict: %s", sk_last_error());
                        count_here(&d, &L, sets[t], &cost, l2, r2, t2, n2);
                        for (int32_t r = 0; r < R && st == SK_STATUS_SUCCESS; ++r)
                            CHECK(loc[r] == l2[r] && rem[r] == r2[r] && til[r] == t2[r] &&
                                      ns[r] == n2[r],
                                  "%s %s R %d %s set %d rank %d: predicted %lld/%lld/%lld %g, "
                                  "counted %lld/%lld/%lld %g",
                                  cpc_kind_names[kind], causal ? "causal" : "", (int)R,
                                  sh ? "zigzag" : "contiguous", t, (int)r, (long long)loc[r],
                                  (long long)rem[r], (long long)til[r], ns[r], (long long)l2[r],
                                  (long long)r2[r], (long long)t2[r], n2[r]);
                    }
                    ++cases;
                    sk_layout_destroy(owned);
                }
}

/* The same call twice gives the same starts; the defaults are the ones
 * documented. */
SK_TEST(cp_balance_is_deterministic) {
    sk_cp_cost c;
    CHECK(sk_cp_cost_default(&c) == SK_STATUS_SUCCESS, "%s", sk_last_error());
    CHECK(c.local_block == 13.25 && c.remote_block == 20.1 && c.tile == 61.4, "defaults %g %g %g",
          c.local_block, c.remote_block, c.tile);
    const sk_cp_desc d = make_desc(4, SK_CP_SHARDING_ZIGZAG, 64 * 100 + 3, 1);
    const sk_grid g = tu_grid(d.seq, d.seq, 64, 64, 1, 2);
    sk_layout_t owned = cpc_layout(CPC_RANDOM, 1, &g, tu_base_seed());
    REQUIRE(owned != NULL, "layout: %s", sk_last_error());
    sk_bsr L;
    sk_layout_view(owned, &L);
    int32_t a[MAX_C], b[MAX_C];
    memset(a, 0, sizeof a);
    memset(b, 0xff, sizeof b);
    CHECK(sk_cp_balance(&d, &L, NULL, a, 9) == SK_STATUS_SUCCESS, "%s", sk_last_error());
    CHECK(sk_cp_balance(&d, &L, NULL, b, 9) == SK_STATUS_SUCCESS, "%s", sk_last_error());
    CHECK(memcmp(a, b, 9 * sizeof(int32_t)) == 0, "two calls differ");
    sk_layout_destroy(owned);
}

/* Status and message (naming the argument) of a failed call. */
static void expect_fail(const char *what, sk_status got, sk_status want, const char *needle) {
    const char *msg = sk_last_error();
    CHECK(got == want, "%s: got %s, want %s (%s)", what, sk_status_name(got), sk_status_name(want),
          msg);
    CHECK(strstr(msg, needle) != NULL, "%s: message \"%s\" lacks \"%s\"", what, msg, needle);
}

/* Bad boundaries in desc->chunk_starts, refused by every call that reads
 * them, nothing written; a V1 descriptor never reads the new fields. */
SK_TEST(cp_bad_chunk_starts) {
    sk_cp_desc d = make_desc(2, SK_CP_SHARDING_ZIGZAG, 64 * 10 - 3, 1);
    sk_bsr L;
    sk_layout_t owned = grid_layout(&d, 1, sk_layout_create_causal, &L);
    REQUIRE(owned != NULL, "layout: %s", sk_last_error());
    static const struct {
        int32_t s[5];
        const char *needle;
    } bad[] = {
        {{1, 3, 5, 7, 10}, "desc->chunk_starts[0] = 1"},
        {{0, 3, 3, 7, 10}, "desc->chunk_starts[2] = 3"},
        {{0, 5, 3, 7, 10}, "desc->chunk_starts[2] = 3"},
        {{0, 3, 5, 11, 10}, "desc->chunk_starts[3] = 11"},
        {{0, 3, 5, 7, 9}, "desc->chunk_starts[4] = 9 must be nb = 10"},
        {{0, 1, 2, 3, 5}, "desc->chunk_starts[4] = 5 must be nb = 10"}, /* blocks of 128 */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        d.chunk_starts = bad[i].s;
        int64_t tok = -7;
        expect_fail("shard", sk_cp_shard(&d, 0, 64, &tok, NULL, NULL, NULL),
                    SK_STATUS_BAD_PARAM_VALUE, bad[i].needle);
        CHECK(tok == -7, "shard wrote tokens");
        size_t pb = 7;
        expect_fail("plan size", sk_cp_plan_size(&d, &L, &pb), SK_STATUS_BAD_PARAM_VALUE,
                    bad[i].needle);
        CHECK(pb == 7, "plan size written");
        uint64_t plan[64];
        memset(plan, 0xab, sizeof plan);
        expect_fail("plan", sk_cp_plan(&d, &L, plan, sizeof plan), SK_STATUS_BAD_PARAM_VALUE,
                    bad[i].needle);
        CHECK(plan[0] == 0xababababababababull, "plan written");
        double ns[2] = {-1, -1};
        expect_fail("predict", sk_cp_predict(&d, &L, NULL, ns, NULL, NULL, NULL),
                    SK_STATUS_BAD_PARAM_VALUE, bad[i].needle);
        CHECK(ns[0] == -1 && ns[1] == -1, "predict written");
    }
    /* A V1 descriptor (the size before chunk_starts): neither new field is
     * read (a pointer that would fault, a reserve out of range). */
    d.chunk_starts = (const int32_t *)(uintptr_t)8;
    d.reserve_sms = -5;
    d.struct_size = offsetof(sk_cp_desc, chunk_starts);
    int64_t tok = 0, s[2], l[2];
    int32_t n = 0;
    CHECK(sk_cp_shard(&d, 1, 64, &tok, &n, s, l) == SK_STATUS_SUCCESS, "V1: %s", sk_last_error());
    CHECK(n == 2 && s[0] == 64 * 2 && l[0] == 64 * 3 && s[1] == 64 * 5 && l[1] == 64 * 2,
          "V1 rank 1: chunks at %lld+%lld, %lld+%lld", (long long)s[0], (long long)l[0],
          (long long)s[1], (long long)l[1]);
    d.struct_size = offsetof(sk_cp_desc, chunk_starts) + 8;
    expect_fail("struct_size", sk_cp_shard(&d, 0, 64, &tok, NULL, NULL, NULL),
                SK_STATUS_BAD_PARAM_STRUCT_SIZE, "sk_cp_desc_init");
    /* reserve_sms. */
    d.struct_size = sizeof d;
    d.chunk_starts = NULL;
    d.reserve_sms = -1;
    expect_fail("reserve -1", sk_cp_shard(&d, 0, 64, &tok, NULL, NULL, NULL),
                SK_STATUS_BAD_PARAM_VALUE, "desc->reserve_sms = -1");
    d.reserve_sms = 1025;
    expect_fail("reserve 1025", sk_cp_plan_size(&d, &L, &(size_t){0}), SK_STATUS_BAD_PARAM_VALUE,
                "desc->reserve_sms = 1025");
    sk_cp_desc fresh;
    sk_cp_desc_init(&fresh, sizeof fresh);
    CHECK(fresh.reserve_sms == 16 && fresh.chunk_starts == NULL, "init: reserve %d",
          (int)fresh.reserve_sms);
    sk_layout_destroy(owned);
}

/* A plan made with equal chunks, a run with other boundaries: refused
 * naming them before any exchange, o and lse untouched. */
SK_TEST(cp_bad_plan_of_other_chunk_starts) {
    sk_cp_desc d = make_desc(2, SK_CP_SHARDING_CONTIGUOUS, 64 * 6, 1);
    d.dtype = SK_DTYPE_F32;
    sk_bsr L;
    sk_layout_t owned = grid_layout(&d, 1, sk_layout_create_causal, &L);
    REQUIRE(owned != NULL, "layout: %s", sk_last_error());
    size_t pb = 0;
    REQUIRE(sk_cp_plan_size(&d, &L, &pb) == SK_STATUS_SUCCESS, "%s", sk_last_error());
    void *plan = malloc(pb);
    REQUIRE(sk_cp_plan(&d, &L, plan, pb) == SK_STATUS_SUCCESS, "%s", sk_last_error());
    const int32_t other[3] = {0, 4, 6};
    d.chunk_starts = other;
    size_t ws = 0;
    expect_fail("workspace", sk_cp_workspace_size(&d, plan, pb, &ws), SK_STATUS_BAD_PARAM_VALUE,
                "plan was made with other chunk boundaries: chunk 1 starts at block 3 there, at 4");
    expect_fail("backward workspace", sk_cp_backward_workspace_size(&d, plan, pb, &ws),
                SK_STATUS_BAD_PARAM_VALUE, "other chunk boundaries");
    CHECK(ws == 0, "workspace size written");
    /* The run (rank 0 of a simulated pair; it fails before the exchange). */
    sk_comm_t comm[2];
    REQUIRE(sk_comm_create_simulated(2, comm) == SK_STATUS_SUCCESS, "%s", sk_last_error());
    const size_t n = (size_t)(2 * 4 * 64 * 4 * 16);
    float *x = calloc(n, sizeof(float)), *o = malloc(n * sizeof(float));
    float *lse = malloc(2 * 4 * 4 * 64 * sizeof(float)), *w = malloc(1 << 20);
    tu_fill_nan(o, SK_DTYPE_F32, (int64_t)n);
    tu_fill_nan(lse, SK_DTYPE_F32, 2 * 4 * 4 * 64);
    expect_fail("forward", sk_cp_forward(&d, plan, pb, comm[0], x, x, x, o, lse, w, 1 << 20, NULL),
                SK_STATUS_BAD_PARAM_VALUE, "other chunk boundaries");
    for (size_t i = 0; i < n; ++i)
        if (!isnan(o[i])) {
            CHECK(0, "o[%zu] written", i);
            break;
        }
    for (size_t i = 0; i < 2 * 4 * 4 * 64; ++i)
        if (!isnan(lse[i])) {
            CHECK(0, "lse[%zu] written", i);
            break;
        }
    free(x), free(o), free(lse), free(w), free(plan);
    sk_comm_destroy(comm[0]);
    sk_comm_destroy(comm[1]);
    sk_layout_destroy(owned);
}

/* sk_cp_balance / sk_cp_predict / sk_cp_cost_default arguments. */
SK_TEST(cp_bad_balance_arguments) {
    sk_cp_desc d = make_desc(3, SK_CP_SHARDING_ZIGZAG, 64 * 20, 1);
    sk_bsr L;
    sk_layout_t owned = grid_layout(&d, 1, sk_layout_create_causal, &L);
    REQUIRE(owned != NULL, "layout: %s", sk_last_error());
    int32_t starts[MAX_C];
    for (int i = 0; i < MAX_C; ++i) starts[i] = -3;
#define UNTOUCHED                                                                                  \
    for (int i = 0; i < MAX_C; ++i)                                                                \
        if (starts[i] != -3) {                                                                     \
            CHECK(0, "starts[%d] written", i);                                                     \
            break;                                                                                 \
        }
    expect_fail("NULL starts", sk_cp_balance(&d, &L, NULL, NULL, 7),
                SK_STATUS_BAD_PARAM_NULL_POINTER, "chunk_starts");
    expect_fail("count", sk_cp_balance(&d, &L, NULL, starts, 6), SK_STATUS_BAD_PARAM_VALUE,
                "count = 6: chunk_starts needs C + 1 = 7");
    UNTOUCHED
    expect_fail("NULL layout", sk_cp_balance(&d, NULL, NULL, starts, 7),
                SK_STATUS_BAD_PARAM_NULL_POINTER, "layout");
    expect_fail("NULL desc", sk_cp_balance(NULL, &L, NULL, starts, 7),
                SK_STATUS_BAD_PARAM_NULL_POINTER, "desc");
    sk_cp_desc short_seq = d;
    short_seq.seq = 64 * 19;
    expect_fail("layout grid", sk_cp_balance(&short_seq, &L, NULL, starts, 7),
                SK_STATUS_BAD_LAYOUT_MISMATCH, "desc->seq");
    static const struct {
        sk_cp_cost c;
        const char *needle;
    } bad[] = {{{-1, 1, 1}, "cost->local_block = -1"},
               {{1, NAN, 1}, "cost->remote_block = nan"},
               {{1, 1, INFINITY}, "cost->tile = inf"},
               {{0, 0, 0}, "all 0"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        expect_fail("cost", sk_cp_balance(&d, &L, &bad[i].c, starts, 7), SK_STATUS_BAD_PARAM_VALUE,
                    bad[i].needle);
        double ns[3] = {-1, -1, -1};
        expect_fail("predict cost", sk_cp_predict(&d, &L, &bad[i].c, ns, NULL, NULL, NULL),
                    SK_STATUS_BAD_PARAM_VALUE, bad[i].needle);
        CHECK(ns[0] == -1, "predict written");
    }
    UNTOUCHED
#undef UNTOUCHED
    /* desc's own boundaries are not read by the balance, bad or not. */
    const int32_t junk[1] = {5};
    d.chunk_starts = junk;
    CHECK(sk_cp_balance(&d, &L, NULL, starts, 7) == SK_STATUS_SUCCESS, "%s", sk_last_error());
    CHECK(starts[0] == 0 && starts[6] == 20, "starts %d .. %d", (int)starts[0], (int)starts[6]);
    expect_fail("default NULL", sk_cp_cost_default(NULL), SK_STATUS_BAD_PARAM_NULL_POINTER, "cost");
    sk_layout_destroy(owned);
}
