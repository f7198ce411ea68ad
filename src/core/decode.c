/*
 * decode.c - the public decode entry points (sparsek.h "Decode"):
 * descriptor defaults, every argument check, the split-count rule, and
 * dispatch (CPU: src/cpu/decode_ref.c; CUDA: src/cuda/decode/decode.cu).
 *
 * The call is checked as the paged forward checks its caches and page
 * table (attention_paged.c's helpers: page geometry, the table's span, the
 * pages each sequence uses) and as the fixed-batch forward checks Q and O
 * ([B, q_len, H, D] tensors, attention.c's helpers); the layout by the
 * decode layout's own rule (layout_decode.c). Order: descriptor, shapes,
 * layout geometry, the two arrays' pointers, tensors, aliasing (then the
 * CUDA workspace), on the CPU the arrays' content (lengths, pages, the
 * layout against the lengths), then the backend.
 */
#include <string.h>

#include "core/attention_internal.h"
#include "core/check.h"
#include "core/decode.h"
#include "core/internal.h"
#include "core/problem.h"
#include "cpu/cpu_backend.h"
#include "cuda/backend.h"

sk_status sk_decode_desc_init(sk_decode_desc *desc, size_t struct_size) {
    SK_ENTER("sk_decode_desc_init");
    SK_CHECK_NOT_NULL(desc);
    SK_TRY(sk_check_init_struct_size(struct_size, sizeof(sk_decode_desc), "sk_decode_desc"));
    memset(desc, 0, sizeof *desc);
    desc->struct_size = sizeof *desc;
    desc->backend = SK_BACKEND_CUDA;
    desc->dtype = SK_DTYPE_F16;
    desc->q_len = 1;
    desc->mask = SK_MASK_CAUSAL;
    desc->page_size = 16;
    return SK_STATUS_SUCCESS;
}

sk_status sk_decode_check_desc(const sk_decode_desc *d) {
    if (d == NULL) return sk_error(SK_STATUS_BAD_PARAM_NULL_POINTER, "desc must not be NULL");
    static const char *const names[6] = {"batch",   "q_len",    "num_pages",
                                         "heads_q", "heads_kv", "head_dim"};
    const int64_t sizes[6] = {d->batch, d->q_len, d->num_pages, d->heads_q, d->heads_kv,
                              d->head_dim};
    SK_TRY(sk_check_desc_struct_size(d->struct_size, sizeof(sk_decode_desc), "desc",
                                     "sk_decode_desc_init"));
    SK_TRY(sk_check_attention_shape_named(d->backend, d->dtype, sizes, names));
    if (d->q_len > SK_DECODE_MAX_Q_LEN)
        return sk_error(SK_STATUS_BAD_PARAM_SHAPE, "desc->q_len = %lld must be 1 .. %d",
                        (long long)d->q_len, SK_DECODE_MAX_Q_LEN);
    SK_TRY(sk_varlen_check_count(d->max_seqlen_k, "max_seqlen_k"));
    SK_TRY(sk_paged_check_pages(d->num_pages, d->page_size, d->max_pages, d->page_table_stride,
                                d->max_seqlen_k));
    SK_TRY(sk_attention_check_scale_mask(d->scale, d->mask));
    if (d->num_splits < 0 || d->num_splits > SK_DECODE_MAX_SPLITS)
        return sk_error(SK_STATUS_BAD_PARAM_VALUE,
                        "desc->num_splits = %d must be 0 (chosen by the library) or 1 .. %d",
                        (int)d->num_splits, SK_DECODE_MAX_SPLITS);
    return SK_STATUS_SUCCESS;
}

/* The NULL layout: every key, in blocks the CPU reference reads. */
static void dense_layout(sk_attention_problem *p, int64_t max_seqlen_k) {
    p->block_q = 64;
    p->block_k = SK_DECODE_DENSE_BLOCK;
    p->row_blocks = 1;
    p->slice_rows = 1;
    p->col_blocks = (int32_t)sk_ceil_div_i64(max_seqlen_k, SK_DECODE_DENSE_BLOCK);
    p->layout_batch = 1;
    p->layout_heads = 1;
    p->head_div = (int32_t)p->heads_q;
}

/* Everything that needs no pointer but the layout's: fills *dp but the
 * tensors and the arrays. */
static sk_status check_geometry(const sk_decode_desc *d, const sk_bsr *layout,
                                sk_decode_problem *dp) {
    SK_TRY(sk_decode_check_desc(d));
    memset(dp, 0, sizeof *dp);
    sk_attention_paged_problem *pp = &dp->paged;
    sk_attention_problem *p = &pp->v.flat;
    /* num_pages < 2^31 and page_size <= 128: the slot count fits. */
    const int64_t sizes[6] = {d->batch,   d->q_len,    d->num_pages * d->page_size,
                              d->heads_q, d->heads_kv, d->head_dim};
    sk_attention_problem_init(p, d->backend, d->dtype, sizes, d->scale, d->mask);
    SK_TRY(sk_attention_check_sizes(p, "batch x q_len", "batch x num_pages x page_size",
                                    "batch x heads_q x q_len"));
    sk_resolve_strides(d->q_strides, d->q_len, d->heads_q, d->head_dim, p->q_stride);
    sk_resolve_strides(d->o_strides, d->q_len, d->heads_q, d->head_dim, p->o_stride);
    sk_resolve_strides(d->k_strides, d->page_size, d->heads_kv, d->head_dim, p->k_stride);
    sk_resolve_strides(d->v_strides, d->page_size, d->heads_kv, d->head_dim, p->v_stride);
    if (layout == NULL) {
        dense_layout(p, d->max_seqlen_k);
        dp->dense = 1;
    } else {
        int32_t col_blocks;
        SK_TRY(sk_decode_layout_geometry(layout, d->batch, d->heads_kv, d->q_len, d->max_seqlen_k,
                                         &col_blocks));
        SK_TRY(sk_attention_layout_slices(layout, 1, col_blocks, p));
    }
    pp->v.batch = (int32_t)d->batch;
    pp->v.max_seqlen_q = d->q_len;
    pp->v.max_seqlen_k = d->max_seqlen_k;
    pp->num_pages = d->num_pages;
    pp->page_size = d->page_size;
    pp->max_pages = d->max_pages;
    pp->page_table_stride = d->page_table_stride != 0 ? d->page_table_stride : d->max_pages;
    dp->q_len = (int32_t)d->q_len;
    dp->num_splits = d->num_splits;
    return SK_STATUS_SUCCESS;
}

/* The switch of decode.h (benchmarks and tests). */
static int split_rule = 2;

void sk_decode_set_split_rule(int rule) { split_rule = rule == 1 ? 1 : 2; }
int sk_decode_get_split_rule(void) { return split_rule; }

int32_t sk_decode_split_count(const sk_decode_problem *dp, int32_t row_groups,
                              int64_t target_ctas, int64_t sms) {
    if (dp->num_splits > 0) return dp->num_splits;
    const sk_attention_problem *p = &dp->paged.v.flat;
    /* The most keys a row can select, from the geometry alone. */
    int64_t keys = dp->paged.v.max_seqlen_k;
    if (!dp->dense) {
        const int64_t rows = (int64_t)p->layout_batch * p->layout_heads;
        int64_t blocks = sk_ceil_div_i64(p->nnz, rows);
        if (blocks > p->col_blocks) blocks = p->col_blocks;
        if (blocks * p->block_k < keys) keys = blocks * p->block_k;
    }
    const int64_t ctas = (int64_t)dp->paged.v.batch * p->heads_kv * row_groups;
    int64_t splits = ctas >= target_ctas ? 1 : target_ctas / ctas;
    /* Rule 2: a dense split streams contiguous pages, one CTA per SM keeps
     * enough bytes in flight, and short splits pay their fixed costs
     * (fill, drain, partials, merge) more often: below
     * SK_DECODE_FILL_SPLIT_KEYS a split, one CTA per SM instead. */
    if (split_rule == 2 && dp->dense && splits > 1 && keys / splits < SK_DECODE_FILL_SPLIT_KEYS) {
        const int64_t per_sm = sms / ctas;
        if (per_sm < splits) splits = per_sm < 1 ? 1 : per_sm;
    }
    const int64_t by_work = keys / SK_DECODE_MIN_SPLIT_KEYS;
    if (splits > by_work) splits = by_work;
    if (splits > SK_DECODE_MAX_SPLITS) splits = SK_DECODE_MAX_SPLITS;
    return splits < 1 ? 1 : (int32_t)splits;
}

/* The two arrays: present, int32-aligned; stored in *dp, their spans
 * (read) into out[2]. */
static sk_status check_arrays(sk_decode_problem *dp, const int32_t *seq_lens_k,
                              const int32_t *page_table, sk_buffer out[2]) {
    sk_attention_paged_problem *pp = &dp->paged;
    SK_CHECK_NOT_NULL(seq_lens_k);
    SK_CHECK_NOT_NULL(page_table);
    SK_TRY(sk_check_alignment(seq_lens_k, NULL, 4, 4, 0, "seq_lens_k"));
    SK_TRY(sk_check_alignment(page_table, NULL, 4, 4, 0, "page_table"));
    const sk_buffer lens = {"seq_lens_k", seq_lens_k, (int64_t)pp->v.batch * 4, 0};
    out[0] = lens;
    SK_TRY(sk_paged_table_buffer(page_table, pp->v.batch, pp->page_table_stride, pp->max_pages,
                                 &out[1]));
    pp->seq_lens_k = seq_lens_k;
    pp->page_table = page_table;
    return SK_STATUS_SUCCESS;
}

/* Every buffer of a run: the forward's list order (o, lse, q, the caches
 * as k and v, the layout arrays), then the two arrays. */
enum { DECODE_ARRAYS = SK_ATTN_BUFFERS, DECODE_BUFFERS = SK_ATTN_BUFFERS + 2 };

static sk_status problem_workspace_size(const sk_decode_problem *dp, size_t *bytes) {
    if (dp->paged.v.flat.backend == SK_BACKEND_CPU) {
        *bytes = 0;
        return SK_STATUS_SUCCESS;
    }
    return sk_cuda_decode_workspace_size(dp, bytes);
}

/* The CUDA workspace (written) against buffers[]; nothing on the CPU or
 * for a NULL workspace. */
static sk_status check_workspace_apart(const sk_decode_problem *dp, const void *workspace,
                                       size_t workspace_size, const sk_buffer *buffers,
                                       int count) {
    if (dp->paged.v.flat.backend == SK_BACKEND_CPU || workspace == NULL) return SK_STATUS_SUCCESS;
    size_t bytes;
    SK_TRY(problem_workspace_size(dp, &bytes));
    return sk_check_workspace_apart(workspace, workspace_size, bytes, buffers, count);
}

/* Host arrays (CPU backend): the lengths and pages, the layout in full
 * and against the lengths. Device arrays cannot be read here. */
static sk_status check_content(const sk_decode_problem *dp, const sk_bsr *layout) {
    if (dp->paged.v.flat.backend != SK_BACKEND_CPU) return SK_STATUS_SUCCESS;
    SK_TRY(sk_paged_check_pages_used(&dp->paged));
    if (layout == NULL) return SK_STATUS_SUCCESS;
    return sk_decode_layout_content(layout, dp->paged.v.flat.col_blocks, dp->paged.seq_lens_k);
}

/* Every check of run and of the one-shot call. */
static sk_status check_call(const sk_decode_desc *desc, const sk_bsr *layout,
                            const int32_t *seq_lens_k, const int32_t *page_table, const void *q,
                            const void *k_cache, const void *v_cache, void *o, float *lse,
                            const void *workspace, size_t workspace_size, sk_decode_problem *dp) {
    SK_TRY(check_geometry(desc, layout, dp));
    sk_buffer buffers[DECODE_BUFFERS];
    SK_TRY(check_arrays(dp, seq_lens_k, page_table, buffers + DECODE_ARRAYS));
    SK_TRY(sk_paged_check_tensors(&dp->paged, q, k_cache, v_cache, o, lse, buffers));
    SK_TRY(sk_check_no_alias(buffers, DECODE_BUFFERS));
    SK_TRY(check_workspace_apart(dp, workspace, workspace_size, buffers, DECODE_BUFFERS));
    return check_content(dp, layout);
}

static sk_status plan_checked(const sk_decode_problem *dp, void *workspace, size_t workspace_size,
                              struct CUstream_st *stream) {
    if (dp->paged.v.flat.backend == SK_BACKEND_CPU) return SK_STATUS_SUCCESS;
    return sk_cuda_decode_plan(dp, workspace, workspace_size, stream);
}

static sk_status run_checked(const sk_decode_problem *dp, void *workspace, size_t workspace_size,
                             struct CUstream_st *stream) {
    if (dp->paged.v.flat.backend == SK_BACKEND_CPU) return sk_cpu_decode_run(dp);
    return sk_cuda_decode_run(dp, workspace, workspace_size, stream);
}

sk_status sk_decode_splits(const sk_decode_desc *desc, const sk_bsr *layout,
                           int32_t *num_splits) {
    SK_ENTER("sk_decode_splits");
    SK_CHECK_NOT_NULL(num_splits);
    sk_decode_problem dp;
    SK_TRY(check_geometry(desc, layout, &dp));
    if (dp.paged.v.flat.backend == SK_BACKEND_CPU) {
        *num_splits = 1;
        return SK_STATUS_SUCCESS;
    }
    return sk_cuda_decode_splits(&dp, num_splits);
}

sk_status sk_decode_workspace_size(const sk_decode_desc *desc, const sk_bsr *layout,
                                   size_t *workspace_bytes) {
    SK_ENTER("sk_decode_workspace_size");
    SK_CHECK_NOT_NULL(workspace_bytes);
    sk_decode_problem dp;
    SK_TRY(check_geometry(desc, layout, &dp));
    return problem_workspace_size(&dp, workspace_bytes);
}

sk_status sk_decode_plan(const sk_decode_desc *desc, const sk_bsr *layout,
                         const int32_t *seq_lens_k, const int32_t *page_table, void *workspace,
                         size_t workspace_size, struct CUstream_st *stream) {
    SK_ENTER("sk_decode_plan");
    sk_decode_problem dp;
    SK_TRY(check_geometry(desc, layout, &dp));
    /* The plan may write the workspace and reads the layout and the arrays. */
    sk_buffer arrays[4];
    SK_TRY(check_arrays(&dp, seq_lens_k, page_table, arrays + 2));
    sk_attention_layout_buffers(&dp.paged.v.flat, arrays);
    SK_TRY(check_workspace_apart(&dp, workspace, workspace_size, arrays, 4));
    SK_TRY(check_content(&dp, layout));
    return plan_checked(&dp, workspace, workspace_size, stream);
}

sk_status sk_decode_run(const sk_decode_desc *desc, const sk_bsr *layout,
                        const int32_t *seq_lens_k, const int32_t *page_table, const void *q,
                        const void *k_cache, const void *v_cache, void *o, float *lse,
                        void *workspace, size_t workspace_size, struct CUstream_st *stream) {
    SK_ENTER("sk_decode_run");
    sk_decode_problem dp;
    SK_TRY(check_call(desc, layout, seq_lens_k, page_table, q, k_cache, v_cache, o, lse,
                      workspace, workspace_size, &dp));
    return run_checked(&dp, workspace, workspace_size, stream);
}

sk_status sk_decode(const sk_decode_desc *desc, const sk_bsr *layout, const int32_t *seq_lens_k,
                    const int32_t *page_table, const void *q, const void *k_cache,
                    const void *v_cache, void *o, float *lse, void *workspace,
                    size_t workspace_size, struct CUstream_st *stream) {
    SK_ENTER("sk_decode");
    sk_decode_problem dp;
    SK_TRY(check_call(desc, layout, seq_lens_k, page_table, q, k_cache, v_cache, o, lse,
                      workspace, workspace_size, &dp));
    SK_TRY(plan_checked(&dp, workspace, workspace_size, stream));
    return run_checked(&dp, workspace, workspace_size, stream);
}
