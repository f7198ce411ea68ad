/*
 * key_shape.h - inputs whose rows' maximum score grows along the keys: the
 * online softmax then moves its max late, by steps of a chosen size, or
 * once at the very end, and one key's product dominates its score (the
 * FP8 tensor cores then align small products to a large one; see
 * docs/perf/fp8.md, "The shaped-row LSE"). The FP8 cases (fp8_case.c)
 * apply it to their random Q and K before quantizing (the references see
 * the shaped values).
 */
#ifndef SK_TESTS_KEY_SHAPE_H
#define SK_TESTS_KEY_SHAPE_H

#include <stdint.h>

typedef enum {
    TU_SHAPE_NONE = 0,
    TU_SHAPE_RAMP,  /* K of key s times (1 + arg s / 128): the max rises by a little each block */
    TU_SHAPE_STEPS, /* Q[., 0] = 1; K[s, 0] = (s / 128) arg / sl at key 17 of each block of
                       128 and at the last key: block j's max is ~arg above block j - 1's, in
                       the base-2 units of the kernels (sl = |scale| log2 e) */
    TU_SHAPE_LAST   /* Q[., 0] = 1; K[last key, 0] = arg / sl: one late jump of ~arg */
} tu_shape;

/* Element (s, d) of Q (is_k = 0) or K (is_k = 1), random value x, after
 * shaping; S the sequence length (of K), scale the softmax scale. */
double tu_key_shape(tu_shape shape, double arg, double scale, int is_k, int64_t s, int64_t S,
                    int64_t d, double x);

#endif /* SK_TESTS_KEY_SHAPE_H */
