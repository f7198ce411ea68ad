/*
 * attention_fp8_ref.c - the CPU reference of the FP8 (e4m3) forward: the
 * attention of the real inputs descale x code, computed by the ordinary
 * reference (attention_ref.c) in fp32 / fp64 from them.
 *
 * Q, K and V are decoded exactly and multiplied by their (batch, head)
 * descale in fp32 (one rounding, as the definition in sparsek.h), into
 * packed fp32 copies (V from either layout); the reference then runs on those with O rounded once
 * to out_dtype and written through the caller's strides, LSE as usual.
 */
#include <stdlib.h>

#include "core/fp8_vt.h"
#include "core/internal.h"
#include "cpu/cpu_backend.h"
#include "cpu/fp8.h"

/* [B, S, H, D] e4m3 codes with element strides st -> packed fp32 x descale. */
static void dequantize(float *dst, const uint8_t *src, const int64_t st[3], int64_t batch,
                       int64_t seq, int64_t heads, int64_t dim, const float *descale) {
#pragma omp parallel for schedule(static)
    for (int64_t bs = 0; bs < batch * seq; ++bs) {
        const int64_t b = bs / seq, s = bs % seq;
        for (int64_t h = 0; h < heads; ++h) {
            const float f = descale != NULL ? descale[b * heads + h] : 1.0f;
            const uint8_t *row = src + b * st[0] + s * st[1] + h * st[2];
            float *out = dst + (bs * heads + h) * dim;
            for (int64_t d = 0; d < dim; ++d) out[d] = f * sk_e4m3_to_f32(row[d]);
        }
    }
}

/* V^T (SK_V_LAYOUT_VT_FP8, core/fp8_vt.h) -> packed fp32 [B, Sk, Hkv, D]
 * x descale: the same values as `dequantize` on the rows layout of the same
 * codes. Only keys below Sk are read. */
static void dequantize_vt(float *dst, const uint8_t *src, int64_t batch, int64_t seq,
                          int64_t heads, int64_t dim, const float *descale) {
    const int64_t pad = sk_vt_seq_pad(seq);
#pragma omp parallel for schedule(static)
    for (int64_t bh = 0; bh < batch * heads; ++bh) {
        const int64_t b = bh / heads, h = bh % heads;
        const float f = descale != NULL ? descale[bh] : 1.0f;
        for (int64_t d = 0; d < dim; ++d) {
            const uint8_t *row = src + (bh * dim + d) * pad;
            for (int64_t s = 0; s < seq; ++s)
                dst[((b * seq + s) * heads + h) * dim + d] = f * sk_e4m3_to_f32(row[sk_vt_col(s)]);
        }
    }
}

static void packed_strides(int64_t seq, int64_t heads, int64_t dim, int64_t out[3]) {
    out[2] = dim;
    out[1] = heads * dim;
    out[0] = seq * heads * dim;
}

sk_status sk_cpu_attention_fp8_run(const sk_attention_problem *p) {
    /* The element counts fit int64 (the core checked the byte counts); the
     * fp32 copies' bytes are checked against size_t here. */
    const int64_t nq = p->batch * p->seq_q * p->heads_q * p->head_dim;
    const int64_t nk = p->batch * p->seq_k * p->heads_kv * p->head_dim;
    float *q = NULL, *k = NULL, *v = NULL;
    if ((uint64_t)nq <= SIZE_MAX / 4 && (uint64_t)nk <= SIZE_MAX / 4) {
        q = (float *)malloc((size_t)nq * 4);
        k = (float *)malloc((size_t)nk * 4);
        v = (float *)malloc((size_t)nk * 4);
    }
    if (q == NULL || k == NULL || v == NULL) {
        free(q);
        free(k);
        free(v);
        return sk_error(SK_STATUS_ALLOC_FAILED,
                        "the CPU backend could not allocate the fp32 copies of the E4M3 inputs "
                        "(%lld + 2 x %lld floats)",
                        (long long)nq, (long long)nk);
    }
    dequantize(q, (const uint8_t *)p->q, p->q_stride, p->batch, p->seq_q, p->heads_q,
               p->head_dim, p->q_descale);
    dequantize(k, (const uint8_t *)p->k, p->k_stride, p->batch, p->seq_k, p->heads_kv,
               p->head_dim, p->k_descale);
    if (p->v_layout == SK_V_LAYOUT_VT_FP8)
        dequantize_vt(v, (const uint8_t *)p->v, p->batch, p->seq_k, p->heads_kv, p->head_dim,
                      p->v_descale);
    else
        dequantize(v, (const uint8_t *)p->v, p->v_stride, p->batch, p->seq_k, p->heads_kv,
                   p->head_dim, p->v_descale);

    sk_attention_problem f = *p;
    f.dtype = SK_DTYPE_F32; /* inputs; O stays in out_dtype */
    f.q_descale = f.k_descale = f.v_descale = NULL;
    f.v_layout = SK_V_LAYOUT_ROWS; /* the fp32 copy */
    f.q = q;
    f.k = k;
    f.v = v;
    packed_strides(p->seq_q, p->heads_q, p->head_dim, f.q_stride);
    packed_strides(p->seq_k, p->heads_kv, p->head_dim, f.k_stride);
    packed_strides(p->seq_k, p->heads_kv, p->head_dim, f.v_stride);
    const sk_status st = sk_cpu_attention_run(&f);
    free(q);
    free(k);
    free(v);
    return st;
}
