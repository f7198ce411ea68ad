/*
 * test_fp8.c - the FP8 (e4m3) inputs on the CPU backend: the decode of every
 * code through the public attention, the quantizer against the test's own
 * codec (every bf16 value in range, ties included), seeded attention cases
 * against the fp64 reference on the dequantized inputs (tests/common/
 * fp8_case.c), and every bad FP8 argument (status, message, nothing
 * written).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fp8_case.h"
#include "common/harness.h"
#include "common/key_shape.h"
#include "common/test_util.h"
#include "sparsek.h"

/* Attention over one key: O = descale x decode(V) exactly (each e4m3 value
 * is an fp16 value), so a D = 256 row of V holding every code shows the
 * library's decode of each. */
static void decode_through_attention(float v_descale, sk_dtype out) {
    enum { D = 256 };
    uint8_t q[D], k[D], v[D];
    uint16_t o[D];
    for (int i = 0; i < D; ++i) {
        q[i] = 0x38; /* 1.0 */
        k[i] = 0x00;
        v[i] = (uint8_t)i;
    }
    const int32_t offsets[2] = {0, 1}, cols[1] = {0};
    sk_bsr layout = {tu_grid(1, 1, 64, 64, 1, 1), 1, (int32_t *)offsets, (int32_t *)cols};
    sk_attention_desc d;
    REQUIRE(sk_attention_desc_init(&d, sizeof d) == SK_STATUS_SUCCESS, "%s", sk_last_error());
    d.backend = SK_BACKEND_CPU;
    d.dtype = SK_DTYPE_E4M3;
    d.out_dtype = out;
    d.batch = d.seq_q = d.seq_k = d.heads_q = d.heads_kv = 1;
    d.head_dim = D;
    const float vd[1] = {v_descale};
    d.v_descale = v_descale != 1.0f ? vd : NULL;
    float lse = NAN;
    REQUIRE(sk_attention_forward(&d, &layout, q, k, v, o, &lse, NULL, 0, NULL) ==
                SK_STATUS_SUCCESS,
            "%s", sk_last_error());
    CHECK(lse == 0.0f, "lse = %g, expected log(1) = 0", (double)lse);
    for (int i = 0; i < D; ++i) {
        const float want = v_descale * tu_e4m3_to_f32((uint8_t)i);
        const float got = tu_load(o, out, i);
        if (isnan(want))
            CHECK(isnan(got), "code 0x%02x: O = %g, expected NaN", i, (double)got);
        else
            CHECK(got == want, "code 0x%02x: O = %.9g, expected %.9g", i, (double)got,
                  (double)want);
    }
}

SK_TEST(fp8_decode_every_code) {
    /* The test's own decoder first, on the format's landmarks. */
    CHECK(tu_e4m3_to_f32(0x7E) == 448.0f && tu_e4m3_to_f32(0xFE) == -448.0f, "max");
    CHECK(tu_e4m3_to_f32(0x01) == 0x1p-9f && tu_e4m3_to_f32(0x07) == 7 * 0x1p-9f, "subnormals");
    CHECK(tu_e4m3_to_f32(0x08) == 0x1p-6f && tu_e4m3_to_f32(0x38) == 1.0f, "normals");
    CHECK(tu_e4m3_to_f32(0xB8) == -1.0f && tu_e4m3_to_f32(0x3F) == 1.875f, "sign, mantissa");
    CHECK(isnan(tu_e4m3_to_f32(0x7F)) && isnan(tu_e4m3_to_f32(0xFF)), "NaN codes");
    CHECK(tu_e4m3_to_f32(0x78) == 256.0f && !isnan(tu_e4m3_to_f32(0x7E)), "no inf, 0x78 = 256");
    decode_through_attention(1.0f, SK_DTYPE_F16);
    decode_through_attention(1.0f, SK_DTYPE_BF16); /* bf16 holds 3 mantissa bits too */
    decode_through_attention(0.5f, SK_DTYPE_F16);   /* descales are exact powers here */
}

/* sk_quantize_e4m3 on the CPU against the test's codec (a nearest-code
 * search) and its amax rule, bit for bit. */
static void quantize_case(sk_dtype dtype, int64_t B, int64_t S, int64_t H, int64_t D,
                          const float *vals, int padded) {
    const int64_t pad = padded ? 16 : 0;
    const int64_t st[3] = {(S + (padded ? 1 : 0)) * (H * (D + pad) + pad), H * (D + pad) + pad,
                           D + pad};
    const int64_t span = (B - 1) * st[0] + (S - 1) * st[1] + (H - 1) * st[2] + D;
    uint16_t *x = (uint16_t *)malloc((size_t)span * 2);
    uint8_t *y = (uint8_t *)malloc((size_t)(B * S * H * D));
    float *descale = (float *)malloc((size_t)(B * H) * sizeof(float));
    REQUIRE(x && y && descale, "out of memory");
    memset(x, 0xFF, (size_t)span * 2); /* NaN padding: must not count in amax */
    for (int64_t b = 0; b < B; ++b)
        for (int64_t s = 0; s < S; ++s)
            for (int64_t h = 0; h < H; ++h)
                for (int64_t d = 0; d < D; ++d)
                    tu_store(x, dtype, b * st[0] + s * st[1] + h * st[2] + d,
                             vals[((b * S + s) * H + h) * D + d]);
    sk_quantize_desc q;
    f8_quantize_desc(&q, SK_BACKEND_CPU, dtype, B, S, H, D, padded ? st : NULL);
    size_t ws = 1;
    CHECK(sk_quantize_e4m3_workspace_size(&q, &ws) == SK_STATUS_SUCCESS && ws == 0,
          "CPU workspace %zu", ws);
    REQUIRE(sk_quantize_e4m3(&q, x, y, descale, NULL, 0, NULL) == SK_STATUS_SUCCESS, "%s",
            sk_last_error());
    int64_t bad = 0;
    for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h) {
            float amax = 0.0f;
            for (int64_t s = 0; s < S; ++s)
                for (int64_t d = 0; d < D; ++d)
                    amax = fmaxf(amax, fabsf(tu_load(x, dtype, b * st[0] + s * st[1] + h * st[2] + d)));
            const int scaled = amax > 0.0f && isfinite(amax);
            const float inv = scaled ? 448.0f / amax : 1.0f;
            const float want_ds = scaled ? amax / 448.0f : 1.0f;
            CHECK(descale[b * H + h] == want_ds, "descale[%lld, %lld] = %g, expected %g",
                  (long long)b, (long long)h, (double)descale[b * H + h], (double)want_ds);
            for (int64_t s = 0; s < S; ++s)
                for (int64_t d = 0; d < D; ++d) {
                    const float v = tu_load(x, dtype, b * st[0] + s * st[1] + h * st[2] + d);
                    const uint8_t want = tu_f32_to_e4m3(scaled ? v * inv : v);
                    const uint8_t got = y[((b * S + s) * H + h) * D + d];
                    if (got != want && bad++ < 8)
                        CHECK(0, "y[%lld, %lld, %lld, %lld] = 0x%02x, expected 0x%02x (x = %.9g)",
                              (long long)b, (long long)s, (long long)h, (long long)d, got, want,
                              (double)v);
                }
        }
    CHECK(bad == 0, "%lld codes differ", (long long)bad);
    free(x);
    free(y);
    free(descale);
}

SK_TEST(fp8_quantize_cpu_every_bf16) {
    /* Every bf16 value in [-448, 448] plus 448 itself in each head, so the
     * scale is exactly 1 and each value meets the encoder as is: all the
     * rounding ties between e4m3 neighbours are bf16 values. */
    int64_t n = 0;
    const int64_t D = 64;
    float *vals = (float *)malloc((size_t)2 * 0x4400 * sizeof(float) + (size_t)D * 4);
    REQUIRE(vals != NULL, "out of memory");
    for (uint32_t h = 0; h < 0x8000; ++h) {
        const float f = tu_bf16_to_f32((uint16_t)h);
        if (!(f <= 448.0f)) continue;
        vals[n++] = f;
        vals[n++] = -f;
    }
    vals[n++] = 448.0f;
    while (n % D != 0) vals[n++] = 448.0f;
    quantize_case(SK_DTYPE_BF16, 1, n / D, 1, D, vals, 0);
    free(vals);
}

SK_TEST(fp8_quantize_cpu_scales_and_specials) {
    tu_rng rng;
    tu_rng_seed(&rng, tu_base_seed() ^ 0xF8A1);
    enum { B = 2, S = 37, H = 3, D = 24 };
    float vals[B * S * H * D];
    for (int i = 0; i < B * S * H * D; ++i) vals[i] = (float)(tu_rng_normal(&rng) * 3.0);
    /* (b=0, h=1): all zero (descale 1); (b=1, h=0): an inf (scale 1,
     * saturation), a NaN; (b=1, h=2): tiny values (subnormal codes). */
    for (int s = 0; s < S; ++s)
        for (int d = 0; d < D; ++d) {
            vals[((0 * S + s) * H + 1) * D + d] = 0.0f;
            vals[((1 * S + s) * H + 2) * D + d] *= 1e-6f;
        }
    vals[((1 * S + 3) * H + 0) * D + 5] = INFINITY;
    vals[((1 * S + 4) * H + 0) * D + 6] = NAN;
    quantize_case(SK_DTYPE_F16, B, S, H, D, vals, 1);
    quantize_case(SK_DTYPE_BF16, B, S, H, D, vals, 0);
}

/* One case on the CPU backend against the fp64 reference. */
static int64_t run_cpu_case(const f8_inst *x, int drop_v_descale) {
    sk_attention_desc d;
    f8_inst_desc(x, SK_BACKEND_CPU, &d, x->q_descale, x->k_descale,
                 drop_v_descale ? NULL : x->v_descale);
    void *o = malloc((size_t)x->o_alloc * 2);
    const int64_t rows = x->c.batch * x->c.heads_q * x->c.seq_q;
    float *lse = (float *)malloc((size_t)rows * sizeof(float));
    if (o == NULL || lse == NULL) {
        free(o);
        free(lse);
        CHECK(0, "out of memory");
        return -1;
    }
    memset(o, 0xFF, (size_t)x->o_alloc * 2);
    tu_fill_nan(lse, SK_DTYPE_F32, rows);
    const sk_status st = sk_attention_forward(&d, &x->layout, x->q8, x->k8, x->v8, o,
                                              x->c.with_lse ? lse : NULL, NULL, 0, NULL);
    int64_t bad = -1;
    CHECK(st == SK_STATUS_SUCCESS, "%s", sk_last_error());
    if (st == SK_STATUS_SUCCESS)
        bad = f8_inst_compare(x, o, x->c.with_lse ? lse : NULL,
                              drop_v_descale ? "cpu (v_descale dropped)" : "cpu",
                              !drop_v_descale, drop_v_descale ? 0 : 8);
    free(o);
    free(lse);
    return bad;
}

SK_TEST(fp8_cpu_reference_cases) {
    tu_rng rng;
    tu_rng_seed(&rng, tu_base_seed() ^ 0xF8C0);
    int failed = 0, run = 0;
    double yard = 0.0;
    for (int v = 0; v < 24; ++v) {
        f8_case c;
        f8_case_cpu_variant(&c, &rng, v);
        f8_inst x;
        REQUIRE(f8_inst_create(&x, &c) == 0, "out of memory");
        const int64_t bad = run_cpu_case(&x, 0);
        failed += bad != 0;
        ++run;
        yard += f8_inst_yard_total(&x);
        /* The comparison can fail: without V's descales the output is off. */
        if (c.with_descale && v < 8) {
            const int64_t wrong = run_cpu_case(&x, 1);
            CHECK(wrong > 0 || f8_inst_yard_total(&x) == 0.0,
                  "dropping v_descale went unnoticed (case %d)", v);
            if (wrong > 0) printf("    (case %d: the dropped v_descale was caught, as it must)\n", v);
        }
        f8_inst_destroy(&x);
    }
    CHECK(failed == 0, "%d of %d cases failed", failed, run);
    CHECK(yard > 0.0, "the FP8 yardstick is zero everywhere: the tolerance would be vacuous");
    printf("    %d cases, %d failed (seeded from the suite seed)\n", run, failed);
}

/* The tolerance rule against the naive FP8 kernel (f8_inst_model): it must
 * accept the kernel whose scores go through the modelled FP8 wgmma sum,
 * including the two cases a GPU failed on with an older rule, and reject
 * three broken variants. Case 0 is the H200 case (main 333df50, before the
 * rule had the accumulation yardstick), case 12 the H100 one (main bce1b87,
 * a shaped row, with the model whose products carried their own normalised
 * exponent), each rebuilt from its printed seed and fields; the model's LSE
 * there must be the GPU's (docs/perf/fp8.md, "Accumulation precision", "The
 * shaped-row LSE"). */
enum { kModelCases = 13, kH100Case = kModelCases - 1 };

static void model_case(f8_case *c, int v, tu_rng *rng) {
    memset(c, 0, sizeof *c);
    if (v == 0) { /* gpu_fp8_random, main 333df50, H200 */
        *c = (f8_case){.seed = 0x4a4002ef5dccd057ull, .batch = 3, .seq_q = 22, .seq_k = 38,
                       .heads_q = 16, .heads_kv = 2, .head_dim = 128, .block_q = 128,
                       .block_k = 128, .causal = 1, .layout_batch = 3, .layout_heads = 1,
                       .density = 0.7, .empty_rows = 1, .padded = 1, .with_lse = 1,
                       .with_descale = 1, .out_dtype = SK_DTYPE_F16, .amp = 4.0f};
        return;
    }
    if (v == kH100Case) { /* the shaped FP8 cases (gpu_fp8_shaped's first), bce1b87, H100 */
        *c = (f8_case){.seed = 0xf92f2902ull, .batch = 1, .seq_q = 256, .seq_k = 1000,
                       .heads_q = 2, .heads_kv = 1, .head_dim = 128, .block_q = 128,
                       .block_k = 128, .layout_batch = 1, .layout_heads = 1, .density = 1.0,
                       .with_lse = 1, .with_descale = 1, .out_dtype = SK_DTYPE_BF16,
                       .amp = 0.25f, .k_shape = TU_SHAPE_STEPS, .k_shape_arg = 2.4f};
        return;
    }
    c->seed = tu_rng_next(rng);
    c->batch = tu_rng_range(rng, 1, 2);
    c->heads_kv = tu_rng_range(rng, 1, 2);
    c->heads_q = c->heads_kv * (v % 2 ? 4 : 1);
    c->head_dim = v % 3 == 1 ? 64 : 128;
    c->block_q = c->block_k = 128;
    c->seq_q = tu_rng_range(rng, 1, 160);
    c->seq_k = tu_rng_range(rng, 1, 300);
    c->causal = v % 2;
    c->scale = v % 4 == 3 ? -0.08f : 0.0f;
    c->layout_batch = 1;
    c->layout_heads = 1;
    c->density = 0.7;
    c->with_lse = 1;
    c->with_descale = v % 5 != 4;
    c->out_dtype = v % 2 ? SK_DTYPE_F16 : SK_DTYPE_BF16;
    c->amp = c->with_descale ? (v % 3 ? 4.0f : 1.0f) : 0.7f;
}

/* The model's LSE of the GPU's failing row must be the GPU's value within
 * 4 fp32 ulps (the model is the naive row in fp64, the kernel's softmax is
 * fp32; the next candidate rules of fp8.md miss by 1e-3 or more), the rule without the
 * accumulation yardstick must reject the GPU's value (so the case is the
 * one that failed) and the rule with it must accept it. */
static void check_gpu_row(const char *gpu, const f8_inst *x, const float *lse, int64_t row,
                          double gpu_lse, double ref) {
    const double old_tol = x->lse_tol[row], new_tol = old_tol + 2.0 * x->lse_yard[row];
    printf("    %s: model %.7f (GPU %.7f), reference %.7f, |GPU - ref| %.3g, tolerance "
           "without the yardstick %.3g, with it %.3g\n",
           gpu, lse[row], gpu_lse, x->ref_lse[row], fabs(gpu_lse - ref), old_tol, new_tol);
    CHECK(fabs(lse[row] - gpu_lse) <= 0x1p-21 * fabs(gpu_lse) && fabs(x->ref_lse[row] - ref) < 1e-5,
          "the accumulation model no longer reproduces the %s's LSE", gpu);
    CHECK(fabs(gpu_lse - x->ref_lse[row]) > old_tol,
          "the rule without the yardstick accepts the %s's LSE: the case is not the one that "
          "failed", gpu);
    CHECK(fabs(gpu_lse - x->ref_lse[row]) <= new_tol, "the rule rejects the %s's LSE", gpu);
}

SK_TEST(fp8_tolerance_rule_has_teeth) {
    tu_rng rng;
    tu_rng_seed(&rng, tu_base_seed() ^ 0xF8A0);
    static const char *const names[4] = {"naive FP8 kernel", "10-bit accumulation",
                                         "logits x (1 + 2^-8)", "last key dropped"};
    int64_t bad[4] = {0, 0, 0, 0};
    for (int v = 0; v < kModelCases; ++v) {
        f8_case c;
        model_case(&c, v, &rng);
        f8_inst x;
        REQUIRE(f8_inst_create(&x, &c) == 0, "out of memory");
        const int64_t rows = c.batch * c.heads_q * c.seq_q;
        void *o = malloc((size_t)x.o_alloc * 2);
        float *lse = (float *)malloc((size_t)rows * sizeof(float));
        REQUIRE(o != NULL && lse != NULL, "out of memory");
        for (int w = 0; w < 4; ++w) {
            REQUIRE(f8_inst_model(&x, (f8_model)w, o, lse) == 0, "out of memory");
            const int64_t n = f8_inst_compare(&x, o, lse, names[w], 0, w == 0 ? 8 : 0);
            bad[w] += n;
            if (w != 0) continue;
            if (v == 0) /* LSE[b 0, h 10, q 18] */
                check_gpu_row("H200", &x, lse, (0 * c.heads_q + 10) * c.seq_q + 18, 46.485325,
                              46.447176);
            if (v == kH100Case) /* LSE[b 0, h 0, q 21] */
                check_gpu_row("H100", &x, lse, (0 * c.heads_q + 0) * c.seq_q + 21, 12.064959,
                              12.06971);
        }
        free(o);
        free(lse);
        f8_inst_destroy(&x);
    }
    for (int w = 0; w < 4; ++w) printf("    %-22s %lld elements outside the tolerance\n", names[w], (long long)bad[w]);
    CHECK(bad[0] == 0, "the rule rejects the naive FP8 kernel it is built on");
    for (int w = 1; w < 4; ++w) CHECK(bad[w] > 0, "the rule accepts a broken kernel (%s)", names[w]);
}
