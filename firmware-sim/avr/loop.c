/* Firmware in the loop: run the protocol image (fjords-mote.elf) in simavr as one mote.
 *
 *   loop FIRMWARE.elf EEPROM.bin TRACE STEP_MS [SPEEDUP [WINDOW_WALL_MS]]
 *
 * EEPROM.bin is the mote's configuration (firmware_sim/loop.py writes it). TRACE holds one
 * A-to-D reading (0..1023) per line, STEP_MS apart: a conversion started t ms after the first
 * one reads the trace at floor(t / STEP_MS), so a mote that samples slower sub-samples the
 * trace and a sleeping one skips it. The UART is the radio: every byte the mote sends goes to
 * stdout as it is (COBS frames), and bytes on stdin reach the mote's receiver, but only while
 * its receiver is on (PB0 high); what arrives meanwhile waits in the pipe, as a base station
 * holds a control for a mote's next window. When a window opens and nothing is waiting, the
 * runner gives the gateway up to WINDOW_WALL_MS (default 100) of wall time to answer: the
 * window is `listen_ms` of mote time, but the simulated mote runs far faster than real time.
 * SPEEDUP (default 0: as fast as possible) paces mote time at N x real time.
 *
 * At the end of the trace the runner pulls INT0 low (power failing), lets the mote send its
 * last status, writes the EEPROM as the mote left it back to EEPROM.bin (its boot count and
 * highest control counter: what its next boot starts from), and prints one line to stderr:
 * "stats {json}" with the counts energy is computed from (awake cycles, conversions, bytes
 * each way, listen time) and the controls the firmware refused (`rejected`, by reason).
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <simavr/avr_adc.h>
#include <simavr/avr_eeprom.h>
#include <simavr/avr_ioport.h>
#include <simavr/avr_uart.h>
#include <simavr/sim_avr.h>
#include <simavr/sim_irq.h>

#include "sim.h"

#define F_CPU 1000000UL

static avr_t *avr;
static avr_irq_t *adc0, *uart_in, *int0_pin;
static uint16_t *trace;
static long n_samples;
static double step_ms, speedup = 0;
static int window_wall_ms = 100;
static avr_cycle_count_t origin, window_from;
static int started, done, window_open, window_edge, xoff;
static unsigned long conversions, tx_bytes, tx_zeros, rx_bytes, listen_cycles, windows;
static unsigned char out_buf[4096], rx_queue[8192];
static size_t out_len, rx_head, rx_tail;
static int stdin_open = 1;
static int uart_fd = 1; /* stdout, kept apart from simavr's own messages */
static struct timespec wall0;

static void flush_out(void)
{
    size_t off = 0;
    while (off < out_len) {
        ssize_t n = write(uart_fd, out_buf + off, out_len - off);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            exit(3); /* the gateway side went away */
        }
        off += (size_t)n;
    }
    out_len = 0;
}

static double wall_ms(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (now.tv_sec - wall0.tv_sec) * 1e3 + (now.tv_nsec - wall0.tv_nsec) / 1e6;
}

static double mote_ms(void) { return (double)(avr->cycle - origin) * 1000.0 / F_CPU; }

static void pace(void)
{
    if (speedup <= 0)
        return;
    double ahead = mote_ms() / speedup - wall_ms();
    if (ahead > 1) {
        flush_out();
        struct timespec ts = {(time_t)(ahead / 1000), (long)(((long)ahead % 1000) * 1000000L)};
        nanosleep(&ts, NULL);
    }
}

static void on_adc_start(avr_irq_t *irq, uint32_t value, void *param)
{
    (void)irq;
    (void)value;
    (void)param;
    if (!started) {
        started = 1;
        origin = avr->cycle;
    }
    /* Conversions start on the sample clock or a little late (never early): floor. */
    long i = (long)(mote_ms() / step_ms + 1e-9);
    if (i >= n_samples) {
        done = 1;
        return;
    }
    conversions++;
    pace();
    /* AVCC is set to 1023 mV, so a reading of N counts is N millivolts. */
    avr_raise_irq(adc0, trace[i]);
}

static void on_uart_byte(avr_irq_t *irq, uint32_t value, void *param)
{
    (void)irq;
    (void)param;
    if (out_len == sizeof out_buf)
        flush_out();
    out_buf[out_len++] = (unsigned char)value;
    tx_bytes++;
    if ((value & 0xff) == 0) {
        tx_zeros++;
        flush_out(); /* a frame boundary: let the gateway have it */
    }
}

static void on_rx_pin(avr_irq_t *irq, uint32_t value, void *param)
{
    (void)irq;
    (void)param;
    if (value && !window_open) {
        window_open = window_edge = 1;
        window_from = avr->cycle;
        windows++;
    } else if (!value && window_open) {
        window_open = 0;
        listen_cycles += avr->cycle - window_from;
    }
}

static void on_xon(avr_irq_t *irq, uint32_t value, void *param)
{
    (void)irq;
    (void)value;
    (void)param;
    xoff = 0;
}

static void on_xoff(avr_irq_t *irq, uint32_t value, void *param)
{
    (void)irq;
    (void)value;
    (void)param;
    xoff = 1;
}

/* Move what the pipe holds into rx_queue; wait up to `timeout_ms` for the first byte. */
static void read_stdin(int timeout_ms)
{
    if (!stdin_open)
        return;
    struct pollfd p = {0, POLLIN, 0};
    if (poll(&p, 1, timeout_ms) <= 0)
        return;
    for (;;) {
        size_t room = sizeof rx_queue - rx_tail;
        if (!room && rx_head) {
            memmove(rx_queue, rx_queue + rx_head, rx_tail - rx_head);
            rx_tail -= rx_head;
            rx_head = 0;
            room = sizeof rx_queue - rx_tail;
        }
        if (!room)
            return;
        ssize_t n = read(0, rx_queue + rx_tail, room);
        if (n == 0)
            stdin_open = 0;
        if (n <= 0)
            return;
        rx_tail += (size_t)n;
    }
}

static int run_one(void)
{
    int state = avr_run(avr);
    if (state == cpu_Done || state == cpu_Crashed) {
        flush_out();
        fprintf(stderr, "loop: firmware stopped (state %d)\n", state);
        return 0;
    }
    if (window_edge) {
        window_edge = 0;
        flush_out();
        read_stdin(rx_head == rx_tail ? window_wall_ms : 0);
    }
    while (window_open && !xoff && rx_head < rx_tail) {
        avr_raise_irq(uart_in, rx_queue[rx_head++]);
        rx_bytes++;
    }
    return 1;
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr,
                "usage: %s FIRMWARE.elf EEPROM.bin TRACE STEP_MS [SPEEDUP [WINDOW_MS [PRELOAD]]]\n",
                argv[0]);
        return 2;
    }
    /* simavr logs to stdout: send that to stderr and keep the real stdout for the UART. */
    fflush(stdout);
    uart_fd = dup(1);
    dup2(2, 1);
    trace = sim_read_trace("loop", argv[3], &n_samples);
    step_ms = strtod(argv[4], NULL);
    if (argc > 5)
        speedup = strtod(argv[5], NULL);
    if (argc > 6)
        window_wall_ms = atoi(argv[6]);
    /* PRELOAD: bytes the receiver holds at boot, read before the simulation starts, so what
     * reaches the first window does not depend on how soon the writer ran. */
    long preload = argc > 7 ? atol(argv[7]) : 0;
    if (preload < 0 || (size_t)preload > sizeof rx_queue) {
        fprintf(stderr, "loop: PRELOAD must be 0..%zu bytes\n", sizeof rx_queue);
        return 2;
    }
    while (rx_tail < (size_t)preload) {
        ssize_t n = read(0, rx_queue + rx_tail, (size_t)preload - rx_tail);
        if (n <= 0) {
            fprintf(stderr, "loop: stdin ended inside the %ld preloaded bytes\n", preload);
            return 2;
        }
        rx_tail += (size_t)n;
    }
    if (step_ms <= 0 || n_samples == 0) {
        fprintf(stderr, "loop: need STEP_MS > 0 and a non-empty trace\n");
        return 2;
    }
    static uint8_t eeprom[4096];
    FILE *ef = fopen(argv[2], "rb");
    if (!ef) {
        perror(argv[2]);
        return 2;
    }
    size_t ee_len = fread(eeprom, 1, sizeof eeprom, ef);
    fclose(ef);

    avr = sim_make("loop", argv[1], F_CPU);
    avr_eeprom_desc_t ee = {.ee = eeprom, .offset = 0, .size = (uint32_t)ee_len};
    avr_ioctl(avr, AVR_IOCTL_EEPROM_SET, &ee);

    adc0 = avr_io_getirq(avr, AVR_IOCTL_ADC_GETIRQ, ADC_IRQ_ADC0);
    uart_in = avr_io_getirq(avr, AVR_IOCTL_UART_GETIRQ('0'), UART_IRQ_INPUT);
    int0_pin = avr_io_getirq(avr, AVR_IOCTL_IOPORT_GETIRQ('D'), 0);
    avr_irq_register_notify(avr_io_getirq(avr, AVR_IOCTL_ADC_GETIRQ, ADC_IRQ_OUT_TRIGGER),
                            on_adc_start, NULL);
    avr_irq_register_notify(avr_io_getirq(avr, AVR_IOCTL_UART_GETIRQ('0'), UART_IRQ_OUTPUT),
                            on_uart_byte, NULL);
    avr_irq_register_notify(avr_io_getirq(avr, AVR_IOCTL_UART_GETIRQ('0'), UART_IRQ_OUT_XON),
                            on_xon, NULL);
    avr_irq_register_notify(avr_io_getirq(avr, AVR_IOCTL_UART_GETIRQ('0'), UART_IRQ_OUT_XOFF),
                            on_xoff, NULL);
    avr_irq_register_notify(avr_io_getirq(avr, AVR_IOCTL_IOPORT_GETIRQ('B'), 0), on_rx_pin,
                            NULL);
    avr_raise_irq(int0_pin, 1); /* supply good */
    fcntl(0, F_SETFL, fcntl(0, F_GETFL) | O_NONBLOCK);
    clock_gettime(CLOCK_MONOTONIC, &wall0);

    /* The trace ends at its last reading's time plus a period, whether or not the mote still
     * converts (an asleep mote does not: it must not keep the run going forever). */
    while (!done) {
        if (!run_one())
            return 1;
        if (started && mote_ms() >= (n_samples + 1) * step_ms)
            done = 1;
    }
    /* Power failing: the mote gets 50 ms to say so, or as long as its last status takes (a
     * sealed one costs an HMAC, about 0.1 s at 1 MHz, maybe after a data message's): until
     * image.c's `halted` and 30 ms for the UART, up to a second. */
    avr_raise_irq(int0_pin, 0);
    avr_cycle_count_t until = avr->cycle + F_CPU / 20, at_most = avr->cycle + F_CPU;
    uint8_t *halted = sim_data(avr, "halted");
    int extended = 0;
    while (avr->cycle < until) {
        if (!run_one())
            return 1;
        if (avr->cycle >= until && halted && !*halted && !extended) {
            extended = 1;
            while (!*halted && avr->cycle < at_most)
                if (!run_one())
                    return 1;
            until = avr->cycle + 3 * F_CPU / 100; /* the transmit queue: 255 bytes, 21 ms */
        }
    }
    flush_out();
    if (window_open)
        listen_cycles += avr->cycle - window_from;
    /* The EEPROM as the mote left it (boot count, control counter): its next boot's. */
    avr_eeprom_desc_t back = {.offset = 0, .size = (uint32_t)ee_len};
    avr_ioctl(avr, AVR_IOCTL_EEPROM_GET, &back); /* its return value means nothing here */
    if (back.ee) {
        FILE *out = fopen(argv[2], "wb");
        if (!out || fwrite(back.ee, 1, ee_len, out) != ee_len || fclose(out) != 0) {
            perror(argv[2]);
            return 1;
        }
    }
    /* Controls the firmware refused (image.c `auth_rejected`: three little-endian u16). */
    uint8_t *rej = sim_data(avr, "auth_rejected");
    unsigned rejected[3] = {0, 0, 0};
    for (int i = 0; rej && i < 3; i++)
        rejected[i] = (unsigned)(rej[2 * i] | rej[2 * i + 1] << 8);
    fprintf(stderr,
            "stats {\"f_cpu_hz\": %lu, \"cycles\": %llu, \"awake_cycles\": %llu, "
            "\"conversions\": %lu, \"tx_bytes\": %lu, \"tx_frames\": %lu, \"rx_bytes\": %lu, "
            "\"listen_s\": %.6f, \"windows\": %lu, \"rejected\": {\"unsigned\": %u, "
            "\"bad_mac\": %u, \"replay\": %u}}\n",
            F_CPU, (unsigned long long)avr->cycle, (unsigned long long)(avr->cycle - sim_slept),
            conversions, tx_bytes, tx_zeros / 2, rx_bytes, (double)listen_cycles / F_CPU, windows,
            rejected[0], rejected[1], rejected[2]);
    avr_terminate(avr);
    return 0;
}
