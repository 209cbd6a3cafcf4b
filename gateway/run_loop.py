"""How the daemon's Fjord is built from `[runtime]` and shares the event loop with the
transports and the HTTP clients: its scheduler and progress policy, router slices, gathering
input, and yielding to result clients (`RunLoop`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from fjords.engine import Engine
from fjords.limits import Limits
from fjords.runtime.fjord import Fjord
from fjords.runtime.progress import INF, ProgressPolicy
from fjords.runtime.scheduler import DEFAULT_SCHEDULER, LoopSharing, make_scheduler
from gateway.config import Config


@dataclass(frozen=True)
class RunLoop:
    """How the Fjord shares the event loop with the transports and the HTTP clients
    (`[runtime]` keys of the same names).

    - `router_slice_rows`: samples a stream router takes per transition, so a burst's first
      rows are published (and, with `yield_for_results`, written) before its last samples are
      routed; larger amortises more per-batch work per sample. Behind by more, a router takes
      a quarter of what waits (at most 4,096), so the Fjord catches up in a few event-loop
      turns however many other tasks share them.
    - `gather_rows`, `gather_ms`: woken by new samples, the scheduler first gives the event loop
      turns while more keep arriving (up to this many rows, this long): a transport that hands
      over one message per turn (MQTT) then still fills router batches when the gateway is
      busy. Off by default (`gather_ms = 0`): over MQTT it did not change batch sizes in
      benchmarks/gateway_load.py, and with an in-process fleet each gathered turn runs every
      mote, halving the Fjord's share of the loop.
    - `yield_for_results`: end a scheduler slice as soon as rows wait for live clients, while
      fewer than `yield_backlog_rows` samples wait in the streams (a burst); behind by more,
      the Fjord keeps its whole slice (yielding after every slice would let it fall further
      behind when many tasks share the loop, e.g. an in-process fleet: latency is then the
      backlog, and only throughput reduces it).
    - `gc_freeze`, `gc_quiet_s`: the objects alive once the daemon has started, and again
      `gc_quiet_s` after the query set or the sensor catalog last changed (and every 500
      changes during a burst of them), are frozen out of the garbage collector's full passes
      (`gateway.gc_freeze`): with 1,000 queries each pass pauses the loop for 130-200 ms.
    """

    router_slice_rows: int = 256
    gather_rows: int = 256
    gather_ms: float = 0.0
    yield_for_results: bool = True
    yield_backlog_rows: int = 2048
    gc_freeze: bool = True
    gc_quiet_s: float = 5.0

    @classmethod
    def from_config(cls, config: Config) -> RunLoop:
        rt = config.runtime
        return cls(
            router_slice_rows=rt.router_slice_rows,
            gather_rows=rt.gather_rows,
            gather_ms=rt.gather_ms,
            yield_for_results=rt.yield_for_results,
            yield_backlog_rows=rt.yield_backlog_rows,
            gc_freeze=rt.gc_freeze,
            gc_quiet_s=rt.gc_quiet_s,
        )


MAX_ROUTER_SLICE = 4096  # the router's own default batch


def progress_policy(config: Config) -> ProgressPolicy:
    """[runtime] progress settings (fjords.runtime.progress): quiet sensors are released by
    wall-clock idleness (`idle_timeout_s`), never because another sensor ran ahead in event
    time; `max_lag_seconds`, when set, is an extra cap in event time (off by default: it makes
    slow-period sensors late whenever others run ahead)."""
    rt = config.runtime
    return ProgressPolicy(
        idle_timeout_s=rt.idle_timeout_s,
        max_future_s=rt.max_future_seconds,
        max_lag=INF if rt.max_lag_seconds is None else rt.max_lag_seconds,
    )


def scheduler_name(config: Config) -> str:
    """[runtime] scheduler: "ticket" (the default: PRIORITY n sets a query's share when the
    gateway is saturated) or "round-robin" (every ready operator takes turns; PRIORITY is kept
    but has no effect)."""
    return config.runtime.scheduler or DEFAULT_SCHEDULER


def make_engine(config: Config, scheduler: str, limits: Limits | None = None) -> Engine:
    """The daemon's query engine and its Fjord: `scheduler` (`scheduler_name`), and
    `[runtime]`'s queue bound, progress policy and group-filter sharing; `limits` default to
    `[limits]`."""
    if limits is None:
        limits = Limits.from_mapping(msgspec.structs.asdict(config.limits))
    fjord = Fjord(
        make_scheduler(scheduler),
        queue_bound=config.queue_bound,
        progress=progress_policy(config),
        limits=limits,
    )
    return Engine(fjord, share_group_filters=config.runtime.share_group_filters)


def loop_sharing(fjord: Fjord, run_loop: RunLoop, flush_due: Callable[[], bool]) -> LoopSharing:
    """The scheduler's side of `RunLoop`: router slices (sized at each scheduler slice, for
    every stream, also those added later), gathering input, and yielding while result rows
    wait for clients (`flush_due`: the result hub's)."""
    rl, streams = run_loop, fjord.streams
    least = max(1, rl.router_slice_rows)
    for stream in streams.values():
        stream.router.batch = least

    def waiting() -> int:
        return sum(len(s.queue) for s in streams.values())

    def size_slices() -> None:
        for stream in streams.values():
            stream.router.batch = max(least, min(MAX_ROUTER_SLICE, len(stream.queue) // 4))

    most = rl.yield_backlog_rows

    def results_waiting() -> bool:  # (the flag stays up while the Fjord is behind)
        return waiting() < most and flush_due()

    return LoopSharing(
        gather=waiting if rl.gather_ms > 0 else None,
        gather_rows=rl.gather_rows,
        gather_seconds=rl.gather_ms / 1000.0,
        before_slice=size_slices,
        yield_when=results_waiting if rl.yield_for_results else None,
    )
