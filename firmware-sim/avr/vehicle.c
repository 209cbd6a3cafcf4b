/* vehicle: one message per vehicle with the ticks it covered and uncovered the
 * sensor ({t0, t2} upstream, {t1, t3} downstream). */
#include "detector.h"
#include "mote.h"

#ifndef DOWNSTREAM
#define MSG_TYPE MSG_VEHICLE_UP
#else
#define MSG_TYPE MSG_VEHICLE_DOWN
#endif

static uint16_t t_on;

void program_init(void) { covered = 0; }

void program_sample(uint16_t tick, uint16_t value)
{
    uint8_t edge = detect(value);
    if (edge == EDGE_COVER) {
        t_on = tick;
    } else if (edge == EDGE_UNCOVER) {
        uint8_t msg[4];
        put16(&msg[0], t_on);
        put16(&msg[2], tick);
        mote_send(MSG_TYPE, msg, sizeof msg);
    }
}
