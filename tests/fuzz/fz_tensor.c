/*
 * fz_tensor.c - see fz_tensor.h.
 */
#include "fz_tensor.h"

#include <stdlib.h>
#include <string.h>

size_t fz_dtype_size(sk_dtype dtype) {
    if (dtype == SK_DTYPE_F16 || dtype == SK_DTYPE_BF16) return 2;
    if (dtype == SK_DTYPE_F32) return 4;
    return 0;
}

void fz_tensor_init(fz_tensor *t, int64_t b, int64_t s, int64_t h, int64_t d,
                    const int64_t strides[3], sk_dtype dtype) {
    memset(t, 0, sizeof *t);
    t->ext[0] = b;
    t->ext[1] = s;
    t->ext[2] = h;
    t->dim = d;
    t->dtype = dtype;
    t->es = fz_dtype_size(dtype);
    if (b < 1 || s < 1 || h < 1 || d < 1 || t->es == 0) return;
    if (__builtin_mul_overflow(b, s, &t->elems) || __builtin_mul_overflow(t->elems, h, &t->elems) ||
        __builtin_mul_overflow(t->elems, d, &t->elems))
        t->elems = INT64_MAX;
    if (strides[0] == 0 && strides[1] == 0 && strides[2] == 0) {
        /* Packed: d, h * d, s * h * d, each of which must exist. */
        t->st[2] = d;
        if (__builtin_mul_overflow(h, d, &t->st[1]) ||
            __builtin_mul_overflow(s, t->st[1], &t->st[0]))
            return;
    } else {
        memcpy(t->st, strides, sizeof t->st);
    }
    int64_t span = d;
    for (int a = 0; a < 3; ++a) {
        int64_t reach;
        if (t->st[a] < 0 || __builtin_mul_overflow(t->ext[a] - 1, t->st[a], &reach) ||
            __builtin_add_overflow(span, reach, &span))
            return;
    }
    if (__builtin_mul_overflow(span, (int64_t)t->es, &t->bytes)) return;
    t->span = span;
    t->span_ok = 1;
}

int64_t fz_tensor_at(const fz_tensor *t, int64_t b, int64_t s, int64_t h, int64_t e) {
    return b * t->st[0] + s * t->st[1] + h * t->st[2] + e;
}

int fz_tensor_small(const fz_tensor *t) {
    return t->span_ok && t->elems <= FZ_TENSOR_ELEMS_CAP;
}

void fz_tensor_fill(const fz_tensor *t, void *buf, tu_rng *rng, double mag) {
    memset(buf, 0xFF, (size_t)t->bytes);
    for (int64_t b = 0; b < t->ext[0]; ++b)
        for (int64_t s = 0; s < t->ext[1]; ++s)
            for (int64_t h = 0; h < t->ext[2]; ++h)
                for (int64_t e = 0; e < t->dim; ++e)
                    tu_store(buf, t->dtype, fz_tensor_at(t, b, s, h, e),
                             (float)(tu_rng_normal(rng) * mag));
}

void fz_tensor_mark(const fz_tensor *t, uint8_t *mask) {
    for (int64_t b = 0; b < t->ext[0]; ++b)
        for (int64_t s = 0; s < t->ext[1]; ++s)
            for (int64_t h = 0; h < t->ext[2]; ++h)
                memset(mask + fz_tensor_at(t, b, s, h, 0) * (int64_t)t->es, 1,
                       (size_t)t->dim * t->es);
}

int fz_tensor_self_overlap(const fz_tensor *t) {
    uint8_t *seen = (uint8_t *)calloc((size_t)t->span, 1);
    if (seen == NULL) return 0;
    int shared = 0;
    for (int64_t b = 0; b < t->ext[0] && !shared; ++b)
        for (int64_t s = 0; s < t->ext[1] && !shared; ++s)
            for (int64_t h = 0; h < t->ext[2] && !shared; ++h) {
                const int64_t at = fz_tensor_at(t, b, s, h, 0);
                for (int64_t e = 0; e < t->dim; ++e) shared |= seen[at + e]++ != 0;
            }
    free(seen);
    return shared;
}
