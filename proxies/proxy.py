"""`SensorProxy`: one sensor's long-running proxy, as a sans-IO state machine.

It is fed what the sensor sends (`on_message(msg, now, wall=...)`), what the queries need
(`set_demand(demand, now)`) and the passing of time (`tick(now)`), and answers with actions
(`proxies.actions`) for the caller to carry out: tuples and heartbeats to push into the Fjord,
controls to send. `now` is the caller's clock (the manager's: by default the stream's event
time), used for liveness and energy; `wall` its wall clock, for the control channel's retry
timer and for liveness at the sensor's own pace (stream time, driven by the fastest sensors, is
not silence for a slower one); sample times are the mote's own.

The proxy decides what the sensor should run (`proxies.choice`, from `proxies.demand`) and
what it believes it runs, and composes one part per concern, each sans-IO in its own module:

- `proxies.layout.TupleLayout`: where the readings go in the stream's tuples, from the hello.
- `proxies.tuples.TupleMaker`: messages -> tuples, at most once (dedup, reorder), pushed-down
  windows as partials, a loop pair's vehicles. A reading's time passes the caller's future
  bound first, given at construction (`admit(progress_key, t)`: the stream's clock guard).
- `proxies.control.ControlChannel`: the controls on their way to the mote (pending, retry,
  ack, supersede), an explicit state machine; a `wake` given up is queued again (the queries
  need the sensor).
- `proxies.liveness.Liveness`: online/offline from the gaps between messages, on the caller's
  clock and (given `wall`) on the wall clock at the sensor's own pace. Progress is not
  carried forward for a silent sensor in event time (another sensor racing ahead must never
  make its readings late): the stream's router releases it by wall-clock idleness
  (`fjords.runtime.progress`), fitted to the period it announces here (`PushPace` on hello and on rate
  or program acks).
- `proxies.stall.StallWatch`: whether its data stopped while the program the gateway gave it
  should send (`stalled`), on the same two clocks; what it owes comes from the gateway's own
  choice and acknowledged controls (`owed_gap`), never from an ack of a control it did not send.
- `proxies.energy.EnergyEstimator`: energy and battery on the sensor's own clock.
- `proxies.refusals.Refusals`: what the mote refused or left unanswered, so it is not asked
  again (or only after a cooldown).

The proxy keeps the state the `/sensors` view shows; rendering it is the HTTP API's concern.

Sleep lasts until woken: `sleep` tells the mote to open a short receive window every `sleep_s`
(the wake check: how quickly a new query must be served) and nothing else; its bare `listen`s
keep it `asleep`, and when a query needs it again `wake` goes out in the next such window,
followed by the program and rate. A listen that carries the mote's clock (`Listen.time`) is a
heartbeat at that time: a sleeping sensor stays in the stream's progress, so its readings after
waking are never behind the watermark. One whose listens carry no time (an older mote) is
released (`PushRelease`) at its first listen asleep and holds windows again when it reports.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from firmware_sim.programs import PROGRAMS, RAW_BATCH

from fjords.schema import Schema
from proxies.actions import (
    Action,
    ProxyStats,
    PushHeartbeat,
    PushPace,
    PushRelease,
    PushRow,
    SendControl,
)
from proxies.choice import DEFAULT_SLEEP_S, ProgramChoice, choose_program
from proxies.control import (
    DEFAULT_RETRY_AFTER_S,
    Acked,
    ControlChannel,
    GiveUp,
    Pending,
    Refused,
    Send,
    Superseded,
    UnknownAck,
    describe,
    freeze,
    thaw,
)
from proxies.demand import SensorDemand, SensorView
from proxies.energy import EnergyEstimator
from proxies.layout import ProxyError, TupleLayout
from proxies.liveness import Liveness, Recent
from proxies.pair import PairJoin
from proxies.refusals import Refusals
from proxies.stall import DEFAULT_STALL_AFTER, DEFAULT_STALL_MIN_S, StallWatch
from proxies.tuples import TupleMaker, first_time, last_time
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
        wall: float | None = None,
        admit: Callable[[object, float], bool] | None = None,
        stall_after: float = DEFAULT_STALL_AFTER,
        stall_min_s: float = DEFAULT_STALL_MIN_S,
    ) -> None:
        if retry_windows < 1 or max_sends < 1 or offline_after <= 0:
            raise ValueError("retry_windows and max_sends must be >= 1, offline_after > 0")
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
        self.retry_after_s = retry_after_s  # (the channel's; kept for what_if and the catalog)
        self._wall: float | None = None  # the caller's wall clock at the current input
        self.sleep_s = sleep_s
        self.control = control  # False: never reprogram the sensor (a baseline, or read-only)
        self._paced = 0.0  # the gap last announced with PushPace
        self._every_paced = 1  # and how many readings each one stands for
        self._sampled_at: tuple[float, int] | None = None  # (rate, n) lowered for SAMPLE EVERY
        self._released = False  # asleep and released from the stream's progress
        self.stats = ProxyStats()
        self.history: Recent[tuple[float, str, str]] = Recent(history)
        self.attributes = dict(hello.attributes)
        self.role = str(hello.attributes.get("role", "")) or None
        self.capabilities = tuple(hello.programs)
        self.refusals = Refusals()
        layout = TupleLayout.of(
            hello, stream=stream, schema=schema, sensor_field=sensor_field, pair=pair
        )
        self.progress_key = layout.progress_key
        self.static = layout.static
        self.value_field = layout.value_field
        self.view = SensorView(layout.static, layout.value_field, self.kind, layout.time_field)
        # -- liveness and progress ---------------------------------------------------------
        self.liveness = Liveness(now, offline_after, wall=wall)
        self.stall = StallWatch(now, wall=wall, stall_after=stall_after, min_wall_s=stall_min_s)
        self._said_offline = False  # its last status said offline: it owes no data
        self._owed_key: tuple | None = None  # what owed_gap was last computed from
        # -- control ------------------------------------------------------------------
        self.demand = SensorDemand()
        self.choice: ProgramChoice | None = None
        self.believed = _Belief()
        self.channel = ControlChannel(
            retry_windows=retry_windows,
            max_sends=max_sends,
            retry_after_s=retry_after_s,
            stats=self.stats,
        )
        self.errors: Recent[str] = Recent(8)
        self._admit = admit
        self.tuples = TupleMaker(
            stream=stream,
            layout=layout,
            kind=self.kind,
            pair=pair,
            role=self.role,
            admit=admit,
            stats=self.stats,
            errors=self.errors,
        )
        # -- energy estimate (cost model) ----------------------------------------------
        self.battery_reported = hello.battery
        self.native_rate_hz: float | None = None
        self.energy = EnergyEstimator(
            profile, now=now, sleep_s=sleep_s, listen_ms_per_s=listen_ms_per_s
        )
        self._adopt_hello(hello, now)
        self._expect(now)

    # == inputs ============================================================================
    def on_message(self, msg: Message, now: float, *, wall: float | None = None) -> list[Action]:
        """Everything the sensor sent; returns what to push and what to send. `wall` is the
        caller's wall clock (monotonic seconds) for the control channel's retry timer; None
        (no wall clock) re-sends by receive windows alone, and judges silence on `now` alone."""
        reached = self.progress_time
        out = self._on_message(msg, now, wall)
        if wall is not None and self.progress_time > reached:
            self.liveness.timed(self.progress_time, wall)  # its own pace against the wall
        self._expect(now)
        return out

    def _on_message(self, msg: Message, now: float, wall: float | None) -> list[Action]:
        self.stats.messages += 1
        self._wall = wall
        out: list[Action] = []
        self.liveness.heard(now, first=self.stats.messages <= 1, wall=wall)  # (hello to first)
        self._said_offline = isinstance(msg, Status) and not msg.online
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
        t_first = first_time(msg)
        if t_first is not None:
            self.energy.reading(t_first, last_time(msg), now, **self._energy_state())
        if self.believed.asleep and not isinstance(msg, Listen):
            # Readings: it is awake after all (woke by itself, or missed the sleep).
            self._set_belief(now, asleep=False)
            self._reconcile(now)
        self._released = False  # its readings hold the stream's progress again
        if isinstance(msg, Samples | Events | AggregateReport) and self.stall.data(now, wall):
            self.history.append((now, "unstalled", f"{msg.kind} after a stall"))
        if isinstance(msg, Samples):
            self.tuples.on_samples(msg, out)
        elif isinstance(msg, Events):
            self.tuples.on_events(msg, out)
        elif isinstance(msg, AggregateReport):
            self.tuples.on_aggregate(msg, self.demand, out)
        elif isinstance(msg, Listen):
            if msg.time is not None:
                self._listen_heartbeat(msg.time, out)
        else:  # a Control from a sensor makes no sense
            self.tuples.bad(f"unexpected {msg.kind!r} message from a sensor")
            return out
        listen = msg.duration_ms if isinstance(msg, Listen) else msg.listen_ms
        if listen:
            self._listen_window(listen, now, out)
        return out

    def set_demand(self, demand: SensorDemand, now: float) -> list[Action]:
        """The queries changed: choose again; controls wait for the next receive window.
        Only which queries want the sensor changed (a stream-wide query added, with 200
        sensors): it must deliver the same, so the program stays without a choice."""
        old, self.demand = self.demand, demand
        if self.choice is None or not old.asks_same(demand):
            self._choose(now, "demand changed")
            self._expect(now)
        return []

    def tick(self, now: float, *, wall: float | None = None) -> list[Action]:
        """Time passes without messages: mark a silent sensor offline (given `wall`, only if
        it is silent at its own pace on the wall clock too).

        Progress is not carried forward here: an asleep sensor reports its clock on its
        listens (or is released at its first listen without one), and a silent sensor is
        released by the router's wall-clock idleness (carrying its progress forward in event
        time would make its readings late)."""
        out: list[Action] = []
        if self.online:
            limit = self.offline_after * self.expected_gap
            if self.believed.asleep:  # it listens every sleep_s (or at its readings' times)
                limit = max(limit, self.offline_after * self.sleep_s * self.energy.pace_ratio())
            if now - self.last_heard > limit:  # (the rest only then: ticks visit every proxy)
                why = self.liveness.check(now, limit, wall=wall, own_limit=self._own_limit())
                if why is not None:
                    self._went_offline(now, why)
        stall = self.stall
        if not stall.stalled and stall.gap is not None and now - stall.data_at > stall.limit():
            why = stall.check(now, wall=wall, wall_limit=self.liveness.wall_limit)
            if why is not None:
                self.history.append((now, "stalled", why))
        self._account(now)
        return out

    # == stalls ================================================================================
    def _expect(self, now: float) -> None:
        """Tell the stall watch how often data is owed now (`owed_gap`), when what it depends
        on changed (this runs on every message)."""
        b = self.believed
        key = (self.choice, b.program, b.params, b.rate_hz, b.asleep, self._said_offline)
        if key == self._owed_key:
            return
        self._owed_key = key
        if self.stall.expect(self.owed_gap(), now, self._wall):
            self.history.append((now, "unstalled", "no data is owed now"))

    def owed_gap(self) -> float | None:
        """Own seconds between the data messages the gateway can count on; None when it can
        count on none: it said it goes offline, asleep by the gateway's own acknowledged
        `sleep`, a program that may send nothing (filter, deadband, vehicle), no known rate.
        What the mote runs is taken from what the gateway asked it to run as well as from what
        it believes the mote runs (a control on its way: the longer gap of the two), never from
        an acknowledgement of a control the gateway did not send."""
        b = self.believed
        if self._said_offline or b.asleep:
            return None
        params = thaw(b.params) if b.params is not None else None
        gap = _program_gap(b.program, params, b.rate_hz)
        c = self.choice
        if gap is None or not self.control or c is None:
            return gap
        wanted = _program_gap(c.program, c.params, c.rate_hz or b.rate_hz)
        return None if wanted is None else max(gap, wanted)

    @property
    def stalled(self) -> bool:
        return self.stall.stalled

    def _listen_heartbeat(self, t: float, out: list[Action]) -> None:
        """A listen carrying the mote's clock: it has reached `t` (nothing later is dated
        before it). A time the future bound refuses is counted and ignored."""
        if not math.isfinite(t) or t <= self.progress_time:
            return
        if self._admit is not None and not self._admit(self.progress_key, t):
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
        params = thaw(b.params) if b.params else {}
        if isinstance(params, dict):
            for k in ("window_ms", "period_ms"):
                v = params.get(k)
                if isinstance(v, int | float) and not isinstance(v, bool) and v > 0:
                    gap = max(gap, v / 1000.0)
        return gap

    def _pace(self, out: list[Action]) -> None:
        g = self._declared_gap()
        every = self._every()
        if g > 0 and math.isfinite(g) and (g != self._paced or every != self._every_paced):
            self._paced, self._every_paced = g, every
            out.append(PushPace(self.stream, self.progress_key, g, every))

    def _every(self) -> int:
        """How many of its own readings each one it sends stands for: n while it runs the rate
        lowered for SAMPLE EVERY n ROWS (believed: acked), else 1."""
        rate = self.believed.rate_hz
        if self._sampled_at is None or rate is None:
            return 1
        lowered, n = self._sampled_at
        if math.isclose(rate, lowered, rel_tol=1e-9):
            return n
        if self.choice is None or self.choice.every_rows == 1:
            self._sampled_at = None  # back at a rate of its own: a later one is not lowered
        return 1

    def on_send_failed(self, control: Control, error: str, *, permanent: bool, now: float) -> None:
        """The transport could not send `control` (permanent: it never will, e.g. unencodable)."""
        self.stats.send_failures += 1
        self.errors.append(f"send {control.op}: {error}")
        for ev in self.channel.send_failed(control, error, permanent=permanent):
            if isinstance(ev, GiveUp):
                self._give_up(ev.control, now, ev.why, unanswered=ev.unanswered)
        self._expect(now)

    # == state ===============================================================================
    @property
    def expected_gap(self) -> float:
        """How long silence is normal: the longest recent gap between messages, and at least
        a raw packet's worth of sample periods (the longest a `raw` mote holds its readings)."""
        return self.liveness.expected_gap(self._min_gap())

    def _own_limit(self) -> float:
        """How long silence is normal in its own seconds (the wall clock's limit at its pace):
        `offline_after` expected gaps by its program and its timed messages; asleep, wake
        checks."""
        own = self.liveness.expected_own_gap(max(self._min_gap(), self._declared_gap()))
        if self.believed.asleep:
            own = max(own, self.sleep_s)
        return self.offline_after * own

    def _min_gap(self) -> float:
        """A raw packet's worth of sample periods (0 with no known rate)."""
        return RAW_BATCH / self.believed.rate_hz if self.believed.rate_hz else 0.0

    @property
    def online(self) -> bool:
        return self.liveness.online

    @property
    def last_heard(self) -> float:
        return self.liveness.last_heard

    @last_heard.setter
    def last_heard(self, now: float) -> None:
        self.liveness.last_heard = now

    @property
    def progress_time(self) -> float:
        """The latest time this sensor has reached (readings, windows, heartbeats)."""
        return self.tuples.progress_time

    @progress_time.setter
    def progress_time(self, t: float) -> None:
        self.tuples.progress_time = t

    @property
    def last_time(self) -> float:
        """The latest pushed sample, event or window time."""
        return self.tuples.last_time

    @property
    def listen_ms_per_s(self) -> float:
        return self.energy.listen_ms_per_s

    @property
    def energy_j(self) -> float:
        """The energy it spent since its first reading (estimated)."""
        return self.energy.energy_j

    @property
    def status(self) -> str:
        if not self.online:
            return "offline"
        if self.stall.stalled:
            return "stalled"
        if self.believed.asleep:
            return "asleep"
        return "online"

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
            self.channel.restart()  # a rebooted mote lost whatever it had not acked
        if self.choice is None:
            self._choose(now, "hello")
        else:
            self._reconcile(now)

    def _go_offline(self, now: float, why: str) -> None:
        if self.liveness.go_offline(why) is not None:
            self._went_offline(now, why)

    def _went_offline(self, now: float, why: str) -> None:
        self.stats.offline_spells += 1
        self.history.append((now, "offline", why))

    def _come_back(self, now: float, why: str) -> None:
        if self.liveness.come_back(keep_last_gap=self.believed.asleep):
            self.history.append((now, "online", why))

    # == control =============================================================================
    def what_if(self, demand: SensorDemand) -> ProgramChoice:
        """The program this sensor would get for `demand` (EXPLAIN: nothing changes)."""
        r = self.refusals
        return choose_program(
            demand,
            kind=self.kind,
            capabilities=r.usable(self.capabilities),
            role=self.role,
            current_rate_hz=self.native_rate_hz if r.rate_adjustable else self.believed.rate_hz,
            rate_adjustable=r.rate_adjustable,
            max_rate_hz=r.max_rate_hz,
            profile=self.profile,
            listen_ms_per_s=self.listen_ms_per_s,
            sleep_s=self.sleep_s,
        )

    def _choose(self, now: float, why: str) -> None:
        choice = self.what_if(self.demand)
        old = self.choice
        self.choice = choice
        if choice.every_rows > 1 and choice.rate_hz is not None:
            self._sampled_at = (choice.rate_hz, choice.every_rows)
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
        if b.program != c.program or b.params != freeze(c.params):
            out.append(Control.load_program(sid, c.program, c.params))
        if (
            self.refusals.rate_adjustable
            and c.rate_hz is not None
            and (b.rate_hz is None or not math.isclose(b.rate_hz, c.rate_hz, rel_tol=1e-9))
        ):
            out.append(Control.set_period(sid, 1000.0 / c.rate_hz))
        return out

    @property
    def pending(self) -> list[Pending]:
        """The controls on their way to the mote (the channel's)."""
        return self.channel.pending

    @property
    def windows(self) -> int:
        """Receive windows seen."""
        return self.channel.windows

    def _reconcile(self, now: float) -> None:
        """Make the pending controls those that take the mote from belief to choice."""
        for ev in self.channel.want(self._wanted_controls()):
            if isinstance(ev, Superseded):
                ops = ", ".join(str(c.op) for c in ev.controls)
                self.history.append((now, "superseded", ops))

    def _listen_window(self, listen_ms: float, now: float, out: list[Action]) -> None:
        self.stats.listen_windows += 1
        if self.refusals.cooling:
            self._end_cooldowns(now)
        self.energy.window(listen_ms, now, **self._energy_state())
        # Its receive time per second is better known now. Rate-limited on the wall clock
        # where there is one: a replay's stream time runs thousands of times faster (a fleet
        # replayed 14,400x fast opens its windows a second apart in stream time).
        self.energy.refresh(self.believed, now if self._wall is None else self._wall)
        for ev in self.channel.window(self._wall):
            if isinstance(ev, Send):
                self.history.append((now, "sent", f"{describe(ev.control)} in window {ev.window}"))
                out.append(SendControl(self.sensor_id, ev.control))
            elif isinstance(ev, GiveUp):
                self._give_up(ev.control, now, ev.why, unanswered=ev.unanswered)

    def _on_ack(self, ack: Ack, now: float) -> None:
        (ev,) = self.channel.ack(ack)
        if isinstance(ev, UnknownAck):
            return
        if isinstance(ev, Refused):
            self.history.append((now, "refused", f"{describe(ev.control)}: {ev.error}"))
            self._give_up(ev.control, now, ev.error or "refused")
            return
        assert isinstance(ev, Acked)
        control = ev.control
        self.history.append((now, "acked", f"{describe(control)} after window {ev.window}"))
        self.refusals.acked(control)
        if control.op == ControlOp.LOAD_PROGRAM:
            self._set_belief(now, program=control.program, params=freeze(dict(control.params)))
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

    def _give_up(self, control: Control, now: float, why: str, *, unanswered: bool = False) -> None:
        self.errors.append(f"{describe(control)}: {why}")
        again = self.refusals.gave_up(
            control, now, unanswered=unanswered, native_rate_hz=self.native_rate_hz
        )
        if again is not None:
            self._choose(now, again)
        elif control.op == ControlOp.WAKE:
            self._reconcile(now)  # the queries still need it: wake again (a new seq)

    def _end_cooldowns(self, now: float) -> None:
        """Programs and rates whose cooldown has passed may be asked for again."""
        done = self.refusals.cooled(now)
        if done:
            self._choose(now, f"asking again for {', '.join(done)} after no ack")

    def _set_belief(self, now: float, **changes: Any) -> None:
        self._account(now)
        for k, v in changes.items():
            setattr(self.believed, k, v)
        self.energy.believe(self.believed)

    # == energy ============================================================================
    def _energy_state(self) -> dict[str, Any]:
        """How the energy clock may run past the latest reading: asleep, freely; awake, for
        at most `offline_after` gaps of its program (observed gaps include any jump of the
        caller's clock)."""
        return {
            "asleep": self.believed.asleep,
            "cap_s": self.offline_after * self._declared_gap(),
        }

    def _account(self, now: float) -> None:
        """Charge the believed power up to `now` on the sensor's own clock."""
        self.energy.account(now, **self._energy_state())


# -- helpers ---------------------------------------------------------------------------------
def _program_gap(program: str | None, params: object, rate_hz: float | None) -> float | None:
    """Own seconds between the data messages `program` sends for sure (None: it may send
    nothing for long, or its rate is unknown): `raw` a batch of readings (params unknown: the
    firmware's largest), `aggregate` a window, `count` a period."""
    given = params if isinstance(params, dict) else None
    period = 1.0 / rate_hz if rate_hz else None
    if program == "raw":
        if period is None:
            return None
        batch = RAW_BATCH if given is None else given.get("batch", 1)
        return _positive(batch, RAW_BATCH) * period
    if program == "aggregate":
        window = _positive(given.get("window_ms") if given is not None else None, 0.0)
        return max(window / 1000.0, period or 0.0) if window else None
    if program == "count":
        ms = given.get("period_ms", 1000) if given is not None else 1000
        return _positive(ms, 1000) / 1000.0
    return None


def _positive(v: object, default: float) -> float:
    """`v` if it is a finite number > 0, else `default`."""
    if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v > 0:
        return float(v)
    return default
