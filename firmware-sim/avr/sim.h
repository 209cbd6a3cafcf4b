/* What the simavr runners share (harness.c: cycles per sample period of one program;
 * loop.c: the protocol image in the loop): the ATmega128 made from an ELF at a clock, sleep
 * counted rather than simulated, traces of 10-bit readings. */
#ifndef SIM_H
#define SIM_H

#include <stdint.h>

#include <simavr/sim_avr.h>

/* Cycles the MCU spent asleep so far (avr->cycle - sim_slept = awake cycles). */
extern avr_cycle_count_t sim_slept;

/* The ATmega128 running FIRMWARE at f_cpu Hz, AVCC 1023 mV (a reading of N counts is N mV),
 * its sleeps counted into sim_slept, UART 0 without simavr's stdio echo; exits 2 on error. */
avr_t *sim_make(const char *prog, const char *firmware, uint32_t f_cpu);

/* The RAM of the firmware's variable `symbol` (from its ELF), or NULL. */
uint8_t *sim_data(avr_t *avr, const char *symbol);

/* One reading (0..1023) per line; exits 2 on a bad file. */
uint16_t *sim_read_trace(const char *prog, const char *path, long *count);

#endif
