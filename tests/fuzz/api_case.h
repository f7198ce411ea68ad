/*
 * api_case.h - the input format of fuzz_api (one definition, read by the
 * harness and written by make_seeds.c; see fz_codec.h): which entry point,
 * its descriptor, strides, layout, data and where its buffers lie.
 *
 * The fields are the descriptor's own values (wide codecs), so a seed
 * spells a real call and a mutation moves one value to a boundary.
 */
#ifndef SK_FUZZ_API_CASE_H
#define SK_FUZZ_API_CASE_H

#include <stdint.h>

#include "fz_arena.h"
#include "fz_codec.h"
#include "fz_layout_gen.h"
#include "sparsek.h"

/* The entry points, op % API_OPS. */
enum {
    API_ATTN_WORKSPACE,
    API_ATTN_PLAN,
    API_ATTN_RUN,
    API_ATTN_FORWARD,
    API_ATTN_TOPK_WORKSPACE,
    API_ATTN_TOPK,
    API_GEMM_WORKSPACE,
    API_GEMM_PLAN,
    API_GEMM_RUN,
    API_GEMM,
    API_BLOCK_POOL,
    API_SELECT_TOPK,
    API_POOL_SELECT_WORKSPACE,
    API_POOL_SELECT_TOPK,
    API_FROM_SCORES,
    API_TOPK_CAPACITY,
    API_TOPK_WORKSPACE,
    API_BWD_WORKSPACE, /* the attention backward (fuzz_api_backward.c) */
    API_BWD_PLAN,
    API_BWD_RUN,
    API_BWD,
    API_OPS
};

enum {
    API_FAULT_NONE = 0,
    API_FAULT_STRUCT_SIZE = 1, /* desc->struct_size one too many */
    API_FAULT_NULL_DESC = 2,   /* desc passed as NULL */
    API_FAULT_NULL_LAYOUT = 3, /* layout (or an ws-size / capacity output) passed as NULL */
    API_FAULTS = 8             /* values 4 .. 7: no fault */
};

enum {
    API_LSE = 1,    /* attention: write LSE */
    API_SPECIAL = 2 /* scores with NaN, +-inf and -0 (sk_layout_from_scores) */
};

/* The attention backward's own switches (api_case.bwd_flags). */
enum {
    API_BWD_REAL_FWD = 1,    /* O and LSE from a real CPU forward (else arbitrary values) */
    API_BWD_STRUCT_SIZE = 2, /* bwd->struct_size one too many */
    API_BWD_NULL = 4,        /* bwd passed as NULL */
    API_BWD_INIT_SIZE = 8    /* sk_attention_backward_desc_init first called with a wrong size */
};

enum { API_MAX_EDITS = 4 };

typedef struct api_case {
    uint8_t op;
    uint8_t fault;     /* API_FAULT_*, modulo API_FAULTS */
    int32_t backend;   /* sk_backend */
    int32_t dtype;     /* attention / top-k dtype; GEMM ab_dtype */
    int32_t c_dtype;   /* GEMM */
    int64_t size[6];   /* B, Sq, Sk, Hq, Hkv, D; GEMM m, n, k */
    float scale;       /* attention / top-k; GEMM alpha */
    float beta;        /* GEMM */
    int32_t mask;      /* sk_mask (the attention's in sk_attention_topk); GEMM b_order */
    int32_t topk_mask; /* sk_attention_topk: the top-k descriptor's mask */
    int64_t
        strides[4][3]; /* Q, K, V, O element strides (all 0 = packed); GEMM ldb, ldc in [0][0..1] */
    /* Layout (attention, GEMM): the grid, then a mask drawn from the seed. */
    sk_grid grid;
    uint8_t density;              /* a block is selected with probability density / 255 */
    int32_t nnz_delta;            /* added to the mask's count to make nnz */
    uint8_t n_edits;              /* modulo API_MAX_EDITS + 1 */
    fz_edit edits[API_MAX_EDITS]; /* on the layout's row offsets and indices */
    /* Top-k. */
    int32_t block_q, block_k, k, sink_blocks, local_blocks, per_kv_head;
    uint8_t attn_fault; /* sk_attention_topk: attn differs from topk in field x % 8 (0, 1: none) */
    /* Data and placement. */
    uint8_t flags;     /* API_LSE, API_SPECIAL */
    uint8_t magnitude; /* inputs N(0, 1) * 2^(x % 9 - 4) */
    uint64_t seed;
    uint32_t workspace_bytes; /* the workspace passed (unused on the CPU) */
    fz_place place;
    /* Attention backward. These, the high bytes of place.misalign and
     * place.null_mask and place.at[8 ..] are coded after everything above,
     * so the inputs written before they existed decode as before. */
    int32_t deterministic;     /* bwd->deterministic */
    int64_t bwd_strides[4][3]; /* dO, dQ, dK, dV element strides (all 0 = packed) */
    uint8_t bwd_flags;         /* API_BWD_* */
} api_case;

/* Read (c reading) or write (c writing) every field of k. */
void api_case_code(fz_codec *c, api_case *k);

#endif /* SK_FUZZ_API_CASE_H */
