/*
 * test_fp8_bad_inputs.c - every bad FP8 argument: E4M3 where a call does not
 * take it, O's dtype, the descales (set without E4M3, misaligned,
 * overlapping O), and the quantizer's arguments. Each gets its exact status,
 * a message naming the argument, and leaves every buffer byte-identical;
 * and a descriptor of the size before the FP8 fields still works.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/harness.h"
#include "common/test_util.h"
#include "sparsek.h"

enum { N = 64, SENT = 0xA5 };

/* A valid E4M3 forward on the CPU: B1 Sq = Sk = 64, H1, D64, one block. */
typedef struct f8_fix {
    sk_attention_desc d;
    sk_bsr layout;
    int32_t offsets[2], cols[1];
    uint8_t q[N * N], k[N * N], v[N * N];
    /* o, lse and the descales share one block of memory so that overlaps
     * can be made; each part starts filled with SENT. */
    union {
        float align;
        uint8_t bytes[N * N * 2 + N * 4 + 64];
    } mem;
} f8_fix;

static void fix_init(f8_fix *f) {
    memset(f, 0, sizeof *f);
    sk_attention_desc_init(&f->d, sizeof f->d);
    f->d.backend = SK_BACKEND_CPU;
    f->d.dtype = SK_DTYPE_E4M3;
    f->d.batch = f->d.heads_q = f->d.heads_kv = 1;
    f->d.seq_q = f->d.seq_k = f->d.head_dim = N;
    f->offsets[1] = 1;
    f->layout.grid = tu_grid(N, N, 64, 64, 1, 1);
    f->layout.nnz = 1;
    f->layout.row_offsets = f->offsets;
    f->layout.col_indices = f->cols;
    for (int i = 0; i < N * N; ++i) f->q[i] = f->k[i] = f->v[i] = (uint8_t)(0x30 + i % 7);
    memset(f->mem.bytes, SENT, sizeof f->mem.bytes);
}

static void *fix_o(f8_fix *f) { return f->mem.bytes; }
static float *fix_lse(f8_fix *f) { return (float *)(f->mem.bytes + N * N * 2); }

/* Run sk_attention_forward; check status, message and untouched memory. */
static void expect(f8_fix *f, sk_status want, const char *needle) {
    uint8_t before[sizeof f->mem.bytes];
    memcpy(before, f->mem.bytes, sizeof before);
    const sk_status got = sk_attention_forward(&f->d, &f->layout, f->q, f->k, f->v, fix_o(f),
                                               fix_lse(f), NULL, 0, NULL);
    const char *msg = sk_last_error();
    CHECK(got == want, "got %s, want %s (%s)", sk_status_name(got), sk_status_name(want), msg);
    CHECK(strstr(msg, needle) != NULL, "message does not mention \"%s\": \"%s\"", needle, msg);
    CHECK(memcmp(before, f->mem.bytes, sizeof before) == 0, "o, lse or a descale was written");
}

SK_TEST(fp8_bad_inputs_fixture_is_valid) {
    f8_fix *f = (f8_fix *)malloc(sizeof *f);
    REQUIRE(f != NULL, "out of memory");
    fix_init(f);
    const sk_status st = sk_attention_forward(&f->d, &f->layout, f->q, f->k, f->v, fix_o(f),
                                              fix_lse(f), NULL, 0, NULL);
    CHECK(st == SK_STATUS_SUCCESS, "%s", sk_last_error());
    /* Default O dtype of E4M3: BF16 (0x3F80 = 1.0 region, never the fill). */
    CHECK(((uint16_t *)fix_o(f))[0] != 0xA5A5u, "O was not written");
    free(f);
}

SK_TEST(fp8_bad_out_dtype_and_descales) {
    f8_fix *f = (f8_fix *)malloc(sizeof *f);
    REQUIRE(f != NULL, "out of memory");
    const sk_dtype bad_out[3] = {SK_DTYPE_F32, SK_DTYPE_E4M3, (sk_dtype)77};
    for (int i = 0; i < 3; ++i) {
        fix_init(f);
        f->d.out_dtype = bad_out[i];
        expect(f, SK_STATUS_BAD_PARAM_DTYPE, "desc->out_dtype");
    }
    /* Not E4M3: out_dtype must be 0 or dtype; descales must be NULL. */
    fix_init(f);
    f->d.dtype = SK_DTYPE_F16;
    f->d.out_dtype = SK_DTYPE_BF16;
    expect(f, SK_STATUS_BAD_PARAM_DTYPE, "desc->out_dtype");
    const float one[1] = {1.0f};
    for (int i = 0; i < 3; ++i) {
        fix_init(f);
        f->d.dtype = SK_DTYPE_BF16;
        f->d.q_descale = i == 0 ? one : NULL;
        f->d.k_descale = i == 1 ? one : NULL;
        f->d.v_descale = i == 2 ? one : NULL;
        expect(f, SK_STATUS_BAD_PARAM_VALUE,
               i == 0 ? "desc->q_descale" : i == 1 ? "desc->k_descale" : "desc->v_descale");
    }
    /* Misaligned descales, and descales O or LSE would overwrite. */
    fix_init(f);
    f->d.k_descale = (const float *)(f->mem.bytes + N * N * 2 + N * 4 + 1);
    expect(f, SK_STATUS_BAD_PARAM_ALIGNMENT, "desc->k_descale");
    fix_init(f);
    f->d.v_descale = (const float *)(f->mem.bytes + 64); /* inside O */
    expect(f, SK_STATUS_BAD_PARAM_STRIDE, "desc->v_descale");
    fix_init(f);
    f->d.q_descale = fix_lse(f) + 3; /* inside LSE */
    expect(f, SK_STATUS_BAD_PARAM_STRIDE, "desc->q_descale");
    /* Just past LSE: fine, and read (a 0 descale on Q gives uniform weights). */
    fix_init(f);
    float *after = (float *)(f->mem.bytes + N * N * 2 + N * 4);
    after[0] = 0.0f;
    f->d.q_descale = after;
    CHECK(sk_attention_forward(&f->d, &f->layout, f->q, f->k, f->v, fix_o(f), fix_lse(f), NULL,
                               0, NULL) == SK_STATUS_SUCCESS,
          "%s", sk_last_error());
    free(f);
}

SK_TEST(fp8_e4m3_refused_elsewhere) {
    /* The backward, the varlen call, the GEMM and top-k take no FP8. */
    f8_fix *f = (f8_fix *)malloc(sizeof *f);
    REQUIRE(f != NULL, "out of memory");
    fix_init(f);
    sk_attention_backward_desc bwd;
    sk_attention_backward_desc_init(&bwd, sizeof bwd);
    size_t bytes = 7;
    CHECK(sk_attention_backward_workspace_size(&f->d, &bwd, &f->layout, &bytes) ==
              SK_STATUS_BAD_PARAM_DTYPE,
          "backward: %s", sk_last_error());
    CHECK(strstr(sk_last_error(), "E4M3") != NULL, "%s", sk_last_error());
    CHECK(bytes == 7, "workspace_bytes written");

    sk_attention_varlen_desc vd;
    sk_attention_varlen_desc_init(&vd, sizeof vd);
    vd.backend = SK_BACKEND_CPU;
    vd.dtype = SK_DTYPE_E4M3;
    vd.batch = 1;
    vd.total_q = vd.total_k = vd.max_seqlen_q = vd.max_seqlen_k = N;
    vd.heads_q = vd.heads_kv = 1;
    vd.head_dim = N;
    CHECK(sk_attention_varlen_workspace_size(&vd, &f->layout, &bytes) ==
              SK_STATUS_BAD_PARAM_DTYPE,
          "varlen: %s", sk_last_error());
    CHECK(strstr(sk_last_error(), "desc->dtype = E4M3") != NULL, "%s", sk_last_error());

    sk_bsr_gemm_desc g;
    sk_bsr_gemm_desc_init(&g, sizeof g);
    g.backend = SK_BACKEND_CPU;
    g.ab_dtype = SK_DTYPE_E4M3;
    g.m = g.n = g.k = N;
    CHECK(sk_bsr_gemm_workspace_size(&g, &f->layout, &bytes) == SK_STATUS_BAD_PARAM_DTYPE,
          "gemm: %s", sk_last_error());
    CHECK(strstr(sk_last_error(), "desc->ab_dtype = E4M3") != NULL, "%s", sk_last_error());

    sk_topk_desc t;
    sk_topk_desc_init(&t, sizeof t);
    t.backend = SK_BACKEND_CPU;
    t.dtype = SK_DTYPE_E4M3;
    t.batch = t.heads_q = t.heads_kv = 1;
    t.seq_q = t.seq_k = t.head_dim = N;
    CHECK(sk_topk_workspace_size(&t, &bytes) == SK_STATUS_BAD_PARAM_DTYPE, "topk: %s",
          sk_last_error());
    CHECK(bytes == 7, "workspace_bytes written");
    free(f);
}

SK_TEST(fp8_quantize_bad_inputs) {
    enum { B = 1, S = 8, H = 2, D = 16 };
    uint16_t x[B * S * H * D];
    union {
        float align;
        uint8_t bytes[B * S * H * D + 64];
    } out;
    for (int i = 0; i < B * S * H * D; ++i) x[i] = 0x3C00;
    sk_quantize_desc q;
    /* sizeof q - 8 is now the size before `layout`, taken (test_fp8_vt.c). */
    CHECK(sk_quantize_desc_init(&q, sizeof q - 16) == SK_STATUS_BAD_PARAM_STRUCT_SIZE, "%s",
          sk_last_error());
    struct {
        const char *needle;
        sk_status want;
        int what;
    } cases[] = {{"desc->dtype", SK_STATUS_BAD_PARAM_DTYPE, 0},
                 {"desc->seq", SK_STATUS_BAD_PARAM_SHAPE, 1},
                 {"desc->backend", SK_STATUS_BAD_PARAM_VALUE, 2},
                 {"y overlaps", SK_STATUS_BAD_PARAM_STRIDE, 3},
                 {"descale must not be NULL", SK_STATUS_BAD_PARAM_NULL_POINTER, 4},
                 {"descale", SK_STATUS_BAD_PARAM_ALIGNMENT, 5},
                 {"x", SK_STATUS_BAD_PARAM_STRIDE, 6},
                 {"struct_size", SK_STATUS_BAD_PARAM_STRUCT_SIZE, 7}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; ++c) {
        sk_quantize_desc_init(&q, sizeof q);
        q.backend = SK_BACKEND_CPU;
        q.dtype = SK_DTYPE_F16;
        q.batch = B;
        q.seq = S;
        q.heads = H;
        q.head_dim = D;
        uint8_t *y = out.bytes;
        float *descale = (float *)(out.bytes + B * S * H * D);
        const void *xp = x;
        switch (cases[c].what) {
        case 0: q.dtype = SK_DTYPE_E4M3; break;
        case 1: q.seq = 0; break;
        case 2: q.backend = (sk_backend)9; break;
        case 3: y = (uint8_t *)x + 4; break;
        case 4: descale = NULL; break;
        case 5: descale = (float *)(out.bytes + B * S * H * D + 2); break;
        case 6: q.x_strides[0] = -1; q.x_strides[1] = H * D; q.x_strides[2] = D; break;
        case 7: q.struct_size = 3; break;
        }
        memset(out.bytes, SENT, sizeof out.bytes);
        uint16_t x_before[B * S * H * D];
        memcpy(x_before, x, sizeof x);
        const sk_status got = sk_quantize_e4m3(&q, xp, y, descale, NULL, 0, NULL);
        const char *msg = sk_last_error();
        CHECK(got == cases[c].want, "case %zu: got %s, want %s (%s)", c, sk_status_name(got),
              sk_status_name(cases[c].want), msg);
        CHECK(strstr(msg, cases[c].needle) != NULL && strstr(msg, "sk_quantize_e4m3") != NULL,
              "case %zu: message does not mention \"%s\": \"%s\"", c, cases[c].needle, msg);
        int untouched = memcmp(x, x_before, sizeof x) == 0;
        for (size_t i = 0; i < sizeof out.bytes; ++i) untouched &= out.bytes[i] == SENT;
        CHECK(untouched, "case %zu: a buffer was written", c);
    }
}

SK_TEST(fp8_desc_older_struct_size) {
    /* A caller built before the FP8 fields passes the size up to
     * o_strides: desc_init fills only that much, and the calls take it with
     * out_dtype 0 and no descales, never reading past it. */
    const size_t v1 = offsetof(sk_attention_desc, out_dtype);
    f8_fix *f = (f8_fix *)malloc(sizeof *f);
    REQUIRE(f != NULL, "out of memory");
    fix_init(f);
    union {
        sk_attention_desc desc; /* for the alignment */
        unsigned char bytes[sizeof(sk_attention_desc)];
    } u;
    unsigned char *raw = u.bytes;
    memset(raw, 0x5A, sizeof u.bytes); /* the tail: garbage that must not be read */
    sk_attention_desc *d = &u.desc;
    REQUIRE(sk_attention_desc_init(d, v1) == SK_STATUS_SUCCESS, "%s", sk_last_error());
    CHECK(d->struct_size == v1, "struct_size = %zu", d->struct_size);
    for (size_t i = v1; i < sizeof u.bytes; ++i) CHECK(raw[i] == 0x5A, "byte %zu written", i);
    memcpy(raw, &f->d, v1);
    d->struct_size = v1;
    /* E4M3 with the old size: O in BF16, descales 1. */
    CHECK(sk_attention_forward(d, &f->layout, f->q, f->k, f->v, fix_o(f), fix_lse(f), NULL, 0,
                               NULL) == SK_STATUS_SUCCESS,
          "%s", sk_last_error());
    uint16_t o_old[16];
    memcpy(o_old, fix_o(f), sizeof o_old);
    fix_init(f); /* the full-size descriptor, same problem, defaults */
    CHECK(sk_attention_forward(&f->d, &f->layout, f->q, f->k, f->v, fix_o(f), fix_lse(f), NULL, 0,
                               NULL) == SK_STATUS_SUCCESS,
          "%s", sk_last_error());
    CHECK(memcmp(o_old, fix_o(f), sizeof o_old) == 0, "the old-size descriptor computed otherwise");
    /* Any other size is refused. */
    CHECK(sk_attention_desc_init(d, v1 + 8) == SK_STATUS_BAD_PARAM_STRUCT_SIZE, "v1 + 8 taken");
    d->struct_size = v1 - 8;
    CHECK(sk_attention_forward(d, &f->layout, f->q, f->k, f->v, fix_o(f), fix_lse(f), NULL, 0,
                               NULL) == SK_STATUS_BAD_PARAM_STRUCT_SIZE,
          "struct_size v1 - 8 taken");
    CHECK(strstr(sk_last_error(), "desc->struct_size") != NULL, "%s", sk_last_error());
    free(f);
}
