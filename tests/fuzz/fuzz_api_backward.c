/*
 * fuzz_api_backward.c - sk_attention_backward_desc_init,
 * sk_attention_backward_workspace_size, _plan, _run and
 * sk_attention_backward on the CPU backend (part of the fuzz_api harness).
 *
 * Buffers: q, k, v, o, dout, lse (read), dq, dk, dv (written), the layout
 * arrays (read) and the workspace (unused on the CPU). The rules are the
 * forward's (descriptor, layout geometry and content, q/k/v/o strides,
 * fuzz_api_attention.c), the backward descriptor's (struct_size,
 * deterministic 0 or 1, strides >= 0 with spans within int64), every
 * pointer present (lse included), no two elements of o, dq, dk or dv
 * sharing memory, and dq, dk, dv apart from every other buffer.
 *
 * O and LSE come from a real CPU forward over the placed q, k, v and layout
 * (API_BWD_REAL_FWD) or are arbitrary values; only the former is compared
 * with the fp64 backward (fz_bwd_ref.h). A success is run twice: with
 * deterministic = 1 the second must give bitwise the same dq, dk, dv.
 */
#include <stdlib.h>
#include <string.h>

#include "common/test_util.h"
#include "fuzz_api.h"
#include "fz_bwd_ref.h"
#include "fz_tensor.h"

/* The reference's work is about 4 forwards, and a success runs the
 * library's forward and two backwards: a quarter of the forward's cap. */
#define BWD_WORK_CAP (API_WORK_CAP / 4)

enum { W_Q, W_K, W_V, W_O, W_DOUT, W_LSE, W_DQ, W_DK, W_DV, W_TENSORS };

/* The backward descriptor of the case through its init; the init's own
 * refusal of a wrong size (with *bwd untouched) when the case asks. */
static void make_bwd(const api_case *c, sk_attention_backward_desc *bw) {
    static const char *const api = "sk_attention_backward_desc_init";
    if (c->bwd_flags & API_BWD_INIT_SIZE) {
        memset(bw, 0x5A, sizeof *bw);
        fz_expect e;
        fz_expect_clear(&e);
        fz_expect_fail(&e, "struct_size is one too many");
        fz_check_status(sk_attention_backward_desc_init(bw, sizeof *bw + 1), api, &e);
        const uint8_t *bytes = (const uint8_t *)bw;
        for (size_t i = 0; i < sizeof *bw; ++i)
            FZ_REQUIRE(bytes[i] == 0x5A, "%s: a refused call changed byte %zu of *bwd", api, i);
    }
    fz_check_status(sk_attention_backward_desc_init(bw, sizeof *bw), api, NULL);
    int defaults = bw->struct_size == sizeof *bw && bw->deterministic == 1;
    for (int i = 0; i < 3; ++i)
        defaults = defaults && bw->dout_strides[i] == 0 && bw->dq_strides[i] == 0 &&
                   bw->dk_strides[i] == 0 && bw->dv_strides[i] == 0;
    FZ_REQUIRE(defaults, "%s: the defaults are not struct_size, deterministic 1, packed", api);
    bw->deterministic = c->deterministic;
    memcpy(bw->dout_strides, c->bwd_strides[0], sizeof bw->dout_strides);
    memcpy(bw->dq_strides, c->bwd_strides[1], sizeof bw->dq_strides);
    memcpy(bw->dk_strides, c->bwd_strides[2], sizeof bw->dk_strides);
    memcpy(bw->dv_strides, c->bwd_strides[3], sizeof bw->dv_strides);
    if (c->bwd_flags & API_BWD_STRUCT_SIZE) bw->struct_size += 1;
}

static void expect_bwd(const api_case *c, const sk_attention_backward_desc *bw, fz_expect *e) {
    if (c->bwd_flags & API_BWD_NULL) fz_expect_fail(e, "bwd is NULL");
    if (c->bwd_flags & API_BWD_STRUCT_SIZE) fz_expect_fail(e, "bwd->struct_size is wrong");
    if (bw->deterministic != 0 && bw->deterministic != 1)
        fz_expect_fail(e, "bwd->deterministic = %d is neither 0 nor 1", (int)bw->deterministic);
}

/* Inputs N(0, 1) (q, k scaled by mag) where fillable; O and LSE arbitrary
 * (a real forward may overwrite them). */
static void fill_inputs(const fz_bwd *p, fz_arena *a, tu_rng *rng, double mag) {
    const fz_tensor *t[5] = {&p->a.q, &p->a.k, &p->a.v, &p->a.o, &p->dout};
    for (int i = 0; i < 5; ++i)
        if (fz_arena_fillable(a, i) && fz_tensor_small(t[i]))
            fz_tensor_fill(t[i], a->b[i].ptr, rng, i <= W_K ? mag : 1.0);
    if (fz_arena_fillable(a, W_LSE))
        for (int64_t x = 0; x < a->b[W_LSE].bytes / 4; ++x)
            tu_store(a->b[W_LSE].ptr, SK_DTYPE_F32, x, (float)(4.0 * tu_rng_normal(rng)));
}

/* The written tensors' elements into their masks; their self-overlap. */
static void mark_outputs(const fz_bwd *p, fz_arena *a, fz_expect *e) {
    const fz_tensor *t[3] = {&p->dq, &p->dk, &p->dv};
    for (int i = 0; i < 3; ++i) {
        if (a->b[W_DQ + i].ptr == NULL || !fz_tensor_small(t[i])) continue;
        if (fz_tensor_self_overlap(t[i]))
            fz_expect_fail(e, "two elements of %s share memory", a->b[W_DQ + i].name);
        fz_tensor_mark(t[i], fz_arena_wmask(a, W_DQ + i));
    }
    if (a->b[W_O].ptr != NULL && fz_tensor_small(&p->a.o) && fz_tensor_self_overlap(&p->a.o))
        fz_expect_fail(e, "two elements of o share memory");
}

typedef struct bwd_call {
    int op;
    const sk_attention_desc *d;
    const sk_attention_backward_desc *bw;
    const sk_bsr *l;
    void *ptr[W_TENSORS];
    void *ws;
    size_t ws_bytes;
    size_t *ws_size;
} bwd_call;

static sk_status call(const bwd_call *k) {
    void *const *p = k->ptr;
    switch (k->op) {
    case API_BWD_WORKSPACE:
        return sk_attention_backward_workspace_size(k->d, k->bw, k->l, k->ws_size);
    case API_BWD_PLAN:
        return sk_attention_backward_plan(k->d, k->bw, k->l, k->ws, k->ws_bytes, NULL);
    case API_BWD_RUN:
        return sk_attention_backward_run(k->d, k->bw, k->l, p[W_Q], p[W_K], p[W_V], p[W_O],
                                         p[W_DOUT], (const float *)p[W_LSE], p[W_DQ], p[W_DK],
                                         p[W_DV], k->ws, k->ws_bytes, NULL);
    default:
        return sk_attention_backward(k->d, k->bw, k->l, p[W_Q], p[W_K], p[W_V], p[W_O], p[W_DOUT],
                                     (const float *)p[W_LSE], p[W_DQ], p[W_DK], p[W_DV], k->ws,
                                     k->ws_bytes, NULL);
    }
}

/* A success again: with deterministic = 1, bitwise the same outputs. */
static void check_repeat(const bwd_call *k, const fz_arena *a, const char *api) {
    uint8_t *before[3];
    for (int i = 0; i < 3; ++i) {
        const fz_buf *b = &a->b[W_DQ + i];
        before[i] = (uint8_t *)malloc((size_t)b->bytes + 1);
        if (before[i] == NULL) fz_fail("harness: out of memory");
        memcpy(before[i], b->ptr, (size_t)b->bytes);
    }
    const sk_status st = call(k);
    FZ_REQUIRE(st == SK_STATUS_SUCCESS, "%s: a repeated call returned %s", api, sk_status_name(st));
    for (int i = 0; i < 3; ++i) {
        const fz_buf *b = &a->b[W_DQ + i];
        if (k->bw->deterministic == 1)
            FZ_REQUIRE(memcmp(before[i], b->ptr, (size_t)b->bytes) == 0,
                       "%s: deterministic = 1, but a repeated call changed %s", api, b->name);
        free(before[i]);
    }
}

void fuzz_api_backward(const api_case *c) {
    static const char *const names[4] = {"sk_attention_backward_workspace_size",
                                         "sk_attention_backward_plan", "sk_attention_backward_run",
                                         "sk_attention_backward"};
    const char *api = names[c->op - API_BWD_WORKSPACE];
    const int tensors = c->op == API_BWD_RUN || c->op == API_BWD;
    sk_attention_desc d;
    api_attn_desc(c, &d);
    sk_attention_backward_desc bw;
    make_bwd(c, &bw);
    fz_expect e;
    fz_expect_clear(&e);
    const int sizes_ok = api_attn_expect_desc(c, &d, c->op != API_BWD_WORKSPACE, &e);
    expect_bwd(c, &bw, &e);
    api_layout l;
    if (!api_layout_build(c, c->op != API_BWD_WORKSPACE, &l)) return;
    api_attn_expect_geometry(c, &d, &l, &e);

    fz_bwd p;
    memset(&p, 0, sizeof p);
    if (sizes_ok) fz_bwd_from_desc(&p, &d, &bw);
    fz_arena a;
    fz_arena_init(&a);
    if (tensors) {
        const fz_tensor *t[W_TENSORS] = {&p.a.q, &p.a.k, &p.a.v, &p.a.o, &p.dout,
                                         NULL,   &p.dq,  &p.dk,  &p.dv};
        static const char *const tn[W_TENSORS] = {"q",   "k",  "v",  "o", "dout",
                                                  "lse", "dq", "dk", "dv"};
        for (int i = 0; i < W_TENSORS; ++i)
            if (i == W_LSE)
                fz_arena_add(&a, "lse", api_lse_count(&d, sizes_ok) * 4, 4, FZ_READ);
            else
                api_tensor_add(&a, &e, t[i], tn[i], i >= W_DQ ? FZ_WRITE : FZ_READ, sizes_ok);
    }
    api_layout_add(&l, &a);
    api_workspace_add(c, &a);
    const double work = sizes_ok ? fz_attn_work(&p.a) : 0.0;
    if (!api_place(&a, c, !e.must_fail && tensors && work > BWD_WORK_CAP, &l)) return;

    bwd_call k;
    memset(&k, 0, sizeof k);
    int fwd_ok = 0;
    if (tensors) {
        tu_rng rng;
        tu_rng_seed(&rng, c->seed);
        fill_inputs(&p, &a, &rng, api_magnitude(c));
        for (int i = 0; i < W_TENSORS; ++i) {
            k.ptr[i] = a.b[i].ptr;
            if (k.ptr[i] == NULL) fz_expect_fail(&e, "%s is NULL", a.b[i].name);
        }
        mark_outputs(&p, &a, &e);
        api_expect_apart(&e, &a);
    }
    api_layout_fill(&l, &a);
    if (tensors && (c->bwd_flags & API_BWD_REAL_FWD) && c->fault != API_FAULT_NULL_LAYOUT &&
        work <= BWD_WORK_CAP) {
        /* The forward refuses what it must (checked by its own harness
         * part); a success makes O and LSE consistent for the comparison. */
        fwd_ok = sk_attention_forward(&d, &l.bsr, k.ptr[W_Q], k.ptr[W_K], k.ptr[W_V], k.ptr[W_O],
                                      (float *)k.ptr[W_LSE], NULL, 0, NULL) == SK_STATUS_SUCCESS;
    }
    if (c->op != API_BWD_WORKSPACE && l.g.ok) {
        fz_layout_ref r;
        api_layout_eval(&l, &r);
        if (!r.ok) fz_expect_fail(&e, "the layout fails the full check");
    }
    fz_arena_snapshot(&a);

    size_t ws_size = API_UNTOUCHED_SIZE;
    k.op = c->op;
    k.d = c->fault == API_FAULT_NULL_DESC ? NULL : &d;
    k.bw = (c->bwd_flags & API_BWD_NULL) ? NULL : &bw;
    k.l = c->fault == API_FAULT_NULL_LAYOUT ? NULL : &l.bsr;
    k.ws = a.b[a.n - 1].ptr;
    k.ws_bytes = (size_t)a.b[a.n - 1].bytes;
    k.ws_size = c->fault == API_FAULT_NULL_LAYOUT && c->op == API_BWD_WORKSPACE ? NULL : &ws_size;
    const int ok = api_outcome(&a, call(&k), api, &e);
    if (c->op == API_BWD_WORKSPACE)
        FZ_REQUIRE(ws_size == (ok ? 0 : API_UNTOUCHED_SIZE),
                   "%s: *workspace_bytes = %zu after %s (the CPU needs 0)", api, ws_size,
                   ok ? "success" : "a failure");
    if (ok && tensors) {
        if (fwd_ok && !api_inputs_overlap(&a))
            fz_check_backward(&p, &l.bsr, k.ptr[W_Q], k.ptr[W_K], k.ptr[W_V], k.ptr[W_DOUT],
                              k.ptr[W_DQ], k.ptr[W_DK], k.ptr[W_DV], api);
        check_repeat(&k, &a, api);
    }
    fz_arena_free(&a);
    api_layout_free(&l);
}
