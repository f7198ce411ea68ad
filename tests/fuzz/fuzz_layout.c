/*
 * fuzz_layout.c - libFuzzer harness (a): a grid and BSR arrays from raw
 * bytes (layout_case.h) through every layout entry point, on the CPU.
 *
 * Properties, each a finding when broken:
 *  - sk_grid_blocks and sk_layout_validate give the verdict of the
 *    independent checker (fz_layout_ref.h): success with its counts, or a
 *    failure whose status belongs to the rules broken, outputs untouched;
 *  - a valid layout survives the round trips unchanged: to_mask ->
 *    create_from_mask, to_flex -> create_from_flex (also from a padded,
 *    unsorted flex form, possibly broken by the edits), create_from_bsr; an
 *    invalid one (or a buffer one element short) is refused by each, with
 *    nothing written and no handle stored;
 *  - a small CPU attention over a valid layout matches the dense fp64
 *    reference masked by it (fz_attn_ref.h: tails, causal, empty rows);
 *  - the builders (fuzz_layout_builders.c).
 * Arrays are allocated at exactly their documented lengths, so any read
 * beyond them is an AddressSanitizer report. Sizes are capped (rows,
 * dense blocks, attention work) to keep an execution well below 1 ms.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/test_util.h"
#include "fz_attn_ref.h"
#include "fuzz_layout.h"

enum { ROW_CAP = 4096, NNZ_CAP = 1 << 16 };
#define ATTN_WORK_CAP 2.0e5

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static double sentinel_storage[4];

sk_layout_t fl_sentinel(void) {
    return (sk_layout_t)(void *)sentinel_storage;
}

void fl_view_checked(sk_layout_t out, const sk_grid *grid, const char *api, sk_bsr *view) {
    FZ_REQUIRE(out != NULL && out != fl_sentinel(), "%s succeeded without a handle", api);
    FZ_REQUIRE(sk_layout_view(out, view) == SK_STATUS_SUCCESS, "sk_layout_view: %s",
               sk_last_error());
    fz_layout_ref r;
    fz_layout_ref_eval(view, &r);
    FZ_REQUIRE(r.ok, "%s built a layout that is not valid (independent check)", api);
    FZ_REQUIRE(memcmp(&view->grid, grid, sizeof *grid) == 0, "%s: the layout's grid differs", api);
}

/* ---------------------------------------------------------------------------
 * The grid
 * ------------------------------------------------------------------------- */

static void check_grid_blocks(const layout_case *k, const fz_grid_ref *g) {
    int32_t out[3] = {-7, -7, -7};
    int32_t *ptr[3] = {&out[0], &out[1], &out[2]};
    if (k->flags & LC_GRID_NULLS)
        for (int i = 0; i < 3; ++i)
            if ((k->builder_seed >> i) & 1) ptr[i] = NULL;
    const sk_status st = sk_grid_blocks(&k->grid, ptr[0], ptr[1], ptr[2]);
    if (!g->ok) {
        fz_check_refused(st, "sk_grid_blocks", &g->fail);
        FZ_REQUIRE(out[0] == -7 && out[1] == -7 && out[2] == -7, "sk_grid_blocks failed but wrote");
        return;
    }
    fz_check_status(st, "sk_grid_blocks", NULL);
    FZ_REQUIRE(st == SK_STATUS_SUCCESS, "sk_grid_blocks refused a valid grid (%s)",
               sk_status_name(st));
    const int64_t want[3] = {g->row_blocks, g->col_blocks, g->slices};
    for (int i = 0; i < 3; ++i)
        FZ_REQUIRE(ptr[i] == NULL || out[i] == want[i], "sk_grid_blocks output %d = %d, want %lld",
                   i, (int)out[i], (long long)want[i]);
}

/* ---------------------------------------------------------------------------
 * BSR arrays from the mask, then the edits
 * ------------------------------------------------------------------------- */

typedef struct arrays {
    int32_t *off, *idx;
    int64_t n_off, n_idx;
    int32_t *off_copy, *idx_copy; /* to check that no call writes them */
    sk_bsr bsr;
} arrays;

/* 0 when the grid is valid but too large to hold arrays. */
static int build_arrays(const layout_case *k, const fz_grid_ref *g, arrays *a) {
    memset(a, 0, sizeof *a);
    a->bsr.grid = k->grid;
    if (!g->ok) {
        /* The grid must be refused before any array is read. */
        a->n_off = a->n_idx = 1;
        a->off = (int32_t *)calloc(1, 4);
        a->idx = (int32_t *)calloc(1, 4);
        a->bsr.nnz = 0;
    } else {
        if (g->total_rows > ROW_CAP || g->dense > FL_DENSE_CAP) return 0;
        const int64_t rows = g->total_rows, cb = g->col_blocks;
        uint8_t *sel = (uint8_t *)malloc((size_t)(rows * cb));
        for (int64_t bit = 0; bit < rows * cb; ++bit)
            sel[bit] = (uint8_t)layout_case_mask_bit(k, bit);
        const int made = fz_layout_from_mask(sel, rows, cb, k->nnz_delta, NNZ_CAP, &a->off, &a->idx,
                                             &a->bsr.nnz);
        free(sel);
        if (!made) return 0;
        a->n_off = rows + 1;
        a->n_idx = a->bsr.nnz > 0 ? a->bsr.nnz : 0;
    }
    if (!(k->flags & LC_FLEX_EDITS))
        fz_edits_apply(k->edits, k->n_edits, a->off, a->n_off, a->idx, a->n_idx);
    a->off_copy = (int32_t *)malloc((size_t)a->n_off * 4 + 4);
    a->idx_copy = (int32_t *)malloc((size_t)a->n_idx * 4 + 4);
    memcpy(a->off_copy, a->off, (size_t)a->n_off * 4);
    if (a->n_idx > 0) memcpy(a->idx_copy, a->idx, (size_t)a->n_idx * 4);
    a->bsr.row_offsets = (k->flags & LC_NULL_OFFSETS) ? NULL : a->off;
    a->bsr.col_indices = (k->flags & LC_NULL_INDICES) ? NULL : a->idx;
    return 1;
}

static void require_arrays_unchanged(const arrays *a, const char *api) {
    FZ_REQUIRE(memcmp(a->off, a->off_copy, (size_t)a->n_off * 4) == 0 &&
                   (a->n_idx == 0 || memcmp(a->idx, a->idx_copy, (size_t)a->n_idx * 4) == 0),
               "%s wrote into the layout it was given", api);
}

static void free_arrays(arrays *a) {
    free(a->off);
    free(a->idx);
    free(a->off_copy);
    free(a->idx_copy);
}

/* ---------------------------------------------------------------------------
 * Conversions
 * ------------------------------------------------------------------------- */

/* A handle `api` stored: equal to want; destroyed. */
static void require_same_layout(sk_status st, sk_layout_t out, const sk_bsr *want,
                                int64_t total_rows, const char *api) {
    fz_check_status(st, api, NULL);
    FZ_REQUIRE(st == SK_STATUS_SUCCESS, "%s refused a valid layout (%s)", api, sk_status_name(st));
    sk_bsr view;
    fl_view_checked(out, &want->grid, api, &view);
    fz_layout_require_equal(&view, want, total_rows, api);
    sk_layout_destroy(out);
}

static void check_refused_handle(sk_status st, sk_layout_t out, const char *api,
                                 const fz_statuses *allowed) {
    fz_check_refused(st, api, allowed);
    FZ_REQUIRE(out == fl_sentinel(), "%s failed but stored a handle", api);
}

static void check_mask(const layout_case *k, const fz_layout_ref *r, const arrays *a) {
    const int short_buf = (k->flags & LC_SHORT) && r->grid.ok;
    const int64_t bytes = r->grid.ok ? r->grid.dense - short_buf : 16;
    uint8_t *mask = (uint8_t *)malloc((size_t)bytes);
    memset(mask, 0xAB, (size_t)bytes);
    const sk_status st = sk_layout_to_mask(&a->bsr, mask, (size_t)bytes);
    require_arrays_unchanged(a, "sk_layout_to_mask");
    if (!r->ok || short_buf) {
        fz_statuses allowed = r->fail;
        if (short_buf) fz_statuses_add(&allowed, SK_STATUS_BAD_PARAM_SHAPE);
        fz_check_refused(st, "sk_layout_to_mask", &allowed);
        for (int64_t x = 0; x < bytes; ++x)
            FZ_REQUIRE(mask[x] == 0xAB, "sk_layout_to_mask failed but wrote byte %lld",
                       (long long)x);
    } else {
        fz_check_status(st, "sk_layout_to_mask", NULL);
        FZ_REQUIRE(st == SK_STATUS_SUCCESS, "sk_layout_to_mask refused a valid layout");
        const int64_t cb = r->grid.col_blocks;
        for (int64_t g = 0; g < r->grid.total_rows; ++g) {
            uint8_t *row = (uint8_t *)calloc((size_t)cb, 1);
            for (int32_t e = a->off[g]; e < a->off[g + 1]; ++e) row[a->idx[e]] = 1;
            for (int64_t j = 0; j < cb; ++j)
                FZ_REQUIRE(mask[g * cb + j] == row[j],
                           "sk_layout_to_mask: row %lld block %lld is %d", (long long)g,
                           (long long)j, mask[g * cb + j]);
            free(row);
        }
        sk_layout_t out = fl_sentinel();
        const sk_status st2 = sk_layout_create_from_mask(&out, &a->bsr.grid, mask);
        require_same_layout(st2, out, &a->bsr, r->grid.total_rows, "sk_layout_create_from_mask");
    }
    if (!r->grid.ok) {
        sk_layout_t out = fl_sentinel();
        const sk_status st2 = sk_layout_create_from_mask(&out, &a->bsr.grid, mask);
        check_refused_handle(st2, out, "sk_layout_create_from_mask", &r->grid.fail);
    }
    free(mask);
}

/* sk_layout_to_flex: counts and the row permutations of sparsek.h. */
static void check_to_flex(const layout_case *k, const fz_layout_ref *r, const arrays *a) {
    const int short_buf = (k->flags & LC_SHORT) && r->grid.ok;
    const int which = (int)(k->builder_seed & 1); /* 0: counts short, 1: indices short */
    const int64_t n_counts = r->grid.ok ? r->grid.total_rows - (short_buf && !which) : 4;
    const int64_t n_ind = r->grid.ok ? r->grid.dense - (short_buf && which) : 4;
    int32_t *counts = (int32_t *)malloc((size_t)n_counts * 4);
    int32_t *ind = (int32_t *)malloc((size_t)n_ind * 4);
    memset(counts, 0xAB, (size_t)n_counts * 4);
    memset(ind, 0xAB, (size_t)n_ind * 4);
    const sk_status st = sk_layout_to_flex(&a->bsr, counts, (size_t)n_counts, ind, (size_t)n_ind);
    require_arrays_unchanged(a, "sk_layout_to_flex");
    if (!r->ok || short_buf) {
        fz_statuses allowed = r->fail;
        if (short_buf) fz_statuses_add(&allowed, SK_STATUS_BAD_PARAM_SHAPE);
        fz_check_refused(st, "sk_layout_to_flex", &allowed);
        const uint8_t *cb8 = (const uint8_t *)counts, *ib8 = (const uint8_t *)ind;
        for (int64_t x = 0; x < n_counts * 4; ++x)
            FZ_REQUIRE(cb8[x] == 0xAB, "sk_layout_to_flex failed but wrote counts");
        for (int64_t x = 0; x < n_ind * 4; ++x)
            FZ_REQUIRE(ib8[x] == 0xAB, "sk_layout_to_flex failed but wrote indices");
    } else {
        fz_check_status(st, "sk_layout_to_flex", NULL);
        FZ_REQUIRE(st == SK_STATUS_SUCCESS, "sk_layout_to_flex refused a valid layout");
        const int64_t cb = r->grid.col_blocks;
        for (int64_t g = 0; g < r->grid.total_rows; ++g) {
            const int32_t n = a->off[g + 1] - a->off[g];
            FZ_REQUIRE(counts[g] == n, "sk_layout_to_flex: counts[%lld] = %d, want %d",
                       (long long)g, (int)counts[g], (int)n);
            /* Selected blocks increasing, then the others increasing. */
            int64_t w = 0;
            for (int32_t e = a->off[g]; e < a->off[g + 1]; ++e, ++w)
                FZ_REQUIRE(ind[g * cb + w] == a->idx[e], "sk_layout_to_flex: row %lld entry %lld",
                           (long long)g, (long long)w);
            for (int64_t j = 0, e = a->off[g]; j < cb; ++j) {
                if (e < a->off[g + 1] && a->idx[e] == j) {
                    ++e;
                    continue;
                }
                FZ_REQUIRE(ind[g * cb + w] == j,
                           "sk_layout_to_flex: row %lld entry %lld is %d, want unselected %lld",
                           (long long)g, (long long)w, (int)ind[g * cb + w], (long long)j);
                ++w;
            }
        }
        sk_layout_t out = fl_sentinel();
        const sk_status st2 =
            sk_layout_create_from_flex(&out, &a->bsr.grid, counts, ind, (int32_t)cb);
        require_same_layout(st2, out, &a->bsr, r->grid.total_rows, "sk_layout_create_from_flex");
    }
    if (!r->grid.ok) {
        sk_layout_t out = fl_sentinel();
        const sk_status st2 = sk_layout_create_from_flex(&out, &a->bsr.grid, counts, ind, 1);
        check_refused_handle(st2, out, "sk_layout_create_from_flex", &r->grid.fail);
    }
    free(counts);
    free(ind);
}

/* create_from_flex from a padded form: each row's blocks in decreasing
 * order, then junk, row_width above the longest row; with LC_FLEX_EDITS
 * the edits break counts and indices, and the verdict is checked. */
static void check_from_flex_padded(const layout_case *k, const fz_layout_ref *r, const arrays *a) {
    const int64_t rows = r->grid.total_rows, cb = r->grid.col_blocks;
    int32_t longest = 0;
    for (int64_t g = 0; g < rows; ++g)
        if (a->off[g + 1] - a->off[g] > longest) longest = a->off[g + 1] - a->off[g];
    const int32_t rw = longest + (int32_t)(k->data_seed % 3) + (longest == 0);
    if (rows * rw > 2 * FL_DENSE_CAP) return;
    int32_t *counts = (int32_t *)malloc((size_t)rows * 4);
    int32_t *ind = (int32_t *)malloc((size_t)(rows * rw) * 4);
    for (int64_t g = 0; g < rows; ++g) {
        const int32_t n = a->off[g + 1] - a->off[g];
        counts[g] = n;
        for (int32_t e = 0; e < rw; ++e)
            ind[g * rw + e] =
                e < n ? a->idx[a->off[g + 1] - 1 - e] : (int32_t)(cb + e) * (e & 1 ? -1 : 1);
    }
    if (k->flags & LC_FLEX_EDITS)
        fz_edits_apply(k->edits, k->n_edits, counts, rows, ind, rows * rw);
    /* The independent verdict, and the layout a success must equal. */
    fz_statuses bad = {0};
    int64_t nnz = 0;
    uint8_t *sel = (uint8_t *)malloc((size_t)cb);
    for (int64_t g = 0; g < rows; ++g) {
        if (counts[g] < 0 || counts[g] > cb || counts[g] > rw) {
            fz_statuses_add(&bad, SK_STATUS_BAD_LAYOUT_COUNT);
            continue;
        }
        memset(sel, 0, (size_t)cb);
        for (int32_t e = 0; e < counts[g]; ++e) {
            const int32_t x = ind[g * rw + e];
            if (x < 0 || x >= cb)
                fz_statuses_add(&bad, SK_STATUS_BAD_LAYOUT_INDEX_RANGE);
            else if (sel[x]++)
                fz_statuses_add(&bad, SK_STATUS_BAD_LAYOUT_DUPLICATE);
        }
        nnz += counts[g];
    }
    sk_layout_t out = fl_sentinel();
    const sk_status st = sk_layout_create_from_flex(&out, &a->bsr.grid, counts, ind, rw);
    if (bad.n > 0) {
        check_refused_handle(st, out, "sk_layout_create_from_flex", &bad);
    } else {
        arrays want;
        memset(&want, 0, sizeof want);
        want.bsr.grid = a->bsr.grid;
        want.bsr.nnz = (int32_t)nnz;
        want.off = (int32_t *)malloc((size_t)(rows + 1) * 4);
        want.idx = (int32_t *)malloc((size_t)(nnz + 1) * 4);
        int32_t n = 0;
        want.off[0] = 0;
        for (int64_t g = 0; g < rows; ++g) {
            memset(sel, 0, (size_t)cb);
            for (int32_t e = 0; e < counts[g]; ++e) sel[ind[g * rw + e]] = 1;
            for (int64_t j = 0; j < cb; ++j)
                if (sel[j]) want.idx[n++] = (int32_t)j;
            want.off[g + 1] = n;
        }
        want.bsr.row_offsets = want.off;
        want.bsr.col_indices = want.idx;
        require_same_layout(st, out, &want.bsr, rows, "sk_layout_create_from_flex (padded)");
        free(want.off);
        free(want.idx);
    }
    free(sel);
    free(counts);
    free(ind);
}

static void check_copy(const fz_layout_ref *r, const arrays *a) {
    sk_layout_t out = fl_sentinel();
    const sk_status st = sk_layout_create_from_bsr(&out, &a->bsr);
    require_arrays_unchanged(a, "sk_layout_create_from_bsr");
    if (r->ok)
        require_same_layout(st, out, &a->bsr, r->grid.total_rows, "sk_layout_create_from_bsr");
    else
        check_refused_handle(st, out, "sk_layout_create_from_bsr", &r->fail);
}

/* ---------------------------------------------------------------------------
 * A small attention over a valid layout
 * ------------------------------------------------------------------------- */

/* Hq and Hkv for the grid's heads (the layout's slices must map). */
static void pick_heads(const layout_case *k, int64_t *hq, int64_t *hkv) {
    const int64_t H = k->grid.heads, x = k->heads_sel / 3;
    switch (k->heads_sel % 3) {
    case 0: /* heads == Hq: Hkv a divisor of it */
        *hq = H;
        *hkv = 1 + x % H;
        while (H % *hkv != 0) --*hkv;
        break;
    case 1: /* heads == Hkv */
        *hkv = H;
        *hq = H * (1 + x % 3);
        break;
    default: /* heads == 1 broadcasts, or as case 0 */
        *hkv = H == 1 ? 1 + x % 2 : H;
        *hq = *hkv * (1 + (x / 2) % 2);
        break;
    }
}

static void check_attention(const layout_case *k, const arrays *a) {
    static const sk_dtype dtypes[3] = {SK_DTYPE_F32, SK_DTYPE_F16, SK_DTYPE_BF16};
    sk_attention_desc d;
    sk_attention_desc_init(&d, sizeof d);
    d.backend = SK_BACKEND_CPU;
    d.dtype = dtypes[k->dtype % 3];
    d.batch = k->grid.batch == 1 ? 1 + k->batch_sel % 2 : k->grid.batch;
    d.seq_q = k->grid.rows;
    d.seq_k = k->grid.cols;
    pick_heads(k, &d.heads_q, &d.heads_kv);
    d.head_dim = 1 + k->head_dim % 8;
    d.scale = k->scale;
    d.mask = (k->flags & LC_CAUSAL) ? SK_MASK_CAUSAL : SK_MASK_NONE;
    fz_attn at;
    fz_attn_from_desc(&at, &d);
    if (fz_attn_work(&at) > ATTN_WORK_CAP) return;
    fz_set_case("attention B%lld Sq%lld Sk%lld Hq%lld Hkv%lld D%lld dtype %d scale %g causal %d "
                "over grid %lld x %lld blocks %d x %d batch %d heads %d",
                (long long)d.batch, (long long)d.seq_q, (long long)d.seq_k, (long long)d.heads_q,
                (long long)d.heads_kv, (long long)d.head_dim, (int)d.dtype, (double)d.scale,
                (int)d.mask, (long long)k->grid.rows, (long long)k->grid.cols,
                (int)k->grid.block_rows, (int)k->grid.block_cols, (int)k->grid.batch,
                (int)k->grid.heads);
    tu_rng rng;
    tu_rng_seed(&rng, k->data_seed);
    const double mag = ldexp(1.0, (int)(k->magnitude % 9) - 4);
    void *q = malloc((size_t)at.q.bytes), *kk = malloc((size_t)at.k.bytes);
    void *v = malloc((size_t)at.v.bytes), *o = malloc((size_t)at.o.bytes);
    const int64_t lse_n = d.batch * d.heads_q * d.seq_q;
    float *lse = (k->flags & LC_LSE) ? (float *)malloc((size_t)lse_n * 4) : NULL;
    fz_tensor_fill(&at.q, q, &rng, mag);
    fz_tensor_fill(&at.k, kk, &rng, mag);
    fz_tensor_fill(&at.v, v, &rng, 1.0);
    memset(o, 0xFF, (size_t)at.o.bytes);
    if (lse != NULL) memset(lse, 0xFF, (size_t)lse_n * 4);
    const int run = (k->flags & LC_RUN) != 0;
    const char *api = run ? "sk_attention_run" : "sk_attention_forward";
    const sk_status st = run ? sk_attention_run(&d, &a->bsr, q, kk, v, o, lse, NULL, 0, NULL)
                             : sk_attention_forward(&d, &a->bsr, q, kk, v, o, lse, NULL, 0, NULL);
    require_arrays_unchanged(a, api);
    const int refused = fz_scale_refused(d.scale);
    if (refused == 1) {
        fz_statuses allowed = {0};
        fz_statuses_add(&allowed, SK_STATUS_BAD_PARAM_VALUE);
        fz_check_refused(st, api, &allowed);
    } else if (refused == -1) {
        fz_check_status(st, api, NULL);
    } else {
        fz_check_status(st, api, NULL);
        FZ_REQUIRE(st == SK_STATUS_SUCCESS || st == SK_STATUS_ALLOC_FAILED,
                   "%s refused a valid problem (%s)", api, sk_status_name(st));
        if (st == SK_STATUS_SUCCESS) fz_check_attention(&at, &a->bsr, q, kk, v, o, lse, api);
    }
    free(q);
    free(kk);
    free(v);
    free(o);
    free(lse);
}

/* ---------------------------------------------------------------------------
 * The entry point
 * ------------------------------------------------------------------------- */

static void check_layout(const layout_case *k, const fz_grid_ref *g) {
    arrays a;
    if (!build_arrays(k, g, &a)) return;
    fz_layout_ref r;
    fz_layout_ref_eval(&a.bsr, &r);
    const sk_status st = sk_layout_validate(&a.bsr);
    require_arrays_unchanged(&a, "sk_layout_validate");
    if (r.ok) {
        fz_check_status(st, "sk_layout_validate", NULL);
        FZ_REQUIRE(st == SK_STATUS_SUCCESS, "sk_layout_validate refused a valid layout (%s)",
                   sk_status_name(st));
    } else {
        fz_check_refused(st, "sk_layout_validate", &r.fail);
    }
    check_mask(k, &r, &a);
    check_to_flex(k, &r, &a);
    check_copy(&r, &a);
    if (r.ok) {
        check_from_flex_padded(k, &r, &a);
        check_attention(k, &a);
    }
    free_arrays(&a);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    layout_case k;
    memset(&k, 0, sizeof k);
    fz_codec c;
    fz_codec_reader(&c, data, size);
    layout_case_code(&c, &k);
    fz_set_case("grid rows %lld cols %lld blocks %d x %d batch %d heads %d, flags 0x%02x, nnz "
                "delta %d, %d edits",
                (long long)k.grid.rows, (long long)k.grid.cols, (int)k.grid.block_rows,
                (int)k.grid.block_cols, (int)k.grid.batch, (int)k.grid.heads, k.flags,
                (int)k.nnz_delta, (int)k.n_edits);
    fz_grid_ref g;
    fz_grid_ref_eval(&k.grid, &g);
    check_grid_blocks(&k, &g);
    check_layout(&k, &g);
    fl_check_builders(&k, &g);
    return 0;
}
