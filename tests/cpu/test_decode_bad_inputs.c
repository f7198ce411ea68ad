/*
 * test_decode_bad_inputs.c - every bad input of the decode call
 * (sparsek.h "Decode") gets its exact status, a message naming the call
 * and the argument, and leaves every buffer byte-identical (the style of
 * test_paged_bad_inputs.c, whose buffer helpers it uses).
 *
 * The fixture is a valid call: B = 3 sequences of len_k 60, 130, 0, q_len
 * = 2, Hq = 4, Hkv = 2, D = 16, F16, CPU, pages of 32 tokens, 8 pages, a
 * page table of 5 columns with row stride 6 whose unused entries hold
 * garbage, a decode layout per KV head in blocks of 32 keys (sequence 2's
 * rows empty). Each test breaks one thing and checks the status, the
 * message, and that O, LSE (0xA5 sentinels), the inputs, the arrays, the
 * layout arrays and the descriptor are unchanged.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/harness.h"
#include "common/packed_fixture.h"
#include "common/test_util.h"
#include "sparsek.h"

enum { NBUF = 9, QLEN = 2, HQ = 4, HKV = 2, DIM = 16, PAGES = 8, NNZ = 6 };

typedef enum dcall { D_RUN, D_ONESHOT, D_WORKSPACE_SIZE, D_PLAN, D_VALIDATE, D_SPLITS } dcall;

static const char *dcall_name(dcall c) {
    static const char *const names[6] = {"sk_decode_run",  "sk_decode",
                                         "sk_decode_workspace_size", "sk_decode_plan",
                                         "sk_layout_validate_decode", "sk_decode_splits"};
    return names[c];
}

enum { IQ, IK, IV, IO, ILSE, ILENS, ITABLE, IOFF, IIDX };
static const char *const buf_names[NBUF] = {"q",          "k_cache",    "v_cache",
                                            "o",          "lse",        "seq_lens_k",
                                            "page_table", "row_offsets", "col_indices"};

typedef struct dfix {
    sk_decode_desc desc;
    const sk_decode_desc *desc_arg;
    sk_bsr layout;
    const sk_bsr *layout_arg;
    pk_buffers b;
    size_t ws_bytes;
    size_t *ws_arg;
    int32_t splits;
} dfix;

static int32_t *ints(dfix *f, int which) {
    return (int32_t *)(void *)f->b.p[which];
}

static int fix_init(dfix *f) {
    memset(f, 0, sizeof *f);
    tu_rng rng;
    tu_rng_seed(&rng, tu_base_seed() + 37);
    if (sk_decode_desc_init(&f->desc, sizeof f->desc) != SK_STATUS_SUCCESS) return 0;
    f->desc.backend = SK_BACKEND_CPU;
    f->desc.dtype = SK_DTYPE_F16;
    f->desc.batch = 3;
    f->desc.q_len = QLEN;
    f->desc.max_seqlen_k = 130;
    f->desc.heads_q = HQ;
    f->desc.heads_kv = HKV;
    f->desc.head_dim = DIM;
    f->desc.num_pages = PAGES;
    f->desc.page_size = 32;
    f->desc.max_pages = 5;
    f->desc.page_table_stride = 6;
    const size_t qn = 3 * QLEN * HQ * DIM * 2, kn = PAGES * 32 * HKV * DIM * 2;
    const size_t bytes[NBUF] = {qn, kn, kn, qn, 3 * HQ * QLEN * 4, 12, 3 * 6 * 4, 7 * 4, NNZ * 4};
    if (!pk_alloc(&f->b, NBUF, bytes, buf_names, IV + 1, &rng)) return 0;
    const int32_t lens[3] = {60, 130, 0};
    /* Sequence 0: pages 6, 1; sequence 1: 0, 2, 3, 4, 5; garbage elsewhere. */
    const int32_t table[18] = {6, 1, -1, 99, 7, 12345, 0, 2, 3, 4, 5, -9, 8, -2, 77, 1 << 30, 3, 0};
    /* Slices (b, h): (0,0) {0,1}; (0,1) {1}; (1,0) {0,4}; (1,1) {2}; sequence 2 empty. */
    const int32_t off[7] = {0, 2, 3, 5, 6, 6, 6}, idx[NNZ] = {0, 1, 1, 0, 4, 2};
    memcpy(ints(f, ILENS), lens, sizeof lens);
    memcpy(ints(f, ITABLE), table, sizeof table);
    memcpy(ints(f, IOFF), off, sizeof off);
    memcpy(ints(f, IIDX), idx, sizeof idx);
    f->layout.grid = tu_grid(QLEN, 130, 64, 32, 3, HKV);
    f->layout.nnz = NNZ;
    f->layout.row_offsets = ints(f, IOFF);
    f->layout.col_indices = ints(f, IIDX);
    f->desc_arg = &f->desc;
    f->layout_arg = &f->layout;
    f->ws_bytes = 12345;
    f->ws_arg = &f->ws_bytes;
    f->splits = -7;
    return 1;
}

static sk_status fix_call(dfix *f, dcall call) {
    void *const *a = f->b.arg;
    const int32_t *lens = (const int32_t *)a[ILENS], *table = (const int32_t *)a[ITABLE];
    switch (call) {
    case D_RUN:
        return sk_decode_run(f->desc_arg, f->layout_arg, lens, table, a[IQ], a[IK], a[IV], a[IO],
                             (float *)a[ILSE], NULL, 0, NULL);
    case D_ONESHOT:
        return sk_decode(f->desc_arg, f->layout_arg, lens, table, a[IQ], a[IK], a[IV], a[IO],
                         (float *)a[ILSE], NULL, 0, NULL);
    case D_WORKSPACE_SIZE:
        return sk_decode_workspace_size(f->desc_arg, f->layout_arg, f->ws_arg);
    case D_PLAN:
        return sk_decode_plan(f->desc_arg, f->layout_arg, lens, table, NULL, 0, NULL);
    case D_VALIDATE:
        return sk_layout_validate_decode(f->layout_arg, f->desc_arg, lens);
    case D_SPLITS:
        return sk_decode_splits(f->desc_arg, f->layout_arg, &f->splits);
    }
    return SK_STATUS_INTERNAL_ERROR;
}

static void expect(dfix *f, dcall call, sk_status want, sk_status want2, const char *needle) {
    pk_snapshot(&f->b, NULL);
    const sk_decode_desc desc_before = f->desc;
    const sk_status got = fix_call(f, call);
    pk_expect(&f->b, NULL, dcall_name(call), got, want, want2, needle);
    CHECK(f->ws_bytes == 12345, "workspace_bytes was written: %zu", f->ws_bytes);
    CHECK(f->splits == -7, "num_splits was written: %d", (int)f->splits);
    CHECK(memcmp(&desc_before, &f->desc, sizeof desc_before) == 0, "desc was written");
}

#define BAD_DECODE(name, call, want, needle, ...)                                                  \
    SK_TEST(decode_bad_input_##name) {                                                             \
        dfix fx;                                                                                   \
        dfix *FIX = &fx;                                                                           \
        if (!fix_init(FIX)) {                                                                      \
            CHECK(0, "fixture: out of memory");                                                    \
            pk_free(&FIX->b);                                                                      \
            return;                                                                                \
        }                                                                                          \
        __VA_ARGS__;                                                                               \
        expect(FIX, call, want, SK_STATUS_SUCCESS, needle);                                        \
        pk_free(&FIX->b);                                                                          \
    }

SK_TEST(decode_bad_input_fixture_is_valid) {
    dfix f;
    if (!fix_init(&f)) {
        CHECK(0, "out of memory");
        pk_free(&f.b);
        return;
    }
    const dcall calls[6] = {D_RUN, D_ONESHOT, D_WORKSPACE_SIZE, D_PLAN, D_VALIDATE, D_SPLITS};
    for (int i = 0; i < 6; ++i) {
        const sk_status st = fix_call(&f, calls[i]);
        CHECK(st == SK_STATUS_SUCCESS, "%s: %s %s", dcall_name(calls[i]), sk_status_name(st),
              sk_last_error());
    }
    CHECK(f.ws_bytes == 0, "CPU workspace %zu", f.ws_bytes);
    CHECK(f.splits == 1, "CPU splits %d", (int)f.splits);
    const size_t untouched = pk_untouched(&f.b, IO, 2) + pk_untouched(&f.b, ILSE, 4);
    CHECK(untouched == 0, "%zu elements of O and LSE not written", untouched);
    /* Sequence 2 has no key: O = 0 and LSE = -inf for its rows. */
    const float *lse = (const float *)(void *)f.b.p[ILSE];
    for (int i = 2 * HQ * QLEN; i < 3 * HQ * QLEN; ++i)
        CHECK(isinf(lse[i]) && lse[i] < 0, "LSE[%d] = %g of the empty sequence", i, lse[i]);
    pk_free(&f.b);
}

/* The descriptor and the page geometry. */
BAD_DECODE(null_desc, D_RUN, SK_STATUS_BAD_PARAM_NULL_POINTER, "desc", FIX->desc_arg = NULL)
BAD_DECODE(desc_not_initialised, D_ONESHOT, SK_STATUS_BAD_PARAM_STRUCT_SIZE,
           "sk_decode_desc_init", FIX->desc.struct_size = 0)
BAD_DECODE(f32_on_cuda, D_PLAN, SK_STATUS_BAD_PARAM_DTYPE, "F32", FIX->desc.dtype = SK_DTYPE_F32;
           FIX->desc.backend = SK_BACKEND_CUDA_SM80)
BAD_DECODE(q_len_zero, D_RUN, SK_STATUS_BAD_PARAM_SHAPE, "desc->q_len = 0", FIX->desc.q_len = 0)
BAD_DECODE(q_len_17, D_WORKSPACE_SIZE, SK_STATUS_BAD_PARAM_SHAPE, "desc->q_len = 17 must be 1 .. 16",
           FIX->desc.q_len = 17)
BAD_DECODE(heads_not_a_multiple, D_RUN, SK_STATUS_BAD_PARAM_SHAPE, "heads_q",
           FIX->desc.heads_q = 3)
BAD_DECODE(max_seqlen_k_zero, D_RUN, SK_STATUS_BAD_PARAM_SHAPE, "desc->max_seqlen_k = 0",
           FIX->desc.max_seqlen_k = 0)
BAD_DECODE(page_size_48, D_PLAN, SK_STATUS_BAD_PARAM_VALUE, "page_size = 48",
           FIX->desc.page_size = 48)
BAD_DECODE(table_stride_below_max_pages, D_RUN, SK_STATUS_BAD_PARAM_STRIDE,
           "page_table_stride = 4", FIX->desc.page_table_stride = 4)
BAD_DECODE(max_seqlen_k_above_the_table, D_ONESHOT, SK_STATUS_BAD_PARAM_SHAPE,
           "max_pages x page_size = 160", FIX->desc.max_seqlen_k = 161)
BAD_DECODE(scale_nan, D_RUN, SK_STATUS_BAD_PARAM_VALUE, "scale", FIX->desc.scale = NAN)
BAD_DECODE(num_splits_negative, D_RUN, SK_STATUS_BAD_PARAM_VALUE, "desc->num_splits = -1",
           FIX->desc.num_splits = -1)
BAD_DECODE(num_splits_129, D_SPLITS, SK_STATUS_BAD_PARAM_VALUE, "desc->num_splits = 129",
           FIX->desc.num_splits = 129)
/* Strides. */
BAD_DECODE(q_negative_stride, D_RUN, SK_STATUS_BAD_PARAM_STRIDE, "q stride",
           FIX->desc.q_strides[0] = 128; FIX->desc.q_strides[1] = -64; FIX->desc.q_strides[2] = 16)
BAD_DECODE(overlapping_o_strides, D_RUN, SK_STATUS_BAD_PARAM_STRIDE, "o stride over head",
           FIX->desc.o_strides[0] = 128;
           FIX->desc.o_strides[1] = 64; FIX->desc.o_strides[2] = 8)
BAD_DECODE(v_cache_extent_overflow, D_ONESHOT, SK_STATUS_BAD_PARAM_OVERFLOW, "v_cache",
           FIX->desc.v_strides[0] = INT64_MAX / 4;
           FIX->desc.v_strides[1] = 32; FIX->desc.v_strides[2] = 16)
/* The layout's geometry: the decode rule, not sk_grid_blocks'. */
BAD_DECODE(layout_batch_1, D_PLAN, SK_STATUS_BAD_LAYOUT_MISMATCH, "grid.batch = 1",
           FIX->layout.grid.batch = 1)
BAD_DECODE(layout_heads_hq, D_RUN, SK_STATUS_BAD_LAYOUT_MISMATCH, "grid.heads = 4",
           FIX->layout.grid.heads = 4)
BAD_DECODE(layout_rows_not_q_len, D_WORKSPACE_SIZE, SK_STATUS_BAD_LAYOUT_MISMATCH,
           "grid.rows = 3", FIX->layout.grid.rows = 3)
BAD_DECODE(layout_block_rows_128, D_RUN, SK_STATUS_BAD_PARAM_VALUE, "block_rows = 128",
           FIX->layout.grid.block_rows = 128)
BAD_DECODE(layout_cols_not_max_seqlen_k, D_VALIDATE, SK_STATUS_BAD_LAYOUT_MISMATCH,
           "grid.cols = 129", FIX->layout.grid.cols = 129)
BAD_DECODE(layout_block_cols_8, D_RUN, SK_STATUS_BAD_PARAM_VALUE, "block_cols = 8",
           FIX->layout.grid.block_cols = 8)
BAD_DECODE(layout_block_cols_48, D_VALIDATE, SK_STATUS_BAD_PARAM_VALUE, "block_cols = 48",
           FIX->layout.grid.block_cols = 48)
BAD_DECODE(layout_null_col_indices, D_RUN, SK_STATUS_BAD_PARAM_NULL_POINTER, "col_indices",
           FIX->layout.col_indices = NULL)
BAD_DECODE(layout_misaligned_offsets, D_PLAN, SK_STATUS_BAD_PARAM_ALIGNMENT, "row_offsets",
           FIX->layout.row_offsets = (int32_t *)(void *)(FIX->b.p[IOFF] + 2))
/* Pointers and alignment. */
BAD_DECODE(null_seq_lens_k, D_RUN, SK_STATUS_BAD_PARAM_NULL_POINTER, "seq_lens_k",
           FIX->b.arg[ILENS] = NULL)
BAD_DECODE(null_page_table, D_PLAN, SK_STATUS_BAD_PARAM_NULL_POINTER, "page_table",
           FIX->b.arg[ITABLE] = NULL)
BAD_DECODE(misaligned_page_table, D_ONESHOT, SK_STATUS_BAD_PARAM_ALIGNMENT, "page_table = ",
           FIX->b.arg[ITABLE] = FIX->b.p[ITABLE] + 2)
BAD_DECODE(null_q, D_RUN, SK_STATUS_BAD_PARAM_NULL_POINTER, "q must not be NULL",
           FIX->b.arg[IQ] = NULL)
BAD_DECODE(null_o, D_RUN, SK_STATUS_BAD_PARAM_NULL_POINTER, "o must not be NULL",
           FIX->b.arg[IO] = NULL)
BAD_DECODE(misaligned_k_cache, D_RUN, SK_STATUS_BAD_PARAM_ALIGNMENT, "k_cache = ",
           FIX->b.arg[IK] = FIX->b.p[IK] + 1)
BAD_DECODE(misaligned_lse, D_RUN, SK_STATUS_BAD_PARAM_ALIGNMENT, "lse = ",
           FIX->b.arg[ILSE] = FIX->b.p[ILSE] + 2)
/* Aliasing. */
BAD_DECODE(o_overlaps_v_cache, D_RUN, SK_STATUS_BAD_PARAM_STRIDE, "o overlaps v_cache",
           FIX->b.arg[IO] = FIX->b.p[IV] + 16)
BAD_DECODE(lse_overlaps_page_table, D_ONESHOT, SK_STATUS_BAD_PARAM_STRIDE,
           "lse overlaps page_table", FIX->b.arg[ITABLE] = FIX->b.p[ILSE] + 8;
           memcpy(FIX->b.p[ILSE] + 8, FIX->b.p[ITABLE], 72))
BAD_DECODE(o_overlaps_seq_lens_k, D_RUN, SK_STATUS_BAD_PARAM_STRIDE, "o overlaps seq_lens_k",
           FIX->b.arg[ILENS] = FIX->b.p[IO] + 4;
           memcpy(FIX->b.p[IO] + 4, FIX->b.p[ILENS], 12))
BAD_DECODE(lse_overlaps_col_indices, D_RUN, SK_STATUS_BAD_PARAM_STRIDE,
           "lse overlaps layout->col_indices",
           memcpy(FIX->b.p[ILSE] + 4, FIX->b.p[IIDX], NNZ * 4);
           FIX->layout.col_indices = (int32_t *)(void *)(FIX->b.p[ILSE] + 4))
BAD_DECODE(o_overlaps_q, D_ONESHOT, SK_STATUS_BAD_PARAM_STRIDE, "o overlaps q",
           FIX->b.arg[IO] = FIX->b.p[IQ] + 32)
/* The arrays' content (host arrays on the CPU). */
BAD_DECODE(seq_lens_k_negative, D_PLAN, SK_STATUS_BAD_PARAM_SHAPE, "seq_lens_k[2] = -1",
           ints(FIX, ILENS)[2] = -1)
BAD_DECODE(seq_lens_k_above_max, D_RUN, SK_STATUS_BAD_PARAM_SHAPE, "seq_lens_k[1] = 131",
           ints(FIX, ILENS)[1] = 131)
BAD_DECODE(validate_seq_lens_k_above_max, D_VALIDATE, SK_STATUS_BAD_PARAM_SHAPE,
           "seq_lens_k[1] = 131", ints(FIX, ILENS)[1] = 131)
BAD_DECODE(page_index_negative, D_RUN, SK_STATUS_BAD_PARAM_VALUE, "page_table[1][2] = -3",
           ints(FIX, ITABLE)[8] = -3)
BAD_DECODE(page_index_past_the_cache, D_ONESHOT, SK_STATUS_BAD_PARAM_VALUE,
           "page_table[0][1] = 8 is outside [0, num_pages = 8)", ints(FIX, ITABLE)[1] = 8)
/* 65 keys need a third page of sequence 0's row, which holds -1. */
BAD_DECODE(longer_sequence_reaches_a_garbage_entry, D_PLAN, SK_STATUS_BAD_PARAM_VALUE,
           "page_table[0][2] = -1", ints(FIX, ILENS)[0] = 65)
/* Sequence 0 has 60 keys: two blocks of 32; index 2 would be a third. */
BAD_DECODE(layout_index_past_sequence, D_RUN, SK_STATUS_BAD_LAYOUT_INDEX_RANGE,
           "sequence 0 has len_k = 60", ints(FIX, IIDX)[1] = 2)
BAD_DECODE(validate_index_past_sequence, D_VALIDATE, SK_STATUS_BAD_LAYOUT_INDEX_RANGE,
           "sequence 0 has len_k = 60", ints(FIX, IIDX)[1] = 2)
BAD_DECODE(layout_index_past_grid, D_VALIDATE, SK_STATUS_BAD_LAYOUT_INDEX_RANGE,
           "outside [0, 5)", ints(FIX, IIDX)[4] = 5)
BAD_DECODE(layout_unsorted, D_ONESHOT, SK_STATUS_BAD_LAYOUT_UNSORTED, "increasing",
           ints(FIX, IIDX)[3] = 4; ints(FIX, IIDX)[4] = 0)
BAD_DECODE(layout_duplicate, D_RUN, SK_STATUS_BAD_LAYOUT_DUPLICATE, "repeats",
           ints(FIX, IIDX)[0] = 1)
BAD_DECODE(layout_count_differs_from_nnz, D_RUN, SK_STATUS_BAD_LAYOUT_COUNT, "nnz",
           FIX->layout.nnz = 5)

SK_TEST(decode_bad_input_null_splits_out) {
    dfix f;
    if (!fix_init(&f)) {
        CHECK(0, "out of memory");
        pk_free(&f.b);
        return;
    }
    const sk_status st = sk_decode_splits(&f.desc, &f.layout, NULL);
    CHECK(st == SK_STATUS_BAD_PARAM_NULL_POINTER, "%s", sk_status_name(st));
    CHECK(strstr(sk_last_error(), "sk_decode_splits: num_splits") != NULL, "%s", sk_last_error());
    pk_free(&f.b);
}

/* A layout validated without the lengths takes any index below the grid's
 * blocks (the CUDA kernels skip those past a sequence's end). */
SK_TEST(decode_validate_without_lengths_takes_indices_past_the_end) {
    dfix f;
    if (!fix_init(&f)) {
        CHECK(0, "out of memory");
        pk_free(&f.b);
        return;
    }
    ints(&f, IIDX)[1] = 3; /* sequence 0: blocks 0 and 3; it has 2 */
    sk_status st = sk_layout_validate_decode(&f.layout, &f.desc, NULL);
    CHECK(st == SK_STATUS_SUCCESS, "%s %s", sk_status_name(st), sk_last_error());
    st = sk_layout_validate_decode(&f.layout, &f.desc, ints(&f, ILENS));
    CHECK(st == SK_STATUS_BAD_LAYOUT_INDEX_RANGE, "%s", sk_status_name(st));
    /* A shared row (heads = 1) has B + 1 offsets. */
    const int32_t off[4] = {0, 2, 4, 4}, idx[4] = {0, 1, 0, 4};
    sk_bsr shared = f.layout;
    shared.grid.heads = 1;
    shared.nnz = 4;
    shared.row_offsets = (int32_t *)(void *)off;
    shared.col_indices = (int32_t *)(void *)idx;
    st = sk_layout_validate_decode(&shared, &f.desc, ints(&f, ILENS));
    CHECK(st == SK_STATUS_SUCCESS, "%s %s", sk_status_name(st), sk_last_error());
    /* Blocks of 16 and 32 are refused by sk_grid_blocks (other layouts). */
    st = sk_grid_blocks(&f.layout.grid, NULL, NULL, NULL);
    CHECK(st == SK_STATUS_BAD_PARAM_VALUE, "sk_grid_blocks took block_cols 32: %s",
          sk_status_name(st));
    pk_free(&f.b);
}

/* The CUDA backends make the same checks first; without CUDA or a GPU the
 * valid call is NOT_SUPPORTED_BACKEND (no GPU here) and a bad one gets
 * the CPU's status. */
SK_TEST(decode_bad_input_same_status_on_cuda) {
    dfix f;
    if (!fix_init(&f)) {
        CHECK(0, "out of memory");
        pk_free(&f.b);
        return;
    }
    f.desc.backend = SK_BACKEND_CUDA_SM80;
    f.desc.q_len = 0;
    expect(&f, D_RUN, SK_STATUS_BAD_PARAM_SHAPE, SK_STATUS_SUCCESS, "desc->q_len = 0");
    f.desc.q_len = QLEN;
    f.b.arg[IO] = f.b.p[IK] + 16;
    expect(&f, D_ONESHOT, SK_STATUS_BAD_PARAM_STRIDE, SK_STATUS_SUCCESS, "o overlaps k_cache");
    pk_free(&f.b);
}

/* The aliasing rule in full: each output (o, lse) placed on every other
 * buffer of the call (the tensors, the two arrays, the layout arrays, the
 * other output) is refused before anything is read or written. */
SK_TEST(decode_bad_input_every_output_against_every_buffer) {
    const int outs[2] = {IO, ILSE};
    for (int oi = 0; oi < 2; ++oi)
        for (int other = 0; other < NBUF; ++other) {
            if (other == outs[oi]) continue;
            dfix f;
            if (!fix_init(&f)) {
                CHECK(0, "out of memory");
                pk_free(&f.b);
                return;
            }
            /* The output starts where the other buffer starts. */
            f.b.arg[outs[oi]] = f.b.p[other];
            pk_snapshot(&f.b, NULL);
            const sk_status st = fix_call(&f, oi == 0 ? D_RUN : D_ONESHOT);
            CHECK(st == SK_STATUS_BAD_PARAM_STRIDE, "%s on %s: %s (%s)", buf_names[outs[oi]],
                  buf_names[other], sk_status_name(st), sk_last_error());
            CHECK(strstr(sk_last_error(), "overlaps") != NULL, "%s", sk_last_error());
            pk_expect(&f.b, NULL, oi == 0 ? "sk_decode_run" : "sk_decode", st,
                      SK_STATUS_BAD_PARAM_STRIDE, SK_STATUS_SUCCESS, "overlaps");
            pk_free(&f.b);
        }
}
