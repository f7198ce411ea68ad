/*
 * test_fp8_vt.c - the pre-transposed V of the FP8 kernel (sparsek.h,
 * SK_QUANT_LAYOUT_VT_FP8 / SK_V_LAYOUT_VT_FP8) on the CPU: the key order
 * against the consumers' P register packing, the quantizer's VT bytes
 * against its rows bytes, the attention with V^T bit for bit equal to the
 * attention with rows V, and every bad VT argument (status, message naming
 * the field, nothing written), with the older descriptor sizes.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fp8_case.h"
#include "common/harness.h"
#include "common/test_util.h"
#include "core/fp8_vt.h"
#include "sparsek.h"

/* The consumer's packing (fwd_sm90_fp8_consumer.cuh, sk98_pack_p), emulated:
 * register r of k32 step kk of lane (g, t) packs accumulators 16 kk + j for
 * j in kJ[r], and accumulator i holds key 8 (i >> 2) + 2 t + (i & 1); the
 * A fragment reads register r's byte b at column 4 t + b (r = 0, 1) or
 * 16 + 4 t + b (r = 2, 3) of step kk. sk_vt_key must name that key. */
SK_TEST(fp8_vt_key_order_is_the_p_registers) {
    static const int kJ[4][4] = {{0, 1, 4, 5}, {2, 3, 6, 7}, {8, 9, 12, 13}, {10, 11, 14, 15}};
    int seen[128] = {0};
    for (int kk = 0; kk < 4; ++kk)
        for (int t = 0; t < 4; ++t)
            for (int r = 0; r < 4; ++r)
                for (int b = 0; b < 4; ++b) {
                    const int acc = 16 * kk + kJ[r][b];
                    const int key = 8 * (acc >> 2) + 2 * t + (acc & 1);
                    const int col = 32 * kk + (r >= 2 ? 16 : 0) + 4 * t + b;
                    CHECK(sk_vt_key(col) == key, "column %d: sk_vt_key %lld, P holds key %d", col,
                          (long long)sk_vt_key(col), key);
                    CHECK(sk_vt_col(key) == col, "key %d: sk_vt_col %lld, P column %d", key,
                          (long long)sk_vt_col(key), col);
                    seen[col] += (r & 1) == 0; /* rows g and g + 8 share the columns */
                }
    for (int c = 0; c < 128; ++c) CHECK(seen[c] == 1, "column %d covered %d times", c, seen[c]);
    /* The sparsek.h formula, and a permutation inside each 32 keys. */
    for (int64_t s = 0; s < 1024; ++s) {
        const int64_t k = s % 32;
        const int64_t want = s - k + (k & 16) + 4 * ((k >> 1) & 3) + 2 * ((k >> 3) & 1) + (k & 1);
        CHECK(sk_vt_col(s) == want && sk_vt_key(sk_vt_col(s)) == s && sk_vt_col(s) / 32 == s / 32,
              "key %lld", (long long)s);
    }
    CHECK(sk_vt_seq_pad(1) == 128 && sk_vt_seq_pad(128) == 128 && sk_vt_seq_pad(129) == 256,
          "S_pad");
}

/* One quantization in both layouts: the same descale, VT's code of (b, s,
 * h, d) at column sk_vt_col(s) of row (b, h, d) is the rows layout's, and
 * the padding columns are 0 (the outputs start filled with 0xA5). */
static void vt_round_trip(sk_dtype dtype, int64_t B, int64_t S, int64_t H, int64_t D,
                          tu_rng *rng) {
    const int64_t st[3] = {S * (H * D + 16), H * D + 16, D};
    const int64_t span = (B - 1) * st[0] + (S - 1) * st[1] + (H - 1) * st[2] + D;
    int64_t vt_bytes = -1;
    REQUIRE(sk_quantize_vt_elems(B, S, H, D, &vt_bytes) == SK_STATUS_SUCCESS, "%s",
            sk_last_error());
    CHECK(vt_bytes == B * H * D * sk_vt_seq_pad(S), "vt elems %lld", (long long)vt_bytes);
    uint16_t *x = (uint16_t *)malloc((size_t)span * 2);
    uint8_t *rows = (uint8_t *)malloc((size_t)(B * S * H * D));
    uint8_t *vt = (uint8_t *)malloc((size_t)vt_bytes);
    float *ds_rows = (float *)malloc((size_t)(B * H) * 4), *ds_vt = (float *)malloc((size_t)(B * H) * 4);
    REQUIRE(x && rows && vt && ds_rows && ds_vt, "out of memory");
    for (int64_t i = 0; i < span; ++i)
        tu_store(x, dtype, i, (float)(tu_rng_normal(rng) * (i % 97 == 0 ? 40.0 : 1.5)));
    memset(vt, 0xA5, (size_t)vt_bytes);
    sk_quantize_desc q;
    f8_quantize_desc(&q, SK_BACKEND_CPU, dtype, B, S, H, D, st); /* padded rows */
    REQUIRE(sk_quantize_e4m3(&q, x, rows, ds_rows, NULL, 0, NULL) == SK_STATUS_SUCCESS, "%s",
            sk_last_error());
    q.layout = SK_QUANT_LAYOUT_VT_FP8;
    REQUIRE(sk_quantize_e4m3(&q, x, vt, ds_vt, NULL, 0, NULL) == SK_STATUS_SUCCESS, "%s",
            sk_last_error());
    CHECK(memcmp(ds_rows, ds_vt, (size_t)(B * H) * 4) == 0, "descales differ");
    const int64_t pad = sk_vt_seq_pad(S);
    int64_t bad = 0;
    for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h)
            for (int64_t d = 0; d < D; ++d) {
                const uint8_t *row = vt + ((b * H + h) * D + d) * pad;
                for (int64_t s = 0; s < pad; ++s) {
                    const uint8_t want = s < S ? rows[((b * S + s) * H + h) * D + d] : 0;
                    if (row[sk_vt_col(s)] != want && bad++ < 6)
                        CHECK(0, "B%lld S%lld H%lld D%lld: vt[%lld, %lld, %lld, key %lld] = 0x%02x, "
                              "rows 0x%02x",
                              (long long)B, (long long)S, (long long)H, (long long)D, (long long)b,
                              (long long)h, (long long)d, (long long)s, row[sk_vt_col(s)], want);
                }
            }
    CHECK(bad == 0, "%lld VT codes differ from the rows codes", (long long)bad);
    free(x);
    free(rows);
    free(vt);
    free(ds_rows);
    free(ds_vt);
}

SK_TEST(fp8_vt_quantize_round_trip) {
    tu_rng rng;
    const uint64_t seed = tu_base_seed() ^ 0xF8F7;
    tu_rng_seed(&rng, seed);
    printf("    seed 0x%016llx\n", (unsigned long long)seed);
    static const int64_t seqs[] = {1, 31, 32, 33, 127, 128, 130, 257};
    for (int i = 0; i < 8; ++i) {
        vt_round_trip(i % 2 ? SK_DTYPE_F16 : SK_DTYPE_BF16, 1 + i % 2, seqs[i], 1 + i % 3,
                      i % 3 == 0 ? 64 : i % 3 == 1 ? 128 : 24, &rng);
    }
}

/* The CPU attention with V^T (every padding column NaN: the CPU reads no
 * key past Sk) against the same codes in rows: O and LSE bit for bit. */
SK_TEST(fp8_vt_attention_equals_rows_cpu) {
    tu_rng rng;
    tu_rng_seed(&rng, tu_base_seed() ^ 0xF8F8);
    int run = 0;
    for (int v = 0; v < 12; ++v) {
        f8_case c;
        f8_case_cpu_variant(&c, &rng, v);
        f8_inst x;
        REQUIRE(f8_inst_create(&x, &c) == 0, "out of memory");
        int64_t vt_bytes;
        uint8_t *vt = f8_inst_vt(&x, 0x7F, 0x7F, &vt_bytes);
        const int64_t rows = c.batch * c.heads_q * c.seq_q;
        void *o[2] = {malloc((size_t)x.o_alloc * 2), malloc((size_t)x.o_alloc * 2)};
        float *lse[2] = {(float *)malloc((size_t)rows * 4), (float *)malloc((size_t)rows * 4)};
        REQUIRE(vt && o[0] && o[1] && lse[0] && lse[1], "out of memory");
        for (int k = 0; k < 2; ++k) {
            sk_attention_desc d;
            f8_inst_desc(&x, SK_BACKEND_CPU, &d, x.q_descale, x.k_descale, x.v_descale);
            if (k == 1) {
                d.v_layout = SK_V_LAYOUT_VT_FP8;
                memset(d.v_strides, 0, sizeof d.v_strides);
            }
            memset(o[k], 0xFF, (size_t)x.o_alloc * 2);
            tu_fill_nan(lse[k], SK_DTYPE_F32, rows);
            const sk_status st = sk_attention_forward(&d, &x.layout, x.q8, x.k8, k ? vt : x.v8,
                                                      o[k], lse[k], NULL, 0, NULL);
            CHECK(st == SK_STATUS_SUCCESS, "case %d layout %d: %s", v, k, sk_last_error());
        }
        char buf[256];
        f8_case_describe(&c, buf, sizeof buf);
        CHECK(memcmp(o[0], o[1], (size_t)x.o_alloc * 2) == 0, "O differs: %s", buf);
        CHECK(memcmp(lse[0], lse[1], (size_t)rows * 4) == 0, "LSE differs: %s", buf);
        CHECK(f8_inst_compare(&x, o[1], lse[1], "cpu vt", 1, 4) == 0, "vt vs fp64: %s", buf);
        ++run;
        free(vt);
        free(o[0]);
        free(o[1]);
        free(lse[0]);
        free(lse[1]);
        f8_inst_destroy(&x);
    }
    printf("    %d cases, rows V and V^T compared bit for bit\n", run);
}

enum { NPAD = 128, SENT = 0xA5 };

SK_TEST(fp8_vt_quantize_bad_inputs) {
    enum { S = 40, D = 16 };
    uint16_t x[S * D];
    union {
        double align;
        uint8_t bytes[D * NPAD + 64];
    } out;
    for (int i = 0; i < S * D; ++i) x[i] = 0x3C00;
    int64_t elems = 5;
    CHECK(sk_quantize_vt_elems(1, 1, 1, 1, NULL) == SK_STATUS_BAD_PARAM_NULL_POINTER, "NULL");
    CHECK(sk_quantize_vt_elems(1, 0, 1, 8, &elems) == SK_STATUS_BAD_PARAM_SHAPE && elems == 5 &&
              strstr(sk_last_error(), "seq") != NULL,
          "%s", sk_last_error());
    CHECK(sk_quantize_vt_elems(1 << 20, INT64_MAX / 4, 1, 8, &elems) ==
              SK_STATUS_BAD_PARAM_OVERFLOW && elems == 5,
          "%s", sk_last_error());
    CHECK(sk_quantize_vt_elems(1, INT64_MAX, 1, 1, &elems) == SK_STATUS_BAD_PARAM_OVERFLOW, "%s",
          sk_last_error());
    for (int c = 0; c < 3; ++c) {
        sk_quantize_desc q;
        f8_quantize_desc(&q, SK_BACKEND_CPU, SK_DTYPE_F16, 1, S, 1, D, NULL);
        q.layout = SK_QUANT_LAYOUT_VT_FP8;
        uint8_t *y = out.bytes;
        float *descale = (float *)(out.bytes + D * NPAD);
        const char *needle = "";
        sk_status want = SK_STATUS_SUCCESS;
        switch (c) {
        case 0: q.layout = 3; needle = "desc->layout"; want = SK_STATUS_BAD_PARAM_VALUE; break;
        case 1: /* 16-byte alignment on CUDA, checked before any device work */
            q.backend = SK_BACKEND_CUDA;
            y = out.bytes + 8;
            needle = "y";
            want = SK_STATUS_BAD_PARAM_ALIGNMENT;
            break;
        case 2: /* descale inside V^T's span (rows y would end at S x D) */
            descale = (float *)(out.bytes + S * D + 16);
            needle = "overlap";
            want = SK_STATUS_BAD_PARAM_STRIDE;
            break;
        }
        memset(out.bytes, SENT, sizeof out.bytes);
        const sk_status got = sk_quantize_e4m3(&q, x, y, descale, NULL, 0, NULL);
        CHECK(got == want, "case %d: got %s (%s)", c, sk_status_name(got), sk_last_error());
        CHECK(strstr(sk_last_error(), needle) != NULL, "case %d: \"%s\"", c, sk_last_error());
        int untouched = 1;
        for (size_t i = 0; i < sizeof out.bytes; ++i) untouched &= out.bytes[i] == SENT;
        CHECK(untouched, "case %d: written", c);
    }
}
