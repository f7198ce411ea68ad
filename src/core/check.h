/*
 * check.h - argument checks shared by the attention and GEMM entry points:
 * enums, strided-tensor extents, alignment, output overlap, layout geometry.
 * Each check records its own message (naming `what`) and returns a status.
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

/* Strides >= 0 and the largest element offset + 1 fits int64; the span (in
 * elements) is stored in *span_elems. */
sk_status sk_check_tensor_extent(const sk_tensor_shape *t, const char *what, int64_t *span_elems);

/* No two elements of an output share memory. */
sk_status sk_check_no_self_overlap(const sk_tensor_shape *t, const char *what);

/* Pointer aligned to `align` bytes, and every outer stride * elem_size a
 * multiple of `stride_align` bytes (skipped when stride_align is 0). */
sk_status sk_check_alignment(const void *ptr, const sk_tensor_shape *t, size_t elem_size,
                             size_t align, size_t stride_align, const char *what);

/* The byte ranges [a, a + a_bytes) and [b, b + b_bytes) are disjoint. */
sk_status sk_check_disjoint(const void *a, int64_t a_bytes, const char *a_what, const void *b,
                            int64_t b_bytes, const char *b_what);

#endif /* SK_CORE_CHECK_H */
