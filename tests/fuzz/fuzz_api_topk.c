/*
 * fuzz_api_topk.c - the top-k selection entry points on the CPU backend
 * (part of the fuzz_api harness): sk_topk_layout_capacity,
 * sk_topk_workspace_size, sk_pool_select_topk_workspace_size,
 * sk_block_pool, sk_select_topk, sk_pool_select_topk and
 * sk_layout_from_scores; the descriptor helpers that
 * fuzz_api_attention_topk.c shares.
 *
 * The rules are the header's: the descriptor (struct_size, backend, dtype,
 * sizes, Hq a multiple of Hkv, blocks 64 or 128, finite scale, k, sinks and
 * local blocks >= 0, mask) and the output grid it implies (as
 * sk_grid_blocks); Q, K and the pooled buffers present with spans within
 * int64; the layout's arrays present (col_indices unless the capacity is 0)
 * and sized by the capacity; every output apart from everything else. A
 * success is checked against tests/common's naive selection: the capacity
 * by brute force, the pooled means, the layout from naive fp64 scores
 * (near ties allowed) or from the given scores (exactly), and
 * sk_pool_select_topk against sk_block_pool + sk_select_topk bit for bit.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/test_util.h"
#include "common/topk_check.h"
#include "fuzz_api.h"

/* ---------------------------------------------------------------------------
 * The descriptor
 * ------------------------------------------------------------------------- */

void api_topk_init(const api_case *c, api_topk *p, fz_expect *e) {
    memset(p, 0, sizeof *p);
    sk_topk_desc *d = &p->d;
    sk_topk_desc_init(d, sizeof *d);
    API_DESC_COMMON(d, c);
    d->block_q = c->block_q;
    d->block_k = c->block_k;
    d->k = c->k;
    d->sink_blocks = c->sink_blocks;
    d->local_blocks = c->local_blocks;
    d->mask = (sk_mask)c->topk_mask;
    d->per_kv_head = c->per_kv_head;
    if (c->fault == API_FAULT_STRUCT_SIZE) {
        d->struct_size += 1;
        fz_expect_fail(e, "desc->struct_size is wrong");
    }
    if (c->fault == API_FAULT_NULL_DESC) fz_expect_fail(e, "a descriptor is NULL");
    const int query = c->op == API_TOPK_CAPACITY || c->op == API_TOPK_WORKSPACE ||
                      c->op == API_POOL_SELECT_WORKSPACE || c->op == API_ATTN_TOPK_WORKSPACE;
    api_expect_backend(e, d->backend, d->dtype, !query);
    api_expect_dtype(e, d->dtype, "desc->dtype");
    p->sizes_ok = fz_dtype_size(d->dtype) > 0;
    for (int i = 0; i < 6; ++i)
        if (c->size[i] < 1) {
            fz_expect_fail(e, "size %d = %lld is below 1", i, (long long)c->size[i]);
            p->sizes_ok = 0;
        }
    if (c->size[0] >= 1 && c->size[3] >= 1 && c->size[4] >= 1 && d->heads_q % d->heads_kv != 0)
        fz_expect_fail(e, "heads_q is not a multiple of heads_kv");
    if (!isfinite(d->scale)) fz_expect_fail(e, "scale is not finite");
    if (d->k < 0 || d->sink_blocks < 0 || d->local_blocks < 0)
        fz_expect_fail(e, "k, sink_blocks or local_blocks below 0");
    if (d->mask != SK_MASK_NONE && d->mask != SK_MASK_CAUSAL)
        fz_expect_fail(e, "mask = %d is not an sk_mask", (int)d->mask);
    if (d->block_q != 64 && d->block_q != 128) fz_expect_fail(e, "block_q is not 64 or 128");
    if (d->block_k != 64 && d->block_k != 128) fz_expect_fail(e, "block_k is not 64 or 128");
    if (!p->sizes_ok) return;
    const int64_t heads = d->per_kv_head ? d->heads_kv : d->heads_q;
    if (d->batch > INT32_MAX || heads > INT32_MAX) {
        fz_expect_fail(e, "batch or the layout heads do not fit the grid's int32");
        return;
    }
    const sk_grid grid = {d->seq_q,   d->seq_k,          d->block_q,
                          d->block_k, (int32_t)d->batch, (int32_t)heads};
    p->grid = grid;
    fz_grid_ref_eval(&grid, &p->g);
    if (!p->g.ok) {
        fz_expect_fail(e, "the output grid is refused by sk_grid_blocks' rules");
        return;
    }
    if (p->g.dense > INT32_MAX) { /* sparsek.h: the top-k score matrix limit */
        fz_expect_fail(e, "the dense score matrix has more than INT32_MAX entries");
        p->g.ok = 0;
        return;
    }
    fz_tensor_init(&p->q, d->batch, d->seq_q, d->heads_q, d->head_dim, d->q_strides, d->dtype);
    fz_tensor_init(&p->k, d->batch, d->seq_k, d->heads_kv, d->head_dim, d->k_strides, d->dtype);
    /* Pooled [B, H, blocks, D] fp32 must fit int64 bytes. */
    int64_t x;
    if (__builtin_mul_overflow(d->batch, d->heads_q, &x) ||
        __builtin_mul_overflow(x, p->g.row_blocks, &x) ||
        __builtin_mul_overflow(x, d->head_dim, &x) || __builtin_mul_overflow(x, 4, &p->pq_bytes) ||
        __builtin_mul_overflow(d->batch, d->heads_kv, &x) ||
        __builtin_mul_overflow(x, p->g.col_blocks, &x) ||
        __builtin_mul_overflow(x, d->head_dim, &x) || __builtin_mul_overflow(x, 4, &p->pk_bytes)) {
        fz_expect_fail(e, "the pooled sizes overflow int64 bytes");
        p->pq_bytes = p->pk_bytes = 0;
    }
    p->huge = p->g.row_blocks > (1 << 16);
    const double cb = (double)p->g.col_blocks;
    p->small = p->g.total_rows <= 4096 && (double)d->seq_q * cb <= (1 << 20) &&
               (double)p->g.total_rows * cb * cb <= (1 << 22);
    p->t.desc = *d;
    p->t.desc.struct_size = sizeof p->t.desc;
    /* The naive rules need the options in range (else the call is refused). */
    const int options_ok = d->k >= 0 && d->sink_blocks >= 0 && d->local_blocks >= 0;
    p->capacity = p->small && options_ok ? tk_naive_capacity(&p->t) : -1;
}

void api_topk_add_qk(const api_topk *p, fz_arena *a, fz_expect *e) {
    const fz_tensor *t[2] = {&p->q, &p->k};
    static const char *const names[2] = {"q", "k"};
    for (int i = 0; i < 2; ++i) {
        if (p->g.ok && !t[i]->span_ok)
            fz_expect_fail(e, "%s: strides negative or span overflows", names[i]);
        fz_arena_add(a, names[i], t[i]->span_ok ? t[i]->bytes : 64, t[i]->es ? t[i]->es : 4,
                     FZ_READ);
    }
}

void api_topk_add_layout(const api_topk *p, fz_arena *a) {
    const int sized = p->small && p->capacity >= 0;
    fz_arena_add(a, "layout->row_offsets", sized ? (p->g.total_rows + 1) * 4 : 64, 4, FZ_WRITE);
    fz_arena_add(a, "layout->col_indices", sized ? p->capacity * 4 : 64, 4, FZ_WRITE);
}

void api_topk_fill_qk(api_topk *p, fz_arena *a, int iq, tu_rng *rng, double mag) {
    if (fz_arena_fillable(a, iq) && fz_tensor_small(&p->q))
        fz_tensor_fill(&p->q, a->b[iq].ptr, rng, mag);
    if (fz_arena_fillable(a, iq + 1) && fz_tensor_small(&p->k))
        fz_tensor_fill(&p->k, a->b[iq + 1].ptr, rng, mag);
    p->t.q = a->b[iq].ptr;
    p->t.k = a->b[iq + 1].ptr;
    memcpy(p->t.qs, p->q.st, sizeof p->t.qs);
    memcpy(p->t.ks, p->k.st, sizeof p->t.ks);
    p->t.q_span = p->q.span;
    p->t.k_span = p->k.span;
}

void api_topk_layout_struct(const api_case *c, const api_topk *p, const fz_arena *a, int i_off,
                            sk_bsr *lay, fz_expect *e) {
    memset(lay, 0xA5, sizeof *lay); /* grid and nnz are written on success only */
    lay->row_offsets = (int32_t *)(void *)a->b[i_off].ptr;
    lay->col_indices = (int32_t *)(void *)a->b[i_off + 1].ptr;
    if (c->fault == API_FAULT_NULL_LAYOUT) fz_expect_fail(e, "layout is NULL");
    if (lay->row_offsets == NULL) fz_expect_fail(e, "layout->row_offsets is NULL");
    if (lay->col_indices == NULL && p->capacity != 0)
        fz_expect_fail(e, "layout->col_indices is NULL");
}

void api_topk_out_init(const api_topk *p, api_topk_out *o) {
    o->off = (int32_t *)malloc((size_t)(p->g.total_rows + 1) * 4);
    o->idx = (int32_t *)malloc((size_t)p->capacity * 4 + 4);
    if (o->off == NULL || o->idx == NULL) fz_fail("harness: out of memory");
    memset(&o->bsr, 0, sizeof o->bsr);
    o->bsr.row_offsets = o->off;
    o->bsr.col_indices = o->idx;
}

void api_topk_out_require(const api_topk *p, api_topk_out *o, const sk_bsr *got, const char *what) {
    const int64_t rows = p->g.total_rows;
    o->bsr.nnz = o->off[rows];
    sk_bsr g2 = *got;
    g2.nnz = got->row_offsets[rows];
    fz_layout_require_equal(&g2, &o->bsr, rows, what);
    free(o->off);
    free(o->idx);
}

void api_topk_check_layout(const api_topk *p, const sk_bsr *lay, const char *api) {
    FZ_REQUIRE(memcmp(&lay->grid, &p->grid, sizeof p->grid) == 0,
               "%s: layout->grid is not the "
               "output grid",
               api);
    FZ_REQUIRE(lay->nnz == p->capacity, "%s: layout->nnz = %d, the capacity is %lld", api,
               (int)lay->nnz, (long long)p->capacity);
    const int32_t count = lay->row_offsets[p->g.total_rows];
    FZ_REQUIRE(count >= 0 && count <= p->capacity, "%s: %d entries, capacity %lld", api, (int)count,
               (long long)p->capacity);
    sk_bsr v = *lay;
    v.nnz = count;
    fz_layout_ref r;
    fz_layout_ref_eval(&v, &r);
    FZ_REQUIRE(r.ok, "%s wrote a layout that is not valid (independent check)", api);
}

/* ---------------------------------------------------------------------------
 * The calls
 * ------------------------------------------------------------------------- */

/* The layout of sk_block_pool + sk_select_topk on private buffers equals
 * sk_pool_select_topk's (sparsek.h: "the same layout bit for bit"). */
static void check_pool_select_equal(const api_topk *p, const sk_bsr *got) {
    float *pq = (float *)malloc((size_t)p->pq_bytes), *pk = (float *)malloc((size_t)p->pk_bytes);
    api_topk_out want;
    api_topk_out_init(p, &want);
    FZ_REQUIRE(sk_block_pool(&p->d, p->t.q, p->t.k, pq, pk, NULL) == SK_STATUS_SUCCESS &&
                   sk_select_topk(&p->d, pq, pk, &want.bsr, NULL, 0, NULL) == SK_STATUS_SUCCESS,
               "sk_block_pool + sk_select_topk failed where sk_pool_select_topk succeeded");
    api_topk_out_require(p, &want, got, "sk_pool_select_topk vs sk_block_pool + sk_select_topk");
    free(pq);
    free(pk);
}

/* Every score of sk_select_topk's pooled inputs is far inside the fp32
 * range (beyond it the fp32 scores are +-inf, which the fp64 naive
 * selection does not model). */
static int scores_in_range(const api_topk *p, const float *pq, const float *pk) {
    double mq = 0.0, mk = 0.0;
    for (int64_t x = 0; x < p->pq_bytes / 4; ++x) mq = fabs(pq[x]) > mq ? fabs(pq[x]) : mq;
    for (int64_t x = 0; x < p->pk_bytes / 4; ++x) mk = fabs(pk[x]) > mk ? fabs(pk[x]) : mk;
    const double scale = p->d.scale != 0.0f ? fabs(p->d.scale) : 1.0;
    return scale * mq * mk * (double)p->d.head_dim * (double)p->d.heads_q < 1e37;
}

static void size_call(const api_case *c, api_topk *p, fz_expect *e) {
    size_t ws = API_UNTOUCHED_SIZE;
    size_t *out = c->fault == API_FAULT_NULL_LAYOUT ? NULL : &ws;
    if (out == NULL) fz_expect_fail(e, "workspace_bytes is NULL");
    const sk_topk_desc *dp = c->fault == API_FAULT_NULL_DESC ? NULL : &p->d;
    if (c->op == API_TOPK_WORKSPACE) {
        const sk_status st = sk_topk_workspace_size(dp, out);
        fz_check_status(st, "sk_topk_workspace_size", e);
        FZ_REQUIRE(ws == (st == SK_STATUS_SUCCESS ? 0 : API_UNTOUCHED_SIZE),
                   "sk_topk_workspace_size: *workspace_bytes = %zu", ws);
    } else {
        const sk_status st = sk_pool_select_topk_workspace_size(dp, out);
        fz_check_status(st, "sk_pool_select_topk_workspace_size", e);
        FZ_REQUIRE(ws == (st == SK_STATUS_SUCCESS ? 0 : API_UNTOUCHED_SIZE),
                   "sk_pool_select_topk_workspace_size: *workspace_bytes = %zu", ws);
    }
}

static void capacity_call(const api_case *c, api_topk *p, const fz_expect *e) {
    sk_grid grid;
    memset(&grid, 0xA5, sizeof grid);
    const sk_grid poison = grid;
    int32_t cap = -7;
    sk_grid *gp = c->fault == API_FAULT_NULL_LAYOUT ? NULL : &grid;
    int32_t *cp = (c->seed & 1) ? NULL : &cap; /* either output may be NULL */
    const sk_status st =
        sk_topk_layout_capacity(c->fault == API_FAULT_NULL_DESC ? NULL : &p->d, gp, cp);
    fz_check_status(st, "sk_topk_layout_capacity", e);
    if (st != SK_STATUS_SUCCESS) {
        FZ_REQUIRE(cap == -7 && memcmp(&grid, &poison, sizeof grid) == 0,
                   "sk_topk_layout_capacity failed but wrote");
        return;
    }
    if (gp != NULL)
        FZ_REQUIRE(memcmp(&grid, &p->grid, sizeof grid) == 0,
                   "sk_topk_layout_capacity: wrong grid");
    if (cp != NULL && p->capacity >= 0)
        FZ_REQUIRE(cap == p->capacity, "sk_topk_layout_capacity: %d, naive %lld", (int)cap,
                   (long long)p->capacity);
}

void fuzz_api_topk(const api_case *c) {
    api_topk p;
    fz_expect e;
    fz_expect_clear(&e);
    api_topk_init(c, &p, &e);
    if (p.huge) return;
    if (c->op == API_TOPK_WORKSPACE || c->op == API_POOL_SELECT_WORKSPACE) {
        size_call(c, &p, &e);
        return;
    }
    if (c->op == API_TOPK_CAPACITY) {
        capacity_call(c, &p, &e);
        return;
    }
    /* Buffers: inputs first, then the outputs, then the workspace. */
    fz_arena a;
    fz_arena_init(&a);
    double work = 0.0;
    int n_in = 2;
    switch (c->op) {
    case API_BLOCK_POOL:
        api_topk_add_qk(&p, &a, &e);
        fz_arena_add(&a, "pooled_q", p.pq_bytes > 0 ? p.pq_bytes : 64, 4, FZ_WRITE);
        fz_arena_add(&a, "pooled_k", p.pk_bytes > 0 ? p.pk_bytes : 64, 4, FZ_WRITE);
        work =
            p.sizes_ok && p.q.span_ok && p.k.span_ok ? (double)p.q.elems + (double)p.k.elems : 0.0;
        break;
    case API_SELECT_TOPK:
        fz_arena_add(&a, "pooled_q", p.pq_bytes > 0 ? p.pq_bytes : 64, 4, FZ_READ);
        fz_arena_add(&a, "pooled_k", p.pk_bytes > 0 ? p.pk_bytes : 64, 4, FZ_READ);
        work = (double)p.g.dense * (double)p.d.head_dim *
               (double)(p.d.heads_q / (p.d.heads_kv ? p.d.heads_kv : 1));
        break;
    case API_POOL_SELECT_TOPK:
        api_topk_add_qk(&p, &a, &e);
        work = p.sizes_ok && p.q.span_ok && p.k.span_ok
                   ? 2.0 * ((double)p.q.elems + (double)p.k.elems) +
                         (double)p.g.dense * (double)p.d.head_dim *
                             (double)(p.d.heads_q / p.d.heads_kv)
                   : 0.0;
        break;
    default: /* API_FROM_SCORES */
        fz_arena_add(&a, "scores", p.g.ok ? p.g.dense * 4 : 64, 4, FZ_READ);
        n_in = 1;
        work = (double)p.g.dense;
        break;
    }
    const int pool = c->op == API_BLOCK_POOL;
    if (!pool) api_topk_add_layout(&p, &a);
    api_workspace_add(c, &a);
    const int sized = p.small && p.capacity >= 0;
    if (!api_place(&a, c, !e.must_fail && ((!pool && !sized) || work > API_WORK_CAP), NULL)) return;
    tu_rng rng;
    tu_rng_seed(&rng, c->seed);
    const double mag = api_magnitude(c);
    if (c->op == API_BLOCK_POOL || c->op == API_POOL_SELECT_TOPK)
        api_topk_fill_qk(&p, &a, 0, &rng, mag);
    if (c->op == API_SELECT_TOPK)
        for (int i = 0; i < 2; ++i)
            for (int64_t x = 0; fz_arena_fillable(&a, i) && x < a.b[i].bytes / 4; ++x)
                ((float *)(void *)a.b[i].ptr)[x] = (float)(tu_rng_normal(&rng) * mag);
    if (c->op == API_FROM_SCORES && a.b[0].ptr != NULL && p.g.ok && sized) {
        float *s = tk_random_scores(&p.t, &rng, (c->flags & API_SPECIAL) ? 0.2 : 0.0);
        if (s == NULL) fz_fail("harness: out of memory");
        memcpy(a.b[0].ptr, s, (size_t)p.g.dense * 4);
        free(s);
    }
    /* Inputs are buffers 0 .. n_in - 1; then pooled Q, K or the layout. */
    for (int i = 0; i < n_in; ++i)
        if (a.b[i].ptr == NULL) fz_expect_fail(&e, "input %s is NULL", a.b[i].name);
    for (int i = 0; pool && i < 2; ++i)
        if (a.b[2 + i].ptr == NULL) fz_expect_fail(&e, "output %s is NULL", a.b[2 + i].name);
    sk_bsr lay;
    fz_expect unused;
    fz_expect_clear(&unused);
    api_topk_layout_struct(c, &p, &a, n_in, &lay, pool ? &unused : &e);
    api_expect_apart(&e, &a);
    fz_arena_snapshot(&a);
    const sk_bsr lay0 = lay;
    const sk_topk_desc *dp = c->fault == API_FAULT_NULL_DESC ? NULL : &p.d;
    sk_bsr *lp = c->fault == API_FAULT_NULL_LAYOUT ? NULL : &lay;
    void *ws = a.b[a.n - 1].ptr;
    const size_t ws_bytes = (size_t)a.b[a.n - 1].bytes;
    const char *api;
    sk_status st;
    const float *in0 = (const float *)(void *)a.b[0].ptr, *in1 = (const float *)(void *)a.b[1].ptr;
    switch (c->op) {
    case API_BLOCK_POOL:
        api = "sk_block_pool";
        st = sk_block_pool(dp, a.b[0].ptr, a.b[1].ptr, (float *)(void *)a.b[2].ptr,
                           (float *)(void *)a.b[3].ptr, NULL);
        break;
    case API_SELECT_TOPK:
        api = "sk_select_topk";
        st = sk_select_topk(dp, in0, in1, lp, ws, ws_bytes, NULL);
        break;
    case API_POOL_SELECT_TOPK:
        api = "sk_pool_select_topk";
        st = sk_pool_select_topk(dp, a.b[0].ptr, a.b[1].ptr, lp, ws, ws_bytes, NULL);
        break;
    default:
        api = "sk_layout_from_scores";
        st = sk_layout_from_scores(dp, in0, lp, ws, ws_bytes, NULL);
        break;
    }
    const int ok = api_outcome(&a, st, api, &e);
    if (!ok || c->op == API_BLOCK_POOL)
        FZ_REQUIRE(memcmp(&lay, &lay0, sizeof lay) == 0, "%s: the layout struct changed", api);
    if (ok && !api_inputs_overlap(&a)) {
        if (c->op == API_BLOCK_POOL) {
            FZ_REQUIRE(
                tk_check_pooled(&p.t, 1, (const float *)(void *)a.b[2].ptr, "pooled_q") == 0 &&
                    tk_check_pooled(&p.t, 0, (const float *)(void *)a.b[3].ptr, "pooled_k") == 0,
                "sk_block_pool: pooled blocks differ from the naive means");
        } else {
            api_topk_check_layout(&p, &lay, api);
            if (c->op == API_SELECT_TOPK)
                FZ_REQUIRE(!scores_in_range(&p, in0, in1) ||
                               tk_layout_matches_naive_scores(&p.t, in0, in1, lay.row_offsets,
                                                              lay.col_indices, api),
                           "sk_select_topk: the layout differs from the naive selection");
            else if (c->op == API_FROM_SCORES)
                FZ_REQUIRE(tk_layout_equals_naive(&p.t, in0, lay.row_offsets, lay.col_indices, api),
                           "sk_layout_from_scores: the layout differs from the naive selection");
            else
                check_pool_select_equal(&p, &lay);
        }
    }
    fz_arena_free(&a);
}
