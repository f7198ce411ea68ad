/*
 * test_bad_inputs.c - every bad input gets its exact status, a message that
 * names the problem, and leaves every buffer byte-identical.
 *
 * Each test starts from a valid call (a fixture that succeeds as is, checked
 * by bad_input_fixtures_are_valid), breaks one thing, and checks:
 *   - the status, exactly;
 *   - sk_last_error() names the call and contains a word naming the problem;
 *   - O, LSE and C (pre-filled with a 0xA5 byte sentinel), and the inputs,
 *     are byte-identical afterwards; so is *workspace_bytes.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/harness.h"
#include "common/naive_ref.h"
#include "common/test_util.h"
#include "sparsek.h"

enum { SENTINEL = 0xA5 };

typedef enum api_call {
    CALL_RUN,
    CALL_FORWARD,
    CALL_WORKSPACE_SIZE,
    CALL_PLAN,
    CALL_DESC_INIT
} api_call;

static const char *call_name(api_call c) {
    switch (c) {
    case CALL_RUN:
        return "sk_attention_run";
    case CALL_FORWARD:
        return "sk_attention_forward";
    case CALL_WORKSPACE_SIZE:
        return "sk_attention_workspace_size";
    case CALL_PLAN:
        return "sk_attention_plan";
    case CALL_DESC_INIT:
        return "sk_attention_desc_init";
    }
    return "?";
}

/* A byte buffer and its snapshot. */
typedef struct buf {
    unsigned char *p, *copy;
    size_t bytes;
} buf;

static int buf_alloc(buf *b, size_t bytes, int fill_random, tu_rng *rng) {
    b->bytes = bytes;
    b->p = (unsigned char *)malloc(bytes + 16);
    b->copy = (unsigned char *)malloc(bytes + 16);
    if (b->p == NULL || b->copy == NULL) return 0;
    for (size_t i = 0; i < bytes + 16; ++i)
        b->p[i] = fill_random ? (unsigned char)(tu_rng_next(rng) & 0x3f) : SENTINEL;
    return 1;
}

static void buf_snapshot(buf *b) {
    memcpy(b->copy, b->p, b->bytes + 16);
}
static int buf_unchanged(const buf *b) {
    return memcmp(b->copy, b->p, b->bytes + 16) == 0;
}
static void buf_free(buf *b) {
    free(b->p);
    free(b->copy);
}

/* ---------------------------------------------------------------------------
 * Attention: a valid call (B=1, Sq=100, Sk=130, Hq=8, Hkv=2, D=16, F16, CPU,
 * a dense layout per KV head), then one thing broken.
 * ------------------------------------------------------------------------- */

typedef struct attn_fixture {
    sk_attention_desc desc;
    const sk_attention_desc *desc_arg;
    sk_bsr layout;
    const sk_bsr *layout_arg;
    buf q, k, v, o, lse;
    const void *q_arg, *k_arg, *v_arg;
    void *o_arg;
    float *lse_arg;
    size_t ws_bytes;
    size_t *ws_arg;
    size_t init_size; /* struct_size passed by CALL_DESC_INIT */
} attn_fixture;

static int attn_fixture_init(attn_fixture *f) {
    memset(f, 0, sizeof *f);
    tu_rng rng;
    tu_rng_seed(&rng, tu_base_seed());
    if (sk_attention_desc_init(&f->desc, sizeof f->desc) != SK_STATUS_SUCCESS) return 0;
    f->desc.backend = SK_BACKEND_CPU;
    f->desc.dtype = SK_DTYPE_F16;
    f->desc.batch = 1;
    f->desc.seq_q = 100;
    f->desc.seq_k = 130;
    f->desc.heads_q = 8;
    f->desc.heads_kv = 2;
    f->desc.head_dim = 16;
    uint8_t mask[2 * 2 * 3];
    memset(mask, 1, sizeof mask);
    sk_grid grid = {100, 130, 64, 64, 1, 2};
    if (nr_bsr_from_mask(&f->layout, &grid, mask) != 0) return 0;
    const size_t qn = 100 * 8 * 16, kn = 130 * 2 * 16;
    if (!buf_alloc(&f->q, qn * 2, 1, &rng) || !buf_alloc(&f->k, kn * 2, 1, &rng) ||
        !buf_alloc(&f->v, kn * 2, 1, &rng) || !buf_alloc(&f->o, qn * 2, 0, &rng) ||
        !buf_alloc(&f->lse, 8 * 100 * 4, 0, &rng))
        return 0;
    f->desc_arg = &f->desc;
    f->layout_arg = &f->layout;
    f->q_arg = f->q.p;
    f->k_arg = f->k.p;
    f->v_arg = f->v.p;
    f->o_arg = f->o.p;
    f->lse_arg = (float *)(void *)f->lse.p;
    f->ws_bytes = 12345;
    f->ws_arg = &f->ws_bytes;
    f->init_size = sizeof(sk_attention_desc);
    return 1;
}

static void attn_fixture_free(attn_fixture *f) {
    nr_bsr_free(&f->layout);
    buf_free(&f->q), buf_free(&f->k), buf_free(&f->v), buf_free(&f->o), buf_free(&f->lse);
}

static sk_status attn_call(attn_fixture *f, api_call call) {
    switch (call) {
    case CALL_RUN:
        return sk_attention_run(f->desc_arg, f->layout_arg, f->q_arg, f->k_arg, f->v_arg, f->o_arg,
                                f->lse_arg, NULL, 0, NULL);
    case CALL_FORWARD:
        return sk_attention_forward(f->desc_arg, f->layout_arg, f->q_arg, f->k_arg, f->v_arg,
                                    f->o_arg, f->lse_arg, NULL, 0, NULL);
    case CALL_WORKSPACE_SIZE:
        return sk_attention_workspace_size(f->desc_arg, f->layout_arg, f->ws_arg);
    case CALL_PLAN:
        return sk_attention_plan(f->desc_arg, f->layout_arg, NULL, 0, NULL);
    case CALL_DESC_INIT:
        return sk_attention_desc_init((sk_attention_desc *)(void *)f->desc_arg, f->init_size);
    }
    return SK_STATUS_INTERNAL_ERROR;
}

/* Call, then check status, message and untouched buffers. */
static void expect_attn(attn_fixture *f, api_call call, sk_status want, const char *needle) {
    buf *all[5] = {&f->q, &f->k, &f->v, &f->o, &f->lse};
    for (int i = 0; i < 5; ++i) buf_snapshot(all[i]);
    sk_attention_desc desc_before = f->desc;
    const sk_status got = attn_call(f, call);
    const char *msg = sk_last_error();
    CHECK(got == want, "%s: got %s, want %s (%s)", call_name(call), sk_status_name(got),
          sk_status_name(want), msg);
    CHECK(strstr(msg, call_name(call)) != NULL, "message does not name %s: \"%s\"", call_name(call),
          msg);
    CHECK(strstr(msg, needle) != NULL, "message does not mention \"%s\": \"%s\"", needle, msg);
    static const char *const names[5] = {"q", "k", "v", "o", "lse"};
    for (int i = 0; i < 5; ++i)
        CHECK(buf_unchanged(all[i]), "%s: buffer %s was written", call_name(call), names[i]);
    CHECK(f->ws_bytes == 12345, "workspace_bytes was written: %zu", f->ws_bytes);
    if (call != CALL_DESC_INIT)
        CHECK(memcmp(&desc_before, &f->desc, sizeof desc_before) == 0, "desc was written");
}

/* One test per bad input: FIX is the fixture, BREAK the statements that
 * break it. */
/* A view of `l` whose row_offsets (which == 0) or col_indices (which == 1)
 * sit one byte past a 4-byte boundary: copies in static storage, so the
 * fixture's own arrays stay what its free expects. */
static const sk_bsr *misaligned_layout(const sk_bsr *l, int which) {
    static int64_t words[1 << 13]; /* 8-byte aligned */
    unsigned char *storage = (unsigned char *)words;
    static sk_bsr view;
    int32_t slices = 0, rows = 0;
    if (sk_grid_blocks(&l->grid, &rows, NULL, &slices) != SK_STATUS_SUCCESS) return l;
    const size_t n = which == 0 ? (size_t)slices * (size_t)rows + 1 : (size_t)l->nnz;
    if (n * sizeof(int32_t) + 1 > sizeof words) return l;
    memcpy(storage + 1, which == 0 ? l->row_offsets : l->col_indices, n * sizeof(int32_t));
    view = *l;
    if (which == 0)
        view.row_offsets = (int32_t *)(void *)(storage + 1);
    else
        view.col_indices = (int32_t *)(void *)(storage + 1);
    return &view;
}

#define BAD_ATTN(name, call, want, needle, ...)                                                    \
    SK_TEST(bad_input_attention_##name) {                                                          \
        attn_fixture fx;                                                                           \
        attn_fixture *FIX = &fx;                                                                   \
        if (!attn_fixture_init(FIX)) {                                                             \
            CHECK(0, "fixture: out of memory");                                                    \
            attn_fixture_free(FIX);                                                                \
            return;                                                                                \
        }                                                                                          \
        __VA_ARGS__;                                                                               \
        expect_attn(FIX, call, want, needle);                                                      \
        attn_fixture_free(FIX);                                                                    \
    }

SK_TEST(bad_input_fixtures_are_valid) {
    attn_fixture f;
    if (!attn_fixture_init(&f)) {
        CHECK(0, "out of memory");
        attn_fixture_free(&f);
        return;
    }
    const api_call calls[4] = {CALL_RUN, CALL_FORWARD, CALL_WORKSPACE_SIZE, CALL_PLAN};
    for (int i = 0; i < 4; ++i) {
        const sk_status st = attn_call(&f, calls[i]);
        CHECK(st == SK_STATUS_SUCCESS, "%s: %s %s", call_name(calls[i]), sk_status_name(st),
              sk_last_error());
    }
    CHECK(f.ws_bytes == 0, "CPU workspace %zu", f.ws_bytes);
    /* The run really wrote O (fp16 0xA5A5 is not a possible result here). */
    size_t untouched = 0;
    for (size_t i = 0; i < f.o.bytes; i += 2)
        untouched += f.o.p[i] == SENTINEL && f.o.p[i + 1] == SENTINEL;
    CHECK(untouched == 0, "%zu elements of O not written", untouched);
    attn_fixture_free(&f);
}

BAD_ATTN(null_desc, CALL_RUN, SK_STATUS_BAD_PARAM_NULL_POINTER, "desc", FIX->desc_arg = NULL)
BAD_ATTN(desc_not_initialised, CALL_FORWARD, SK_STATUS_BAD_PARAM_STRUCT_SIZE, "struct_size",
         FIX->desc.struct_size = 0)
/* - 4: sizeof - 8 is the size before v_layout, which older callers pass. */
BAD_ATTN(desc_init_wrong_size, CALL_DESC_INIT, SK_STATUS_BAD_PARAM_STRUCT_SIZE, "struct_size",
         FIX->init_size = sizeof(sk_attention_desc) - 4)
BAD_ATTN(desc_init_null, CALL_DESC_INIT, SK_STATUS_BAD_PARAM_NULL_POINTER, "desc",
         FIX->desc_arg = NULL)
BAD_ATTN(bad_backend, CALL_RUN, SK_STATUS_BAD_PARAM_VALUE, "backend",
         FIX->desc.backend = (sk_backend)9)
BAD_ATTN(bad_dtype, CALL_WORKSPACE_SIZE, SK_STATUS_BAD_PARAM_DTYPE, "dtype",
         FIX->desc.dtype = (sk_dtype)7)
BAD_ATTN(f32_on_cuda, CALL_PLAN, SK_STATUS_BAD_PARAM_DTYPE, "F32", FIX->desc.dtype = SK_DTYPE_F32;
         FIX->desc.backend = SK_BACKEND_CUDA)
BAD_ATTN(batch_zero, CALL_RUN, SK_STATUS_BAD_PARAM_SHAPE, "batch", FIX->desc.batch = 0)
BAD_ATTN(seq_k_negative, CALL_FORWARD, SK_STATUS_BAD_PARAM_SHAPE, "seq_k", FIX->desc.seq_k = -5)
BAD_ATTN(heads_q_not_multiple, CALL_RUN, SK_STATUS_BAD_PARAM_SHAPE, "heads_kv",
         FIX->desc.heads_kv = 3)
BAD_ATTN(head_dim_zero, CALL_RUN, SK_STATUS_BAD_PARAM_SHAPE, "head_dim", FIX->desc.head_dim = 0)
BAD_ATTN(scale_nan, CALL_RUN, SK_STATUS_BAD_PARAM_VALUE, "scale", FIX->desc.scale = NAN)
BAD_ATTN(scale_inf, CALL_PLAN, SK_STATUS_BAD_PARAM_VALUE, "scale", FIX->desc.scale = INFINITY)
BAD_ATTN(mask_7, CALL_RUN, SK_STATUS_BAD_PARAM_VALUE, "mask", FIX->desc.mask = (sk_mask)7)
BAD_ATTN(negative_stride, CALL_RUN, SK_STATUS_BAD_PARAM_STRIDE, "stride",
         FIX->desc.q_strides[0] = 100 * 128;
         FIX->desc.q_strides[1] = -128; FIX->desc.q_strides[2] = 16)
/* Two query heads share an O row: head stride 8 < D = 16. */
BAD_ATTN(overlapping_o_strides, CALL_FORWARD, SK_STATUS_BAD_PARAM_STRIDE, "overlap",
         FIX->desc.o_strides[0] = 100 * 64;
         FIX->desc.o_strides[1] = 64; FIX->desc.o_strides[2] = 8)
BAD_ATTN(stride_extent_overflow, CALL_RUN, SK_STATUS_BAD_PARAM_OVERFLOW, "overflow",
         FIX->desc.k_strides[0] = 0;
         FIX->desc.k_strides[1] = INT64_MAX / 64; FIX->desc.k_strides[2] = 16)
BAD_ATTN(size_overflow, CALL_WORKSPACE_SIZE, SK_STATUS_BAD_PARAM_OVERFLOW, "overflow",
         /* B x S x H x D = 2^20 x 2^20 x 2^20 x 2^20; the grid itself is fine */
         FIX->desc.batch = 1 << 20;
         FIX->desc.seq_q = FIX->desc.seq_k = 1 << 20;
         FIX->desc.heads_q = FIX->desc.heads_kv = 1 << 20; FIX->desc.head_dim = 1 << 20;
         FIX->layout.grid.rows = FIX->layout.grid.cols = 1 << 20; FIX->layout.grid.heads = 1)
BAD_ATTN(layout_grid_mismatch_seq_q, CALL_RUN, SK_STATUS_BAD_LAYOUT_MISMATCH, "seq_q",
         FIX->desc.seq_q = 200)
BAD_ATTN(layout_heads_3, CALL_RUN, SK_STATUS_BAD_LAYOUT_MISMATCH, "heads",
         FIX->layout.grid.heads = 3)
BAD_ATTN(layout_batch_2_for_batch_1, CALL_PLAN, SK_STATUS_BAD_LAYOUT_MISMATCH, "batch",
         FIX->layout.grid.batch = 2)
BAD_ATTN(layout_block_32, CALL_WORKSPACE_SIZE, SK_STATUS_BAD_PARAM_VALUE, "block_rows",
         FIX->layout.grid.block_rows = 32)
BAD_ATTN(null_layout, CALL_PLAN, SK_STATUS_BAD_PARAM_NULL_POINTER, "layout", FIX->layout_arg = NULL)
BAD_ATTN(null_workspace_bytes, CALL_WORKSPACE_SIZE, SK_STATUS_BAD_PARAM_NULL_POINTER,
         "workspace_bytes", FIX->ws_arg = NULL)
BAD_ATTN(null_q, CALL_RUN, SK_STATUS_BAD_PARAM_NULL_POINTER, "q must not be NULL",
         FIX->q_arg = NULL)
BAD_ATTN(null_v, CALL_FORWARD, SK_STATUS_BAD_PARAM_NULL_POINTER, "v must not be NULL",
         FIX->v_arg = NULL)
BAD_ATTN(null_o, CALL_RUN, SK_STATUS_BAD_PARAM_NULL_POINTER, "o must not be NULL",
         FIX->o_arg = NULL)
BAD_ATTN(o_overlaps_q, CALL_RUN, SK_STATUS_BAD_PARAM_STRIDE, "overlaps",
         FIX->o_arg = (void *)(FIX->q.p + 64))
BAD_ATTN(lse_overlaps_o, CALL_FORWARD, SK_STATUS_BAD_PARAM_STRIDE, "lse",
         FIX->lse_arg = (float *)(void *)(FIX->o.p + 256))
BAD_ATTN(misaligned_q_f16, CALL_RUN, SK_STATUS_BAD_PARAM_ALIGNMENT,
         "q = ", FIX->q_arg = FIX->q.p + 1)
BAD_ATTN(misaligned_row_offsets, CALL_RUN, SK_STATUS_BAD_PARAM_ALIGNMENT, "layout->row_offsets",
         FIX->layout_arg = misaligned_layout(&FIX->layout, 0))
BAD_ATTN(misaligned_col_indices, CALL_PLAN, SK_STATUS_BAD_PARAM_ALIGNMENT, "layout->col_indices",
         FIX->layout_arg = misaligned_layout(&FIX->layout, 1))
BAD_ATTN(layout_unsorted, CALL_RUN, SK_STATUS_BAD_LAYOUT_UNSORTED, "col_indices",
         FIX->layout.col_indices[3] = 1;
         FIX->layout.col_indices[4] = 0)
BAD_ATTN(layout_count_differs_from_nnz, CALL_PLAN, SK_STATUS_BAD_LAYOUT_COUNT, "nnz",
         FIX->layout.nnz -= 1)
BAD_ATTN(layout_index_out_of_range, CALL_FORWARD, SK_STATUS_BAD_LAYOUT_INDEX_RANGE, "col_indices",
         FIX->layout.col_indices[2] = 3)

/* CUDA on a machine without a GPU: a bad argument gets the same status as
 * on the CPU (checks come before any device check); a valid one, with no
 * device, NOT_SUPPORTED_BACKEND. Nothing is written either way. */
SK_TEST(bad_input_attention_cuda_without_gpu) {
    int32_t devices = -1;
    CHECK(sk_device_count(&devices) == SK_STATUS_SUCCESS, "%s", sk_last_error());
    attn_fixture f;
    if (!attn_fixture_init(&f)) {
        CHECK(0, "out of memory");
        attn_fixture_free(&f);
        return;
    }
    f.desc.head_dim = 0;
    f.desc.backend = SK_BACKEND_CUDA;
    expect_attn(&f, CALL_RUN, SK_STATUS_BAD_PARAM_SHAPE, "head_dim");
    f.desc.backend = SK_BACKEND_CUDA_SM90;
    expect_attn(&f, CALL_WORKSPACE_SIZE, SK_STATUS_BAD_PARAM_SHAPE, "head_dim");
    f.desc.head_dim = 16;
    f.desc.backend = SK_BACKEND_CUDA;
    if (devices == 0) {
        /* Host pointers are fine here: nothing may be touched without a GPU. */
        /* (The workspace size needs no device, so it may answer.) */
        expect_attn(&f, CALL_PLAN, SK_STATUS_NOT_SUPPORTED_BACKEND, "");
        expect_attn(&f, CALL_RUN, SK_STATUS_NOT_SUPPORTED_BACKEND, "");
        expect_attn(&f, CALL_FORWARD, SK_STATUS_NOT_SUPPORTED_BACKEND, "");
    }
    attn_fixture_free(&f);
}

/* ---------------------------------------------------------------------------
 * BSR GEMM: a valid call (m=100, n=40, k=130, F16 x F16 -> F32, CPU, a dense
 * A with 64 x 64 blocks), then one thing broken.
 * ------------------------------------------------------------------------- */

typedef enum gemm_call {
    GCALL_RUN,
    GCALL_GEMM,
    GCALL_WORKSPACE_SIZE,
    GCALL_PLAN,
    GCALL_INIT
} gemm_call;

static const char *gemm_call_name(gemm_call c) {
    switch (c) {
    case GCALL_RUN:
        return "sk_bsr_gemm_run";
    case GCALL_GEMM:
        return "sk_bsr_gemm";
    case GCALL_WORKSPACE_SIZE:
        return "sk_bsr_gemm_workspace_size";
    case GCALL_PLAN:
        return "sk_bsr_gemm_plan";
    case GCALL_INIT:
        return "sk_bsr_gemm_desc_init";
    }
    return "?";
}

typedef struct gemm_fixture {
    sk_bsr_gemm_desc desc;
    sk_bsr_gemm_desc *desc_arg;
    sk_bsr layout;
    const sk_bsr *layout_arg;
    buf a, b, c;
    const void *a_arg, *b_arg;
    void *c_arg;
    size_t ws_bytes;
    size_t init_size;
} gemm_fixture;

static int gemm_fixture_init(gemm_fixture *f) {
    memset(f, 0, sizeof *f);
    tu_rng rng;
    tu_rng_seed(&rng, tu_base_seed() + 1);
    if (sk_bsr_gemm_desc_init(&f->desc, sizeof f->desc) != SK_STATUS_SUCCESS) return 0;
    f->desc.backend = SK_BACKEND_CPU;
    f->desc.ab_dtype = SK_DTYPE_F16;
    f->desc.c_dtype = SK_DTYPE_F32;
    f->desc.m = 100;
    f->desc.n = 40;
    f->desc.k = 130;
    uint8_t mask[2 * 3];
    memset(mask, 1, sizeof mask);
    sk_grid grid = {100, 130, 64, 64, 1, 1};
    if (nr_bsr_from_mask(&f->layout, &grid, mask) != 0) return 0;
    if (!buf_alloc(&f->a, 6 * 64 * 64 * 2, 1, &rng) || !buf_alloc(&f->b, 130 * 40 * 2, 1, &rng) ||
        !buf_alloc(&f->c, 100 * 40 * 4, 0, &rng))
        return 0;
    f->desc_arg = &f->desc;
    f->layout_arg = &f->layout;
    f->a_arg = f->a.p;
    f->b_arg = f->b.p;
    f->c_arg = f->c.p;
    f->ws_bytes = 12345;
    f->init_size = sizeof(sk_bsr_gemm_desc);
    return 1;
}

static void gemm_fixture_free(gemm_fixture *f) {
    nr_bsr_free(&f->layout);
    buf_free(&f->a), buf_free(&f->b), buf_free(&f->c);
}

static sk_status gemm_call_api(gemm_fixture *f, gemm_call call) {
    switch (call) {
    case GCALL_RUN:
        return sk_bsr_gemm_run(f->desc_arg, f->layout_arg, f->a_arg, f->b_arg, f->c_arg, NULL, 0,
                               NULL);
    case GCALL_GEMM:
        return sk_bsr_gemm(f->desc_arg, f->layout_arg, f->a_arg, f->b_arg, f->c_arg, NULL, 0, NULL);
    case GCALL_WORKSPACE_SIZE:
        return sk_bsr_gemm_workspace_size(f->desc_arg, f->layout_arg, &f->ws_bytes);
    case GCALL_PLAN:
        return sk_bsr_gemm_plan(f->desc_arg, f->layout_arg, NULL, 0, NULL);
    case GCALL_INIT:
        return sk_bsr_gemm_desc_init(f->desc_arg, f->init_size);
    }
    return SK_STATUS_INTERNAL_ERROR;
}

static void expect_gemm(gemm_fixture *f, gemm_call call, sk_status want, const char *needle) {
    buf *all[3] = {&f->a, &f->b, &f->c};
    for (int i = 0; i < 3; ++i) buf_snapshot(all[i]);
    const sk_status got = gemm_call_api(f, call);
    const char *msg = sk_last_error();
    CHECK(got == want, "%s: got %s, want %s (%s)", gemm_call_name(call), sk_status_name(got),
          sk_status_name(want), msg);
    CHECK(strstr(msg, gemm_call_name(call)) != NULL, "message does not name %s: \"%s\"",
          gemm_call_name(call), msg);
    CHECK(strstr(msg, needle) != NULL, "message does not mention \"%s\": \"%s\"", needle, msg);
    static const char *const names[3] = {"a_values", "b", "c"};
    for (int i = 0; i < 3; ++i)
        CHECK(buf_unchanged(all[i]), "%s: buffer %s was written", gemm_call_name(call), names[i]);
    CHECK(f->ws_bytes == 12345, "workspace_bytes was written: %zu", f->ws_bytes);
}

#define BAD_GEMM(name, call, want, needle, ...)                                                    \
    SK_TEST(bad_input_gemm_##name) {                                                               \
        gemm_fixture fx;                                                                           \
        gemm_fixture *FIX = &fx;                                                                   \
        if (!gemm_fixture_init(FIX)) {                                                             \
            CHECK(0, "fixture: out of memory");                                                    \
            gemm_fixture_free(FIX);                                                                \
            return;                                                                                \
        }                                                                                          \
        __VA_ARGS__;                                                                               \
        expect_gemm(FIX, call, want, needle);                                                      \
        gemm_fixture_free(FIX);                                                                    \
    }

SK_TEST(bad_input_gemm_fixture_is_valid) {
    gemm_fixture f;
    if (!gemm_fixture_init(&f)) {
        CHECK(0, "out of memory");
        gemm_fixture_free(&f);
        return;
    }
    const gemm_call calls[4] = {GCALL_RUN, GCALL_GEMM, GCALL_WORKSPACE_SIZE, GCALL_PLAN};
    for (int i = 0; i < 4; ++i) {
        const sk_status st = gemm_call_api(&f, calls[i]);
        CHECK(st == SK_STATUS_SUCCESS, "%s: %s %s", gemm_call_name(calls[i]), sk_status_name(st),
              sk_last_error());
    }
    CHECK(f.ws_bytes == 0, "CPU workspace %zu", f.ws_bytes);
    gemm_fixture_free(&f);
}

BAD_GEMM(null_desc, GCALL_RUN, SK_STATUS_BAD_PARAM_NULL_POINTER, "desc", FIX->desc_arg = NULL)
BAD_GEMM(desc_not_initialised, GCALL_GEMM, SK_STATUS_BAD_PARAM_STRUCT_SIZE, "struct_size",
         FIX->desc.struct_size = 0)
BAD_GEMM(desc_init_wrong_size, GCALL_INIT, SK_STATUS_BAD_PARAM_STRUCT_SIZE, "struct_size",
         FIX->init_size = 1)
BAD_GEMM(null_layout, GCALL_WORKSPACE_SIZE, SK_STATUS_BAD_PARAM_NULL_POINTER, "a_layout",
         FIX->layout_arg = NULL)
BAD_GEMM(null_b, GCALL_RUN, SK_STATUS_BAD_PARAM_NULL_POINTER, "b must not be NULL",
         FIX->b_arg = NULL)
BAD_GEMM(null_a_values, GCALL_GEMM, SK_STATUS_BAD_PARAM_NULL_POINTER, "a_values", FIX->a_arg = NULL)
BAD_GEMM(null_c, GCALL_RUN, SK_STATUS_BAD_PARAM_NULL_POINTER, "c must not be NULL",
         FIX->c_arg = NULL)
BAD_GEMM(ldc_less_than_n, GCALL_RUN, SK_STATUS_BAD_PARAM_STRIDE, "ldc", FIX->desc.ldc = 39)
BAD_GEMM(ldb_less_than_k_col_major, GCALL_PLAN, SK_STATUS_BAD_PARAM_STRIDE, "ldb",
         FIX->desc.b_order = SK_ORDER_COL_MAJOR;
         FIX->desc.ldb = 129)
BAD_GEMM(bad_b_order, GCALL_RUN, SK_STATUS_BAD_PARAM_VALUE, "b_order",
         FIX->desc.b_order = (sk_order)0)
BAD_GEMM(bad_c_dtype, GCALL_WORKSPACE_SIZE, SK_STATUS_BAD_PARAM_DTYPE, "c_dtype",
         FIX->desc.c_dtype = (sk_dtype)0)
BAD_GEMM(f32_ab_on_cuda, GCALL_RUN, SK_STATUS_BAD_PARAM_DTYPE, "F32",
         FIX->desc.ab_dtype = SK_DTYPE_F32;
         FIX->desc.backend = SK_BACKEND_CUDA_SM80)
BAD_GEMM(k_zero, GCALL_RUN, SK_STATUS_BAD_PARAM_SHAPE, "k = 0", FIX->desc.k = 0)
BAD_GEMM(m_mismatches_layout, GCALL_RUN, SK_STATUS_BAD_LAYOUT_MISMATCH, "a_layout",
         FIX->desc.m = 64)
BAD_GEMM(alpha_inf, GCALL_GEMM, SK_STATUS_BAD_PARAM_VALUE, "alpha", FIX->desc.alpha = INFINITY)
BAD_GEMM(beta_nan, GCALL_RUN, SK_STATUS_BAD_PARAM_VALUE, "beta", FIX->desc.beta = NAN)
BAD_GEMM(layout_batch_2, GCALL_RUN, SK_STATUS_BAD_LAYOUT_MISMATCH, "batch",
         FIX->layout.grid.batch = 2)
BAD_GEMM(c_overlaps_b, GCALL_RUN, SK_STATUS_BAD_PARAM_STRIDE, "overlaps",
         FIX->c_arg = (void *)(FIX->b.p + 100))
BAD_GEMM(misaligned_c_f32, GCALL_RUN, SK_STATUS_BAD_PARAM_ALIGNMENT,
         "c = ", FIX->c_arg = (void *)(FIX->c.p + 2))
BAD_GEMM(misaligned_row_offsets, GCALL_GEMM, SK_STATUS_BAD_PARAM_ALIGNMENT,
         "a_layout->row_offsets", FIX->layout_arg = misaligned_layout(&FIX->layout, 0))
BAD_GEMM(misaligned_col_indices, GCALL_RUN, SK_STATUS_BAD_PARAM_ALIGNMENT,
         "a_layout->col_indices", FIX->layout_arg = misaligned_layout(&FIX->layout, 1))
BAD_GEMM(layout_unsorted, GCALL_RUN, SK_STATUS_BAD_LAYOUT_UNSORTED, "col_indices",
         FIX->layout.col_indices[0] = 1;
         FIX->layout.col_indices[1] = 0)
BAD_GEMM(layout_duplicate, GCALL_GEMM, SK_STATUS_BAD_LAYOUT_DUPLICATE, "col_indices",
         FIX->layout.col_indices[1] = 0)
BAD_GEMM(layout_offsets_decrease, GCALL_PLAN, SK_STATUS_BAD_LAYOUT_OFFSETS, "row_offsets",
         FIX->layout.row_offsets[1] = 4;
         FIX->layout.row_offsets[2] = 3)
