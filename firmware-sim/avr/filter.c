/* filter: send (tick, value) for readings inside any of the pushed-down ranges
 * (inclusive; RANGES is a list of {lo, hi}, 0 and 0xffff for open ends). */
#include "mote.h"

#ifndef RANGES
#define RANGES {{0, 299}, {820, 0xffff}}
#endif

#ifndef N_RANGES /* the protocol image sets the ranges at run time (params.h) */
static const uint16_t ranges[][2] = RANGES;
#define N_RANGES (sizeof ranges / sizeof ranges[0])
#endif

void program_init(void) {}

void program_sample(uint16_t tick, uint16_t value)
{
    for (uint8_t i = 0; i < N_RANGES; i++) {
        if (value >= ranges[i][0] && value <= ranges[i][1]) {
            uint8_t msg[4];
            put16(&msg[0], tick);
            put16(&msg[2], value);
            mote_send(MSG_FILTER, msg, sizeof msg);
            return;
        }
    }
}
