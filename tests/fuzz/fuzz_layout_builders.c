/*
 * fuzz_layout_builders.c - the pattern builders of sparsek.h on the fuzzed
 * grid and parameters (part of the fuzz_layout harness).
 *
 * A builder refuses a grid the independent checker refuses, or a parameter
 * outside its documented range, with a status of the rules broken and *out
 * untouched; otherwise it succeeds (or reports ALLOC_FAILED) with a layout
 * the checker accepts, over the grid asked for. Where the problem is small,
 * the content is checked against the header's definition, token by token:
 * dense, causal, window and sinks + window exactly; random by its row
 * counts, its causal candidates and its reproducibility; top-k against the
 * tests' naive selection (tests/common/topk_naive.c). The strided builder
 * is checked for validity only.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/test_util.h"
#include "common/topk_naive.h"
#include "fuzz_layout.h"

/* Content checks run when Sq x (col blocks) is at most this. */
#define CONTENT_CAP (1 << 18)

/* The outcome of a builder call; 1 with *view filled when it succeeded. */
static int outcome(sk_status st, sk_layout_t out, const char *api, const fz_grid_ref *g,
                   int params_ok, const sk_grid *grid, sk_bsr *view) {
    if (!g->ok || !params_ok) {
        fz_statuses allowed = g->fail;
        if (!params_ok) fz_statuses_add(&allowed, SK_STATUS_BAD_PARAM_VALUE);
        fz_check_refused(st, api, &allowed);
        FZ_REQUIRE(out == fl_sentinel(), "%s failed but stored a handle", api);
        return 0;
    }
    fz_check_status(st, api, NULL);
    if (st == SK_STATUS_ALLOC_FAILED) return 0;
    FZ_REQUIRE(st == SK_STATUS_SUCCESS, "%s refused a valid grid and parameters (%s)", api,
               sk_status_name(st));
    fl_view_checked(out, grid, api, view);
    return 1;
}

/* Row geometry: query tokens q0 .. q1 of row block i, their shift to key
 * positions (p = q + Sk - Sq), the key blocks. */
typedef struct geom {
    int64_t sq, sk, bq, bk, rb, cb;
} geom;

static int64_t q_end(const geom *m, int64_t i) {
    return (i + 1) * m->bq < m->sq ? (i + 1) * m->bq : m->sq;
}
static int64_t k_end(const geom *m, int64_t j) {
    return (j + 1) * m->bk < m->sk ? (j + 1) * m->bk : m->sk;
}

/* [a, b] meets key block j. */
static int meets(const geom *m, int64_t j, int64_t a, int64_t b) {
    const int64_t lo = j * m->bk, hi = k_end(m, j) - 1;
    return a <= b && a <= hi && b >= lo;
}

enum { PAT_DENSE, PAT_CAUSAL, PAT_WINDOW, PAT_SINKS };

/* Key block j holds a key that some query of row block i admits. */
static int pattern_keeps(const geom *m, int pat, int64_t x, int64_t y, int64_t i, int64_t j) {
    for (int64_t q = i * m->bq; q < q_end(m, i); ++q) {
        const int64_t p = q + m->sk - m->sq;
        int hit = 0;
        switch (pat) {
        case PAT_DENSE:
            hit = 1;
            break;
        case PAT_CAUSAL:
            hit = meets(m, j, 0, p);
            break;
        case PAT_WINDOW: /* x = left, y = right; p +- a distance may leave int64 */
            hit = meets(m, j, x > p ? INT64_MIN / 4 : p - x,
                        y > INT64_MAX / 4 ? INT64_MAX / 4 : p + y);
            break;
        default: /* sinks: x sink tokens, y window tokens, causal */
            hit = meets(m, j, 0, (x - 1 < p ? x - 1 : p)) ||
                  meets(m, j, y > p ? INT64_MIN / 4 : p - y + 1, p);
            break;
        }
        if (hit) return 1;
    }
    return 0;
}

static void check_pattern(const sk_bsr *v, const geom *m, const fz_grid_ref *g, int pat, int64_t x,
                          int64_t y, const char *api) {
    if ((double)m->sq * (double)m->cb > CONTENT_CAP) return;
    uint8_t *sel = (uint8_t *)malloc((size_t)m->cb), *want = (uint8_t *)malloc((size_t)m->cb);
    for (int64_t i = 0; i < m->rb; ++i) {
        for (int64_t j = 0; j < m->cb; ++j) want[j] = (uint8_t)pattern_keeps(m, pat, x, y, i, j);
        for (int64_t s = 0; s < g->slices; ++s) { /* the same pattern in every slice */
            fz_layout_row(v, m->rb, s, i, m->cb, sel);
            for (int64_t j = 0; j < m->cb; ++j)
                FZ_REQUIRE(sel[j] == want[j], "%s: slice %lld row block %lld key block %lld is %s",
                           api, (long long)s, (long long)i, (long long)j,
                           want[j] ? "missing" : "extra");
        }
    }
    free(sel);
    free(want);
}

/* A causal pair in (i, j): the last query's position reaches the block. */
static int has_causal(const geom *m, int64_t i, int64_t j) {
    return j * m->bk <= q_end(m, i) - 1 + m->sk - m->sq;
}

static void check_random(const layout_case *k, const sk_bsr *v, const geom *m, const fz_grid_ref *g,
                         int causal) {
    if ((double)m->sq * (double)m->cb > CONTENT_CAP) return;
    for (int64_t s = 0; s < g->slices; ++s)
        for (int64_t i = 0; i < m->rb; ++i) {
            int64_t n = 0;
            for (int64_t j = 0; j < m->cb; ++j) n += !causal || has_causal(m, i, j);
            const int64_t gr = s * m->rb + i;
            const int64_t want = k->rand_k < n ? k->rand_k : n;
            FZ_REQUIRE(v->row_offsets[gr + 1] - v->row_offsets[gr] == want,
                       "sk_layout_create_random: row %lld has %d blocks, want min(k, %lld)",
                       (long long)gr, (int)(v->row_offsets[gr + 1] - v->row_offsets[gr]),
                       (long long)n);
            for (int32_t e = v->row_offsets[gr]; e < v->row_offsets[gr + 1]; ++e)
                FZ_REQUIRE(!causal || has_causal(m, i, v->col_indices[e]),
                           "sk_layout_create_random: row %lld picks block %d with no causal pair",
                           (long long)gr, (int)v->col_indices[e]);
        }
    /* Reproducible from the seed. */
    sk_layout_t again = NULL;
    FZ_REQUIRE(sk_layout_create_random(&again, &k->grid, k->rand_k, k->builder_seed, causal) ==
                   SK_STATUS_SUCCESS,
               "sk_layout_create_random: a second call failed");
    sk_bsr w;
    sk_layout_view(again, &w);
    fz_layout_require_equal(&w, v, g->total_rows, "sk_layout_create_random (same seed twice)");
    sk_layout_destroy(again);
}

/* Scores [slices, rb, cb]: halves in [-2, 2], with NaN, +-inf and -0. */
static float *make_scores(const layout_case *k, int64_t n) {
    float *s = (float *)malloc((size_t)n * sizeof(float));
    tu_rng rng;
    tu_rng_seed(&rng, k->builder_seed);
    static const float special[4] = {NAN, INFINITY, -INFINITY, -0.0f};
    for (int64_t x = 0; x < n; ++x) {
        const uint64_t r = tu_rng_next(&rng);
        s[x] = (r & 15) == 0 ? special[(r >> 4) & 3] : 0.5f * (float)((int64_t)((r >> 8) % 9) - 4);
    }
    return s;
}

static void check_topk(const layout_case *k, const sk_bsr *v, const geom *m, const fz_grid_ref *g,
                       const float *scores) {
    /* The naive selection costs min(k, cb) passes over a row. */
    const double passes = k->topk_k < m->cb ? (double)k->topk_k + 1.0 : (double)m->cb;
    if ((double)m->sq * (double)m->cb > CONTENT_CAP ||
        (double)g->total_rows * (double)m->cb * passes > CONTENT_CAP * 16.0)
        return;
    tk_problem t;
    memset(&t, 0, sizeof t);
    sk_topk_desc_init(&t.desc, sizeof t.desc);
    t.desc.seq_q = m->sq;
    t.desc.seq_k = m->sk;
    t.desc.block_q = (int32_t)m->bq;
    t.desc.block_k = (int32_t)m->bk;
    t.desc.k = k->topk_k;
    t.desc.sink_blocks = k->topk_sink;
    t.desc.local_blocks = k->topk_local;
    t.desc.mask = (k->causal_bits & 4) ? SK_MASK_CAUSAL : SK_MASK_NONE;
    uint8_t *cand = (uint8_t *)malloc((size_t)m->cb), *forced = (uint8_t *)malloc((size_t)m->cb);
    uint8_t *want = (uint8_t *)malloc((size_t)m->cb), *got = (uint8_t *)malloc((size_t)m->cb);
    double *row = (double *)malloc((size_t)m->cb * sizeof(double));
    for (int64_t i = 0; i < m->rb; ++i) {
        tk_row_sets(&t, (int32_t)i, cand, forced);
        for (int64_t s = 0; s < g->slices; ++s) {
            for (int64_t j = 0; j < m->cb; ++j) row[j] = scores[(s * m->rb + i) * m->cb + j];
            tk_naive_select_row(&t, cand, forced, row, want);
            fz_layout_row(v, m->rb, s, i, m->cb, got);
            for (int64_t j = 0; j < m->cb; ++j)
                FZ_REQUIRE(got[j] == want[j],
                           "sk_layout_create_topk: slice %lld row block %lld key block %lld is %s",
                           (long long)s, (long long)i, (long long)j, want[j] ? "missing" : "extra");
        }
    }
    free(cand);
    free(forced);
    free(want);
    free(got);
    free(row);
}

void fl_check_builders(const layout_case *k, const fz_grid_ref *g) {
    const sk_grid *grid = &k->grid;
    fz_set_case(
        "builders on grid rows %lld cols %lld blocks %d x %d batch %d heads %d: window %lld "
        "%lld, sinks %lld %lld, strided %d %d, random k %d, topk k %d sink %d local %d, "
        "causal bits %d",
        (long long)grid->rows, (long long)grid->cols, (int)grid->block_rows, (int)grid->block_cols,
        (int)grid->batch, (int)grid->heads, (long long)k->win_left, (long long)k->win_right,
        (long long)k->sink_tokens, (long long)k->window_tokens, (int)k->stride,
        (int)k->local_blocks, (int)k->rand_k, (int)k->topk_k, (int)k->topk_sink, (int)k->topk_local,
        (int)k->causal_bits);
    const int small = g->ok && g->dense <= FL_DENSE_CAP;
    geom m = {grid->rows,       grid->cols,    grid->block_rows,
              grid->block_cols, g->row_blocks, g->col_blocks};
    sk_layout_t out;
    sk_bsr v;
    int ok;

/* A builder with parameters it must refuse is also called on a valid
 * grid too large to build; top-k is not, as it reads the grid's scores. */
#define FL_BUILD(api, params_ok, call)                                                             \
    do {                                                                                           \
        ok = 0;                                                                                    \
        if (small || !g->ok || (!(params_ok) && strcmp(api, "sk_layout_create_topk") != 0)) {      \
            out = fl_sentinel();                                                                   \
            ok = outcome((call), out, api, g, (params_ok), grid, &v);                              \
        }                                                                                          \
    } while (0)

    FL_BUILD("sk_layout_create_dense", 1, sk_layout_create_dense(&out, grid));
    if (ok) check_pattern(&v, &m, g, PAT_DENSE, 0, 0, "sk_layout_create_dense");
    if (ok) sk_layout_destroy(out);

    FL_BUILD("sk_layout_create_causal", 1, sk_layout_create_causal(&out, grid));
    if (ok) check_pattern(&v, &m, g, PAT_CAUSAL, 0, 0, "sk_layout_create_causal");
    if (ok) sk_layout_destroy(out);

    FL_BUILD("sk_layout_create_window", k->win_left >= 0 && k->win_right >= 0,
             sk_layout_create_window(&out, grid, k->win_left, k->win_right));
    if (ok)
        check_pattern(&v, &m, g, PAT_WINDOW, k->win_left, k->win_right, "sk_layout_create_window");
    if (ok) sk_layout_destroy(out);

    FL_BUILD("sk_layout_create_sinks_window", k->sink_tokens >= 0 && k->window_tokens >= 1,
             sk_layout_create_sinks_window(&out, grid, k->sink_tokens, k->window_tokens));
    if (ok)
        check_pattern(&v, &m, g, PAT_SINKS, k->sink_tokens, k->window_tokens,
                      "sk_layout_create_sinks_window");
    if (ok) sk_layout_destroy(out);

    FL_BUILD("sk_layout_create_strided", k->stride >= 1 && k->local_blocks >= 0,
             sk_layout_create_strided(&out, grid, k->stride, k->local_blocks, k->causal_bits & 1));
    if (ok) sk_layout_destroy(out);

    FL_BUILD(
        "sk_layout_create_random", k->rand_k >= 0,
        sk_layout_create_random(&out, grid, k->rand_k, k->builder_seed, (k->causal_bits >> 1) & 1));
    if (ok) check_random(k, &v, &m, g, (k->causal_bits >> 1) & 1);
    if (ok) sk_layout_destroy(out);

    /* Top-k reads [slices, rb, cb] scores: a small stand-in when the grid
     * is refused (it must be refused before any score is read). */
    const int64_t n_scores = small ? g->dense : 4;
    float *scores = make_scores(k, n_scores);
    sk_topk_options opt = {k->topk_k, k->topk_sink, k->topk_local, (k->causal_bits >> 2) & 1};
    FL_BUILD("sk_layout_create_topk", opt.k >= 0 && opt.sink_blocks >= 0 && opt.local_blocks >= 0,
             sk_layout_create_topk(&out, grid, scores, &opt));
    if (ok) check_topk(k, &v, &m, g, scores);
    if (ok) sk_layout_destroy(out);
    free(scores);
#undef FL_BUILD
}
