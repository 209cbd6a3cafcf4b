"""One simulated mote: a firmware_sim program over a stream of readings, sent through a link.

Per A-to-D sample the mote feeds its program, charges the program's exact cost (cycles,
conversion, message bits) to its :class:`firmware_sim.energy.EnergyAccount`, and turns the
program's records into protocol messages. Roughly every `listen_every_s` it piggybacks a
receive window (`listen_ms`) on an outgoing data message (a bare `listen` when it has none),
and only then does it look at control messages, as the paper's proxy protocol has it.

`sleep` (duration D) puts the mote to sleep until a `wake`: it first sends what its program
still holds (a partial batch or window), then takes no readings and, every D seconds of its
time, opens a short receive window announced by a bare `listen` carrying its clock (duty-cycled
listening), so a new query reaches it within D and the gateway knows how far its time has gone
(nothing it sends later is dated before that listen). `load_program` also sends what the old
program holds before replacing it. A mote replaying a recorded trace
(`trace_step_s` set) accepts `set_period` at whole multiples of the trace's step and
sub-samples the trace; other periods are refused with the reason.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec
from firmware_sim.energy import EnergyAccount
from firmware_sim.programs import PROGRAMS, Program, make_program
from firmware_sim.records import Count, PartialAggregate, Record, Sample, VehicleEvent

from sensors.motes.faults import FaultInjector, MoteClock
from sensors.protocol import (
    Ack,
    AggregateReport,
    Control,
    ControlOp,
    Events,
    Hello,
    Listen,
    Message,
    Samples,
    Scalar,
)
from sensors.transports.base import MoteLink

__all__ = ["MoteStats", "Pacer", "SimulatedMote", "records_to_messages"]

#: Programs whose records are readings (a `samples` message), not events or aggregates.
SAMPLE_PROGRAMS = frozenset({"raw", "filter", "deadband"})


@dataclass(slots=True)
class MoteStats:
    samples: int = 0
    messages: int = 0
    acks: int = 0
    controls: int = 0
    asleep_s: float = 0.0
    #: ("sleep" | "wake", mote time) as they were applied: what a test or a report needs to
    #: tell readings never taken (asleep) from readings lost on the way.
    transitions: list[tuple[str, float]] = field(default_factory=list)


class Pacer:
    """Maps mote time to wall time: `speedup` x real time, or None for as fast as possible."""

    def __init__(self, speedup: float | None = None, origin: float | None = None) -> None:
        if speedup is not None and speedup <= 0:
            raise ValueError("speedup must be > 0 (or None: as fast as possible)")
        self.speedup = speedup
        self.origin = origin  # mote time that maps to wall start; first reading if None
        self._wall0 = time.monotonic()

    async def until(self, t: float) -> None:
        if self.speedup is None:
            return
        if self.origin is None:
            self.origin = t
            self._wall0 = time.monotonic()
        ahead = (t - self.origin) / self.speedup - (time.monotonic() - self._wall0)
        if ahead > 0.002:
            await asyncio.sleep(ahead)


def records_to_messages(
    sensor_id: str, program: str, records: list[Record], seq: Iterable[int]
) -> list[Message]:
    """The protocol messages for one sample's records (a batch of samples is one message)."""
    seqs = iter(seq)
    samples = [r for r in records if isinstance(r, Sample)]
    out: list[Message] = []
    if samples:
        out.append(
            Samples(
                sensor_id=sensor_id,
                seq=next(seqs),
                times=tuple(s.t for s in samples),
                rows=tuple((s.value,) for s in samples),
            )
        )
    for r in records:
        if isinstance(r, VehicleEvent):
            out.append(
                Events(sensor_id=sensor_id, seq=next(seqs), name=r.role, times=((r.t_on, r.t_off),))
            )
        elif isinstance(r, Count):
            out.append(
                AggregateReport(
                    sensor_id=sensor_id,
                    seq=next(seqs),
                    start=r.window_start,
                    end=r.window_end,
                    values={"count": r.count},
                )
            )
        elif isinstance(r, PartialAggregate):
            out.append(
                AggregateReport(
                    sensor_id=sensor_id,
                    seq=next(seqs),
                    start=r.window_start,
                    end=r.window_end,
                    values={"sum": r.sum, "count": r.count, "min": r.min, "max": r.max},
                )
            )
    return out


class SimulatedMote:
    """See the module docstring. `readings` are (true time s, value) in time order."""

    def __init__(
        self,
        sensor_id: str,
        link: MoteLink,
        *,
        field: str = "value",
        program: str = "raw",
        params: Mapping[str, Any] | None = None,
        period_s: float = 1.0,
        attributes: Mapping[str, Scalar] | None = None,
        profile: str = "paper",
        clock: MoteClock | None = None,
        faults: FaultInjector | None = None,
        listen_ms: float = 20.0,
        listen_every_s: float = 1.0,
        backpressure: bool = False,
        yield_every: int = 64,
        trace_step_s: float | None = None,
    ) -> None:
        self.sensor_id = sensor_id
        self.link = link
        self.field = field
        self.attributes = dict(attributes or {})
        self.clock = clock or MoteClock()
        self.faults = faults or FaultInjector()
        self.energy = EnergyAccount(profile)
        self.stats = MoteStats()
        self.period_s = period_s
        self.listen_ms = listen_ms
        self.listen_every_s = listen_every_s
        self.backpressure = backpressure
        self.yield_every = yield_every
        self.program_name = program
        self.program: Program = make_program(program, params)
        self._seq = itertools.count()
        self._next_listen: float | None = None
        self._sleep_check_s: float | None = None  # asleep: a receive window this often
        self._next_check = 0.0
        self._next_sample: float | None = None  # sub-sampling a trace at a slower period
        self.trace_step_s = trace_step_s
        if trace_step_s is not None:
            self.period_adjustable = True
        self._was_offline = False
        self._last_t: float | None = None
        self._window_t = 0.0  # mote time of the receive window being handled

    # -- what the gateway learns -----------------------------------------------------
    def hello(self) -> Hello:
        return Hello(
            sensor_id=self.sensor_id,
            seq=next(self._seq),
            schema=((self.field, "float"),),
            programs=tuple(sorted(PROGRAMS)),
            program=self.program_name,
            sample_period_ms=self.period_s * 1000.0,
            battery=round(self.energy.battery_remaining, 6),
            attributes=self.attributes,
        )

    # -- running ----------------------------------------------------------------------
    async def run(
        self,
        readings: Iterable[tuple[float, float]] | AsyncIterator[tuple[float, float]],
        pacer: Pacer | None = None,
        *,
        send_hello: bool = True,
    ) -> None:
        """Sample every reading, then flush the program; returns when the readings end."""
        pacer = pacer or Pacer(None)
        if send_hello:
            await self.link.send(self.hello())
        n = 0
        if isinstance(readings, AsyncIterator):
            async for t, value in readings:
                await self.step(t, value, pacer)
        else:
            for t, value in readings:
                await self.step(t, value, pacer)
                n += 1
                if n % self.yield_every == 0:
                    await asyncio.sleep(0)
        await self.finish()

    async def step(self, t: float, value: float, pacer: Pacer | None = None) -> None:
        """One A-to-D sample at true time `t` (a reading the mote skips when it sub-samples a
        trace at a slower period, or sleeps)."""
        if self._sleep_check_s is None and self._next_sample is not None:
            if t < self._next_sample - 1e-6 * self.period_s:
                return  # between samples: the idle time is charged with the next one
        if pacer is not None:
            await pacer.until(t)
        gap = max(0.0, t - self._last_t) if self._last_t is not None else self.period_s
        self._last_t = t
        if self._sleep_check_s is not None:
            await self._asleep(t, gap)
            return
        if self.trace_step_s is not None and self.period_s > self.trace_step_s * (1 + 1e-9):
            self._next_sample = t + self.period_s
        else:
            self._next_sample = None
        mote_t = self.clock(t)
        records = self.program.feed(mote_t, value)
        self.stats.samples += 1
        messages = records_to_messages(self.sensor_id, self.program_name, records, self._seq)
        listen = self._listen_due(mote_t, bool(messages))
        cost = self.program.last
        self.energy.charge(
            gap,
            cycles=cost.cycles,
            adc=cost.adc,
            bits=cost.bits,
            messages=cost.messages,
            listen_s=self.listen_ms / 1000.0 if listen else 0.0,
        )
        if listen:
            if messages:
                messages[-1] = msgspec.structs.replace(messages[-1], listen_ms=self.listen_ms)
            else:
                messages.append(
                    Listen(
                        sensor_id=self.sensor_id, seq=next(self._seq), duration_ms=self.listen_ms
                    )
                )
        await self._transmit(t, messages)
        if listen:
            await self._receive_window(mote_t)

    async def _asleep(self, t: float, gap: float) -> None:
        """Asleep: idle, except for the receive windows due by `t` (each announced by a bare
        `listen`; a simulated mote only runs at its readings' times, so the windows due since
        the last reading are charged and one goes out now)."""
        check = self._sleep_check_s
        assert check is not None
        windows = 0
        if t >= self._next_check:
            windows = 1 + int((t - self._next_check) // check)
            self._next_check += windows * check
        self.energy.charge(gap, messages=windows, listen_s=windows * self.listen_ms / 1000.0)
        self.stats.asleep_s += gap
        if windows:
            # Its clock rides on the listen: it holds nothing older (flushed when it fell
            # asleep), so the gateway may count this time as the mote's progress.
            listen = Listen(
                sensor_id=self.sensor_id,
                seq=next(self._seq),
                duration_ms=self.listen_ms,
                time=self.clock(t),
            )
            await self._transmit(t, [listen])
            await self._receive_window(self.clock(t))

    @property
    def asleep(self) -> bool:
        return self._sleep_check_s is not None

    async def finish(self) -> None:
        t = self._last_t or 0.0
        records = self.program.flush(self.clock(t))
        messages = records_to_messages(self.sensor_id, self.program_name, records, self._seq)
        await self._transmit(t, messages)
        for msg in self.faults.flush():
            await self._send(msg)

    def _listen_due(self, mote_t: float, has_data: bool) -> bool:
        """A window rides on a data packet when one goes out within a period of it being due;
        otherwise a bare `listen` goes out one period late."""
        if self._next_listen is None:
            self._next_listen = mote_t + self.listen_every_s
            return False
        if mote_t >= self._next_listen and (
            has_data or mote_t >= self._next_listen + self.listen_every_s
        ):
            self._next_listen = mote_t + self.listen_every_s
            return True
        return False

    async def _transmit(self, t: float, messages: list[Message]) -> None:
        offline = self.faults.offline(t)
        if offline != self._was_offline:
            self._was_offline = offline
            self.link.set_online(not offline)
            if not offline:  # back: introduce ourselves again
                await self._send(self.hello())
        if offline:
            self.faults.stats.offline_dropped += len(messages)
            return
        for msg in messages:
            for out in self.faults.submit(t, msg):
                await self._send(out)
        if not messages:
            for out in self.faults.release(t):
                await self._send(out)

    async def _send(self, msg: Message) -> None:
        if self.backpressure:
            await self.link.flow()
        await self.link.send(msg, corrupt=self.faults.corruption())
        self.stats.messages += 1

    async def _receive_window(self, mote_t: float) -> None:
        self._window_t = mote_t
        for control in self.link.poll_controls():
            self.stats.controls += 1
            if control.sensor_id == self.sensor_id:
                if control.op == ControlOp.HELLO:
                    # A gateway that does not know it (restarted while it slept) takes a hello
                    # to mean awake: it wakes, and is put back to sleep if nothing needs it.
                    self._wake()
                    await self._send(self.hello())  # the hello is the answer
                    continue
                if control.op in (ControlOp.SLEEP, ControlOp.LOAD_PROGRAM) and not self.asleep:
                    await self._flush_program(mote_t)
            ack = self.apply(control)
            await self._send(ack)
            self.stats.acks += 1

    async def _flush_program(self, mote_t: float) -> None:
        """Send what the program still holds (a partial batch or window) before it is replaced
        or the mote sleeps: those readings are neither lost nor sent later, behind its clock."""
        records = self.program.flush(mote_t)
        messages = records_to_messages(self.sensor_id, self.program_name, records, self._seq)
        if not messages:
            return
        cost = self.program.last
        self.energy.add_cycles(cost.cycles)  # within the current period: no time passes
        self.energy.add_bits_sent(cost.bits, cost.messages)
        await self._transmit(self._last_t or 0.0, messages)

    def apply(self, control: Control) -> Ack:
        """Carry out a control message; the Ack says whether it worked and why not."""

        def ack(ok: bool = True, error: str = "") -> Ack:
            return Ack(
                sensor_id=self.sensor_id,
                seq=next(self._seq),
                ack_seq=control.seq,
                ok=ok,
                error=error,
            )

        if control.sensor_id != self.sensor_id:
            return ack(False, f"control for {control.sensor_id!r} reached {self.sensor_id!r}")
        if control.op == ControlOp.SET_PERIOD:
            if not self.period_adjustable:
                return ack(False, "this mote samples at its trace's times")
            assert control.period_ms is not None
            period = control.period_ms / 1000.0
            step = self.trace_step_s
            if step is not None:
                k = period / step
                if not (k >= 1 - 1e-9 and math.isclose(k, round(k), rel_tol=1e-9, abs_tol=1e-6)):
                    return ack(
                        False,
                        f"period {period:g} s is not a whole multiple of the trace's {step:g} s",
                    )
                period = round(k) * step
                if self._next_sample is not None or period > step:
                    self._next_sample = (self._last_t or 0.0) + period
            self.period_s = period
            return ack()
        if control.op == ControlOp.LOAD_PROGRAM:
            assert control.program is not None
            try:
                program = make_program(control.program, control.params)
            except ValueError as exc:
                return ack(False, str(exc))
            self.program, self.program_name = program, control.program
            return ack()
        if control.op == ControlOp.SLEEP:
            assert control.duration_ms is not None
            # Until woken; a receive window every duration (the listen interval while asleep).
            check = control.duration_ms / 1000.0 if control.duration_ms > 0 else self.listen_every_s
            if self._sleep_check_s is None:
                self.stats.transitions.append(("sleep", self._window_t))
            self._sleep_check_s = max(check, 1e-3)
            self._next_check = (self._last_t or 0.0) + self._sleep_check_s
            return ack()
        self._wake()
        return ack()

    def _wake(self) -> None:
        if self._sleep_check_s is not None:  # sample again from the next reading
            self.stats.transitions.append(("wake", self._window_t))
            self._sleep_check_s = None
            self._next_sample = None
            self._next_listen = None

    #: Set by sources whose sample times the mote chooses (not a recorded trace).
    period_adjustable = False
