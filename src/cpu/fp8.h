/*
 * fp8.h - the CPU backend's FP8 e4m3fn codec (SK_DTYPE_E4M3), and the
 * per-head quantization of sk_quantize_e4m3 (fp8.c).
 *
 * e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no inf; NaN =
 * S.1111.111 (0x7F, 0xFF); max 448 = 1.75 x 2^8; subnormals m x 2^-9.
 * Decoding is exact. Encoding rounds to nearest, ties to even, saturates
 * to +-448 (infinities too) and maps NaN to 0x7F with its sign bit: the
 * rule of PTX cvt.rn.satfinite.e4m3x2.f32 and of cuda_fp8.h with
 * __NV_SATFINITE, so that the CUDA quantizer gives the same bytes.
 */
#ifndef SK_CPU_FP8_H
#define SK_CPU_FP8_H

#include <stdint.h>

#include "core/problem.h"

float sk_e4m3_to_f32(uint8_t x);
uint8_t sk_f32_to_e4m3(float f);

/* The FP8 forward (attention_fp8_ref.c): dequantize Q, K, V with their
 * descales to packed fp32 (host scratch, allocated before anything is
 * written: SK_STATUS_ALLOC_FAILED), then the reference with O in
 * p->out_dtype written straight to p->o. */
sk_status sk_cpu_attention_fp8_run(const sk_attention_problem *p);

/* The per-(batch, head) quantization of sparsek.h's sk_quantize_e4m3. x has
 * `dtype` (F16 or BF16) elements, element strides xs over [B, S, H]; y is
 * packed [B, S, H, D] or, with layout SK_QUANT_LAYOUT_VT_FP8, the V^T of
 * core/fp8_vt.h (every byte written); descale [B, H]. */
void sk_cpu_quantize_e4m3(const void *x, sk_dtype dtype, int64_t batch, int64_t seq,
                          int64_t heads, int64_t dim, const int64_t xs[3], uint8_t *y,
                          float *descale, int32_t layout);

#endif /* SK_CPU_FP8_H */
