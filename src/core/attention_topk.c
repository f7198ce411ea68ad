/*
 * attention_topk.c - sk_attention_topk and its workspace size: a top-k
 * selection (sk_pool_select_topk's steps, topk_internal.h) into the
 * caller's layout, then the attention over that layout (its steps,
 * attention_internal.h), on one stream. Every check of both runs before
 * anything is enqueued.
 */
#include <string.h>

#include "core/attention_internal.h"
#include "core/check.h"
#include "core/internal.h"
#include "core/topk_internal.h"

/* Workspace parts start at multiples of this (relative to its base). */
enum { WS_ALIGN = 256 };

static size_t align_up(size_t x) {
    return (x + WS_ALIGN - 1) / WS_ALIGN * WS_ALIGN;
}

/* The attention descriptor against the top-k one: present, initialised, and
 * describing the same problem. Its other fields are checked by the attention
 * entry points. */
static sk_status check_same_problem(const sk_attention_desc *a, const sk_topk_problem *p) {
    if (a == NULL) return sk_error(SK_STATUS_BAD_PARAM_NULL_POINTER, "attn must not be NULL");
    SK_TRY(sk_attention_check_struct_size(a, "attn"));
    if (a->backend != p->backend)
        return sk_error(SK_STATUS_BAD_PARAM_VALUE,
                        "attn->backend = %d differs from topk->backend = %d", (int)a->backend,
                        (int)p->backend);
    if (a->dtype != p->dtype)
        return sk_error(SK_STATUS_BAD_PARAM_DTYPE, "attn->dtype = %s differs from topk->dtype = %s",
                        sk_dtype_name(a->dtype), sk_dtype_name(p->dtype));
    const int64_t as[6] = {a->batch, a->seq_q, a->seq_k, a->heads_q, a->heads_kv, a->head_dim};
    const int64_t ts[6] = {p->batch, p->seq_q, p->seq_k, p->heads_q, p->heads_kv, p->head_dim};
    static const char *const names[6] = {"batch",   "seq_q",    "seq_k",
                                         "heads_q", "heads_kv", "head_dim"};
    for (int i = 0; i < 6; ++i)
        if (as[i] != ts[i])
            return sk_error(SK_STATUS_BAD_PARAM_SHAPE,
                            "attn->%s = %lld differs from topk->%s = %lld", names[i],
                            (long long)as[i], names[i], (long long)ts[i]);
    int64_t aq[3], ak[3];
    sk_resolve_strides(a->q_strides, a->seq_q, a->heads_q, a->head_dim, aq);
    sk_resolve_strides(a->k_strides, a->seq_k, a->heads_kv, a->head_dim, ak);
    for (int i = 0; i < 3; ++i) {
        if (aq[i] != p->q_stride[i])
            return sk_error(SK_STATUS_BAD_PARAM_STRIDE,
                            "attn->q_strides[%d] = %lld differs from topk->q_strides[%d] = %lld "
                            "(after resolving packed strides)",
                            i, (long long)aq[i], i, (long long)p->q_stride[i]);
        if (ak[i] != p->k_stride[i])
            return sk_error(SK_STATUS_BAD_PARAM_STRIDE,
                            "attn->k_strides[%d] = %lld differs from topk->k_strides[%d] = %lld "
                            "(after resolving packed strides)",
                            i, (long long)ak[i], i, (long long)p->k_stride[i]);
    }
    return SK_STATUS_SUCCESS;
}

/* Workspace of sk_attention_topk on CUDA: [sk_pool_select_topk's]
 * [attention], the attention's at a multiple of WS_ALIGN. */
typedef struct topk_ws_plan {
    size_t select_bytes, attn_off, attn_bytes, total; /* pool + select, then the attention's */
} topk_ws_plan;

static int32_t geometry_dummy; /* a non-NULL array for geometry-only layout views */

/* Checks the attention descriptor against the output layout's geometry
 * (filling *ap) and sizes the workspace. `layout` may be NULL (workspace
 * size call): a geometry-only view is checked then. */
static sk_status plan_attention_topk(const sk_attention_desc *attn, const sk_topk_problem *p,
                                     const sk_bsr *layout, sk_attention_problem *ap,
                                     topk_ws_plan *w) {
    sk_bsr geom;
    memset(&geom, 0, sizeof geom);
    geom.grid = p->grid;
    geom.nnz = p->capacity;
    geom.row_offsets = layout != NULL ? layout->row_offsets : &geometry_dummy;
    geom.col_indices =
        layout != NULL && layout->col_indices != NULL ? layout->col_indices : &geometry_dummy;
    SK_TRY(sk_attention_check_geometry(attn, &geom, ap));
    size_t attn_bytes = 0;
    SK_TRY(sk_attention_problem_workspace_size(ap, &attn_bytes));
    memset(w, 0, sizeof *w);
    if (p->backend == SK_BACKEND_CPU) return SK_STATUS_SUCCESS;
    SK_TRY(sk_topk_select_bytes(p, SK_TOPK_POOLED, &w->select_bytes));
    w->attn_off = align_up(w->select_bytes);
    w->attn_bytes = attn_bytes;
    w->total = w->attn_off + attn_bytes;
    return SK_STATUS_SUCCESS;
}

sk_status sk_attention_topk_workspace_size(const sk_attention_desc *attn, const sk_topk_desc *topk,
                                           size_t *workspace_bytes) {
    SK_ENTER("sk_attention_topk_workspace_size");
    SK_CHECK_NOT_NULL(workspace_bytes);
    sk_topk_problem p;
    SK_TRY(sk_topk_build_problem(topk, &p));
    SK_TRY(check_same_problem(attn, &p));
    SK_TRY(sk_topk_check_cuda_head_dim(&p));
    topk_ws_plan w;
    sk_attention_problem ap;
    SK_TRY(plan_attention_topk(attn, &p, NULL, &ap, &w));
    *workspace_bytes = w.total;
    return SK_STATUS_SUCCESS;
}

sk_status sk_attention_topk(const sk_attention_desc *attn, const sk_topk_desc *topk, const void *q,
                            const void *k, const void *v, void *o, float *lse, sk_bsr *layout,
                            void *workspace, size_t workspace_size, struct CUstream_st *stream) {
    SK_ENTER("sk_attention_topk");
    sk_topk_problem p;
    SK_TRY(sk_topk_build_problem(topk, &p));
    SK_TRY(check_same_problem(attn, &p));

    /* Q and K as the pooling checks them; then the attention's own checks
     * of its descriptor against the output layout's geometry, and of all
     * five tensors (which give the byte spans of the aliasing check). */
    int64_t q_bytes, k_bytes;
    SK_TRY(sk_topk_check_qk(&p, q, k, &q_bytes, &k_bytes));
    SK_TRY(sk_topk_check_layout_out(&p, layout));
    topk_ws_plan w;
    sk_attention_problem ap;
    SK_TRY(plan_attention_topk(attn, &p, layout, &ap, &w));
    sk_buffer tensors[SK_ATTN_BUFFERS];
    SK_TRY(sk_attention_check_tensors(&ap, q, k, v, o, lse, tensors));

    /* The aliasing rule: this call writes the layout arrays (listed first,
     * at their capacity), O and LSE, and on CUDA the workspace. */
    sk_buffer buffers[SK_ATTN_BUFFERS];
    buffers[0] = tensors[SK_ATTN_ROW_OFFSETS];
    buffers[1] = tensors[SK_ATTN_COL_INDICES];
    buffers[0].written = buffers[1].written = 1;
    memcpy(buffers + 2, tensors, SK_ATTN_ROW_OFFSETS * sizeof *tensors);
    SK_TRY(sk_check_no_alias(buffers, SK_ATTN_BUFFERS));
    const int cuda = sk_backend_is_cuda(p.backend);
    if (cuda) {
        SK_TRY(sk_topk_check_workspace(workspace, workspace_size, w.total));
        SK_TRY(
            sk_check_workspace_apart(workspace, workspace_size, w.total, buffers, SK_ATTN_BUFFERS));
    }

    /* Selection, then the attention over the layout it wrote. */
    p.q = q;
    p.k_in = k;
    SK_TRY(sk_topk_run_select(&p, 1, layout, workspace, cuda ? w.select_bytes : 0, stream));
    if (!cuda) {
        /* A host layout is checked in full: give it the real count (below
         * the capacity when NaN / -inf scores left rows short). */
        sk_bsr view;
        memset(&view, 0, sizeof view);
        view.grid = p.grid;
        view.row_offsets = layout->row_offsets;
        view.col_indices = layout->col_indices;
        view.nnz = layout->row_offsets[p.total_rows];
        ap.nnz = view.nnz;
        SK_TRY(sk_attention_check_layout_content(&ap, &view));
        SK_TRY(sk_attention_enqueue(&ap, NULL, 0, stream));
    } else {
        char *base = (char *)workspace;
        SK_TRY(sk_attention_enqueue(&ap, w.attn_bytes > 0 ? base + w.attn_off : NULL, w.attn_bytes,
                                    stream));
    }
    return SK_STATUS_SUCCESS;
}
