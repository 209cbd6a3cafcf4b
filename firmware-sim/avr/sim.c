/* See sim.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <simavr/avr_uart.h>
#include <simavr/sim_elf.h>

#include "sim.h"

avr_cycle_count_t sim_slept;
static elf_firmware_t fw;

static void no_sleep(avr_t *a, avr_cycle_count_t how_long)
{
    (void)a;
    sim_slept += how_long + 1; /* what avr_callback_run_raw adds to avr->cycle */
}

avr_t *sim_make(const char *prog, const char *firmware, uint32_t f_cpu)
{
    if (elf_read_firmware(firmware, &fw) != 0) {
        fprintf(stderr, "%s: cannot read %s\n", prog, firmware);
        exit(2);
    }
    fw.frequency = f_cpu;
    fw.avcc = 1023;
    fw.vcc = 5000;
    avr_t *avr = avr_make_mcu_by_name("atmega128");
    if (!avr)
        exit(2);
    avr_init(avr);
    avr->log = LOG_ERROR;
    avr_load_firmware(avr, &fw);
    avr->sleep = no_sleep;
    uint32_t flags = 0;
    avr_ioctl(avr, AVR_IOCTL_UART_SET_FLAGS('0'), &flags);
    return avr;
}

uint8_t *sim_data(avr_t *avr, const char *symbol)
{
    for (uint32_t i = 0; i < fw.symbolcount; i++)
        if (!strcmp(fw.symbol[i]->symbol, symbol) && fw.symbol[i]->addr >= 0x800000)
            return &avr->data[fw.symbol[i]->addr - 0x800000];
    return NULL;
}

uint16_t *sim_read_trace(const char *prog, const char *path, long *count)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        perror(path);
        exit(2);
    }
    long cap = 1024, n = 0;
    uint16_t *v = malloc(cap * sizeof *v);
    unsigned x;
    while (fscanf(f, "%u", &x) == 1) {
        if (x > 1023) {
            fprintf(stderr, "%s: reading %u out of 10-bit range\n", prog, x);
            exit(2);
        }
        if (n == cap)
            v = realloc(v, (cap *= 2) * sizeof *v);
        v[n++] = (uint16_t)x;
    }
    fclose(f);
    *count = n;
    return v;
}
