/*
 * check.h - argument checks shared by the entry points: enums, strided-tensor
 * extents, alignment, and the aliasing rule (no buffer a call writes overlaps
 * any other buffer argument). Each check records its own message (naming
 * `what`) and returns a status.
 */
#ifndef SK_CORE_CHECK_H
#define SK_CORE_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include "sparsek.h"

/* Bytes per element of a valid dtype; 0 for an unknown one. */
size_t sk_dtype_size(sk_dtype dtype);
const char *sk_dtype_name(sk_dtype dtype);
const char *sk_backend_name(sk_backend backend);
int sk_backend_is_cuda(sk_backend backend);

sk_status sk_check_backend(sk_backend backend, const char *what);

/* The struct_size argument of an sk_*_desc_init (type: "sk_topk_desc"). */
sk_status sk_check_init_struct_size(size_t struct_size, size_t want, const char *type);
/* A descriptor's struct_size field, as its init function sets it
 * (what: "desc" or "attn"; init: "sk_topk_desc_init"). */
sk_status sk_check_desc_struct_size(size_t struct_size, size_t want, const char *what,
                                    const char *init);

/* The shape fields shared by the attention and top-k descriptors
 * ("desc->..." in messages): the backend, the dtype (F32 on the CPU only),
 * sizes[6] = {batch, seq_q, seq_k, heads_q, heads_kv, head_dim} each >= 1,
 * heads_q a multiple of heads_kv, batch and heads_q fitting int32. */
sk_status sk_check_attention_shape(sk_backend backend, sk_dtype dtype, const int64_t sizes[6]);
/* The same with the six sizes named by the caller (the varlen descriptor's
 * {"batch", "total_q", "total_k", "heads_q", "heads_kv", "head_dim"}). */
sk_status sk_check_attention_shape_named(sk_backend backend, sk_dtype dtype, const int64_t sizes[6],
                                         const char *const names[6]);

/* A strided 4-D tensor [n0, n1, n2, inner] whose inner axis is contiguous.
 * `stride` holds the element strides of the three outer axes. */
typedef struct sk_tensor_shape {
    int64_t extent[3];
    int64_t stride[3];
    int64_t inner;
} sk_tensor_shape;

/* Element strides of a [B, S, H, D] tensor: all three zero means packed. */
void sk_resolve_strides(const int64_t in[3], int64_t seq, int64_t heads, int64_t dim,
                        int64_t out[3]);

/* t = [b, s, h, dim] with the given outer strides. */
void sk_tensor_shape_init(sk_tensor_shape *t, int64_t b, int64_t s, int64_t h, int64_t dim,
                          const int64_t stride[3]);

/* Strides >= 0, and the byte span (largest element offset + 1, times
 * elem_size) fits int64; the span in bytes is stored in *span_bytes. Every
 * message names the tensor (`what`). */
sk_status sk_check_tensor_extent(const sk_tensor_shape *t, size_t elem_size, const char *what,
                                 int64_t *span_bytes);

/* No two elements of an output share memory. */
sk_status sk_check_no_self_overlap(const sk_tensor_shape *t, const char *what);

/* Pointer aligned to `align` bytes, and every outer stride * elem_size a
 * multiple of `stride_align` bytes (skipped when stride_align is 0). */
sk_status sk_check_alignment(const void *ptr, const sk_tensor_shape *t, size_t elem_size,
                             size_t align, size_t stride_align, const char *what);

/* One buffer argument of a call, for the aliasing rule. */
typedef struct sk_buffer {
    const char *what; /* as messages name it: "o", "layout->col_indices" */
    const void *ptr;  /* NULL: absent (skipped) */
    int64_t bytes;    /* the bytes the call may touch from ptr on; 0: skipped */
    int written;      /* != 0: the call writes it */
} sk_buffer;

/* The aliasing rule over a call's buffers: no written buffer overlaps any
 * other one (read or written); exactly adjacent ranges are fine. The ranges
 * are compared as addresses, so host and device pointers alike. The first
 * offending pair (in list order) is reported as "<first> overlaps <second>
 * in memory" with SK_STATUS_BAD_PARAM_STRIDE. */
sk_status sk_check_no_alias(const sk_buffer *buffers, int count);

/* A BSR layout's two arrays as buffers: `rows` + 1 offsets and `nnz`
 * indices of int32 (names as messages give them, e.g.
 * "a_layout->row_offsets"); `written` for a call that fills them. */
void sk_layout_array_buffers(sk_buffer out[2], const char *offsets_name, const char *indices_name,
                             const int32_t *row_offsets, int64_t rows, const int32_t *col_indices,
                             int64_t nnz, int written);

/* The CUDA workspace (written) against every buffer of a list that passed
 * sk_check_no_alias: a second step, because its size comes from the
 * backend (a build without CUDA cannot give it, and must still report the
 * other buffers' overlaps). It spans min(workspace_size, size_bytes), with
 * size_bytes what the entry point's *_workspace_size call gives: the
 * caller's buffer, as far as the call may use it. NULL or 0: nothing. */
sk_status sk_check_workspace_apart(const void *workspace, size_t workspace_size, size_t size_bytes,
                                   const sk_buffer *buffers, int count);

#endif /* SK_CORE_CHECK_H */
