/*
 * fz_codec.h - the byte format of the fuzz inputs, one definition for both
 * directions: a harness decodes libFuzzer's bytes into a case struct, and
 * tests/fuzz/make_seeds.c encodes hand-written case structs into the seed
 * corpus with the very same field functions, so the two cannot drift.
 *
 * A case format is one function that calls fz_u8 / fz_i64 / ... on each of
 * its fields in order; in reading mode each call fills the field from the
 * input (zero once the input runs out, so every byte string decodes), in
 * writing mode it appends the field's bytes. Integers are little-endian.
 *
 * The "wide" integer codecs spend a tag byte to reach the values where size
 * checks break, so that one mutated byte moves a field between them:
 *   fz_i64: tag % 4 = 0  a small signed value (int16)
 *                     1  INT64_MAX - u16
 *                     2  INT32_MAX + int16 (products and counts near int32)
 *                     3  any 64-bit pattern
 *   fz_i32: tag % 3 = 0  a small signed value (int16)
 *                     1  INT32_MAX - u16
 *                     2  any 32-bit pattern
 * Writing picks the first tag that spells the value.
 */
#ifndef SK_FUZZ_CODEC_H
#define SK_FUZZ_CODEC_H

#include <stddef.h>
#include <stdint.h>

typedef struct fz_codec {
    int writing;
    const uint8_t *in; /* reading: the input and what is left of it */
    size_t in_left;
    uint8_t *out; /* writing: a growing buffer (fz_codec_free releases it) */
    size_t out_len, out_cap;
} fz_codec;

void fz_codec_reader(fz_codec *c, const uint8_t *data, size_t size);
void fz_codec_writer(fz_codec *c);
void fz_codec_free(fz_codec *c);

void fz_u8(fz_codec *c, uint8_t *v);
void fz_u16(fz_codec *c, uint16_t *v);
void fz_u32(fz_codec *c, uint32_t *v);
void fz_u64(fz_codec *c, uint64_t *v);
void fz_i32(fz_codec *c, int32_t *v); /* wide codec */
void fz_i64(fz_codec *c, int64_t *v); /* wide codec */
void fz_f32(fz_codec *c, float *v);   /* the raw bits */

/* The rest of the input (reading: *len bytes at *bytes, borrowed) or the
 * given bytes (writing); always the last field of a format. */
void fz_tail(fz_codec *c, const uint8_t **bytes, size_t *len);

#endif /* SK_FUZZ_CODEC_H */
