/* HMAC-SHA256 (FIPS 180-4, RFC 2104) for the AVR: see auth.h. A compact SHA-256: the round
 * constants in flash, a 16-word message schedule computed in place, one 64-byte block buffer.
 * Compiled with -O2 (the Makefile). */
#include <avr/pgmspace.h>
#include <string.h>

#include "auth.h"

static const uint32_t K[64] PROGMEM = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
    0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
    0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
    0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
    0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
    0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
    0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2,
};

static const uint32_t H0[8] PROGMEM = {
    0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab,
    0x5be0cd19,
};

static uint32_t inner[8], outer[8]; /* after the key's ipad and opad blocks */
static uint32_t state[8], w[16];
static uint8_t block[64], digest[32];

/* Rotations as whole-byte moves plus at most three 1-bit rotations: avr-gcc shifts a 32-bit
 * value by n bits in a loop of n steps, which made a block cost about 170,000 cycles. */
static inline uint32_t rotr1(uint32_t x)
{
    __asm__("bst %A0, 0\n\tror %D0\n\tror %C0\n\tror %B0\n\tror %A0\n\tbld %D0, 7" : "+r"(x));
    return x;
}

static inline uint32_t rotl1(uint32_t x)
{
    __asm__("lsl %A0\n\trol %B0\n\trol %C0\n\trol %D0\n\tadc %A0, __zero_reg__" : "+r"(x));
    return x;
}

static inline uint32_t rotr8(uint32_t x) { return (x >> 8) | (x << 24); }
static inline uint32_t rotr16(uint32_t x) { return (x >> 16) | (x << 16); }
static inline uint32_t rotr24(uint32_t x) { return (x >> 24) | (x << 8); }

/* Sigma functions of FIPS 180-4 section 4.1.2, in those terms. */
static inline uint32_t big0(uint32_t a) /* ror 2 ^ ror 13 ^ ror 22 */
{
    uint32_t r2 = rotr1(rotr1(a)), r13 = rotl1(rotl1(rotl1(rotr16(a))));
    return r2 ^ r13 ^ rotl1(rotl1(rotr24(a)));
}

static inline uint32_t big1(uint32_t e) /* ror 6 ^ ror 11 ^ ror 25 */
{
    uint32_t r8 = rotr8(e);
    return rotl1(rotl1(r8)) ^ rotr1(rotr1(rotr1(r8))) ^ rotr1(rotr24(e));
}

static inline uint32_t small0(uint32_t x) /* ror 7 ^ ror 18 ^ shr 3 */
{
    uint32_t r16 = rotr16(x);
    return rotl1(rotr8(x)) ^ rotr1(rotr1(r16)) ^ (rotr1(rotr1(rotr1(x))) & 0x1fffffffUL);
}

static inline uint32_t small1(uint32_t x) /* ror 17 ^ ror 19 ^ shr 10 */
{
    uint32_t r17 = rotr1(rotr16(x));
    return r17 ^ rotr1(rotr1(r17)) ^ (rotr1(rotr1(x >> 8)) & 0x003fffffUL);
}

static uint32_t be32(const uint8_t *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint16_t)p[2] << 8) | p[3];
}

static void put32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static void compress(uint32_t *h, const uint8_t *p)
{
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
    for (uint8_t i = 0; i < 16; i++)
        w[i] = be32(p + 4 * i);
    for (uint8_t i = 0; i < 64; i++) {
        uint32_t x = w[i & 15];
        if (i >= 16) {
            uint32_t w15 = w[(i + 1) & 15], w2 = w[(i + 14) & 15];
            x += small0(w15) + w[(i + 9) & 15] + small1(w2);
            w[i & 15] = x;
        }
        uint32_t t1 = k + big1(e) + (g ^ (e & (f ^ g))) + pgm_read_dword(&K[i]) + x;
        uint32_t t2 = big0(a) + ((a & b) ^ (c & (a ^ b)));
        k = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
    h[4] += e;
    h[5] += f;
    h[6] += g;
    h[7] += k;
}

/* The rest of a hash whose first 64 bytes (the key block) are in `h`: `len` bytes, padding. */
static void finish(uint32_t *h, const uint8_t *p, uint8_t len)
{
    uint16_t bits = (uint16_t)(64 + len) * 8;
    while (len >= 64) {
        compress(h, p);
        p += 64;
        len -= 64;
    }
    memset(block, 0, sizeof block);
    memcpy(block, p, len);
    block[len] = 0x80;
    if (len >= 56) {
        compress(h, block);
        memset(block, 0, sizeof block);
    }
    block[62] = (uint8_t)(bits >> 8);
    block[63] = (uint8_t)bits;
    compress(h, block);
}

static void key_state(uint32_t *h, const uint8_t *key, uint8_t pad)
{
    memset(block, pad, sizeof block);
    for (uint8_t i = 0; i < AUTH_KEY_BYTES; i++)
        block[i] ^= key[i];
    memcpy_P(h, H0, sizeof H0);
    compress(h, block);
}

void auth_set_key(const uint8_t *key)
{
    key_state(inner, key, 0x36);
    key_state(outer, key, 0x5c);
    memset(block, 0, sizeof block); /* no key bytes left in RAM but the states */
}

void auth_tag(const uint8_t *msg, uint8_t len, uint8_t *tag)
{
    memcpy(state, inner, sizeof state);
    finish(state, msg, len);
    for (uint8_t i = 0; i < 8; i++)
        put32(&digest[4 * i], state[i]);
    memcpy(state, outer, sizeof state);
    finish(state, digest, sizeof digest);
    put32(tag, state[0]);
    put32(tag + 4, state[1]);
}

uint8_t auth_check(const uint8_t *msg, uint8_t len, const uint8_t *tag)
{
    uint8_t mine[AUTH_TAG_BYTES], diff = 0;
    auth_tag(msg, len, mine);
    for (uint8_t i = 0; i < AUTH_TAG_BYTES; i++)
        diff |= (uint8_t)(mine[i] ^ tag[i]);
    return diff == 0;
}
