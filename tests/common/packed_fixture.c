/*
 * packed_fixture.c - the shared parts of the packed calls' bad-input
 * fixtures (packed_fixture.h).
 */
#include "common/packed_fixture.h"

#include <stdlib.h>
#include <string.h>

#include "common/harness.h"

int pk_alloc(pk_buffers *b, int n, const size_t *bytes, const char *const *names, int inputs,
             tu_rng *rng) {
    memset(b, 0, sizeof *b);
    b->n = n;
    b->names = names;
    for (int i = 0; i < n; ++i) {
        b->bytes[i] = bytes[i];
        b->p[i] = (unsigned char *)malloc(bytes[i] + 16);
        b->copy[i] = (unsigned char *)malloc(bytes[i] + 16);
        if (b->p[i] == NULL || b->copy[i] == NULL) return 0;
        for (size_t x = 0; x < bytes[i] + 16; ++x)
            b->p[i][x] = i < inputs ? (unsigned char)(tu_rng_next(rng) & 0x3f) : PK_SENTINEL;
        b->arg[i] = b->p[i];
    }
    return 1;
}

void pk_free(pk_buffers *b) {
    for (int i = 0; i < b->n; ++i) free(b->p[i]), free(b->copy[i]);
}

size_t pk_untouched(const pk_buffers *b, int i, size_t es) {
    size_t count = 0;
    for (size_t x = 0; x + es <= b->bytes[i]; x += es) {
        size_t same = 0;
        while (same < es && b->p[i][x + same] == PK_SENTINEL) ++same;
        count += same == es;
    }
    return count;
}

void pk_layout_init(pk_layout *l) {
    const int32_t offsets[7] = {0, 1, 1, 1, 2, 2, 2}, indices[2] = {0, 0};
    memcpy(l->offsets, offsets, sizeof offsets);
    memcpy(l->indices, indices, sizeof indices);
    l->bsr.grid = tu_grid(3 * 64, 130, 64, 64, 1, 2);
    l->bsr.nnz = 2;
    l->bsr.row_offsets = l->offsets;
    l->bsr.col_indices = l->indices;
}

void pk_snapshot(pk_buffers *b, pk_layout *l) {
    for (int i = 0; i < b->n; ++i) memcpy(b->copy[i], b->p[i], b->bytes[i] + 16);
    if (l == NULL) return;
    memcpy(l->off_copy, l->offsets, sizeof l->offsets);
    memcpy(l->idx_copy, l->indices, sizeof l->indices);
}

void pk_expect(const pk_buffers *b, const pk_layout *l, const char *call, sk_status got,
               sk_status want, sk_status want2, const char *needle) {
    const char *msg = sk_last_error();
    CHECK(got == want || (want2 != SK_STATUS_SUCCESS && got == want2), "%s: got %s, want %s (%s)",
          call, sk_status_name(got), sk_status_name(want), msg);
    CHECK(strstr(msg, call) != NULL, "message does not name %s: \"%s\"", call, msg);
    CHECK(strstr(msg, needle) != NULL, "message does not mention \"%s\": \"%s\"", needle, msg);
    for (int i = 0; i < b->n; ++i)
        CHECK(memcmp(b->copy[i], b->p[i], b->bytes[i] + 16) == 0, "%s: buffer %s was written",
              call, b->names[i]);
    if (l != NULL)
        CHECK(memcmp(l->off_copy, l->offsets, sizeof l->offsets) == 0 &&
                  memcmp(l->idx_copy, l->indices, sizeof l->indices) == 0,
              "%s: the layout arrays were written", call);
}
