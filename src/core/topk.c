/*
 * topk.c - the public top-k selection entry points (sk_topk_*, sk_block_pool,
 * sk_select_topk, sk_pool_select_topk, sk_layout_from_scores): descriptor
 * defaults, every argument check, dispatch to the CPU or CUDA backend. Its
 * checks and the dispatch are also the steps of sk_attention_topk
 * (attention_topk.c, through topk_internal.h).
 *
 * As in attention.c, every check runs before a backend is called, so a
 * failed call writes nothing: descriptor and shapes (with the layout grid
 * and capacity), pointers, extents, alignment, overlap, workspace, then the
 * backend's own device checks. Device buffers cannot be measured from the
 * host: the caller's layout arrays must hold the sizes that
 * sk_topk_layout_capacity gives (row_offsets: slices * row_blocks + 1,
 * col_indices: max_nnz), which is documented, not checked.
 *
 * The selection rules are in src/core/topk_rules.h (sk_topk_row_rules);
 * the CPU backend is src/cpu/topk_ref.c, the CUDA one src/cuda/topk/.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/check.h"
#include "core/internal.h"
#include "core/layout.h"
#include "core/topk_internal.h"
#include "core/topk_rules.h"
#include "cpu/cpu_backend.h"
#include "cuda/backend.h"

/* A workspace base must be 16-byte aligned. */
enum { WS_BASE_ALIGN = 16 };

sk_status sk_topk_desc_init(sk_topk_desc *desc, size_t struct_size) {
    SK_ENTER("sk_topk_desc_init");
    SK_CHECK_NOT_NULL(desc);
    SK_TRY(sk_check_init_struct_size(struct_size, sizeof(sk_topk_desc), "sk_topk_desc"));
    memset(desc, 0, sizeof *desc);
    desc->struct_size = sizeof *desc;
    desc->backend = SK_BACKEND_CUDA;
    desc->dtype = SK_DTYPE_F16;
    desc->block_q = 128;
    desc->block_k = 128;
    desc->scale = 0.0f;
    desc->k = 16;
    desc->sink_blocks = 0;
    desc->local_blocks = 0;
    desc->mask = SK_MASK_NONE;
    desc->per_kv_head = 0;
    return SK_STATUS_SUCCESS;
}

static void make_grid(const sk_topk_desc *d, sk_grid *g) {
    memset(g, 0, sizeof *g);
    g->rows = d->seq_q;
    g->cols = d->seq_k;
    g->block_rows = d->block_q;
    g->block_cols = d->block_k;
    g->batch = (int32_t)d->batch;
    g->heads = (int32_t)(d->per_kv_head ? d->heads_kv : d->heads_q);
}

/* The rows' bounds, summed (per slice) and their largest, and the score
 * span (sk_topk_score_span). Each bound is at most col_blocks, so the sum is
 * at most the dense block count of a slice (int64). That is one rule per
 * row (~4 us of host time at 1024 rows, before every call's first kernel),
 * so each thread keeps the last shape's result: both depend only on the
 * fields in the key. */
typedef struct bounds_key {
    int64_t seq_q, seq_k;
    int32_t block_q, block_k, k, sink_blocks, local_blocks, causal;
} bounds_key;

typedef struct row_summary {
    int64_t per_slice;
    int32_t row_cap;
    int32_t score_rows[2], score_cols[2];
} row_summary;

static void summarize_rows(sk_topk_problem *p, int64_t *per_slice) {
    static __thread struct {
        int valid;
        bounds_key key;
        row_summary sum;
    } last;
    bounds_key key;
    memset(&key, 0, sizeof key); /* padding too: the keys are compared with memcmp */
    key.seq_q = p->seq_q;
    key.seq_k = p->seq_k;
    key.block_q = p->block_q;
    key.block_k = p->block_k;
    key.k = p->k;
    key.sink_blocks = p->sink_blocks;
    key.local_blocks = p->local_blocks;
    key.causal = p->causal;
    if (!last.valid || memcmp(&key, &last.key, sizeof key) != 0) {
        row_summary s;
        memset(&s, 0, sizeof s);
        for (int32_t r = 0; r < p->row_blocks; ++r) {
            const sk_topk_row rule = sk_topk_row_rules(p, r);
            s.per_slice += rule.bound;
            if (rule.bound > s.row_cap) s.row_cap = rule.bound;
        }
        sk_topk_score_span(p, s.score_rows, s.score_cols);
        last.key = key;
        last.sum = s;
        last.valid = 1;
    }
    *per_slice = last.sum.per_slice;
    p->row_cap = last.sum.row_cap;
    memcpy(p->score_rows, last.sum.score_rows, sizeof p->score_rows);
    memcpy(p->score_cols, last.sum.score_cols, sizeof p->score_cols);
}

sk_status sk_topk_build_problem(const sk_topk_desc *d, sk_topk_problem *p) {
    if (d == NULL) return sk_error(SK_STATUS_BAD_PARAM_NULL_POINTER, "desc must not be NULL");
    SK_TRY(sk_check_desc_struct_size(d->struct_size, sizeof(sk_topk_desc), "desc", "sk_topk_desc_init"));
    const int64_t sizes[6] = {d->batch, d->seq_q, d->seq_k, d->heads_q, d->heads_kv, d->head_dim};
    SK_TRY(sk_check_attention_shape(d->backend, d->dtype, sizes));
    if (d->block_q != 64 && d->block_q != 128)
        return sk_error(SK_STATUS_BAD_PARAM_VALUE, "desc->block_q = %d must be 64 or 128",
                        (int)d->block_q);
    if (d->block_k != 64 && d->block_k != 128)
        return sk_error(SK_STATUS_BAD_PARAM_VALUE, "desc->block_k = %d must be 64 or 128",
                        (int)d->block_k);
    if (!isfinite(d->scale))
        return sk_error(SK_STATUS_BAD_PARAM_VALUE, "desc->scale = %g must be finite",
                        (double)d->scale);
    if (d->k < 0)
        return sk_error(SK_STATUS_BAD_PARAM_VALUE, "desc->k = %d must be >= 0", (int)d->k);
    if (d->sink_blocks < 0)
        return sk_error(SK_STATUS_BAD_PARAM_VALUE, "desc->sink_blocks = %d must be >= 0",
                        (int)d->sink_blocks);
    if (d->local_blocks < 0)
        return sk_error(SK_STATUS_BAD_PARAM_VALUE, "desc->local_blocks = %d must be >= 0",
                        (int)d->local_blocks);
    if (d->mask != SK_MASK_NONE && d->mask != SK_MASK_CAUSAL)
        return sk_error(SK_STATUS_BAD_PARAM_VALUE,
                        "desc->mask = %d is not an sk_mask (NONE=0, CAUSAL=1)", (int)d->mask);

    sk_grid grid;
    make_grid(d, &grid);
    int32_t rb, cb, slices;
    SK_TRY(sk_grid_check(&grid, &rb, &cb, &slices));
    /* Every selection scores the whole grid into one dense fp32 matrix
     * [slices, row_blocks, col_blocks] (the CUDA workspace, the CPU
     * backend's scratch, sk_layout_from_scores' input), indexed by int32
     * rows and tile counts in src/cuda/topk/: its entry count keeps the
     * INT32_MAX limit (8 GiB of fp32) that sk_grid_check no longer has. */
    const int64_t score_count = (int64_t)slices * rb * cb; /* < 2^62 */
    if (score_count > INT32_MAX)
        return sk_error(SK_STATUS_BAD_LAYOUT_OVERFLOW,
                        "desc: the top-k score matrix [batch x %s = %d slices, %d row blocks, "
                        "%d col blocks] has %lld entries, more than the selection's limit of "
                        "INT32_MAX = %d (it is materialised densely in fp32); select per shard "
                        "or over fewer heads",
                        d->per_kv_head ? "heads_kv" : "heads_q", (int)slices, (int)rb, (int)cb,
                        (long long)score_count, INT32_MAX);

    /* Tensor and pooled sizes in bytes must fit int64. */
    const int64_t es = (int64_t)sk_dtype_size(d->dtype);
    const int64_t q_sizes[5] = {d->batch, d->seq_q, d->heads_q, d->head_dim, es};
    const int64_t k_sizes[5] = {d->batch, d->seq_k, d->heads_kv, d->head_dim, es};
    const int64_t pq_sizes[5] = {d->batch, d->heads_q, rb, d->head_dim, 4};
    const int64_t pk_sizes[5] = {d->batch, d->heads_kv, cb, d->head_dim, 4};
    int64_t bytes;
    if (!sk_product_i64(q_sizes, 5, &bytes) || !sk_product_i64(k_sizes, 5, &bytes))
        return sk_error(SK_STATUS_BAD_PARAM_OVERFLOW,
                        "q or k: batch x seq x heads x head_dim x %lld bytes overflows int64",
                        (long long)es);
    if (!sk_product_i64(pq_sizes, 5, &bytes) || !sk_product_i64(pk_sizes, 5, &bytes))
        return sk_error(SK_STATUS_BAD_PARAM_OVERFLOW,
                        "pooled_q or pooled_k: batch x heads x blocks x head_dim x 4 bytes "
                        "overflows int64");

    memset(p, 0, sizeof *p);
    p->backend = d->backend;
    p->dtype = d->dtype;
    p->batch = d->batch;
    p->seq_q = d->seq_q;
    p->seq_k = d->seq_k;
    p->heads_q = d->heads_q;
    p->heads_kv = d->heads_kv;
    p->head_dim = d->head_dim;
    sk_resolve_strides(d->q_strides, d->seq_q, d->heads_q, d->head_dim, p->q_stride);
    sk_resolve_strides(d->k_strides, d->seq_k, d->heads_kv, d->head_dim, p->k_stride);
    p->group = (int32_t)(d->heads_q / d->heads_kv);
    p->block_q = d->block_q;
    p->block_k = d->block_k;
    p->row_blocks = rb;
    p->col_blocks = cb;
    p->heads = grid.heads;
    p->grid = grid;
    p->slices = slices;
    p->total_rows = slices * rb;
    p->scale = d->scale != 0.0f ? d->scale : (float)(1.0 / sqrt((double)d->head_dim));
    p->k = d->k;
    p->sink_blocks = d->sink_blocks;
    p->local_blocks = d->local_blocks;
    p->causal = d->mask == SK_MASK_CAUSAL;
    p->per_kv_head = d->per_kv_head != 0;

    int64_t per_slice, capacity;
    summarize_rows(p, &per_slice);
    /* Each row bound is at most col_blocks: the capacity is at most the
     * score matrix's entry count, bounded by INT32_MAX above; a failure
     * here is a bug in the row rules. */
    if (!sk_mul_i64(per_slice, slices, &capacity) || capacity > INT32_MAX)
        return sk_error(SK_STATUS_INTERNAL_ERROR,
                        "the layout capacity %lld x %d slices exceeds the score matrix",
                        (long long)per_slice, (int)slices);
    p->capacity = (int32_t)capacity;
    return SK_STATUS_SUCCESS;
}

sk_status sk_topk_check_cuda_head_dim(const sk_topk_problem *p) {
    if (sk_backend_is_cuda(p->backend) && p->head_dim % 8 != 0)
        return sk_error(SK_STATUS_BAD_PARAM_ALIGNMENT,
                        "desc->head_dim = %lld is not a multiple of 8, as the CUDA backend needs "
                        "(16-byte rows)",
                        (long long)p->head_dim);
    return SK_STATUS_SUCCESS;
}

sk_status sk_topk_check_qk(const sk_topk_problem *p, const void *q, const void *k, int64_t *q_bytes,
                           int64_t *k_bytes) {
    SK_CHECK_NOT_NULL(q);
    SK_CHECK_NOT_NULL(k);
    const size_t es = sk_dtype_size(p->dtype);
    sk_tensor_shape tq, tk;
    sk_tensor_shape_init(&tq, p->batch, p->seq_q, p->heads_q, p->head_dim, p->q_stride);
    sk_tensor_shape_init(&tk, p->batch, p->seq_k, p->heads_kv, p->head_dim, p->k_stride);
    int64_t qb, kb;
    SK_TRY(sk_check_tensor_extent(&tq, es, "q", &qb));
    SK_TRY(sk_check_tensor_extent(&tk, es, "k", &kb));
    SK_TRY(sk_topk_check_cuda_head_dim(p));
    const int cuda = sk_backend_is_cuda(p->backend);
    const size_t align = cuda ? 16 : es, stride_align = cuda ? 16 : 0;
    SK_TRY(sk_check_alignment(q, &tq, es, align, stride_align, "q"));
    SK_TRY(sk_check_alignment(k, &tk, es, align, stride_align, "k"));
    *q_bytes = qb;
    *k_bytes = kb;
    return SK_STATUS_SUCCESS;
}

static int64_t pooled_q_bytes(const sk_topk_problem *p) {
    return p->batch * p->heads_q * p->row_blocks * p->head_dim * 4;
}
static int64_t pooled_k_bytes(const sk_topk_problem *p) {
    return p->batch * p->heads_kv * p->col_blocks * p->head_dim * 4;
}

/* Pooled fp32 buffers: non-NULL, aligned (16 bytes on CUDA, float4 access). */
static sk_status check_pooled(const sk_topk_problem *p, const float *pooled_q,
                              const float *pooled_k) {
    SK_CHECK_NOT_NULL(pooled_q);
    SK_CHECK_NOT_NULL(pooled_k);
    const size_t align = sk_backend_is_cuda(p->backend) ? 16 : 4;
    SK_TRY(sk_check_alignment(pooled_q, NULL, 4, align, 0, "pooled_q"));
    SK_TRY(sk_check_alignment(pooled_k, NULL, 4, align, 0, "pooled_k"));
    return SK_STATUS_SUCCESS;
}

sk_status sk_topk_check_layout_out(const sk_topk_problem *p, const sk_bsr *layout) {
    SK_CHECK_NOT_NULL(layout);
    if (layout->row_offsets == NULL)
        return sk_error(SK_STATUS_BAD_PARAM_NULL_POINTER, "layout->row_offsets must not be NULL");
    if (layout->col_indices == NULL && p->capacity > 0)
        return sk_error(SK_STATUS_BAD_PARAM_NULL_POINTER,
                        "layout->col_indices must not be NULL: the layout capacity is %d",
                        (int)p->capacity);
    SK_TRY(sk_check_alignment(layout->row_offsets, NULL, 4, 4, 0, "layout->row_offsets"));
    if (layout->col_indices != NULL)
        SK_TRY(sk_check_alignment(layout->col_indices, NULL, 4, 4, 0, "layout->col_indices"));
    return SK_STATUS_SUCCESS;
}

/* A selection's buffers for the aliasing rule: the layout arrays it writes
 * (row_offsets: total_rows + 1 entries, col_indices: the capacity), then
 * its inputs; returns the count. */
static int selection_buffers(const sk_topk_problem *p, const sk_bsr *layout,
                             const sk_buffer *inputs, int n_inputs, sk_buffer out[4]) {
    sk_layout_array_buffers(out, "layout->row_offsets", "layout->col_indices", layout->row_offsets,
                            p->total_rows, layout->col_indices, p->capacity, 1);
    memcpy(out + 2, inputs, (size_t)n_inputs * sizeof *inputs);
    return 2 + n_inputs;
}

sk_status sk_topk_check_workspace(const void *workspace, size_t workspace_size, size_t need) {
    if (need == 0) return SK_STATUS_SUCCESS;
    if (workspace == NULL)
        return sk_error(SK_STATUS_BAD_PARAM_WORKSPACE,
                        "workspace is NULL, but this call needs %zu bytes", need);
    if (workspace_size < need)
        return sk_error(SK_STATUS_BAD_PARAM_WORKSPACE,
                        "workspace_size = %zu is less than the %zu bytes needed", workspace_size,
                        need);
    if ((uintptr_t)workspace % WS_BASE_ALIGN != 0)
        return sk_error(SK_STATUS_BAD_PARAM_ALIGNMENT, "workspace = %p is not %d-byte aligned",
                        workspace, (int)WS_BASE_ALIGN);
    return SK_STATUS_SUCCESS;
}

static void set_layout(const sk_topk_problem *p, sk_bsr *layout) {
    layout->grid = p->grid;
    layout->nnz = p->capacity;
}

sk_status sk_topk_layout_capacity(const sk_topk_desc *desc, sk_grid *grid, int32_t *max_nnz) {
    SK_ENTER("sk_topk_layout_capacity");
    sk_topk_problem p;
    SK_TRY(sk_topk_build_problem(desc, &p));
    if (grid != NULL) *grid = p.grid;
    if (max_nnz != NULL) *max_nnz = p.capacity;
    return SK_STATUS_SUCCESS;
}

sk_status sk_topk_workspace_size(const sk_topk_desc *desc, size_t *workspace_bytes) {
    SK_ENTER("sk_topk_workspace_size");
    SK_CHECK_NOT_NULL(workspace_bytes);
    sk_topk_problem p;
    SK_TRY(sk_topk_build_problem(desc, &p));
    if (p.backend == SK_BACKEND_CPU) {
        *workspace_bytes = 0;
        return SK_STATUS_SUCCESS;
    }
    return sk_cuda_topk_workspace_size(&p, 1, workspace_bytes);
}

sk_status sk_block_pool(const sk_topk_desc *desc, const void *q, const void *k, float *pooled_q,
                        float *pooled_k, struct CUstream_st *stream) {
    SK_ENTER("sk_block_pool");
    sk_topk_problem p;
    SK_TRY(sk_topk_build_problem(desc, &p));
    int64_t q_bytes, k_bytes;
    SK_TRY(sk_topk_check_qk(&p, q, k, &q_bytes, &k_bytes));
    SK_TRY(check_pooled(&p, pooled_q, pooled_k));
    const sk_buffer buffers[4] = {{"pooled_q", pooled_q, pooled_q_bytes(&p), 1},
                                  {"pooled_k", pooled_k, pooled_k_bytes(&p), 1},
                                  {"q", q, q_bytes, 0},
                                  {"k", k, k_bytes, 0}};
    SK_TRY(sk_check_no_alias(buffers, 4));
    p.q = q;
    p.k_in = k;
    p.pooled_q_out = pooled_q;
    p.pooled_k_out = pooled_k;
    if (p.backend == SK_BACKEND_CPU) return sk_cpu_topk_pool(&p);
    return sk_cuda_topk_pool(&p, stream);
}

sk_status sk_topk_select_bytes(const sk_topk_problem *p, sk_topk_select_kind kind, size_t *bytes) {
    *bytes = 0;
    if (p->backend == SK_BACKEND_CPU) return SK_STATUS_SUCCESS;
    if (kind == SK_TOPK_POOLED) return sk_cuda_topk_pool_select_workspace_size(p, bytes);
    return sk_cuda_topk_workspace_size(p, kind == SK_TOPK_SCORED, bytes);
}

/* The aliasing rule of a selection: its buffers (selection_buffers), then
 * the workspace (sk_topk_select_bytes: present, large enough, aligned)
 * against all of them, as far as the size the public call gives (for
 * sk_layout_from_scores, sk_topk_workspace_size: more than it uses). Nothing
 * is asked of the workspace on the CPU. */
static sk_status check_selection_aliasing(const sk_topk_problem *p, sk_topk_select_kind kind,
                                          const sk_buffer *buffers, int count,
                                          const void *workspace, size_t workspace_size) {
    SK_TRY(sk_check_no_alias(buffers, count));
    size_t need, documented;
    SK_TRY(sk_topk_select_bytes(p, kind, &need));
    if (need == 0) return SK_STATUS_SUCCESS;
    SK_TRY(sk_topk_check_workspace(workspace, workspace_size, need));
    SK_TRY(
        sk_topk_select_bytes(p, kind == SK_TOPK_FROM_SCORES ? SK_TOPK_SCORED : kind, &documented));
    return sk_check_workspace_apart(workspace, workspace_size, documented, buffers, count);
}

sk_status sk_topk_run_select(sk_topk_problem *p, int pool, sk_bsr *layout, void *workspace,
                             size_t workspace_size, struct CUstream_st *stream) {
    p->row_offsets = layout->row_offsets;
    p->col_indices = layout->col_indices;
    if (p->backend == SK_BACKEND_CPU)
        SK_TRY(pool ? sk_cpu_topk_pool_select(p) : sk_cpu_topk_select(p));
    else if (pool)
        SK_TRY(sk_cuda_topk_pool_select(p, workspace, workspace_size, stream));
    else
        SK_TRY(sk_cuda_topk_select(p, workspace, workspace_size, stream));
    set_layout(p, layout);
    return SK_STATUS_SUCCESS;
}

sk_status sk_select_topk(const sk_topk_desc *desc, const float *pooled_q, const float *pooled_k,
                         sk_bsr *layout, void *workspace, size_t workspace_size,
                         struct CUstream_st *stream) {
    SK_ENTER("sk_select_topk");
    sk_topk_problem p;
    SK_TRY(sk_topk_build_problem(desc, &p));
    SK_TRY(check_pooled(&p, pooled_q, pooled_k));
    SK_TRY(sk_topk_check_cuda_head_dim(&p));
    SK_TRY(sk_topk_check_layout_out(&p, layout));
    const sk_buffer inputs[2] = {{"pooled_q", pooled_q, pooled_q_bytes(&p), 0},
                                 {"pooled_k", pooled_k, pooled_k_bytes(&p), 0}};
    sk_buffer buffers[4];
    const int n = selection_buffers(&p, layout, inputs, 2, buffers);
    SK_TRY(check_selection_aliasing(&p, SK_TOPK_SCORED, buffers, n, workspace, workspace_size));
    p.pooled_q = pooled_q;
    p.pooled_k = pooled_k;
    return sk_topk_run_select(&p, 0, layout, workspace, workspace_size, stream);
}

sk_status sk_pool_select_topk_workspace_size(const sk_topk_desc *desc, size_t *workspace_bytes) {
    SK_ENTER("sk_pool_select_topk_workspace_size");
    SK_CHECK_NOT_NULL(workspace_bytes);
    sk_topk_problem p;
    SK_TRY(sk_topk_build_problem(desc, &p));
    SK_TRY(sk_topk_check_cuda_head_dim(&p));
    size_t need;
    SK_TRY(sk_topk_select_bytes(&p, SK_TOPK_POOLED, &need));
    *workspace_bytes = need; /* written only on success */
    return SK_STATUS_SUCCESS;
}

sk_status sk_pool_select_topk(const sk_topk_desc *desc, const void *q, const void *k,
                              sk_bsr *layout, void *workspace, size_t workspace_size,
                              struct CUstream_st *stream) {
    SK_ENTER("sk_pool_select_topk");
    sk_topk_problem p;
    SK_TRY(sk_topk_build_problem(desc, &p));
    int64_t q_bytes, k_bytes;
    SK_TRY(sk_topk_check_qk(&p, q, k, &q_bytes, &k_bytes));
    SK_TRY(sk_topk_check_layout_out(&p, layout));
    const sk_buffer inputs[2] = {{"q", q, q_bytes, 0}, {"k", k, k_bytes, 0}};
    sk_buffer buffers[4];
    const int n = selection_buffers(&p, layout, inputs, 2, buffers);
    SK_TRY(check_selection_aliasing(&p, SK_TOPK_POOLED, buffers, n, workspace, workspace_size));
    p.q = q;
    p.k_in = k;
    return sk_topk_run_select(&p, 1, layout, workspace, workspace_size, stream);
}

sk_status sk_layout_from_scores(const sk_topk_desc *desc, const float *scores, sk_bsr *layout,
                                void *workspace, size_t workspace_size,
                                struct CUstream_st *stream) {
    SK_ENTER("sk_layout_from_scores");
    sk_topk_problem p;
    SK_TRY(sk_topk_build_problem(desc, &p));
    SK_CHECK_NOT_NULL(scores);
    SK_TRY(sk_check_alignment(scores, NULL, 4, 4, 0, "scores"));
    SK_TRY(sk_topk_check_layout_out(&p, layout));
    /* [slices, row_blocks, col_blocks] fp32: at most 4 x INT32_MAX bytes
     * (the score matrix limit of sk_topk_build_problem). */
    const sk_buffer input = {"scores", scores, (int64_t)p.total_rows * p.col_blocks * 4, 0};
    sk_buffer buffers[4];
    const int n = selection_buffers(&p, layout, &input, 1, buffers);
    SK_TRY(
        check_selection_aliasing(&p, SK_TOPK_FROM_SCORES, buffers, n, workspace, workspace_size));
    p.scores = scores;
    return sk_topk_run_select(&p, 0, layout, workspace, workspace_size, stream);
}

