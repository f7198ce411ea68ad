/*
 * fz_codec.c - see fz_codec.h.
 */
#include "fz_codec.h"

#include <stdlib.h>
#include <string.h>

void fz_codec_reader(fz_codec *c, const uint8_t *data, size_t size) {
    memset(c, 0, sizeof *c);
    c->in = data;
    c->in_left = size;
}

void fz_codec_writer(fz_codec *c) {
    memset(c, 0, sizeof *c);
    c->writing = 1;
}

void fz_codec_free(fz_codec *c) {
    free(c->out);
    c->out = NULL;
    c->out_len = c->out_cap = 0;
}

/* n bytes of an unsigned little-endian value. */
static uint64_t get_bytes(fz_codec *c, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n && c->in_left > 0; ++i) {
        v |= (uint64_t)c->in[0] << (8 * i);
        ++c->in;
        --c->in_left;
    }
    return v;
}

static void put_raw(fz_codec *c, const uint8_t *bytes, size_t n) {
    if (c->out_len + n > c->out_cap) {
        size_t cap = c->out_cap ? c->out_cap : 256;
        while (cap < c->out_len + n) cap *= 2;
        uint8_t *grown = (uint8_t *)realloc(c->out, cap);
        if (grown == NULL) abort(); /* the seed program only: nothing to recover */
        c->out = grown;
        c->out_cap = cap;
    }
    memcpy(c->out + c->out_len, bytes, n);
    c->out_len += n;
}

static void put_bytes(fz_codec *c, uint64_t v, int n) {
    uint8_t b[8];
    for (int i = 0; i < n; ++i) b[i] = (uint8_t)(v >> (8 * i));
    put_raw(c, b, (size_t)n);
}

void fz_u8(fz_codec *c, uint8_t *v) {
    if (c->writing)
        put_bytes(c, *v, 1);
    else
        *v = (uint8_t)get_bytes(c, 1);
}

void fz_u16(fz_codec *c, uint16_t *v) {
    if (c->writing)
        put_bytes(c, *v, 2);
    else
        *v = (uint16_t)get_bytes(c, 2);
}

void fz_u32(fz_codec *c, uint32_t *v) {
    if (c->writing)
        put_bytes(c, *v, 4);
    else
        *v = (uint32_t)get_bytes(c, 4);
}

void fz_u64(fz_codec *c, uint64_t *v) {
    if (c->writing)
        put_bytes(c, *v, 8);
    else
        *v = get_bytes(c, 8);
}

void fz_f32(fz_codec *c, float *v) {
    uint32_t bits;
    memcpy(&bits, v, 4);
    fz_u32(c, &bits);
    memcpy(v, &bits, 4);
}

void fz_i64(fz_codec *c, int64_t *v) {
    if (!c->writing) {
        const uint8_t tag = (uint8_t)(get_bytes(c, 1) % 4);
        if (tag == 0)
            *v = (int16_t)get_bytes(c, 2);
        else if (tag == 1)
            *v = INT64_MAX - (int64_t)get_bytes(c, 2);
        else if (tag == 2)
            *v = (int64_t)INT32_MAX + (int16_t)get_bytes(c, 2);
        else
            *v = (int64_t)get_bytes(c, 8);
        return;
    }
    const int64_t x = *v;
    if (x >= INT16_MIN && x <= INT16_MAX) {
        put_bytes(c, 0, 1);
        put_bytes(c, (uint16_t)(int16_t)x, 2);
    } else if (x >= INT64_MAX - UINT16_MAX) {
        put_bytes(c, 1, 1);
        put_bytes(c, (uint64_t)(INT64_MAX - x), 2);
    } else if (x >= (int64_t)INT32_MAX + INT16_MIN && x <= (int64_t)INT32_MAX + INT16_MAX) {
        put_bytes(c, 2, 1);
        put_bytes(c, (uint16_t)(int16_t)(x - INT32_MAX), 2);
    } else {
        put_bytes(c, 3, 1);
        put_bytes(c, (uint64_t)x, 8);
    }
}

void fz_i32(fz_codec *c, int32_t *v) {
    if (!c->writing) {
        const uint8_t tag = (uint8_t)(get_bytes(c, 1) % 3);
        if (tag == 0)
            *v = (int16_t)get_bytes(c, 2);
        else if (tag == 1)
            *v = INT32_MAX - (int32_t)get_bytes(c, 2);
        else
            *v = (int32_t)(uint32_t)get_bytes(c, 4);
        return;
    }
    const int32_t x = *v;
    if (x >= INT16_MIN && x <= INT16_MAX) {
        put_bytes(c, 0, 1);
        put_bytes(c, (uint16_t)(int16_t)x, 2);
    } else if (x >= INT32_MAX - UINT16_MAX) {
        put_bytes(c, 1, 1);
        put_bytes(c, (uint64_t)(INT32_MAX - x), 2);
    } else {
        put_bytes(c, 2, 1);
        put_bytes(c, (uint32_t)x, 4);
    }
}

void fz_tail(fz_codec *c, const uint8_t **bytes, size_t *len) {
    if (c->writing) {
        if (*len > 0) put_raw(c, *bytes, *len);
        return;
    }
    *bytes = c->in;
    *len = c->in_left;
    c->in += c->in_left;
    c->in_left = 0;
}
