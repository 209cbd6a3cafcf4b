/* Force-included (-include params.h) when the programs are compiled into the protocol image:
 * each compile-time parameter of a program becomes a run-time field of `mote_params`. The
 * single-program builds of the cycle measurement do not include this file. */
#ifndef PARAMS_H
#define PARAMS_H

#include "image.h"

#define THRESHOLD (mote_params.threshold)
#define HYSTERESIS (mote_params.hysteresis)
#define EPSILON (mote_params.epsilon)
#define PERIOD_SAMPLES (mote_params.period_samples)
#define WINDOW_SAMPLES (mote_params.window_samples)
#define BATCH_MAX BATCH_LIMIT
#define BATCH (mote_params.batch)
#define N_RANGES (mote_params.n_ranges)
#define ranges (mote_params.ranges)

#endif
