/*
 * packed_fixture.h - what the bad-input tests of the packed calls (varlen,
 * paged: tests/cpu/test_varlen_bad_inputs.c, test_paged_bad_inputs.c) and
 * of the backward (test_backward_bad_inputs.c, buffers only) share: their
 * byte buffers with snapshots, the check that a call failed as expected
 * and wrote nothing, and the packed calls' common layout.
 *
 * The layout: B = 3 sequences of (len_q, len_k) (50, 60), (0, 130),
 * (70, 0), blocks 64, one slice per KV head (2): R = 3 rows per slice,
 * sequence 0's one row selecting its one key block, sequence 2's two rows
 * empty; grid 192 x 130 tokens.
 */
#ifndef SK_TESTS_PACKED_FIXTURE_H
#define SK_TESTS_PACKED_FIXTURE_H

#include <stddef.h>
#include <stdint.h>

#include "common/test_util.h"
#include "sparsek.h"

enum { PK_MAXBUF = 10, PK_SENTINEL = 0xA5 };

typedef struct pk_buffers {
    int n;
    const char *const *names;
    unsigned char *p[PK_MAXBUF], *copy[PK_MAXBUF];
    size_t bytes[PK_MAXBUF];
    void *arg[PK_MAXBUF]; /* what each buffer's argument is (a test may move it) */
} pk_buffers;

/* n buffers of bytes[i] (+ 16 spare) bytes named names[i]: the first
 * `inputs` hold small finite fp16 values (bytes below 0x40) from rng, the
 * others the 0xA5 sentinel; arg[i] = p[i]. 0 when out of memory (free
 * with pk_free either way). */
int pk_alloc(pk_buffers *b, int n, const size_t *bytes, const char *const *names, int inputs,
             tu_rng *rng);
void pk_free(pk_buffers *b);

/* The elements of buffer i (es bytes each) still all sentinel bytes. */
size_t pk_untouched(const pk_buffers *b, int i, size_t es);

/* The fixtures' layout (see above), its arrays owned here. */
typedef struct pk_layout {
    int32_t offsets[7], indices[2];
    int32_t off_copy[7], idx_copy[2];
    sk_bsr bsr;
} pk_layout;
void pk_layout_init(pk_layout *l);

/* A call's state before it runs: the buffers' and layout arrays' bytes
 * (l NULL: a test with a layout of its own, not checked here). */
void pk_snapshot(pk_buffers *b, pk_layout *l);

/* After a call named `call` returned `got`: the status is want (or want2,
 * when not SUCCESS), sk_last_error() names the call and contains needle,
 * and no buffer or layout array (l non-NULL) changed since pk_snapshot. */
void pk_expect(const pk_buffers *b, const pk_layout *l, const char *call, sk_status got,
               sk_status want, sk_status want2, const char *needle);

#endif /* SK_TESTS_PACKED_FIXTURE_H */
