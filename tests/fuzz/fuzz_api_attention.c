/*
 * fuzz_api_attention.c - sk_attention_workspace_size, _plan, _run and
 * _forward on the CPU backend (part of the fuzz_api harness).
 *
 * Buffers: q, k, v (read), o, lse (written), the layout arrays (read) and
 * the workspace (unused on the CPU). The rules each call must enforce are
 * the header's: the descriptor (struct_size, backend, dtype, sizes >= 1,
 * Hq a multiple of Hkv, finite scale, mask), the layout's geometry against
 * it (grid as sk_grid_blocks, rows = Sq, cols = Sk, batch 1 or B, heads 1,
 * Hkv or Hq), its content for the calls that read it, the tensors (present,
 * strides >= 0, spans within int64, O with no two elements sharing memory)
 * and outputs apart from everything else.
 */
#include <math.h>
#include <string.h>

#include "common/test_util.h"
#include "fuzz_api.h"
#include "fz_attn_ref.h"
#include "fz_tensor.h"

void api_attn_desc(const api_case *c, sk_attention_desc *d) {
    sk_attention_desc_init(d, sizeof *d);
    API_DESC_COMMON(d, c);
    /* E4M3 (the forward's FP8 inputs, 1-byte elements) is outside this
     * model, which sizes and checks 2- and 4-byte tensors; its rules are
     * tested by tests/cpu/test_fp8*.c. The value stays an invalid dtype
     * here, so the "not an sk_dtype" rule keeps being fuzzed. */
    if (d->dtype == SK_DTYPE_E4M3) d->dtype = (sk_dtype)(SK_DTYPE_E4M3 + 100);
    d->mask = (sk_mask)c->mask;
    memcpy(d->v_strides, c->strides[2], sizeof d->v_strides);
    memcpy(d->o_strides, c->strides[3], sizeof d->o_strides);
    if (c->fault == API_FAULT_STRUCT_SIZE) d->struct_size += 1;
}

int api_attn_expect_desc(const api_case *c, const sk_attention_desc *d, int runs, fz_expect *e) {
    if (c->fault == API_FAULT_STRUCT_SIZE) fz_expect_fail(e, "desc->struct_size is wrong");
    if (c->fault == API_FAULT_NULL_DESC) fz_expect_fail(e, "desc is NULL");
    api_expect_backend(e, d->backend, d->dtype, runs);
    api_expect_dtype(e, d->dtype, "desc->dtype");
    int sizes_ok = 1;
    for (int i = 0; i < 6; ++i)
        if (c->size[i] < 1) {
            fz_expect_fail(e, "size %d = %lld is below 1", i, (long long)c->size[i]);
            sizes_ok = 0;
        }
    if (sizes_ok && d->heads_q % d->heads_kv != 0)
        fz_expect_fail(e, "heads_q = %lld is not a multiple of heads_kv = %lld",
                       (long long)d->heads_q, (long long)d->heads_kv);
    if (fz_scale_refused(d->scale) == 1)
        fz_expect_fail(e, "scale = %g is not finite or |scale| log2(e) overflows fp32",
                       (double)d->scale);
    if (d->mask != SK_MASK_NONE && d->mask != SK_MASK_CAUSAL)
        fz_expect_fail(e, "mask = %d is not an sk_mask", (int)d->mask);
    return sizes_ok;
}

void api_attn_expect_geometry(const api_case *c, const sk_attention_desc *d, const api_layout *l,
                              fz_expect *e) {
    const sk_grid *g = &c->grid;
    if (c->fault == API_FAULT_NULL_LAYOUT) fz_expect_fail(e, "layout is NULL");
    if (!l->g.ok) fz_expect_fail(e, "the layout's grid is refused by sk_grid_blocks' rules");
    if (g->rows != d->seq_q || g->cols != d->seq_k)
        fz_expect_fail(e, "grid %lld x %lld differs from Sq x Sk", (long long)g->rows,
                       (long long)g->cols);
    if (g->batch != 1 && g->batch != d->batch)
        fz_expect_fail(e, "grid batch = %d is neither 1 nor B", (int)g->batch);
    if (g->heads != 1 && g->heads != d->heads_kv && g->heads != d->heads_q)
        fz_expect_fail(e, "grid heads = %d is neither 1, Hkv nor Hq", (int)g->heads);
}

void api_tensor_add(fz_arena *a, fz_expect *e, const fz_tensor *t, const char *name, int role,
                    int sizes_ok) {
    if (!t->span_ok && t->es > 0 && sizes_ok)
        fz_expect_fail(e, "%s's strides are negative or its span overflows", name);
    const int64_t bytes = t->span_ok ? t->bytes : 64; /* a stand-in when refused */
    fz_arena_add(a, name, bytes, t->es ? t->es : 4, role);
}

int64_t api_lse_count(const sk_attention_desc *d, int sizes_ok) {
    /* A count that overflows is far above the cap. */
    int64_t n = 1;
    if (sizes_ok && (__builtin_mul_overflow(d->batch, d->heads_q, &n) ||
                     __builtin_mul_overflow(n, d->seq_q, &n) || n > API_BYTES_CAP))
        n = API_BYTES_CAP;
    return n;
}

enum { B_Q, B_K, B_V, B_O, B_LSE };

void fuzz_api_attention(const api_case *c) {
    static const char *const names[4] = {"sk_attention_workspace_size", "sk_attention_plan",
                                         "sk_attention_run", "sk_attention_forward"};
    const char *api = names[c->op];
    const int tensors = c->op == API_ATTN_RUN || c->op == API_ATTN_FORWARD;
    sk_attention_desc d;
    api_attn_desc(c, &d);
    fz_expect e;
    fz_expect_clear(&e);
    const int sizes_ok = api_attn_expect_desc(c, &d, c->op != API_ATTN_WORKSPACE, &e);
    api_layout l;
    if (!api_layout_build(c, c->op != API_ATTN_WORKSPACE, &l)) return;
    api_attn_expect_geometry(c, &d, &l, &e);

    fz_attn at;
    memset(&at, 0, sizeof at);
    if (sizes_ok) fz_attn_from_desc(&at, &d);
    fz_arena a;
    fz_arena_init(&a);
    if (tensors) {
        const fz_tensor *t[4] = {&at.q, &at.k, &at.v, &at.o};
        static const char *const tn[4] = {"q", "k", "v", "o"};
        for (int i = 0; i < 4; ++i)
            api_tensor_add(&a, &e, t[i], tn[i], i == B_O ? FZ_WRITE : FZ_READ, sizes_ok);
        fz_arena_add(&a, "lse", (c->flags & API_LSE) ? api_lse_count(&d, sizes_ok) * 4 : 0, 4,
                     FZ_WRITE);
    }
    api_layout_add(&l, &a);
    api_workspace_add(c, &a);
    const double work = sizes_ok ? fz_attn_work(&at) : 0.0;
    if (!api_place(&a, c, !e.must_fail && tensors && work > API_WORK_CAP, &l)) return;
    /* Data: inputs N(0, 1) * mag with NaN between elements, outputs NaN. */
    tu_rng rng;
    tu_rng_seed(&rng, c->seed);
    const double mag = api_magnitude(c);
    void *ptr[5] = {NULL, NULL, NULL, NULL, NULL};
    if (tensors) {
        const fz_tensor *t[3] = {&at.q, &at.k, &at.v};
        for (int i = 0; i < 5; ++i) ptr[i] = a.b[i].ptr;
        for (int i = 0; i < 3; ++i)
            if (fz_arena_fillable(&a, i) && fz_tensor_small(t[i]))
                fz_tensor_fill(t[i], ptr[i], &rng, i == B_V ? 1.0 : mag);
        for (int i = 0; i < 4; ++i)
            if (ptr[i] == NULL) fz_expect_fail(&e, "tensor %d is NULL", i);
        if (!(c->flags & API_LSE)) ptr[B_LSE] = NULL;
        if (ptr[B_O] != NULL && fz_tensor_small(&at.o)) {
            if (fz_tensor_self_overlap(&at.o)) fz_expect_fail(&e, "two elements of o share memory");
            fz_tensor_mark(&at.o, fz_arena_wmask(&a, B_O));
        }
        api_expect_apart(&e, &a);
    }
    api_layout_fill(&l, &a);
    if (c->op != API_ATTN_WORKSPACE && l.g.ok) {
        fz_layout_ref r;
        api_layout_eval(&l, &r);
        if (!r.ok) fz_expect_fail(&e, "the layout fails the full check");
    }
    fz_arena_snapshot(&a);

    const sk_attention_desc *dp = c->fault == API_FAULT_NULL_DESC ? NULL : &d;
    const sk_bsr *lp = c->fault == API_FAULT_NULL_LAYOUT ? NULL : &l.bsr;
    void *ws = a.b[a.n - 1].ptr;
    const size_t ws_bytes = (size_t)a.b[a.n - 1].bytes;
    size_t ws_size = API_UNTOUCHED_SIZE;
    sk_status st;
    switch (c->op) {
    case API_ATTN_WORKSPACE:
        st = sk_attention_workspace_size(dp, lp, &ws_size);
        break;
    case API_ATTN_PLAN:
        st = sk_attention_plan(dp, lp, ws, ws_bytes, NULL);
        break;
    case API_ATTN_RUN:
        st = sk_attention_run(dp, lp, ptr[B_Q], ptr[B_K], ptr[B_V], ptr[B_O], (float *)ptr[B_LSE],
                              ws, ws_bytes, NULL);
        break;
    default:
        st = sk_attention_forward(dp, lp, ptr[B_Q], ptr[B_K], ptr[B_V], ptr[B_O],
                                  (float *)ptr[B_LSE], ws, ws_bytes, NULL);
        break;
    }
    const int ok = api_outcome(&a, st, api, &e);
    if (c->op == API_ATTN_WORKSPACE)
        FZ_REQUIRE(ws_size == (ok ? 0 : API_UNTOUCHED_SIZE),
                   "%s: *workspace_bytes = %zu after %s (the CPU needs 0)", api, ws_size,
                   ok ? "success" : "a failure");
    if (ok && tensors && work <= API_WORK_CAP && !api_inputs_overlap(&a))
        fz_check_attention(&at, &l.bsr, ptr[B_Q], ptr[B_K], ptr[B_V], ptr[B_O],
                           (const float *)ptr[B_LSE], api);
    fz_arena_free(&a);
    api_layout_free(&l);
}
