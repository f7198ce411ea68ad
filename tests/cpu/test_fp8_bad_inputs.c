/*
 * test_fp8_bad_inputs.c - every bad FP8 argument: E4M3 where a call does not
 * take it, O's dtype, the descales (set without E4M3, misaligned,
 * overlapping O), the pre-transposed V's (v_layout), and the quantizer's
 * arguments. Each gets its exact status, a message naming the argument,
 * and leaves every buffer byte-identical; and descriptors of the sizes
 * before the FP8 fields and before v_layout still work.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/harness.h"
#include "common/test_util.h"
#include "sparsek.h"

enum { N = 64, NPAD = 128, SENT = 0xA5 };

/* A valid E4M3 forward on the CPU: B1 Sq = Sk = 64, H1, D64, one block. */
typedef struct f8_fix {
    sk_attention_desc d;
    sk_bsr layout;
    int32_t offsets[2], cols[1];
    uint8_t q[N * N], k[N * N];
    uint8_t v[N * NPAD]; /* rows V [1, 64, 1, 64], or V^T [1, 1, 64, 128] (v_layout) */
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
    for (int i = 0; i < N * N; ++i) f->q[i] = f->k[i] = (uint8_t)(0x30 + i % 7);
    for (int i = 0; i < N * NPAD; ++i) f->v[i] = (uint8_t)(0x30 + i % 7);
    memset(f->mem.bytes, SENT, sizeof f->mem.bytes);
}

static void *fix_o(f8_fix *f) { return f->mem.bytes; }
static float *fix_lse(f8_fix *f) { return (float *)(f->mem.bytes + N * N * 2); }

/* Run sk_attention_forward on q, k, v, o (q, k: the fixture's unless
 * given); check status, message and untouched memory (o, lse, descales, v). */
static void expect_on(f8_fix *f, const void *q, const void *k, const void *v, void *o,
                      sk_status want, const char *needle) {
    uint8_t before[sizeof f->mem.bytes], v_before[sizeof f->v];
    memcpy(before, f->mem.bytes, sizeof before);
    memcpy(v_before, f->v, sizeof v_before);
    const sk_status got = sk_attention_forward(&f->d, &f->layout, q != NULL ? q : f->q,
                                               k != NULL ? k : f->k, v, o, fix_lse(f), NULL, 0,
                                               NULL);
    const char *msg = sk_last_error();
    CHECK(got == want, "got %s, want %s (%s)", sk_status_name(got), sk_status_name(want), msg);
    CHECK(strstr(msg, needle) != NULL, "message does not mention \"%s\": \"%s\"", needle, msg);
    CHECK(memcmp(before, f->mem.bytes, sizeof before) == 0 &&
              memcmp(v_before, f->v, sizeof v_before) == 0,
          "o, lse, a descale or v was written");
}

static void expect(f8_fix *f, sk_status want, const char *needle) {
    expect_on(f, NULL, NULL, f->v, fix_o(f), want, needle);
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
    /* sizeof q - 8 is the size before `layout`, taken (fp8_vt_desc_older_sizes). */
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

/* Pre-transposed V (v_layout = SK_V_LAYOUT_VT_FP8): the fixture with V^T
 * [1, 1, 64, 128] runs; each bad field is refused by name. */
SK_TEST(fp8_vt_attention_bad_inputs) {
    f8_fix *f = (f8_fix *)malloc(sizeof *f);
    REQUIRE(f != NULL, "out of memory");
    fix_init(f);
    f->d.v_layout = SK_V_LAYOUT_VT_FP8;
    CHECK(sk_attention_forward(&f->d, &f->layout, f->q, f->k, f->v, fix_o(f), fix_lse(f), NULL,
                               0, NULL) == SK_STATUS_SUCCESS,
          "the V^T fixture: %s", sk_last_error());
    fix_init(f);
    f->d.v_layout = 7;
    expect(f, SK_STATUS_BAD_PARAM_VALUE, "desc->v_layout");
    fix_init(f);
    f->d.dtype = SK_DTYPE_F16;
    f->d.v_layout = SK_V_LAYOUT_VT_FP8;
    expect(f, SK_STATUS_BAD_PARAM_DTYPE, "desc->v_layout");
    fix_init(f);
    f->d.v_layout = SK_V_LAYOUT_VT_FP8;
    f->d.v_strides[1] = N;
    expect(f, SK_STATUS_BAD_PARAM_STRIDE, "desc->v_strides[1]");
    /* O inside V^T's 8 KB (rows V would be 4 KB: no overlap then). */
    fix_init(f);
    f->d.v_layout = SK_V_LAYOUT_VT_FP8;
    expect_on(f, NULL, NULL, f->v, f->v + N * N, SK_STATUS_BAD_PARAM_STRIDE, "overlap");
    /* CUDA: V^T 16-byte aligned, checked before any device work (q, k and
     * o aligned in a malloc block, V^T 8 bytes off). */
    fix_init(f);
    f->d.v_layout = SK_V_LAYOUT_VT_FP8;
    f->d.backend = SK_BACKEND_CUDA;
    uint8_t *blk = (uint8_t *)malloc(2 * N * N + N * NPAD + 16 + N * N * 2);
    REQUIRE(blk != NULL, "out of memory");
    memcpy(blk, f->q, 2 * N * N);
    expect_on(f, blk, blk + N * N, blk + 2 * N * N + 8, blk + 2 * N * N + N * NPAD + 16,
              SK_STATUS_BAD_PARAM_ALIGNMENT, "v = ");
    free(blk);
    /* The other entry points take no E4M3, so no V^T either. */
    fix_init(f);
    f->d.v_layout = SK_V_LAYOUT_VT_FP8;
    sk_attention_backward_desc bwd;
    sk_attention_backward_desc_init(&bwd, sizeof bwd);
    size_t bytes = 7;
    CHECK(sk_attention_backward_workspace_size(&f->d, &bwd, &f->layout, &bytes) ==
              SK_STATUS_BAD_PARAM_DTYPE && bytes == 7,
          "backward: %s", sk_last_error());
    free(f);
}

SK_TEST(fp8_vt_desc_older_sizes) {
    /* A descriptor of the size before v_layout (the FP8 release's) takes
     * the FP8 fields and never reads the tail: V is rows. */
    const size_t v2 = offsetof(sk_attention_desc, v_layout);
    f8_fix *f = (f8_fix *)malloc(sizeof *f);
    REQUIRE(f != NULL, "out of memory");
    fix_init(f);
    union {
        sk_attention_desc desc;
        unsigned char bytes[sizeof(sk_attention_desc)];
    } u;
    memset(u.bytes, 0x5A, sizeof u.bytes); /* v_layout = 0x5A5A5A5A: invalid if read */
    REQUIRE(sk_attention_desc_init(&u.desc, v2) == SK_STATUS_SUCCESS, "%s", sk_last_error());
    for (size_t i = v2; i < sizeof u.bytes; ++i) CHECK(u.bytes[i] == 0x5A, "byte %zu written", i);
    memcpy(u.bytes, &f->d, v2);
    u.desc.struct_size = v2;
    CHECK(sk_attention_forward(&u.desc, &f->layout, f->q, f->k, f->v, fix_o(f), fix_lse(f), NULL,
                               0, NULL) == SK_STATUS_SUCCESS,
          "%s", sk_last_error());
    CHECK(sk_attention_desc_init(&u.desc, v2 + 4) == SK_STATUS_BAD_PARAM_STRUCT_SIZE, "v2 + 4");
    /* The quantizer: the size before layout works as ROWS; others fail. */
    const size_t q1 = offsetof(sk_quantize_desc, layout);
    union {
        sk_quantize_desc desc;
        unsigned char bytes[sizeof(sk_quantize_desc)];
    } qu;
    memset(qu.bytes, 0x5A, sizeof qu.bytes);
    REQUIRE(sk_quantize_desc_init(&qu.desc, q1) == SK_STATUS_SUCCESS, "%s", sk_last_error());
    for (size_t i = q1; i < sizeof qu.bytes; ++i) CHECK(qu.bytes[i] == 0x5A, "byte %zu written", i);
    CHECK(sk_quantize_desc_init(&qu.desc, q1 - 8) == SK_STATUS_BAD_PARAM_STRUCT_SIZE, "q1 - 8");
    CHECK(sk_quantize_desc_init(&qu.desc, q1 + 4) == SK_STATUS_BAD_PARAM_STRUCT_SIZE, "q1 + 4");
    REQUIRE(sk_quantize_desc_init(&qu.desc, q1) == SK_STATUS_SUCCESS, "%s", sk_last_error());
    qu.desc.backend = SK_BACKEND_CPU;
    qu.desc.batch = qu.desc.seq = qu.desc.heads = 1;
    qu.desc.head_dim = 8;
    const uint16_t x[8] = {0x3C00, 0x4000, 0, 0, 0, 0, 0, 0x3800};
    uint8_t y[8];
    float ds;
    CHECK(sk_quantize_e4m3(&qu.desc, x, y, &ds, NULL, 0, NULL) == SK_STATUS_SUCCESS, "%s",
          sk_last_error());
    CHECK(y[1] == 0x7E && ds == 2.0f / 448.0f, "y[1] = 0x%02x, descale %g", y[1], (double)ds);
    free(f);
}
