/*
 * test_backward_bad_inputs.c - every bad input of the attention backward
 * gets its exact status, a message naming the call and the argument, and
 * leaves every buffer byte-identical (the style of test_bad_inputs.c).
 *
 * Each test starts from a valid call (checked by
 * backward_bad_input_fixture_is_valid), breaks one thing, and checks the
 * status, that sk_last_error() names the entry point and contains a word
 * naming the problem, that dQ, dK, dV (pre-filled with a 0xA5 sentinel),
 * the inputs, both descriptors and *workspace_bytes are unchanged. The
 * CUDA backend gets the same statuses for bad arguments (its checks are
 * the core's), and SK_STATUS_NOT_SUPPORTED naming head_dim (or
 * NOT_SUPPORTED_BACKEND in a build without CUDA) for the fixture's valid
 * call, whose head_dim 16 its kernels do not take.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/harness.h"
#include "common/naive_ref.h"
#include "common/packed_fixture.h"
#include "common/test_util.h"
#include "sparsek.h"

enum { NBUF = 9 };

typedef enum bcall { B_RUN, B_BACKWARD, B_WORKSPACE_SIZE, B_PLAN, B_INIT } bcall;

static const char *bcall_name(bcall c) {
    static const char *const names[5] = {
        "sk_attention_backward_run", "sk_attention_backward", "sk_attention_backward_workspace_size",
        "sk_attention_backward_plan", "sk_attention_backward_desc_init"};
    return names[c];
}

/* A valid call: B=1, Sq=100, Sk=130, Hq=8, Hkv=2, D=16, F16, CPU, a dense
 * layout per KV head. Buffers: q, k, v, o, dout, lse (inputs), dq, dk, dv. */
typedef struct bfix {
    sk_attention_desc desc;
    const sk_attention_desc *desc_arg;
    sk_attention_backward_desc bwd;
    sk_attention_backward_desc *bwd_arg;
    sk_bsr layout;
    const sk_bsr *layout_arg;
    pk_buffers b; /* the nine buffers, their snapshots and arguments */
    size_t ws_bytes;
    size_t *ws_arg;
    size_t init_size;
} bfix;

enum { IQ, IK, IV, IO, IDOUT, ILSE, IDQ, IDK, IDV };
static const char *const buf_names[NBUF] = {"q", "k", "v", "o", "dout", "lse", "dq", "dk", "dv"};

static int fix_init(bfix *f) {
    memset(f, 0, sizeof *f);
    tu_rng rng;
    tu_rng_seed(&rng, tu_base_seed() + 29);
    if (sk_attention_desc_init(&f->desc, sizeof f->desc) != SK_STATUS_SUCCESS ||
        sk_attention_backward_desc_init(&f->bwd, sizeof f->bwd) != SK_STATUS_SUCCESS)
        return 0;
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
    const sk_grid grid = tu_grid(100, 130, 64, 64, 1, 2);
    if (nr_bsr_from_mask(&f->layout, &grid, mask) != 0) return 0;
    const size_t qn = 100 * 8 * 16 * 2, kn = 130 * 2 * 16 * 2;
    const size_t bytes[NBUF] = {qn, kn, kn, qn, qn, 8 * 100 * 4, qn, kn, kn};
    /* Inputs: small finite fp16 / fp32 values; dq, dk, dv: the sentinel. */
    if (!pk_alloc(&f->b, NBUF, bytes, buf_names, IDQ, &rng)) return 0;
    f->desc_arg = &f->desc;
    f->bwd_arg = &f->bwd;
    f->layout_arg = &f->layout;
    f->ws_bytes = 12345;
    f->ws_arg = &f->ws_bytes;
    f->init_size = sizeof(sk_attention_backward_desc);
    return 1;
}

static void fix_free(bfix *f) {
    nr_bsr_free(&f->layout);
    pk_free(&f->b);
}

static sk_status fix_call(bfix *f, bcall call) {
    void *const *a = f->b.arg;
    switch (call) {
    case B_RUN:
        return sk_attention_backward_run(f->desc_arg, f->bwd_arg, f->layout_arg, a[IQ], a[IK],
                                         a[IV], a[IO], a[IDOUT], (const float *)a[ILSE], a[IDQ],
                                         a[IDK], a[IDV], NULL, 0, NULL);
    case B_BACKWARD:
        return sk_attention_backward(f->desc_arg, f->bwd_arg, f->layout_arg, a[IQ], a[IK], a[IV],
                                     a[IO], a[IDOUT], (const float *)a[ILSE], a[IDQ], a[IDK],
                                     a[IDV], NULL, 0, NULL);
    case B_WORKSPACE_SIZE:
        return sk_attention_backward_workspace_size(f->desc_arg, f->bwd_arg, f->layout_arg,
                                                    f->ws_arg);
    case B_PLAN:
        return sk_attention_backward_plan(f->desc_arg, f->bwd_arg, f->layout_arg, NULL, 0, NULL);
    case B_INIT:
        return sk_attention_backward_desc_init(f->bwd_arg, f->init_size);
    }
    return SK_STATUS_INTERNAL_ERROR;
}

/* Call, then check status, message and untouched buffers and descriptors.
 * want2, when not SUCCESS, is a second acceptable status. */
static void expect2(bfix *f, bcall call, sk_status want, sk_status want2, const char *needle) {
    pk_snapshot(&f->b, NULL);
    const sk_attention_desc desc_before = f->desc;
    const sk_attention_backward_desc bwd_before = f->bwd;
    const sk_status got = fix_call(f, call);
    pk_expect(&f->b, NULL, bcall_name(call), got, want, want2, needle);
    CHECK(f->ws_bytes == 12345, "workspace_bytes was written: %zu", f->ws_bytes);
    CHECK(memcmp(&desc_before, &f->desc, sizeof desc_before) == 0, "desc was written");
    if (call != B_INIT)
        CHECK(memcmp(&bwd_before, &f->bwd, sizeof bwd_before) == 0, "bwd was written");
}

static void expect(bfix *f, bcall call, sk_status want, const char *needle) {
    expect2(f, call, want, SK_STATUS_SUCCESS, needle);
}

#define BAD_BWD(name, call, want, needle, ...)                                                     \
    SK_TEST(backward_bad_input_##name) {                                                           \
        bfix fx;                                                                                   \
        bfix *FIX = &fx;                                                                           \
        if (!fix_init(FIX)) {                                                                      \
            CHECK(0, "fixture: out of memory");                                                    \
            fix_free(FIX);                                                                         \
            return;                                                                                \
        }                                                                                          \
        __VA_ARGS__;                                                                               \
        expect(FIX, call, want, needle);                                                           \
        fix_free(FIX);                                                                             \
    }

SK_TEST(backward_bad_input_fixture_is_valid) {
    bfix f;
    if (!fix_init(&f)) {
        CHECK(0, "out of memory");
        fix_free(&f);
        return;
    }
    const bcall calls[4] = {B_RUN, B_BACKWARD, B_WORKSPACE_SIZE, B_PLAN};
    for (int i = 0; i < 4; ++i) {
        const sk_status st = fix_call(&f, calls[i]);
        CHECK(st == SK_STATUS_SUCCESS, "%s: %s %s", bcall_name(calls[i]), sk_status_name(st),
              sk_last_error());
    }
    CHECK(f.ws_bytes == 0, "CPU workspace %zu", f.ws_bytes);
    CHECK(f.bwd.deterministic == 1, "deterministic defaults to %d", (int)f.bwd.deterministic);
    /* The run really wrote every element of dQ, dK, dV (fp16 0xA5A5 is
     * not a possible result here). */
    for (int i = IDQ; i <= IDV; ++i) {
        const size_t untouched = pk_untouched(&f.b, i, 2);
        CHECK(untouched == 0, "%zu elements of %s not written", untouched, buf_names[i]);
    }
    fix_free(&f);
}

/* The descriptors. */
BAD_BWD(null_desc, B_RUN, SK_STATUS_BAD_PARAM_NULL_POINTER, "desc", FIX->desc_arg = NULL)
BAD_BWD(null_bwd, B_BACKWARD, SK_STATUS_BAD_PARAM_NULL_POINTER, "bwd must not be NULL",
        FIX->bwd_arg = NULL)
BAD_BWD(null_bwd_plan, B_PLAN, SK_STATUS_BAD_PARAM_NULL_POINTER, "bwd", FIX->bwd_arg = NULL)
BAD_BWD(bwd_not_initialised, B_RUN, SK_STATUS_BAD_PARAM_STRUCT_SIZE,
        "sk_attention_backward_desc_init", FIX->bwd.struct_size = 0)
BAD_BWD(bwd_init_wrong_size, B_INIT, SK_STATUS_BAD_PARAM_STRUCT_SIZE, "struct_size",
        FIX->init_size = sizeof(sk_attention_backward_desc) - 8)
BAD_BWD(bwd_init_null, B_INIT, SK_STATUS_BAD_PARAM_NULL_POINTER, "bwd", FIX->bwd_arg = NULL)
BAD_BWD(deterministic_2, B_WORKSPACE_SIZE, SK_STATUS_BAD_PARAM_VALUE, "deterministic",
        FIX->bwd.deterministic = 2)
BAD_BWD(deterministic_negative, B_RUN, SK_STATUS_BAD_PARAM_VALUE, "deterministic",
        FIX->bwd.deterministic = -1)
/* The forward's checks, through the forward's descriptor. */
BAD_BWD(desc_not_initialised, B_BACKWARD, SK_STATUS_BAD_PARAM_STRUCT_SIZE, "struct_size",
        FIX->desc.struct_size = 0)
BAD_BWD(bad_dtype, B_RUN, SK_STATUS_BAD_PARAM_DTYPE, "dtype", FIX->desc.dtype = (sk_dtype)7)
BAD_BWD(f32_on_cuda, B_PLAN, SK_STATUS_BAD_PARAM_DTYPE, "F32", FIX->desc.dtype = SK_DTYPE_F32;
        FIX->desc.backend = SK_BACKEND_CUDA)
BAD_BWD(heads_q_not_multiple, B_RUN, SK_STATUS_BAD_PARAM_SHAPE, "heads_kv",
        FIX->desc.heads_kv = 3)
BAD_BWD(scale_nan, B_BACKWARD, SK_STATUS_BAD_PARAM_VALUE, "scale", FIX->desc.scale = NAN)
BAD_BWD(mask_7, B_RUN, SK_STATUS_BAD_PARAM_VALUE, "mask", FIX->desc.mask = (sk_mask)7)
BAD_BWD(layout_grid_mismatch, B_RUN, SK_STATUS_BAD_LAYOUT_MISMATCH, "seq_q",
        FIX->desc.seq_q = 200)
BAD_BWD(null_layout, B_PLAN, SK_STATUS_BAD_PARAM_NULL_POINTER, "layout", FIX->layout_arg = NULL)
BAD_BWD(null_workspace_bytes, B_WORKSPACE_SIZE, SK_STATUS_BAD_PARAM_NULL_POINTER,
        "workspace_bytes", FIX->ws_arg = NULL)
BAD_BWD(layout_unsorted, B_RUN, SK_STATUS_BAD_LAYOUT_UNSORTED, "col_indices",
        FIX->layout.col_indices[3] = 1;
        FIX->layout.col_indices[4] = 0)
BAD_BWD(layout_count_differs_from_nnz, B_PLAN, SK_STATUS_BAD_LAYOUT_COUNT, "nnz",
        FIX->layout.nnz -= 1)
/* Pointers. */
BAD_BWD(null_q, B_RUN, SK_STATUS_BAD_PARAM_NULL_POINTER, "q must not be NULL",
        FIX->b.arg[IQ] = NULL)
BAD_BWD(null_o, B_BACKWARD, SK_STATUS_BAD_PARAM_NULL_POINTER, "o must not be NULL",
        FIX->b.arg[IO] = NULL)
BAD_BWD(null_dout, B_RUN, SK_STATUS_BAD_PARAM_NULL_POINTER, "dout must not be NULL",
        FIX->b.arg[IDOUT] = NULL)
BAD_BWD(null_lse, B_RUN, SK_STATUS_BAD_PARAM_NULL_POINTER, "lse must not be NULL",
        FIX->b.arg[ILSE] = NULL)
BAD_BWD(null_dq, B_BACKWARD, SK_STATUS_BAD_PARAM_NULL_POINTER, "dq must not be NULL",
        FIX->b.arg[IDQ] = NULL)
BAD_BWD(null_dk, B_RUN, SK_STATUS_BAD_PARAM_NULL_POINTER, "dk must not be NULL",
        FIX->b.arg[IDK] = NULL)
BAD_BWD(null_dv, B_RUN, SK_STATUS_BAD_PARAM_NULL_POINTER, "dv must not be NULL",
        FIX->b.arg[IDV] = NULL)
/* Strides and extents. */
BAD_BWD(negative_dout_stride, B_RUN, SK_STATUS_BAD_PARAM_STRIDE, "dout stride over seq",
        FIX->bwd.dout_strides[0] = 100 * 128;
        FIX->bwd.dout_strides[1] = -128; FIX->bwd.dout_strides[2] = 16)
/* Two query heads share a dQ row: head stride 8 < D = 16. */
BAD_BWD(overlapping_dq_strides, B_BACKWARD, SK_STATUS_BAD_PARAM_STRIDE, "dq stride over head",
        FIX->bwd.dq_strides[0] = 100 * 64;
        FIX->bwd.dq_strides[1] = 64; FIX->bwd.dq_strides[2] = 8)
/* Every token of dK at one place: seq stride 0. */
BAD_BWD(overlapping_dk_strides, B_RUN, SK_STATUS_BAD_PARAM_STRIDE, "dk stride over seq",
        FIX->bwd.dk_strides[0] = 130 * 32;
        FIX->bwd.dk_strides[1] = 0; FIX->bwd.dk_strides[2] = 16)
BAD_BWD(dv_extent_overflow, B_RUN, SK_STATUS_BAD_PARAM_OVERFLOW, "dv",
        FIX->bwd.dv_strides[0] = 0;
        FIX->bwd.dv_strides[1] = INT64_MAX / 64; FIX->bwd.dv_strides[2] = 16)
/* O is the forward's output: its strides must be an output's. */
BAD_BWD(overlapping_o_strides, B_RUN, SK_STATUS_BAD_PARAM_STRIDE, "o stride over head",
        FIX->desc.o_strides[0] = 100 * 64;
        FIX->desc.o_strides[1] = 64; FIX->desc.o_strides[2] = 8)
/* Alignment. */
BAD_BWD(misaligned_dout, B_RUN, SK_STATUS_BAD_PARAM_ALIGNMENT, "dout = ",
        FIX->b.arg[IDOUT] = FIX->b.p[IDOUT] + 1)
BAD_BWD(misaligned_dq, B_BACKWARD, SK_STATUS_BAD_PARAM_ALIGNMENT, "dq = ",
        FIX->b.arg[IDQ] = FIX->b.p[IDQ] + 1)
BAD_BWD(misaligned_dk, B_RUN, SK_STATUS_BAD_PARAM_ALIGNMENT, "dk = ",
        FIX->b.arg[IDK] = FIX->b.p[IDK] + 1)
BAD_BWD(misaligned_dv, B_RUN, SK_STATUS_BAD_PARAM_ALIGNMENT, "dv = ",
        FIX->b.arg[IDV] = FIX->b.p[IDV] + 1)
BAD_BWD(misaligned_lse, B_RUN, SK_STATUS_BAD_PARAM_ALIGNMENT, "lse = ",
        FIX->b.arg[ILSE] = FIX->b.p[ILSE] + 2)
/* Aliasing (the full table is in test_aliasing.c). Each overlapping
 * buffer stays inside the allocation it overlaps (16 spare bytes), so the
 * heap's placement of the other buffers cannot change which pair is named. */
BAD_BWD(dq_overlaps_q, B_RUN, SK_STATUS_BAD_PARAM_STRIDE, "dq overlaps q",
        FIX->b.arg[IDQ] = FIX->b.p[IQ] + 16)
BAD_BWD(dk_overlaps_dv, B_BACKWARD, SK_STATUS_BAD_PARAM_STRIDE, "dk overlaps dv",
        FIX->b.arg[IDV] = FIX->b.p[IDK] + 32)
BAD_BWD(dv_overlaps_lse, B_RUN, SK_STATUS_BAD_PARAM_STRIDE, "dv overlaps lse",
        FIX->b.arg[ILSE] = FIX->b.p[IDV] + 256)
BAD_BWD(dq_overlaps_dout, B_RUN, SK_STATUS_BAD_PARAM_STRIDE, "dq overlaps dout",
        FIX->b.arg[IDQ] = FIX->b.p[IDOUT] + 2)

/* Inputs may overlap each other: dO given as O itself, K as V, and LSE
 * inside Q are accepted (O and LSE are read here, not written). */
SK_TEST(backward_inputs_may_overlap) {
    bfix f;
    if (!fix_init(&f)) {
        CHECK(0, "out of memory");
        fix_free(&f);
        return;
    }
    f.b.arg[IDOUT] = f.b.arg[IO];
    f.b.arg[IK] = f.b.arg[IV];
    f.b.arg[ILSE] = f.b.arg[IQ];
    const sk_status st = fix_call(&f, B_RUN);
    CHECK(st == SK_STATUS_SUCCESS, "%s: %s", sk_status_name(st), sk_last_error());
    fix_free(&f);
}

/* The CUDA backends: a bad argument gets the CPU's status (the checks are
 * the core's and come first); the valid call with head_dim 16, which the
 * CUDA kernels do not take, SK_STATUS_NOT_SUPPORTED naming head_dim (or,
 * in a build without CUDA, NOT_SUPPORTED_BACKEND). Nothing is written
 * either way; host pointers are fine, as no device is touched. With
 * head_dim 64 the workspace size needs no device either. */
SK_TEST(backward_cuda_declines_before_the_device) {
    static const sk_backend backends[3] = {SK_BACKEND_CUDA, SK_BACKEND_CUDA_SM80,
                                           SK_BACKEND_CUDA_SM90};
    int32_t devices = -1;
    CHECK(sk_device_count(&devices) == SK_STATUS_SUCCESS, "%s", sk_last_error());
    /* sk_build_info() ends "no CUDA" in a build without CUDA. */
    const int has_cuda = strstr(sk_build_info(), "no CUDA") == NULL;
    for (int bi = 0; bi < 3; ++bi) {
        bfix f;
        if (!fix_init(&f)) {
            CHECK(0, "out of memory");
            fix_free(&f);
            return;
        }
        f.desc.backend = backends[bi];
        f.desc.head_dim = 0;
        expect(&f, B_RUN, SK_STATUS_BAD_PARAM_SHAPE, "head_dim");
        f.desc.head_dim = 16;
        f.bwd.deterministic = 3;
        expect(&f, B_BACKWARD, SK_STATUS_BAD_PARAM_VALUE, "deterministic");
        f.bwd.deterministic = 1;
        f.b.arg[IDQ] = f.b.p[IQ]; /* dq overlaps q */
        expect(&f, B_RUN, SK_STATUS_BAD_PARAM_STRIDE, "dq overlaps q");
        f.b.arg[IDQ] = f.b.p[IDQ];
        f.b.arg[IDK] = f.b.p[IDK] + 2; /* CUDA wants 16-byte tensors */
        expect(&f, B_RUN, SK_STATUS_BAD_PARAM_ALIGNMENT, "dk = ");
        f.b.arg[IDK] = f.b.p[IDK];
        const bcall calls[4] = {B_RUN, B_BACKWARD, B_WORKSPACE_SIZE, B_PLAN};
        for (int i = 0; i < 4; ++i)
            expect2(&f, calls[i], has_cuda ? SK_STATUS_NOT_SUPPORTED : SK_STATUS_NOT_SUPPORTED_BACKEND,
                    SK_STATUS_SUCCESS, has_cuda ? "head_dim = 16" : "without CUDA");
        f.desc.head_dim = 64;
        size_t bytes = 0;
        const sk_status st = sk_attention_backward_workspace_size(&f.desc, &f.bwd, &f.layout, &bytes);
        if (has_cuda)
            CHECK(st == SK_STATUS_SUCCESS && bytes > 0, "head_dim 64: %s, %zu bytes (%s)",
                  sk_status_name(st), bytes, sk_last_error());
        else
            CHECK(st == SK_STATUS_NOT_SUPPORTED_BACKEND, "head_dim 64 without CUDA: %s",
                  sk_status_name(st));
        fix_free(&f);
    }
}
