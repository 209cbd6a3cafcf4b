"""The shared scan of one sensor stream: every query over the stream hangs off this one operator.

Proxies push each sample once into the stream's push queue. The router reads it, tracks event-time
progress per sensor (`fjords.progress`: per-sensor silence bounds in gateway time, a future bound
no one sensor's clock can move), drops late and implausible samples (counted), and routes each tuple through the predicate
index to exactly the queries whose filters it satisfies: one copy of the tuple, shared by all.
Windowed queries also get the stream's watermark, once per batch, when it moves.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from typing import Any

from fjords.operators.base import Operator
from fjords.predicate_index import Atom, BatchTarget, PredicateIndex, Residual
from fjords.progress import (
    INF,
    Heartbeat,
    IdleCheck,
    Pace,
    ProgressPolicy,
    ProgressTracker,
    Release,
    Watermark,
)
from fjords.queues import PushQueue


class StreamRouter(Operator):
    kind = "stream_router"

    def __init__(
        self,
        input: PushQueue,
        time_index: int,
        sensor_index: int | None = None,
        max_lag: float = INF,
        policy: ProgressPolicy | None = None,
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
        self.on_route_error: Callable[[Hashable, Exception], None] | None = None
        # Called with each late tuple: too late for any window, but accepted (the archive keeps
        # it; Spark applies its own watermark).
        self.on_late: Callable[[tuple], None] | None = None

    @property
    def late(self) -> int:
        return self.progress.late

    def add(
        self,
        key: Hashable,
        atoms: Iterable[Atom],
        residual: Residual,
        target: Callable[[tuple], None],
        progress: Callable[[object], None] | None = None,
        batch_target: BatchTarget | None = None,
    ) -> str:
        """Fold a query in: its filter into the index; `progress` receives watermarks if given.

        `batch_target`, if given, gets the query's rows of each batch as one list (a fused
        delivery: the query's work runs inside this transition); else `target` per row."""
        kind = self.index.add(key, atoms, residual, target, batch_target)
        if progress is not None:
            self._progress_targets[key] = progress
            if self.progress.watermark > -INF:
                progress(Watermark(self.progress.watermark))
        return kind

    def remove(self, key: Hashable) -> None:
        self.index.remove(key)
        self._progress_targets.pop(key, None)

    def transition(self) -> bool:
        """One batch: admit its tuples (late and implausible ones counted), route them through
        the index once, as a batch (each query gets one list), then move the watermark."""
        items = self.inputs[0].get_batch(self.batch)  # type: ignore[attr-defined]
        if not items:
            return False
        ti, si = self.time_index, self.sensor_index
        progress = self.progress
        observe = progress.observe
        on_late = self.on_late
        progress.begin()
        wm = progress.watermark
        rows: list[tuple] = []
        admit = rows.append
        flush = False
        for item in items:
            cls = item.__class__
            if cls is tuple:
                ts = item[ti]  # type: ignore[index]
                if ts < wm:
                    progress.late += 1
                    if on_late is not None:
                        on_late(item)  # type: ignore[arg-type]
                    continue
                if observe(None if si is None else item[si], ts):  # type: ignore[index]
                    admit(item)  # type: ignore[arg-type]
                # else: dated implausibly far ahead, counted for its sensor
            elif cls is Heartbeat:
                if item.time == -INF:  # type: ignore[attr-defined]
                    progress.announce(item.sensor)  # type: ignore[attr-defined]
                else:
                    observe(item.sensor, item.time)  # type: ignore[attr-defined]
            elif cls is Pace:
                progress.pace(item.sensor, item.gap_s)  # type: ignore[attr-defined]
            elif cls is Release:
                if item.forget:  # type: ignore[attr-defined]
                    progress.forget(item.sensor)  # type: ignore[attr-defined]
                else:
                    progress.release(item.sensor)  # type: ignore[attr-defined]
            elif cls is Watermark and item.time == INF:  # type: ignore[attr-defined]
                flush = True
            elif cls is IdleCheck:
                pass  # the advance below notices idle sensors
        if rows:
            self.tuples_in += len(rows)
            self.deliveries += self.index.route_batch(rows)
        if self.index.failures:
            self._route_failures()
        new = progress.close() if flush else progress.advance()
        if new is not None and self._progress_targets:
            mark = Watermark(new)
            for put in list(self._progress_targets.values()):
                put(mark)
        return True

    def _route_failures(self) -> None:
        failures = self.index.take_failures()
        if self.on_route_error is None:
            raise next(iter(failures.values()))
        for key, exc in failures.items():
            self.on_route_error(key, exc)

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "queries": len(self.index),
            "late": self.late,
            "clock_rejects": self.progress.clock_rejects,
        }
