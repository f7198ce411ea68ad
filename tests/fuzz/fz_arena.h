/*
 * fz_arena.h - where a call's buffers lie: each at exactly its documented
 * byte span, so that a stray access trips AddressSanitizer.
 *
 * Placement (fz_place, decoded from the input):
 *   mode 0  each buffer its own allocation of exactly its span
 *   mode 1  one arena, buffers in order with fuzzed gaps (0 = abutting)
 *   mode 2  one arena, each buffer at a fuzzed offset (so they may overlap)
 * In an arena the gaps are poisoned (ASAN_POISON_MEMORY_REGION), so an
 * access outside every buffer is reported as if each had its own block. A
 * bit of `misalign` shifts a buffer by one byte; a bit of `null_mask`
 * passes NULL for it.
 *
 * Roles: a READ buffer must not change; a WRITE buffer may change only in
 * the bytes its mask allows (all, when it has none), and only on success;
 * an UNUSED buffer (the workspace of the CPU backend) must not change. The
 * documented rule that outputs never overlap anything else the call touches
 * is fz_arena_overlap.
 */
#ifndef SK_FUZZ_ARENA_H
#define SK_FUZZ_ARENA_H

#include <stddef.h>
#include <stdint.h>

/* 16: the attention backward passes 12 buffers (tensors, layout arrays,
 * workspace). */
enum { FZ_MAX_BUFS = 16 };
enum { FZ_READ = 0, FZ_WRITE = 1, FZ_UNUSED = 2 };

typedef struct fz_place {
    uint8_t mode;
    uint16_t misalign;       /* bit i: buffer i one byte off its alignment */
    uint16_t null_mask;      /* bit i: buffer i passed as NULL */
    int64_t at[FZ_MAX_BUFS]; /* gap (mode 1) or offset (mode 2) of buffer i */
} fz_place;

typedef struct fz_buf {
    const char *name;
    int64_t bytes;  /* the documented span */
    size_t align;   /* its elements' alignment */
    int role;       /* FZ_READ, FZ_WRITE, FZ_UNUSED */
    uint8_t *ptr;   /* where it lies (NULL when passed as NULL) */
    uint8_t *wmask; /* WRITE: bytes a success may change (NULL: all); owned */
    uint8_t *snap;  /* the contents before the call; owned */
} fz_buf;

typedef struct fz_arena {
    int n;
    fz_buf b[FZ_MAX_BUFS];
    uint8_t *block; /* the arena (modes 1, 2) */
    size_t block_bytes;
    uint8_t *own[FZ_MAX_BUFS]; /* the buffers' own blocks (mode 0) */
} fz_arena;

void fz_arena_init(fz_arena *a);
/* A buffer; returns its index. */
int fz_arena_add(fz_arena *a, const char *name, int64_t bytes, size_t align, int role);
/* Place every buffer (contents 0xFF); 0 when the total exceeds cap_bytes
 * (then nothing is allocated and the call should be skipped). */
int fz_arena_place(fz_arena *a, const fz_place *p, int64_t cap_bytes);
/* A mask of the bytes a success may change in buffer i (zeroed; the caller
 * marks them). */
uint8_t *fz_arena_wmask(fz_arena *a, int i);
/* Keep every buffer's contents (after the caller filled the inputs). */
void fz_arena_snapshot(fz_arena *a);
/* A failed call: every buffer as it was. */
void fz_arena_check_untouched(const fz_arena *a, const char *api);
/* A successful call: READ and UNUSED buffers as they were, WRITE buffers
 * changed only inside their masks. */
void fz_arena_check_writes(const fz_arena *a, const char *api);
/* 1 when a WRITE buffer overlaps another READ or WRITE buffer (both non-NULL,
 * non-empty); names them in why. */
int fz_arena_overlap(const fz_arena *a, char *why, size_t len);
void fz_arena_free(fz_arena *a);
/* Buffer i is present and aligned to its elements, so the harness may
 * store values into it (a misaligned one is left 0xFF: only a refusal is
 * expected of the call). */
int fz_arena_fillable(const fz_arena *a, int i);

#endif /* SK_FUZZ_ARENA_H */
