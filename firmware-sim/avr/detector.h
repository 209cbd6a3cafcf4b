/* Vehicle detector shared by `vehicle` and `count`: a vehicle darkens the light
 * sensor; covered below THRESHOLD, uncovered again at THRESHOLD + HYSTERESIS. */
#ifndef DETECTOR_H
#define DETECTOR_H

#include <stdint.h>

#ifndef THRESHOLD
#define THRESHOLD 400
#endif
#ifndef HYSTERESIS
#define HYSTERESIS 50
#endif

enum { EDGE_NONE = 0, EDGE_COVER = 1, EDGE_UNCOVER = 2 };

static uint8_t covered;

static inline uint8_t detect(uint16_t value)
{
    if (!covered) {
        if (value < THRESHOLD) {
            covered = 1;
            return EDGE_COVER;
        }
    } else if (value >= THRESHOLD + HYSTERESIS) {
        covered = 0;
        return EDGE_UNCOVER;
    }
    return EDGE_NONE;
}

#endif
