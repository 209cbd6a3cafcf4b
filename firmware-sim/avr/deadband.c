/* deadband: send (tick, value) when the reading moved more than EPSILON from the
 * last one sent; the first reading is always sent. */
#include "mote.h"

#ifndef EPSILON
#define EPSILON 20
#endif

static uint16_t last;
static uint8_t started;

void program_init(void) { started = 0; }

void program_sample(uint16_t tick, uint16_t value)
{
    uint16_t moved = value > last ? value - last : last - value;
    if (!started || moved > EPSILON) {
        uint8_t msg[4];
        started = 1;
        last = value;
        put16(&msg[0], tick);
        put16(&msg[2], value);
        mote_send(MSG_DEADBAND, msg, sizeof msg);
    }
}
