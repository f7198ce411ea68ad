/*
 * quantize.c - sk_quantize_e4m3 (sparsek.h, "FP8 quantization"): descriptor
 * defaults, every argument check, dispatch to the CPU (cpu/fp8.c) or CUDA
 * backend (cuda/quantize/quantize.cu). Checks first, so a failed call
 * writes nothing: descriptor, shapes, x's extent and alignment, y's and
 * descale's spans, aliasing (y and descale against every buffer, then the
 * CUDA workspace against all of them).
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/check.h"
#include "core/internal.h"
#include "cpu/fp8.h"
#include "core/fp8_vt.h"
#include "cuda/backend.h"

/* The descriptor as callers built it before the layout field: every field
 * up to x_strides. Taken as SK_QUANT_LAYOUT_ROWS; its tail is never read. */
#define SK_QUANTIZE_DESC_V1_SIZE offsetof(sk_quantize_desc, layout)

sk_status sk_quantize_desc_init(sk_quantize_desc *desc, size_t struct_size) {
    SK_ENTER("sk_quantize_desc_init");
    SK_CHECK_NOT_NULL(desc);
    if (struct_size != SK_QUANTIZE_DESC_V1_SIZE)
        SK_TRY(
            sk_check_init_struct_size(struct_size, sizeof(sk_quantize_desc), "sk_quantize_desc"));
    memset(desc, 0, struct_size);
    desc->struct_size = struct_size;
    desc->backend = SK_BACKEND_CUDA;
    desc->dtype = SK_DTYPE_BF16;
    return SK_STATUS_SUCCESS;
}

/* Bytes of the VT_FP8 layout (sparsek.h); no SK_ENTER: the callers name it. */
static sk_status vt_elems(int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                          int64_t *elems) {
    const int64_t sizes[4] = {batch, seq, heads, head_dim};
    static const char *const names[4] = {"batch", "seq", "heads", "head_dim"};
    for (int i = 0; i < 4; ++i)
        if (sizes[i] < 1)
            return sk_error(SK_STATUS_BAD_PARAM_SHAPE, "%s = %lld must be >= 1", names[i],
                            (long long)sizes[i]);
    /* S_pad: seq + 127 cannot overflow below INT64_MAX - 127. */
    const int64_t padded[4] = {batch, heads, head_dim,
                               seq <= INT64_MAX - 127 ? sk_vt_seq_pad(seq) : -1};
    int64_t n;
    if (padded[3] < 0 || !sk_product_i64(padded, 4, &n))
        return sk_error(SK_STATUS_BAD_PARAM_OVERFLOW,
                        "batch x heads x head_dim x seq rounded up to 128 overflows int64 "
                        "(the VT_FP8 layout's size)");
    *elems = n;
    return SK_STATUS_SUCCESS;
}

/* The descriptor, with x's resolved strides into *q. */
static sk_status check_desc(const sk_quantize_desc *d, sk_quantize_problem *q) {
    if (d == NULL) return sk_error(SK_STATUS_BAD_PARAM_NULL_POINTER, "desc must not be NULL");
    if (d->struct_size != SK_QUANTIZE_DESC_V1_SIZE)
        SK_TRY(sk_check_desc_struct_size(d->struct_size, sizeof(sk_quantize_desc), "desc",
                                         "sk_quantize_desc_init"));
    const int32_t layout = d->struct_size == sizeof(sk_quantize_desc) ? d->layout : 0;
    if (layout != SK_QUANT_LAYOUT_ROWS && layout != SK_QUANT_LAYOUT_VT_FP8)
        return sk_error(SK_STATUS_BAD_PARAM_VALUE,
                        "desc->layout = %d is not an sk_quant_layout (ROWS = 0, VT_FP8 = 1)",
                        (int)layout);
    SK_TRY(sk_check_backend(d->backend, "desc->backend"));
    if (d->dtype != SK_DTYPE_F16 && d->dtype != SK_DTYPE_BF16)
        return sk_error(SK_STATUS_BAD_PARAM_DTYPE, "desc->dtype = %d: x is F16 or BF16",
                        (int)d->dtype);
    const int64_t sizes[4] = {d->batch, d->seq, d->heads, d->head_dim};
    static const char *const names[4] = {"batch", "seq", "heads", "head_dim"};
    for (int i = 0; i < 4; ++i)
        if (sizes[i] < 1)
            return sk_error(SK_STATUS_BAD_PARAM_SHAPE, "desc->%s = %lld must be >= 1", names[i],
                            (long long)sizes[i]);
    int64_t n;
    if (!sk_product_i64(sizes, 4, &n) || !sk_mul_i64(n, 2, &n))
        return sk_error(SK_STATUS_BAD_PARAM_OVERFLOW,
                        "x: batch x seq x heads x head_dim x 2 bytes overflows int64");
    if (!sk_mul_i64(d->batch, d->heads, &n) || n > INT32_MAX)
        return sk_error(SK_STATUS_BAD_PARAM_OVERFLOW,
                        "desc->batch x desc->heads = %lld x %lld must be below 2^31",
                        (long long)d->batch, (long long)d->heads);
    const int cuda = sk_backend_is_cuda(d->backend);
    if (cuda && d->head_dim % 8 != 0)
        return sk_error(SK_STATUS_BAD_PARAM_SHAPE,
                        "desc->head_dim = %lld: the CUDA backend needs a multiple of 8",
                        (long long)d->head_dim);
    memset(q, 0, sizeof *q);
    q->backend = d->backend;
    q->dtype = d->dtype;
    q->batch = d->batch;
    q->seq = d->seq;
    q->heads = d->heads;
    q->head_dim = d->head_dim;
    q->layout = layout;
    if (layout == SK_QUANT_LAYOUT_VT_FP8) {
        int64_t elems;
        SK_TRY(vt_elems(d->batch, d->seq, d->heads, d->head_dim, &elems));
    }
    sk_resolve_strides(d->x_strides, d->seq, d->heads, d->head_dim, q->x_stride);
    return SK_STATUS_SUCCESS;
}

sk_status sk_quantize_vt_elems(int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                               int64_t *elems) {
    SK_ENTER("sk_quantize_vt_elems");
    SK_CHECK_NOT_NULL(elems);
    return vt_elems(batch, seq, heads, head_dim, elems);
}

static sk_status quantize_workspace_size(const sk_quantize_problem *q, size_t *bytes) {
    if (q->backend == SK_BACKEND_CPU) {
        *bytes = 0;
        return SK_STATUS_SUCCESS;
    }
    return sk_cuda_quantize_e4m3_workspace_size(q, bytes);
}

sk_status sk_quantize_e4m3_workspace_size(const sk_quantize_desc *desc, size_t *workspace_bytes) {
    SK_ENTER("sk_quantize_e4m3_workspace_size");
    SK_CHECK_NOT_NULL(workspace_bytes);
    sk_quantize_problem q;
    SK_TRY(check_desc(desc, &q));
    return quantize_workspace_size(&q, workspace_bytes);
}

sk_status sk_quantize_e4m3(const sk_quantize_desc *desc, const void *x, uint8_t *y,
                           float *descale, void *workspace, size_t workspace_size,
                           struct CUstream_st *stream) {
    SK_ENTER("sk_quantize_e4m3");
    sk_quantize_problem q;
    SK_TRY(check_desc(desc, &q));
    SK_CHECK_NOT_NULL(x);
    SK_CHECK_NOT_NULL(y);
    SK_CHECK_NOT_NULL(descale);
    const int cuda = sk_backend_is_cuda(q.backend);
    sk_tensor_shape tx, ty;
    const int64_t packed[3] = {0, 0, 0};
    int64_t y_stride[3];
    sk_resolve_strides(packed, q.seq, q.heads, q.head_dim, y_stride);
    sk_tensor_shape_init(&tx, q.batch, q.seq, q.heads, q.head_dim, q.x_stride);
    sk_tensor_shape_init(&ty, q.batch, q.seq, q.heads, q.head_dim, y_stride);
    int64_t x_bytes, y_bytes;
    SK_TRY(sk_check_tensor_extent(&tx, 2, "x", &x_bytes));
    SK_TRY(sk_check_tensor_extent(&ty, 1, "y", &y_bytes));
    const int vt = q.layout == SK_QUANT_LAYOUT_VT_FP8;
    if (vt) SK_TRY(vt_elems(q.batch, q.seq, q.heads, q.head_dim, &y_bytes));
    /* CUDA reads x in 16-byte vectors of one row. */
    SK_TRY(sk_check_alignment(x, &tx, 2, cuda ? 16 : 2, cuda ? 16 : 0, "x"));
    SK_TRY(sk_check_alignment(descale, NULL, 4, 4, 0, "descale"));
    /* CUDA writes 8-byte vectors of a row (VT_FP8: 16-byte ones). */
    if (cuda) SK_TRY(sk_check_alignment(y, NULL, 1, vt ? 16 : 8, 0, "y"));
    const sk_buffer buffers[3] = {{"y", y, y_bytes, 1},
                                  {"descale", descale, q.batch * q.heads * 4, 1},
                                  {"x", x, x_bytes, 0}};
    SK_TRY(sk_check_no_alias(buffers, 3));
    if (q.backend == SK_BACKEND_CPU) {
        sk_cpu_quantize_e4m3(x, q.dtype, q.batch, q.seq, q.heads, q.head_dim, q.x_stride, y,
                             descale, q.layout);
        return SK_STATUS_SUCCESS;
    }
    size_t need;
    SK_TRY(quantize_workspace_size(&q, &need));
    if (workspace != NULL) SK_TRY(sk_check_workspace_apart(workspace, workspace_size, need, buffers, 3));
    q.x = x;
    q.y = y;
    q.descale = descale;
    return sk_cuda_quantize_e4m3(&q, workspace, workspace_size, stream);
}
