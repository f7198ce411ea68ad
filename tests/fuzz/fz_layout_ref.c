/*
 * fz_layout_ref.c - see fz_layout_ref.h. Shares nothing with src/: exact
 * integer arithmetic through the compiler's overflow builtins.
 */
#include "fz_layout_ref.h"

#include <string.h>

void fz_grid_ref_eval(const sk_grid *g, fz_grid_ref *r) {
    memset(r, 0, sizeof *r);
    int bad = 0;
    if (g->rows < 1 || g->cols < 1 || g->batch < 1 || g->heads < 1) {
        fz_statuses_add(&r->fail, SK_STATUS_BAD_PARAM_SHAPE);
        bad = 1;
    }
    if ((g->block_rows != 64 && g->block_rows != 128) ||
        (g->block_cols != 64 && g->block_cols != 128)) {
        /* A block size is a scalar out of range, or a shape: either reads right. */
        fz_statuses_add(&r->fail, SK_STATUS_BAD_PARAM_VALUE);
        fz_statuses_add(&r->fail, SK_STATUS_BAD_PARAM_SHAPE);
        bad = 1;
    }
    if (bad) return;
    /* rows >= 1: (rows - 1) / b + 1 is the ceiling without overflow. */
    const int64_t rb = (g->rows - 1) / g->block_rows + 1;
    const int64_t cb = (g->cols - 1) / g->block_cols + 1;
    const int64_t slices = (int64_t)g->batch * g->heads;
    int64_t total, dense = 0;
    /* total + 1 offsets and the column indices are int32; the dense count
     * total x cb is not bounded (issue 33), only computed (< 2^62). */
    if (__builtin_mul_overflow(slices, rb, &total) || total >= INT32_MAX || cb > INT32_MAX ||
        __builtin_mul_overflow(total, cb, &dense)) {
        fz_statuses_add(&r->fail, SK_STATUS_BAD_LAYOUT_OVERFLOW);
        fz_statuses_add(&r->fail, SK_STATUS_BAD_PARAM_OVERFLOW);
        return;
    }
    r->ok = 1;
    r->row_blocks = rb;
    r->col_blocks = cb;
    r->slices = slices;
    r->total_rows = total;
    r->dense = dense;
}

/* The first broken rule among the row indices, in row-major order. */
static void check_indices(const sk_bsr *l, int64_t rows, int64_t cb, fz_layout_ref *r) {
    const int32_t *off = l->row_offsets, *idx = l->col_indices;
    for (int64_t g = 0; g < rows; ++g)
        for (int64_t e = off[g]; e < off[g + 1]; ++e) {
            const int32_t x = idx[e];
            const int first = e == off[g];
            if (x < 0 || x >= cb) fz_statuses_add(&r->fail, SK_STATUS_BAD_LAYOUT_INDEX_RANGE);
            if (!first && x == idx[e - 1])
                fz_statuses_add(&r->fail, SK_STATUS_BAD_LAYOUT_DUPLICATE);
            if (!first && x < idx[e - 1]) fz_statuses_add(&r->fail, SK_STATUS_BAD_LAYOUT_UNSORTED);
            if (r->fail.n > 0) return;
        }
}

void fz_layout_ref_eval(const sk_bsr *l, fz_layout_ref *r) {
    memset(r, 0, sizeof *r);
    fz_grid_ref_eval(&l->grid, &r->grid);
    if (!r->grid.ok) {
        r->fail = r->grid.fail;
        return;
    }
    /* The arrays and the count. */
    if (l->row_offsets == NULL || (l->col_indices == NULL && l->nnz > 0))
        fz_statuses_add(&r->fail, SK_STATUS_BAD_PARAM_NULL_POINTER);
    if (l->nnz < 0) fz_statuses_add(&r->fail, SK_STATUS_BAD_LAYOUT_COUNT);
    if (r->fail.n > 0) return;
    /* The offsets: a decrease and a count beyond nnz may be met in either
     * order, so either status reads right once both rules are broken. */
    const int64_t rows = r->grid.total_rows;
    const int32_t *off = l->row_offsets;
    if (off[0] != 0) fz_statuses_add(&r->fail, SK_STATUS_BAD_LAYOUT_OFFSETS);
    for (int64_t g = 0; g < rows; ++g) {
        if (off[g + 1] < off[g]) fz_statuses_add(&r->fail, SK_STATUS_BAD_LAYOUT_OFFSETS);
        if (off[g + 1] > l->nnz || off[g + 1] < 0)
            fz_statuses_add(&r->fail, SK_STATUS_BAD_LAYOUT_COUNT);
    }
    if (off[rows] != l->nnz) fz_statuses_add(&r->fail, SK_STATUS_BAD_LAYOUT_COUNT);
    if (r->fail.n > 0) return;
    check_indices(l, rows, r->grid.col_blocks, r);
    r->ok = r->fail.n == 0;
}

int64_t fz_slice_of(const sk_grid *g, int64_t b, int64_t h, int64_t hq, int64_t hkv) {
    const int64_t bs = g->batch == 1 ? 0 : b;
    int64_t hs;
    if (g->heads == hq)
        hs = h;
    else if (g->heads == 1)
        hs = 0;
    else
        hs = h / (hq / hkv); /* heads == hkv: per KV head */
    return bs * g->heads + hs;
}

void fz_layout_row(const sk_bsr *l, int64_t row_blocks, int64_t s, int64_t i, int64_t cb,
                   uint8_t *sel) {
    memset(sel, 0, (size_t)cb);
    const int64_t g = s * row_blocks + i;
    for (int32_t e = l->row_offsets[g]; e < l->row_offsets[g + 1]; ++e) sel[l->col_indices[e]] = 1;
}

void fz_layout_require_equal(const sk_bsr *got, const sk_bsr *want, int64_t total_rows,
                             const char *what) {
    const sk_grid *a = &got->grid, *b = &want->grid;
    FZ_REQUIRE(a->rows == b->rows && a->cols == b->cols && a->block_rows == b->block_rows &&
                   a->block_cols == b->block_cols && a->batch == b->batch && a->heads == b->heads,
               "%s: the layout's grid differs from the one asked for", what);
    FZ_REQUIRE(got->nnz == want->nnz, "%s: nnz = %d, want %d", what, (int)got->nnz, (int)want->nnz);
    for (int64_t g = 0; g <= total_rows; ++g)
        FZ_REQUIRE(got->row_offsets[g] == want->row_offsets[g],
                   "%s: row_offsets[%lld] = %d, want %d", what, (long long)g,
                   (int)got->row_offsets[g], (int)want->row_offsets[g]);
    for (int32_t e = 0; e < want->nnz; ++e)
        FZ_REQUIRE(got->col_indices[e] == want->col_indices[e], "%s: col_indices[%d] = %d, want %d",
                   what, (int)e, (int)got->col_indices[e], (int)want->col_indices[e]);
}
