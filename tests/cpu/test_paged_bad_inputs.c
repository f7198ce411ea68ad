/*
 * test_paged_bad_inputs.c - every bad input of the paged-KV attention gets
 * its exact status, a message naming the call and the argument, and leaves
 * every buffer byte-identical (the style of test_bad_inputs.c).
 *
 * The fixture is a valid call: B = 3 sequences of (len_q, len_k) (50, 60),
 * (0, 130), (70, 0) as in test_varlen_bad_inputs.c, Hq = 4, Hkv = 2, D =
 * 16, F16, CPU, blocks 64, pages of 32 tokens, 8 pages, a page table of 5
 * columns with row stride 6 whose unused entries hold garbage, a layout per
 * KV head (sequence 0's row selects its one key block). Each test breaks
 * one thing and checks the status, the message, and that O, LSE (0xA5
 * sentinels), the inputs, the arrays, the layout and the descriptor are
 * unchanged. The CUDA backends get the same statuses for bad arguments,
 * then SK_STATUS_NOT_SUPPORTED (NOT_SUPPORTED_BACKEND without CUDA).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/harness.h"
#include "common/packed_fixture.h"
#include "common/test_util.h"
#include "sparsek.h"

enum { NBUF = 8, TOTAL_Q = 120, HQ = 4, HKV = 2, DIM = 16, PAGES = 8 };

typedef enum pcall { P_RUN, P_FORWARD, P_WORKSPACE_SIZE, P_PLAN, P_INIT } pcall;

static const char *pcall_name(pcall c) {
    static const char *const names[5] = {"sk_attention_paged_run", "sk_attention_paged_forward",
                                         "sk_attention_paged_workspace_size",
                                         "sk_attention_paged_plan", "sk_attention_paged_desc_init"};
    return names[c];
}

enum { IQ, IK, IV, IO, ILSE, ICUQ, ILENS, ITABLE };
static const char *const buf_names[NBUF] = {"q",   "k_cache",      "v_cache",    "o",
                                            "lse", "cu_seqlens_q", "seq_lens_k", "page_table"};

typedef struct pfix {
    sk_attention_paged_desc desc;
    const sk_attention_paged_desc *desc_arg;
    pk_layout lay;
    const sk_bsr *layout_arg;
    pk_buffers b;
    size_t ws_bytes;
    size_t *ws_arg;
    size_t init_size;
} pfix;

static int32_t *ints(pfix *f, int which) {
    return (int32_t *)(void *)f->b.p[which];
}

static int fix_init(pfix *f) {
    memset(f, 0, sizeof *f);
    tu_rng rng;
    tu_rng_seed(&rng, tu_base_seed() + 31);
    if (sk_attention_paged_desc_init(&f->desc, sizeof f->desc) != SK_STATUS_SUCCESS) return 0;
    f->desc.backend = SK_BACKEND_CPU;
    f->desc.dtype = SK_DTYPE_F16;
    f->desc.batch = 3;
    f->desc.total_q = TOTAL_Q;
    f->desc.max_seqlen_q = 70;
    f->desc.max_seqlen_k = 130;
    f->desc.heads_q = HQ;
    f->desc.heads_kv = HKV;
    f->desc.head_dim = DIM;
    f->desc.num_pages = PAGES;
    f->desc.page_size = 32;
    f->desc.max_pages = 5;
    f->desc.page_table_stride = 6;
    const size_t qn = TOTAL_Q * HQ * DIM * 2, kn = PAGES * 32 * HKV * DIM * 2;
    const size_t bytes[NBUF] = {qn, kn, kn, qn, HQ * TOTAL_Q * 4, 16, 12, 3 * 6 * 4};
    if (!pk_alloc(&f->b, NBUF, bytes, buf_names, IV + 1, &rng)) return 0;
    const int32_t cu_q[4] = {0, 50, 50, 120}, lens[3] = {60, 130, 0};
    /* Sequence 0: pages 6, 1; sequence 1: 0, 2, 3, 4, 5; garbage elsewhere. */
    const int32_t table[18] = {6, 1, -1, 99, 7, 12345, 0, 2, 3, 4, 5, -9, 8, -2, 77, 1 << 30, 3, 0};
    memcpy(ints(f, ICUQ), cu_q, sizeof cu_q);
    memcpy(ints(f, ILENS), lens, sizeof lens);
    memcpy(ints(f, ITABLE), table, sizeof table);
    pk_layout_init(&f->lay);
    f->desc_arg = &f->desc;
    f->layout_arg = &f->lay.bsr;
    f->ws_bytes = 12345;
    f->ws_arg = &f->ws_bytes;
    f->init_size = sizeof(sk_attention_paged_desc);
    return 1;
}

static void fix_free(pfix *f) {
    pk_free(&f->b);
}

static sk_status fix_call(pfix *f, pcall call) {
    void *const *a = f->b.arg;
    const int32_t *cq = (const int32_t *)a[ICUQ], *lens = (const int32_t *)a[ILENS],
                  *table = (const int32_t *)a[ITABLE];
    switch (call) {
    case P_RUN:
        return sk_attention_paged_run(f->desc_arg, f->layout_arg, cq, lens, table, a[IQ], a[IK],
                                      a[IV], a[IO], (float *)a[ILSE], NULL, 0, NULL);
    case P_FORWARD:
        return sk_attention_paged_forward(f->desc_arg, f->layout_arg, cq, lens, table, a[IQ], a[IK],
                                          a[IV], a[IO], (float *)a[ILSE], NULL, 0, NULL);
    case P_WORKSPACE_SIZE:
        return sk_attention_paged_workspace_size(f->desc_arg, f->layout_arg, f->ws_arg);
    case P_PLAN:
        return sk_attention_paged_plan(f->desc_arg, f->layout_arg, cq, lens, table, NULL, 0, NULL);
    case P_INIT:
        return sk_attention_paged_desc_init((sk_attention_paged_desc *)(void *)f->desc_arg,
                                            f->init_size);
    }
    return SK_STATUS_INTERNAL_ERROR;
}

static void expect2(pfix *f, pcall call, sk_status want, sk_status want2, const char *needle) {
    pk_snapshot(&f->b, &f->lay);
    const sk_attention_paged_desc desc_before = f->desc;
    const sk_status got = fix_call(f, call);
    pk_expect(&f->b, &f->lay, pcall_name(call), got, want, want2, needle);
    CHECK(f->ws_bytes == 12345, "workspace_bytes was written: %zu", f->ws_bytes);
    if (call != P_INIT)
        CHECK(memcmp(&desc_before, &f->desc, sizeof desc_before) == 0, "desc was written");
}

static void expect(pfix *f, pcall call, sk_status want, const char *needle) {
    expect2(f, call, want, SK_STATUS_SUCCESS, needle);
}

#define BAD_PAGED(name, call, want, needle, ...)                                                   \
    SK_TEST(paged_bad_input_##name) {                                                              \
        pfix fx;                                                                                   \
        pfix *FIX = &fx;                                                                           \
        if (!fix_init(FIX)) {                                                                      \
            CHECK(0, "fixture: out of memory");                                                    \
            fix_free(FIX);                                                                         \
            return;                                                                                \
        }                                                                                          \
        __VA_ARGS__;                                                                               \
        expect(FIX, call, want, needle);                                                           \
        fix_free(FIX);                                                                             \
    }

SK_TEST(paged_bad_input_fixture_is_valid) {
    pfix f;
    if (!fix_init(&f)) {
        CHECK(0, "out of memory");
        fix_free(&f);
        return;
    }
    const pcall calls[4] = {P_RUN, P_FORWARD, P_WORKSPACE_SIZE, P_PLAN};
    for (int i = 0; i < 4; ++i) {
        const sk_status st = fix_call(&f, calls[i]);
        CHECK(st == SK_STATUS_SUCCESS, "%s: %s %s", pcall_name(calls[i]), sk_status_name(st),
              sk_last_error());
    }
    CHECK(f.ws_bytes == 0, "CPU workspace %zu", f.ws_bytes);
    const size_t untouched = pk_untouched(&f.b, IO, 2) + pk_untouched(&f.b, ILSE, 4);
    CHECK(untouched == 0, "%zu elements of O and LSE not written", untouched);
    fix_free(&f);
}

/* The descriptor and the page geometry. */
BAD_PAGED(null_desc, P_RUN, SK_STATUS_BAD_PARAM_NULL_POINTER, "desc", FIX->desc_arg = NULL)
BAD_PAGED(desc_not_initialised, P_FORWARD, SK_STATUS_BAD_PARAM_STRUCT_SIZE,
          "sk_attention_paged_desc_init", FIX->desc.struct_size = 0)
BAD_PAGED(desc_init_wrong_size, P_INIT, SK_STATUS_BAD_PARAM_STRUCT_SIZE, "struct_size",
          FIX->init_size = sizeof(sk_attention_paged_desc) + 8)
BAD_PAGED(f32_on_cuda, P_PLAN, SK_STATUS_BAD_PARAM_DTYPE, "F32", FIX->desc.dtype = SK_DTYPE_F32;
          FIX->desc.backend = SK_BACKEND_CUDA_SM80)
BAD_PAGED(num_pages_zero, P_RUN, SK_STATUS_BAD_PARAM_SHAPE, "desc->num_pages = 0",
          FIX->desc.num_pages = 0)
BAD_PAGED(num_pages_above_int32, P_WORKSPACE_SIZE, SK_STATUS_BAD_PARAM_OVERFLOW, "num_pages",
          FIX->desc.num_pages = (int64_t)INT32_MAX + 1)
BAD_PAGED(page_size_8, P_RUN, SK_STATUS_BAD_PARAM_VALUE, "page_size = 8", FIX->desc.page_size = 8)
BAD_PAGED(page_size_48, P_PLAN, SK_STATUS_BAD_PARAM_VALUE, "page_size = 48",
          FIX->desc.page_size = 48)
BAD_PAGED(max_pages_zero, P_FORWARD, SK_STATUS_BAD_PARAM_SHAPE, "max_pages = 0",
          FIX->desc.max_pages = 0)
BAD_PAGED(table_stride_below_max_pages, P_RUN, SK_STATUS_BAD_PARAM_STRIDE, "page_table_stride = 4",
          FIX->desc.page_table_stride = 4)
BAD_PAGED(table_stride_negative, P_WORKSPACE_SIZE, SK_STATUS_BAD_PARAM_STRIDE,
          "page_table_stride = -6", FIX->desc.page_table_stride = -6)
BAD_PAGED(max_seqlen_k_above_the_table, P_RUN, SK_STATUS_BAD_PARAM_SHAPE,
          "max_pages x page_size = 160", FIX->desc.max_seqlen_k = 161)
BAD_PAGED(total_q_zero, P_RUN, SK_STATUS_BAD_PARAM_SHAPE, "desc->total_q = 0",
          FIX->desc.total_q = 0)
BAD_PAGED(scale_inf, P_RUN, SK_STATUS_BAD_PARAM_VALUE, "scale", FIX->desc.scale = INFINITY)
/* Strides and sizes. */
BAD_PAGED(k_cache_negative_stride, P_RUN, SK_STATUS_BAD_PARAM_STRIDE, "k_cache stride over seq",
          FIX->desc.k_strides[0] = 1024;
          FIX->desc.k_strides[1] = -32; FIX->desc.k_strides[2] = 16)
BAD_PAGED(v_cache_extent_overflow, P_FORWARD, SK_STATUS_BAD_PARAM_OVERFLOW, "v_cache: extent 8",
          FIX->desc.v_strides[0] = INT64_MAX / 4;
          FIX->desc.v_strides[1] = 32; FIX->desc.v_strides[2] = 16)
/* num_pages x page_size x heads_kv x head_dim x 2 bytes: 2^31 x 2^5 x 2^10 x 2^30 x 2. */
BAD_PAGED(cache_size_overflow, P_WORKSPACE_SIZE, SK_STATUS_BAD_PARAM_OVERFLOW,
          "num_pages x page_size", FIX->desc.num_pages = INT32_MAX;
          FIX->desc.heads_q = FIX->desc.heads_kv = 1 << 10; FIX->desc.head_dim = 1 << 30;
          FIX->lay.bsr.grid.heads = 1)
BAD_PAGED(overlapping_o_strides, P_RUN, SK_STATUS_BAD_PARAM_STRIDE, "o stride over head",
          FIX->desc.o_strides[0] = 64;
          FIX->desc.o_strides[1] = 8)
/* The layout's geometry. */
BAD_PAGED(layout_batch_2, P_PLAN, SK_STATUS_BAD_LAYOUT_MISMATCH, "batch = 2",
          FIX->lay.bsr.grid.batch = 2)
/* Pointers and alignment. */
BAD_PAGED(null_seq_lens_k, P_RUN, SK_STATUS_BAD_PARAM_NULL_POINTER, "seq_lens_k",
          FIX->b.arg[ILENS] = NULL)
BAD_PAGED(null_page_table, P_PLAN, SK_STATUS_BAD_PARAM_NULL_POINTER, "page_table",
          FIX->b.arg[ITABLE] = NULL)
BAD_PAGED(misaligned_page_table, P_FORWARD, SK_STATUS_BAD_PARAM_ALIGNMENT,
          "page_table = ", FIX->b.arg[ITABLE] = FIX->b.p[ITABLE] + 2)
BAD_PAGED(null_k_cache, P_RUN, SK_STATUS_BAD_PARAM_NULL_POINTER, "k_cache must not be NULL",
          FIX->b.arg[IK] = NULL)
BAD_PAGED(misaligned_v_cache, P_RUN, SK_STATUS_BAD_PARAM_ALIGNMENT,
          "v_cache = ", FIX->b.arg[IV] = FIX->b.p[IV] + 1)
/* Aliasing (the full table is in test_aliasing.c). */
BAD_PAGED(o_overlaps_k_cache, P_RUN, SK_STATUS_BAD_PARAM_STRIDE, "o overlaps k_cache",
          FIX->b.arg[IO] = FIX->b.p[IK] + 16)
BAD_PAGED(lse_overlaps_page_table, P_FORWARD, SK_STATUS_BAD_PARAM_STRIDE, "lse overlaps page_table",
          FIX->b.arg[ITABLE] = FIX->b.p[ILSE] + 8;
          memcpy(FIX->b.p[ILSE] + 8, FIX->b.p[ITABLE], 72))
BAD_PAGED(o_overlaps_seq_lens_k, P_RUN, SK_STATUS_BAD_PARAM_STRIDE, "o overlaps seq_lens_k",
          FIX->b.arg[ILENS] = FIX->b.p[IO] + 4;
          memcpy(FIX->b.p[IO] + 4, FIX->b.p[ILENS], 12))
/* The arrays' content (host arrays on the CPU). */
BAD_PAGED(cu_seqlens_q_last_not_total, P_RUN, SK_STATUS_BAD_PARAM_SHAPE, "total_q = 120",
          ints(FIX, ICUQ)[3] = 119)
BAD_PAGED(seq_lens_k_negative, P_PLAN, SK_STATUS_BAD_PARAM_SHAPE, "seq_lens_k[2] = -1",
          ints(FIX, ILENS)[2] = -1)
BAD_PAGED(seq_lens_k_above_max, P_RUN, SK_STATUS_BAD_PARAM_SHAPE, "seq_lens_k[1] = 130",
          FIX->desc.max_seqlen_k = 129)
BAD_PAGED(page_index_negative, P_RUN, SK_STATUS_BAD_PARAM_VALUE, "page_table[1][2] = -3",
          ints(FIX, ITABLE)[8] = -3)
BAD_PAGED(page_index_past_the_cache, P_FORWARD, SK_STATUS_BAD_PARAM_VALUE,
          "page_table[0][1] = 8 is outside [0, num_pages = 8)", ints(FIX, ITABLE)[1] = 8)
/* 65 keys need a third page of sequence 0's row, which holds -1. */
BAD_PAGED(longer_sequence_reaches_a_garbage_entry, P_PLAN, SK_STATUS_BAD_PARAM_VALUE,
          "page_table[0][2] = -1", ints(FIX, ILENS)[0] = 65)
/* Sequence 0 has one key block of 64 keys; index 1 would be a second. */
BAD_PAGED(layout_index_past_sequence, P_RUN, SK_STATUS_BAD_LAYOUT_INDEX_RANGE,
          "sequence 0 has len_k = 60", FIX->lay.indices[0] = 1)
BAD_PAGED(layout_count_differs_from_nnz, P_RUN, SK_STATUS_BAD_LAYOUT_COUNT, "nnz",
          FIX->lay.bsr.nnz = 3)

/* The CUDA backends: the CPU's statuses for bad arguments, then on
 * SK_BACKEND_CUDA_SM90 SK_STATUS_NOT_SUPPORTED (the Hopper kernel: not D = 16)
 * or NOT_SUPPORTED_BACKEND, on the portable backends a workspace size; the
 * device arrays are not read on the host, so bad page indices pass. */
SK_TEST(paged_cuda_declines_before_the_device) {
    static const sk_backend backends[3] = {SK_BACKEND_CUDA, SK_BACKEND_CUDA_SM80,
                                           SK_BACKEND_CUDA_SM90};
    const int has_cuda = strstr(sk_build_info(), "no CUDA") == NULL;
    const sk_status declined = has_cuda ? SK_STATUS_NOT_SUPPORTED : SK_STATUS_NOT_SUPPORTED_BACKEND;
    for (int bi = 0; bi < 3; ++bi) {
        pfix f;
        if (!fix_init(&f)) {
            CHECK(0, "out of memory");
            fix_free(&f);
            return;
        }
        f.desc.backend = backends[bi];
        f.desc.page_size = 24;
        expect(&f, P_RUN, SK_STATUS_BAD_PARAM_VALUE, "page_size = 24");
        f.desc.page_size = 32;
        f.b.arg[IO] = f.b.p[IV]; /* o overlaps v_cache */
        expect(&f, P_FORWARD, SK_STATUS_BAD_PARAM_STRIDE, "o overlaps v_cache");
        f.b.arg[IO] = f.b.p[IO];
        f.b.arg[IQ] = f.b.p[IQ] + 8; /* CUDA wants 16-byte tensors */
        expect(&f, P_RUN, SK_STATUS_BAD_PARAM_ALIGNMENT, "q = ");
        f.b.arg[IQ] = f.b.p[IQ];
        ints(&f, ITABLE)[0] = -100; /* not read on the host */
        if (has_cuda && backends[bi] != SK_BACKEND_CUDA_SM90) {
            /* The portable kernels exist: the workspace size needs no
             * device. Plan and run would reach one with these host
             * arrays; the GPU suite runs them (test_attention_varlen_gpu.c). */
            const sk_status st = fix_call(&f, P_WORKSPACE_SIZE);
            CHECK(st == SK_STATUS_SUCCESS && f.ws_bytes != 12345 && f.ws_bytes > 0,
                  "backend %d: workspace size %s, %zu bytes (%s)", (int)backends[bi],
                  sk_status_name(st), f.ws_bytes, sk_last_error());
            fix_free(&f);
            continue;
        }
        /* SK_BACKEND_CUDA_SM90: the Hopper kernel declines D = 16 (it
         * covers D 64 / 128, blocks 128) from every call, the workspace
         * size included, before any device access; or no CUDA. */
        const pcall calls[4] = {P_RUN, P_FORWARD, P_WORKSPACE_SIZE, P_PLAN};
        for (int i = 0; i < 4; ++i)
            expect2(&f, calls[i], declined, SK_STATUS_SUCCESS,
                    has_cuda ? "head_dim 64 or 128 only" : "without CUDA");
        fix_free(&f);
    }
}
