/*
 * check.c - argument checks shared by the entry points (see check.h).
 */
#include "core/check.h"

#include <string.h>

#include "core/internal.h"

size_t sk_dtype_size(sk_dtype dtype) {
    switch (dtype) {
    case SK_DTYPE_F16:
    case SK_DTYPE_BF16:
        return 2;
    case SK_DTYPE_F32:
        return 4;
    case SK_DTYPE_E4M3:
        return 1;
    }
    return 0;
}

const char *sk_dtype_name(sk_dtype dtype) {
    switch (dtype) {
    case SK_DTYPE_F16:
        return "F16";
    case SK_DTYPE_BF16:
        return "BF16";
    case SK_DTYPE_F32:
        return "F32";
    case SK_DTYPE_E4M3:
        return "E4M3";
    }
    return "unknown";
}

const char *sk_backend_name(sk_backend backend) {
    switch (backend) {
    case SK_BACKEND_CPU:
        return "CPU";
    case SK_BACKEND_CUDA:
        return "CUDA";
    case SK_BACKEND_CUDA_SM80:
        return "CUDA_SM80";
    case SK_BACKEND_CUDA_SM90:
        return "CUDA_SM90";
    }
    return "unknown";
}

int sk_backend_is_cuda(sk_backend backend) {
    return backend == SK_BACKEND_CUDA || backend == SK_BACKEND_CUDA_SM80 ||
           backend == SK_BACKEND_CUDA_SM90;
}

sk_status sk_check_backend(sk_backend backend, const char *what) {
    if (backend != SK_BACKEND_CPU && !sk_backend_is_cuda(backend))
        return sk_error(SK_STATUS_BAD_PARAM_VALUE,
                        "%s = %d is not an sk_backend (CPU=1, CUDA=2, CUDA_SM80=3, CUDA_SM90=4)",
                        what, (int)backend);
    return SK_STATUS_SUCCESS;
}

sk_status sk_check_init_struct_size(size_t struct_size, size_t want, const char *type) {
    if (struct_size != want)
        return sk_error(SK_STATUS_BAD_PARAM_STRUCT_SIZE,
                        "struct_size = %zu, but this library's %s has %zu bytes", struct_size,
                        type, want);
    return SK_STATUS_SUCCESS;
}

sk_status sk_check_desc_struct_size(size_t struct_size, size_t want, const char *what,
                                    const char *init) {
    if (struct_size != want)
        return sk_error(SK_STATUS_BAD_PARAM_STRUCT_SIZE,
                        "%s->struct_size = %zu, expected %zu: initialise the descriptor with %s",
                        what, struct_size, want, init);
    return SK_STATUS_SUCCESS;
}

sk_status sk_check_attention_shape(sk_backend backend, sk_dtype dtype, const int64_t sizes[6]) {
    static const char *const names[6] = {"batch",   "seq_q",    "seq_k",
                                         "heads_q", "heads_kv", "head_dim"};
    return sk_check_attention_shape_named(backend, dtype, sizes, names);
}

sk_status sk_check_attention_shape_named(sk_backend backend, sk_dtype dtype, const int64_t sizes[6],
                                         const char *const names[6]) {
    SK_TRY(sk_check_backend(backend, "desc->backend"));
    if (sk_dtype_size(dtype) == 0)
        return sk_error(SK_STATUS_BAD_PARAM_DTYPE, "desc->dtype = %d is not an sk_dtype",
                        (int)dtype);
    /* FP8 is the fixed-batch forward's alone, which checks it before this
     * (sk_attention_check_fp8 in attention.c) and passes O's dtype here. */
    if (dtype == SK_DTYPE_E4M3)
        return sk_error(SK_STATUS_BAD_PARAM_DTYPE,
                        "desc->dtype = E4M3 is taken by the attention forward (sk_attention_*) "
                        "only; this call takes F16 or BF16 (F32 on the CPU)");
    if (dtype == SK_DTYPE_F32 && backend != SK_BACKEND_CPU)
        return sk_error(SK_STATUS_BAD_PARAM_DTYPE,
                        "desc->dtype = F32 is for the CPU backend only; the %s backend takes F16 "
                        "or BF16",
                        sk_backend_name(backend));
    for (int i = 0; i < 6; ++i)
        if (sizes[i] < 1)
            return sk_error(SK_STATUS_BAD_PARAM_SHAPE, "desc->%s = %lld must be >= 1", names[i],
                            (long long)sizes[i]);
    const int64_t batch = sizes[0], heads_q = sizes[3], heads_kv = sizes[4];
    if (heads_q % heads_kv != 0)
        return sk_error(SK_STATUS_BAD_PARAM_SHAPE,
                        "desc->heads_q = %lld is not a multiple of desc->heads_kv = %lld",
                        (long long)heads_q, (long long)heads_kv);
    if (heads_q > INT32_MAX || batch > INT32_MAX)
        return sk_error(SK_STATUS_BAD_PARAM_OVERFLOW,
                        "desc->batch = %lld and desc->heads_q = %lld must fit int32",
                        (long long)batch, (long long)heads_q);
    return SK_STATUS_SUCCESS;
}

void sk_resolve_strides(const int64_t in[3], int64_t seq, int64_t heads, int64_t dim,
                        int64_t out[3]) {
    if (in[0] == 0 && in[1] == 0 && in[2] == 0) {
        out[2] = dim;
        out[1] = heads * dim;
        out[0] = seq * heads * dim;
    } else {
        memcpy(out, in, 3 * sizeof(int64_t));
    }
}

void sk_tensor_shape_init(sk_tensor_shape *t, int64_t b, int64_t s, int64_t h, int64_t dim,
                          const int64_t stride[3]) {
    t->extent[0] = b;
    t->extent[1] = s;
    t->extent[2] = h;
    memcpy(t->stride, stride, 3 * sizeof(int64_t));
    t->inner = dim;
}

static const char *const axis_names[3] = {"batch", "seq", "head"};

sk_status sk_check_tensor_extent(const sk_tensor_shape *t, size_t elem_size, const char *what,
                                 int64_t *span_bytes) {
    /* span = 1 + sum (extent - 1) * stride + (inner - 1), all overflow-checked. */
    int64_t span = t->inner;
    for (int a = 0; a < 3; ++a) {
        if (t->stride[a] < 0)
            return sk_error(SK_STATUS_BAD_PARAM_STRIDE, "%s stride over %s = %lld is negative", what,
                            axis_names[a], (long long)t->stride[a]);
        int64_t reach;
        if (!sk_mul_i64(t->extent[a] - 1, t->stride[a], &reach) || !sk_add_i64(span, reach, &span))
            return sk_error(SK_STATUS_BAD_PARAM_OVERFLOW,
                            "%s: extent %lld x stride %lld over %s overflows int64", what,
                            (long long)t->extent[a], (long long)t->stride[a], axis_names[a]);
    }
    if (!sk_mul_i64(span, (int64_t)elem_size, span_bytes))
        return sk_error(SK_STATUS_BAD_PARAM_OVERFLOW,
                        "%s: the byte span (%lld elements of %zu bytes) overflows int64", what,
                        (long long)span, elem_size);
    return SK_STATUS_SUCCESS;
}

sk_status sk_check_no_self_overlap(const sk_tensor_shape *t, const char *what) {
    /* Sort the axes with extent > 1 by stride; each must step past the whole
     * span of the axes below it, starting with the contiguous inner axis. */
    int order[3], n = 0;
    for (int a = 0; a < 3; ++a)
        if (t->extent[a] > 1) order[n++] = a;
    for (int i = 1; i < n; ++i)
        for (int j = i; j > 0 && t->stride[order[j]] < t->stride[order[j - 1]]; --j) {
            int tmp = order[j];
            order[j] = order[j - 1];
            order[j - 1] = tmp;
        }
    int64_t covered = t->inner; /* elements spanned by the axes handled so far */
    for (int i = 0; i < n; ++i) {
        int a = order[i];
        if (t->stride[a] < covered)
            return sk_error(SK_STATUS_BAD_PARAM_STRIDE,
                            "%s stride over %s = %lld makes elements overlap (needs >= %lld)", what,
                            axis_names[a], (long long)t->stride[a], (long long)covered);
        /* Saturate: no later axis can step past more than int64 holds. */
        if (!sk_mul_i64(t->stride[a], t->extent[a], &covered)) covered = INT64_MAX;
    }
    return SK_STATUS_SUCCESS;
}

sk_status sk_check_alignment(const void *ptr, const sk_tensor_shape *t, size_t elem_size,
                             size_t align, size_t stride_align, const char *what) {
    if ((uintptr_t)ptr % align != 0)
        return sk_error(SK_STATUS_BAD_PARAM_ALIGNMENT, "%s = %p is not %zu-byte aligned", what, ptr,
                        align);
    if (stride_align == 0 || t == NULL) return SK_STATUS_SUCCESS;
    for (int a = 0; a < 3; ++a) {
        if (t->extent[a] <= 1) continue; /* an axis of one element is never stepped */
        if (((uint64_t)t->stride[a] * elem_size) % stride_align != 0)
            return sk_error(SK_STATUS_BAD_PARAM_ALIGNMENT,
                            "%s stride over %s = %lld elements is not a multiple of %zu bytes",
                            what, axis_names[a], (long long)t->stride[a], stride_align);
    }
    return SK_STATUS_SUCCESS;
}

/* [a, a + a_bytes) and [b, b + b_bytes) share a byte; written without
 * a + bytes, which could wrap past the top of the address space. */
static int ranges_overlap(uintptr_t a, uint64_t a_bytes, uintptr_t b, uint64_t b_bytes) {
    if (a_bytes == 0 || b_bytes == 0) return 0;
    return a >= b ? (uint64_t)(a - b) < b_bytes : (uint64_t)(b - a) < a_bytes;
}

/* One pair of the aliasing rule: fine unless one is written and they share a
 * byte (absent and empty buffers never do). */
static sk_status check_pair(const sk_buffer *x, const sk_buffer *y) {
    if (x->ptr == NULL || y->ptr == NULL || x->bytes <= 0 || y->bytes <= 0)
        return SK_STATUS_SUCCESS;
    if (!x->written && !y->written) return SK_STATUS_SUCCESS;
    if (!ranges_overlap((uintptr_t)x->ptr, (uint64_t)x->bytes, (uintptr_t)y->ptr,
                        (uint64_t)y->bytes))
        return SK_STATUS_SUCCESS;
    return sk_error(SK_STATUS_BAD_PARAM_STRIDE,
                    "%s overlaps %s in memory (a buffer the call writes must not share a byte "
                    "with any other argument)",
                    x->what, y->what);
}

sk_status sk_check_no_alias(const sk_buffer *buffers, int count) {
    for (int i = 0; i < count; ++i)
        for (int j = i + 1; j < count; ++j) SK_TRY(check_pair(&buffers[i], &buffers[j]));
    return SK_STATUS_SUCCESS;
}

void sk_layout_array_buffers(sk_buffer out[2], const char *offsets_name, const char *indices_name,
                             const int32_t *row_offsets, int64_t rows, const int32_t *col_indices,
                             int64_t nnz, int written) {
    /* rows < 2^31 (sk_grid_check) and nnz <= INT32_MAX: the bytes fit. */
    out[0].what = offsets_name;
    out[0].ptr = row_offsets;
    out[0].bytes = (rows + 1) * 4;
    out[0].written = written;
    out[1].what = indices_name;
    out[1].ptr = col_indices;
    out[1].bytes = nnz * 4;
    out[1].written = written;
}

sk_status sk_check_workspace_apart(const void *workspace, size_t workspace_size, size_t size_bytes,
                                   const sk_buffer *buffers, int count) {
    size_t bytes = workspace_size < size_bytes ? workspace_size : size_bytes;
    if (bytes > (size_t)INT64_MAX) bytes = (size_t)INT64_MAX; /* no range is longer */
    const sk_buffer ws = {"workspace", workspace, (int64_t)bytes, 1};
    for (int i = 0; i < count; ++i) SK_TRY(check_pair(&ws, &buffers[i]));
    return SK_STATUS_SUCCESS;
}
