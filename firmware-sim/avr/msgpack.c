/* msgpack subset: see msgpack.h. Big-endian on the wire, as the msgpack spec says. */
#include <string.h>

#include "msgpack.h"

void mp_byte(struct mp_writer *w, uint8_t b)
{
    if (w->len >= w->cap) {
        w->overflow = 1;
        return;
    }
    w->buf[w->len++] = b;
}

void mp_bytes(struct mp_writer *w, const void *p, uint8_t n)
{
    if ((uint16_t)w->len + n > w->cap) {
        w->overflow = 1;
        return;
    }
    memcpy(&w->buf[w->len], p, n);
    w->len += n;
}

static void be(struct mp_writer *w, uint32_t v, uint8_t n)
{
    while (n--)
        mp_byte(w, (uint8_t)(v >> (8 * n)));
}

void mp_array(struct mp_writer *w, uint8_t n)
{
    if (n < 16) {
        mp_byte(w, (uint8_t)(0x90 | n));
    } else {
        mp_byte(w, 0xdc);
        be(w, n, 2);
    }
}

void mp_map(struct mp_writer *w, uint8_t n)
{
    if (n < 16) {
        mp_byte(w, (uint8_t)(0x80 | n));
    } else {
        mp_byte(w, 0xde);
        be(w, n, 2);
    }
}

void mp_str(struct mp_writer *w, const char *s)
{
    uint8_t n = (uint8_t)strlen(s);
    if (n < 32) {
        mp_byte(w, (uint8_t)(0xa0 | n));
    } else {
        mp_byte(w, 0xd9);
        mp_byte(w, n);
    }
    mp_bytes(w, s, n);
}

void mp_uint(struct mp_writer *w, uint32_t v)
{
    if (v < 128) {
        mp_byte(w, (uint8_t)v);
    } else if (v < 256) {
        mp_byte(w, 0xcc);
        mp_byte(w, (uint8_t)v);
    } else if (v < 65536UL) {
        mp_byte(w, 0xcd);
        be(w, v, 2);
    } else {
        mp_byte(w, 0xce);
        be(w, v, 4);
    }
}

void mp_nil(struct mp_writer *w) { mp_byte(w, 0xc0); }

void mp_bool(struct mp_writer *w, uint8_t v) { mp_byte(w, v ? 0xc3 : 0xc2); }

void mp_float(struct mp_writer *w, float v)
{
    union {
        float f;
        uint32_t u;
    } x = {.f = v};
    mp_byte(w, 0xca);
    be(w, x.u, 4);
}

void mp_seconds(struct mp_writer *w, uint64_t ms)
{
    uint64_t s = ms / 1000; /* the one 64-bit division when the time is whole seconds */
    if ((uint16_t)(ms - s * 1000) == 0 && s <= 0xffffffffULL) {
        mp_uint(w, (uint32_t)s);
        return;
    }
    /* The float64 nearest ms / 1000: q = round(ms * 2^k / 1000) with 2^52 <= q < 2^53, by
     * integer arithmetic (avr-gcc's double is 32 bits). ms > 0 here, and ms < 2^62. */
    const uint64_t top = 1000ULL << 52; /* 62 bits long */
    int16_t k = (int16_t)(__builtin_clzll(ms) - 2);
    uint64_t num = ms << k;
    if (num < top) {
        num <<= 1;
        k++;
    }
    uint64_t q = num / 1000, r = num - q * 1000;
    if (2 * r > 1000 || (2 * r == 1000 && (q & 1)))
        q++;
    if (q >> 53) {
        q >>= 1;
        k--;
    }
    uint64_t bits = ((uint64_t)(1023 + 52 - k) << 52) | (q & ((1ULL << 52) - 1));
    mp_byte(w, 0xcb);
    be(w, (uint32_t)(bits >> 32), 4);
    be(w, (uint32_t)bits, 4);
}

/* -- reading ------------------------------------------------------------------------------ */

static uint8_t take(struct mp_reader *r, uint8_t *b)
{
    if (r->err || r->p >= r->end) {
        r->err = 1;
        return 0;
    }
    *b = *r->p++;
    return 1;
}

static uint8_t take_be(struct mp_reader *r, uint8_t n, uint32_t *v)
{
    uint32_t x = 0;
    uint8_t b;
    while (n--) {
        if (!take(r, &b))
            return 0;
        x = (x << 8) | b;
    }
    *v = x;
    return 1;
}

static uint8_t fail(struct mp_reader *r)
{
    r->err = 1;
    return 0;
}

static uint8_t read_count(struct mp_reader *r, uint8_t fix, uint8_t c16, uint8_t *n)
{
    uint8_t b;
    uint32_t v;
    if (!take(r, &b))
        return 0;
    if ((b & 0xf0) == fix) {
        *n = b & 0x0f;
        return 1;
    }
    if (b == c16 && take_be(r, 2, &v) && v < 256) {
        *n = (uint8_t)v;
        return 1;
    }
    return fail(r);
}

uint8_t mp_read_array(struct mp_reader *r, uint8_t *n) { return read_count(r, 0x90, 0xdc, n); }

uint8_t mp_read_map(struct mp_reader *r, uint8_t *n) { return read_count(r, 0x80, 0xde, n); }

uint8_t mp_read_str(struct mp_reader *r, const char **s, uint8_t *n)
{
    uint8_t b;
    if (!take(r, &b))
        return 0;
    if ((b & 0xe0) == 0xa0) {
        *n = b & 0x1f;
    } else if (b == 0xd9) {
        if (!take(r, n))
            return 0;
    } else {
        return fail(r);
    }
    if (r->end - r->p < *n)
        return fail(r);
    *s = (const char *)r->p;
    r->p += *n;
    return 1;
}

uint8_t mp_read_uint(struct mp_reader *r, uint32_t *v)
{
    uint8_t b;
    uint32_t hi;
    if (!take(r, &b))
        return 0;
    if (b < 0x80) {
        *v = b;
        return 1;
    }
    switch (b) {
    case 0xcc:
        return take_be(r, 1, v);
    case 0xcd:
        return take_be(r, 2, v);
    case 0xce:
        return take_be(r, 4, v);
    case 0xcf:
        if (take_be(r, 4, &hi) && hi == 0)
            return take_be(r, 4, v);
        return fail(r);
    default:
        return fail(r);
    }
}

uint8_t mp_read_u64(struct mp_reader *r, uint64_t *v)
{
    uint32_t hi, lo;
    if (!r->err && r->p < r->end && *r->p == 0xcf) {
        r->p++;
        if (!take_be(r, 4, &hi) || !take_be(r, 4, &lo))
            return 0;
        *v = ((uint64_t)hi << 32) | lo;
        return 1;
    }
    if (!mp_read_uint(r, &lo))
        return 0;
    *v = lo;
    return 1;
}

uint8_t mp_read_number(struct mp_reader *r, float *v)
{
    uint8_t b;
    uint32_t x, lo;
    union {
        float f;
        uint32_t u;
    } f;
    if (!take(r, &b))
        return 0;
    if (b < 0x80 || b >= 0xe0) {
        *v = (float)(int8_t)b;
        return 1;
    }
    switch (b) {
    case 0xcc:
    case 0xcd:
    case 0xce:
        if (!take_be(r, (uint8_t)(1 << (b - 0xcc)), &x))
            return 0;
        *v = (float)x;
        return 1;
    case 0xd0:
        if (!take_be(r, 1, &x))
            return 0;
        *v = (float)(int8_t)x;
        return 1;
    case 0xd1:
        if (!take_be(r, 2, &x))
            return 0;
        *v = (float)(int16_t)x;
        return 1;
    case 0xd2:
        if (!take_be(r, 4, &x))
            return 0;
        *v = (float)(int32_t)x;
        return 1;
    case 0xca:
        if (!take_be(r, 4, &f.u))
            return 0;
        *v = f.f;
        return 1;
    case 0xcb: {
        /* float64 -> float32 by hand: sign, exponent rebased, mantissa truncated. */
        if (!take_be(r, 4, &x) || !take_be(r, 4, &lo))
            return 0;
        int16_t e = (int16_t)((x >> 20) & 0x7ff);
        uint32_t sign = x & 0x80000000UL;
        if (e == 0x7ff)
            return fail(r); /* inf, nan */
        e -= 1023;
        if (e == -1023 || e < -126) {
            f.u = sign; /* zero, or too small for a float: zero */
        } else if (e > 127) {
            return fail(r);
        } else {
            uint32_t mant = ((x & 0xfffffUL) << 3) | (lo >> 29);
            f.u = sign | ((uint32_t)(e + 127) << 23) | mant;
        }
        *v = f.f;
        return 1;
    }
    default:
        return fail(r);
    }
}

uint8_t mp_read_nil(struct mp_reader *r)
{
    if (!r->err && r->p < r->end && *r->p == 0xc0) {
        r->p++;
        return 1;
    }
    return 0;
}

static uint8_t skip_n(struct mp_reader *r, uint32_t n)
{
    if ((uint32_t)(r->end - r->p) < n)
        return fail(r);
    r->p += n;
    return 1;
}

uint8_t mp_skip(struct mp_reader *r, uint8_t depth)
{
    uint8_t b;
    uint32_t n = 0, items = 0;
    if (!depth)
        return fail(r);
    if (!take(r, &b))
        return 0;
    if (b < 0x80 || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3)
        return 1;
    if ((b & 0xe0) == 0xa0)
        return skip_n(r, b & 0x1f);
    if ((b & 0xf0) == 0x90)
        items = b & 0x0f;
    else if ((b & 0xf0) == 0x80)
        items = 2u * (b & 0x0f);
    else
        switch (b) {
        case 0xcc:
        case 0xd0:
            return skip_n(r, 1);
        case 0xcd:
        case 0xd1:
            return skip_n(r, 2);
        case 0xce:
        case 0xd2:
        case 0xca:
            return skip_n(r, 4);
        case 0xcf:
        case 0xd3:
        case 0xcb:
            return skip_n(r, 8);
        case 0xd9:
        case 0xc4:
            return take_be(r, 1, &n) && skip_n(r, n);
        case 0xda:
        case 0xc5:
            return take_be(r, 2, &n) && skip_n(r, n);
        case 0xdc:
            if (!take_be(r, 2, &items))
                return 0;
            break;
        case 0xde:
            if (!take_be(r, 2, &items))
                return 0;
            items *= 2;
            break;
        default:
            return fail(r); /* 32-bit lengths and extension types: not in this protocol */
        }
    while (items--)
        if (!mp_skip(r, (uint8_t)(depth - 1)))
            return 0;
    return 1;
}

uint8_t mp_str_eq(const char *s, uint8_t n, const char *c)
{
    return strlen(c) == n && memcmp(s, c, n) == 0;
}
