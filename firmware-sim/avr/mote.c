/* Sample clock, A-to-D and interrupt-driven transmit queue (ATmega128). */
#include <avr/interrupt.h>
#include <avr/io.h>
#include <avr/sleep.h>

#include "mote.h"

#ifndef SAMPLE_HZ
#define SAMPLE_HZ 180
#endif
#define TX_SIZE 64 /* power of two */
/* ADC clock F_CPU/8 = 125 kHz at 1 MHz, inside the 50-200 kHz full-resolution range. */
#define ADC_PRESCALE (_BV(ADPS1) | _BV(ADPS0))

volatile uint16_t mote_dropped;
static volatile uint8_t adc_ready;
static volatile uint16_t adc_value;
static uint8_t tx_buf[TX_SIZE];
static volatile uint8_t tx_head, tx_tail;
static uint8_t sequence;

ISR(TIMER1_COMPA_vect)
{
    /* The A-to-D is powered only for the conversion (datasheet: disable it to save power). */
    ADCSRA = _BV(ADEN) | _BV(ADSC) | _BV(ADIE) | ADC_PRESCALE;
}

ISR(ADC_vect)
{
    adc_value = ADC;
    ADCSRA = 0;
    adc_ready = 1;
}

ISR(USART0_UDRE_vect)
{
    uint8_t tail = tx_tail;
    if (tail == tx_head) {
        UCSR0B &= (uint8_t)~_BV(UDRIE0);
        return;
    }
    UDR0 = tx_buf[tail];
    tx_tail = (uint8_t)((tail + 1) & (TX_SIZE - 1));
}

void mote_send(uint8_t type, const uint8_t *payload, uint8_t length)
{
    uint8_t head = tx_head;
    uint8_t used = (uint8_t)((head - tx_tail) & (TX_SIZE - 1));
    if ((uint8_t)(TX_SIZE - 1 - used) < (uint8_t)(length + 1)) {
        mote_dropped++;
        return;
    }
    tx_buf[head] = (uint8_t)((type << 4) | (sequence & 0x0f));
    sequence++;
    head = (uint8_t)((head + 1) & (TX_SIZE - 1));
    for (uint8_t i = 0; i < length; i++) {
        tx_buf[head] = payload[i];
        head = (uint8_t)((head + 1) & (TX_SIZE - 1));
    }
    tx_head = head;
    UCSR0B |= _BV(UDRIE0);
}

int main(void)
{
    ADMUX = _BV(REFS0); /* AVCC reference, channel 0 */
    UBRR0H = 0;
    UBRR0L = 0;
    UCSR0A = _BV(U2X0); /* 125 kbaud at 1 MHz */
    UCSR0C = _BV(UCSZ01) | _BV(UCSZ00);
    UCSR0B = _BV(TXEN0);
    OCR1A = (uint16_t)(F_CPU / SAMPLE_HZ - 1);
    TCCR1B = _BV(WGM12) | _BV(CS10);
    TIMSK = _BV(OCIE1A);
    program_init();
    set_sleep_mode(SLEEP_MODE_IDLE);
    uint16_t tick = 0;
    sei();
    for (;;) {
        cli();
        if (adc_ready) {
            adc_ready = 0;
            sei();
            program_sample(tick, adc_value);
            tick++;
            continue;
        }
        sleep_enable();
        sei();
        sleep_cpu();
        sleep_disable();
    }
}
