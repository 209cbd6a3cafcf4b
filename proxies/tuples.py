"""Turning a sensor's messages into tuples of its stream, at most once (sans-IO).

- Every reading becomes one tuple of the sensor's stream (static attributes filled in from a
  template), at most once: samples, vehicles and windows at or before the latest already pushed
  time are dropped and counted as duplicates (seen before) or out of order.
- A pushed-down window (`aggregate` or `count`) becomes ONE tuple at time = window start with a
  `fjords.partial.Partial` in the value field, then a heartbeat at its end.
- A loop pair's motes running raw: the vehicles are detected here, as the `vehicle` program
  would, and joined by the pair (`proxies.pair`).
- A reading dated implausibly far ahead (`admit(progress_key, t)`, the caller's future bound)
  is dropped and counted (`clock_rejects`) before it can make the sensor's later readings look
  out of order.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Iterable
from typing import Any

from firmware_sim.programs import Program, make_program
from firmware_sim.records import VehicleEvent

from fjords.errors import SchemaError
from fjords.partial import Partial
from fjords.schema import convert
from proxies.actions import Action, ProxyStats, PushHeartbeat, PushRow
from proxies.demand import SensorDemand
from proxies.layout import TupleLayout
from proxies.pair import PairJoin
from sensors.protocol import AggregateReport, Events, Message, Samples

__all__ = ["TupleMaker", "first_time", "last_time"]

_RECENT = 256  # sample times remembered to tell duplicates from reordered samples


class TupleMaker:
    """One sensor's messages -> PushRow/PushHeartbeat actions (see the module docstring)."""

    def __init__(
        self,
        *,
        stream: str,
        layout: TupleLayout,
        kind: str,
        pair: PairJoin | None,
        role: str | None,
        admit: Callable[[object, float], bool] | None,
        stats: ProxyStats,
        errors: Any,
    ) -> None:
        self.stream = stream
        self.progress_key = layout.progress_key
        self.kind = kind
        self._template = layout.template
        self._time_i = layout.time_i
        self._value_slots = layout.value_slots  # (row position, tuple index, type)
        self._value_i = layout.value_i
        self.pair = pair
        self.role = role
        self.stats = stats
        self.errors = errors
        # Whether a reading's time is plausible (`admit(progress_key, t)`); None: all are.
        self._admit = admit
        self._detector: Program | None = None  # pair on raw: the gateway detects vehicles
        self.last_time = -math.inf  # latest pushed sample/event/window time
        # The last _RECENT pushed times, a ring: an array, whose numbers the garbage collector
        # does not visit (a set and a deque of floats per sensor would be most of what its full
        # passes visit in a running gateway). Pushed times only grow: a repeat is recent or
        # older.
        self._recent = array("d")
        self._recent_at = 0  # where the next time goes once the ring is full
        self.progress_time = -math.inf  # latest time this sensor has reached (for heartbeats)

    def fresh(self, t: float) -> bool:
        """Whether a reading at `t` is new; counts duplicates and reordered ones."""
        if self._admit is not None and not self._admit(self.progress_key, t):
            self.stats.clock_rejects += 1
            return False
        last = self.last_time
        # (A pushed window's end is `last_time` too, but not a pushed reading: the next starts there.)
        if t > last or (t == last and t not in self._recent):
            self.last_time = t
            recent = self._recent  # inline `_remember`: this runs once per reading
            if len(recent) < _RECENT:
                recent.append(t)
            else:
                at = self._recent_at
                recent[at] = t
                self._recent_at = at + 1 if at + 1 < _RECENT else 0
            return True
        if t in self._recent:
            self.stats.duplicates += 1
        else:
            self.stats.out_of_order += 1
        return False

    def _remember(self, t: float) -> None:
        recent = self._recent
        if len(recent) < _RECENT:
            recent.append(t)
        else:
            at = self._recent_at
            recent[at] = t
            self._recent_at = at + 1 if at + 1 < _RECENT else 0

    def _have_window(self, start: float, end: float) -> bool:
        """Whether a partial [start, end] holds nothing new (a retransmission). A window
        ending where this sensor is, or before, we have; but a zero-length one at that end
        (what the old program held when a load_program came right after a window's first
        reading) holds a reading the window before it (end exclusive) did not."""
        last = self.last_time
        if end != last:
            return end < last
        return start < end or end in self._recent

    def on_samples(self, msg: Samples, out: list[Action]) -> None:
        if self.kind == "pair":
            self._pair_samples(msg, out)
            return
        slots, tmpl, ti, stream = self._value_slots, self._template, self._time_i, self.stream
        for t, values in zip(msg.times, msg.rows, strict=True):
            if not isinstance(t, int | float) or isinstance(t, bool) or not math.isfinite(t):
                self.bad(f"sample time {t!r} is not a finite number")
                continue
            if len(values) != len(slots):
                self.bad(f"sample row of {len(values)} values; the hello announced {len(slots)}")
                continue
            if not self.fresh(t):
                continue
            row = list(tmpl)
            row[ti] = t
            try:
                for j, i, typ in slots:
                    v = values[j]
                    row[i] = v if v.__class__ is float and typ == "float" else convert(v, typ)
            except SchemaError as exc:
                self.bad(str(exc))
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
            if not values or not self.fresh(t):
                continue
            v = values[0]
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                self.bad(f"light reading {v!r} is not a finite number")
                continue
            for rec in self._detector.feed(t, float(v)):
                if isinstance(rec, VehicleEvent):
                    self._push_rows(self.pair.event(rec.role, rec.t_on, rec.t_off), out)
            self._push_rows(self.pair.advance(self.role or "upstream", t), out)
        self._pair_heartbeat(out)

    def on_events(self, msg: Events, out: list[Action]) -> None:
        if self.pair is None:
            self.bad("events from a sensor that is not part of a loop pair")
            return
        role = msg.name
        if role not in ("upstream", "downstream"):
            self.bad(f"events named {role!r}; expected upstream or downstream")
            return
        latest = -math.inf
        for times in msg.times:
            if len(times) != 2 or not all(math.isfinite(x) for x in times) or times[1] < times[0]:
                self.bad(f"vehicle event {times!r} is not (on, off) with on <= off")
                continue
            if not self.fresh(times[0]):
                continue
            self._push_rows(self.pair.event(role, times[0], times[1]), out)
            latest = max(latest, times[1])
        if latest > -math.inf:
            self._push_rows(self.pair.advance(role, latest), out)
            self._pair_heartbeat(out)

    def on_aggregate(self, msg: AggregateReport, demand: SensorDemand, out: list[Action]) -> None:
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
            self.bad(f"aggregate values {dict(values)!r} are not count[, sum, min, max]")
            return
        if self.kind == "pair":
            assert self.pair is not None
            if partial.sum is not None:
                self.bad("a pair mote sent value aggregates")
                return
            self.pair.counts(self.role or "upstream")
            if self.role == "downstream":
                self.stats.redundant += 1
                return
            allowed = demand.needs == "counts"
        else:
            allowed = partial.sum is not None and demand.window_s is not None
        if not allowed:
            # The mote still runs a program no query allows any more (it is being switched).
            self.stats.stale_partials += 1
            return
        w = demand.window_s
        if self.kind == "scalar" and w is not None:
            if end - start > w + 1e-6:
                self.stats.stale_partials += 1
                return
            if abs(start / w - round(start / w)) > 1e-6:
                self.stats.misaligned_windows += 1
        if self._admit is not None and not self._admit(self.progress_key, end):
            self.stats.clock_rejects += 1
            return
        if self._have_window(start, end):
            self.stats.duplicates += 1  # a window we already have (a retransmission)
            return
        if start == end:
            self._remember(end)
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

    def bad(self, why: str) -> None:
        self.stats.bad += 1
        self.errors.append(why)


def first_time(msg: Message) -> float | None:
    """The earliest time a reading message carries (None for listen, hello...)."""
    t: float | None = None
    if isinstance(msg, Samples) and msg.times:
        t = min(msg.times)
    elif isinstance(msg, Events) and msg.times:
        t = min((x[0] for x in msg.times if x), default=None)
    elif isinstance(msg, AggregateReport):
        t = msg.start
    return t if t is not None and math.isfinite(t) else None


def last_time(msg: Message) -> float:
    """The latest time a reading message carries (-inf for none)."""
    if isinstance(msg, Samples) and msg.times:
        return max(msg.times)
    if isinstance(msg, Events) and msg.times:
        return max((x[-1] for x in msg.times if x), default=-math.inf)
    if isinstance(msg, AggregateReport):
        return msg.end
    return -math.inf
