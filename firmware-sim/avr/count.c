/* count: vehicles that arrived in each period of PERIOD_SAMPLES samples, sent
 * with the tick that ends the period. */
#include "detector.h"
#include "mote.h"

#ifndef PERIOD_SAMPLES
#define PERIOD_SAMPLES 180
#endif

static uint16_t in_period, vehicles;

void program_init(void) { covered = 0; }

void program_sample(uint16_t tick, uint16_t value)
{
    if (in_period == PERIOD_SAMPLES) {
        uint8_t msg[4];
        put16(&msg[0], tick);
        put16(&msg[2], vehicles);
        mote_send(MSG_COUNT, msg, sizeof msg);
        in_period = 0;
        vehicles = 0;
    }
    if (detect(value) == EDGE_COVER)
        vehicles++;
    in_period++;
}

#ifdef PARAMS_H
/* The protocol image only: send the partial period before the mote sleeps or loads another
 * program; `tick` is the one after its last sample (the period's end). */
void program_flush(uint16_t tick)
{
    if (in_period) {
        uint8_t msg[4];
        uint16_t full = PERIOD_SAMPLES;
        put16(&msg[0], tick);
        put16(&msg[2], vehicles);
        PERIOD_SAMPLES = in_period; /* the message's start: in_period samples before its end */
        mote_send(MSG_COUNT, msg, sizeof msg);
        PERIOD_SAMPLES = full;
        in_period = 0;
        vehicles = 0;
    }
}
#endif
