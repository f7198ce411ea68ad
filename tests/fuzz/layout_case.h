/*
 * layout_case.h - the input format of fuzz_layout (one definition, read by
 * the harness and written by make_seeds.c; see fz_codec.h).
 *
 * Fields in order: the grid; flags; a count offset and up to 8 edits that
 * break the layout built from the mask; the attention's parameters; the
 * builders' parameters; then the rest of the input is the block mask, bit
 * g * col_blocks + j selecting key block j of layout row g, the bytes
 * repeating when the input is shorter than the mask.
 */
#ifndef SK_FUZZ_LAYOUT_CASE_H
#define SK_FUZZ_LAYOUT_CASE_H

#include <stddef.h>
#include <stdint.h>

#include "fz_codec.h"
#include "fz_layout_gen.h"
#include "sparsek.h"

enum {
    LC_NULL_OFFSETS = 1, /* row_offsets passed as NULL */
    LC_NULL_INDICES = 2, /* col_indices passed as NULL */
    LC_CAUSAL = 4,       /* the attention is causal */
    LC_LSE = 8,          /* the attention writes LSE */
    LC_SHORT = 16,       /* conversion buffers one element short */
    LC_RUN = 32,         /* sk_attention_run instead of sk_attention_forward */
    LC_FLEX_EDITS = 64,  /* the edits break the flex arrays instead of the BSR ones */
    LC_GRID_NULLS = 128  /* sk_grid_blocks with NULL outputs */
};

enum { LC_MAX_EDITS = 8 };

typedef struct layout_case {
    sk_grid grid;
    uint8_t flags;
    int32_t nnz_delta;           /* added to the mask's count to make nnz */
    uint8_t n_edits;             /* % (LC_MAX_EDITS + 1) */
    fz_edit edits[LC_MAX_EDITS]; /* on row offsets and indices, or (LC_FLEX_EDITS)
                                    on a padded flex form's counts and indices */
    /* The attention over a valid layout (packed tensors). */
    uint8_t dtype;     /* % 3: F32, F16, BF16 */
    uint8_t head_dim;  /* 1 + x % 8 */
    uint8_t heads_sel; /* Hq and Hkv from grid.heads (see fuzz_layout.c) */
    uint8_t batch_sel; /* B when grid.batch is 1: 1 + x % 2 */
    uint8_t magnitude; /* inputs N(0, 1) * 2^(x % 9 - 4) */
    float scale;       /* 0 = default */
    uint64_t data_seed;
    /* The builders. */
    int64_t win_left, win_right, sink_tokens, window_tokens;
    int32_t stride, local_blocks, rand_k, topk_k, topk_sink, topk_local;
    uint8_t causal_bits; /* bit 0 strided, 1 random, 2 topk */
    uint64_t builder_seed;
    /* The block mask (the rest of the input). */
    const uint8_t *mask;
    size_t mask_len;
} layout_case;

/* Read (c reading) or write (c writing) every field of k. */
void layout_case_code(fz_codec *c, layout_case *k);

/* Bit `bit` of the mask: the tail's bytes, repeated; 0 when it is empty. */
int layout_case_mask_bit(const layout_case *k, int64_t bit);

#endif /* SK_FUZZ_LAYOUT_CASE_H */
