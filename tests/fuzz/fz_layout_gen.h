/*
 * fz_layout_gen.h - the layouts the harnesses make from their inputs: the
 * grid's codec, the BSR arrays of a block mask with a count offset, and
 * the edits that then break them (an offset, index or count set or moved).
 */
#ifndef SK_FUZZ_LAYOUT_GEN_H
#define SK_FUZZ_LAYOUT_GEN_H

#include <stdint.h>

#include "fz_codec.h"
#include "sparsek.h"

/* The grid's fields, rows and cols wide 64-bit, the others wide 32-bit. */
void fz_grid_code(fz_codec *c, sk_grid *g);

/* An edit: kind % 4 = 0 set, 1 add, to the first array (row offsets, or
 * flex counts); 2 set, 3 add, to the second (column indices); at position
 * pos modulo the array's length. */
typedef struct fz_edit {
    uint8_t kind;
    uint16_t pos;
    int32_t value;
} fz_edit;

/* A count of edits (modulo max + 1 when read), then the edits. */
void fz_edits_code(fz_codec *c, uint8_t *n, fz_edit *edits, int max);

/* Apply the edits to arrays a (first) and b (second) of na, nb entries. */
void fz_edits_apply(const fz_edit *edits, int n, int32_t *a, int64_t na, int32_t *b, int64_t nb);

/* BSR arrays of the block mask sel[rows * cb] (non-zero: selected), nnz =
 * its count + nnz_delta clamped to int32: *off gets rows + 1 entries,
 * *idx max(nnz, 0) (indices past the mask's count are filler); both
 * malloc'd. 0 (nothing allocated) when nnz is above nnz_cap. */
int fz_layout_from_mask(const uint8_t *sel, int64_t rows, int64_t cb, int32_t nnz_delta,
                        int64_t nnz_cap, int32_t **off, int32_t **idx, int32_t *nnz);

#endif /* SK_FUZZ_LAYOUT_GEN_H */
