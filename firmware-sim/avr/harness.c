/* simavr harness: run a mote program on the ATmega128, feed its A-to-D from a
 * trace and count the cycles it spends awake in each sample period.
 *
 *   harness FIRMWARE.elf TRACE F_CPU
 *
 * TRACE holds one 10-bit reading per line. A period starts when the program
 * starts a conversion; its awake cycles are all cycles not spent asleep until the
 * next conversion starts. Output lines: "p INDEX CYCLES BYTES" per period and
 * "u INDEX BYTE" per byte the program transmitted in that period.
 */
#include <stdio.h>
#include <stdlib.h>

#include <simavr/avr_adc.h>
#include <simavr/avr_uart.h>
#include <simavr/sim_avr.h>
#include <simavr/sim_irq.h>

#include "sim.h"

static uint16_t *trace;
static long n_samples, next_sample = 0;
static avr_t *avr;
static avr_irq_t *adc0;
static avr_cycle_count_t awake_mark;
static long period = -1;
static unsigned period_bytes;

static void close_period(void)
{
    avr_cycle_count_t awake = avr->cycle - sim_slept;
    if (period >= 0)
        printf("p %ld %llu %u\n", period, (unsigned long long)(awake - awake_mark), period_bytes);
    awake_mark = awake;
    period_bytes = 0;
    period++;
}

static void on_adc_start(avr_irq_t *irq, uint32_t value, void *param)
{
    (void)irq;
    (void)value;
    (void)param;
    close_period();
    if (next_sample < n_samples)
        /* AVCC is set to 1023 mV, so a reading of N counts is N millivolts. */
        avr_raise_irq(adc0, trace[next_sample++]);
}

static void on_uart_byte(avr_irq_t *irq, uint32_t value, void *param)
{
    (void)irq;
    (void)param;
    printf("u %ld %u\n", period, value & 0xff);
    period_bytes++;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s FIRMWARE.elf TRACE F_CPU\n", argv[0]);
        return 2;
    }
    trace = sim_read_trace("harness", argv[2], &n_samples);
    avr = sim_make("harness", argv[1], (uint32_t)strtoul(argv[3], NULL, 10));
    adc0 = avr_io_getirq(avr, AVR_IOCTL_ADC_GETIRQ, ADC_IRQ_ADC0);
    avr_irq_register_notify(avr_io_getirq(avr, AVR_IOCTL_ADC_GETIRQ, ADC_IRQ_OUT_TRIGGER),
                            on_adc_start, NULL);
    avr_irq_register_notify(avr_io_getirq(avr, AVR_IOCTL_UART_GETIRQ('0'), UART_IRQ_OUTPUT),
                            on_uart_byte, NULL);

    /* Period n_samples is the one after the last reading: stop when it begins. */
    while (period < n_samples) {
        int state = avr_run(avr);
        if (state == cpu_Done || state == cpu_Crashed) {
            fprintf(stderr, "harness: firmware stopped (state %d) in period %ld\n", state, period);
            return 1;
        }
    }
    printf("end %ld\n", period);
    avr_terminate(avr);
    return 0;
}
