/*
 * test_varlen_bad_inputs.c - every bad input of the varlen attention and of
 * the varlen layout calls gets its exact status, a message naming the call
 * and the argument, and leaves every buffer byte-identical (the style of
 * test_bad_inputs.c).
 *
 * The attention fixture is a valid call: B = 3 sequences of (len_q, len_k)
 * (50, 60), (0, 130), (70, 0), Hq = 4, Hkv = 2, D = 16, F16, CPU, blocks
 * 64, a layout per KV head (R = 3 rows per slice: sequence 0's one row
 * selects its one key block, sequence 2's two rows are empty). Each test
 * breaks one thing and checks the status, the message, and that O, LSE
 * (0xA5 sentinels), the inputs, the length arrays, the layout arrays, the
 * descriptor and *workspace_bytes are unchanged. The CUDA backends get the
 * same statuses for bad arguments and, for the valid call,
 * SK_STATUS_NOT_SUPPORTED (NOT_SUPPORTED_BACKEND in a build without CUDA),
 * touching nothing.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/harness.h"
#include "common/packed_fixture.h"
#include "common/test_util.h"
#include "sparsek.h"

enum { NBUF = 7, TOTAL_Q = 120, TOTAL_K = 190, HQ = 4, HKV = 2, DIM = 16 };

typedef enum vcall { V_RUN, V_FORWARD, V_WORKSPACE_SIZE, V_PLAN, V_INIT } vcall;

static const char *vcall_name(vcall c) {
    static const char *const names[5] = {"sk_attention_varlen_run", "sk_attention_varlen_forward",
                                         "sk_attention_varlen_workspace_size",
                                         "sk_attention_varlen_plan",
                                         "sk_attention_varlen_desc_init"};
    return names[c];
}

enum { IQ, IK, IV, IO, ILSE, ICUQ, ICUK };
static const char *const buf_names[NBUF] = {"q",           "k", "v", "o", "lse", "cu_seqlens_q",
                                            "cu_seqlens_k"};

typedef struct vfix {
    sk_attention_varlen_desc desc;
    const sk_attention_varlen_desc *desc_arg;
    pk_layout lay;
    const sk_bsr *layout_arg;
    pk_buffers b;
    size_t ws_bytes;
    size_t *ws_arg;
    size_t init_size;
} vfix;

static int32_t *cu(vfix *f, int which) {
    return (int32_t *)(void *)f->b.p[which];
}

static int fix_init(vfix *f) {
    memset(f, 0, sizeof *f);
    tu_rng rng;
    tu_rng_seed(&rng, tu_base_seed() + 30);
    if (sk_attention_varlen_desc_init(&f->desc, sizeof f->desc) != SK_STATUS_SUCCESS) return 0;
    f->desc.backend = SK_BACKEND_CPU;
    f->desc.dtype = SK_DTYPE_F16;
    f->desc.batch = 3;
    f->desc.total_q = TOTAL_Q;
    f->desc.total_k = TOTAL_K;
    f->desc.max_seqlen_q = 70;
    f->desc.max_seqlen_k = 130;
    f->desc.heads_q = HQ;
    f->desc.heads_kv = HKV;
    f->desc.head_dim = DIM;
    const size_t qn = TOTAL_Q * HQ * DIM * 2, kn = TOTAL_K * HKV * DIM * 2;
    const size_t bytes[NBUF] = {qn, kn, kn, qn, HQ * TOTAL_Q * 4, 16, 16};
    if (!pk_alloc(&f->b, NBUF, bytes, buf_names, IV + 1, &rng)) return 0;
    const int32_t cu_q[4] = {0, 50, 50, 120}, cu_k[4] = {0, 60, 190, 190};
    memcpy(cu(f, ICUQ), cu_q, sizeof cu_q);
    memcpy(cu(f, ICUK), cu_k, sizeof cu_k);
    pk_layout_init(&f->lay);
    f->desc_arg = &f->desc;
    f->layout_arg = &f->lay.bsr;
    f->ws_bytes = 12345;
    f->ws_arg = &f->ws_bytes;
    f->init_size = sizeof(sk_attention_varlen_desc);
    return 1;
}

static void fix_free(vfix *f) {
    pk_free(&f->b);
}

static sk_status fix_call(vfix *f, vcall call) {
    void *const *a = f->b.arg;
    const int32_t *cq = (const int32_t *)a[ICUQ], *ck = (const int32_t *)a[ICUK];
    switch (call) {
    case V_RUN:
        return sk_attention_varlen_run(f->desc_arg, f->layout_arg, cq, ck, a[IQ], a[IK], a[IV],
                                       a[IO], (float *)a[ILSE], NULL, 0, NULL);
    case V_FORWARD:
        return sk_attention_varlen_forward(f->desc_arg, f->layout_arg, cq, ck, a[IQ], a[IK], a[IV],
                                           a[IO], (float *)a[ILSE], NULL, 0, NULL);
    case V_WORKSPACE_SIZE:
        return sk_attention_varlen_workspace_size(f->desc_arg, f->layout_arg, f->ws_arg);
    case V_PLAN:
        return sk_attention_varlen_plan(f->desc_arg, f->layout_arg, cq, ck, NULL, 0, NULL);
    case V_INIT:
        return sk_attention_varlen_desc_init((sk_attention_varlen_desc *)(void *)f->desc_arg,
                                             f->init_size);
    }
    return SK_STATUS_INTERNAL_ERROR;
}

/* Call, then check status (want, or want2 when it is not SUCCESS),
 * message and untouched buffers, layout arrays and descriptor. */
static void expect2(vfix *f, vcall call, sk_status want, sk_status want2, const char *needle) {
    pk_snapshot(&f->b, &f->lay);
    const sk_attention_varlen_desc desc_before = f->desc;
    const sk_status got = fix_call(f, call);
    pk_expect(&f->b, &f->lay, vcall_name(call), got, want, want2, needle);
    CHECK(f->ws_bytes == 12345, "workspace_bytes was written: %zu", f->ws_bytes);
    if (call != V_INIT)
        CHECK(memcmp(&desc_before, &f->desc, sizeof desc_before) == 0, "desc was written");
}

static void expect(vfix *f, vcall call, sk_status want, const char *needle) {
    expect2(f, call, want, SK_STATUS_SUCCESS, needle);
}

#define BAD_VARLEN(name, call, want, needle, ...)                                                  \
    SK_TEST(varlen_bad_input_##name) {                                                             \
        vfix fx;                                                                                   \
        vfix *FIX = &fx;                                                                           \
        if (!fix_init(FIX)) {                                                                      \
            CHECK(0, "fixture: out of memory");                                                    \
            fix_free(FIX);                                                                         \
            return;                                                                                \
        }                                                                                          \
        __VA_ARGS__;                                                                               \
        expect(FIX, call, want, needle);                                                           \
        fix_free(FIX);                                                                             \
    }

SK_TEST(varlen_bad_input_fixture_is_valid) {
    vfix f;
    if (!fix_init(&f)) {
        CHECK(0, "out of memory");
        fix_free(&f);
        return;
    }
    const vcall calls[4] = {V_RUN, V_FORWARD, V_WORKSPACE_SIZE, V_PLAN};
    for (int i = 0; i < 4; ++i) {
        const sk_status st = fix_call(&f, calls[i]);
        CHECK(st == SK_STATUS_SUCCESS, "%s: %s %s", vcall_name(calls[i]), sk_status_name(st),
              sk_last_error());
    }
    CHECK(f.ws_bytes == 0, "CPU workspace %zu", f.ws_bytes);
    /* Every element of O and LSE was written (fp16 0xA5A5 is not a possible
     * result here; sequence 2's rows are O = 0, LSE = -inf). */
    const size_t untouched = pk_untouched(&f.b, IO, 2) + pk_untouched(&f.b, ILSE, 4);
    CHECK(untouched == 0, "%zu elements of O and LSE not written", untouched);
    const float *lse = (const float *)(void *)f.b.p[ILSE];
    CHECK(isinf(lse[TOTAL_Q - 1]) && lse[TOTAL_Q - 1] < 0 && isfinite(lse[0]),
          "LSE of sequence 2 (no key) %g, of sequence 0 %g", (double)lse[TOTAL_Q - 1],
          (double)lse[0]);
    fix_free(&f);
}

/* The descriptor. */
BAD_VARLEN(null_desc, V_RUN, SK_STATUS_BAD_PARAM_NULL_POINTER, "desc", FIX->desc_arg = NULL)
BAD_VARLEN(desc_not_initialised, V_FORWARD, SK_STATUS_BAD_PARAM_STRUCT_SIZE,
           "sk_attention_varlen_desc_init", FIX->desc.struct_size = 0)
BAD_VARLEN(desc_init_wrong_size, V_INIT, SK_STATUS_BAD_PARAM_STRUCT_SIZE, "struct_size",
           FIX->init_size = sizeof(sk_attention_varlen_desc) - 8)
BAD_VARLEN(desc_init_null, V_INIT, SK_STATUS_BAD_PARAM_NULL_POINTER, "desc", FIX->desc_arg = NULL)
BAD_VARLEN(bad_backend, V_RUN, SK_STATUS_BAD_PARAM_VALUE, "backend",
           FIX->desc.backend = (sk_backend)9)
BAD_VARLEN(bad_dtype, V_WORKSPACE_SIZE, SK_STATUS_BAD_PARAM_DTYPE, "dtype",
           FIX->desc.dtype = (sk_dtype)7)
BAD_VARLEN(f32_on_cuda, V_PLAN, SK_STATUS_BAD_PARAM_DTYPE, "F32", FIX->desc.dtype = SK_DTYPE_F32;
           FIX->desc.backend = SK_BACKEND_CUDA)
BAD_VARLEN(batch_zero, V_RUN, SK_STATUS_BAD_PARAM_SHAPE, "desc->batch = 0", FIX->desc.batch = 0)
BAD_VARLEN(total_q_zero, V_RUN, SK_STATUS_BAD_PARAM_SHAPE, "desc->total_q = 0",
           FIX->desc.total_q = 0)
BAD_VARLEN(total_k_negative, V_FORWARD, SK_STATUS_BAD_PARAM_SHAPE, "desc->total_k",
           FIX->desc.total_k = -1)
BAD_VARLEN(total_q_above_int32, V_WORKSPACE_SIZE, SK_STATUS_BAD_PARAM_OVERFLOW, "total_q",
           FIX->desc.total_q = (int64_t)INT32_MAX + 1)
BAD_VARLEN(max_seqlen_q_zero, V_RUN, SK_STATUS_BAD_PARAM_SHAPE, "max_seqlen_q",
           FIX->desc.max_seqlen_q = 0)
BAD_VARLEN(max_seqlen_k_above_int32, V_PLAN, SK_STATUS_BAD_PARAM_OVERFLOW, "max_seqlen_k",
           FIX->desc.max_seqlen_k = (int64_t)INT32_MAX + 5)
BAD_VARLEN(heads_q_not_multiple, V_RUN, SK_STATUS_BAD_PARAM_SHAPE, "heads_kv",
           FIX->desc.heads_kv = 3)
BAD_VARLEN(head_dim_zero, V_RUN, SK_STATUS_BAD_PARAM_SHAPE, "head_dim", FIX->desc.head_dim = 0)
BAD_VARLEN(scale_nan, V_RUN, SK_STATUS_BAD_PARAM_VALUE, "scale", FIX->desc.scale = NAN)
BAD_VARLEN(mask_7, V_PLAN, SK_STATUS_BAD_PARAM_VALUE, "mask", FIX->desc.mask = (sk_mask)7)
/* Strides and sizes. */
BAD_VARLEN(negative_stride, V_RUN, SK_STATUS_BAD_PARAM_STRIDE, "q stride over seq",
           FIX->desc.q_strides[0] = -64;
           FIX->desc.q_strides[1] = 16)
/* Two query heads share an O row: head stride 8 < D = 16. */
BAD_VARLEN(overlapping_o_strides, V_FORWARD, SK_STATUS_BAD_PARAM_STRIDE, "o stride over head",
           FIX->desc.o_strides[0] = 64;
           FIX->desc.o_strides[1] = 8)
BAD_VARLEN(stride_extent_overflow, V_RUN, SK_STATUS_BAD_PARAM_OVERFLOW, "k: extent 190",
           FIX->desc.k_strides[0] = INT64_MAX / 64;
           FIX->desc.k_strides[1] = 16)
/* total_q x heads_q x head_dim x 2 bytes: 2^31 x 2^30 x 2^20 x 2. */
BAD_VARLEN(size_overflow, V_WORKSPACE_SIZE, SK_STATUS_BAD_PARAM_OVERFLOW, "total_q x heads_q",
           FIX->desc.total_q = INT32_MAX;
           FIX->desc.heads_q = FIX->desc.heads_kv = 1 << 30; FIX->desc.head_dim = 1 << 20;
           FIX->lay.bsr.grid.heads = 1)
/* The layout's geometry. */
BAD_VARLEN(null_layout, V_PLAN, SK_STATUS_BAD_PARAM_NULL_POINTER, "layout", FIX->layout_arg = NULL)
BAD_VARLEN(layout_batch_2, V_RUN, SK_STATUS_BAD_LAYOUT_MISMATCH, "batch = 2",
           FIX->lay.bsr.grid.batch = 2)
BAD_VARLEN(layout_heads_3, V_RUN, SK_STATUS_BAD_LAYOUT_MISMATCH, "heads",
           FIX->lay.bsr.grid.heads = 3)
BAD_VARLEN(layout_block_32, V_WORKSPACE_SIZE, SK_STATUS_BAD_PARAM_VALUE, "block_rows",
           FIX->lay.bsr.grid.block_rows = 32)
BAD_VARLEN(null_workspace_bytes, V_WORKSPACE_SIZE, SK_STATUS_BAD_PARAM_NULL_POINTER,
           "workspace_bytes", FIX->ws_arg = NULL)
/* Pointers and alignment. */
BAD_VARLEN(null_cu_seqlens_q, V_RUN, SK_STATUS_BAD_PARAM_NULL_POINTER, "cu_seqlens_q",
           FIX->b.arg[ICUQ] = NULL)
BAD_VARLEN(null_cu_seqlens_k_plan, V_PLAN, SK_STATUS_BAD_PARAM_NULL_POINTER, "cu_seqlens_k",
           FIX->b.arg[ICUK] = NULL)
BAD_VARLEN(misaligned_cu_seqlens_k, V_FORWARD, SK_STATUS_BAD_PARAM_ALIGNMENT,
           "cu_seqlens_k = ", FIX->b.arg[ICUK] = FIX->b.p[ICUK] + 2)
BAD_VARLEN(null_q, V_RUN, SK_STATUS_BAD_PARAM_NULL_POINTER, "q must not be NULL",
           FIX->b.arg[IQ] = NULL)
BAD_VARLEN(null_o, V_FORWARD, SK_STATUS_BAD_PARAM_NULL_POINTER, "o must not be NULL",
           FIX->b.arg[IO] = NULL)
BAD_VARLEN(misaligned_q, V_RUN, SK_STATUS_BAD_PARAM_ALIGNMENT,
           "q = ", FIX->b.arg[IQ] = FIX->b.p[IQ] + 1)
BAD_VARLEN(misaligned_lse, V_RUN, SK_STATUS_BAD_PARAM_ALIGNMENT,
           "lse = ", FIX->b.arg[ILSE] = FIX->b.p[ILSE] + 2)
/* Aliasing (the full table is in test_aliasing.c). */
BAD_VARLEN(o_overlaps_q, V_RUN, SK_STATUS_BAD_PARAM_STRIDE, "o overlaps q",
           FIX->b.arg[IO] = FIX->b.p[IQ] + 16)
BAD_VARLEN(lse_overlaps_cu_seqlens_q, V_FORWARD, SK_STATUS_BAD_PARAM_STRIDE,
           "lse overlaps cu_seqlens_q", FIX->b.arg[ICUQ] = FIX->b.p[ILSE] + 8;
           memcpy(FIX->b.p[ILSE] + 8, FIX->b.p[ICUQ], 16))
BAD_VARLEN(o_overlaps_cu_seqlens_k, V_RUN, SK_STATUS_BAD_PARAM_STRIDE, "o overlaps cu_seqlens_k",
           FIX->b.arg[ICUK] = FIX->b.p[IO] + 32;
           memcpy(FIX->b.p[IO] + 32, FIX->b.p[ICUK], 16))
/* The lengths (host arrays on the CPU: checked before anything is written). */
BAD_VARLEN(cu_seqlens_q_first_not_0, V_RUN, SK_STATUS_BAD_PARAM_SHAPE, "cu_seqlens_q[0] = 1",
           cu(FIX, ICUQ)[0] = 1)
BAD_VARLEN(cu_seqlens_q_decreasing, V_FORWARD, SK_STATUS_BAD_PARAM_SHAPE,
           "cu_seqlens_q[2] = 40 is less than cu_seqlens_q[1] = 50", cu(FIX, ICUQ)[2] = 40)
BAD_VARLEN(cu_seqlens_q_last_not_total, V_PLAN, SK_STATUS_BAD_PARAM_SHAPE, "total_q = 120",
           cu(FIX, ICUQ)[3] = 119)
BAD_VARLEN(cu_seqlens_k_last_not_total, V_RUN, SK_STATUS_BAD_PARAM_SHAPE, "total_k = 190",
           cu(FIX, ICUK)[3] = 191)
BAD_VARLEN(len_q_above_max, V_RUN, SK_STATUS_BAD_PARAM_SHAPE, "above max_seqlen_q = 69",
           FIX->desc.max_seqlen_q = 69)
BAD_VARLEN(len_k_above_max, V_PLAN, SK_STATUS_BAD_PARAM_SHAPE, "sequence 1 has len_k = 130",
           FIX->desc.max_seqlen_k = 100)
/* The layout's content. */
BAD_VARLEN(layout_count_differs_from_nnz, V_RUN, SK_STATUS_BAD_LAYOUT_COUNT, "nnz",
           FIX->lay.bsr.nnz = 1)
BAD_VARLEN(layout_index_past_grid, V_FORWARD, SK_STATUS_BAD_LAYOUT_INDEX_RANGE, "col_indices",
           FIX->lay.indices[1] = 3)
/* Sequence 0 has one key block; index 1 is inside the grid, not inside it. */
BAD_VARLEN(layout_index_past_sequence, V_RUN, SK_STATUS_BAD_LAYOUT_INDEX_RANGE, "sequence 0",
           FIX->lay.indices[0] = 1)
/* Sequence 2 has no key: its row may not select any block. */
BAD_VARLEN(layout_row_of_sequence_without_keys, V_PLAN, SK_STATUS_BAD_LAYOUT_INDEX_RANGE,
           "sequence 2 has len_k = 0", FIX->lay.offsets[1] = 0;
           FIX->lay.offsets[2] = 1)
/* Two rows per slice where the sequences need three. */
BAD_VARLEN(layout_too_few_rows, V_RUN, SK_STATUS_BAD_LAYOUT_MISMATCH, "need 3",
           FIX->lay.bsr.grid.rows = 2 * 64;
           FIX->lay.offsets[3] = 2; FIX->lay.offsets[4] = 2)

/* The CUDA backends: a bad argument gets the CPU's status (the core's
 * checks come first); the valid call, on SK_BACKEND_CUDA_SM90
 * SK_STATUS_NOT_SUPPORTED (the Hopper kernel does not cover D = 16) or,
 * without CUDA, NOT_SUPPORTED_BACKEND, writing nothing; on the others a
 * workspace size. Host pointers are fine, as no device is touched. Device
 * length arrays are not read: lengths that do not add up pass the host
 * checks. */
SK_TEST(varlen_cuda_declines_before_the_device) {
    static const sk_backend backends[3] = {SK_BACKEND_CUDA, SK_BACKEND_CUDA_SM80,
                                           SK_BACKEND_CUDA_SM90};
    const int has_cuda = strstr(sk_build_info(), "no CUDA") == NULL;
    const sk_status declined = has_cuda ? SK_STATUS_NOT_SUPPORTED : SK_STATUS_NOT_SUPPORTED_BACKEND;
    for (int bi = 0; bi < 3; ++bi) {
        vfix f;
        if (!fix_init(&f)) {
            CHECK(0, "out of memory");
            fix_free(&f);
            return;
        }
        f.desc.backend = backends[bi];
        f.desc.head_dim = 0;
        expect(&f, V_RUN, SK_STATUS_BAD_PARAM_SHAPE, "head_dim");
        f.desc.head_dim = DIM;
        f.lay.bsr.grid.batch = 3;
        expect(&f, V_WORKSPACE_SIZE, SK_STATUS_BAD_LAYOUT_MISMATCH, "batch = 3");
        f.lay.bsr.grid.batch = 1;
        f.b.arg[IO] = f.b.p[IQ]; /* o overlaps q */
        expect(&f, V_FORWARD, SK_STATUS_BAD_PARAM_STRIDE, "o overlaps q");
        f.b.arg[IO] = f.b.p[IO];
        f.b.arg[IK] = f.b.p[IK] + 2; /* CUDA wants 16-byte tensors */
        expect(&f, V_RUN, SK_STATUS_BAD_PARAM_ALIGNMENT, "k = ");
        f.b.arg[IK] = f.b.p[IK];
        cu(&f, ICUQ)[3] = 7; /* not read on the host */
        if (has_cuda && backends[bi] != SK_BACKEND_CUDA_SM90) {
            /* The portable kernels exist: the workspace size needs no
             * device. Plan and run would reach one with these host
             * arrays; the GPU suite runs them (test_attention_varlen_gpu.c). */
            const sk_status st = fix_call(&f, V_WORKSPACE_SIZE);
            CHECK(st == SK_STATUS_SUCCESS && f.ws_bytes != 12345 && f.ws_bytes > 0,
                  "backend %d: workspace size %s, %zu bytes (%s)", (int)backends[bi],
                  sk_status_name(st), f.ws_bytes, sk_last_error());
            fix_free(&f);
            continue;
        }
        /* SK_BACKEND_CUDA_SM90: the Hopper kernel declines D = 16 (it
         * covers D 64 / 128, blocks 128) from every call, the workspace
         * size included, before any device access; or no CUDA. */
        const vcall calls[4] = {V_RUN, V_FORWARD, V_WORKSPACE_SIZE, V_PLAN};
        for (int i = 0; i < 4; ++i)
            expect2(&f, calls[i], declined, SK_STATUS_SUCCESS,
                    has_cuda ? "head_dim 64 or 128 only" : "without CUDA");
        fix_free(&f);
    }
}

/* ---------------------------------------------------------------------------
 * The varlen layout calls: status, message, *out untouched
 * ------------------------------------------------------------------------- */

/* sk_layout_t sentinel: a builder must leave *out as it was on failure. */
#define OUT_SENTINEL ((sk_layout_t)(uintptr_t)0x5a5a)

static void expect_layout(sk_status got, sk_layout_t out, sk_status want, const char *api,
                          const char *needle) {
    const char *msg = sk_last_error();
    CHECK(got == want, "%s: got %s, want %s (%s)", api, sk_status_name(got), sk_status_name(want),
          msg);
    CHECK(strstr(msg, api) != NULL && strstr(msg, needle) != NULL,
          "%s: message \"%s\" lacks \"%s\"", api, msg, needle);
    CHECK(out == OUT_SENTINEL, "%s: *out was written", api);
}

SK_TEST(varlen_layout_bad_inputs) {
    const int32_t cu_q[4] = {0, 50, 50, 120}, cu_k[4] = {0, 60, 190, 190};
    const int32_t bad_q[4] = {0, 50, 40, 120}, first_q[4] = {3, 50, 50, 120};
    const sk_varlen_grid good = {3, 64, 64, 2, cu_q, cu_k};
    sk_varlen_grid g = good;
    sk_layout_t out = OUT_SENTINEL;

    expect_layout(sk_layout_create_varlen_causal(&out, NULL), out, SK_STATUS_BAD_PARAM_NULL_POINTER,
                  "sk_layout_create_varlen_causal", "grid must not be NULL");
    g.batch = 0;
    expect_layout(sk_layout_create_varlen_dense(&out, &g), out, SK_STATUS_BAD_PARAM_SHAPE,
                  "sk_layout_create_varlen_dense", "grid->batch = 0");
    g = good;
    g.cu_seqlens_k = NULL;
    expect_layout(sk_layout_create_varlen_window(&out, &g, 1, 1), out,
                  SK_STATUS_BAD_PARAM_NULL_POINTER, "sk_layout_create_varlen_window",
                  "cu_seqlens_k");
    g = good;
    g.cu_seqlens_q = bad_q;
    expect_layout(sk_layout_create_varlen_random(&out, &g, 1, 0, 0), out, SK_STATUS_BAD_PARAM_SHAPE,
                  "sk_layout_create_varlen_random", "cu_seqlens_q[2] = 40");
    g.cu_seqlens_q = first_q;
    expect_layout(sk_layout_create_varlen_causal(&out, &g), out, SK_STATUS_BAD_PARAM_SHAPE,
                  "sk_layout_create_varlen_causal", "cu_seqlens_q[0] = 3");
    g = good;
    g.cu_seqlens_q = (const int32_t *)(const void *)((const char *)cu_q + 2);
    expect_layout(sk_layout_create_varlen_causal(&out, &g), out, SK_STATUS_BAD_PARAM_ALIGNMENT,
                  "sk_layout_create_varlen_causal", "grid->cu_seqlens_q");
    g = good;
    g.block_cols = 96;
    expect_layout(sk_layout_create_varlen_dense(&out, &g), out, SK_STATUS_BAD_PARAM_VALUE,
                  "sk_layout_create_varlen_dense", "block_cols = 96");
    g = good;
    g.heads = 0;
    expect_layout(sk_layout_create_varlen_dense(&out, &g), out, SK_STATUS_BAD_PARAM_SHAPE,
                  "sk_layout_create_varlen_dense", "heads = 0");
    expect_layout(sk_layout_create_varlen_window(&out, &good, -1, 0), out,
                  SK_STATUS_BAD_PARAM_VALUE, "sk_layout_create_varlen_window", "left = -1");
    expect_layout(sk_layout_create_varlen_sinks_window(&out, &good, 4, 0), out,
                  SK_STATUS_BAD_PARAM_VALUE, "sk_layout_create_varlen_sinks_window",
                  "window_tokens = 0");
    expect_layout(sk_layout_create_varlen_random(&out, &good, -2, 0, 1), out,
                  SK_STATUS_BAD_PARAM_VALUE, "sk_layout_create_varlen_random", "k = -2");
    expect_layout(sk_layout_create_varlen_causal(NULL, &good), out,
                  SK_STATUS_BAD_PARAM_NULL_POINTER, "sk_layout_create_varlen_causal", "out");

    /* Masks: heads 2 x (1 x 1 + 0 + 2 x 0) = 2 bytes needed. */
    const uint8_t masks[2] = {1, 1};
    expect_layout(sk_layout_create_varlen_from_masks(&out, &good, NULL, 2), out,
                  SK_STATUS_BAD_PARAM_NULL_POINTER, "sk_layout_create_varlen_from_masks", "masks");
    expect_layout(sk_layout_create_varlen_from_masks(&out, &good, masks, 1), out,
                  SK_STATUS_BAD_PARAM_SHAPE, "sk_layout_create_varlen_from_masks",
                  "mask_bytes = 1");

    /* Layouts: sequence 0 needs 50 x 60 tokens, heads 2. */
    sk_layout_t seq0 = NULL;
    const sk_grid g0 = tu_grid(50, 60, 64, 64, 1, 2), g0_wrong = tu_grid(50, 61, 64, 64, 1, 2);
    REQUIRE(sk_layout_create_dense(&seq0, &g0) == SK_STATUS_SUCCESS, "%s", sk_last_error());
    sk_bsr v0;
    sk_layout_view(seq0, &v0);
    sk_bsr wrong = v0;
    wrong.grid = g0_wrong;
    const sk_bsr *list[3] = {&wrong, NULL, NULL};
    expect_layout(sk_layout_create_varlen_from_layouts(&out, &good, list), out,
                  SK_STATUS_BAD_LAYOUT_MISMATCH, "sk_layout_create_varlen_from_layouts",
                  "layouts[0] grid is 50 x 61");
    list[0] = &v0;
    list[2] = &v0; /* sequence 2 has no key */
    expect_layout(sk_layout_create_varlen_from_layouts(&out, &good, list), out,
                  SK_STATUS_BAD_LAYOUT_MISMATCH, "sk_layout_create_varlen_from_layouts",
                  "layouts[2] must be NULL");
    list[2] = NULL;
    sk_bsr broken = v0;
    broken.nnz = v0.nnz + 1;
    list[0] = &broken;
    expect_layout(sk_layout_create_varlen_from_layouts(&out, &good, list), out,
                  SK_STATUS_BAD_LAYOUT_COUNT, "sk_layout_create_varlen_from_layouts",
                  "layouts[0]: layout->row_offsets[2]");
    expect_layout(sk_layout_create_varlen_from_layouts(&out, &good, NULL), out,
                  SK_STATUS_BAD_PARAM_NULL_POINTER, "sk_layout_create_varlen_from_layouts",
                  "layouts");

    /* Validation and the grid helper. */
    list[0] = &v0;
    sk_layout_t made = NULL;
    REQUIRE(sk_layout_create_varlen_from_layouts(&made, &good, list) == SK_STATUS_SUCCESS, "%s",
            sk_last_error());
    sk_bsr v;
    sk_layout_view(made, &v);
    CHECK(sk_layout_validate_varlen(&v, &good) == SK_STATUS_SUCCESS, "%s", sk_last_error());
    sk_varlen_grid other = good;
    other.heads = 1;
    expect_layout(sk_layout_validate_varlen(&v, &other), out, SK_STATUS_BAD_LAYOUT_MISMATCH,
                  "sk_layout_validate_varlen", "heads 2");
    const int32_t longer_k[4] = {0, 10, 190, 190}; /* sequence 0: 10 keys, still one block */
    other = good;
    other.cu_seqlens_k = longer_k;
    CHECK(sk_layout_validate_varlen(&v, &other) == SK_STATUS_SUCCESS, "10 keys: one block: %s",
          sk_last_error());
    const int32_t more_q[4] = {0, 50, 50, 200}; /* sequence 2 needs 3 rows */
    other = good;
    other.cu_seqlens_q = more_q;
    expect_layout(sk_layout_validate_varlen(&v, &other), out, SK_STATUS_BAD_LAYOUT_MISMATCH,
                  "sk_layout_validate_varlen", "need 4");
    sk_grid lg;
    expect_layout(sk_varlen_layout_grid(&good, NULL), out, SK_STATUS_BAD_PARAM_NULL_POINTER,
                  "sk_varlen_layout_grid", "layout_grid");
    g = good;
    g.cu_seqlens_q = bad_q;
    expect_layout(sk_varlen_layout_grid(&g, &lg), out, SK_STATUS_BAD_PARAM_SHAPE,
                  "sk_varlen_layout_grid", "negative length");
    sk_layout_destroy(made);
    sk_layout_destroy(seq0);
}
