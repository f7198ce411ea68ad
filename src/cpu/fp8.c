/*
 * fp8.c - the CPU backend's e4m3fn codec and the per-head quantization
 * (see fp8.h for the format and the rounding rule).
 */
#include "cpu/fp8.h"

#include <math.h>

#include "core/fp8_vt.h"
#include "cpu/half.h"

float sk_e4m3_to_f32(uint8_t x) {
    const int e = (x >> 3) & 15, m = x & 7;
    float v;
    if (e == 15 && m == 7)
        v = NAN;
    else if (e == 0)
        v = ldexpf((float)m, -9); /* subnormal: m/8 x 2^-6 */
    else
        v = ldexpf((float)(8 + m), e - 10); /* (1 + m/8) x 2^(e - 7) */
    return (x & 0x80) ? -v : v;
}

uint8_t sk_f32_to_e4m3(float f) {
    const uint8_t sign = signbit(f) ? 0x80 : 0;
    if (isnan(f)) return sign | 0x7F;
    const float a = fabsf(f);
    /* Past 448 RNE would go to 480, which e4m3fn lacks: saturate. */
    if (a >= 448.0f) return sign | 0x7E;
    if (a < 0x1p-6f) {
        /* Subnormal quantum 2^-9: the scaling is exact, rintf rounds to
         * even (the default mode); 8 is the smallest normal, code 0x08. */
        return sign | (uint8_t)rintf(a * 512.0f);
    }
    int e2;
    (void)frexpf(a, &e2); /* a = fr x 2^e2, fr in [0.5, 1): exponent E = e2 - 1 */
    int exp = e2 - 1;
    int m = (int)rintf(ldexpf(a, 3 - exp)); /* in [8, 16] */
    if (m == 16) {
        m = 8;
        ++exp;
    }
    /* a < 448 keeps (exp, m) below the NaN code (15, 15). */
    return sign | (uint8_t)(((exp + 7) << 3) | (m - 8));
}

void sk_cpu_quantize_e4m3(const void *x, sk_dtype dtype, int64_t batch, int64_t seq,
                          int64_t heads, int64_t dim, const int64_t xs[3], uint8_t *y,
                          float *descale, int32_t layout) {
    const int vt = layout == SK_QUANT_LAYOUT_VT_FP8;
    const int64_t pad = sk_vt_seq_pad(seq);
#pragma omp parallel for schedule(static)
    for (int64_t bh = 0; bh < batch * heads; ++bh) {
        const int64_t b = bh / heads, h = bh % heads;
        float amax = 0.0f;
        for (int64_t s = 0; s < seq; ++s)
            for (int64_t d = 0; d < dim; ++d) {
                const float v = sk_cpu_load1_f32(x, dtype, b * xs[0] + s * xs[1] + h * xs[2] + d);
                amax = fmaxf(amax, fabsf(v)); /* fmaxf skips NaN */
            }
        const int scaled = amax > 0.0f && isfinite(amax);
        const float inv = scaled ? 448.0f / amax : 1.0f;
        descale[bh] = scaled ? amax / 448.0f : 1.0f;
        for (int64_t s = 0; s < seq; ++s)
            for (int64_t d = 0; d < dim; ++d) {
                const float v = sk_cpu_load1_f32(x, dtype, b * xs[0] + s * xs[1] + h * xs[2] + d);
                const int64_t at = vt ? (bh * dim + d) * pad + sk_vt_col(s)
                                      : ((b * seq + s) * heads + h) * dim + d;
                y[at] = sk_f32_to_e4m3(v * inv);
            }
        if (vt) /* the keys past S: zero codes */
            for (int64_t d = 0; d < dim; ++d)
                for (int64_t s = seq; s < pad; ++s) y[(bh * dim + d) * pad + sk_vt_col(s)] = 0;
    }
}
