/*
 * decode_select.c - the public decode page selection entry points
 * (sparsek.h "Decode page selection"): the descriptor, every argument
 * check, dispatch to the CPU reference (src/cpu/decode_select_ref.c) or the
 * CUDA kernels (src/cuda/decode_select/).
 *
 * As everywhere, every check runs before a backend is called, so a failed
 * call writes nothing: descriptor and shapes, pointers, extents, alignment,
 * aliasing, workspace, then (CPU only: host arrays) the lengths and the
 * page indices the call reads.
 */
#include <math.h>
#include <string.h>

#include "core/check.h"
#include "core/decode_select.h"
#include "core/internal.h"
#include "cpu/cpu_backend.h"
#include "cuda/backend.h"

/* The most query tokens (one layout row block of 64) and channels. */
enum { DSEL_MAX_Q_LEN = 64, DSEL_MAX_HEAD_DIM = 256, DSEL_BLOCK_ROWS = 64, DSEL_MAX_GROUP = 4096 };

sk_status sk_decode_select_desc_init(sk_decode_select_desc *desc, size_t struct_size) {
    SK_ENTER("sk_decode_select_desc_init");
    SK_CHECK_NOT_NULL(desc);
    SK_TRY(sk_check_init_struct_size(struct_size, sizeof(sk_decode_select_desc),
                                     "sk_decode_select_desc"));
    memset(desc, 0, sizeof *desc);
    desc->struct_size = sizeof *desc;
    desc->backend = SK_BACKEND_CUDA;
    desc->dtype = SK_DTYPE_F16;
    desc->block_k = 64;
    desc->k = 64;
    desc->sink_blocks = 1;
    desc->recent_blocks = 2;
    desc->page_size = 64;
    return SK_STATUS_SUCCESS;
}

static int is_block_size(int32_t x) { return x == 16 || x == 32 || x == 64 || x == 128; }

/* The selection's scalars and the paged geometry. */
static sk_status check_fields(const sk_decode_select_desc *d) {
    if (d->q_len > DSEL_MAX_Q_LEN)
        return sk_error(SK_STATUS_BAD_PARAM_SHAPE, "desc->q_len = %lld must be at most %d",
                        (long long)d->q_len, (int)DSEL_MAX_Q_LEN);
    if (d->head_dim % SK_DSEL_LANES != 0 || d->head_dim > DSEL_MAX_HEAD_DIM)
        return sk_error(SK_STATUS_BAD_PARAM_SHAPE,
                        "desc->head_dim = %lld must be a multiple of %d, at most %d",
                        (long long)d->head_dim, (int)SK_DSEL_LANES, (int)DSEL_MAX_HEAD_DIM);
    if (d->max_seqlen_k > INT32_MAX)
        return sk_error(SK_STATUS_BAD_PARAM_OVERFLOW, "desc->max_seqlen_k = %lld must fit int32",
                        (long long)d->max_seqlen_k);
    if (!is_block_size(d->block_k))
        return sk_error(SK_STATUS_BAD_PARAM_VALUE, "desc->block_k = %d must be 16, 32, 64 or 128",
                        (int)d->block_k);
    if (!isfinite(d->scale))
        return sk_error(SK_STATUS_BAD_PARAM_VALUE, "desc->scale = %g must be finite",
                        (double)d->scale);
    if (d->k < 0 || d->sink_blocks < 0 || d->recent_blocks < 0)
        return sk_error(SK_STATUS_BAD_PARAM_VALUE,
                        "desc->k = %d, sink_blocks = %d and recent_blocks = %d must be >= 0",
                        (int)d->k, (int)d->sink_blocks, (int)d->recent_blocks);
    if (d->num_pages < 1 || d->num_pages > INT32_MAX)
        return sk_error(SK_STATUS_BAD_PARAM_SHAPE, "desc->num_pages = %lld must be in 1 .. %d",
                        (long long)d->num_pages, INT32_MAX);
    if (!is_block_size(d->page_size))
        return sk_error(SK_STATUS_BAD_PARAM_VALUE, "desc->page_size = %d must be 16, 32, 64 or 128",
                        (int)d->page_size);
    if (d->max_pages < 1)
        return sk_error(SK_STATUS_BAD_PARAM_SHAPE, "desc->max_pages = %d must be >= 1",
                        (int)d->max_pages);
    if (d->page_table_stride < 0 ||
        (d->page_table_stride != 0 && d->page_table_stride < d->max_pages))
        return sk_error(SK_STATUS_BAD_PARAM_STRIDE,
                        "desc->page_table_stride = %lld must be 0 (packed) or at least max_pages "
                        "= %d",
                        (long long)d->page_table_stride, (int)d->max_pages);
    if (d->group_blocks != 0 && (d->group_blocks < 2 || d->group_blocks > DSEL_MAX_GROUP))
        return sk_error(SK_STATUS_BAD_PARAM_VALUE,
                        "desc->group_blocks = %d must be 0 (one level) or in 2 .. %d",
                        (int)d->group_blocks, (int)DSEL_MAX_GROUP);
    if (d->group_blocks != 0 && d->top_groups < 1)
        return sk_error(SK_STATUS_BAD_PARAM_VALUE,
                        "desc->top_groups = %d must be >= 1 with group_blocks = %d",
                        (int)d->top_groups, (int)d->group_blocks);
    if (d->max_seqlen_k > (int64_t)d->max_pages * d->page_size)
        return sk_error(SK_STATUS_BAD_PARAM_SHAPE,
                        "desc->max_seqlen_k = %lld exceeds max_pages x page_size = %lld",
                        (long long)d->max_seqlen_k, (long long)d->max_pages * d->page_size);
    return SK_STATUS_SUCCESS;
}

static sk_status build_problem(const sk_decode_select_desc *d, sk_dsel_problem *p) {
    if (d == NULL) return sk_error(SK_STATUS_BAD_PARAM_NULL_POINTER, "desc must not be NULL");
    SK_TRY(sk_check_desc_struct_size(d->struct_size, sizeof(sk_decode_select_desc), "desc",
                                     "sk_decode_select_desc_init"));
    static const char *const names[6] = {"batch",    "q_len",    "max_seqlen_k",
                                         "heads_q", "heads_kv", "head_dim"};
    const int64_t sizes[6] = {d->batch,   d->q_len,    d->max_seqlen_k,
                              d->heads_q, d->heads_kv, d->head_dim};
    SK_TRY(sk_check_attention_shape_named(d->backend, d->dtype, sizes, names));
    SK_TRY(check_fields(d));

    memset(p, 0, sizeof *p);
    p->max_blocks = (int32_t)sk_ceil_div_i64(d->max_seqlen_k, d->block_k);
    int64_t rows, cap = (int64_t)d->k + d->sink_blocks + d->recent_blocks, capacity;
    if (cap > p->max_blocks) cap = p->max_blocks;
    if (!sk_mul_i64(d->batch, d->heads_kv, &rows) || rows > INT32_MAX ||
        !sk_mul_i64(rows, cap, &capacity) || capacity > INT32_MAX)
        return sk_error(SK_STATUS_BAD_LAYOUT_OVERFLOW,
                        "the decode layout of batch x heads_kv = %lld x %lld rows of up to %lld "
                        "blocks does not fit int32",
                        (long long)d->batch, (long long)d->heads_kv, (long long)cap);
    const int64_t es = (int64_t)sk_dtype_size(d->dtype);
    if (d->group_blocks > 0) {
        p->group_blocks = d->group_blocks;
        p->top_groups = d->top_groups;
        p->max_groups = (int32_t)sk_ceil_div_i64(p->max_blocks, d->group_blocks);
        p->group_cap = d->top_groups < p->max_groups ? d->top_groups : p->max_groups;
    }
    const int64_t sum_sizes[5] = {rows, (int64_t)p->max_blocks + p->max_groups, 2, d->head_dim, es};
    const int64_t score_sizes[2] = {rows, p->max_blocks};
    int64_t bytes, blocks;
    if (!sk_product_i64(sum_sizes, 5, &bytes))
        return sk_error(SK_STATUS_BAD_PARAM_OVERFLOW,
                        "summary: batch x heads_kv x %d blocks x 2 x head_dim x %lld bytes "
                        "overflows int64",
                        (int)p->max_blocks, (long long)es);
    if (!sk_product_i64(score_sizes, 2, &blocks) || blocks > INT32_MAX)
        return sk_error(SK_STATUS_BAD_PARAM_OVERFLOW,
                        "batch x heads_kv x %d key blocks does not fit int32", (int)p->max_blocks);

    p->backend = d->backend;
    p->dtype = d->dtype;
    p->batch = (int32_t)d->batch;
    p->q_len = (int32_t)d->q_len;
    p->heads_q = (int32_t)d->heads_q;
    p->heads_kv = (int32_t)d->heads_kv;
    p->group = (int32_t)(d->heads_q / d->heads_kv);
    p->head_dim = (int32_t)d->head_dim;
    p->max_seqlen_k = d->max_seqlen_k;
    p->block_k = d->block_k;
    p->scale = d->scale != 0.0f ? d->scale : (float)(1.0 / sqrt((double)d->head_dim));
    p->k = d->k;
    p->sink_blocks = d->sink_blocks;
    p->recent_blocks = d->recent_blocks;
    p->row_cap = (int32_t)cap;
    p->rows = (int32_t)rows;
    p->capacity = (int32_t)capacity;
    p->grid.rows = d->q_len;
    p->grid.cols = d->max_seqlen_k;
    p->grid.block_rows = DSEL_BLOCK_ROWS;
    p->grid.block_cols = d->block_k;
    p->grid.batch = p->batch;
    p->grid.heads = p->heads_kv;
    sk_resolve_strides(d->q_strides, d->q_len, d->heads_q, d->head_dim, p->q_stride);
    sk_resolve_strides(d->k_strides, d->page_size, d->heads_kv, d->head_dim, p->k_stride);
    p->num_pages = d->num_pages;
    p->page_size = d->page_size;
    p->max_pages = d->max_pages;
    p->page_table_stride = d->page_table_stride != 0 ? d->page_table_stride : d->max_pages;
    return SK_STATUS_SUCCESS;
}

static int64_t summary_bytes(const sk_dsel_problem *p) {
    return (int64_t)p->rows * ((int64_t)p->max_blocks + p->max_groups) * 2 * p->head_dim *
           (int64_t)sk_dtype_size(p->dtype);
}

/* A [n0, n1, n2, D] tensor of the call: extent and alignment (16 bytes and
 * 16-byte strides on CUDA). */
static sk_status check_tensor(const sk_dsel_problem *p, const void *ptr, int64_t n0, int64_t n1,
                              int64_t n2, const int64_t stride[3], const char *what,
                              int64_t *bytes) {
    if (ptr == NULL)
        return sk_error(SK_STATUS_BAD_PARAM_NULL_POINTER, "%s must not be NULL", what);
    const size_t es = sk_dtype_size(p->dtype);
    sk_tensor_shape t;
    sk_tensor_shape_init(&t, n0, n1, n2, p->head_dim, stride);
    SK_TRY(sk_check_tensor_extent(&t, es, what, bytes));
    const int cuda = sk_backend_is_cuda(p->backend);
    return sk_check_alignment(ptr, &t, es, cuda ? 16 : es, cuda ? 16 : 0, what);
}

/* An int32 array of `n` entries. */
static sk_status check_ints(const int32_t *ptr, int64_t n, const char *what, int64_t *bytes) {
    if (ptr == NULL)
        return sk_error(SK_STATUS_BAD_PARAM_NULL_POINTER, "%s must not be NULL", what);
    SK_TRY(sk_check_alignment(ptr, NULL, 4, 4, 0, what));
    *bytes = n * 4;
    return SK_STATUS_SUCCESS;
}

static sk_status check_summary(const sk_dsel_problem *p, const void *summary) {
    SK_CHECK_NOT_NULL(summary);
    const size_t es = sk_dtype_size(p->dtype);
    return sk_check_alignment(summary, NULL, es, sk_backend_is_cuda(p->backend) ? 16 : es, 0,
                              "summary");
}

/* Host lengths: each in [0, max_seqlen_k], and old <= new for an append. */
static sk_status check_lens(const sk_dsel_problem *p, const int32_t *lens, const char *what,
                            const int32_t *old_lens) {
    for (int32_t b = 0; b < p->batch; ++b) {
        if (lens[b] < 0 || lens[b] > p->max_seqlen_k)
            return sk_error(SK_STATUS_BAD_PARAM_SHAPE, "%s[%d] = %d is outside [0, max_seqlen_k = %lld]",
                            what, (int)b, (int)lens[b], (long long)p->max_seqlen_k);
        if (old_lens != NULL && (old_lens[b] < 0 || old_lens[b] > lens[b]))
            return sk_error(SK_STATUS_BAD_PARAM_SHAPE,
                            "old_lens[%d] = %d is outside [0, new_lens[%d] = %d]", (int)b,
                            (int)old_lens[b], (int)b, (int)lens[b]);
    }
    return SK_STATUS_SUCCESS;
}

/* Host page tables: the pages holding keys from[b] .. to[b] - 1. */
static sk_status check_pages(const sk_dsel_problem *p, const int32_t *from, const int32_t *to) {
    for (int32_t b = 0; b < p->batch; ++b) {
        const int32_t *row = p->page_table + (int64_t)b * p->page_table_stride;
        const int64_t first = from != NULL ? from[b] / p->page_size : 0;
        const int64_t end = sk_ceil_div_i64(to[b], p->page_size);
        for (int64_t i = first; i < end; ++i)
            if (row[i] < 0 || row[i] >= p->num_pages)
                return sk_error(SK_STATUS_BAD_PARAM_VALUE,
                                "page_table[%d][%lld] = %d is outside [0, num_pages = %lld): "
                                "sequence %d reads keys up to %d",
                                (int)b, (long long)i, (int)row[i], (long long)p->num_pages, (int)b,
                                (int)to[b]);
    }
    return SK_STATUS_SUCCESS;
}

sk_status sk_kv_summary_bytes(const sk_decode_select_desc *desc, size_t *bytes) {
    SK_ENTER("sk_kv_summary_bytes");
    SK_CHECK_NOT_NULL(bytes);
    sk_dsel_problem p;
    SK_TRY(build_problem(desc, &p));
    *bytes = (size_t)summary_bytes(&p);
    return SK_STATUS_SUCCESS;
}

/* Build (old_lens NULL) or append: every check, then the backend. */
static sk_status summary_call(const sk_decode_select_desc *desc, const void *k_cache,
                              const int32_t *page_table, const int32_t *old_lens,
                              const int32_t *lens, const char *lens_name, void *summary,
                              struct CUstream_st *stream) {
    sk_dsel_problem p;
    SK_TRY(build_problem(desc, &p));
    int64_t cache_bytes, table_bytes, lens_bytes = 0, old_bytes = 0, entries;
    SK_TRY(check_tensor(&p, k_cache, p.num_pages, p.page_size, p.heads_kv, p.k_stride, "k_cache",
                        &cache_bytes));
    SK_CHECK_NOT_NULL(page_table);
    if (!sk_mul_i64(p.batch - 1, p.page_table_stride, &entries) ||
        !sk_add_i64(entries, p.max_pages, &entries) || entries > INT64_MAX / 4)
        return sk_error(SK_STATUS_BAD_PARAM_OVERFLOW,
                        "page_table: (batch - 1) x page_table_stride + max_pages entries overflow");
    SK_TRY(check_ints(page_table, entries, "page_table", &table_bytes));
    if (old_lens != NULL) SK_TRY(check_ints(old_lens, p.batch, "old_lens", &old_bytes));
    SK_TRY(check_ints(lens, p.batch, lens_name, &lens_bytes));
    SK_TRY(check_summary(&p, summary));
    /* The append reads the summary too: it is one buffer either way. */
    const sk_buffer buffers[5] = {{"summary", summary, summary_bytes(&p), 1},
                                  {"k_cache", k_cache, cache_bytes, 0},
                                  {"page_table", page_table, table_bytes, 0},
                                  {lens_name, lens, lens_bytes, 0},
                                  {"old_lens", old_lens, old_bytes, 0}};
    SK_TRY(sk_check_no_alias(buffers, 5));
    p.k_cache = k_cache;
    p.page_table = page_table;
    p.seq_lens = lens;
    p.old_lens = old_lens;
    p.summary = summary;
    p.summary_out = summary;
    if (p.backend != SK_BACKEND_CPU) return sk_cuda_dsel_summary(&p, old_lens != NULL, stream);
    SK_TRY(check_lens(&p, lens, lens_name, old_lens));
    SK_TRY(check_pages(&p, old_lens, lens));
    return sk_cpu_dsel_summary(&p, old_lens != NULL);
}

sk_status sk_kv_summary_build(const sk_decode_select_desc *desc, const void *k_cache,
                              const int32_t *page_table, const int32_t *seq_lens_k, void *summary,
                              struct CUstream_st *stream) {
    SK_ENTER("sk_kv_summary_build");
    return summary_call(desc, k_cache, page_table, NULL, seq_lens_k, "seq_lens_k", summary, stream);
}

sk_status sk_kv_summary_append(const sk_decode_select_desc *desc, const void *k_cache,
                               const int32_t *page_table, const int32_t *old_lens,
                               const int32_t *new_lens, void *summary,
                               struct CUstream_st *stream) {
    SK_ENTER("sk_kv_summary_append");
    SK_CHECK_NOT_NULL(old_lens);
    return summary_call(desc, k_cache, page_table, old_lens, new_lens, "new_lens", summary,
                        stream);
}

sk_status sk_decode_select_capacity(const sk_decode_select_desc *desc, sk_grid *grid,
                                    int32_t *max_nnz) {
    SK_ENTER("sk_decode_select_capacity");
    sk_dsel_problem p;
    SK_TRY(build_problem(desc, &p));
    if (grid != NULL) *grid = p.grid;
    if (max_nnz != NULL) *max_nnz = p.capacity;
    return SK_STATUS_SUCCESS;
}

static sk_status workspace_need(const sk_dsel_problem *p, size_t *bytes) {
    *bytes = 0;
    if (p->backend == SK_BACKEND_CPU) return SK_STATUS_SUCCESS;
    return sk_cuda_dsel_workspace_size(p, bytes);
}

sk_status sk_decode_select_workspace_size(const sk_decode_select_desc *desc,
                                          size_t *workspace_bytes) {
    SK_ENTER("sk_decode_select_workspace_size");
    SK_CHECK_NOT_NULL(workspace_bytes);
    sk_dsel_problem p;
    SK_TRY(build_problem(desc, &p));
    size_t need;
    SK_TRY(workspace_need(&p, &need));
    *workspace_bytes = need;
    return SK_STATUS_SUCCESS;
}

sk_status sk_decode_select(const sk_decode_select_desc *desc, const void *q, const void *summary,
                           const int32_t *seq_lens_k, sk_bsr *layout, void *workspace,
                           size_t workspace_size, struct CUstream_st *stream) {
    SK_ENTER("sk_decode_select");
    sk_dsel_problem p;
    SK_TRY(build_problem(desc, &p));
    int64_t q_bytes, lens_bytes = 0;
    SK_TRY(check_tensor(&p, q, p.batch, p.q_len, p.heads_q, p.q_stride, "q", &q_bytes));
    SK_TRY(check_summary(&p, summary));
    SK_TRY(check_ints(seq_lens_k, p.batch, "seq_lens_k", &lens_bytes));
    SK_CHECK_NOT_NULL(layout);
    int64_t off_bytes = 0, idx_bytes = 0;
    SK_TRY(check_ints(layout->row_offsets, (int64_t)p.rows + 1, "layout->row_offsets", &off_bytes));
    if (p.capacity > 0)
        SK_TRY(check_ints(layout->col_indices, p.capacity, "layout->col_indices", &idx_bytes));
    sk_buffer buffers[5];
    sk_layout_array_buffers(buffers, "layout->row_offsets", "layout->col_indices",
                            layout->row_offsets, p.rows, layout->col_indices, p.capacity, 1);
    const sk_buffer inputs[3] = {{"q", q, q_bytes, 0},
                                 {"summary", summary, summary_bytes(&p), 0},
                                 {"seq_lens_k", seq_lens_k, lens_bytes, 0}};
    memcpy(buffers + 2, inputs, sizeof inputs);
    SK_TRY(sk_check_no_alias(buffers, 5));
    size_t need;
    SK_TRY(workspace_need(&p, &need));
    if (need > 0) {
        if (workspace == NULL || workspace_size < need)
            return sk_error(SK_STATUS_BAD_PARAM_WORKSPACE,
                            "workspace = %p of %zu bytes; this call needs %zu", workspace,
                            workspace_size, need);
        SK_TRY(sk_check_alignment(workspace, NULL, 1, 16, 0, "workspace"));
        SK_TRY(sk_check_workspace_apart(workspace, workspace_size, need, buffers, 5));
    }
    p.q = q;
    p.summary = summary;
    p.seq_lens = seq_lens_k;
    p.row_offsets = layout->row_offsets;
    p.col_indices = layout->col_indices;
    if (p.backend == SK_BACKEND_CPU) {
        SK_TRY(check_lens(&p, seq_lens_k, "seq_lens_k", NULL));
        SK_TRY(sk_cpu_dsel_select(&p));
    } else {
        SK_TRY(sk_cuda_dsel_select(&p, workspace, workspace_size, stream));
    }
    layout->grid = p.grid;
    layout->nnz = p.capacity;
    return SK_STATUS_SUCCESS;
}
