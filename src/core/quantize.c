/*
 * quantize.c - sk_quantize_e4m3 (sparsek.h, "FP8 quantization"): descriptor
 * defaults, every argument check, dispatch to the CPU (cpu/fp8.c) or CUDA
 * backend (cuda/quantize/quantize.cu). Checks first, so a failed call
 * writes nothing: descriptor, shapes, x's extent and alignment, y's and
 * descale's spans, aliasing (y and descale against every buffer, then the
 * CUDA workspace against all of them).
 */
#include <string.h>

#include "core/check.h"
#include "core/internal.h"
#include "cpu/fp8.h"
#include "cuda/backend.h"

sk_status sk_quantize_desc_init(sk_quantize_desc *desc, size_t struct_size) {
    SK_ENTER("sk_quantize_desc_init");
    SK_CHECK_NOT_NULL(desc);
    SK_TRY(sk_check_init_struct_size(struct_size, sizeof(sk_quantize_desc), "sk_quantize_desc"));
    memset(desc, 0, sizeof *desc);
    desc->struct_size = sizeof *desc;
    desc->backend = SK_BACKEND_CUDA;
    desc->dtype = SK_DTYPE_BF16;
    return SK_STATUS_SUCCESS;
}

/* The descriptor, with x's resolved strides into *q. */
static sk_status check_desc(const sk_quantize_desc *d, sk_quantize_problem *q) {
    if (d == NULL) return sk_error(SK_STATUS_BAD_PARAM_NULL_POINTER, "desc must not be NULL");
    SK_TRY(sk_check_desc_struct_size(d->struct_size, sizeof(sk_quantize_desc), "desc",
                                     "sk_quantize_desc_init"));
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
    sk_resolve_strides(d->x_strides, d->seq, d->heads, d->head_dim, q->x_stride);
    return SK_STATUS_SUCCESS;
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
    /* CUDA reads x in 16-byte vectors of one row. */
    SK_TRY(sk_check_alignment(x, &tx, 2, cuda ? 16 : 2, cuda ? 16 : 0, "x"));
    SK_TRY(sk_check_alignment(descale, NULL, 4, 4, 0, "descale"));
    if (cuda) SK_TRY(sk_check_alignment(y, NULL, 1, 8, 0, "y"));
    const sk_buffer buffers[3] = {{"y", y, y_bytes, 1},
                                  {"descale", descale, q.batch * q.heads * 4, 1},
                                  {"x", x, x_bytes, 0}};
    SK_TRY(sk_check_no_alias(buffers, 3));
    if (q.backend == SK_BACKEND_CPU) {
        sk_cpu_quantize_e4m3(x, q.dtype, q.batch, q.seq, q.heads, q.head_dim, q.x_stride, y,
                             descale);
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
