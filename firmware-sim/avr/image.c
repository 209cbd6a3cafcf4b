/* The protocol image (ATmega128): every program, the gateway's wire protocol, a receive window.
 *
 * Wire: a message is the msgpack array [1, kind, [fields...]] of sensors/protocol.py, framed as
 * 00 | COBS(message | CRC-16/CCITT-FALSE big-endian) | 00 on USART0 (the radio's byte
 * interface). At boot the mote sends its hello; then per sample period it wakes on Timer1,
 * converts one reading and hands it to the loaded program, whose packed records (mote.h) become
 * `samples`, `events` or `aggregate` messages here. About every `listen_every_ms` a data message
 * carries `listen_ms` (or a bare `listen` goes out) and, once it is on the air, the receiver is
 * on for `listen_ms` (PB0 high): control messages for this mote are applied and acknowledged
 * then. INT0 (power failing) sends a last `status` offline.
 *
 * Who the mote is comes from EEPROM (struct config below; written by the programmer or by
 * firmware_sim/loop.py for simavr). Readings are A-to-D counts; `scale` counts per unit turns
 * them into the units the gateway sees, and parameters back into counts.
 *
 * With a key in EEPROM (not all 0xff) every message is sealed (sensors/auth.py):
 * [1, kind, body, counter, tag], the counter (boot_count << 32) | n, boot_count incremented in
 * EEPROM at every boot; a control is applied only if it is sealed with the key and its counter
 * is above the highest accepted so far (kept in EEPROM). Anything else is ignored, unacked,
 * and counted in `auth_rejected`. A blank key: unauthenticated, as before.
 */
#include <avr/eeprom.h>
#include <avr/interrupt.h>
#include <avr/io.h>
#include <avr/sleep.h>
#include <stddef.h>
#include <string.h>
#include <util/crc16.h>

#include "auth.h"
#include "image.h"
#include "mote.h"
#include "msgpack.h"

#define PROTOCOL_VERSION 1
#define MSG_MAX 240                        /* longest message (before CRC and COBS) */
#define FRAME_MAX (MSG_MAX + 2 + 2 + 2)    /* + CRC, COBS overhead, two delimiters */
#define SEAL_BYTES 19 /* counter as uint64 (9), tag as bin 8 (10) */
#define RX_MAX (160 + SEAL_BYTES)          /* longest control frame accepted */
#define CHUNK_MS 500                       /* Timer1 counts at most this long per match */
#define TIMER_COUNTS_PER_MS (F_CPU / 8 / 1000)
#define ADC_PRESCALE (_BV(ADPS1) | _BV(ADPS0))
#define RX_ON_PIN PB0
#define ATTR_MAX 120

struct config {
    uint8_t magic[2]; /* "FJ" */
    uint8_t version;  /* 2 */
    uint8_t program;  /* index into programs[] at boot */
    uint32_t period_ms;
    uint64_t start_ms; /* mote clock (ms) at the first sample */
    float scale;       /* A-to-D counts per reading unit */
    uint16_t listen_ms;
    uint32_t listen_every_ms;
    char id[33];
    char field[17];
    uint16_t attributes_len; /* a msgpack map of that many bytes follows the struct, */
    /* then one byte n and n bytes of the boot program's params (a msgpack map; n may be 0) */
    uint8_t key[AUTH_KEY_BYTES]; /* all 0xff: no key, unauthenticated */
    uint32_t boot_count;         /* written by the mote: +1 at every boot */
    uint64_t control_counter;    /* written by the mote: the highest control counter accepted */
} __attribute__((packed));

static struct config cfg = {
    {'F', 'J'}, 2, 0, 1000, 0, 1.0f, 20, 1000, "mote", "value", 0, {0}, 0, 0,
};
static uint8_t attributes[ATTR_MAX];
static uint8_t cfg_ok;

struct mote_params mote_params;

/* -- programs (the same sources as the single-program builds; see the Makefile) ---------- */
#define PROGRAM(name) void name##_init(void); void name##_sample(uint16_t tick, uint16_t value);
PROGRAM(raw)
PROGRAM(vehicle_up)
PROGRAM(vehicle_down)
PROGRAM(count)
PROGRAM(filter)
PROGRAM(aggregate)
PROGRAM(deadband)
/* Programs that hold readings (a batch, a window, a period) send them when told to flush. */
void raw_flush(uint16_t tick);
void aggregate_flush(uint16_t tick);
void count_flush(uint16_t tick);

enum { P_AGGREGATE, P_COUNT, P_DEADBAND, P_FILTER, P_RAW, P_VEHICLE, N_PROGRAMS };
static const char *const program_names[N_PROGRAMS] = {
    "aggregate", "count", "deadband", "filter", "raw", "vehicle",
};
static uint8_t program;
static uint8_t downstream; /* vehicle's role */
/* The loaded program's time parameters, kept in ms so SET_PERIOD can recompute samples. */
static uint32_t count_period_ms = 1000, aggregate_window_ms = 1000;
/* Aggregate windows lie on the mote clock's multiples of the window (as the gateway's windows
 * do): a program loaded mid-window first closes a short window at the next boundary. */
static uint16_t full_window_samples;
static uint8_t short_window;

/* -- state ---------------------------------------------------------------------------------- */
volatile uint16_t mote_dropped; /* messages dropped: the transmit queue was full */
/* Controls for this mote ignored, by reason (sensors/auth.py's): read by avr/loop.c. */
struct auth_rejected {
    uint16_t unsigned_, bad_mac, replay;
} auth_rejected;
static uint8_t auth_on;
static uint32_t boot_count, sealed_n; /* the next counter: (boot_count << 32) | sealed_n */
static uint64_t control_counter;      /* highest accepted; UINT64_MAX: none yet */
uint16_t rx_dropped;            /* received frames dropped: bad COBS/CRC/message, overflow */
static volatile uint8_t adc_ready, period_due, window_over, power_fail; /* period_due counts */
static volatile uint16_t adc_value;
static volatile uint32_t remaining_ms; /* of this sample period, chunk in progress included */
static volatile uint16_t chunk_ms;     /* what Timer1 is counting now */
static uint32_t period_ms;
static uint64_t sample_ms; /* mote clock of the current sample */
static uint64_t next_listen_ms;
static uint64_t sleep_window_ms, next_window_ms; /* asleep: a receive window this often */
static uint8_t asleep, listening, window_wanted;
volatile uint8_t halted; /* the last status is queued: read by avr/loop.c */
static uint16_t tick, seq;

static uint8_t tx_buf[256]; /* uint8_t indices wrap by themselves */
static volatile uint8_t tx_head, tx_tail;
static uint8_t rx_ring[256]; /* bytes as received; frames are cut in the main loop */
static volatile uint8_t rx_w, rx_lost;
static uint8_t rx_r;
static uint8_t rx_buf[RX_MAX];
static uint8_t rx_len, rx_overflow;

static uint8_t msg_buf[MSG_MAX];
static struct mp_writer w;

/* -- interrupts ----------------------------------------------------------------------------- */
static void timer_chunk(void)
{
    chunk_ms = (uint16_t)(remaining_ms > CHUNK_MS ? CHUNK_MS : remaining_ms);
    OCR1A = (uint16_t)(chunk_ms * TIMER_COUNTS_PER_MS - 1);
}

ISR(TIMER1_COMPA_vect)
{
    remaining_ms -= chunk_ms;
    if (!remaining_ms) {
        if (period_due < 255)
            period_due++; /* a late main loop still takes every sample */
        remaining_ms = period_ms;
    }
    timer_chunk();
}

ISR(ADC_vect)
{
    adc_value = ADC;
    ADCSRA = 0; /* powered only for the conversion */
    adc_ready = 1;
}

ISR(USART0_UDRE_vect)
{
    uint8_t tail = tx_tail;
    if (tail == tx_head) {
        UCSR0B &= (uint8_t)~_BV(UDRIE0);
        return;
    }
    UDR0 = tx_buf[tail];
    tx_tail = (uint8_t)(tail + 1);
}

ISR(USART0_RX_vect)
{
    uint8_t b = UDR0;
    if ((uint8_t)(rx_w + 1) == rx_r) {
        rx_lost = 1; /* the main loop fell 255 bytes behind: the frame is broken */
        return;
    }
    rx_ring[rx_w] = b;
    rx_w = (uint8_t)(rx_w + 1);
    /* Nearly full (the main loop is verifying a control: an HMAC takes ~0.1 s): leave the
     * next bytes in the USART, whose full receiver holds the sender off (XOFF). */
    if ((uint8_t)(rx_r - rx_w - 1) < 16)
        UCSR0B &= (uint8_t)~_BV(RXCIE0);
}

ISR(TIMER3_COMPA_vect) { window_over = 1; }

ISR(INT0_vect) { power_fail = 1; }

/* -- framing -------------------------------------------------------------------------------- */
static uint8_t tx_room(void) { return (uint8_t)(255 - (uint8_t)(tx_head - tx_tail)); }

static void next_boot(void)
{
    boot_count++;
    sealed_n = 0;
    eeprom_update_dword((uint32_t *)offsetof(struct config, boot_count), boot_count);
}

/* [1, kind, body] in msg_buf -> [1, kind, body, counter, tag] (room reserved by begin). */
static void seal(void)
{
    uint8_t tag[AUTH_TAG_BYTES];
    uint32_t n = sealed_n;
    w.cap += SEAL_BYTES;
    msg_buf[0] = 0x94;
    mp_byte(&w, 0xcf);
    for (int8_t i = 24; i >= 0; i -= 8)
        mp_byte(&w, (uint8_t)(boot_count >> i));
    for (int8_t i = 24; i >= 0; i -= 8)
        mp_byte(&w, (uint8_t)(n >> i));
    auth_tag(msg_buf, w.len, tag);
    msg_buf[0] = 0x95;
    mp_byte(&w, 0xc4);
    mp_byte(&w, AUTH_TAG_BYTES);
    mp_bytes(&w, tag, AUTH_TAG_BYTES);
    if (++sealed_n == 0) /* 2^32 messages in one boot: counters go on in a new "boot" */
        next_boot();
}

/* COBS-encode msg_buf + CRC into the transmit queue, or drop the whole frame. */
static void send_frame(void)
{
    static uint8_t frame[FRAME_MAX];
    uint16_t crc = 0xffff;
    if (auth_on && !w.overflow)
        seal();
    if (w.overflow) {
        mote_dropped++;
        return;
    }
    for (uint8_t i = 0; i < w.len; i++)
        crc = _crc_xmodem_update(crc, msg_buf[i]);
    msg_buf[w.len] = (uint8_t)(crc >> 8);
    msg_buf[w.len + 1] = (uint8_t)crc;
    uint8_t n = (uint8_t)(w.len + 2), out = 1, code_at = 1, code = 1;
    frame[0] = 0;
    out = 2;
    for (uint8_t i = 0; i < n; i++) {
        if (msg_buf[i]) {
            frame[out++] = msg_buf[i];
            if (++code == 0xff) {
                frame[code_at] = code;
                code_at = out++;
                code = 1;
            }
        } else {
            frame[code_at] = code;
            code_at = out++;
            code = 1;
        }
    }
    frame[code_at] = code;
    frame[out++] = 0;
    if (tx_room() < out) {
        mote_dropped++;
        return;
    }
    uint8_t head = tx_head;
    for (uint8_t i = 0; i < out; i++)
        tx_buf[head++] = frame[i];
    tx_head = head;
    UCSR0B |= _BV(UDRIE0);
}

/* -- messages ------------------------------------------------------------------------------- */
static void begin(const char *kind, uint8_t fields)
{
    w.buf = msg_buf;
    w.cap = MSG_MAX - 2 - (auth_on ? SEAL_BYTES : 0); /* room for the CRC (and the seal) */
    w.len = 0;
    w.overflow = 0;
    mp_array(&w, 3);
    mp_uint(&w, PROTOCOL_VERSION);
    mp_str(&w, kind);
    mp_array(&w, fields);
    mp_str(&w, cfg.id);
    mp_uint(&w, seq++);
}

static void send_hello(void)
{
    begin("hello", 8);
    mp_array(&w, 1); /* schema: one float field */
    mp_array(&w, 2);
    mp_str(&w, cfg.field);
    mp_str(&w, "float");
    mp_array(&w, N_PROGRAMS);
    for (uint8_t i = 0; i < N_PROGRAMS; i++)
        mp_str(&w, program_names[i]);
    mp_str(&w, program_names[program]);
    mp_uint(&w, period_ms);
    mp_nil(&w); /* battery: not measured on this board */
    if (cfg.attributes_len)
        mp_bytes(&w, attributes, (uint8_t)cfg.attributes_len);
    else
        mp_map(&w, 0);
    send_frame();
}

static void send_ack(uint32_t ack_seq, const char *error)
{
    begin("ack", 5);
    mp_uint(&w, ack_seq);
    mp_bool(&w, error == 0);
    mp_str(&w, error ? error : "");
    send_frame();
}

/* Asleep, a listen carries the mote's clock (the optional trailing `time`): a heartbeat, so
 * the gateway keeps a sleeping mote in its event-time progress. Awake it does not (a program
 * may hold older readings, e.g. a raw batch). */
static void send_listen(void)
{
    begin("listen", asleep ? 4 : 3);
    mp_uint(&w, cfg.listen_ms);
    if (asleep)
        mp_seconds(&w, sample_ms);
    send_frame();
    window_wanted = 1;
}

static void send_status_offline(const char *reason)
{
    begin("status", 5);
    mp_bool(&w, 0);
    mp_nil(&w);
    mp_str(&w, reason);
    send_frame();
}

/* A window rides on a data message once due; a bare listen goes one listen period late. */
static uint8_t listen_due(uint8_t has_data)
{
    if (sample_ms < next_listen_ms)
        return 0;
    if (!has_data && sample_ms < next_listen_ms + cfg.listen_every_ms)
        return 0;
    next_listen_ms = sample_ms + cfg.listen_every_ms;
    return 1;
}

static void end_data(void)
{
    if (listen_due(1)) {
        mp_uint(&w, cfg.listen_ms);
        window_wanted = 1;
    } else {
        mp_nil(&w);
    }
    send_frame();
}

static uint64_t tick_ms(uint16_t t) { return sample_ms - (uint64_t)(uint16_t)(tick - t) * period_ms; }

static void value(uint32_t counts)
{
    if (cfg.scale == 1.0f)
        mp_uint(&w, counts);
    else
        mp_float(&w, (float)counts / cfg.scale);
}

static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

/* The programs' packed records (mote.h) as protocol messages. */
void mote_send(uint8_t type, const uint8_t *p, uint8_t length)
{
    uint8_t n;
    switch (type) {
    case MSG_RAW: /* the batch ends with the current sample */
        n = length / 2;
        begin("samples", 5);
        mp_array(&w, n);
        for (uint8_t i = 0; i < n; i++)
            mp_seconds(&w, tick_ms((uint16_t)(tick - (n - 1 - i))));
        mp_array(&w, n);
        for (uint8_t i = 0; i < n; i++) {
            mp_array(&w, 1);
            value(get16(&p[2 * i]));
        }
        break;
    case MSG_FILTER:
    case MSG_DEADBAND:
        begin("samples", 5);
        mp_array(&w, 1);
        mp_seconds(&w, tick_ms(get16(p)));
        mp_array(&w, 1);
        mp_array(&w, 1);
        value(get16(&p[2]));
        break;
    case MSG_VEHICLE_UP:
    case MSG_VEHICLE_DOWN:
        begin("events", 5);
        mp_str(&w, type == MSG_VEHICLE_UP ? "upstream" : "downstream");
        mp_array(&w, 1);
        mp_array(&w, 2);
        mp_seconds(&w, tick_ms(get16(p)));
        mp_seconds(&w, tick_ms(get16(&p[2])));
        break;
    case MSG_COUNT: /* (end tick, vehicles) over the PERIOD_SAMPLES before the end tick */
        begin("aggregate", 6);
        mp_seconds(&w, tick_ms((uint16_t)(get16(p) - mote_params.period_samples)));
        mp_seconds(&w, tick_ms(get16(p)));
        mp_map(&w, 1);
        mp_str(&w, "count");
        mp_uint(&w, get16(&p[2]));
        break;
    case MSG_AGGREGATE: { /* (end tick, u32 sum, count, min, max) */
        uint16_t count = get16(&p[6]);
        if (short_window) { /* the first, aligning window is over: whole windows from now */
            short_window = 0;
            mote_params.window_samples = full_window_samples;
        }
        begin("aggregate", 6);
        mp_seconds(&w, tick_ms((uint16_t)(get16(p) - count)));
        mp_seconds(&w, tick_ms(get16(p)));
        mp_map(&w, 4);
        mp_str(&w, "sum");
        value((uint32_t)get16(&p[2]) | ((uint32_t)get16(&p[4]) << 16));
        mp_str(&w, "count");
        mp_uint(&w, count);
        mp_str(&w, "min");
        value(get16(&p[8]));
        mp_str(&w, "max");
        value(get16(&p[10]));
        break;
    }
    default:
        mote_dropped++;
        return;
    }
    end_data();
}

/* -- programs at run time ------------------------------------------------------------------- */
static void program_start(void)
{
    switch (program) {
    case P_AGGREGATE:
        aggregate_init();
        break;
    case P_COUNT:
        count_init();
        break;
    case P_DEADBAND:
        deadband_init();
        break;
    case P_FILTER:
        filter_init();
        break;
    case P_RAW:
        raw_init();
        break;
    default:
        if (downstream)
            vehicle_down_init();
        else
            vehicle_up_init();
    }
}

static void program_feed(uint16_t t, uint16_t v)
{
    switch (program) {
    case P_AGGREGATE:
        aggregate_sample(t, v);
        break;
    case P_COUNT:
        count_sample(t, v);
        break;
    case P_DEADBAND:
        deadband_sample(t, v);
        break;
    case P_FILTER:
        filter_sample(t, v);
        break;
    case P_RAW:
        raw_sample(t, v);
        break;
    default:
        if (downstream)
            vehicle_down_sample(t, v);
        else
            vehicle_up_sample(t, v);
    }
}

/* Send what the program holds (a partial batch, window or period) before the mote sleeps or
 * loads a program, as the Python motes do: those readings are neither lost nor sent after the
 * mote's asleep clock has passed them. No window rides on these messages. */
static void program_flush(void)
{
    uint16_t saved_tick = tick;
    uint64_t saved_ms = sample_ms, saved_listen = next_listen_ms;
    /* The last sample fed is tick - 1; sample_ms is already the next one's while it converts. */
    uint64_t last_ms = adc_ready || (ADCSRA & _BV(ADSC)) ? sample_ms - period_ms : sample_ms;
    next_listen_ms = UINT64_MAX;
    switch (program) {
    case P_RAW: /* its batch ends with the current sample: the last one fed */
        tick = (uint16_t)(saved_tick - 1);
        sample_ms = last_ms;
        raw_flush(tick);
        break;
    case P_AGGREGATE: /* its window ends at the tick after the last sample */
        sample_ms = last_ms + period_ms;
        aggregate_flush(tick);
        break;
    case P_COUNT:
        sample_ms = last_ms + period_ms;
        count_flush(tick);
        break;
    default: /* filter, deadband, vehicle: nothing held */
        break;
    }
    tick = saved_tick;
    sample_ms = saved_ms;
    next_listen_ms = saved_listen;
}

static uint16_t samples_in(uint32_t ms)
{
    uint32_t n = (ms + period_ms / 2) / period_ms;
    return (uint16_t)(n < 1 ? 1 : n > 0xffff ? 0xffff : n);
}

static void retime(void)
{
    short_window = 0; /* a new period: whole windows from the one in progress */
    mote_params.period_samples = samples_in(count_period_ms);
    mote_params.window_samples = samples_in(aggregate_window_ms);
}

/* Make the aggregate's first window end on the next multiple of the window in mote time:
 * its samples are those from the next one fed up to (not including) that boundary. */
static void align_window(void)
{
    /* The next sample fed: the one converting now, or the next period's. */
    uint64_t next = sample_ms;
    if (!adc_ready && !(ADCSRA & _BV(ADSC)))
        next += period_ms;
    uint64_t boundary = (next + aggregate_window_ms - 1) / aggregate_window_ms;
    boundary *= aggregate_window_ms;
    uint64_t n = (boundary - next + period_ms - 1) / period_ms;
    full_window_samples = samples_in(aggregate_window_ms);
    mote_params.window_samples = full_window_samples;
    short_window = 0;
    if (n && n < full_window_samples) {
        mote_params.window_samples = (uint16_t)n;
        short_window = 1;
    }
}

/* A reading-unit value as counts, rounded up (lower bounds) or down (upper bounds). */
static uint16_t counts(float v, uint8_t up)
{
    float c = v * cfg.scale;
    if (c <= 0)
        return 0;
    if (c >= 65535.0f)
        return 0xffff;
    uint16_t n = (uint16_t)c;
    if (up && (float)n < c - 1e-3f)
        n++;
    return n;
}

/* Parse LOAD_PROGRAM's params (a msgpack map) for program `p`; 0 or an error message. */
static const char *load(uint8_t p, struct mp_reader *r)
{
    struct mote_params next = {400, 50, 0, 0, 0, 1, 0, {{0}}};
    uint32_t period = 1000, window = 0;
    uint8_t role = 0, have_ranges = 0, have_epsilon = 0, n;
    float x;
    next.threshold = counts(400, 0);
    next.hysteresis = counts(50, 0);
    if (!mp_read_map(r, &n))
        return "params must be a map";
    while (n--) {
        const char *k;
        uint8_t kn;
        if (!mp_read_str(r, &k, &kn))
            return "parameter names must be strings";
        if (mp_str_eq(k, kn, "ranges") && p == P_FILTER) {
            uint8_t m, two;
            if (!mp_read_array(r, &m) || m == 0 || m > MAX_RANGES)
                return "ranges must be 1 to 4 [lo, hi] pairs";
            for (uint8_t i = 0; i < m; i++) {
                float lo = 0, hi = 0;
                uint8_t open_lo, open_hi;
                if (!mp_read_array(r, &two) || two != 2)
                    return "each range must be [lo, hi]";
                open_lo = mp_read_nil(r);
                if (!open_lo && !mp_read_number(r, &lo))
                    return "range bounds must be numbers or nil";
                open_hi = mp_read_nil(r);
                if (!open_hi && !mp_read_number(r, &hi))
                    return "range bounds must be numbers or nil";
                if (!open_lo && !open_hi && lo > hi)
                    return "empty range (lo > hi)";
                next.ranges[i][0] = open_lo ? 0 : counts(lo, 1);
                next.ranges[i][1] = open_hi ? 0xffff : counts(hi, 0);
                if (!open_hi && hi < 0)
                    next.ranges[i][0] = 1, next.ranges[i][1] = 0; /* matches nothing */
            }
            next.n_ranges = m;
            have_ranges = 1;
        } else if (mp_str_eq(k, kn, "role") && p == P_VEHICLE) {
            const char *s;
            uint8_t sn;
            if (!mp_read_str(r, &s, &sn))
                return "role must be a string";
            if (mp_str_eq(s, sn, "downstream"))
                role = 1;
            else if (!mp_str_eq(s, sn, "upstream"))
                return "role must be 'upstream' or 'downstream'";
        } else {
            if (!mp_read_number(r, &x))
                return "parameters must be numbers";
            if (mp_str_eq(k, kn, "epsilon") && p == P_DEADBAND && x >= 0) {
                next.epsilon = counts(x, 0);
                have_epsilon = 1;
            } else if (mp_str_eq(k, kn, "batch") && p == P_RAW && x >= 1 && x <= BATCH_LIMIT) {
                next.batch = (uint8_t)x;
            } else if (mp_str_eq(k, kn, "window_ms") && p == P_AGGREGATE && x > 0) {
                window = (uint32_t)(x + 0.5f);
            } else if (mp_str_eq(k, kn, "period_ms") && p == P_COUNT && x > 0) {
                period = (uint32_t)(x + 0.5f);
            } else if (mp_str_eq(k, kn, "threshold") && (p == P_COUNT || p == P_VEHICLE)) {
                next.threshold = counts(x, 0);
            } else if (mp_str_eq(k, kn, "hysteresis") && (p == P_COUNT || p == P_VEHICLE) &&
                       x >= 0) {
                next.hysteresis = counts(x, 0);
            } else {
                return "unknown or out-of-range parameter";
            }
        }
    }
    if (p == P_FILTER && !have_ranges)
        return "filter needs ranges";
    if (p == P_DEADBAND && !have_epsilon)
        return "deadband needs epsilon";
    if (p == P_AGGREGATE && !window)
        return "aggregate needs window_ms";
    mote_params = next;
    downstream = role;
    count_period_ms = period;
    aggregate_window_ms = window ? window : 1000;
    retime();
    program = p;
    program_start();
    short_window = 0;
    if (p == P_AGGREGATE)
        align_window();
    return 0;
}

/* -- receiving ------------------------------------------------------------------------------ */
/* A control for this mote in rx_buf (up to `end`), its body at `body`: 1 if it is sealed with
 * our key and its counter is new (then recorded, in EEPROM too), else counted and 0. The tag is
 * checked before the counter is read, so only the key's holder can move the counter. */
static uint8_t authentic(uint8_t elements, uint8_t *end, struct mp_reader *body)
{
    uint64_t counter;
    uint8_t len = (uint8_t)(end - rx_buf);
    if (elements != 5) {
        auth_rejected.unsigned_++;
        return 0;
    }
    if (len < 12 || end[-10] != 0xc4 || end[-9] != AUTH_TAG_BYTES) {
        auth_rejected.bad_mac++;
        return 0;
    }
    rx_buf[0] = 0x94; /* the tag covers [1, kind, body, counter] */
    uint8_t ok = auth_check(rx_buf, (uint8_t)(len - 10), end - AUTH_TAG_BYTES);
    rx_buf[0] = 0x95;
    body->end = end - 10;
    if (!ok || !mp_skip(body, 5) || !mp_read_u64(body, &counter) || body->p != body->end) {
        auth_rejected.bad_mac++;
        return 0;
    }
    if (control_counter != UINT64_MAX && counter <= control_counter) {
        auth_rejected.replay++;
        return 0;
    }
    control_counter = counter;
    eeprom_update_block(&control_counter, (void *)offsetof(struct config, control_counter),
                        sizeof control_counter);
    return 1;
}

/* Decode rx_buf in place: COBS, CRC, envelope; then apply a control meant for this mote. */
static void handle_frame(uint8_t len)
{
    uint8_t out = 0, i = 0;
    while (i < len) {
        uint8_t code = rx_buf[i++];
        if (code == 0 || (uint16_t)i + code - 1 > len)
            goto bad;
        for (uint8_t k = 1; k < code; k++)
            rx_buf[out++] = rx_buf[i++];
        if (code != 0xff && i < len)
            rx_buf[out++] = 0;
    }
    if (out < 3)
        goto bad;
    uint16_t crc = 0xffff;
    for (uint8_t k = 0; k < out - 2; k++)
        crc = _crc_xmodem_update(crc, rx_buf[k]);
    if (crc != (uint16_t)((rx_buf[out - 2] << 8) | rx_buf[out - 1]))
        goto bad;

    uint8_t *end = rx_buf + out - 2;
    struct mp_reader r = {rx_buf, end, 0};
    uint8_t n, elements;
    uint32_t version, cseq;
    const char *s;
    uint8_t sn;
    /* [1, "control", body] or, sealed, [1, "control", body, counter, tag]. */
    if (!mp_read_array(&r, &elements) || elements < 3 || !mp_read_uint(&r, &version) ||
        version != PROTOCOL_VERSION || !mp_read_str(&r, &s, &sn) || !mp_str_eq(s, sn, "control"))
        goto bad;
    struct mp_reader body = r;
    if (!mp_read_array(&r, &n) || n < 7 || !mp_read_str(&r, &s, &sn)) /* later fields: ignored */
        goto bad;
    if (!mp_str_eq(s, sn, cfg.id))
        return; /* for another mote on the same channel */
    if (auth_on && !authentic(elements, end, &body))
        return;
    if (!mp_read_uint(&r, &cseq) || !mp_read_str(&r, &s, &sn))
        goto bad;
    float period = 0, duration = 0;
    const char *prog = 0;
    uint8_t prog_n = 0;
    uint8_t has_period = !mp_read_nil(&r) && mp_read_number(&r, &period);
    if (r.err || (!mp_read_nil(&r) && !mp_read_str(&r, &prog, &prog_n)))
        goto bad;
    struct mp_reader params = r;
    if (!mp_skip(&r, 4))
        goto bad;
    uint8_t has_duration = !mp_read_nil(&r) && mp_read_number(&r, &duration);
    if (r.err)
        goto bad;

    if (mp_str_eq(s, sn, "hello")) {
        asleep = 0;   /* a gateway that asks believes us awake (it may have restarted) */
        send_hello(); /* the hello is the answer */
    } else if (mp_str_eq(s, sn, "set_period")) {
        if (!has_period || period < 10.0f || period > 4.0e9f) {
            send_ack(cseq, "period_ms must be 10 ms or more");
        } else {
            /* The period in progress ends at its start + the new period (or now, if past). */
            uint32_t next = (uint32_t)(period + 0.5f);
            cli();
            uint32_t done = period_ms - remaining_ms;
            remaining_ms = next > done + chunk_ms ? next - done : chunk_ms;
            period_ms = next;
            sei();
            retime();
            send_ack(cseq, 0);
        }
    } else if (mp_str_eq(s, sn, "load_program")) {
        uint8_t p = N_PROGRAMS;
        if (!asleep) /* the old program's readings first, then the ack (as the Python motes) */
            program_flush();
        for (uint8_t k = 0; k < N_PROGRAMS; k++)
            if (prog && mp_str_eq(prog, prog_n, program_names[k]))
                p = k;
        if (p == N_PROGRAMS) {
            send_ack(cseq, "unknown program");
        } else {
            const char *error = load(p, &params);
            send_ack(cseq, error);
        }
    } else if (mp_str_eq(s, sn, "sleep")) {
        if (!has_duration) {
            send_ack(cseq, "sleep needs duration_ms");
        } else {
            /* Asleep until WAKE; a short receive window every duration_ms meanwhile. What the
             * program holds goes first (its clock on the listens would pass those readings). */
            if (!asleep)
                program_flush();
            asleep = 1;
            sleep_window_ms = (uint64_t)(duration + 0.5f);
            if (sleep_window_ms < period_ms)
                sleep_window_ms = period_ms;
            next_window_ms = sample_ms + sleep_window_ms;
            send_ack(cseq, 0);
        }
    } else if (mp_str_eq(s, sn, "wake")) {
        asleep = 0;
        send_ack(cseq, 0);
    } else {
        send_ack(cseq, "unknown op");
    }
    return;
bad:
    rx_dropped++;
}

/* One received byte: a zero ends a frame (COBS), anything else belongs to one. */
static void receive(uint8_t b)
{
    if (b == 0) {
        if (rx_lost || rx_overflow)
            rx_dropped++;
        else if (rx_len)
            handle_frame(rx_len);
        rx_len = 0;
        rx_overflow = 0;
        rx_lost = 0;
        return;
    }
    if (rx_len < RX_MAX)
        rx_buf[rx_len++] = b;
    else
        rx_overflow = 1;
}

static void open_window(void)
{
    window_wanted = 0;
    listening = 1;
    window_over = 0;
    rx_len = 0;
    rx_overflow = 0;
    UCSR0B |= _BV(RXEN0) | _BV(RXCIE0);
    PORTB |= _BV(RX_ON_PIN);
    TCNT3 = 0;
    OCR3A = (uint16_t)(cfg.listen_ms * TIMER_COUNTS_PER_MS - 1);
    ETIFR = _BV(OCF3A);
    ETIMSK |= _BV(OCIE3A);
    TCCR3B = _BV(WGM32) | _BV(CS31); /* CTC, F_CPU / 8 */
}

static void close_window(void)
{
    TCCR3B = 0;
    ETIMSK &= (uint8_t)~_BV(OCIE3A);
    UCSR0B &= (uint8_t)~(_BV(RXEN0) | _BV(RXCIE0));
    PORTB &= (uint8_t)~_BV(RX_ON_PIN);
    listening = 0;
    window_over = 0;
    rx_len = 0;
}

/* -- main ----------------------------------------------------------------------------------- */
static void on_period(void)
{
    sample_ms += period_ms;
    if (asleep) {
        if (sample_ms >= next_window_ms) { /* duty-cycled: a WAKE can still reach it */
            next_window_ms += sleep_window_ms;
            send_listen();
        }
        return;
    }
    ADCSRA = _BV(ADEN) | _BV(ADSC) | _BV(ADIE) | ADC_PRESCALE;
}

static void on_sample(uint16_t v)
{
    uint8_t before = seq;
    program_feed(tick, v);
    tick++;
    if ((uint8_t)seq == before && listen_due(0))
        send_listen();
}

static void load_config(void)
{
    struct config c;
    eeprom_read_block(&c, 0, sizeof c);
    if (c.magic[0] == 'F' && c.magic[1] == 'J' && c.version == 2 && c.period_ms &&
        c.scale > 0 && c.listen_ms && c.listen_ms <= CHUNK_MS && c.program < N_PROGRAMS &&
        c.attributes_len <= ATTR_MAX) {
        c.id[sizeof c.id - 1] = 0;
        c.field[sizeof c.field - 1] = 0;
        cfg = c;
        cfg_ok = 1;
        eeprom_read_block(attributes, (const void *)sizeof c, c.attributes_len);
    }
    for (uint8_t i = 0; i < AUTH_KEY_BYTES && cfg_ok; i++)
        if (cfg.key[i] != 0xff)
            auth_on = 1;
    if (auth_on) { /* counters never repeat: this boot's are above every earlier boot's */
        auth_set_key(cfg.key);
        memset(cfg.key, 0, sizeof cfg.key);
        boot_count = cfg.boot_count;
        control_counter = cfg.control_counter;
        next_boot();
    }
}

int main(void)
{
    load_config();
    period_ms = cfg.period_ms;
    program = P_RAW;
    mote_params.batch = 1;
    mote_params.threshold = counts(400, 0);
    mote_params.hysteresis = counts(50, 0);
    retime();
    program = P_RAW;
    program_start();
    if (cfg_ok) { /* the boot program, with its params as LOAD_PROGRAM would give them */
        const uint8_t *at = (const uint8_t *)(sizeof cfg + cfg.attributes_len);
        uint8_t n = eeprom_read_byte(at);
        if (n > RX_MAX)
            n = 0;
        if (n)
            eeprom_read_block(rx_buf, at + 1, n);
        else
            rx_buf[0] = 0x80; /* {} */
        struct mp_reader r = {rx_buf, rx_buf + (n ? n : 1), 0};
        if (load(cfg.program, &r) != 0) { /* bad params: raw it is */
            program = P_RAW;
            program_start();
        }
    }
    sample_ms = cfg.start_ms - period_ms; /* the first period starts at once */
    if (program == P_AGGREGATE)
        align_window(); /* on the clock just set */
    next_listen_ms = cfg.start_ms + cfg.listen_every_ms;

    DDRB |= _BV(RX_ON_PIN);
    ADMUX = _BV(REFS0);
    UBRR0H = 0;
    UBRR0L = 0;
    UCSR0A = _BV(U2X0); /* 125 kbaud at 1 MHz */
    UCSR0C = _BV(UCSZ01) | _BV(UCSZ00);
    UCSR0B = _BV(TXEN0);
    EICRA = _BV(ISC01); /* INT0 on a falling edge: supply failing */
    EIMSK = _BV(INT0);
    set_sleep_mode(SLEEP_MODE_IDLE);
    sei();
    send_hello();
    /* The sample clock starts with the first sample: sample n is n periods after it. */
    remaining_ms = period_ms;
    timer_chunk();
    TCNT1 = 0;
    TCCR1B = _BV(WGM12) | _BV(CS11); /* CTC, F_CPU / 8 */
    TIMSK = _BV(OCIE1A);
    period_due = 1;
    for (;;) {
        cli();
        if (power_fail) {
            power_fail = 0;
            sei();
            send_status_offline("power failing");
            TCCR1B = 0; /* no more samples: the supply is going */
            ADCSRA = 0;
            halted = 1;
            continue;
        }
        if (period_due && !adc_ready && !(ADCSRA & _BV(ADSC))) {
            period_due--;
            sei();
            on_period();
            continue;
        }
        if (adc_ready) {
            adc_ready = 0;
            sei();
            if (!halted)
                on_sample(adc_value);
            continue;
        }
        if (rx_r != rx_w) {
            sei();
            receive(rx_ring[rx_r++]);
            if (listening && (uint8_t)(rx_r - rx_w - 1) > 128)
                UCSR0B |= _BV(RXCIE0);
            continue;
        }
        if (window_wanted && !listening && tx_head == tx_tail) {
            sei();
            open_window();
            continue;
        }
        if (window_over) {
            window_over = 0;
            if (rx_len || rx_r != rx_w) { /* a frame is arriving: hear it out */
                sei();
                continue;
            }
            sei();
            close_window();
            continue;
        }
        sleep_enable();
        sei();
        sleep_cpu();
        sleep_disable();
    }
}
