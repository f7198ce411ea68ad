/*
 * fz_layout_gen.c - see fz_layout_gen.h.
 */
#include "fz_layout_gen.h"

#include <stdlib.h>

void fz_grid_code(fz_codec *c, sk_grid *g) {
    fz_i64(c, &g->rows);
    fz_i64(c, &g->cols);
    fz_i32(c, &g->block_rows);
    fz_i32(c, &g->block_cols);
    fz_i32(c, &g->batch);
    fz_i32(c, &g->heads);
}

void fz_edits_code(fz_codec *c, uint8_t *n, fz_edit *edits, int max) {
    fz_u8(c, n);
    if (!c->writing) *n %= max + 1;
    for (int i = 0; i < *n; ++i) {
        fz_u8(c, &edits[i].kind);
        fz_u16(c, &edits[i].pos);
        fz_i32(c, &edits[i].value);
    }
}

static void apply(int32_t *arr, int64_t n, const fz_edit *e) {
    if (n <= 0) return;
    int32_t *x = &arr[e->pos % n];
    *x = (e->kind & 1) ? (int32_t)((uint32_t)*x + (uint32_t)e->value) : e->value;
}

void fz_edits_apply(const fz_edit *edits, int n, int32_t *a, int64_t na, int32_t *b, int64_t nb) {
    for (int i = 0; i < n; ++i) {
        if ((edits[i].kind & 3) < 2)
            apply(a, na, &edits[i]);
        else
            apply(b, nb, &edits[i]);
    }
}

int fz_layout_from_mask(const uint8_t *sel, int64_t rows, int64_t cb, int32_t nnz_delta,
                        int64_t nnz_cap, int32_t **off, int32_t **idx, int32_t *nnz) {
    int64_t count = 0;
    for (int64_t x = 0; x < rows * cb; ++x) count += sel[x] != 0;
    int64_t n64 = count + nnz_delta;
    if (n64 > INT32_MAX) n64 = INT32_MAX;
    if (n64 < INT32_MIN) n64 = INT32_MIN;
    if (n64 > nnz_cap) return 0;
    const int64_t n_idx = n64 > 0 ? n64 : 0;
    *nnz = (int32_t)n64;
    *off = (int32_t *)malloc((size_t)(rows + 1) * 4);
    *idx = (int32_t *)malloc((size_t)n_idx * 4); /* exactly: a read past it is a report */
    if (*off == NULL || (*idx == NULL && n_idx > 0)) abort(); /* the harness cannot go on */
    int64_t e = 0;
    (*off)[0] = 0;
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t j = 0; j < cb; ++j)
            if (sel[r * cb + j]) {
                if (e < n_idx) (*idx)[e] = (int32_t)j;
                ++e;
            }
        (*off)[r + 1] = (int32_t)e;
    }
    for (; e < n_idx; ++e) (*idx)[e] = (int32_t)(e % (cb + 1));
    return 1;
}
