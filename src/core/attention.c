/*
 * attention.c - the public attention entry points: descriptor defaults, every
 * argument check, and dispatch to the CPU or CUDA backend.
 *
 * All checks run before any backend is called, so a failed call writes
 * nothing. The order is: descriptor, shapes, layout geometry, pointers,
 * strides and extents, alignment, aliasing (o and lse against every other
 * buffer, layout arrays included; then the CUDA workspace, sized here on the
 * host, against all of them), layout content (CPU only: device arrays
 * cannot be read from here), then the backend's own checks (device,
 * supported combination, workspace size).
 */
#include <float.h>
#include <stddef.h>
#include <math.h>
#include <string.h>

#include "core/check.h"
#include "core/internal.h"
#include "core/fp8_vt.h"
#include "core/layout.h"
#include "core/attention_internal.h"
#include "core/problem.h"
#include "cpu/cpu_backend.h"
#include "cuda/backend.h"

/* log2(e) in fp32, as the CUDA kernels fold it into the scale. */
#define SK_LOG2E_F32 1.4426950408889634f

/* The descriptor as callers built before the FP8 fields existed: every
 * field up to o_strides. Such a descriptor is taken as it is (out_dtype 0,
 * no descales) and its missing tail is never read or written. */
#define SK_ATTENTION_DESC_V1_SIZE offsetof(sk_attention_desc, out_dtype)
/* ... and before v_layout: the FP8 fields are read, V is rows. */
#define SK_ATTENTION_DESC_V2_SIZE offsetof(sk_attention_desc, v_layout)

sk_status sk_attention_desc_init(sk_attention_desc *desc, size_t struct_size) {
    SK_ENTER("sk_attention_desc_init");
    SK_CHECK_NOT_NULL(desc);
    if (struct_size != SK_ATTENTION_DESC_V1_SIZE && struct_size != SK_ATTENTION_DESC_V2_SIZE)
        SK_TRY(
            sk_check_init_struct_size(struct_size, sizeof(sk_attention_desc), "sk_attention_desc"));
    memset(desc, 0, struct_size);
    desc->struct_size = struct_size;
    desc->backend = SK_BACKEND_CUDA;
    desc->dtype = SK_DTYPE_F16;
    desc->scale = 0.0f;
    desc->mask = SK_MASK_NONE;
    return SK_STATUS_SUCCESS;
}

sk_status sk_attention_check_scale_mask(float scale, sk_mask mask) {
    if (!isfinite(scale))
        return sk_error(SK_STATUS_BAD_PARAM_VALUE, "desc->scale = %g must be finite",
                        (double)scale);
    /* The CUDA kernels' softmax is in base 2 with scale x log2(e) folded
     * into one fp32 factor: a scale whose fold overflows fp32 can only give
     * inf and NaN, so no backend takes it. fp32 rounds a product to inf
     * from 2^128 - 2^103 on; the double product of two floats is exact. */
    if ((double)fabsf(scale) * (double)SK_LOG2E_F32 >= 0x1p128 - 0x1p103)
        return sk_error(SK_STATUS_BAD_PARAM_VALUE,
                        "desc->scale = %g is too large: scale x log2(e), the fp32 factor of the "
                        "base-2 softmax, overflows fp32 (|scale| must be below %g)",
                        (double)scale, (double)FLT_MAX / (double)SK_LOG2E_F32);
    if (mask != SK_MASK_NONE && mask != SK_MASK_CAUSAL)
        return sk_error(SK_STATUS_BAD_PARAM_VALUE,
                        "desc->mask = %d is not an sk_mask (NONE=0, CAUSAL=1)", (int)mask);
    return SK_STATUS_SUCCESS;
}

sk_status sk_attention_check_struct_size(const sk_attention_desc *d, const char *what) {
    if (d->struct_size == SK_ATTENTION_DESC_V1_SIZE || d->struct_size == SK_ATTENTION_DESC_V2_SIZE)
        return SK_STATUS_SUCCESS;
    return sk_check_desc_struct_size(d->struct_size, sizeof(sk_attention_desc), what,
                                     "sk_attention_desc_init");
}

/* The FP8 fields of a checked-size descriptor (defaults for a V1 one). */
typedef struct fp8_fields {
    sk_dtype out_dtype;
    const float *q_descale, *k_descale, *v_descale;
    int32_t v_layout;
} fp8_fields;

static fp8_fields read_fp8_fields(const sk_attention_desc *d) {
    fp8_fields f;
    memset(&f, 0, sizeof f);
    if (d->struct_size != SK_ATTENTION_DESC_V1_SIZE) {
        f.out_dtype = d->out_dtype;
        f.q_descale = d->q_descale;
        f.k_descale = d->k_descale;
        f.v_descale = d->v_descale;
    }
    if (d->struct_size == sizeof(sk_attention_desc)) f.v_layout = d->v_layout;
    return f;
}

/* v_layout: an sk_v_layout; VT_FP8 with E4M3 inputs and v_strides all 0. */
static sk_status check_v_layout(const sk_attention_desc *d, const fp8_fields *f) {
    if (f->v_layout == SK_V_LAYOUT_ROWS) return SK_STATUS_SUCCESS;
    if (f->v_layout != SK_V_LAYOUT_VT_FP8)
        return sk_error(SK_STATUS_BAD_PARAM_VALUE,
                        "desc->v_layout = %d is not an sk_v_layout (ROWS = 0, VT_FP8 = 1)",
                        (int)f->v_layout);
    if (d->dtype != SK_DTYPE_E4M3)
        return sk_error(SK_STATUS_BAD_PARAM_DTYPE,
                        "desc->v_layout = VT_FP8 takes E4M3 inputs, but desc->dtype = %d",
                        (int)d->dtype);
    for (int i = 0; i < 3; ++i)
        if (d->v_strides[i] != 0)
            return sk_error(SK_STATUS_BAD_PARAM_STRIDE,
                            "desc->v_strides[%d] = %lld: with desc->v_layout = VT_FP8, V is the "
                            "packed [B, Hkv, D, Sk_pad] layout and v_strides must be all 0",
                            i, (long long)d->v_strides[i]);
    return SK_STATUS_SUCCESS;
}

/* O's dtype and the FP8 fields: out_dtype 0 means dtype (BF16 for E4M3);
 * E4M3 inputs give F16 or BF16 O, any other dtype its own; descales only
 * with E4M3. *out gets O's dtype. */
static sk_status check_fp8_fields(const sk_attention_desc *d, sk_dtype *out) {
    const fp8_fields f = read_fp8_fields(d);
    const int fp8 = d->dtype == SK_DTYPE_E4M3;
    const sk_dtype o = f.out_dtype != 0 ? f.out_dtype : fp8 ? SK_DTYPE_BF16 : d->dtype;
    if (fp8 && o != SK_DTYPE_F16 && o != SK_DTYPE_BF16)
        return sk_error(SK_STATUS_BAD_PARAM_DTYPE,
                        "desc->out_dtype = %d: O of E4M3 inputs is F16 or BF16 (0: BF16)",
                        (int)f.out_dtype);
    if (!fp8 && o != d->dtype)
        return sk_error(SK_STATUS_BAD_PARAM_DTYPE,
                        "desc->out_dtype = %d must be 0 or desc->dtype (%d) unless dtype is E4M3",
                        (int)f.out_dtype, (int)d->dtype);
    if (!fp8) {
        const char *set = f.q_descale != NULL   ? "desc->q_descale"
                          : f.k_descale != NULL ? "desc->k_descale"
                          : f.v_descale != NULL ? "desc->v_descale"
                                                : NULL;
        if (set != NULL)
            return sk_error(SK_STATUS_BAD_PARAM_VALUE,
                            "%s must be NULL unless desc->dtype is E4M3 (it scales FP8 inputs)",
                            set);
    }
    SK_TRY(check_v_layout(d, &f));
    *out = o;
    return SK_STATUS_SUCCESS;
}

/* d is not NULL; sizes are its six sizes. E4M3 inputs are checked as their
 * O's dtype (the shape check takes no FP8: only this entry point does). */
static sk_status check_desc(const sk_attention_desc *d, const int64_t sizes[6], sk_dtype *out) {
    SK_TRY(sk_attention_check_struct_size(d, "desc"));
    if (d->dtype == SK_DTYPE_E4M3) {
        SK_TRY(check_fp8_fields(d, out));
        SK_TRY(sk_check_attention_shape(d->backend, *out, sizes));
    } else {
        SK_TRY(sk_check_attention_shape(d->backend, d->dtype, sizes));
        SK_TRY(check_fp8_fields(d, out));
    }
    return sk_attention_check_scale_mask(d->scale, d->mask);
}

void sk_attention_problem_init(sk_attention_problem *p, sk_backend backend, sk_dtype dtype,
                               const int64_t sizes[6], float scale, sk_mask mask) {
    memset(p, 0, sizeof *p);
    p->backend = backend;
    p->dtype = dtype;
    p->batch = sizes[0];
    p->seq_q = sizes[1];
    p->seq_k = sizes[2];
    p->heads_q = sizes[3];
    p->heads_kv = sizes[4];
    p->head_dim = sizes[5];
    p->group = (int32_t)(p->heads_q / p->heads_kv);
    p->scale = scale != 0.0f ? scale : (float)(1.0 / sqrt((double)p->head_dim));
    p->causal = mask == SK_MASK_CAUSAL;
    p->lse_head_stride = p->seq_q;
    p->out_dtype = dtype;
}

sk_status sk_attention_layout_slices(const sk_bsr *layout, int32_t row_blocks, int32_t col_blocks,
                                     sk_attention_problem *p) {
    const sk_grid *g = &layout->grid;
    if (g->heads != 1 && g->heads != p->heads_kv && g->heads != p->heads_q)
        return sk_error(SK_STATUS_BAD_LAYOUT_MISMATCH,
                        "layout grid heads = %d must be 1, heads_kv = %lld or heads_q = %lld",
                        (int)g->heads, (long long)p->heads_kv, (long long)p->heads_q);
    if (layout->nnz < 0)
        return sk_error(SK_STATUS_BAD_LAYOUT_COUNT, "layout nnz = %d is negative",
                        (int)layout->nnz);
    if (layout->row_offsets == NULL)
        return sk_error(SK_STATUS_BAD_PARAM_NULL_POINTER, "layout->row_offsets must not be NULL");
    if (layout->col_indices == NULL && layout->nnz > 0)
        return sk_error(SK_STATUS_BAD_PARAM_NULL_POINTER,
                        "layout->col_indices must not be NULL when nnz = %d > 0", (int)layout->nnz);
    /* int32 arrays on every backend (the CUDA kernels load them as such). */
    SK_TRY(sk_check_alignment(layout->row_offsets, NULL, 4, 4, 0, "layout->row_offsets"));
    if (layout->col_indices != NULL)
        SK_TRY(sk_check_alignment(layout->col_indices, NULL, 4, 4, 0, "layout->col_indices"));
    p->block_q = g->block_rows;
    p->block_k = g->block_cols;
    p->row_blocks = row_blocks;
    p->slice_rows = row_blocks;
    p->col_blocks = col_blocks;
    p->layout_batch = g->batch;
    p->layout_heads = g->heads;
    /* Query head h reads head slice h / head_div. */
    if (g->heads == 1)
        p->head_div = (int32_t)p->heads_q;
    else if (g->heads == p->heads_q)
        p->head_div = 1;
    else
        p->head_div = (int32_t)(p->heads_q / p->heads_kv);
    p->nnz = layout->nnz;
    p->row_offsets = layout->row_offsets;
    p->col_indices = layout->col_indices;
    return SK_STATUS_SUCCESS;
}

/* Layout geometry against the descriptor; fills the layout part of *p. */
static sk_status check_layout_geometry(const sk_attention_desc *d, const sk_bsr *layout,
                                       sk_attention_problem *p) {
    SK_CHECK_NOT_NULL(layout);
    int32_t row_blocks, col_blocks;
    SK_TRY(sk_grid_check(&layout->grid, &row_blocks, &col_blocks, NULL));
    const sk_grid *g = &layout->grid;
    if (g->rows != d->seq_q || g->cols != d->seq_k)
        return sk_error(SK_STATUS_BAD_LAYOUT_MISMATCH,
                        "layout grid is %lld x %lld tokens, but seq_q = %lld and seq_k = %lld",
                        (long long)g->rows, (long long)g->cols, (long long)d->seq_q,
                        (long long)d->seq_k);
    if (g->batch != 1 && g->batch != d->batch)
        return sk_error(SK_STATUS_BAD_LAYOUT_MISMATCH,
                        "layout grid batch = %d must be 1 (broadcast) or batch = %lld",
                        (int)g->batch, (long long)d->batch);
    return sk_attention_layout_slices(layout, row_blocks, col_blocks, p);
}

sk_status sk_attention_check_sizes(const sk_attention_problem *p, const char *q_dims,
                                   const char *kv_dims, const char *lse_dims) {
    /* Packed strides are products of the sizes: check those first, in
     * bytes; LSE [B, Hq, Sq] fp32 on its own (with 2-byte elements and
     * D = 1 it is larger than Q). */
    /* Q and O: the wider of the two (FP8 inputs, 2-byte O). */
    const int64_t es = (int64_t)(sk_dtype_size(p->out_dtype) > sk_dtype_size(p->dtype)
                                     ? sk_dtype_size(p->out_dtype)
                                     : sk_dtype_size(p->dtype));
    const int64_t q_sizes[5] = {p->batch, p->seq_q, p->heads_q, p->head_dim, es};
    const int64_t kv_sizes[5] = {p->batch, p->seq_k, p->heads_kv, p->head_dim, es};
    const int64_t lse_sizes[4] = {p->batch, p->heads_q, p->seq_q, 4};
    int64_t bytes;
    if (!sk_product_i64(q_sizes, 5, &bytes))
        return sk_error(SK_STATUS_BAD_PARAM_OVERFLOW,
                        "q and o: %s x heads_q x head_dim x %lld bytes overflows int64", q_dims,
                        (long long)es);
    if (!sk_product_i64(kv_sizes, 5, &bytes))
        return sk_error(SK_STATUS_BAD_PARAM_OVERFLOW,
                        "k and v: %s x heads_kv x head_dim x %lld bytes overflows int64", kv_dims,
                        (long long)es);
    if (!sk_product_i64(lse_sizes, 4, &bytes))
        return sk_error(SK_STATUS_BAD_PARAM_OVERFLOW, "lse: %s x 4 bytes overflows int64",
                        lse_dims);
    return SK_STATUS_SUCCESS;
}

/* Everything that needs no tensor pointer: descriptor, shapes, strides,
 * layout geometry. Fills *p except the tensor pointers. */
sk_status sk_attention_check_geometry(const sk_attention_desc *d, const sk_bsr *layout,
                                      sk_attention_problem *p) {
    if (d == NULL) return sk_error(SK_STATUS_BAD_PARAM_NULL_POINTER, "desc must not be NULL");
    const int64_t sizes[6] = {d->batch, d->seq_q, d->seq_k, d->heads_q, d->heads_kv, d->head_dim};
    sk_dtype out_dtype;
    SK_TRY(check_desc(d, sizes, &out_dtype));
    sk_attention_problem_init(p, d->backend, d->dtype, sizes, d->scale, d->mask);
    const fp8_fields f = read_fp8_fields(d);
    p->out_dtype = out_dtype;
    p->q_descale = f.q_descale;
    p->k_descale = f.k_descale;
    p->v_descale = f.v_descale;
    p->v_layout = f.v_layout;
    SK_TRY(check_layout_geometry(d, layout, p));
    SK_TRY(
        sk_attention_check_sizes(p, "batch x seq_q", "batch x seq_k", "batch x heads_q x seq_q"));
    if (p->v_layout == SK_V_LAYOUT_VT_FP8) {
        const int64_t vt_sizes[4] = {p->batch, p->heads_kv, p->head_dim,
                                     p->seq_k <= INT64_MAX - 127 ? sk_vt_seq_pad(p->seq_k) : -1};
        int64_t bytes;
        if (vt_sizes[3] < 0 || !sk_product_i64(vt_sizes, 4, &bytes))
            return sk_error(SK_STATUS_BAD_PARAM_OVERFLOW,
                            "v (desc->v_layout = VT_FP8): batch x heads_kv x head_dim x seq_k "
                            "rounded up to 128 overflows int64");
    }
    sk_resolve_strides(d->q_strides, d->seq_q, d->heads_q, d->head_dim, p->q_stride);
    sk_resolve_strides(d->k_strides, d->seq_k, d->heads_kv, d->head_dim, p->k_stride);
    sk_resolve_strides(d->v_strides, d->seq_k, d->heads_kv, d->head_dim, p->v_stride);
    sk_resolve_strides(d->o_strides, d->seq_q, d->heads_q, d->head_dim, p->o_stride);
    return SK_STATUS_SUCCESS;
}

/* The layout arrays as read buffers: slices x row_blocks + 1 offsets,
 * nnz indices. */
void sk_attention_layout_buffers(const sk_attention_problem *p, sk_buffer out[2]) {
    const int64_t rows = (int64_t)p->layout_batch * p->layout_heads * p->row_blocks;
    sk_layout_array_buffers(out, "layout->row_offsets", "layout->col_indices", p->row_offsets, rows,
                            p->col_indices, p->nnz, 0);
}

sk_status sk_attention_check_row_bytes(const sk_attention_problem *p) {
    const int64_t row_bytes = p->head_dim * (int64_t)sk_dtype_size(p->dtype);
    if (sk_backend_is_cuda(p->backend) && row_bytes % 16 != 0)
        return sk_error(SK_STATUS_BAD_PARAM_ALIGNMENT,
                        "head_dim = %lld rows are not a multiple of 16 bytes, as the CUDA backend "
                        "needs",
                        (long long)p->head_dim);
    return SK_STATUS_SUCCESS;
}

sk_status sk_attention_check_tensor(const sk_attention_problem *p, const void *ptr, int64_t n0,
                                    int64_t n1, int64_t heads, const int64_t stride[3], int written,
                                    const char *what, sk_buffer *out) {
    const size_t es = sk_dtype_size(p->dtype);
    sk_tensor_shape t;
    sk_tensor_shape_init(&t, n0, n1, heads, p->head_dim, stride);
    int64_t bytes;
    SK_TRY(sk_check_tensor_extent(&t, es, what, &bytes));
    if (written) SK_TRY(sk_check_no_self_overlap(&t, what));
    const int cuda = sk_backend_is_cuda(p->backend);
    SK_TRY(sk_check_alignment(ptr, &t, es, cuda ? 16 : es, cuda ? 16 : 0, what));
    out->what = what;
    out->ptr = ptr;
    out->bytes = bytes;
    out->written = written;
    return SK_STATUS_SUCCESS;
}

/* Pointer, extent and alignment checks of the run call; the byte spans of
 * its buffers into buffers[] for the caller's aliasing check. */
sk_status sk_attention_check_tensors(sk_attention_problem *p, const void *q, const void *k,
                                     const void *v, void *o, float *lse,
                                     sk_buffer buffers[SK_ATTN_BUFFERS]) {
    SK_CHECK_NOT_NULL(q);
    SK_CHECK_NOT_NULL(k);
    SK_CHECK_NOT_NULL(v);
    SK_CHECK_NOT_NULL(o);
    const size_t es = sk_dtype_size(p->dtype), oes = sk_dtype_size(p->out_dtype);
    sk_tensor_shape tq, tk, tv, to;
    sk_tensor_shape_init(&tq, p->batch, p->seq_q, p->heads_q, p->head_dim, p->q_stride);
    sk_tensor_shape_init(&tk, p->batch, p->seq_k, p->heads_kv, p->head_dim, p->k_stride);
    if (p->v_layout == SK_V_LAYOUT_VT_FP8) {
        /* V^T [B, Hkv, D, Sk_pad], packed (fp8_vt.h), as a 4-D tensor. */
        const int64_t pad = sk_vt_seq_pad(p->seq_k);
        const int64_t vt_stride[3] = {p->heads_kv * p->head_dim * pad, p->head_dim * pad, pad};
        sk_tensor_shape_init(&tv, p->batch, p->heads_kv, p->head_dim, pad, vt_stride);
    } else {
        sk_tensor_shape_init(&tv, p->batch, p->seq_k, p->heads_kv, p->head_dim, p->v_stride);
    }
    sk_tensor_shape_init(&to, p->batch, p->seq_q, p->heads_q, p->head_dim, p->o_stride);
    int64_t q_bytes, k_bytes, v_bytes, o_bytes;
    SK_TRY(sk_check_tensor_extent(&tq, es, "q", &q_bytes));
    SK_TRY(sk_check_tensor_extent(&tk, es, "k", &k_bytes));
    SK_TRY(sk_check_tensor_extent(&tv, es, "v", &v_bytes));
    SK_TRY(sk_check_tensor_extent(&to, oes, "o", &o_bytes));
    SK_TRY(sk_check_no_self_overlap(&to, "o"));

    /* The CUDA kernels move 16-byte vectors of one row; the CPU needs
     * element alignment only. */
    const int cuda = sk_backend_is_cuda(p->backend);
    const size_t align = cuda ? 16 : es, stride_align = cuda ? 16 : 0;
    SK_TRY(sk_attention_check_row_bytes(p));
    SK_TRY(sk_check_alignment(q, &tq, es, align, stride_align, "q"));
    SK_TRY(sk_check_alignment(k, &tk, es, align, stride_align, "k"));
    SK_TRY(sk_check_alignment(v, &tv, es, align, stride_align, "v"));
    SK_TRY(sk_check_alignment(o, &to, oes, cuda ? 16 : oes, stride_align, "o"));
    if (lse != NULL) SK_TRY(sk_check_alignment(lse, NULL, 4, 4, 0, "lse"));

    /* LSE [B, Hq, Sq] fp32: checked by sk_attention_check_geometry. */
    const int64_t lse_bytes = p->batch * p->heads_q * p->seq_q * 4;
    const sk_buffer tensors[SK_ATTN_ROW_OFFSETS] = {{"o", o, o_bytes, 1},
                                                    {"lse", lse, lse_bytes, 1},
                                                    {"q", q, q_bytes, 0},
                                                    {"k", k, k_bytes, 0},
                                                    {"v", v, v_bytes, 0}};
    memcpy(buffers, tensors, sizeof tensors);
    sk_attention_layout_buffers(p, buffers + SK_ATTN_ROW_OFFSETS);

    p->q = q;
    p->k = k;
    p->v = v;
    p->o = o;
    p->lse = lse;
    return SK_STATUS_SUCCESS;
}

sk_status sk_attention_check_workspace_apart(const sk_attention_problem *p, const void *workspace,
                                             size_t workspace_size, const sk_buffer *buffers,
                                             int count) {
    if (p->backend == SK_BACKEND_CPU || workspace == NULL) return SK_STATUS_SUCCESS;
    size_t bytes;
    SK_TRY(sk_attention_problem_workspace_size(p, &bytes));
    return sk_check_workspace_apart(workspace, workspace_size, bytes, buffers, count);
}

/* The FP8 descales of run / forward (read; NULL: absent): fp32 [B, H],
 * 4-byte aligned; their byte spans into out[3]. */
static sk_status check_descales(const sk_attention_problem *p, sk_buffer out[3]) {
    const float *const ptr[3] = {p->q_descale, p->k_descale, p->v_descale};
    const int64_t heads[3] = {p->heads_q, p->heads_kv, p->heads_kv};
    static const char *const names[3] = {"desc->q_descale", "desc->k_descale", "desc->v_descale"};
    for (int i = 0; i < 3; ++i) {
        if (ptr[i] != NULL) SK_TRY(sk_check_alignment(ptr[i], NULL, 4, 4, 0, names[i]));
        /* batch and heads fit int32 (sk_check_attention_shape): no overflow. */
        out[i].what = names[i];
        out[i].ptr = ptr[i];
        out[i].bytes = p->batch * heads[i] * 4;
        out[i].written = 0;
    }
    return SK_STATUS_SUCCESS;
}

/* The aliasing rule of run / forward: o and lse against every other buffer
 * (the descales included), then the workspace (written on CUDA) against all
 * of them. */
static sk_status check_aliasing(const sk_attention_problem *p, const sk_buffer *buffers,
                                const void *workspace, size_t workspace_size) {
    sk_buffer all[SK_ATTN_BUFFERS + 3];
    memcpy(all, buffers, SK_ATTN_BUFFERS * sizeof *buffers);
    SK_TRY(check_descales(p, all + SK_ATTN_BUFFERS));
    SK_TRY(sk_check_no_alias(all, SK_ATTN_BUFFERS + 3));
    return sk_attention_check_workspace_apart(p, workspace, workspace_size, all,
                                              SK_ATTN_BUFFERS + 3);
}

/* Host layouts are checked in full; device ones cannot be read here. */
sk_status sk_attention_check_layout_content(const sk_attention_problem *p, const sk_bsr *layout) {
    if (p->backend == SK_BACKEND_CPU) return sk_layout_check(layout);
    return SK_STATUS_SUCCESS;
}

sk_status sk_attention_problem_workspace_size(const sk_attention_problem *p,
                                              size_t *workspace_bytes) {
    if (p->backend == SK_BACKEND_CPU) {
        *workspace_bytes = 0;
        return SK_STATUS_SUCCESS;
    }
    return sk_cuda_attention_workspace_size(p, workspace_bytes);
}

sk_status sk_attention_workspace_size(const sk_attention_desc *desc, const sk_bsr *layout,
                                      size_t *workspace_bytes) {
    SK_ENTER("sk_attention_workspace_size");
    SK_CHECK_NOT_NULL(workspace_bytes);
    sk_attention_problem p;
    SK_TRY(sk_attention_check_geometry(desc, layout, &p));
    return sk_attention_problem_workspace_size(&p, workspace_bytes);
}

static sk_status plan_checked(const sk_attention_problem *p, void *workspace, size_t workspace_size,
                              struct CUstream_st *stream) {
    if (p->backend == SK_BACKEND_CPU) return SK_STATUS_SUCCESS;
    return sk_cuda_attention_plan(p, workspace, workspace_size, stream);
}

sk_status sk_attention_plan(const sk_attention_desc *desc, const sk_bsr *layout, void *workspace,
                            size_t workspace_size, struct CUstream_st *stream) {
    SK_ENTER("sk_attention_plan");
    sk_attention_problem p;
    SK_TRY(sk_attention_check_geometry(desc, layout, &p));
    /* The plan writes the workspace and reads the layout arrays. */
    sk_buffer arrays[2];
    sk_attention_layout_buffers(&p, arrays);
    SK_TRY(sk_attention_check_workspace_apart(&p, workspace, workspace_size, arrays, 2));
    SK_TRY(sk_attention_check_layout_content(&p, layout));
    return plan_checked(&p, workspace, workspace_size, stream);
}

static sk_status run_checked(const sk_attention_problem *p, void *workspace, size_t workspace_size,
                             struct CUstream_st *stream) {
    if (p->backend == SK_BACKEND_CPU) return sk_cpu_attention_run(p);
    return sk_cuda_attention_run(p, workspace, workspace_size, stream);
}

/* sk_attention_run's checks and run, with a carried-in LSE or none, all
 * tiles or a part (part NULL: all, no reserve). */
static sk_status run_call(const sk_attention_desc *desc, const sk_bsr *layout, const void *q,
                          const void *k, const void *v, void *o, float *lse, const float *lse_carry,
                          const sk_attention_part *part, void *workspace, size_t workspace_size,
                          struct CUstream_st *stream) {
    sk_attention_problem p;
    SK_TRY(sk_attention_check_geometry(desc, layout, &p));
    sk_buffer buffers[SK_ATTN_BUFFERS];
    SK_TRY(sk_attention_check_tensors(&p, q, k, v, o, lse, buffers));
    SK_TRY(check_aliasing(&p, buffers, workspace, workspace_size));
    SK_TRY(sk_attention_check_layout_content(&p, layout));
    p.lse_carry = lse_carry;
    if (part != NULL) {
        p.tile_first = part->tile_first;
        p.tile_count = part->tile_count;
        p.reserve_sms = part->reserve_sms;
    }
    return run_checked(&p, workspace, workspace_size, stream);
}

sk_status sk_attention_run(const sk_attention_desc *desc, const sk_bsr *layout, const void *q,
                           const void *k, const void *v, void *o, float *lse, void *workspace,
                           size_t workspace_size, struct CUstream_st *stream) {
    SK_ENTER("sk_attention_run");
    return run_call(desc, layout, q, k, v, o, lse, NULL, NULL, workspace, workspace_size, stream);
}

sk_status sk_attention_carry_supported(const sk_attention_desc *desc, const sk_bsr *layout,
                                       int *supported) {
    sk_attention_problem p;
    *supported = 0;
    SK_TRY(sk_attention_check_geometry(desc, layout, &p));
    if (!sk_backend_is_cuda(p.backend)) return SK_STATUS_SUCCESS;
    return sk_cuda_attention_carry_supported(&p, supported);
}

sk_status sk_attention_run_carry(const sk_attention_desc *desc, const sk_bsr *layout, const void *q,
                                 const void *k, const void *v, void *o, float *lse,
                                 const float *lse_carry, void *workspace, size_t workspace_size,
                                 struct CUstream_st *stream) {
    return run_call(desc, layout, q, k, v, o, lse, lse_carry, NULL, workspace, workspace_size,
                    stream);
}

sk_status sk_attention_run_part(const sk_attention_desc *desc, const sk_bsr *layout, const void *q,
                                const void *k, const void *v, void *o, float *lse,
                                const sk_attention_part *part, void *workspace,
                                size_t workspace_size, struct CUstream_st *stream) {
    return run_call(desc, layout, q, k, v, o, lse, NULL, part, workspace, workspace_size, stream);
}

sk_status sk_attention_forward(const sk_attention_desc *desc, const sk_bsr *layout, const void *q,
                               const void *k, const void *v, void *o, float *lse, void *workspace,
                               size_t workspace_size, struct CUstream_st *stream) {
    SK_ENTER("sk_attention_forward");
    sk_attention_problem p;
    SK_TRY(sk_attention_check_geometry(desc, layout, &p));
    sk_buffer buffers[SK_ATTN_BUFFERS];
    SK_TRY(sk_attention_check_tensors(&p, q, k, v, o, lse, buffers));
    SK_TRY(check_aliasing(&p, buffers, workspace, workspace_size));
    SK_TRY(sk_attention_check_layout_content(&p, layout));
    return sk_attention_enqueue(&p, workspace, workspace_size, stream);
}

sk_status sk_attention_enqueue(const sk_attention_problem *p, void *workspace,
                               size_t workspace_size, struct CUstream_st *stream) {
    SK_TRY(plan_checked(p, workspace, workspace_size, stream));
    return run_checked(p, workspace, workspace_size, stream);
}
