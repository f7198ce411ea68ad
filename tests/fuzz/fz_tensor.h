/*
 * fz_tensor.h - strided [B, S, H, D] tensors as sparsek.h documents them,
 * computed independently of src/: strides (all three 0 = packed), the byte
 * span from the first to one past the last element in exact arithmetic,
 * element offsets, value fills, and whether two elements share memory.
 */
#ifndef SK_FUZZ_TENSOR_H
#define SK_FUZZ_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "common/test_util.h"
#include "sparsek.h"

typedef struct fz_tensor {
    int64_t ext[3]; /* B, S, H */
    int64_t dim;    /* D, contiguous */
    int64_t st[3];  /* resolved element strides */
    sk_dtype dtype;
    size_t es;     /* element bytes; 0 for a dtype that is not an sk_dtype */
    int span_ok;   /* sizes >= 1, strides >= 0 and the byte span fits int64 */
    int64_t span;  /* elements from the first to one past the last */
    int64_t bytes; /* span * es */
    int64_t elems; /* B * S * H * D, INT64_MAX when that overflows */
} fz_tensor;

/* Tensors the harnesses fill, mark or search element by element. */
enum { FZ_TENSOR_ELEMS_CAP = 1 << 20 };

/* Bytes of a dtype; 0 when it is not one. */
size_t fz_dtype_size(sk_dtype dtype);

void fz_tensor_init(fz_tensor *t, int64_t b, int64_t s, int64_t h, int64_t d,
                    const int64_t strides[3], sk_dtype dtype);

/* Element index of (b, s, h, e). */
int64_t fz_tensor_at(const fz_tensor *t, int64_t b, int64_t s, int64_t h, int64_t e);

/* Every byte of the span 0xFF (NaN in each dtype, so a read of the padding
 * shows), then each element N(0, 1) * mag rounded to the dtype. */
void fz_tensor_fill(const fz_tensor *t, void *buf, tu_rng *rng, double mag);

/* 1 at each byte of an element, in mask[0 .. bytes). */
void fz_tensor_mark(const fz_tensor *t, uint8_t *mask);

/* Two elements share memory (the span must be small: a bitmap of it). */
int fz_tensor_self_overlap(const fz_tensor *t);

/* Its span is valid and it has at most FZ_TENSOR_ELEMS_CAP elements. */
int fz_tensor_small(const fz_tensor *t);

#endif /* SK_FUZZ_TENSOR_H */
