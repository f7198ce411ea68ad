/*
 * internal.h - error reporting and checked arithmetic shared by the host code.
 *
 * Every public entry point starts with SK_ENTER("sk_name"), which clears the
 * thread's last-error text and remembers the entry point's name; sk_error()
 * then records "sk_name: <message>" and returns the status, so a check reads
 *     if (x < 1) return sk_error(SK_STATUS_BAD_PARAM_SHAPE, "x = %lld must be >= 1", x);
 * Nothing here prints, exits or allocates.
 */
#ifndef SK_CORE_INTERNAL_H
#define SK_CORE_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "sparsek.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define SK_PRINTF_LIKE(f, a) __attribute__((format(printf, f, a)))
#else
#define SK_PRINTF_LIKE(f, a)
#endif

/* Clear the last error and name the entry point for later messages. */
void sk_enter(const char *api_name);
#define SK_ENTER(name) sk_enter(name)

/* Record "<api>: <message>" as this thread's last error; returns status. */
sk_status sk_error(sk_status status, const char *fmt, ...) SK_PRINTF_LIKE(2, 3);

#ifdef __cplusplus
}
#endif

/* Propagate a failure: the callee already recorded its message. */
#define SK_TRY(expr)                                                                               \
    do {                                                                                           \
        sk_status sk_try_status_ = (expr);                                                         \
        if (sk_try_status_ != SK_STATUS_SUCCESS) return sk_try_status_;                            \
    } while (0)

/* NULL check with the argument's name in the message. */
#define SK_CHECK_NOT_NULL(ptr)                                                                     \
    do {                                                                                           \
        if ((ptr) == NULL)                                                                         \
            return sk_error(SK_STATUS_BAD_PARAM_NULL_POINTER, "%s must not be NULL", #ptr);        \
    } while (0)

/* Checked int64 size arithmetic: the one family every size, count, extent
 * and byte span of the host code goes through (grid and layout checks,
 * descriptor checks, tensor extents). Operands are non-negative sizes; each
 * returns false, leaving *out untouched, when an operand is negative or the
 * exact result does not fit int64, so a caller turns that into
 * SK_STATUS_BAD_PARAM_OVERFLOW (or BAD_LAYOUT_OVERFLOW) naming the sizes. */
static inline bool sk_mul_i64(int64_t a, int64_t b, int64_t *out) {
    if (a < 0 || b < 0) return false;
    if (a != 0 && b > INT64_MAX / a) return false;
    *out = a * b;
    return true;
}
static inline bool sk_add_i64(int64_t a, int64_t b, int64_t *out) {
    if (a < 0 || b < 0) return false;
    if (b > INT64_MAX - a) return false;
    *out = a + b;
    return true;
}
/* The product of n >= 1 factors (e.g. B x S x H x D x bytes). */
static inline bool sk_product_i64(const int64_t *factors, int n, int64_t *out) {
    int64_t r = factors[0];
    if (r < 0) return false;
    for (int i = 1; i < n; ++i)
        if (!sk_mul_i64(r, factors[i], &r)) return false;
    *out = r;
    return true;
}
/* ceil(a / b) for a >= 0 and b >= 1. Never overflows, unlike (a + b - 1) / b,
 * which wraps for a within b - 1 of INT64_MAX. */
static inline int64_t sk_ceil_div_i64(int64_t a, int64_t b) {
    return a / b + (a % b != 0);
}

#endif /* SK_CORE_INTERNAL_H */
