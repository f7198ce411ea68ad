/*
 * test_attention_varlen_emu.c - the GPU varlen suite's checker, run on the
 * CPU against an emulation of the portable CUDA kernel's arithmetic
 * (src/cuda/attention/fwd_sm80_mainloop.cuh in varlen mode): a correct
 * kernel must pass it. The emulation visits what the kernel visits (the
 * plan's visiting rule, 64-key chunks of each visited block, keys past
 * len_k zero-filled), reads every key of a chunk, masks the invisible ones
 * to P = 0 yet still multiplies their V (0 x NaN = NaN, as the tensor
 * cores do), keeps the lazily moved base-2 reference max, sums l over the
 * fp32 P and rounds P to the dtype before P V. Cases use
 * vc_case.kernel_rules, as the GPU suite does (varlen_case.h): NaN only in
 * key blocks no tile visits, and the tolerance term of P's rounding.
 *
 * Why it exists: the first GPU run of the varlen suite failed on correct
 * results (NaN in masked keys of visited blocks, and P's rounding outside
 * the CPU backend's tolerance); this check reproduces both on the CPU with
 * the CPU rules (kernel_rules = 0).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/harness.h"
#include "common/test_util.h"
#include "common/varlen_case.h"

enum { EMU_CHUNK = 64, EMU_MAXD = 128 };

/* The kernel's P: fp32, rounded to the dtype for the P V product. */
static float emu_round(sk_dtype dtype, float x) {
    return dtype == SK_DTYPE_BF16 ? tu_bf16_to_f32(tu_f32_to_bf16(x))
                                  : tu_f16_to_f32(tu_f32_to_f16(x));
}

/* The layout head slice of query head h (sparsek.h's rule). */
static int64_t emu_slice(const vc_case *c, int64_t h) {
    if (c->layout_heads == c->heads_q) return h;
    if (c->layout_heads == 1) return 0;
    return h / (c->heads_q / c->heads_kv);
}

/* One query row (token t = q0 + q, head h) of sequence b as the kernel
 * computes it, into x->o and x->lse. */
static void emu_row(const vc_case *c, vc_data *x, int32_t b, int64_t h, int64_t q) {
    const int64_t D = c->head_dim, group = c->heads_q / c->heads_kv, hk = h / group;
    const int64_t lq = c->len_q[b], lk = c->len_k[b], i = q / c->bq, t = x->cu_q[b] + q;
    const float scale = c->scale != 0.0f ? c->scale : 1.0f / sqrtf((float)D);
    const float c2 = fabsf(scale) * 1.4426950408889634f;
    const int64_t last = (i + 1) * c->bq < lq ? (i + 1) * c->bq : lq;
    const int64_t kmax = last - 1 + lk - lq;                                  /* the tile's */
    const int64_t lim = c->causal && q + lk - lq < lk ? q + lk - lq : lk - 1; /* the row's */
    float qv[EMU_MAXD], o[EMU_MAXD], ms = -INFINITY, l = 0.0f;
    for (int64_t d = 0; d < D; ++d) {
        const float v = tu_load(x->q, c->dtype, t * x->ts_q + h * x->hs + d);
        qv[d] = scale < 0.0f ? -v : v; /* Q negated exactly, the scale made positive */
        o[d] = 0.0f;
    }
    const int64_t g = emu_slice(c, h) * x->R + x->row_start[b] + i;
    for (int32_t e = x->layout.row_offsets[g]; e < x->layout.row_offsets[g + 1]; ++e) {
        const int64_t j = x->layout.col_indices[e];
        if (j < 0 || j >= x->nbk[b] || (c->causal && j * c->bk > kmax)) continue;
        for (int64_t kb = j * c->bk; kb < (j + 1) * c->bk; kb += EMU_CHUNK) {
            if (kb >= lk || (c->causal && kb > kmax)) break; /* chunk never loaded */
            float s[EMU_CHUNK], xmax = -INFINITY;
            for (int64_t k = 0; k < EMU_CHUNK; ++k) {
                const int64_t key = kb + k;
                float dot = 0.0f; /* zero-filled past len_k */
                for (int64_t d = 0; d < D && key < lk; ++d)
                    dot += qv[d] *
                           tu_load(x->k, c->dtype, (x->cu_k[b] + key) * x->ts_k + hk * x->hs + d);
                s[k] = key > lim ? -INFINITY : dot;
                xmax = fmaxf(xmax, s[k]);
            }
            const float xs = xmax * c2;
            if (xs > ms + 8.0f) { /* the reference max moves: rescale */
                const float alpha = exp2f(ms - xs);
                l *= alpha;
                for (int64_t d = 0; d < D; ++d) o[d] *= alpha;
                ms = xs;
            }
            const float off = ms == -INFINITY ? 0.0f : ms;
            for (int64_t k = 0; k < EMU_CHUNK; ++k) {
                const float p = exp2f(fmaf(s[k], c2, -off));
                l += p;
                const float pr = emu_round(c->dtype, p);
                const int64_t key = kb + k;
                for (int64_t d = 0; d < D; ++d)
                    o[d] += pr * (key < lk ? tu_load(x->v, c->dtype,
                                                     (x->cu_k[b] + key) * x->ts_k + hk * x->hs + d)
                                           : 0.0f);
            }
        }
    }
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    for (int64_t d = 0; d < D; ++d)
        tu_store(x->o, c->dtype, t * x->ts_q + h * x->hs + d, o[d] * inv);
    if (c->with_lse)
        x->lse[h * x->total_q + t] = l > 0.0f ? ms * 0.6931471805599453f + logf(l) : -INFINITY;
}

/* A case the CUDA kernels take (as the GPU suite's random cases). */
static vc_case emu_case(tu_rng *rng) {
    vc_case c = vc_random_case(rng, 5, 300, 500);
    c.dtype = tu_rng_range(rng, 0, 1) ? SK_DTYPE_BF16 : SK_DTYPE_F16;
    c.head_dim = tu_rng_range(rng, 0, 1) ? 128 : 64;
    c.padded = c.padded ? 2 : 0;
    c.kernel_rules = 1;
    if (tu_rng_range(rng, 0, 2) == 0) {
        c.causal = 1;
        c.window_blocks = (int32_t)tu_rng_range(rng, 1, 3);
        c.sink_blocks = (int32_t)tu_rng_range(rng, 0, 1);
    }
    return c;
}

SK_TEST(varlen_gpu_checker_passes_kernel_emulation) {
    int failed = 0, cases = 0;
    int64_t empty = 0;
    for (int n = 0; n < 24; ++n) {
        const uint64_t seed = tu_base_seed() ^ (0x656d756c61746full + (uint64_t)n * 0x9e3779b9ull);
        tu_rng rng;
        tu_rng_seed(&rng, seed);
        const vc_case c = emu_case(&rng);
        char label[512];
        vc_label(&c, seed, label, sizeof label);
        vc_data x;
        if (!vc_make(&c, &rng, &x)) {
            CHECK(0, "%s out of memory", label);
            vc_data_free(&x);
            continue;
        }
        for (int32_t b = 0; b < c.batch; ++b)
            for (int64_t h = 0; h < c.heads_q; ++h)
                for (int64_t q = 0; q < c.len_q[b]; ++q) emu_row(&c, &x, b, h, q);
        vc_outcome out;
        memset(&out, 0, sizeof out);
        failed += vc_compare_reference(&c, &x, label, &out) != 0;
        empty += out.empty_rows;
        ++cases;
        vc_data_free(&x);
    }
    printf("    %d emulated cases, %d failed, %lld empty rows\n", cases, failed, (long long)empty);
    CHECK(failed == 0, "%d emulated kernel runs failed the GPU suite's checker", failed);
    CHECK(empty > 0, "no case had an empty row (the 0 x NaN case is not exercised)");
}
