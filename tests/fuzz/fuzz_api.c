/*
 * fuzz_api.c - libFuzzer harness (b): descriptors, strides and buffer
 * placements (api_case.h) through every attention, GEMM and top-k entry
 * point, on the CPU backend.
 *
 * Tensors and arrays are allocated at exactly their documented byte spans,
 * computed here from shape, strides and dtype (fz_tensor.h), and placed by
 * the input: apart, abutting, or overlapping inside one arena whose gaps
 * are poisoned (fz_arena.h). Properties, each a finding when broken:
 *  - no AddressSanitizer or UBSan report (a stray access is one);
 *  - a call the header's rules refuse (bad enum, size, stride, pointer,
 *    layout, or an output overlapping anything else the call touches)
 *    does not succeed;
 *  - a failure writes nothing: every buffer byte and every output value
 *    as before, a status of a bad argument (or not supported, or
 *    ALLOC_FAILED), a last-error text naming the entry point;
 *  - a success writes only the documented output elements and, where the
 *    problem is small, matches a naive reference: the dense fp64
 *    attention masked by the layout, the fp64 GEMM, the naive top-k of
 *    tests/common (under the tolerance rule of docs/DEVELOPING.md).
 * Per family: fuzz_api_attention.c, fuzz_api_backward.c (with the fp64
 * backward of tests/common/naive_bwd.c), fuzz_api_gemm.c, fuzz_api_topk.c.
 */
#include "fuzz_api.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/test_util.h"

enum { ROW_CAP = 4096, DENSE_CAP = 1 << 16, NNZ_CAP = 1 << 16 };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* ---------------------------------------------------------------------------
 * Layouts
 * ------------------------------------------------------------------------- */

int api_layout_build(const api_case *c, int reads, api_layout *l) {
    memset(l, 0, sizeof *l);
    l->bsr.grid = c->grid;
    fz_grid_ref_eval(&c->grid, &l->g);
    const int small = l->g.ok && l->g.total_rows <= ROW_CAP && l->g.dense <= DENSE_CAP;
    if (!small) {
        if (l->g.ok && reads) return 0;
        l->n_off = l->n_idx = 1; /* refused, or never read */
        l->off = (int32_t *)calloc(1, 4);
        l->idx = (int32_t *)calloc(1, 4);
        l->bsr.nnz = c->nnz_delta < 0 ? c->nnz_delta : 0;
        return 1;
    }
    const int64_t rows = l->g.total_rows, cb = l->g.col_blocks;
    uint8_t *sel = (uint8_t *)malloc((size_t)(rows * cb));
    tu_rng rng;
    tu_rng_seed(&rng, c->seed ^ 0x6c61796f7574ull);
    for (int64_t x = 0; x < rows * cb; ++x)
        sel[x] = (uint8_t)((tu_rng_next(&rng) & 255) < c->density);
    const int made =
        fz_layout_from_mask(sel, rows, cb, c->nnz_delta, NNZ_CAP, &l->off, &l->idx, &l->bsr.nnz);
    free(sel);
    if (!made) return 0;
    l->n_off = rows + 1;
    l->n_idx = l->bsr.nnz > 0 ? l->bsr.nnz : 0;
    fz_edits_apply(c->edits, c->n_edits, l->off, l->n_off, l->idx, l->n_idx);
    return 1;
}

void api_layout_add(api_layout *l, fz_arena *a) {
    l->i_off = fz_arena_add(a, "layout->row_offsets", l->n_off * 4, 4, FZ_READ);
    l->i_idx = fz_arena_add(a, "layout->col_indices", l->n_idx * 4, 4, FZ_READ);
}

void api_layout_fill(api_layout *l, fz_arena *a) {
    uint8_t *off = a->b[l->i_off].ptr, *idx = a->b[l->i_idx].ptr;
    if (off != NULL) memcpy(off, l->off, (size_t)l->n_off * 4);
    if (idx != NULL && l->n_idx > 0) memcpy(idx, l->idx, (size_t)l->n_idx * 4);
    l->bsr.row_offsets = (int32_t *)(void *)off;
    l->bsr.col_indices = (int32_t *)(void *)idx;
}

void api_layout_eval(const api_layout *l, fz_layout_ref *r) {
    sk_bsr v = l->bsr;
    int32_t *off = (int32_t *)malloc((size_t)l->n_off * 4 + 4);
    int32_t *idx = (int32_t *)malloc((size_t)l->n_idx * 4 + 4);
    if (off == NULL || idx == NULL) fz_fail("harness: out of memory");
    if (v.row_offsets != NULL) {
        memcpy(off, v.row_offsets, (size_t)l->n_off * 4);
        v.row_offsets = off;
    }
    if (v.col_indices != NULL) {
        if (l->n_idx > 0) memcpy(idx, v.col_indices, (size_t)l->n_idx * 4);
        v.col_indices = idx;
    }
    fz_layout_ref_eval(&v, r);
    free(off);
    free(idx);
}

void api_layout_free(api_layout *l) {
    free(l->off);
    free(l->idx);
}

int api_workspace_add(const api_case *c, fz_arena *a) {
    return fz_arena_add(a, "workspace", (int64_t)(c->workspace_bytes % 257), 16, FZ_UNUSED);
}

/* ---------------------------------------------------------------------------
 * Expectations and outcomes
 * ------------------------------------------------------------------------- */

void api_expect_backend(fz_expect *e, int32_t backend, int32_t dtype, int runs) {
    const int cuda = backend == SK_BACKEND_CUDA || backend == SK_BACKEND_CUDA_SM80 ||
                     backend == SK_BACKEND_CUDA_SM90;
    if (!cuda && backend != SK_BACKEND_CPU)
        fz_expect_fail(e, "backend = %d is not an sk_backend", (int)backend);
    if (cuda && dtype == SK_DTYPE_F32) fz_expect_fail(e, "F32 data with a CUDA backend");
    if (cuda && runs)
        fz_expect_fail(e, "backend %d is CUDA, and this build has none", (int)backend);
}

void api_expect_dtype(fz_expect *e, int32_t dtype, const char *what) {
    if (dtype != SK_DTYPE_F16 && dtype != SK_DTYPE_BF16 && dtype != SK_DTYPE_F32)
        fz_expect_fail(e, "%s = %d is not an sk_dtype", what, (int)dtype);
}

void api_expect_apart(fz_expect *e, const fz_arena *a) {
    char why[160];
    if (fz_arena_overlap(a, why, sizeof why)) fz_expect_fail(e, "%s", why);
}

int api_inputs_overlap(const fz_arena *a) {
    for (int i = 0; i < a->n; ++i)
        for (int j = i + 1; j < a->n; ++j) {
            const fz_buf *x = &a->b[i], *y = &a->b[j];
            if (x->ptr == NULL || y->ptr == NULL || x->bytes == 0 || y->bytes == 0) continue;
            if (x->role == FZ_UNUSED || y->role == FZ_UNUSED) continue;
            if (x->ptr < y->ptr + y->bytes && y->ptr < x->ptr + x->bytes) return 1;
        }
    return 0;
}

int api_place(fz_arena *a, const api_case *c, int skip, api_layout *l) {
    if (!skip && fz_arena_place(a, &c->place, API_BYTES_CAP)) return 1;
    fz_arena_free(a);
    if (l != NULL) api_layout_free(l);
    return 0;
}

double api_magnitude(const api_case *c) {
    return ldexp(1.0, (int)(c->magnitude % 9) - 4);
}

int api_outcome(const fz_arena *a, sk_status st, const char *api, const fz_expect *e) {
    fz_check_status(st, api, e);
    if (st != SK_STATUS_SUCCESS) {
        fz_arena_check_untouched(a, api);
        return 0;
    }
    fz_arena_check_writes(a, api);
    return 1;
}

/* ---------------------------------------------------------------------------
 * The entry point
 * ------------------------------------------------------------------------- */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    api_case c;
    memset(&c, 0, sizeof c);
    fz_codec codec;
    fz_codec_reader(&codec, data, size);
    api_case_code(&codec, &c);
    c.op %= API_OPS;
    c.fault %= API_FAULTS;
    fz_set_case("op %d fault %d backend %d dtype %d sizes %lld %lld %lld %lld %lld %lld place %d",
                (int)c.op, (int)c.fault, (int)c.backend, (int)c.dtype, (long long)c.size[0],
                (long long)c.size[1], (long long)c.size[2], (long long)c.size[3],
                (long long)c.size[4], (long long)c.size[5], (int)(c.place.mode % 3));
    if (c.op <= API_ATTN_FORWARD)
        fuzz_api_attention(&c);
    else if (c.op <= API_ATTN_TOPK)
        fuzz_api_attention_topk(&c);
    else if (c.op >= API_GEMM_WORKSPACE && c.op <= API_GEMM)
        fuzz_api_gemm(&c);
    else if (c.op >= API_BWD_WORKSPACE)
        fuzz_api_backward(&c);
    else
        fuzz_api_topk(&c);
    return 0;
}
