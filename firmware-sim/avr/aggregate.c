/* aggregate: per window of WINDOW_SAMPLES readings send (end tick, sum, count,
 * min, max), from which the gateway rolls up AVG exactly. */
#include "mote.h"

#ifndef WINDOW_SAMPLES
#define WINDOW_SAMPLES 18
#endif

static uint32_t sum;
static uint16_t count, lo, hi;

void program_init(void) { count = 0; }

void program_sample(uint16_t tick, uint16_t value)
{
    if (count == WINDOW_SAMPLES) {
        uint8_t msg[12];
        put16(&msg[0], tick);
        put16(&msg[2], (uint16_t)sum);
        put16(&msg[4], (uint16_t)(sum >> 16));
        put16(&msg[6], count);
        put16(&msg[8], lo);
        put16(&msg[10], hi);
        mote_send(MSG_AGGREGATE, msg, sizeof msg);
        count = 0;
    }
    if (count == 0) {
        sum = 0;
        lo = 0xffff;
        hi = 0;
    }
    sum += value;
    count++;
    if (value < lo)
        lo = value;
    if (value > hi)
        hi = value;
}

#ifdef PARAMS_H
/* The protocol image only: send the partial window before the mote sleeps or loads another
 * program; `tick` is the one after its last sample (the window's end). */
void program_flush(uint16_t tick)
{
    if (count) {
        uint8_t msg[12];
        put16(&msg[0], tick);
        put16(&msg[2], (uint16_t)sum);
        put16(&msg[4], (uint16_t)(sum >> 16));
        put16(&msg[6], count);
        put16(&msg[8], lo);
        put16(&msg[10], hi);
        mote_send(MSG_AGGREGATE, msg, sizeof msg);
        count = 0;
    }
}
#endif
