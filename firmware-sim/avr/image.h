/* The protocol image: one firmware with every program, selected and parameterised at run
 * time by the gateway's LOAD_PROGRAM (see image.c and docs/protocol.md).
 *
 * The programs (raw.c, vehicle.c, ...) are the same sources the cycle measurement builds one
 * by one with compile-time constants; for the image, params.h (force-included) turns those
 * constants into fields of `mote_params`, so there is one copy of each program.
 */
#ifndef IMAGE_H
#define IMAGE_H

#include <stdint.h>

#define MAX_RANGES 4
#define BATCH_LIMIT 8

struct mote_params {
    uint16_t threshold, hysteresis; /* vehicle, count: A-to-D counts */
    uint16_t epsilon;               /* deadband: counts */
    uint16_t period_samples;        /* count: samples per counting period */
    uint16_t window_samples;        /* aggregate: samples per window */
    uint8_t batch;                  /* raw: readings per message (1..BATCH_LIMIT) */
    uint8_t n_ranges;               /* filter */
    uint16_t ranges[MAX_RANGES][2]; /* filter: inclusive [lo, hi] in counts */
};

extern struct mote_params mote_params;

#endif
