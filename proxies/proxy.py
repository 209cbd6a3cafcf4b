"""`SensorProxy`: one sensor's long-running proxy, as a sans-IO state machine.

It is fed what the sensor sends (`on_message(msg, now)`), what the queries need
(`set_demand(demand, now)`) and the passing of time (`tick(now)`), and answers with actions
for the caller to carry out: tuples and heartbeats to push into the Fjord, controls to send.
`now` is the caller's clock (the manager's: by default the stream's event time), used only
for liveness; sample times are the mote's own.

- Every reading becomes one tuple of the sensor's stream (static attributes filled in), at
  most once: samples, vehicles and windows at or before the latest already pushed time are
  dropped and counted as duplicates (seen before) or out of order.
- A pushed-down window (`aggregate` or `count`) becomes ONE tuple at time = window start with
  a `fjords.partial.Partial` in the value field, then a heartbeat at its end.
- Controls go out only when a message announced a receive window (`listen_ms`, or a bare
  `listen`), are re-sent in a later window until acknowledged (once `retry_windows` windows
  AND `retry_after_s` seconds of the caller's wall clock passed since the last send, so a
  mote replayed so fast that its windows are milliseconds apart does not exhaust its sends
  before the ack can come back), are given up after `max_sends` sends (a `wake` is queued
  again: the queries need the sensor), and a newer demand replaces any still pending.
- A sensor silent for `offline_after` expected message gaps is offline; when it says hello
  again its current program and rate are sent again. Progress is not carried forward for it
  in event time (another sensor racing ahead must never make its readings late): the stream's
  router releases a quiet sensor by wall-clock idleness (`fjords.progress`), fitted to the
  period it announces here (`PushPace` on hello and on rate or program acks). An asleep
  sensor whose listens carry its clock (`Listen.time`) stays in the stream's progress: each
  listen is a heartbeat, so its readings after waking are never behind the watermark. One
  whose listens carry no time (an older mote) is released (`PushRelease`) at its first
  listen asleep and holds windows again when it next reports.
- Sleep lasts until woken: `sleep` tells the mote to open a short receive window every
  `sleep_s` (the wake check: how quickly a new query must be served) and nothing else; its
  bare `listen`s keep it `asleep`, and when a query needs it again `wake` goes out in the next
  such window, followed by the program and rate.
- A listen that carries the mote's clock (`Listen.time`) is a heartbeat at that time, asleep
  or awake: the mote promises nothing later is dated before it.
- Energy is estimated on the sensor's own clock: from its first reading's time (not from the
  gateway's time before any reading arrived), at the power the cost model predicts for what
  it is believed to run (asleep: idle plus its receive windows).
- A reading dated implausibly far ahead (the manager's `admit` check, `fjords.progress`'s
  future bound) is dropped and counted (`clock_rejects`), before it can make the sensor's
  later readings look out of order.
"""

from __future__ import annotations

import itertools
import math
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec
from firmware_sim.energy import Battery
from firmware_sim.model import predict
from firmware_sim.profiles import resolve_profile
from firmware_sim.programs import PROGRAMS, RAW_BATCH, Program, make_program
from firmware_sim.records import VehicleEvent

from fjords.errors import SchemaError
from fjords.partial import Partial
from fjords.schema import Schema, convert
from proxies.choice import DEFAULT_SLEEP_S, ProgramChoice, choose_program
from proxies.demand import SensorDemand, SensorView
from proxies.pair import PairJoin
from sensors.protocol import (
    Ack,
    Aggregate,
    Control,
    ControlOp,
    Events,
    Hello,
    Listen,
    Message,
    Samples,
    Status,
)

__all__ = [
    "Action",
    "ProxyError",
    "ProxyStats",
    "PushHeartbeat",
    "PushPace",
    "PushRelease",
    "PushRow",
    "SendControl",
    "SensorProxy",
]

T = TypeVar("T")

#: Wall seconds a control waits for its ack before it is re-sent (besides `retry_windows`
#: windows): a few round trips through a busy broker and gateway.
DEFAULT_RETRY_AFTER_S = 2.0
#: Until two receive windows were seen, assume the paper's "few tens of ms per second".
ASSUMED_LISTEN_MS_PER_S = 20.0
ASSUMED_LISTEN_MS = 20.0  # a receive window's length until one was announced
_RECENT = 256  # sample times remembered to tell duplicates from reordered samples


class ProxyError(ValueError):
    """A sensor whose hello does not fit its stream (the reader logs it and skips the sensor)."""


@dataclass(frozen=True, slots=True)
class PushRow:
    stream: str
    row: tuple


@dataclass(frozen=True, slots=True)
class PushHeartbeat:
    stream: str
    sensor: object
    time: float


@dataclass(frozen=True, slots=True)
class PushPace:
    """The sensor sends about every `gap_s` seconds (its silence bound, fjords.progress)."""

    stream: str
    sensor: object
    gap_s: float


@dataclass(frozen=True, slots=True)
class PushRelease:
    """The sensor will send nothing for a while (asleep): it stops holding the stream."""

    stream: str
    sensor: object


@dataclass(frozen=True, slots=True)
class SendControl:
    sensor_id: str
    control: Control


Action = PushRow | PushHeartbeat | PushPace | PushRelease | SendControl


@dataclass(slots=True)
class ProxyStats:
    messages: int = 0
    tuples: int = 0
    heartbeats: int = 0
    duplicates: int = 0
    out_of_order: int = 0
    bad: int = 0
    stale_partials: int = 0  # windows of a pushed-down program no current demand allows
    misaligned_windows: int = 0
    redundant: int = 0  # downstream counts of a pair (upstream's are pushed)
    listen_windows: int = 0
    controls_sent: int = 0
    retries: int = 0
    superseded: int = 0
    acks: int = 0
    refused: int = 0
    unanswered: int = 0  # controls given up after max_sends windows without an ack
    unknown_acks: int = 0
    send_failures: int = 0
    offline_spells: int = 0
    clock_rejects: int = 0  # readings dated implausibly far ahead (fjords.progress)


@dataclass(slots=True)
class _Pending:
    control: Control
    sent_window: int | None = None
    sends: int = 0
    sent_wall: float | None = None  # the caller's wall clock at the last send


@dataclass(slots=True)
class _Belief:
    """What we believe the mote runs: None means unknown (so it is sent again)."""

    program: str | None = None
    params: tuple | None = None
    rate_hz: float | None = None
    asleep: bool = False  # until a wake (it listens every sleep_s)


class SensorProxy:
    """See the module docstring. Build one per sensor from its first hello."""

    def __init__(
        self,
        hello: Hello,
        *,
        stream: str,
        schema: Schema,
        sensor_field: str | None,
        now: float,
        pair: PairJoin | None = None,
        profile: str = "paper",
        default_period_s: float | None = None,
        offline_after: float = 3.0,
        retry_windows: int = 2,
        max_sends: int = 5,
        sleep_s: float = DEFAULT_SLEEP_S,
        listen_ms_per_s: float | None = None,
        history: int = 128,
        control: bool = True,
        retry_after_s: float = DEFAULT_RETRY_AFTER_S,
    ) -> None:
        if retry_windows < 1 or max_sends < 1 or offline_after <= 0:
            raise ValueError("retry_windows and max_sends must be >= 1, offline_after > 0")
        if not retry_after_s >= 0:
            raise ValueError("retry_after_s must be >= 0")
        self.sensor_id = hello.sensor_id
        self.stream = stream
        self.schema = schema
        self.pair = pair
        self.kind = "pair" if pair is not None else "scalar"
        self.profile = profile
        self.default_period_s = default_period_s
        self.offline_after = offline_after
        self.retry_windows = retry_windows
        self.max_sends = max_sends
        self.retry_after_s = retry_after_s
        self._wall: float | None = None  # the caller's wall clock at the current input
        self.sleep_s = sleep_s
        self.fixed_listen_ms_per_s = listen_ms_per_s
        self.control = control  # False: never reprogram the sensor (a baseline, or read-only)
        # Whether a reading's time is plausible (the manager's future bound); None: all are.
        self.admit: Callable[[float], bool] | None = None
        self._paced = 0.0  # the gap last announced with PushPace
        self._released = False  # asleep and released from the stream's progress
        self.stats = ProxyStats()
        self.history: _Recent[tuple[float, str, str]] = _Recent(history)
        self._seq = itertools.count(1)
        self._battery = Battery.of(resolve_profile(profile))
        self.attributes = dict(hello.attributes)
        self.role = str(hello.attributes.get("role", "")) or None
        self.capabilities = tuple(hello.programs)
        self._refused_programs: set[str] = set()
        self.rate_adjustable = True
        self.max_rate_hz: float | None = None  # it refused a faster period (e.g. a trace's step)
        # -- the tuple template: static columns filled once ---------------------------
        if schema.time is None:
            raise ProxyError(f"stream {stream!r} has no time field")
        self._time_i = schema.index(schema.time)
        template: list[object] = [None] * len(schema)
        static: dict[str, object] = {}
        key: object = hello.sensor_id
        try:
            if pair is not None:
                if sensor_field is None:
                    raise ProxyError(f"pair stream {stream!r} needs a sensor field (the pair id)")
                key = convert(pair.pair_id, schema.type_of(sensor_field), sensor_field)
                static[sensor_field] = key
            elif sensor_field is not None:
                key = convert(hello.sensor_id, schema.type_of(sensor_field), sensor_field)
                static[sensor_field] = key
            for name, value in hello.attributes.items():
                if name in schema and name not in static and name != schema.time:
                    static[name] = convert(value, schema.type_of(name), name)
        except SchemaError as exc:
            raise ProxyError(f"sensor {hello.sensor_id!r}: {exc}") from None
        for name, value in static.items():
            template[schema.index(name)] = value
        self._template = template
        self.progress_key = key
        self.static = static
        self._value_slots: list[tuple[int, int, str]] = []  # (row position, tuple index, type)
        if pair is None:
            if not hello.schema:
                raise ProxyError(f"sensor {hello.sensor_id!r} announced no reading fields")
            for j, (name, _type) in enumerate(hello.schema):
                if name not in schema:
                    raise ProxyError(
                        f"sensor {hello.sensor_id!r} reads {name!r}, which stream {stream!r} "
                        f"does not have; its columns are {', '.join(schema.names)}"
                    )
                self._value_slots.append((j, schema.index(name), schema.type_of(name)))
            self.value_field = hello.schema[0][0]
        else:
            self.value_field = "speed" if "speed" in schema else schema.names[-1]
        self._value_i = schema.index(self.value_field)
        self.view = SensorView(static, self.value_field, self.kind, schema.time)
        self._detector: Program | None = None  # pair on raw: the gateway detects vehicles
        # -- liveness and progress ---------------------------------------------------------
        self.online = True
        self.last_heard = now
        self.created = now
        self._gaps: _Recent[float] = _Recent(8)
        self.last_time = -math.inf  # latest pushed sample/event/window time
        self._recent: set[float] = set()
        self._recent_order: deque[float] = deque()
        self.progress_time = -math.inf  # latest time this sensor has reached (for heartbeats)
        self._heard_time = -math.inf  # progress_time when it was last heard from
        self._listen_ms_after_first = 0.0  # receive time per second = this / span of windows
        self._first_listen: float | None = None
        self._last_listen: float | None = None
        # -- control ------------------------------------------------------------------
        self.demand = SensorDemand()
        self.choice: ProgramChoice | None = None
        self.believed = _Belief()
        self.pending: list[_Pending] = []
        self._inflight: OrderedDict[int, Control] = OrderedDict()
        self.windows = 0
        self.errors: _Recent[str] = _Recent(8)
        # -- energy estimate (cost model) ----------------------------------------------
        self.battery_reported = hello.battery
        self.native_rate_hz: float | None = None
        self.energy_j = 0.0
        self._power_mw = 0.0  # what it is believed to draw, receive windows included
        self._accrue_mw = 0.0  # the same without an awake mote's windows (counted one by one)
        # The energy clock runs on the sensor's own time: from its first reading to its latest,
        # and past it at the caller's pace (awake: for at most `offline_after` expected gaps, so
        # a caller's clock driven by another fleet's epoch never charges a replayed trace's
        # sensor for the years between).
        self._energy_since: float | None = None  # sensor time accounted up to
        self._own_last = -math.inf  # its latest reading's time
        self._now_at_own = now  # the caller's clock then
        self._own_first: tuple[float, float] | None = None  # (first reading's time, caller's now)
        self._listen_ms = ASSUMED_LISTEN_MS  # the latest receive window's length
        self._adopt_hello(hello, now)

    # == inputs ============================================================================
    def on_message(self, msg: Message, now: float, *, wall: float | None = None) -> list[Action]:
        """Everything the sensor sent; returns what to push and what to send. `wall` is the
        caller's wall clock (monotonic seconds) for the control channel's retry timer; None
        (no wall clock) re-sends by receive windows alone."""
        self.stats.messages += 1
        self._wall = wall
        out: list[Action] = []
        if now > self.last_heard and self.stats.messages > 1:  # not hello to first message
            self._gaps.append(now - self.last_heard)
        self.last_heard = max(self.last_heard, now)
        if isinstance(msg, Hello):
            self._adopt_hello(msg, now)
            self._pace(out)
            return out
        if isinstance(msg, Status):
            if msg.battery is not None:
                self.battery_reported = msg.battery
            if not msg.online:
                self._go_offline(now, msg.reason or "status offline")
            else:
                self._come_back(now, "status online")
            return out
        if isinstance(msg, Ack):
            self._on_ack(msg, now)
            self._pace(out)
            return out
        if not self.online:
            self._come_back(now, f"{msg.kind} after silence")
        if isinstance(msg, Listen) and self.believed.asleep:
            # A sleeping mote's duty-cycled window: it stays asleep. With its clock on the
            # listen it keeps its place in the stream's progress; without, it is released.
            if msg.time is not None:
                self._listen_heartbeat(msg.time, out)
            elif not self._released and self.kind == "scalar":
                self._released = True
                out.append(PushRelease(self.stream, self.progress_key))
            self._listen_window(msg.duration_ms, now, out)
            return out
        t_first = _first_time(msg)
        if t_first is not None:
            if self._energy_since is None:
                self._energy_since = t_first
                self._own_first = (t_first, now)
            else:
                self._account(now)
            self._own_last = max(self._own_last, t_first, _last_time(msg))
            self._now_at_own = now
        if self.believed.asleep and not isinstance(msg, Listen):
            # Readings: it is awake after all (woke by itself, or missed the sleep).
            self._set_belief(now, asleep=False)
            self._reconcile(now)
        self._released = False  # its readings hold the stream's progress again
        if isinstance(msg, Samples):
            self._on_samples(msg, out)
        elif isinstance(msg, Events):
            self._on_events(msg, out)
        elif isinstance(msg, Aggregate):
            self._on_aggregate(msg, out)
        elif isinstance(msg, Listen):
            if msg.time is not None:
                self._listen_heartbeat(msg.time, out)
        else:  # a Control from a sensor makes no sense
            self._bad(f"unexpected {msg.kind!r} message from a sensor")
            return out
        self._heard_time = self.progress_time  # extrapolated from here while it is silent
        listen = msg.duration_ms if isinstance(msg, Listen) else msg.listen_ms
        if listen:
            self._listen_window(listen, now, out)
        return out

    def set_demand(self, demand: SensorDemand, now: float) -> list[Action]:
        """The queries changed: choose again; controls wait for the next receive window."""
        self.demand = demand
        self._choose(now, "demand changed")
        return []

    def tick(self, now: float) -> list[Action]:
        """Time passes without messages: mark a silent sensor offline.

        Progress is not carried forward here: an asleep sensor reports its clock on its
        listens (or is released at its first listen without one), and a silent sensor is
        released by the router's wall-clock idleness (carrying its progress forward in event
        time would make its readings late)."""
        out: list[Action] = []
        silent = now - self.last_heard
        asleep = self.believed.asleep
        if self.online:
            limit = self.offline_after * self.expected_gap
            if asleep:  # it listens every sleep_s (or at its readings' times, if slower)
                limit = max(limit, self.offline_after * self.sleep_s * self._pace_ratio())
            if silent > limit:
                self._go_offline(now, f"silent for {silent:g} s")
        self._account(now)
        return out

    def _listen_heartbeat(self, t: float, out: list[Action]) -> None:
        """A listen carrying the mote's clock: it has reached `t` (nothing later is dated
        before it). A time the future bound refuses is counted and ignored."""
        if not math.isfinite(t) or t <= self.progress_time:
            return
        if self.admit is not None and not self.admit(t):
            self.stats.clock_rejects += 1
            return
        self.progress_time = t
        out.append(PushHeartbeat(self.stream, self.progress_key, t))
        self.stats.heartbeats += 1

    def progress_actions(self) -> list[Action]:
        """What the stream's progress must know of a new sensor: how often it sends."""
        out: list[Action] = []
        self._pace(out)
        return out

    def _declared_gap(self) -> float:
        """The longest a message gap should be by its program and rate: a raw packet's worth of
        sample periods, or the program's window or count period."""
        b = self.believed
        gap = RAW_BATCH / b.rate_hz if b.rate_hz else 0.0
        params = _thaw(b.params) if b.params else {}
        if isinstance(params, dict):
            for k in ("window_ms", "period_ms"):
                v = params.get(k)
                if isinstance(v, int | float) and not isinstance(v, bool) and v > 0:
                    gap = max(gap, v / 1000.0)
        return gap

    def _pace(self, out: list[Action]) -> None:
        g = self._declared_gap()
        if g > 0 and math.isfinite(g) and g != self._paced:
            self._paced = g
            out.append(PushPace(self.stream, self.progress_key, g))

    def on_send_failed(self, control: Control, error: str, *, permanent: bool, now: float) -> None:
        """The transport could not send `control` (permanent: it never will, e.g. unencodable)."""
        self.stats.send_failures += 1
        self.errors.append(f"send {control.op}: {error}")
        if permanent:
            self.pending = [p for p in self.pending if p.control.seq != control.seq]
            self._give_up(control, now, f"cannot be sent: {error}")

    # == state ===============================================================================
    @property
    def expected_gap(self) -> float:
        """How long silence is normal: the longest recent gap between messages, and at least
        a raw packet's worth of sample periods (the longest a `raw` mote holds its readings)."""
        period = 1.0 / self.believed.rate_hz if self.believed.rate_hz else 0.0
        return max([RAW_BATCH * period, *self._gaps, 1e-9])

    def _pace_ratio(self) -> float:
        """How much faster the caller's clock has run than the sensor's (>= 1): a real-time
        mote beside a fleet replayed 60x faster listens every 30 s of its own, 30 min of the
        caller's."""
        if self._own_first is None:
            return 1.0
        own0, now0 = self._own_first
        own, caller = self._own_last - own0, self._now_at_own - now0
        if own <= 0 or caller <= 0:
            return 1.0
        return max(1.0, min(caller / own, 1e6))

    @property
    def listen_ms_per_s(self) -> float:
        if self.fixed_listen_ms_per_s is not None:
            return self.fixed_listen_ms_per_s
        if self._first_listen is None or self._last_listen is None:
            return ASSUMED_LISTEN_MS_PER_S
        span = self._last_listen - self._first_listen
        if span <= 0:
            return ASSUMED_LISTEN_MS_PER_S
        return self._listen_ms_after_first / span

    @property
    def status(self) -> str:
        if not self.online:
            return "offline"
        if self.believed.asleep:
            return "asleep"
        return "online"

    def catalog(self, now: float | None = None) -> dict[str, Any]:
        """The sensor's entry for GET /sensors (JSON-able)."""
        if now is not None:
            self._account(now)
        choice = self.choice
        b = self.believed
        spent = self.energy_j / self._battery.capacity_j
        battery = None if self.battery_reported is None else max(0.0, self.battery_reported - spent)
        return {
            "id": self.sensor_id,
            "stream": self.stream,
            "kind": self.kind,
            "schema": [[f.name, f.type] for f in self.schema.fields],
            "attributes": dict(self.attributes),
            "capabilities": list(self.capabilities),
            "status": self.status,
            "program": b.program,
            "params": None if b.params is None else _thaw(b.params),
            "sample_rate_hz": b.rate_hz,
            "wanted": None
            if choice is None
            else {
                "program": choice.program,
                "params": choice.params,
                "sample_rate_hz": choice.rate_hz,
                "reason": choice.reason,
                "lifetime_met": choice.lifetime_met,
            },
            "queries": list(self.demand.queries),
            "pending_controls": [str(p.control.op) for p in self.pending],
            "power_mw_estimate": self._power_mw,
            "energy_j_estimate": self.energy_j,
            "battery_estimate": battery,
            "lifetime_days_estimate": None
            if not self._power_mw
            else self._battery.lifetime_s(self._power_mw) / 86_400.0,
            "listen_ms_per_s": self.listen_ms_per_s,
            "wake_check_s": self.sleep_s,
            "counters": {k: getattr(self.stats, k) for k in self.stats.__slots__},
            "errors": list(self.errors),
        }

    # == messages ============================================================================
    def _fresh(self, t: float) -> bool:
        """Whether a reading at `t` is new; counts duplicates and reordered ones."""
        if self.admit is not None and not self.admit(t):
            self.stats.clock_rejects += 1
            return False
        last = self.last_time
        # (A pushed window's end is `last_time` too, but not a pushed reading: the next starts there.)
        if t > last or (t == last and t not in self._recent):
            self.last_time = t
            self._recent.add(t)
            self._recent_order.append(t)
            if len(self._recent_order) > _RECENT:
                self._recent.discard(self._recent_order.popleft())
            return True
        if t in self._recent:
            self.stats.duplicates += 1
        else:
            self.stats.out_of_order += 1
        return False

    def _on_samples(self, msg: Samples, out: list[Action]) -> None:
        if self.kind == "pair":
            self._pair_samples(msg, out)
            return
        slots, tmpl, ti, stream = self._value_slots, self._template, self._time_i, self.stream
        for t, values in zip(msg.times, msg.rows, strict=True):
            if not isinstance(t, int | float) or isinstance(t, bool) or not math.isfinite(t):
                self._bad(f"sample time {t!r} is not a finite number")
                continue
            if len(values) != len(slots):
                self._bad(f"sample row of {len(values)} values; the hello announced {len(slots)}")
                continue
            if not self._fresh(t):
                continue
            row = list(tmpl)
            row[ti] = t
            try:
                for j, i, typ in slots:
                    v = values[j]
                    row[i] = v if v.__class__ is float and typ == "float" else convert(v, typ)
            except SchemaError as exc:
                self._bad(str(exc))
                continue
            out.append(PushRow(stream, tuple(row)))
            self.stats.tuples += 1
            self.progress_time = max(self.progress_time, t)

    def _pair_samples(self, msg: Samples, out: list[Action]) -> None:
        """A pair mote running raw: detect vehicles here, as its `vehicle` program would."""
        assert self.pair is not None
        if self._detector is None:
            self._detector = make_program("vehicle", {"role": self.role or "upstream"})
        for t, values in zip(msg.times, msg.rows, strict=True):
            if not values or not self._fresh(t):
                continue
            v = values[0]
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                self._bad(f"light reading {v!r} is not a finite number")
                continue
            for rec in self._detector.feed(t, float(v)):
                if isinstance(rec, VehicleEvent):
                    self._push_rows(self.pair.event(rec.role, rec.t_on, rec.t_off), out)
            self._push_rows(self.pair.advance(self.role or "upstream", t), out)
        self._pair_heartbeat(out)

    def _on_events(self, msg: Events, out: list[Action]) -> None:
        if self.pair is None:
            self._bad("events from a sensor that is not part of a loop pair")
            return
        role = msg.name
        if role not in ("upstream", "downstream"):
            self._bad(f"events named {role!r}; expected upstream or downstream")
            return
        latest = -math.inf
        for times in msg.times:
            if len(times) != 2 or not all(math.isfinite(x) for x in times) or times[1] < times[0]:
                self._bad(f"vehicle event {times!r} is not (on, off) with on <= off")
                continue
            if not self._fresh(times[0]):
                continue
            self._push_rows(self.pair.event(role, times[0], times[1]), out)
            latest = max(latest, times[1])
        if latest > -math.inf:
            self._push_rows(self.pair.advance(role, latest), out)
            self._pair_heartbeat(out)

    def _on_aggregate(self, msg: Aggregate, out: list[Action]) -> None:
        values = msg.values
        start, end = msg.start, msg.end
        try:
            count = int(values["count"])
            if count != values["count"] or count < 0:
                raise ValueError
            if "sum" in values:
                partial = Partial(
                    count, float(values["sum"]), float(values["min"]), float(values["max"])
                )
            else:
                partial = Partial(count)
        except (KeyError, TypeError, ValueError):
            self._bad(f"aggregate values {dict(values)!r} are not count[, sum, min, max]")
            return
        if self.kind == "pair":
            assert self.pair is not None
            if partial.sum is not None:
                self._bad("a pair mote sent value aggregates")
                return
            self.pair.counts(self.role or "upstream")
            if self.role == "downstream":
                self.stats.redundant += 1
                return
            allowed = self.demand.needs == "counts"
        else:
            allowed = partial.sum is not None and self.demand.window_s is not None
        if not allowed:
            # The mote still runs a program no query allows any more (it is being switched).
            self.stats.stale_partials += 1
            return
        w = self.demand.window_s
        if self.kind == "scalar" and w is not None:
            if end - start > w + 1e-6:
                self.stats.stale_partials += 1
                return
            if abs(start / w - round(start / w)) > 1e-6:
                self.stats.misaligned_windows += 1
        if self.admit is not None and not self.admit(end):
            self.stats.clock_rejects += 1
            return
        if end <= self.last_time:
            self.stats.duplicates += 1  # a window we already have (a retransmission)
            return
        # A program loaded mid-window sends a partial of only the readings after the load; the
        # raw readings before it were pushed already. Placing the partial at the latest time
        # pushed (inside the window) keeps it in the window's pane and never late.
        t_row = max(start, self.last_time)
        row = list(self._template)
        row[self._time_i] = t_row
        row[self._value_i] = partial
        out.append(PushRow(self.stream, tuple(row)))
        self.stats.tuples += 1
        # The window is complete: nothing before its end will come from this sensor.
        self.last_time = max(self.last_time, end)
        self.progress_time = max(self.progress_time, end)
        out.append(PushHeartbeat(self.stream, self.progress_key, end))
        self.stats.heartbeats += 1

    def _push_rows(self, rows: Iterable[tuple], out: list[Action]) -> None:
        for r in rows:
            out.append(PushRow(self.stream, r))
            self.stats.tuples += 1

    def _pair_heartbeat(self, out: list[Action]) -> None:
        assert self.pair is not None
        t = self.pair.heartbeat_time
        if t > self.progress_time:
            self.progress_time = t
            out.append(PushHeartbeat(self.stream, self.progress_key, t))
            self.stats.heartbeats += 1

    def _bad(self, why: str) -> None:
        self.stats.bad += 1
        self.errors.append(why)

    # == liveness ============================================================================
    def _adopt_hello(self, hello: Hello, now: float) -> None:
        """First hello, or the sensor rebooted/reconnected: believe what it says it runs."""
        returning = self.stats.messages > 0
        self.capabilities = tuple(hello.programs) or self.capabilities
        self.battery_reported = hello.battery
        rate = 1000.0 / hello.sample_period_ms if hello.sample_period_ms > 0 else None
        if not returning or self.native_rate_hz is None:
            self.native_rate_hz = rate  # the rate it runs when no query asks for another
        # Its program's parameters are unknown (unless it has none): what we want is sent again.
        known = PROGRAMS.get(hello.program)
        params = () if known is not None and not known.PARAMS else None
        self._set_belief(
            now, program=hello.program or None, params=params, rate_hz=rate, asleep=False
        )
        if returning:
            self._come_back(now, "hello")
            self.history.append((now, "hello", "current program and rate re-sent"))
            for p in self.pending:
                p.sent_window = None  # a rebooted mote lost whatever it had not acked
        if self.choice is None:
            self._choose(now, "hello")
        else:
            self._reconcile(now)

    def _go_offline(self, now: float, why: str) -> None:
        if self.online:
            self.online = False
            self.stats.offline_spells += 1
            self.history.append((now, "offline", why))

    def _come_back(self, now: float, why: str) -> None:
        if not self.online:
            self.online = True
            self.history.append((now, "online", why))
            # Asleep, the silence was its listen interval as the caller's clock sees it (which
            # may run faster than the sensor's): keep it, or every window would flap offline.
            keep = self._gaps[-1:] if self.believed.asleep else []
            self._gaps.clear()
            self._gaps.extend(keep)

    # == control =============================================================================
    def what_if(self, demand: SensorDemand) -> ProgramChoice:
        """The program this sensor would get for `demand` (EXPLAIN: nothing changes)."""
        caps = [c for c in self.capabilities if c not in self._refused_programs]
        if not caps:
            caps = ["raw"]
        return choose_program(
            demand,
            kind=self.kind,
            capabilities=caps,
            role=self.role,
            current_rate_hz=self.native_rate_hz if self.rate_adjustable else self.believed.rate_hz,
            rate_adjustable=self.rate_adjustable,
            max_rate_hz=self.max_rate_hz,
            profile=self.profile,
            listen_ms_per_s=self.listen_ms_per_s,
            sleep_s=self.sleep_s,
        )

    def _choose(self, now: float, why: str) -> None:
        choice = self.what_if(self.demand)
        old = self.choice
        self.choice = choice
        if old is None or old.key() != choice.key():
            self.history.append(
                (
                    now,
                    "choice",
                    f"{choice.program} {choice.params} "
                    f"@ {choice.rate_hz} Hz ({why}): {choice.reason}",
                )
            )
        self._reconcile(now)

    def _wanted_controls(self) -> list[Control]:
        c, b = self.choice, self.believed
        if c is None or not self.control:
            return []
        sid = self.sensor_id
        if c.program == "sleep":
            if b.asleep:
                return []
            return [Control.sleep(sid, c.sleep_s * 1000.0)]
        out: list[Control] = []
        if b.asleep:
            out.append(Control.wake(sid))  # in its next window; the program and rate follow
        if b.program != c.program or b.params != _freeze(c.params):
            out.append(Control.load_program(sid, c.program, c.params))  # type: ignore[arg-type]
        if (
            self.rate_adjustable
            and c.rate_hz is not None
            and (b.rate_hz is None or not math.isclose(b.rate_hz, c.rate_hz, rel_tol=1e-9))
        ):
            out.append(Control.set_period(sid, 1000.0 / c.rate_hz))
        return out

    def _reconcile(self, now: float) -> None:
        """Make the pending controls those that take the mote from belief to choice."""
        wanted = self._wanted_controls()
        keep: list[_Pending] = []
        for w in wanted:
            same = next((p for p in self.pending if _same_control(p.control, w)), None)
            if same is not None:
                keep.append(same)
            else:
                keep.append(_Pending(_with_seq(w, next(self._seq))))
        dropped = [p for p in self.pending if p not in keep]
        if dropped:
            self.stats.superseded += len(dropped)
            self.history.append((now, "superseded", ", ".join(str(p.control.op) for p in dropped)))
        self.pending = keep

    def _listen_window(self, listen_ms: float, now: float, out: list[Action]) -> None:
        self.windows += 1
        self.stats.listen_windows += 1
        if listen_ms > 0:
            self._listen_ms = listen_ms
        self._account(now)
        if self._first_listen is None:
            self._first_listen = now
        else:
            self._listen_ms_after_first += listen_ms
        self._last_listen = now
        if not self.believed.asleep:
            # The receive time it announced: counted as it happens, not from an assumed rate.
            if self._energy_since is not None:
                prof = resolve_profile(self.profile)
                self.energy_j += listen_ms / 1000.0 * prof.rx_mw * 1e-3
        self._power_mw = self._estimate_power()  # its receive time per second is better known
        wall = self._wall
        for p in list(self.pending):
            if p.sent_window is not None and (
                self.windows - p.sent_window < self.retry_windows
                or (
                    wall is not None
                    and p.sent_wall is not None
                    and wall - p.sent_wall < self.retry_after_s
                )
            ):
                continue  # its ack may still be on the way
            if p.sends >= self.max_sends:
                self.pending.remove(p)
                self.stats.unanswered += 1
                self._give_up(p.control, now, f"no ack after {p.sends} windows")
                continue
            if p.sends:
                self.stats.retries += 1
            p.sends += 1
            p.sent_window = self.windows
            p.sent_wall = wall
            self._inflight[p.control.seq] = p.control
            while len(self._inflight) > 64:
                self._inflight.popitem(last=False)
            self.stats.controls_sent += 1
            self.history.append((now, "sent", f"{_describe(p.control)} in window {self.windows}"))
            out.append(SendControl(self.sensor_id, p.control))

    def _on_ack(self, ack: Ack, now: float) -> None:
        control = self._inflight.pop(ack.ack_seq, None)
        if control is None:
            self.stats.unknown_acks += 1
            return
        self.stats.acks += 1
        self.pending = [p for p in self.pending if p.control.seq != ack.ack_seq]
        if not ack.ok:
            self.stats.refused += 1
            self.history.append((now, "refused", f"{_describe(control)}: {ack.error}"))
            self._give_up(control, now, ack.error or "refused")
            return
        self.history.append((now, "acked", f"{_describe(control)} after window {self.windows}"))
        if control.op == ControlOp.LOAD_PROGRAM:
            self._set_belief(now, program=control.program, params=_freeze(dict(control.params)))
            if self.pair is not None and control.program != "count":
                self.pair.mode.pop(self.role or "upstream", None)
        elif control.op == ControlOp.SET_PERIOD:
            assert control.period_ms is not None
            self._set_belief(now, rate_hz=1000.0 / control.period_ms)
        elif control.op == ControlOp.SLEEP:
            self._set_belief(now, asleep=True)
        else:
            self._set_belief(now, asleep=False)
        self._reconcile(now)

    def _give_up(self, control: Control, now: float, why: str) -> None:
        self.errors.append(f"{_describe(control)}: {why}")
        if control.op == ControlOp.SET_PERIOD:
            assert control.period_ms is not None
            refused_hz = 1000.0 / control.period_ms if control.period_ms > 0 else math.inf
            native = self.native_rate_hz
            if native and refused_hz > native * (1 + 1e-9) and self.max_rate_hz is None:
                # e.g. a trace replay cannot sample faster than its trace; slower may still work
                self.max_rate_hz = native
                self._choose(now, f"the sample rate cannot go above {native:g} Hz")
            else:
                self.rate_adjustable = False  # e.g. a mote that samples at a trace's times
                self._choose(now, "the sample rate cannot be changed")
        elif control.op == ControlOp.LOAD_PROGRAM and control.program:
            self._refused_programs.add(control.program)
            self._choose(now, f"{control.program} is not available")
        elif control.op == ControlOp.WAKE:
            self._reconcile(now)  # the queries still need it: wake again (a new seq)

    def _set_belief(self, now: float, **changes: Any) -> None:
        self._account(now)
        for k, v in changes.items():
            setattr(self.believed, k, v)
        self._power_mw = self._estimate_power()
        self._accrue_mw = self._estimate_power(windows=self.believed.asleep)

    # == energy ============================================================================
    def _account(self, now: float) -> None:
        """Charge the believed power up to `now` on the sensor's own clock."""
        since = self._energy_since
        if since is None:
            return
        past = max(0.0, now - self._now_at_own)
        if not self.believed.asleep:
            # (by its program's declared gap: observed gaps include any jump of the caller's clock)
            past = min(past, self.offline_after * self._declared_gap())
        own = self._own_last + past
        if own > since:
            self.energy_j += self._accrue_mw * 1e-3 * (own - since)
            self._energy_since = own

    def _estimate_power(self, *, windows: bool = True) -> float:
        """The cost model's power for what it is believed to run; without `windows`, an awake
        mote's receive windows are left out (the energy estimate counts them as announced)."""
        b = self.believed
        prof = resolve_profile(self.profile)
        if b.asleep:
            # Idle, plus a receive window (announced by a bare `listen` packet) every sleep_s.
            window_j = (
                self._listen_ms / 1000.0 * prof.rx_mw * 1e-3
                + prof.packet_overhead_bits * prof.tx_joules_per_bit
            )
            return prof.cpu_idle_mw + window_j / max(self.sleep_s, 1e-3) * 1e3
        if not b.program or not b.rate_hz:
            return 0.0
        listen = min(1000.0, self.listen_ms_per_s) if windows else 0.0
        workload: dict[str, Any] = {"listen_ms_per_s": listen}
        params = _thaw(b.params) if b.params else {}
        if b.program == "aggregate" and "window_ms" in params:
            workload["window_ms"] = float(params["window_ms"])
        if b.program == "count" and "period_ms" in params:
            workload["period_ms"] = float(params["period_ms"])
        try:
            return predict(b.program, b.rate_hz, self.profile, **workload).power_mw
        except ValueError:
            return 0.0


# -- helpers ---------------------------------------------------------------------------------


class _Recent(list[T]):
    """The last `maxlen` items: a list, since an empty deque costs ~600 bytes and a catalog
    holds thousands of proxies with a few of these each."""

    __slots__ = ("maxlen",)

    def __init__(self, maxlen: int) -> None:
        super().__init__()
        self.maxlen = maxlen

    def append(self, item: T) -> None:
        super().append(item)
        if len(self) > self.maxlen:
            del self[0]


def _first_time(msg: Message) -> float | None:
    """The earliest time a reading message carries (None for listen, hello...)."""
    t: float | None = None
    if isinstance(msg, Samples) and msg.times:
        t = min(msg.times)
    elif isinstance(msg, Events) and msg.times:
        t = min((x[0] for x in msg.times if x), default=None)
    elif isinstance(msg, Aggregate):
        t = msg.start
    return t if t is not None and math.isfinite(t) else None


def _last_time(msg: Message) -> float:
    """The latest time a reading message carries (-inf for none)."""
    if isinstance(msg, Samples) and msg.times:
        return max(msg.times)
    if isinstance(msg, Events) and msg.times:
        return max((x[-1] for x in msg.times if x), default=-math.inf)
    if isinstance(msg, Aggregate):
        return msg.end
    return -math.inf


def _freeze(v: Any) -> Any:
    if isinstance(v, dict):
        return tuple(sorted((k, _freeze(x)) for k, x in v.items()))
    if isinstance(v, list | tuple):
        return tuple(_freeze(x) for x in v)
    return v


def _thaw(v: Any) -> Any:
    if isinstance(v, tuple) and all(
        isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str) for x in v
    ):
        return {k: _thaw(x) for k, x in v}
    if isinstance(v, tuple):
        return [_thaw(x) for x in v]
    return v


def _same_control(a: Control, b: Control) -> bool:
    return (
        a.op == b.op
        and a.program == b.program
        and _freeze(dict(a.params)) == _freeze(dict(b.params))
        and a.period_ms == b.period_ms
        and a.duration_ms == b.duration_ms
    )


def _with_seq(c: Control, seq: int) -> Control:
    return msgspec.structs.replace(c, seq=seq)


def _describe(c: Control) -> str:
    if c.op == ControlOp.LOAD_PROGRAM:
        return f"load_program {c.program} {dict(c.params)} (seq {c.seq})"
    if c.op == ControlOp.SET_PERIOD:
        return f"set_period {c.period_ms:g} ms (seq {c.seq})"
    if c.op == ControlOp.SLEEP:
        return f"sleep {c.duration_ms:g} ms (seq {c.seq})"
    return f"{c.op} (seq {c.seq})"
