/*
 * topk_varlen.c - the top-k selection on varlen and paged inputs (sparsek.h
 * "Top-k selection on varlen and paged inputs"): descriptor defaults, every
 * argument check, dispatch (CPU: src/cpu/topk_varlen_ref.c; CUDA:
 * src/cuda/topk/select_varlen.cu).
 *
 * The per-sequence rules, blocks and scale are the fixed selection's: the
 * descriptor is checked through sk_topk_build_problem on a one-row-block
 * fixed descriptor (same field names in messages), whose problem becomes
 * the per-sequence template. The varlen geometry (R rows per slice, the key
 * block capacity, the score matrix limit, the capacity) is this file's.
 * Order: descriptor, tensors, arrays, layout arrays, aliasing (then the
 * CUDA workspace), on the CPU the arrays' content, then the backend.
 */
#include <string.h>

#include "core/attention_internal.h"
#include "core/check.h"
#include "core/internal.h"
#include "core/layout.h"
#include "core/topk_internal.h"
#include "cpu/cpu_backend.h"
#include "cuda/backend.h"

sk_status sk_topk_varlen_desc_init(sk_topk_varlen_desc *desc, size_t struct_size) {
    SK_ENTER("sk_topk_varlen_desc_init");
    SK_CHECK_NOT_NULL(desc);
    SK_TRY(sk_check_init_struct_size(struct_size, sizeof(sk_topk_varlen_desc),
                                     "sk_topk_varlen_desc"));
    memset(desc, 0, sizeof *desc);
    desc->struct_size = sizeof *desc;
    desc->backend = SK_BACKEND_CUDA;
    desc->dtype = SK_DTYPE_F16;
    desc->block_q = 128;
    desc->block_k = 128;
    desc->k = 16;
    desc->mask = SK_MASK_NONE;
    desc->page_size = 16;
    return SK_STATUS_SUCCESS;
}

/* The fixed descriptor whose checks and problem serve every sequence: one
 * query row block, the longest key range (its score matrix is one row). */
static void fixed_desc(const sk_topk_varlen_desc *d, sk_topk_desc *f) {
    memset(f, 0, sizeof *f);
    f->struct_size = sizeof *f;
    f->backend = d->backend;
    f->dtype = d->dtype;
    f->batch = 1;
    f->seq_q = d->block_q == 64 ? 64 : 128;
    f->seq_k = d->max_seqlen_k;
    f->heads_q = d->heads_q;
    f->heads_kv = d->heads_kv;
    f->head_dim = d->head_dim;
    f->block_q = d->block_q;
    f->block_k = d->block_k;
    f->scale = d->scale;
    f->k = d->k;
    f->sink_blocks = d->sink_blocks;
    f->local_blocks = d->local_blocks;
    f->mask = d->mask;
    f->per_kv_head = d->per_kv_head;
}

/* Block rows a sequence of `len` tokens can need in total over B sequences
 * of `total` tokens: sk_varlen_max_row_blocks' rule (layout_varlen.c),
 * inputs already checked. */
static int64_t max_blocks(int64_t batch, int64_t total, int64_t max_len, int32_t block) {
    int64_t r = batch * sk_ceil_div_i64(max_len, block);
    const int64_t spread = (total + batch * (block - 1)) / block;
    if (spread < r) r = spread;
    if (total < r) r = total;
    return r > 0 ? r : 1;
}

/* What a descriptor is checked for: the varlen call, the paged call, or the
 * layout alone (neither total_k nor the page fields). */
typedef enum { TV_VARLEN, TV_PAGED, TV_LAYOUT } tv_mode;

static sk_status check_desc(const sk_topk_varlen_desc *d, tv_mode mode) {
    if (d == NULL) return sk_error(SK_STATUS_BAD_PARAM_NULL_POINTER, "desc must not be NULL");
    SK_TRY(sk_check_desc_struct_size(d->struct_size, sizeof(sk_topk_varlen_desc), "desc",
                                     "sk_topk_varlen_desc_init"));
    static const char *const third[3] = {"total_k", "num_pages", "max_seqlen_k"};
    const char *const names[6] = {"batch", "total_q", third[mode], "heads_q", "heads_kv",
                                  "head_dim"};
    const int64_t keys = mode == TV_VARLEN ? d->total_k
                         : mode == TV_PAGED ? d->num_pages
                                            : d->max_seqlen_k;
    const int64_t sizes[6] = {d->batch, d->total_q, keys, d->heads_q, d->heads_kv, d->head_dim};
    SK_TRY(sk_check_attention_shape_named(d->backend, d->dtype, sizes, names));
    SK_TRY(sk_varlen_check_count(d->total_q, "total_q"));
    if (mode == TV_VARLEN) SK_TRY(sk_varlen_check_count(d->total_k, "total_k"));
    SK_TRY(sk_varlen_check_count(d->max_seqlen_q, "max_seqlen_q"));
    SK_TRY(sk_varlen_check_count(d->max_seqlen_k, "max_seqlen_k"));
    if (mode == TV_PAGED)
        SK_TRY(sk_paged_check_pages(d->num_pages, d->page_size, d->max_pages,
                                    d->page_table_stride, d->max_seqlen_k));
    return SK_STATUS_SUCCESS;
}

/* The descriptor alone: fills *vp (pointers NULL). */
static sk_status build_problem(const sk_topk_varlen_desc *d, tv_mode mode,
                               sk_topk_varlen_problem *vp) {
    SK_TRY(check_desc(d, mode));
    const int paged = mode == TV_PAGED;
    sk_topk_desc f;
    fixed_desc(d, &f);
    sk_topk_problem t;
    SK_TRY(sk_topk_build_problem(&f, &t));
    SK_TRY(sk_topk_check_cuda_head_dim(&t));

    memset(vp, 0, sizeof *vp);
    const int32_t bq = d->block_q, bk = d->block_k;
    const int64_t rows = max_blocks(d->batch, d->total_q, d->max_seqlen_q, bq);
    const int64_t max_kb = sk_ceil_div_i64(d->max_seqlen_k, bk);
    /* Paged keys have no total: every sequence may reach max_seqlen_k. */
    const int64_t kb_cap = mode == TV_VARLEN ? max_blocks(d->batch, d->total_k, d->max_seqlen_k, bk)
                           : mode == TV_PAGED ? d->batch * max_kb
                                              : 0;
    int64_t row_cap = (int64_t)d->k + d->sink_blocks + d->local_blocks;
    if (row_cap > max_kb) row_cap = max_kb;
    const int64_t slices = t.heads;
    /* The CUDA path scores every row against max_kb columns into one dense
     * fp32 matrix (int32 indexed): the fixed selection's limit. */
    const int64_t score_count = slices * rows * max_kb; /* < 2^31 x 2^25 x 2^25 */
    if (score_count > INT32_MAX)
        return sk_error(SK_STATUS_BAD_LAYOUT_OVERFLOW,
                        "desc: the varlen top-k score matrix [%lld slices, %lld rows, %lld key "
                        "blocks] has %lld entries, more than the selection's limit of INT32_MAX "
                        "= %d; select over fewer sequences or heads",
                        (long long)slices, (long long)rows, (long long)max_kb,
                        (long long)score_count, INT32_MAX);
    /* Pooled Q [Hq, R, D] and K [Hkv, kb_cap, D] fp32: one CUDA CTA per
     * pooled row (int32 counts), and byte sizes that fit. */
    const int64_t pq_sizes[4] = {rows, d->heads_q, d->head_dim, 4};
    const int64_t pk_sizes[4] = {kb_cap, d->heads_kv, d->head_dim, 4};
    int64_t bytes;
    if (rows * d->heads_q > INT32_MAX || kb_cap * d->heads_kv > INT32_MAX ||
        !sk_product_i64(pq_sizes, 4, &bytes) || !sk_product_i64(pk_sizes, 4, &bytes))
        return sk_error(SK_STATUS_BAD_PARAM_OVERFLOW,
                        "desc: the pooled blocks (%lld query rows x heads_q, %lld key blocks x "
                        "heads_kv) exceed INT32_MAX rows or int64 bytes",
                        (long long)rows, (long long)kb_cap);

    vp->t = t;
    vp->t.seq_q = vp->t.seq_k = 0; /* per sequence */
    sk_varlen_resolve_strides(d->q_strides, d->heads_q, d->head_dim, vp->t.q_stride);
    if (paged)
        sk_resolve_strides(d->k_cache_strides, d->page_size, d->heads_kv, d->head_dim,
                           vp->t.k_stride);
    else
        sk_varlen_resolve_strides(d->k_strides, d->heads_kv, d->head_dim, vp->t.k_stride);
    vp->batch = (int32_t)d->batch;
    vp->paged = paged != 0;
    vp->total_q = d->total_q;
    vp->total_k = paged ? 0 : d->total_k;
    vp->max_seqlen_q = d->max_seqlen_q;
    vp->max_seqlen_k = d->max_seqlen_k;
    vp->rows = (int32_t)rows;
    vp->max_kb = (int32_t)max_kb;
    vp->kb_cap = (int32_t)kb_cap;
    vp->row_cap = (int32_t)row_cap;
    vp->slices = (int32_t)slices;
    vp->capacity = (int32_t)(slices * rows * row_cap); /* <= score_count */
    vp->t.capacity = vp->capacity;
    vp->t.total_rows = (int32_t)(slices * rows);
    memset(&vp->grid, 0, sizeof vp->grid);
    vp->grid.rows = rows * bq;
    vp->grid.cols = d->max_seqlen_k;
    vp->grid.block_rows = bq;
    vp->grid.block_cols = bk;
    vp->grid.batch = 1;
    vp->grid.heads = (int32_t)slices;
    if (paged) {
        vp->num_pages = d->num_pages;
        vp->page_size = d->page_size;
        vp->max_pages = d->max_pages;
        vp->page_table_stride = d->page_table_stride != 0 ? d->page_table_stride : d->max_pages;
    }
    return SK_STATUS_SUCCESS;
}

/* One input tensor [n0, n1, heads, D] (strides over the three outer axes):
 * extent, alignment (CUDA: 16-byte pointer and strides), its span. */
static sk_status check_tensor(const sk_topk_varlen_problem *vp, const void *ptr, int64_t n0,
                              int64_t n1, int64_t heads, const int64_t stride[3], const char *what,
                              sk_buffer *out) {
    if (ptr == NULL)
        return sk_error(SK_STATUS_BAD_PARAM_NULL_POINTER, "%s must not be NULL", what);
    const size_t es = sk_dtype_size(vp->t.dtype);
    sk_tensor_shape ts;
    sk_tensor_shape_init(&ts, n0, n1, heads, vp->t.head_dim, stride);
    int64_t span;
    SK_TRY(sk_check_tensor_extent(&ts, es, what, &span));
    const int cuda = sk_backend_is_cuda(vp->t.backend);
    SK_TRY(sk_check_alignment(ptr, &ts, es, cuda ? 16 : es, cuda ? 16 : 0, what));
    const sk_buffer b = {what, ptr, span, 0};
    *out = b;
    return SK_STATUS_SUCCESS;
}

/* An int32 array of `entries` (host or device): present, aligned. */
static sk_status check_array(const int32_t *ptr, int64_t entries, const char *what,
                             sk_buffer *out) {
    if (ptr == NULL)
        return sk_error(SK_STATUS_BAD_PARAM_NULL_POINTER, "%s must not be NULL", what);
    SK_TRY(sk_check_alignment(ptr, NULL, 4, 4, 0, what));
    const sk_buffer b = {what, ptr, entries * 4, 0};
    *out = b;
    return SK_STATUS_SUCCESS;
}

static sk_status workspace_bytes_of(const sk_topk_varlen_problem *vp, size_t *bytes) {
    *bytes = 0;
    if (vp->t.backend == SK_BACKEND_CPU) return SK_STATUS_SUCCESS;
    return sk_cuda_topk_varlen_workspace_size(vp, bytes);
}

/* Host arrays (CPU backend): the lengths and the pages each sequence uses. */
static sk_status check_content(const sk_topk_varlen_problem *vp) {
    if (vp->t.backend != SK_BACKEND_CPU) return SK_STATUS_SUCCESS;
    SK_TRY(sk_varlen_check_seqlens(vp->cu_seqlens_q, vp->batch, vp->total_q, vp->max_seqlen_q,
                                   'q'));
    if (!vp->paged)
        return sk_varlen_check_seqlens(vp->cu_seqlens_k, vp->batch, vp->total_k,
                                       vp->max_seqlen_k, 'k');
    sk_attention_paged_problem pp;
    memset(&pp, 0, sizeof pp);
    pp.v.batch = vp->batch;
    pp.v.max_seqlen_k = vp->max_seqlen_k;
    pp.seq_lens_k = vp->seq_lens_k;
    pp.page_table = vp->page_table;
    pp.num_pages = vp->num_pages;
    pp.page_table_stride = vp->page_table_stride;
    pp.page_size = vp->page_size;
    pp.max_pages = vp->max_pages;
    return sk_paged_check_pages_used(&pp);
}

enum { TV_BUFFERS = 6 }; /* row_offsets, col_indices, q, k, two or three arrays */

/* Everything after the descriptor; then the run. k_arrays: cu_seqlens_k
 * (varlen) or seq_lens_k and page_table (paged). */
static sk_status check_and_run(sk_topk_varlen_problem *vp, const int32_t *cu_seqlens_q,
                               const int32_t *k_arrays[2], const void *q, const void *k,
                               sk_bsr *layout, void *workspace, size_t workspace_size,
                               struct CUstream_st *stream) {
    sk_buffer buffers[TV_BUFFERS + 1];
    int n = 2;
    SK_TRY(check_tensor(vp, q, 1, vp->total_q, vp->t.heads_q, vp->t.q_stride, "q", &buffers[n++]));
    if (vp->paged)
        SK_TRY(check_tensor(vp, k, vp->num_pages, vp->page_size, vp->t.heads_kv, vp->t.k_stride,
                            "k_cache", &buffers[n++]));
    else
        SK_TRY(check_tensor(vp, k, 1, vp->total_k, vp->t.heads_kv, vp->t.k_stride, "k",
                            &buffers[n++]));
    SK_TRY(check_array(cu_seqlens_q, (int64_t)vp->batch + 1, "cu_seqlens_q", &buffers[n++]));
    if (vp->paged) {
        SK_TRY(check_array(k_arrays[0], vp->batch, "seq_lens_k", &buffers[n++]));
        SK_TRY(check_array(k_arrays[1], 1, "page_table", &buffers[n]));
        SK_TRY(sk_paged_table_buffer(k_arrays[1], vp->batch, vp->page_table_stride,
                                     vp->max_pages, &buffers[n++]));
    } else {
        SK_TRY(check_array(k_arrays[0], (int64_t)vp->batch + 1, "cu_seqlens_k", &buffers[n++]));
    }
    SK_TRY(sk_topk_check_layout_out(&vp->t, layout));
    sk_layout_array_buffers(buffers, "layout->row_offsets", "layout->col_indices",
                            layout->row_offsets, vp->t.total_rows, layout->col_indices,
                            vp->capacity, 1);
    SK_TRY(sk_check_no_alias(buffers, n));
    size_t need;
    SK_TRY(workspace_bytes_of(vp, &need));
    SK_TRY(sk_topk_check_workspace(workspace, workspace_size, need));
    SK_TRY(sk_check_workspace_apart(workspace, workspace_size, need, buffers, n));
    vp->cu_seqlens_q = cu_seqlens_q;
    vp->cu_seqlens_k = vp->paged ? NULL : k_arrays[0];
    vp->seq_lens_k = vp->paged ? k_arrays[0] : NULL;
    vp->page_table = vp->paged ? k_arrays[1] : NULL;
    SK_TRY(check_content(vp));
    vp->q = q;
    vp->k = k;
    vp->row_offsets = layout->row_offsets;
    vp->col_indices = layout->col_indices;
    if (vp->t.backend == SK_BACKEND_CPU)
        SK_TRY(sk_cpu_topk_varlen_select(vp));
    else
        SK_TRY(sk_cuda_topk_varlen_select(vp, workspace, workspace_size, stream));
    layout->grid = vp->grid;
    layout->nnz = vp->capacity;
    return SK_STATUS_SUCCESS;
}

sk_status sk_topk_varlen_layout_capacity(const sk_topk_varlen_desc *desc, sk_grid *grid,
                                         int32_t *max_nnz) {
    SK_ENTER("sk_topk_varlen_layout_capacity");
    sk_topk_varlen_problem vp;
    /* total_k and the page fields do not change the layout. */
    SK_TRY(build_problem(desc, TV_LAYOUT, &vp));
    if (grid != NULL) *grid = vp.grid;
    if (max_nnz != NULL) *max_nnz = vp.capacity;
    return SK_STATUS_SUCCESS;
}

sk_status sk_topk_varlen_workspace_size(const sk_topk_varlen_desc *desc, size_t *workspace_bytes) {
    SK_ENTER("sk_topk_varlen_workspace_size");
    SK_CHECK_NOT_NULL(workspace_bytes);
    sk_topk_varlen_problem vp;
    SK_TRY(build_problem(desc, TV_VARLEN, &vp));
    return workspace_bytes_of(&vp, workspace_bytes);
}

sk_status sk_topk_paged_workspace_size(const sk_topk_varlen_desc *desc, size_t *workspace_bytes) {
    SK_ENTER("sk_topk_paged_workspace_size");
    SK_CHECK_NOT_NULL(workspace_bytes);
    sk_topk_varlen_problem vp;
    SK_TRY(build_problem(desc, TV_PAGED, &vp));
    return workspace_bytes_of(&vp, workspace_bytes);
}

sk_status sk_topk_varlen_select(const sk_topk_varlen_desc *desc, const int32_t *cu_seqlens_q,
                                const int32_t *cu_seqlens_k, const void *q, const void *k,
                                sk_bsr *layout, void *workspace, size_t workspace_size,
                                struct CUstream_st *stream) {
    SK_ENTER("sk_topk_varlen_select");
    sk_topk_varlen_problem vp;
    SK_TRY(build_problem(desc, TV_VARLEN, &vp));
    const int32_t *arrays[2] = {cu_seqlens_k, NULL};
    return check_and_run(&vp, cu_seqlens_q, arrays, q, k, layout, workspace, workspace_size,
                         stream);
}

sk_status sk_topk_paged_select(const sk_topk_varlen_desc *desc, const int32_t *cu_seqlens_q,
                               const int32_t *seq_lens_k, const int32_t *page_table,
                               const void *q, const void *k_cache, sk_bsr *layout,
                               void *workspace, size_t workspace_size,
                               struct CUstream_st *stream) {
    SK_ENTER("sk_topk_paged_select");
    sk_topk_varlen_problem vp;
    SK_TRY(build_problem(desc, TV_PAGED, &vp));
    const int32_t *arrays[2] = {seq_lens_k, page_table};
    return check_and_run(&vp, cu_seqlens_q, arrays, q, k_cache, layout, workspace,
                         workspace_size, stream);
}
