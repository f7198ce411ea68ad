/*
 * test_topk_errors.c - every bad input of the top-k entry points gets its
 * exact status, a message that names the call and the problem, and leaves
 * every buffer, the layout struct and every output scalar untouched.
 *
 * Each test starts from a valid CPU call (topk_bad_input_fixture_is_valid
 * checks that it succeeds as is), breaks one thing, and checks.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/harness.h"
#include "common/test_util.h"
#include "sparsek.h"

enum { SENTINEL = 0xA5 };

typedef enum tk_call {
    TK_DESC_INIT,
    TK_CAPACITY,
    TK_WS_SIZE,
    TK_POOL,
    TK_SELECT,
    TK_FROM_SCORES,
    TK_ATTN_WS_SIZE,
    TK_ATTN,
    TK_PS_WS_SIZE,
    TK_POOL_SELECT
} tk_call;

static const char *tk_call_name(tk_call c) {
    switch (c) {
    case TK_DESC_INIT:
        return "sk_topk_desc_init";
    case TK_CAPACITY:
        return "sk_topk_layout_capacity";
    case TK_WS_SIZE:
        return "sk_topk_workspace_size";
    case TK_POOL:
        return "sk_block_pool";
    case TK_SELECT:
        return "sk_select_topk";
    case TK_FROM_SCORES:
        return "sk_layout_from_scores";
    case TK_ATTN_WS_SIZE:
        return "sk_attention_topk_workspace_size";
    case TK_ATTN:
        return "sk_attention_topk";
    case TK_PS_WS_SIZE:
        return "sk_pool_select_topk_workspace_size";
    case TK_POOL_SELECT:
        return "sk_pool_select_topk";
    }
    return "?";
}

/* A byte buffer (16 slack bytes past its end) and its snapshot. */
typedef struct tbuf {
    unsigned char *p, *copy;
    size_t bytes;
} tbuf;

static int tbuf_alloc(tbuf *b, size_t bytes, int random, tu_rng *rng) {
    b->bytes = bytes;
    /* 16-byte aligned, as the CUDA checks want for the pooled buffers. */
    void *mem = NULL;
    if (posix_memalign(&mem, 16, bytes + 16) != 0) mem = NULL;
    b->p = (unsigned char *)mem;
    b->copy = (unsigned char *)malloc(bytes + 16);
    if (b->p == NULL || b->copy == NULL) return 0;
    for (size_t i = 0; i < bytes + 16; ++i)
        b->p[i] = random ? (unsigned char)(tu_rng_next(rng) & 0x3f) : SENTINEL;
    return 1;
}
static void tbuf_snapshot(tbuf *b) { memcpy(b->copy, b->p, b->bytes + 16); }
static int tbuf_unchanged(const tbuf *b) { return memcmp(b->copy, b->p, b->bytes + 16) == 0; }
static void tbuf_free(tbuf *b) {
    free(b->p);
    free(b->copy);
}

enum { NBUF = 10 };

typedef struct fixture {
    sk_topk_desc desc;
    sk_attention_desc attn;
    const sk_topk_desc *desc_arg;
    const sk_attention_desc *attn_arg;
    tbuf b[NBUF]; /* q, k, v, o, lse, pooled_q, pooled_k, scores, row_offsets, col_indices */
    const void *q, *k, *v;
    void *o;
    float *lse, *pooled_q, *pooled_k;
    const float *pooled_q_in, *pooled_k_in, *scores;
    sk_bsr layout;
    sk_bsr *layout_arg;
    void *ws;
    size_t ws_size;
    size_t bytes;
    size_t *bytes_arg;
    sk_grid grid;
    sk_grid *grid_arg;
    int32_t max_nnz;
    int32_t *max_nnz_arg;
    size_t init_size;
} fixture;

static const char *const buf_names[NBUF] = {"q",        "k",        "v",      "o",
                                            "lse",      "pooled_q", "pooled_k", "scores",
                                            "row_offsets", "col_indices"};

/* CPU, F16, B1 Sq200 Sk300 Hq4 Hkv2 D16, blocks 64, k 2, sink 1, local 1,
 * causal: 4 row blocks x 5 col blocks per slice, 4 slices. */
static int fixture_init(fixture *f) {
    memset(f, 0, sizeof *f);
    tu_rng rng;
    tu_rng_seed(&rng, tu_base_seed() ^ 0x700);
    if (sk_topk_desc_init(&f->desc, sizeof f->desc) != SK_STATUS_SUCCESS) return 0;
    f->desc.backend = SK_BACKEND_CPU;
    f->desc.dtype = SK_DTYPE_F16;
    f->desc.batch = 1;
    f->desc.seq_q = 200;
    f->desc.seq_k = 300;
    f->desc.heads_q = 4;
    f->desc.heads_kv = 2;
    f->desc.head_dim = 16;
    f->desc.block_q = 64;
    f->desc.block_k = 64;
    f->desc.k = 2;
    f->desc.sink_blocks = 1;
    f->desc.local_blocks = 1;
    f->desc.mask = SK_MASK_CAUSAL;
    if (sk_attention_desc_init(&f->attn, sizeof f->attn) != SK_STATUS_SUCCESS) return 0;
    f->attn.backend = SK_BACKEND_CPU;
    f->attn.dtype = SK_DTYPE_F16;
    f->attn.batch = 1;
    f->attn.seq_q = 200;
    f->attn.seq_k = 300;
    f->attn.heads_q = 4;
    f->attn.heads_kv = 2;
    f->attn.head_dim = 16;
    f->attn.mask = SK_MASK_CAUSAL;
    const size_t qn = 200 * 4 * 16, kn = 300 * 2 * 16;
    const size_t sizes[NBUF] = {qn * 2, kn * 2, kn * 2, qn * 2, 4 * 200 * 4,
                                4 * 4 * 16 * 4, 2 * 5 * 16 * 4, 4 * 4 * 5 * 4, 17 * 4, 64 * 4};
    const int random[NBUF] = {1, 1, 1, 0, 0, 0, 0, 1, 0, 0};
    for (int i = 0; i < NBUF; ++i)
        if (!tbuf_alloc(&f->b[i], sizes[i], random[i], &rng)) return 0;
    f->desc_arg = &f->desc;
    f->attn_arg = &f->attn;
    f->q = f->b[0].p;
    f->k = f->b[1].p;
    f->v = f->b[2].p;
    f->o = f->b[3].p;
    f->lse = (float *)(void *)f->b[4].p;
    f->pooled_q = (float *)(void *)f->b[5].p;
    f->pooled_k = (float *)(void *)f->b[6].p;
    f->pooled_q_in = f->pooled_q;
    f->pooled_k_in = f->pooled_k;
    f->scores = (const float *)(void *)f->b[7].p;
    memset(&f->layout, 0x5c, sizeof f->layout);
    f->layout.row_offsets = (int32_t *)(void *)f->b[8].p;
    f->layout.col_indices = (int32_t *)(void *)f->b[9].p;
    f->layout_arg = &f->layout;
    f->bytes = 12345;
    f->bytes_arg = &f->bytes;
    memset(&f->grid, 0x3c, sizeof f->grid);
    f->grid_arg = &f->grid;
    f->max_nnz = -12345;
    f->max_nnz_arg = &f->max_nnz;
    f->init_size = sizeof(sk_topk_desc);
    return 1;
}

static void fixture_free(fixture *f) {
    for (int i = 0; i < NBUF; ++i) tbuf_free(&f->b[i]);
}

static sk_status fixture_call(fixture *f, tk_call c) {
    switch (c) {
    case TK_DESC_INIT:
        return sk_topk_desc_init((sk_topk_desc *)(void *)f->desc_arg, f->init_size);
    case TK_CAPACITY:
        return sk_topk_layout_capacity(f->desc_arg, f->grid_arg, f->max_nnz_arg);
    case TK_WS_SIZE:
        return sk_topk_workspace_size(f->desc_arg, f->bytes_arg);
    case TK_POOL:
        return sk_block_pool(f->desc_arg, f->q, f->k, f->pooled_q, f->pooled_k, NULL);
    case TK_SELECT:
        return sk_select_topk(f->desc_arg, f->pooled_q_in, f->pooled_k_in, f->layout_arg, f->ws,
                              f->ws_size, NULL);
    case TK_FROM_SCORES:
        return sk_layout_from_scores(f->desc_arg, f->scores, f->layout_arg, f->ws, f->ws_size,
                                     NULL);
    case TK_ATTN_WS_SIZE:
        return sk_attention_topk_workspace_size(f->attn_arg, f->desc_arg, f->bytes_arg);
    case TK_ATTN:
        return sk_attention_topk(f->attn_arg, f->desc_arg, f->q, f->k, f->v, f->o, f->lse,
                                 f->layout_arg, f->ws, f->ws_size, NULL);
    case TK_PS_WS_SIZE:
        return sk_pool_select_topk_workspace_size(f->desc_arg, f->bytes_arg);
    case TK_POOL_SELECT:
        return sk_pool_select_topk(f->desc_arg, f->q, f->k, f->layout_arg, f->ws, f->ws_size,
                                   NULL);
    }
    return SK_STATUS_INTERNAL_ERROR;
}

static void expect(fixture *f, tk_call c, sk_status want, const char *needle) {
    for (int i = 0; i < NBUF; ++i) tbuf_snapshot(&f->b[i]);
    const sk_bsr layout_before = f->layout;
    const sk_topk_desc desc_before = f->desc;
    const sk_grid grid_before = f->grid;
    const sk_status got = fixture_call(f, c);
    const char *msg = sk_last_error();
    CHECK(got == want, "%s: got %s, want %s (%s)", tk_call_name(c), sk_status_name(got),
          sk_status_name(want), msg);
    CHECK(strncmp(msg, tk_call_name(c), strlen(tk_call_name(c))) == 0 &&
              msg[strlen(tk_call_name(c))] == ':',
          "message does not start with %s: \"%s\"", tk_call_name(c), msg);
    CHECK(strstr(msg, needle) != NULL, "message does not mention \"%s\": \"%s\"", needle, msg);
    for (int i = 0; i < NBUF; ++i)
        CHECK(tbuf_unchanged(&f->b[i]), "%s: buffer %s was written", tk_call_name(c),
              buf_names[i]);
    CHECK(memcmp(&layout_before, &f->layout, sizeof layout_before) == 0, "layout struct written");
    CHECK(memcmp(&grid_before, &f->grid, sizeof grid_before) == 0, "grid written");
    CHECK(f->bytes == 12345, "workspace_bytes written: %zu", f->bytes);
    CHECK(f->max_nnz == -12345, "max_nnz written: %d", (int)f->max_nnz);
    CHECK(memcmp(&desc_before, &f->desc, sizeof desc_before) == 0, "desc written");
}

#define BAD_TOPK(name, call, want, needle, ...)                                                    \
    SK_TEST(topk_bad_input_##name) {                                                               \
        fixture fx;                                                                                \
        fixture *FIX = &fx;                                                                        \
        if (!fixture_init(FIX)) {                                                                  \
            CHECK(0, "fixture: out of memory");                                                    \
            fixture_free(FIX);                                                                     \
            return;                                                                                \
        }                                                                                          \
        __VA_ARGS__;                                                                               \
        expect(FIX, call, want, needle);                                                           \
        fixture_free(FIX);                                                                         \
    }

SK_TEST(topk_bad_input_fixture_is_valid) {
    const tk_call calls[9] = {TK_CAPACITY,     TK_WS_SIZE, TK_POOL,       TK_SELECT,
                              TK_FROM_SCORES,  TK_ATTN_WS_SIZE, TK_ATTN, TK_PS_WS_SIZE,
                              TK_POOL_SELECT};
    for (int i = 0; i < 9; ++i) {
        fixture f;
        if (!fixture_init(&f)) {
            CHECK(0, "out of memory");
            fixture_free(&f);
            return;
        }
        const sk_status st = fixture_call(&f, calls[i]);
        CHECK(st == SK_STATUS_SUCCESS, "%s: %s %s", tk_call_name(calls[i]), sk_status_name(st),
              sk_last_error());
        if (calls[i] == TK_CAPACITY)
            CHECK(f.max_nnz == 4 * (3 + 4 + 4 + 4) && f.grid.heads == 4 && f.grid.block_rows == 64,
                  "capacity %d heads %d", (int)f.max_nnz, (int)f.grid.heads);
        if (calls[i] == TK_PS_WS_SIZE) CHECK(f.bytes == 0, "CPU workspace %zu bytes", f.bytes);
        if (calls[i] == TK_SELECT || calls[i] == TK_FROM_SCORES || calls[i] == TK_ATTN ||
            calls[i] == TK_POOL_SELECT)
            CHECK(f.layout.nnz == 60 && f.layout.grid.rows == 200 && f.layout.grid.heads == 4,
                  "%s: layout nnz %d", tk_call_name(calls[i]), (int)f.layout.nnz);
        fixture_free(&f);
    }
}

/* Descriptor */
BAD_TOPK(desc_init_null, TK_DESC_INIT, SK_STATUS_BAD_PARAM_NULL_POINTER, "desc",
         FIX->desc_arg = NULL)
BAD_TOPK(desc_init_struct_size_zero, TK_DESC_INIT, SK_STATUS_BAD_PARAM_STRUCT_SIZE, "struct_size",
         FIX->init_size = 0)
BAD_TOPK(null_desc, TK_SELECT, SK_STATUS_BAD_PARAM_NULL_POINTER, "desc", FIX->desc_arg = NULL)
BAD_TOPK(uninitialised_desc, TK_POOL, SK_STATUS_BAD_PARAM_STRUCT_SIZE, "desc->struct_size",
         FIX->desc.struct_size = 0)
BAD_TOPK(bad_backend, TK_CAPACITY, SK_STATUS_BAD_PARAM_VALUE, "desc->backend",
         FIX->desc.backend = (sk_backend)9)
BAD_TOPK(bad_dtype, TK_POOL, SK_STATUS_BAD_PARAM_DTYPE, "desc->dtype",
         FIX->desc.dtype = (sk_dtype)0)
BAD_TOPK(f32_on_cuda, TK_WS_SIZE, SK_STATUS_BAD_PARAM_DTYPE, "F32",
         FIX->desc.backend = SK_BACKEND_CUDA;
         FIX->desc.dtype = SK_DTYPE_F32)
BAD_TOPK(zero_seq_q, TK_SELECT, SK_STATUS_BAD_PARAM_SHAPE, "desc->seq_q", FIX->desc.seq_q = 0)
BAD_TOPK(negative_head_dim, TK_POOL, SK_STATUS_BAD_PARAM_SHAPE, "desc->head_dim",
         FIX->desc.head_dim = -16)
BAD_TOPK(heads_mismatch, TK_SELECT, SK_STATUS_BAD_PARAM_SHAPE, "heads_q",
         FIX->desc.heads_q = 3)
BAD_TOPK(block_q_96, TK_CAPACITY, SK_STATUS_BAD_PARAM_VALUE, "desc->block_q",
         FIX->desc.block_q = 96)
BAD_TOPK(block_k_256, TK_FROM_SCORES, SK_STATUS_BAD_PARAM_VALUE, "desc->block_k",
         FIX->desc.block_k = 256)
BAD_TOPK(negative_k, TK_SELECT, SK_STATUS_BAD_PARAM_VALUE, "desc->k", FIX->desc.k = -1)
BAD_TOPK(negative_sinks, TK_FROM_SCORES, SK_STATUS_BAD_PARAM_VALUE, "desc->sink_blocks",
         FIX->desc.sink_blocks = -1)
BAD_TOPK(negative_local, TK_SELECT, SK_STATUS_BAD_PARAM_VALUE, "desc->local_blocks",
         FIX->desc.local_blocks = -3)
BAD_TOPK(scale_nan, TK_POOL, SK_STATUS_BAD_PARAM_VALUE, "desc->scale", FIX->desc.scale = NAN)
BAD_TOPK(scale_inf, TK_SELECT, SK_STATUS_BAD_PARAM_VALUE, "desc->scale",
         FIX->desc.scale = INFINITY)
BAD_TOPK(bad_mask, TK_SELECT, SK_STATUS_BAD_PARAM_VALUE, "desc->mask",
         FIX->desc.mask = (sk_mask)7)
BAD_TOPK(grid_overflow, TK_CAPACITY, SK_STATUS_BAD_LAYOUT_OVERFLOW, "int32",
         FIX->desc.seq_q = (int64_t)1 << 40)

/* Pointers, strides, overlap */
BAD_TOPK(null_q, TK_POOL, SK_STATUS_BAD_PARAM_NULL_POINTER, "q", FIX->q = NULL)
BAD_TOPK(null_pooled_q, TK_POOL, SK_STATUS_BAD_PARAM_NULL_POINTER, "pooled_q",
         FIX->pooled_q = NULL)
BAD_TOPK(null_pooled_k_in, TK_SELECT, SK_STATUS_BAD_PARAM_NULL_POINTER, "pooled_k",
         FIX->pooled_k_in = NULL)
BAD_TOPK(negative_q_stride, TK_POOL, SK_STATUS_BAD_PARAM_STRIDE, "q stride",
         FIX->desc.q_strides[0] = 12800;
         FIX->desc.q_strides[1] = -64;
         FIX->desc.q_strides[2] = 16)
BAD_TOPK(pooled_overlaps_q, TK_POOL, SK_STATUS_BAD_PARAM_STRIDE, "overlaps",
         FIX->pooled_q = (float *)(void *)FIX->b[0].p)
BAD_TOPK(pooled_q_overlaps_pooled_k, TK_POOL, SK_STATUS_BAD_PARAM_STRIDE, "overlaps",
         FIX->pooled_k = FIX->pooled_q + 16)
BAD_TOPK(null_layout, TK_SELECT, SK_STATUS_BAD_PARAM_NULL_POINTER, "layout",
         FIX->layout_arg = NULL)
BAD_TOPK(null_row_offsets, TK_FROM_SCORES, SK_STATUS_BAD_PARAM_NULL_POINTER,
         "layout->row_offsets", FIX->layout.row_offsets = NULL)
BAD_TOPK(null_col_indices, TK_SELECT, SK_STATUS_BAD_PARAM_NULL_POINTER, "layout->col_indices",
         FIX->layout.col_indices = NULL)
BAD_TOPK(offsets_overlap_indices, TK_SELECT, SK_STATUS_BAD_PARAM_STRIDE, "overlaps",
         FIX->layout.col_indices = FIX->layout.row_offsets + 4)
BAD_TOPK(layout_overlaps_scores, TK_FROM_SCORES, SK_STATUS_BAD_PARAM_STRIDE, "scores",
         FIX->layout.col_indices = (int32_t *)(void *)FIX->b[7].p)
BAD_TOPK(misaligned_row_offsets, TK_SELECT, SK_STATUS_BAD_PARAM_ALIGNMENT, "row_offsets",
         FIX->layout.row_offsets = (int32_t *)(void *)(FIX->b[8].p + 2))
BAD_TOPK(null_scores, TK_FROM_SCORES, SK_STATUS_BAD_PARAM_NULL_POINTER, "scores",
         FIX->scores = NULL)
BAD_TOPK(null_workspace_bytes, TK_WS_SIZE, SK_STATUS_BAD_PARAM_NULL_POINTER, "workspace_bytes",
         FIX->bytes_arg = NULL)

/* CUDA-only rules, checked before any device is touched. */
BAD_TOPK(cuda_head_dim_12, TK_SELECT, SK_STATUS_BAD_PARAM_ALIGNMENT, "head_dim",
         FIX->desc.backend = SK_BACKEND_CUDA;
         FIX->desc.head_dim = 12)
BAD_TOPK(cuda_misaligned_pooled_q, TK_SELECT, SK_STATUS_BAD_PARAM_ALIGNMENT, "pooled_q",
         FIX->desc.backend = SK_BACKEND_CUDA;
         FIX->pooled_q_in = FIX->pooled_q + 1)
BAD_TOPK(cuda_q_stride_not_16_bytes, TK_POOL, SK_STATUS_BAD_PARAM_ALIGNMENT, "q stride",
         FIX->desc.backend = SK_BACKEND_CUDA;
         FIX->desc.q_strides[0] = 200 * 68;
         FIX->desc.q_strides[1] = 68;
         FIX->desc.q_strides[2] = 17)

/* sk_attention_topk */
BAD_TOPK(attn_null, TK_ATTN, SK_STATUS_BAD_PARAM_NULL_POINTER, "attn", FIX->attn_arg = NULL)
BAD_TOPK(attn_uninitialised, TK_ATTN, SK_STATUS_BAD_PARAM_STRUCT_SIZE, "attn->struct_size",
         FIX->attn.struct_size = 0)
BAD_TOPK(attn_heads_differ, TK_ATTN, SK_STATUS_BAD_PARAM_SHAPE, "attn->heads_q",
         FIX->attn.heads_q = 2)
BAD_TOPK(attn_dtype_differs, TK_ATTN_WS_SIZE, SK_STATUS_BAD_PARAM_DTYPE, "attn->dtype",
         FIX->attn.dtype = SK_DTYPE_BF16)
BAD_TOPK(attn_backend_differs, TK_ATTN, SK_STATUS_BAD_PARAM_VALUE, "attn->backend",
         FIX->attn.backend = SK_BACKEND_CUDA)
BAD_TOPK(attn_q_strides_differ, TK_ATTN, SK_STATUS_BAD_PARAM_STRIDE, "q_strides",
         FIX->attn.q_strides[0] = 200 * 72;
         FIX->attn.q_strides[1] = 72;
         FIX->attn.q_strides[2] = 16)
BAD_TOPK(attn_o_overlaps_q, TK_ATTN, SK_STATUS_BAD_PARAM_STRIDE, "o overlaps q",
         FIX->o = (void *)FIX->b[0].p)
BAD_TOPK(attn_null_v, TK_ATTN, SK_STATUS_BAD_PARAM_NULL_POINTER, "v", FIX->v = NULL)
BAD_TOPK(attn_layout_overlaps_o, TK_ATTN, SK_STATUS_BAD_PARAM_STRIDE, "overlaps o",
         FIX->layout.col_indices = (int32_t *)FIX->o)
BAD_TOPK(attn_scale_nan, TK_ATTN, SK_STATUS_BAD_PARAM_VALUE, "scale", FIX->attn.scale = NAN)
BAD_TOPK(attn_ws_null_bytes, TK_ATTN_WS_SIZE, SK_STATUS_BAD_PARAM_NULL_POINTER,
         "workspace_bytes", FIX->bytes_arg = NULL)

/* sk_pool_select_topk */
BAD_TOPK(ps_null_desc, TK_POOL_SELECT, SK_STATUS_BAD_PARAM_NULL_POINTER, "desc",
         FIX->desc_arg = NULL)
BAD_TOPK(ps_negative_k, TK_POOL_SELECT, SK_STATUS_BAD_PARAM_VALUE, "desc->k", FIX->desc.k = -2)
BAD_TOPK(ps_null_q, TK_POOL_SELECT, SK_STATUS_BAD_PARAM_NULL_POINTER, ": q must not be NULL",
         FIX->q = NULL)
BAD_TOPK(ps_null_k, TK_POOL_SELECT, SK_STATUS_BAD_PARAM_NULL_POINTER, ": k must not be NULL",
         FIX->k = NULL)
BAD_TOPK(ps_null_layout, TK_POOL_SELECT, SK_STATUS_BAD_PARAM_NULL_POINTER, "layout",
         FIX->layout_arg = NULL)
BAD_TOPK(ps_null_col_indices, TK_POOL_SELECT, SK_STATUS_BAD_PARAM_NULL_POINTER,
         "layout->col_indices", FIX->layout.col_indices = NULL)
BAD_TOPK(ps_layout_overlaps_k, TK_POOL_SELECT, SK_STATUS_BAD_PARAM_STRIDE, "overlaps k",
         FIX->layout.row_offsets = (int32_t *)(void *)FIX->b[1].p)
BAD_TOPK(ps_negative_k_stride, TK_POOL_SELECT, SK_STATUS_BAD_PARAM_STRIDE, "k stride",
         FIX->desc.k_strides[0] = 300 * 32;
         FIX->desc.k_strides[1] = -32;
         FIX->desc.k_strides[2] = 16)
BAD_TOPK(ps_cuda_head_dim_12, TK_PS_WS_SIZE, SK_STATUS_BAD_PARAM_ALIGNMENT, "head_dim",
         FIX->desc.backend = SK_BACKEND_CUDA;
         FIX->desc.head_dim = 12)
BAD_TOPK(ps_cuda_q_stride_not_16_bytes, TK_POOL_SELECT, SK_STATUS_BAD_PARAM_ALIGNMENT,
         "q stride", FIX->desc.backend = SK_BACKEND_CUDA;
         FIX->desc.q_strides[0] = 200 * 68;
         FIX->desc.q_strides[1] = 68;
         FIX->desc.q_strides[2] = 17)
BAD_TOPK(ps_ws_null_bytes, TK_PS_WS_SIZE, SK_STATUS_BAD_PARAM_NULL_POINTER, "workspace_bytes",
         FIX->bytes_arg = NULL)

/* A CUDA workspace that is too small (needs the CUDA backend compiled in;
 * without it, the backend's absence is reported first). */
SK_TEST(topk_bad_input_cuda_workspace_too_small) {
    fixture fx;
    if (!fixture_init(&fx)) {
        CHECK(0, "fixture: out of memory");
        fixture_free(&fx);
        return;
    }
    fx.desc.backend = SK_BACKEND_CUDA;
    fx.ws = fx.b[3].p; /* any 16-byte aligned address: only the size is checked */
    fx.ws_size = 16;
    const int no_cuda = strstr(sk_build_info(), "no CUDA") != NULL;
    expect(&fx, TK_SELECT,
           no_cuda ? SK_STATUS_NOT_SUPPORTED_BACKEND : SK_STATUS_BAD_PARAM_WORKSPACE,
           no_cuda ? "without CUDA" : "workspace_size = 16");
    fx.ws = NULL;
    fx.ws_size = 0;
    expect(&fx, TK_FROM_SCORES,
           no_cuda ? SK_STATUS_NOT_SUPPORTED_BACKEND : SK_STATUS_BAD_PARAM_WORKSPACE,
           no_cuda ? "without CUDA" : "workspace is NULL");
    fx.ws = fx.b[3].p;
    fx.ws_size = 16;
    expect(&fx, TK_POOL_SELECT,
           no_cuda ? SK_STATUS_NOT_SUPPORTED_BACKEND : SK_STATUS_BAD_PARAM_WORKSPACE,
           no_cuda ? "without CUDA" : "workspace_size = 16");
    fixture_free(&fx);
}

/* With no usable GPU, the CUDA calls report it and write nothing. */
SK_TEST(topk_cuda_without_a_device_writes_nothing) {
    int32_t n = -1;
    sk_device_count(&n);
    if (n != 0) return; /* a GPU machine: the GPU suite covers these calls */
    fixture fx;
    if (!fixture_init(&fx)) {
        CHECK(0, "fixture: out of memory");
        fixture_free(&fx);
        return;
    }
    fx.desc.backend = SK_BACKEND_CUDA;
    expect(&fx, TK_POOL, SK_STATUS_NOT_SUPPORTED_BACKEND, "CUDA");
    /* Built without CUDA, the workspace size is refused as well (and left
     * unwritten); with CUDA it needs no device. */
    const int no_cuda = strstr(sk_build_info(), "no CUDA") != NULL;
    size_t need = 7;
    const sk_status ws_st = sk_pool_select_topk_workspace_size(&fx.desc, &need);
    CHECK(no_cuda ? ws_st == SK_STATUS_NOT_SUPPORTED_BACKEND && need == 7
                  : ws_st == SK_STATUS_SUCCESS && need > 0,
          "pool-select workspace size: %s (%zu bytes)", sk_last_error(), need);
    if (no_cuda) need = 256;
    fx.ws = malloc(need);
    fx.ws_size = need;
    if (fx.ws != NULL) expect(&fx, TK_POOL_SELECT, SK_STATUS_NOT_SUPPORTED_BACKEND, "CUDA");
    free(fx.ws);
    fixture_free(&fx);
}
