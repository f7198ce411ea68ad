/*
 * key_shape.c - the shaped inputs of key_shape.h.
 */
#include "common/key_shape.h"

#include <math.h>

double tu_key_shape(tu_shape shape, double arg, double scale, int is_k, int64_t s, int64_t S,
                    int64_t d, double x) {
    const double sl = fabs(scale) * 1.4426950408889634;
    switch (shape) {
    case TU_SHAPE_RAMP:
        return is_k ? x * (1.0 + arg * (double)s / 128.0) : x;
    case TU_SHAPE_STEPS:
        if (d != 0) return x;
        if (!is_k) return 1.0;
        return s % 128 == 17 || s == S - 1 ? (double)(s / 128) * arg / sl : x;
    case TU_SHAPE_LAST:
        if (d != 0) return x;
        if (!is_k) return 1.0;
        return s == S - 1 ? arg / sl : x;
    case TU_SHAPE_NONE:
        break;
    }
    return x;
}
