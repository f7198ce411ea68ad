/*
 * attention_paged.c - the public paged-KV attention entry points (sparsek.h,
 * "Paged KV cache"): descriptor defaults, every argument check, dispatch
 * (CPU: src/cpu/attention_varlen_ref.c; CUDA: src/cuda/attention/varlen.cu).
 *
 * The queries, output, LSE and layout are the varlen call's and are checked
 * by its step (sk_varlen_check_queries: the packed call as one batch-1
 * problem); the caches are two [num_pages, page_size, Hkv, D] tensors, the
 * flat problem's K and V (its seq_k = num_pages x page_size, for the size
 * checks); cu_seqlens_q, seq_lens_k and the page table join the aliasing
 * list as read buffers. The order: descriptor, shapes, layout geometry, the
 * three arrays' pointers, tensors, aliasing (then the CUDA workspace), on
 * the CPU the arrays' content (lengths, the page indices each sequence
 * uses, the layout against the lengths), then the backend.
 */
#include <string.h>

#include "core/attention_internal.h"
#include "core/check.h"
#include "core/internal.h"
#include "core/layout.h"
#include "core/problem.h"
#include "cpu/cpu_backend.h"
#include "cuda/backend.h"

sk_status sk_attention_paged_desc_init(sk_attention_paged_desc *desc, size_t struct_size) {
    SK_ENTER("sk_attention_paged_desc_init");
    SK_CHECK_NOT_NULL(desc);
    SK_TRY(sk_check_init_struct_size(struct_size, sizeof(sk_attention_paged_desc),
                                     "sk_attention_paged_desc"));
    memset(desc, 0, sizeof *desc);
    desc->struct_size = sizeof *desc;
    desc->backend = SK_BACKEND_CUDA;
    desc->dtype = SK_DTYPE_F16;
    desc->mask = SK_MASK_NONE;
    desc->page_size = 16;
    return SK_STATUS_SUCCESS;
}

/* The page geometry: sizes, the table's rows, the keys a row can hold. */
static sk_status check_pages(const sk_attention_paged_desc *d) {
    return sk_paged_check_pages(d->num_pages, d->page_size, d->max_pages, d->page_table_stride,
                                d->max_seqlen_k);
}

sk_status sk_paged_check_pages(int64_t num_pages, int32_t page_size, int32_t max_pages,
                               int64_t page_table_stride, int64_t max_seqlen_k) {
    SK_TRY(sk_varlen_check_count(num_pages, "num_pages"));
    if (page_size != 16 && page_size != 32 && page_size != 64 && page_size != 128)
        return sk_error(SK_STATUS_BAD_PARAM_VALUE, "desc->page_size = %d must be 16, 32, 64 or 128",
                        (int)page_size);
    if (max_pages < 1)
        return sk_error(SK_STATUS_BAD_PARAM_SHAPE, "desc->max_pages = %d must be >= 1",
                        (int)max_pages);
    if (page_table_stride < 0 || (page_table_stride != 0 && page_table_stride < max_pages))
        return sk_error(SK_STATUS_BAD_PARAM_STRIDE,
                        "desc->page_table_stride = %lld must be 0 (packed) or at least max_pages = "
                        "%d, so that the table's rows do not overlap",
                        (long long)page_table_stride, (int)max_pages);
    const int64_t keys = (int64_t)max_pages * page_size;
    if (max_seqlen_k > keys)
        return sk_error(SK_STATUS_BAD_PARAM_SHAPE,
                        "desc->max_seqlen_k = %lld exceeds max_pages x page_size = %lld, the keys a "
                        "page table row can hold",
                        (long long)max_seqlen_k, (long long)keys);
    return SK_STATUS_SUCCESS;
}

/* d is not NULL; sizes are its six sizes. */
static sk_status check_desc(const sk_attention_paged_desc *d, const int64_t sizes[6]) {
    static const char *const names[6] = {"batch",   "total_q",  "num_pages",
                                         "heads_q", "heads_kv", "head_dim"};
    SK_TRY(sk_check_desc_struct_size(d->struct_size, sizeof(sk_attention_paged_desc), "desc",
                                     "sk_attention_paged_desc_init"));
    SK_TRY(sk_check_attention_shape_named(d->backend, d->dtype, sizes, names));
    SK_TRY(sk_varlen_check_count(d->total_q, "total_q"));
    SK_TRY(sk_varlen_check_count(d->max_seqlen_q, "max_seqlen_q"));
    SK_TRY(sk_varlen_check_count(d->max_seqlen_k, "max_seqlen_k"));
    SK_TRY(check_pages(d));
    return sk_attention_check_scale_mask(d->scale, d->mask);
}

/* Everything that needs no pointer but the layout's: fills *pp but the
 * tensors and the arrays. */
static sk_status check_geometry(const sk_attention_paged_desc *d, const sk_bsr *layout,
                                sk_attention_paged_problem *pp) {
    if (d == NULL) return sk_error(SK_STATUS_BAD_PARAM_NULL_POINTER, "desc must not be NULL");
    const int64_t sizes[6] = {d->batch,   d->total_q,  d->num_pages,
                              d->heads_q, d->heads_kv, d->head_dim};
    SK_TRY(check_desc(d, sizes));
    memset(pp, 0, sizeof *pp);
    /* num_pages < 2^31 and page_size <= 128: the slot count fits. */
    const int64_t flat[6] = {1,          d->total_q,  d->num_pages * d->page_size,
                             d->heads_q, d->heads_kv, d->head_dim};
    sk_attention_problem *p = &pp->v.flat;
    SK_TRY(sk_varlen_check_queries(p, d->backend, d->dtype, flat, d->scale, d->mask, layout,
                                   "num_pages x page_size", d->q_strides, d->o_strides));
    sk_resolve_strides(d->k_strides, d->page_size, d->heads_kv, d->head_dim, p->k_stride);
    sk_resolve_strides(d->v_strides, d->page_size, d->heads_kv, d->head_dim, p->v_stride);
    pp->v.batch = (int32_t)d->batch;
    pp->v.max_seqlen_q = d->max_seqlen_q;
    pp->v.max_seqlen_k = d->max_seqlen_k;
    pp->num_pages = d->num_pages;
    pp->page_size = d->page_size;
    pp->max_pages = d->max_pages;
    pp->page_table_stride = d->page_table_stride != 0 ? d->page_table_stride : d->max_pages;
    return SK_STATUS_SUCCESS;
}

sk_status sk_paged_table_buffer(const int32_t *page_table, int64_t batch, int64_t stride,
                                int32_t max_pages, sk_buffer *out) {
    int64_t entries, table_bytes;
    if (!sk_mul_i64(batch - 1, stride, &entries) || !sk_add_i64(entries, max_pages, &entries) ||
        !sk_mul_i64(entries, 4, &table_bytes))
        return sk_error(SK_STATUS_BAD_PARAM_OVERFLOW,
                        "page_table: (batch - 1) x page_table_stride + max_pages entries of 4 bytes "
                        "overflows int64 (batch = %lld, page_table_stride = %lld)",
                        (long long)batch, (long long)stride);
    const sk_buffer table = {"page_table", page_table, table_bytes, 0};
    *out = table;
    return SK_STATUS_SUCCESS;
}

/* The three arrays: present, int32-aligned; stored in *pp, their spans
 * (read) into out[3]. */
static sk_status check_arrays(sk_attention_paged_problem *pp, const int32_t *cu_seqlens_q,
                              const int32_t *seq_lens_k, const int32_t *page_table,
                              sk_buffer out[3]) {
    SK_CHECK_NOT_NULL(cu_seqlens_q);
    SK_CHECK_NOT_NULL(seq_lens_k);
    SK_CHECK_NOT_NULL(page_table);
    SK_TRY(sk_check_alignment(cu_seqlens_q, NULL, 4, 4, 0, "cu_seqlens_q"));
    SK_TRY(sk_check_alignment(seq_lens_k, NULL, 4, 4, 0, "seq_lens_k"));
    SK_TRY(sk_check_alignment(page_table, NULL, 4, 4, 0, "page_table"));
    const int64_t batch = pp->v.batch;
    sk_buffer table;
    SK_TRY(sk_paged_table_buffer(page_table, batch, pp->page_table_stride, pp->max_pages, &table));
    const sk_buffer arrays[3] = {{"cu_seqlens_q", cu_seqlens_q, (batch + 1) * 4, 0},
                                 {"seq_lens_k", seq_lens_k, batch * 4, 0},
                                 table};
    memcpy(out, arrays, sizeof arrays);
    pp->v.cu_seqlens_q = cu_seqlens_q;
    pp->seq_lens_k = seq_lens_k;
    pp->page_table = page_table;
    return SK_STATUS_SUCCESS;
}

/* Every buffer of a run: the forward's list order (o, lse, q, then the
 * caches as k and v, the layout arrays), then the three arrays. */
enum { PAGED_ARRAYS = SK_ATTN_BUFFERS, PAGED_BUFFERS = SK_ATTN_BUFFERS + 3 };

sk_status sk_paged_check_tensors(sk_attention_paged_problem *pp, const void *q,
                                 const void *k_cache, const void *v_cache, void *o, float *lse,
                                 sk_buffer *buffers) {
    sk_attention_problem *p = &pp->v.flat;
    SK_CHECK_NOT_NULL(q);
    SK_CHECK_NOT_NULL(k_cache);
    SK_CHECK_NOT_NULL(v_cache);
    SK_CHECK_NOT_NULL(o);
    SK_TRY(sk_attention_check_row_bytes(p));
    SK_TRY(sk_attention_check_tensor(p, q, p->batch, p->seq_q, p->heads_q, p->q_stride, 0, "q",
                                     &buffers[SK_ATTN_Q]));
    SK_TRY(sk_attention_check_tensor(p, k_cache, pp->num_pages, pp->page_size, p->heads_kv,
                                     p->k_stride, 0, "k_cache", &buffers[SK_ATTN_K]));
    SK_TRY(sk_attention_check_tensor(p, v_cache, pp->num_pages, pp->page_size, p->heads_kv,
                                     p->v_stride, 0, "v_cache", &buffers[SK_ATTN_V]));
    SK_TRY(sk_attention_check_tensor(p, o, p->batch, p->seq_q, p->heads_q, p->o_stride, 1, "o",
                                     &buffers[SK_ATTN_O]));
    if (lse != NULL) SK_TRY(sk_check_alignment(lse, NULL, 4, 4, 0, "lse"));
    /* LSE [B, Hq, Sq] fp32 (paged: B = 1, Sq = total_q): its size was
     * checked with the geometry. */
    const sk_buffer lse_buffer = {"lse", lse, p->batch * p->heads_q * p->seq_q * 4, 1};
    buffers[SK_ATTN_LSE] = lse_buffer;
    sk_attention_layout_buffers(p, buffers + SK_ATTN_ROW_OFFSETS);
    p->q = q;
    p->k = k_cache;
    p->v = v_cache;
    p->o = o;
    p->lse = lse;
    return SK_STATUS_SUCCESS;
}

static sk_status problem_workspace_size(const sk_attention_paged_problem *pp, size_t *bytes) {
    if (pp->v.flat.backend == SK_BACKEND_CPU) {
        *bytes = 0;
        return SK_STATUS_SUCCESS;
    }
    return sk_cuda_attention_paged_workspace_size(pp, bytes);
}

/* The CUDA workspace (written) against buffers[]; nothing on the CPU or
 * for a NULL workspace. */
static sk_status check_workspace_apart(const sk_attention_paged_problem *pp, const void *workspace,
                                       size_t workspace_size, const sk_buffer *buffers,
                                       int count) {
    if (pp->v.flat.backend == SK_BACKEND_CPU || workspace == NULL) return SK_STATUS_SUCCESS;
    size_t bytes;
    SK_TRY(problem_workspace_size(pp, &bytes));
    return sk_check_workspace_apart(workspace, workspace_size, bytes, buffers, count);
}

/* Each sequence's key count, and the page indices it uses. */
sk_status sk_paged_check_pages_used(const sk_attention_paged_problem *pp) {
    for (int32_t b = 0; b < pp->v.batch; ++b) {
        const int32_t len_k = pp->seq_lens_k[b];
        if (len_k < 0 || len_k > pp->v.max_seqlen_k)
            return sk_error(SK_STATUS_BAD_PARAM_SHAPE,
                            "seq_lens_k[%d] = %d is outside [0, max_seqlen_k = %lld]", (int)b,
                            (int)len_k, (long long)pp->v.max_seqlen_k);
        const int64_t pages = sk_ceil_div_i64(len_k, pp->page_size);
        const int32_t *row = pp->page_table + b * pp->page_table_stride;
        for (int64_t i = 0; i < pages; ++i)
            if (row[i] < 0 || row[i] >= pp->num_pages)
                return sk_error(SK_STATUS_BAD_PARAM_VALUE,
                                "page_table[%d][%lld] = %d is outside [0, num_pages = %lld): "
                                "sequence %d has %d keys in %lld pages",
                                (int)b, (long long)i, (int)row[i], (long long)pp->num_pages, (int)b,
                                (int)len_k, (long long)pages);
    }
    return SK_STATUS_SUCCESS;
}

/* Host arrays (CPU backend): the lengths, the pages, the layout in full,
 * then the layout against the lengths. Device arrays cannot be read here. */
static sk_status check_content(const sk_attention_paged_problem *pp, const sk_bsr *layout) {
    const sk_attention_varlen_problem *v = &pp->v;
    if (v->flat.backend != SK_BACKEND_CPU) return SK_STATUS_SUCCESS;
    SK_TRY(sk_varlen_check_seqlens(v->cu_seqlens_q, v->batch, v->flat.seq_q, v->max_seqlen_q, 'q'));
    SK_TRY(sk_paged_check_pages_used(pp));
    SK_TRY(sk_layout_check(layout));
    return sk_varlen_check_layout(layout, v->batch, v->cu_seqlens_q, pp->seq_lens_k, NULL);
}

/* Every check of run and of the one-shot call. */
static sk_status check_call(const sk_attention_paged_desc *desc, const sk_bsr *layout,
                            const int32_t *cu_seqlens_q, const int32_t *seq_lens_k,
                            const int32_t *page_table, const void *q, const void *k_cache,
                            const void *v_cache, void *o, float *lse, const void *workspace,
                            size_t workspace_size, sk_attention_paged_problem *pp) {
    SK_TRY(check_geometry(desc, layout, pp));
    sk_buffer buffers[PAGED_BUFFERS];
    SK_TRY(check_arrays(pp, cu_seqlens_q, seq_lens_k, page_table, buffers + PAGED_ARRAYS));
    SK_TRY(sk_paged_check_tensors(pp, q, k_cache, v_cache, o, lse, buffers));
    SK_TRY(sk_check_no_alias(buffers, PAGED_BUFFERS));
    SK_TRY(check_workspace_apart(pp, workspace, workspace_size, buffers, PAGED_BUFFERS));
    return check_content(pp, layout);
}

static sk_status plan_checked(const sk_attention_paged_problem *pp, void *workspace,
                              size_t workspace_size, struct CUstream_st *stream) {
    if (pp->v.flat.backend == SK_BACKEND_CPU) return SK_STATUS_SUCCESS;
    return sk_cuda_attention_paged_plan(pp, workspace, workspace_size, stream);
}

static sk_status run_checked(const sk_attention_paged_problem *pp, void *workspace,
                             size_t workspace_size, struct CUstream_st *stream) {
    if (pp->v.flat.backend == SK_BACKEND_CPU) return sk_cpu_attention_paged_run(pp);
    return sk_cuda_attention_paged_run(pp, workspace, workspace_size, stream);
}

sk_status sk_attention_paged_workspace_size(const sk_attention_paged_desc *desc,
                                            const sk_bsr *layout, size_t *workspace_bytes) {
    SK_ENTER("sk_attention_paged_workspace_size");
    SK_CHECK_NOT_NULL(workspace_bytes);
    sk_attention_paged_problem pp;
    SK_TRY(check_geometry(desc, layout, &pp));
    return problem_workspace_size(&pp, workspace_bytes);
}

sk_status sk_attention_paged_plan(const sk_attention_paged_desc *desc, const sk_bsr *layout,
                                  const int32_t *cu_seqlens_q, const int32_t *seq_lens_k,
                                  const int32_t *page_table, void *workspace,
                                  size_t workspace_size, struct CUstream_st *stream) {
    SK_ENTER("sk_attention_paged_plan");
    sk_attention_paged_problem pp;
    SK_TRY(check_geometry(desc, layout, &pp));
    /* The plan writes the workspace and reads the layout and the arrays. */
    sk_buffer arrays[5];
    SK_TRY(check_arrays(&pp, cu_seqlens_q, seq_lens_k, page_table, arrays + 2));
    sk_attention_layout_buffers(&pp.v.flat, arrays);
    SK_TRY(check_workspace_apart(&pp, workspace, workspace_size, arrays, 5));
    SK_TRY(check_content(&pp, layout));
    return plan_checked(&pp, workspace, workspace_size, stream);
}

sk_status sk_attention_paged_run(const sk_attention_paged_desc *desc, const sk_bsr *layout,
                                 const int32_t *cu_seqlens_q, const int32_t *seq_lens_k,
                                 const int32_t *page_table, const void *q, const void *k_cache,
                                 const void *v_cache, void *o, float *lse, void *workspace,
                                 size_t workspace_size, struct CUstream_st *stream) {
    SK_ENTER("sk_attention_paged_run");
    sk_attention_paged_problem pp;
    SK_TRY(check_call(desc, layout, cu_seqlens_q, seq_lens_k, page_table, q, k_cache, v_cache, o,
                      lse, workspace, workspace_size, &pp));
    return run_checked(&pp, workspace, workspace_size, stream);
}

sk_status sk_attention_paged_forward(const sk_attention_paged_desc *desc, const sk_bsr *layout,
                                     const int32_t *cu_seqlens_q, const int32_t *seq_lens_k,
                                     const int32_t *page_table, const void *q, const void *k_cache,
                                     const void *v_cache, void *o, float *lse, void *workspace,
                                     size_t workspace_size, struct CUstream_st *stream) {
    SK_ENTER("sk_attention_paged_forward");
    sk_attention_paged_problem pp;
    SK_TRY(check_call(desc, layout, cu_seqlens_q, seq_lens_k, page_table, q, k_cache, v_cache, o,
                      lse, workspace, workspace_size, &pp));
    SK_TRY(plan_checked(&pp, workspace, workspace_size, stream));
    return run_checked(&pp, workspace, workspace_size, stream);
}
