/*
 * fp8_vt.h - the V^T layout of the Hopper FP8 kernel (sparsek.h,
 * SK_QUANT_LAYOUT_VT_FP8 / SK_V_LAYOUT_VT_FP8), shared by the CPU
 * quantizer and reference and the CUDA quantizer (host and device code),
 * so that every writer and reader uses one definition of the key order.
 *
 * Row (b, h, d) holds S_pad = round_up(S, 128) bytes; inside each 32-key
 * chunk, key k = 16 k4 + 8 k3 + 2 k12 + k0 sits at column 16 k4 + 4 k12 +
 * 2 k3 + k0: the A-fragment position at which the kernel's P registers
 * hold that key (fwd_sm90_fp8_consumer.cuh, sk98_pack_p), so the TMA box
 * of 128 columns is the P V operand as it is.
 */
#ifndef SK_CORE_FP8_VT_H
#define SK_CORE_FP8_VT_H

#include <stdint.h>

#ifdef __CUDACC__
#define SK_VT_FN static inline __host__ __device__
#else
#define SK_VT_FN static inline
#endif

/* Keys per row of the layout: S rounded up to the kernel's 128-key block. */
SK_VT_FN int64_t sk_vt_seq_pad(int64_t seq) { return (seq + 127) / 128 * 128; }

/* The column of key s (a bit permutation inside its 32-key chunk). */
SK_VT_FN int64_t sk_vt_col(int64_t s) {
    const int64_t k = s & 31;
    return (s - k) + (k & 16) + 4 * ((k >> 1) & 3) + 2 * ((k >> 3) & 1) + (k & 1);
}

/* The key at column c (the inverse of sk_vt_col). */
SK_VT_FN int64_t sk_vt_key(int64_t c) {
    const int64_t k = c & 31;
    return (c - k) + (k & 16) + 8 * ((k >> 1) & 1) + 2 * ((k >> 2) & 3) + (k & 1);
}

#endif /* SK_CORE_FP8_VT_H */
