"""The shared scan of one sensor stream: every query over the stream hangs off this one operator.

Proxies push each sample once into the stream's push queue. The router reads it, tracks event-time
progress per sensor (`fjords.runtime.progress`: per-sensor silence bounds in gateway time, a future bound
no one sensor's clock can move), drops late and implausible samples (counted), and routes each tuple through the predicate
index to exactly the queries whose filters it satisfies: one copy of the tuple, shared by all.
Windowed queries also get the stream's watermark, once per batch, when it moves.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Iterable
from typing import Any

from fjords.runtime.operators.base import DEFAULT_TICKETS, Operator
from fjords.runtime.predicate_index import Atom, BatchTarget, PredicateIndex, Projection, Residual
from fjords.runtime.progress import (
    INF,
    Heartbeat,
    IdleCheck,
    Pace,
    ProgressPolicy,
    ProgressTracker,
    Release,
    Watermark,
)
from fjords.runtime.queues import PushQueue

_ONLY_TUPLES = {tuple}


class _Sampler:
    """SAMPLE EVERY n ROWS of one query: each sensor's n-th, 2n-th, ... reading, counted from
    the first the query sees, before its filter (as a mote sampling n times slower would).
    Its own small index so the filter stays exact; `skipped` counts the readings left out by
    design (not a loss)."""

    __slots__ = ("counts", "every", "index", "skipped")

    def __init__(self, every: int) -> None:
        self.every = every
        self.index = PredicateIndex()
        self.counts: dict[Hashable, int] = {}
        self.skipped = 0

    def take(
        self, rows: list[tuple], sensor_index: int | None, stands_for: dict[Hashable, int]
    ) -> list[tuple]:
        """`stands_for`: sensors sampling slower for SAMPLE EVERY (`Pace.every`): each of
        their readings counts that many."""
        counts, every = self.counts, self.every
        taken = []
        for r in rows:
            s = None if sensor_index is None else r[sensor_index]
            c = counts.get(s, 0) + (stands_for.get(s, 1) if stands_for else 1)
            if c >= every:
                taken.append(r)
                c = 0
            counts[s] = c
        self.skipped += len(rows) - len(taken)
        return taken


class StreamRouter(Operator):
    kind = "stream_router"

    def __init__(
        self,
        input: PushQueue,
        time_index: int,
        sensor_index: int | None = None,
        max_lag: float = INF,
        policy: ProgressPolicy | None = None,
        on_route_error: Callable[[Hashable, Exception], None] | None = None,
        **kw: Any,
    ) -> None:
        # A large batch amortises waking each query's operators over many tuples: a query that
        # matches 1% of tuples still gets ~40 rows per wake-up.
        kw.setdefault("batch", 4096)
        super().__init__([input], [], **kw)
        self.index = PredicateIndex()
        self.progress = ProgressTracker(max_lag, policy)
        self.time_index = time_index
        self.sensor_index = sensor_index
        self._progress_targets: dict[Hashable, Callable[[object], None]] = {}
        self.deliveries = 0
        # Called with (key, exception) for a query whose filter raised while routing; without
        # a handler the first such exception propagates after the batch.
        self.on_route_error = on_route_error
        # Late tuples are too late for any window, but accepted: a consumer that asked for
        # them (`add(..., late=...)`: the archive keeps them, Spark applies its own watermark)
        # gets each one.
        self._late_targets: dict[Hashable, Callable[[tuple], None]] = {}
        self._on_late: Callable[[tuple], None] | None = None
        # PRIORITY inside the batch: fused queries run inside this transition, so the
        # scheduler cannot order them; their deliveries are handed over highest priority first
        # (deferred to the end of routing only while the priorities differ: the index then
        # collects them instead of calling them).
        self._priority: dict[Hashable, int] = {}
        self._priorities: Counter[int] = Counter()
        self._deferred: list[tuple[Hashable, BatchTarget, list[tuple]]] = []
        self._sampled: dict[Hashable, _Sampler] = {}
        self._stands_for: dict[Hashable, int] = {}  # sensor -> its Pace.every, when above 1

    @property
    def late(self) -> int:
        return self.progress.late

    def sampled_out(self, key: Hashable) -> int | None:
        """How many readings SAMPLE EVERY n ROWS left out of `key`'s (None: it does not sample)."""
        sampler = self._sampled.get(key)
        return None if sampler is None else sampler.skipped

    def sample_counts(self, key: Hashable) -> dict | None:
        """Each sensor's count toward `key`'s next SAMPLE EVERY reading (None: it does not sample)."""
        sampler = self._sampled.get(key)
        return None if sampler is None else dict(sampler.counts)

    @property
    def queries(self) -> int:
        return len(self.index) + len(self._sampled)

    def add(
        self,
        key: Hashable,
        atoms: Iterable[Atom],
        residual: Residual,
        rows: BatchTarget,
        *,
        progress: Callable[[object], None] | None = None,
        priority: int = DEFAULT_TICKETS,
        projection: Projection | None = None,
        late: Callable[[tuple], None] | None = None,
        sample_every: int | None = None,
        counted: dict | None = None,
    ) -> str:
        """Fold a query in: its filter into the index; `rows` gets the query's rows of each
        batch as one list (a queue's `put_many`, or a fused delivery: the query's work runs
        inside this transition); `progress` receives watermarks if given. Within a batch,
        queries of higher `priority` (PRIORITY tickets) get their rows first. `projection`:
        the query's fused delivery when it only picks columns (shared per batch with every
        query picking the same ones: `PredicateIndex.add`). `late`: each tuple too late for
        any window (a consumer of the whole stream, such as the archive). `sample_every`:
        the query gets each sensor's n-th readings only (`_Sampler`), its count going on from
        `counted` (a backfill's `sample_counts`)."""
        if sample_every is not None and sample_every > 1:
            sampler = self._sampled[key] = _Sampler(sample_every)
            sampler.counts.update(counted or {})
            kind = sampler.index.add(key, atoms, residual, None, rows, projection)
        else:
            kind = self.index.add(key, atoms, residual, None, rows, projection)
        self._priority[key] = priority
        self._priorities[priority] += 1
        if progress is not None:
            self._progress_targets[key] = progress
            if self.progress.watermark > -INF:
                progress(Watermark(self.progress.watermark))
        if late is not None:
            self._late_targets[key] = late
            self._on_late = _one_call(list(self._late_targets.values()))
        return kind

    def remove(self, key: Hashable) -> None:
        if self._sampled.pop(key, None) is None:
            self.index.remove(key)
        self._progress_targets.pop(key, None)
        if self._late_targets.pop(key, None) is not None:
            self._on_late = _one_call(list(self._late_targets.values()))
        self._unrank(key)

    def set_priority(self, key: Hashable, priority: int) -> None:
        """A query's (or a shared stage's) priority changed; unknown keys are ignored."""
        if key in self._priority:
            self._unrank(key)
            self._priority[key] = priority
            self._priorities[priority] += 1

    def _unrank(self, key: Hashable) -> None:
        p = self._priority.pop(key, None)
        if p is not None:
            self._priorities[p] -= 1
            if not self._priorities[p]:
                del self._priorities[p]

    def _deliver_by_priority(self) -> None:
        """The batch's deferred deliveries, highest priority first (arrival order within a
        priority). One that raises is recorded as the index records it; the rest go on."""
        pending = sorted(self._deferred, key=self._rank)
        self._deferred.clear()
        failures = self.index.failures
        for key, target, rows in pending:
            try:
                target(rows)
            except Exception as e:  # noqa: BLE001 - recorded, the query fails
                failures.setdefault(key, e)
                self.deliveries -= len(rows)

    def _rank(self, item: tuple[Hashable, BatchTarget, list[tuple]]) -> int:
        return -self._priority.get(item[0], 0)

    def transition(self) -> bool:
        """One batch: admit its tuples (late and implausible ones counted), route them through
        the index once, as a batch (each query gets one list), then move the watermark.

        Progress is tracked per run of tuples (`ProgressTracker.observe_batch`), the control
        items between runs (heartbeats, paces, releases) in their place."""
        items = self.inputs[0].get_batch(self.batch)
        if not items:
            return False
        ti, si = self.time_index, self.sensor_index
        progress = self.progress
        observe_batch = progress.observe_batch
        on_late = self._on_late
        progress.begin()
        flush = False
        marks: list[tuple[int, Hashable, int]] = []  # (rows before it, sensor, Pace.every)
        if set(map(type, items)) == _ONLY_TUPLES:
            rows = observe_batch(items, ti, si, on_late)  # type: ignore[arg-type]
        else:
            rows = []
            start = 0
            for i in [i for i, c in enumerate(map(type, items)) if c is not tuple]:
                if i > start:
                    rows += observe_batch(items[start:i], ti, si, on_late)  # type: ignore[arg-type]
                start = i + 1
                item = items[i]
                cls = item.__class__
                if cls is Heartbeat:
                    if item.time == -INF:  # type: ignore[attr-defined]
                        progress.announce(item.sensor)  # type: ignore[attr-defined]
                    else:
                        progress.observe(item.sensor, item.time)  # type: ignore[attr-defined]
                elif cls is Pace:
                    progress.pace(item.sensor, item.gap_s)  # type: ignore[attr-defined]
                    marks.append((len(rows), item.sensor, item.every))  # type: ignore[attr-defined]
                elif cls is Release:
                    if item.forget:  # type: ignore[attr-defined]
                        progress.forget(item.sensor)  # type: ignore[attr-defined]
                    else:
                        progress.release(item.sensor)  # type: ignore[attr-defined]
                elif cls is Watermark and item.time == INF:  # type: ignore[attr-defined]
                    flush = True
                elif cls is IdleCheck:
                    pass  # the advance below notices idle sensors
            if start < len(items):
                rows += observe_batch(items[start:], ti, si, on_late)  # type: ignore[arg-type]
        if rows:
            self.tuples_in += len(rows)
            defer = self._deferred if len(self._priorities) > 1 else None
            self.deliveries += self.index.route_batch(rows, defer)
            if self._sampled:
                self._route_sampled(rows, marks, defer)
            if self._deferred:
                self._deliver_by_priority()
        for _, sensor, every in marks if not rows or not self._sampled else ():
            self._mark(sensor, every)
        if self.index.failures:
            self._route_failures()
        new = progress.close() if flush else progress.advance()
        if new is not None and self._progress_targets:
            mark = Watermark(new)
            for put in list(self._progress_targets.values()):
                put(mark)
        return True

    def _mark(self, sensor: Hashable, every: int) -> None:
        if every > 1:
            self._stands_for[sensor] = every
        else:
            self._stands_for.pop(sensor, None)

    def _route_sampled(
        self, rows: list[tuple], marks: list[tuple[int, Hashable, int]], defer: list | None
    ) -> None:
        """The SAMPLE EVERY queries' readings of the batch, each sensor's `Pace.every` applied
        from where it came in the stream."""
        si = self.sensor_index
        taken: dict[Hashable, list[tuple]] = {key: [] for key in self._sampled}
        start = 0
        for at, sensor, every in [*marks, (len(rows), None, 0)]:
            if at > start:
                part = rows[start:at]
                for key, sampler in self._sampled.items():
                    taken[key] += sampler.take(part, si, self._stands_for)
            start = at
            if every:
                self._mark(sensor, every)
        for key, sampler in self._sampled.items():
            if taken[key]:
                self.deliveries += sampler.index.route_batch(taken[key], defer)
                if sampler.index.failures:
                    self.index.failures.update(sampler.index.take_failures())

    def _route_failures(self) -> None:
        failures = self.index.take_failures()
        if self.on_route_error is None:
            raise next(iter(failures.values()))
        for key, exc in failures.items():
            self.on_route_error(key, exc)

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "queries": self.queries,
            "late": self.late,
            "clock_rejects": self.progress.clock_rejects,
        }


def _one_call(targets: list[Callable[[tuple], None]]) -> Callable[[tuple], None] | None:
    """One callable for the late tuples' consumers (None: no one asked)."""
    if not targets:
        return None
    if len(targets) == 1:
        return targets[0]

    def each(t: tuple) -> None:
        for fn in targets:
            fn(t)

    return each
