/* Shared runtime of the mote programs: sample clock, A-to-D, radio framing.
 *
 * Every program implements program_init() and program_sample(); the runtime
 * wakes on the sample timer, powers the A-to-D up for one conversion, hands the
 * reading to the program and sleeps. A message is one header byte
 * (type << 4 | sequence) and a little-endian payload; the UART stands in for
 * the radio's byte interface, so the harness counts exactly the bits sent.
 */
#ifndef MOTE_H
#define MOTE_H

#include <stdint.h>

#define MSG_RAW 1
#define MSG_VEHICLE_UP 2
#define MSG_VEHICLE_DOWN 3
#define MSG_COUNT 4
#define MSG_FILTER 5
#define MSG_AGGREGATE 6
#define MSG_DEADBAND 7

void program_init(void);
/* `tick` counts samples since reset (wraps at 2^16); `value` is the 10-bit reading. */
void program_sample(uint16_t tick, uint16_t value);

/* Frame and queue one message; drops the whole message when the queue is full. */
void mote_send(uint8_t type, const uint8_t *payload, uint8_t length);

/* Messages dropped because the transmit queue was full. */
extern volatile uint16_t mote_dropped;

static inline void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

#endif
