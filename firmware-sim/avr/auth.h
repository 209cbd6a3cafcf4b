/* Authenticated messages (sensors/auth.py): HMAC-SHA256 tags, truncated to 8 bytes.
 *
 * The key's inner and outer HMAC states are computed once (auth_set_key), so a tag costs
 * ceil((len + 9) / 64) compressions for the message and one for the outer hash: a message of
 * up to 55 bytes costs two SHA-256 blocks, one of up to 119 bytes three. */
#ifndef AUTH_H
#define AUTH_H

#include <stdint.h>

#define AUTH_KEY_BYTES 16
#define AUTH_TAG_BYTES 8

void auth_set_key(const uint8_t *key);
/* The tag of `len` bytes (the envelope `[1, kind, body, counter]` as written). */
void auth_tag(const uint8_t *msg, uint8_t len, uint8_t *tag);
/* 1 if `tag` is the tag of the `len` bytes at `msg` (every byte compared). */
uint8_t auth_check(const uint8_t *msg, uint8_t len, const uint8_t *tag);

#endif
