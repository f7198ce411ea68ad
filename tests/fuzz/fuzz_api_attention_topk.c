/*
 * fuzz_api_attention_topk.c - sk_attention_topk and its workspace size on
 * the CPU backend (part of the fuzz_api harness).
 *
 * Two descriptors that must describe the same problem (sizes, dtype, Q/K
 * strides after resolving, backend, blocks): attn_fault makes one field
 * differ. Buffers: q, k, v (read), o, lse and the output layout's arrays
 * (written), the workspace (unused on the CPU). Beyond the rules of both
 * descriptors (fuzz_api_topk.c, fuzz_api_attention.c), every output must
 * lie apart from everything else. A success gives the layout of
 * sk_pool_select_topk on the same Q and K ("the selection that
 * sk_attention_topk runs"), and O and LSE of the dense fp64 reference
 * masked by it.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/test_util.h"
#include "fuzz_api.h"
#include "fz_attn_ref.h"

/* attn from the top-k descriptor, one field changed by the fault. */
static void make_attn(const api_case *c, const api_topk *p, sk_attention_desc *a, fz_expect *e) {
    sk_attention_desc_init(a, sizeof *a);
    API_DESC_COMMON(a, c); /* as the top-k descriptor */
    a->mask = (sk_mask)c->mask;
    memcpy(a->v_strides, c->strides[2], sizeof a->v_strides);
    memcpy(a->o_strides, c->strides[3], sizeof a->o_strides);
    if (fz_scale_refused(a->scale) == 1)
        fz_expect_fail(e, "attn->scale = %g is beyond the attention's scale rule",
                       (double)a->scale);
    if (a->mask != SK_MASK_NONE && a->mask != SK_MASK_CAUSAL)
        fz_expect_fail(e, "attn->mask = %d is not an sk_mask", (int)a->mask);
    switch (c->attn_fault % 8) {
    case 2:
        a->backend = (sk_backend)(a->backend + 1);
        break;
    case 3:
        a->dtype = a->dtype == SK_DTYPE_F16 ? SK_DTYPE_BF16 : SK_DTYPE_F16;
        break;
    case 4:
        a->batch += a->batch < INT64_MAX;
        break;
    case 5:
        a->seq_q += a->seq_q < INT64_MAX;
        break;
    case 6:
        a->head_dim += a->head_dim < INT64_MAX;
        break;
    case 7: /* K's strides given explicitly, the batch one different */
        if (p->k.span_ok && p->k.st[0] < INT64_MAX) {
            memcpy(a->k_strides, p->k.st, sizeof a->k_strides);
            a->k_strides[0] += 1;
        }
        break;
    default:
        return;
    }
    if (c->attn_fault % 8 != 7 || (p->k.span_ok && p->k.st[0] < INT64_MAX))
        fz_expect_fail(e, "attn and topk differ (fault %d)", c->attn_fault % 8);
}

static void workspace_call(const api_case *c, const api_topk *p, const sk_attention_desc *a,
                           fz_expect *e) {
    size_t ws = API_UNTOUCHED_SIZE;
    size_t *out = c->fault == API_FAULT_NULL_LAYOUT ? NULL : &ws;
    if (out == NULL) fz_expect_fail(e, "workspace_bytes is NULL");
    const int null_attn = c->fault == API_FAULT_NULL_DESC && (c->seed & 2);
    const int null_topk = c->fault == API_FAULT_NULL_DESC && !(c->seed & 2);
    const sk_status st =
        sk_attention_topk_workspace_size(null_attn ? NULL : a, null_topk ? NULL : &p->d, out);
    fz_check_status(st, "sk_attention_topk_workspace_size", e);
    FZ_REQUIRE(ws == (st == SK_STATUS_SUCCESS ? 0 : API_UNTOUCHED_SIZE),
               "sk_attention_topk_workspace_size: *workspace_bytes = %zu", ws);
}

/* The selection sk_attention_topk runs: sk_pool_select_topk on private
 * buffers gives the same layout. */
static void check_same_selection(const api_topk *p, const sk_bsr *got) {
    api_topk_out want;
    api_topk_out_init(p, &want);
    FZ_REQUIRE(sk_pool_select_topk(&p->d, p->t.q, p->t.k, &want.bsr, NULL, 0, NULL) ==
                   SK_STATUS_SUCCESS,
               "sk_pool_select_topk failed where sk_attention_topk succeeded");
    api_topk_out_require(p, &want, got, "sk_attention_topk vs sk_pool_select_topk");
}

enum { B_Q, B_K, B_V, B_O, B_LSE, B_OFF, B_IDX };

void fuzz_api_attention_topk(const api_case *c) {
    api_topk p;
    fz_expect e;
    fz_expect_clear(&e);
    api_topk_init(c, &p, &e);
    if (p.huge) return;
    sk_attention_desc ad;
    make_attn(c, &p, &ad, &e);
    if (c->op == API_ATTN_TOPK_WORKSPACE) {
        workspace_call(c, &p, &ad, &e);
        return;
    }
    fz_attn fa;
    memset(&fa, 0, sizeof fa);
    const int usable = p.sizes_ok && p.g.ok;
    if (usable) fz_attn_from_desc(&fa, &ad);
    fz_arena a;
    fz_arena_init(&a);
    api_topk_add_qk(&p, &a, &e);
    const fz_tensor *vo[2] = {&fa.v, &fa.o};
    static const char *const vo_names[2] = {"v", "o"};
    for (int i = 0; i < 2; ++i) {
        if (usable && !vo[i]->span_ok)
            fz_expect_fail(&e, "%s: strides negative or span overflows", vo_names[i]);
        fz_arena_add(&a, vo_names[i], vo[i]->span_ok ? vo[i]->bytes : 64, vo[i]->es ? vo[i]->es : 4,
                     i == 0 ? FZ_READ : FZ_WRITE);
    }
    int64_t lse_n = 1;
    if (usable && (__builtin_mul_overflow(p.d.batch, p.d.heads_q, &lse_n) ||
                   __builtin_mul_overflow(lse_n, p.d.seq_q, &lse_n) || lse_n > API_BYTES_CAP))
        lse_n = API_BYTES_CAP;
    fz_arena_add(&a, "lse", (c->flags & API_LSE) ? lse_n * 4 : 0, 4, FZ_WRITE);
    api_topk_add_layout(&p, &a);
    api_workspace_add(c, &a);
    const double work = usable ? fz_attn_work(&fa) : 0.0;
    const int sized = p.small && p.capacity >= 0;
    if (!api_place(&a, c, !e.must_fail && (!sized || work > API_WORK_CAP), NULL)) return;
    tu_rng rng;
    tu_rng_seed(&rng, c->seed);
    api_topk_fill_qk(&p, &a, B_Q, &rng, api_magnitude(c));
    if (fz_arena_fillable(&a, B_V) && fz_tensor_small(&fa.v))
        fz_tensor_fill(&fa.v, a.b[B_V].ptr, &rng, 1.0);
    for (int i = B_Q; i <= B_O; ++i)
        if (a.b[i].ptr == NULL) fz_expect_fail(&e, "%s is NULL", a.b[i].name);
    if (a.b[B_O].ptr != NULL && fz_tensor_small(&fa.o)) {
        if (fz_tensor_self_overlap(&fa.o)) fz_expect_fail(&e, "two elements of o share memory");
        fz_tensor_mark(&fa.o, fz_arena_wmask(&a, B_O));
    }
    sk_bsr lay;
    api_topk_layout_struct(c, &p, &a, B_OFF, &lay, &e);
    api_expect_apart(&e, &a);
    fz_arena_snapshot(&a);
    const sk_bsr lay0 = lay;

    const int null_attn = c->fault == API_FAULT_NULL_DESC && (c->seed & 2);
    const int null_topk = c->fault == API_FAULT_NULL_DESC && !(c->seed & 2);
    float *lse = (c->flags & API_LSE) ? (float *)(void *)a.b[B_LSE].ptr : NULL;
    const sk_status st = sk_attention_topk(null_attn ? NULL : &ad, null_topk ? NULL : &p.d,
                                           a.b[B_Q].ptr, a.b[B_K].ptr, a.b[B_V].ptr, a.b[B_O].ptr,
                                           lse, c->fault == API_FAULT_NULL_LAYOUT ? NULL : &lay,
                                           a.b[a.n - 1].ptr, (size_t)a.b[a.n - 1].bytes, NULL);
    const int ok = api_outcome(&a, st, "sk_attention_topk", &e);
    if (!ok)
        FZ_REQUIRE(memcmp(&lay, &lay0, sizeof lay) == 0,
                   "sk_attention_topk: the layout struct changed");
    if (ok && !api_inputs_overlap(&a)) {
        api_topk_check_layout(&p, &lay, "sk_attention_topk");
        check_same_selection(&p, &lay);
        sk_bsr view = lay;
        view.nnz = lay.row_offsets[p.g.total_rows];
        fz_check_attention(&fa, &view, a.b[B_Q].ptr, a.b[B_K].ptr, a.b[B_V].ptr, a.b[B_O].ptr, lse,
                           "sk_attention_topk");
    }
    fz_arena_free(&a);
}
