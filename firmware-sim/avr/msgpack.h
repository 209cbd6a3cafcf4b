/* The msgpack subset the gateway's messages use (sensors/protocol.py): a writer into a fixed
 * buffer and a bounds-checked reader. Every write and read is checked: an overflowing message
 * sets `overflow` (the caller drops it), a malformed one sets `err` (the caller refuses it). */
#ifndef MSGPACK_H
#define MSGPACK_H

#include <stdint.h>

struct mp_writer {
    uint8_t *buf;
    uint8_t cap, len;
    uint8_t overflow;
};

void mp_byte(struct mp_writer *w, uint8_t b);
void mp_bytes(struct mp_writer *w, const void *p, uint8_t n);
void mp_array(struct mp_writer *w, uint8_t n);
void mp_map(struct mp_writer *w, uint8_t n);
void mp_str(struct mp_writer *w, const char *s);
void mp_uint(struct mp_writer *w, uint32_t v);
void mp_nil(struct mp_writer *w);
void mp_bool(struct mp_writer *w, uint8_t v);
void mp_float(struct mp_writer *w, float v);
/* `ms` / 1000 as a msgpack number: an integer for whole seconds, else the nearest float64. */
void mp_seconds(struct mp_writer *w, uint64_t ms);

struct mp_reader {
    const uint8_t *p, *end;
    uint8_t err;
};

/* Each returns 0 and sets `err` when the next value is not of the asked type. */
uint8_t mp_read_array(struct mp_reader *r, uint8_t *n);
uint8_t mp_read_map(struct mp_reader *r, uint8_t *n);
uint8_t mp_read_str(struct mp_reader *r, const char **s, uint8_t *n);
uint8_t mp_read_uint(struct mp_reader *r, uint32_t *v);
/* Any unsigned integer encoding, up to 64 bits (counters). */
uint8_t mp_read_u64(struct mp_reader *r, uint64_t *v);
/* Any number (int, float32, float64) as a float. */
uint8_t mp_read_number(struct mp_reader *r, float *v);
/* Consumes a nil and returns 1, or returns 0 and consumes nothing. */
uint8_t mp_read_nil(struct mp_reader *r);
uint8_t mp_skip(struct mp_reader *r, uint8_t depth);
/* 1 if the string (s, n) equals the C string `c`. */
uint8_t mp_str_eq(const char *s, uint8_t n, const char *c);

#endif
