/* raw: every sample, BATCH readings of 16 bits per message. */
#include "mote.h"

#ifndef BATCH
#define BATCH 8
#endif

#ifndef BATCH_MAX
#define BATCH_MAX BATCH
#endif

static uint8_t batch[2 * BATCH_MAX];
static uint8_t n;

void program_init(void) { n = 0; }

void program_sample(uint16_t tick, uint16_t value)
{
    (void)tick;
    put16(&batch[2 * n], value);
    if (++n == BATCH) {
        mote_send(MSG_RAW, batch, 2 * BATCH);
        n = 0;
    }
}

#ifdef PARAMS_H
/* The protocol image only: send the partial batch before the mote sleeps or loads another
 * program (the caller makes `tick` the last sample's). */
void program_flush(uint16_t tick)
{
    (void)tick;
    if (n) {
        mote_send(MSG_RAW, batch, 2 * n);
        n = 0;
    }
}
#endif
