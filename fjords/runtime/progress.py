"""Event-time progress: watermarks, heartbeats, and the per-sensor tracker that makes them.

Windows close when the stream's watermark passes their end. The rules, and why:

**Each sensor holds the watermark at its own latest time.** The watermark is the minimum, over
the sensors that are *active*, of the latest sample (or heartbeat) time each has reached. A sensor
that said hello but has sent nothing yet holds it at -inf. A sensor is never released because
another raced ahead in event time: a fast replay, or motes draining their backlogs at different
speeds, would otherwise make the slower ones late (a stream-wide `max_lag` alone would).

**A sensor that went quiet is released by wall-clock idleness** (Flink's `withIdleness`): no
sample or heartbeat for its silence bound of *gateway* time (an injectable monotonic clock)
makes it idle; it stops holding the watermark until it speaks again, and its samples behind
the watermark are then late (counted). The silence bound fits the sensor's own period:

    bound = max(idle_timeout_s, idle_gaps x expected message gap)

where the expected gap is the longest of the recent gaps between its arrivals (wall clock) and,
until two arrivals were seen, the gap its proxy declared (`Pace`: hello period x readings per
packet, updated on SET_PERIOD acks). A sensor that never sent a sample is bounded by
`idle_timeout_s` alone, so a hello with no data holds windows back at most that long. When
every sensor is idle the watermark moves to the latest time any of them reached (what came
is complete), but never past the latest time of a sensor released asleep (`Release`): it
sends again from where it fell asleep when woken, and those readings must not be late.
`max_lag` (event seconds, off by default) is an optional hard cap on how far behind the
fastest sensor one may hold the stream.

**A sleeping sensor's clock stays known.** A mote asleep announces its clock on its listen
windows (a heartbeat, `Listen.time` in the protocol): it is an active sensor like any other
and holds the watermark at that time. Only a sleeper that cannot say its time (an older mote)
is released, and it then bounds the all-idle jump as above.

**One sensor's clock cannot poison progress.** A sample at `t` is rejected only when it is
more than `max_future_s` ahead of the gateway's wall clock AND of the stream's progress:

    t > max(wall_now, reference, own_latest) + allowance + max_future_s

- `wall_now`: the gateway's wall clock. Sensors with synchronised clocks, and every replay of
  the past, however fast, are never rejected; nor is the first packet of a simulation
  running ahead of the wall clock (it is within one message gap of it).
- `reference`: the stream's progress as the *other* sensors attest it: the highest time
  claimed (accepted or not) by any sensor but this one. A sensor's own outlier never raises
  its own bound (it raises only the others' bounds; they are honest or checked against the
  rest in turn). It admits an honest replay or simulation running ahead of the wall clock
  however fast, and a sensor catching up with its peers after an outage.
- `allowance`: the per-stream skew estimate, how far an honest sensor may move in one
  message: the largest of its declared gap (`Pace`), its last accepted step, and the
  largest accepted per-sensor step of the stream so far; each capped at `max_step_s`.
- `own_latest`: the sensor's own accepted latest: a sensor advancing message by message
  stays admitted even when it is the only one (a one-sensor stream).

A rejected sample is dropped, counted for its sensor (`clock_rejects`) and is no sign of life
(a sensor sending only those goes idle). A sensor whose latest sample (accepted or not) is
more than `max_future_s` from the wall clock AND from its peers (the median of all sensors'
latest, beyond max_future_s plus 5 median absolute deviations) is flagged `clock_suspect` with its
offset, and so is one whose latest sample was rejected; a replay whose sensors agree is not.
The watermark is a minimum over accepted progress and the stream's `max_time` counts
accepted samples only, so one sensor's clock never moves the stream's progress.

Limitations: in a stream dated well ahead of the wall clock (a trace of the future), a
sensor's first reading, or one after a silence longer than the allowance while every peer was
silent too (e.g. readings filtered at the mote), can be rejected until a peer claims that time. A reading far ahead of a replay of the past but not of the wall clock
is accepted (it cannot be told from a sensor catching up); it never moves the watermark.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from operator import itemgetter, sub
from typing import Any

INF = float("inf")
# A sensor's latest time before its first sample: this very object (a time of -inf never passes
# `t > latest`, so `latest is _UNSEEN` tells an unset latest without a float comparison).
_UNSEEN = -INF


@dataclass(frozen=True, slots=True)
class Watermark:
    """In-band progress: no later item carries a sample time below `time`."""

    time: float


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """A proxy's word that `sensor` has reached `time` though it sent no sample."""

    sensor: object
    time: float


@dataclass(frozen=True, slots=True)
class Pace:
    """A proxy's word on how often `sensor` sends: about every `gap_s` seconds (its period
    times the readings per packet). Fits the sensor's silence bound until arrivals are seen."""

    sensor: object
    gap_s: float
    # Each reading it sends stands for this many at its own rate: it samples that much slower
    # for SAMPLE EVERY n ROWS (the router's per-query count goes on in the readings it stands for).
    every: int = 1


@dataclass(frozen=True, slots=True)
class Release:
    """`sensor` will send nothing for a while (asleep) or is gone for good (`forget`)."""

    sensor: object
    forget: bool = False


@dataclass(frozen=True, slots=True)
class IdleCheck:
    """Wakes the router so idleness is noticed when no data flows."""


IDLE_CHECK = IdleCheck()


@dataclass(frozen=True, slots=True)
class ProgressPolicy:
    """The progress settings of a stream (see the module docstring)."""

    idle_timeout_s: float = 30.0
    idle_gaps: float = 3.0
    max_future_s: float = 300.0
    max_step_s: float = 86_400.0
    max_lag: float = INF
    clock: Callable[[], float] = time.monotonic  # gateway time, for idleness
    wall_clock: Callable[[], float] = time.time  # epoch seconds, for the future bound


class _Sensor:
    __slots__ = (
        "latest",
        "seen",
        "gap",
        "declared",
        "idle",
        "step",
        "claimed",
        "rejects",
        "samples",
        "last_claim",
        "rejected_last",
        "asleep",
    )

    def __init__(self, now: float) -> None:
        self.latest = _UNSEEN  # accepted event time reached
        self.seen = now  # gateway time of the last arrival (or of being announced)
        self.gap = 0.0  # longest recent gap between arrivals (gateway time), decaying
        self.declared = 0.0  # the proxy's Pace
        self.idle = False
        self.step = 0.0  # last accepted event-time step
        self.claimed = -INF  # latest time claimed, accepted or not
        self.rejects = 0
        self.samples = 0
        self.last_claim = -INF  # the time of its most recent sample, accepted or not
        self.rejected_last = False
        self.asleep = False  # released asleep: bounds the all-idle jump until it reports


# Fewer sensors per round cost more per run than the row loop does per row.
_MIN_ROUND = 16


def _field_list(i: int) -> Callable[[list[tuple]], list]:
    """Field `i` of every row, as a list."""
    get = itemgetter(i)
    return lambda rows: list(map(get, rows))


def _rounds(keys: list, times: list[float], n_sensors: int) -> tuple[list, set, set, int] | None:
    """A batch sampled in rounds (a synchronously polled fleet, a replay of METR-LA), else
    None: in time order, each distinct time a run holding a sensor at most once, every run
    but the first and the last holding each of the batch's `n_sensors` sensors (the batch
    may cut a round at either end), at least one such full run. Returns the runs' times,
    the sensors of the first and of the last run, and the first run's length: each sensor
    then steps from run to run and is counted by run, and `observe_batch` needs no Python
    step per row (property-tested equal to its loop)."""
    n = len(times)
    if n < n_sensors + 2 or n_sensors < _MIN_ROUND:
        return None
    t = times[0]
    j = 1
    while j < n and times[j] == t:  # the first run: at most a round
        j += 1
        if j > n_sensors:
            return None
    runs: list = []
    sets: list[set] = []
    i = 0
    while True:
        ks = set(keys[i:j])
        if len(ks) != j - i or times[i:j].count(t) != j - i:
            return None  # a sensor twice at one time, or not in time order
        runs.append(t)
        sets.append(ks)
        if j == n:
            break
        i, t = j, times[j]
        if not t > runs[-1]:
            return None  # not in time order
        j = min(i + n_sensors, n)  # a full round inside, any part of one at the end
    if len(runs) < 3:
        return None
    return runs, sets[0], sets[-1], len(sets[0])


class ProgressTracker:
    """Per-sensor progress -> the stream's watermark (see the module docstring)."""

    def __init__(self, max_lag: float = INF, policy: ProgressPolicy | None = None) -> None:
        if policy is None:
            policy = ProgressPolicy(max_lag=max_lag)
        self.policy = policy
        self.max_lag = policy.max_lag
        self.sensors: dict[object, _Sensor] = {}
        self.watermark = -INF
        self.max_time = -INF
        self.late = 0
        self.clock_rejects = 0
        self.idle_releases = 0
        self._top1: tuple[float, object] = (-INF, None)  # (highest claim, its sensor)
        self._top2 = -INF  # second-highest claim of another sensor: the reference
        self._now = policy.clock()
        self._wall = policy.wall_clock()
        self._admit_below = self._wall + policy.max_future_s
        self.skew = 0.0  # the largest accepted per-sensor step (capped): the stream's skew
        self._peers_cache: tuple[float, tuple[float, float] | None] | None = None

    # -- compatibility: sensor -> latest --------------------------------------------------
    @property
    def latest(self) -> dict[object, float]:
        return {k: s.latest for k, s in self.sensors.items()}

    # -- input ------------------------------------------------------------------------------
    def begin(self) -> float:
        """Read the clocks once per batch; returns the time below which every sample is
        admitted without a per-sensor check."""
        p = self.policy
        self._now = p.clock()
        self._wall = p.wall_clock()
        self._admit_below = max(self._wall, self._top2) + p.max_future_s
        return self._admit_below

    def observe(self, sensor: object, time: float) -> bool:
        """A sample (or heartbeat) of `sensor` at `time`; False if rejected as implausible.
        A rejected sample is not a sign of life: a sensor sending only those goes idle."""
        s = self.sensors.get(sensor)
        now = self._now
        if s is None:
            s = self.sensors[sensor] = _Sensor(now)
            if time > self._admit_below:
                s.idle = True  # not holding anyone back before it is admitted once
        s.last_claim = time
        if time > self._admit_below and not self._admissible(s, time):
            s.rejects += 1
            s.rejected_last = True
            self.clock_rejects += 1
            if time > s.claimed:
                self._claim(sensor, s, time)
            return False
        s.rejected_last = False
        if s.seen != now:
            g = now - s.seen
            s.gap = g if g > s.gap else s.gap * 0.9 + g * 0.1
            s.seen = now
        if s.idle:
            s.idle = False
            s.asleep = False
        if time > s.claimed:
            self._claim(sensor, s, time)
        if time > s.latest:
            if s.latest > -INF:
                step = time - s.latest
                s.step = step if step < self.policy.max_step_s else self.policy.max_step_s
                if s.step > self.skew:
                    self.skew = s.step
            s.latest = time
            if time > self.max_time:
                self.max_time = time
        s.samples += 1
        return True

    def observe_batch(
        self,
        rows: list[tuple],
        time_index: int,
        sensor_index: int | None,
        on_late: Callable[[tuple], None] | None = None,
    ) -> list[tuple]:
        """A run of samples, in arrival order; returns the ones admitted.

        Exactly as if, for each row in order, a row dated behind the watermark were counted
        late (`on_late(row)`) and every other one passed to `observe(sensor, time)`: the same
        watermark, late and reject counts and per-sensor state. Why: per reading, `observe`
        was a quarter of a Query 1 run. When no row can be rejected (all dated at or below
        the admission bound of `begin`, the common case), the per-sensor bookkeeping is done
        once per sensor and batch; only the event-time steps need a pass over the rows, and
        not even that for a batch sampled in rounds (`_rounds`)."""
        if not rows:
            return rows
        times = list(map(itemgetter(time_index), rows))
        get_key = (
            (lambda rs: [None] * len(rs)) if sensor_index is None else _field_list(sensor_index)
        )
        keys = get_key(rows)
        present = set(keys)
        # Sampled in rounds (in time order, no NaN): the ends are the extremes.
        rounds = _rounds(keys, times, len(present))
        wm = self.watermark
        lo = times[0] if rounds is not None else min(times)
        if lo != lo or lo < wm:  # NaN first (min cannot tell), or some rows are late
            kept: list[tuple] = []
            kept_times: list[float] = []
            for r, t in zip(rows, times, strict=True):
                if t < wm:
                    self.late += 1
                    if on_late is not None:
                        on_late(r)
                else:
                    kept.append(r)
                    kept_times.append(t)
            rows, times = kept, kept_times
            if not rows:
                return rows
            keys = get_key(rows)
            present = set(keys)
            rounds = None
        hi = times[-1] if rounds is not None else max(times)
        if hi != hi or hi > self._admit_below:  # NaN first (max cannot tell); or a row may be
            return self._observe_each(rows, times, sensor_index)  # implausible: in order
        sensors = self.sensors
        counts: dict[object, int]
        if rounds is None:
            counts = Counter(keys)  # first-seen order, each sensor's samples
        else:  # the same from the rounds: once in each run inside, maybe in the first and last
            runs, first_run, last_run, f = rounds
            inside = len(runs) - 2
            order = keys[:f] + [k for k in keys[f : f + len(present)] if k not in first_run]
            counts = {k: inside + (k in first_run) + (k in last_run) for k in order}
        top, who = self._top1
        if who is not None and who in present:
            w = sensors.get(who)
            if w is None or w.claimed != top:  # the top's holder was forgotten, and is back:
                return self._observe_each(rows, times, sensor_index)  # see _claim
        now = self._now
        for k in counts:
            if k not in sensors:
                sensors[k] = _Sensor(now)
        # The order-dependent part: each sensor's event-time steps (its latest, its last step,
        # the stream's largest step) and the time of its last sample (one store per row is
        # cheaper than a dict of the batch's last times).
        skew = self.skew
        if rounds is not None and all(
            sensors[k].latest < (rounds[0][0] if k in rounds[1] else rounds[0][1]) for k in counts
        ):
            # Sampled in rounds: each sensor steps from run to run (no loop over the rows).
            gap = max(map(sub, runs[1:], runs[:-1]))
            if gap > skew:
                skew = gap
            for k in counts:
                s = sensors[k]
                lt = s.latest
                first = runs[0] if k in first_run else runs[1]
                if lt is not _UNSEEN and first - lt > skew:  # its step into the batch
                    skew = first - lt
                if k in last_run:
                    end, before = runs[-1], runs[-2]
                else:
                    end, before = runs[-2], runs[-3]
                    if len(runs) == 3 and k not in first_run:  # one run: its only step
                        before = lt
                s.last_claim = s.latest = end
                if before is not _UNSEEN:
                    s.step = end - before
        else:
            for k, t in zip(keys, times, strict=False):  # (same length)
                s = sensors[k]
                s.last_claim = t
                lt = s.latest
                if t > lt:
                    if lt is not _UNSEEN:  # (as `lt > -INF`, without an int-float comparison)
                        st = t - lt
                        s.step = st
                        if st > skew:
                            skew = st
                    s.latest = t
        cap = self.policy.max_step_s
        if skew > self.skew:
            self.skew = skew if skew < cap else cap
        pending = []
        for k, n in counts.items():
            s = sensors[k]
            s.rejected_last = False
            if s.seen != now:
                g = now - s.seen
                s.gap = g if g > s.gap else s.gap * 0.9 + g * 0.1
                s.seen = now
            if s.idle:
                s.idle = False
                s.asleep = False
            if s.step > cap:
                s.step = cap
            s.samples += n
            if s.latest > s.claimed:  # its highest time in the batch is a new claim
                pending.append((k, s))
        if pending:
            # Claims commute but for who holds the top: the first claim of the batch's highest
            # claim, if it is a new top (see _claim; a holder forgotten that does not claim
            # here acts as one that still holds the top).
            m = max(s.latest for _, s in pending)
            if m > top:
                firsts = {k for k, s in pending if s.latest == m}
                i = times.index(m)
                while keys[i] not in firsts:  # a row at m of a sensor that claimed more before
                    i = times.index(m, i + 1)
                w = keys[i]
                self._claim(w, sensors[w], m)
            for k, s in pending:
                if s.latest > s.claimed:
                    self._claim(k, s, s.latest)
        if hi > self.max_time:
            self.max_time = hi
        return rows

    def _observe_each(
        self, rows: list[tuple], times: list[float], sensor_index: int | None
    ) -> list[tuple]:
        observe = self.observe
        if sensor_index is None:
            return [r for r, t in zip(rows, times, strict=True) if observe(None, t)]
        return [r for r, t in zip(rows, times, strict=True) if observe(r[sensor_index], t)]

    def plausible(self, sensor: object, time: float) -> bool:
        """Whether `observe` would admit `time` now (nothing is recorded)."""
        if time <= self._admit_below:
            return True
        s = self.sensors.get(sensor)
        return self._admissible(s if s is not None else _Sensor(self._now), time)

    def _admissible(self, s: _Sensor, t: float) -> bool:
        step = max(s.declared, s.step, self.skew)
        top, who = self._top1
        peers = self._top2 if who is None or self.sensors.get(who) is s else top
        return t <= max(peers, s.latest, self._wall) + step + self.policy.max_future_s

    def _claim(self, sensor: object, s: _Sensor, t: float) -> None:
        s.claimed = t
        top, who = self._top1
        if who == sensor or who is None:
            self._top1 = (t, sensor)
        elif t > top:
            self._top2 = top
            self._top1 = (t, sensor)
        elif t > self._top2:
            self._top2 = t

    def announce(self, sensor: object) -> None:
        """A sensor that said hello: it holds the watermark (at -inf) until it reports, or at
        most `idle_timeout_s` if it never does."""
        if sensor not in self.sensors:
            self.sensors[sensor] = _Sensor(self._now)

    def pace(self, sensor: object, gap_s: float) -> None:
        s = self.sensors.get(sensor)
        if s is None:
            s = self.sensors[sensor] = _Sensor(self._now)
        if math.isfinite(gap_s) and gap_s > 0:
            s.declared = gap_s

    def release(self, sensor: object) -> None:
        """The sensor sends nothing for a while (asleep, and it cannot tell its clock): it stops
        holding the watermark, except that it bounds the jump when every sensor is idle."""
        s = self.sensors.get(sensor)
        if s is not None:
            s.asleep = True
            if not s.idle:
                s.idle = True
                self.idle_releases += 1

    def forget(self, sensor: object) -> None:
        """A sensor removed for good (not merely offline) stops holding progress back."""
        self.sensors.pop(sensor, None)

    # -- the watermark ------------------------------------------------------------------------
    def silence_bound(self, s: _Sensor) -> float:
        p = self.policy
        if s.latest == -INF:
            return p.idle_timeout_s  # announced, never reported
        expected = s.gap if s.samples > 2 and s.gap > 0 else max(s.declared, s.gap)
        return max(p.idle_timeout_s, p.idle_gaps * expected)

    def advance(self) -> float | None:
        """Recompute the watermark; return it if it moved forward, else None."""
        if not self.sensors:
            return None
        now = self._now
        wm = INF
        top = -INF
        sleeper = INF  # the earliest latest time of a sensor released asleep
        floor_s = self.policy.idle_timeout_s  # every silence bound is at least this
        never_idle = floor_s == INF  # every silence bound is infinite
        for s in self.sensors.values():
            if s.latest > top:
                top = s.latest
            if s.idle:
                if s.asleep and -INF < s.latest < sleeper:
                    sleeper = s.latest
                continue
            # (the bound itself only for a sensor silent longer than the least bound: this
            # runs for every sensor at every router batch)
            silent = now - s.seen
            if not never_idle and silent > floor_s and silent > self.silence_bound(s):
                s.idle = True
                self.idle_releases += 1
                continue
            if s.latest < wm:
                wm = s.latest
        if wm == INF:  # every sensor idle: what came is complete, up to where a sleeper was
            wm = min(top, sleeper)
        floor = self.max_time - self.max_lag
        if wm < floor:
            wm = floor
        if wm > self.watermark:
            self.watermark = wm
            return wm
        return None

    def holding(self) -> bool:
        """Whether a sensor holds the watermark now: a stream with no sensors, or only idle
        ones, holds nothing back (a UNION ALL does not wait for it)."""
        return any(not s.idle for s in self.sensors.values())

    def close(self) -> float:
        """End of input: everything is complete."""
        self.watermark = INF
        return INF

    # -- what /sensors shows ------------------------------------------------------------------
    def _peer_stats(self) -> tuple[float, float] | None:
        """The median of the sensors' latest claims and their median absolute deviation,
        recomputed at most once a second (a catalog of 10,000 asks for every sensor)."""
        now = self.policy.clock()
        cached = self._peers_cache
        if cached is not None and now - cached[0] < 1.0:
            return cached[1]
        claims = [x.last_claim for x in self.sensors.values() if x.last_claim > -INF]
        stats = None
        if len(claims) > 1:
            import statistics  # only /sensors asks: not worth every start's import

            med = statistics.median(claims)
            stats = (med, statistics.median(abs(x - med) for x in claims))
        self._peers_cache = (now, stats)
        return stats

    def clock_report(self, sensor: object) -> dict[str, Any]:
        """`clock_rejects`, `clock_suspect` and `clock_offset_s` (vs the wall clock, and vs
        the peers' median when it has peers) for one sensor."""
        s = self.sensors.get(sensor)
        if s is None or s.last_claim == -INF:
            return {"clock_rejects": 0 if s is None else s.rejects, "clock_suspect": False}
        wall = self.policy.wall_clock()
        f = self.policy.max_future_s
        off_wall = s.last_claim - wall
        out: dict[str, Any] = {"clock_rejects": s.rejects, "clock_offset_s": off_wall}
        suspect = abs(off_wall) > f
        peers = self._peer_stats()
        if peers is not None and suspect:
            med, spread = peers
            off_peers = s.last_claim - med
            out["clock_offset_peers_s"] = off_peers
            suspect = abs(off_peers) > f + 5 * spread + max(s.declared, s.step)
        out["clock_suspect"] = bool(suspect or s.rejected_last)
        return out
