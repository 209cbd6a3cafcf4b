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
