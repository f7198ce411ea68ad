/*
 * fz_arena.c - see fz_arena.h.
 */
#include "fz_arena.h"

#include <sanitizer/asan_interface.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fz_finding.h"

void fz_arena_init(fz_arena *a) {
    memset(a, 0, sizeof *a);
}

int fz_arena_add(fz_arena *a, const char *name, int64_t bytes, size_t align, int role) {
    if (a->n == FZ_MAX_BUFS) fz_fail("harness bug: more than %d buffers", FZ_MAX_BUFS);
    fz_buf *b = &a->b[a->n];
    memset(b, 0, sizeof *b);
    b->name = name;
    b->bytes = bytes < 0 ? 0 : bytes;
    b->align = align > 0 ? align : 1;
    b->role = role;
    return a->n++;
}

static int64_t magnitude(int64_t x) {
    return x < 0 ? -(x + 1) : x;
}

static int64_t align_up(int64_t x, int64_t al) {
    return (x + al - 1) / al * al;
}

int fz_arena_place(fz_arena *a, const fz_place *p, int64_t cap_bytes) {
    int64_t total = 0;
    for (int i = 0; i < a->n; ++i) {
        if (a->b[i].bytes > cap_bytes) return 0;
        total += a->b[i].bytes;
    }
    if (total > cap_bytes) return 0;
    const int mode = p->mode % 3;
    if (mode == 0) {
        for (int i = 0; i < a->n; ++i) {
            if (p->null_mask & (1u << i)) continue;
            a->own[i] = (uint8_t *)malloc((size_t)a->b[i].bytes);
            if (a->own[i] == NULL && a->b[i].bytes > 0) fz_fail("harness: out of memory");
            a->b[i].ptr = a->own[i];
            if (a->b[i].ptr != NULL) memset(a->b[i].ptr, 0xFF, (size_t)a->b[i].bytes);
        }
        return 1;
    }
    int64_t off[FZ_MAX_BUFS], end = 0, cursor = 0;
    for (int i = 0; i < a->n; ++i) {
        const int64_t al = (int64_t)a->b[i].align;
        if (mode == 1)
            off[i] = align_up(cursor + magnitude(p->at[i]) % 65, al);
        else
            off[i] = magnitude(p->at[i]) % (total + 1) / al * al;
        if (p->misalign & (1u << i)) off[i] += 1;
        cursor = off[i] + a->b[i].bytes;
        if (cursor > end) end = cursor;
    }
    a->block_bytes = (size_t)(end > 0 ? end : 1);
    a->block = (uint8_t *)malloc(a->block_bytes);
    if (a->block == NULL) fz_fail("harness: out of memory");
    ASAN_POISON_MEMORY_REGION(a->block, a->block_bytes);
    for (int i = 0; i < a->n; ++i) {
        if (p->null_mask & (1u << i)) continue;
        a->b[i].ptr = a->block + off[i];
        ASAN_UNPOISON_MEMORY_REGION(a->b[i].ptr, (size_t)a->b[i].bytes);
    }
    for (int i = 0; i < a->n; ++i)
        if (a->b[i].ptr != NULL) memset(a->b[i].ptr, 0xFF, (size_t)a->b[i].bytes);
    return 1;
}

uint8_t *fz_arena_wmask(fz_arena *a, int i) {
    fz_buf *b = &a->b[i];
    if (b->wmask == NULL) b->wmask = (uint8_t *)calloc((size_t)b->bytes + 1, 1);
    if (b->wmask == NULL) fz_fail("harness: out of memory");
    return b->wmask;
}

void fz_arena_snapshot(fz_arena *a) {
    for (int i = 0; i < a->n; ++i) {
        fz_buf *b = &a->b[i];
        free(b->snap);
        b->snap = (uint8_t *)malloc((size_t)b->bytes + 1);
        if (b->snap == NULL) fz_fail("harness: out of memory");
        if (b->ptr != NULL) memcpy(b->snap, b->ptr, (size_t)b->bytes);
    }
}

/* Byte p lies in a WRITE buffer other than `self`. */
static int in_output(const fz_arena *a, const uint8_t *p, int self) {
    for (int i = 0; i < a->n; ++i)
        if (i != self && a->b[i].role == FZ_WRITE && a->b[i].ptr != NULL && p >= a->b[i].ptr &&
            p < a->b[i].ptr + a->b[i].bytes)
            return 1;
    return 0;
}

/* The first byte of buffer i that changed where it may not, or -1. After
 * a failure nothing may change; after a success (`success`) an output may
 * change inside its mask, and an unused buffer (the CPU workspace,
 * documented as 0 bytes) where it shares bytes with an output. */
static int64_t first_change(const fz_arena *a, int i, int success) {
    const fz_buf *b = &a->b[i];
    if (b->ptr == NULL) return -1;
    for (int64_t x = 0; x < b->bytes; ++x) {
        if (b->ptr[x] == b->snap[x]) continue;
        if (success && b->role == FZ_WRITE && (b->wmask == NULL || b->wmask[x])) continue;
        if (success && b->role == FZ_UNUSED && in_output(a, b->ptr + x, i)) continue;
        return x;
    }
    return -1;
}

void fz_arena_check_untouched(const fz_arena *a, const char *api) {
    for (int i = 0; i < a->n; ++i) {
        const int64_t x = first_change(a, i, 0);
        if (x >= 0)
            fz_fail("%s failed but changed %s at byte %lld of %lld (0x%02x -> 0x%02x)", api,
                    a->b[i].name, (long long)x, (long long)a->b[i].bytes, a->b[i].snap[x],
                    a->b[i].ptr[x]);
    }
}

void fz_arena_check_writes(const fz_arena *a, const char *api) {
    for (int i = 0; i < a->n; ++i) {
        const fz_buf *b = &a->b[i];
        const int64_t x = first_change(a, i, 1);
        if (x >= 0)
            fz_fail("%s changed %s %s at byte %lld of %lld (0x%02x -> 0x%02x)", api,
                    b->role == FZ_WRITE ? "output" : "input", b->name, (long long)x,
                    (long long)b->bytes, b->snap[x], b->ptr[x]);
    }
}

int fz_arena_overlap(const fz_arena *a, char *why, size_t len) {
    for (int i = 0; i < a->n; ++i) {
        const fz_buf *w = &a->b[i];
        if (w->role != FZ_WRITE || w->ptr == NULL || w->bytes == 0) continue;
        for (int j = 0; j < a->n; ++j) {
            const fz_buf *x = &a->b[j];
            if (j == i || x->role == FZ_UNUSED || x->ptr == NULL || x->bytes == 0) continue;
            if (w->ptr < x->ptr + x->bytes && x->ptr < w->ptr + w->bytes) {
                snprintf(why, len, "output %s [%lld bytes] overlaps %s %s [%lld bytes]", w->name,
                         (long long)w->bytes, x->role == FZ_WRITE ? "output" : "input", x->name,
                         (long long)x->bytes);
                return 1;
            }
        }
    }
    return 0;
}

void fz_arena_free(fz_arena *a) {
    for (int i = 0; i < a->n; ++i) {
        free(a->own[i]);
        free(a->b[i].wmask);
        free(a->b[i].snap);
    }
    if (a->block != NULL) {
        ASAN_UNPOISON_MEMORY_REGION(a->block, a->block_bytes);
        free(a->block);
    }
    memset(a, 0, sizeof *a);
}

int fz_arena_fillable(const fz_arena *a, int i) {
    return a->b[i].ptr != NULL && (uintptr_t)a->b[i].ptr % a->b[i].align == 0;
}
