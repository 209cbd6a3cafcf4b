"""Schedulers run every operator of every query in one thread (paper section 3.1.3).

Only operators with pending input are considered: a push queue wakes its consumer when it goes
from empty to non-empty, so an idle Fjord costs nothing and 10,000 idle queries are never polled.

- `RoundRobinScheduler`: ready operators take turns, one `transition` each.
- `TicketScheduler`: stride scheduling (the deterministic form of lottery scheduling, Waldspurger
  & Weihl): each operator holds tickets (its priority) and is charged the time it computed,
  divided by its tickets; the ready operator charged least runs next. An operator with twice the
  tickets gets about twice the CPU time when both are busy.

Both cooperate with asyncio through `run()`: when nothing is ready they await new input instead
of spinning, and they yield to the event loop after every time slice so I/O keeps flowing.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fjords.runtime.operators.base import Operator
from fjords.runtime.queues import PushQueue

if TYPE_CHECKING:  # asyncio is imported when `run()` is: a batch run never needs it
    import asyncio

Clock = Callable[[], float]
ErrorHandler = Callable[[Operator, Exception], None]


@dataclass(frozen=True)
class LoopSharing:
    """How `Scheduler.run` shares the event loop with the rest of the process (the daemon's
    transports and clients: `gateway.run_loop`).

    - `gather`: woken by input, the scheduler first lets the input already on its way join it,
      while `gather()` (the rows waiting, e.g. in the streams' queues) still grows from one
      event-loop turn to the next, up to `gather_rows` and `gather_seconds`. A transport that
      hands over one message per loop turn then still gives the router batches (per-batch work
      amortised) when the gateway is busy, and costs two turns when idle.
    - `before_slice`: called at the start of each slice (the daemon sizes its routers' slices
      to the backlog there).
    - `yield_when`: a slice ends early when this says results are waiting for the event loop
      (rows for live clients): they leave now, not after the rest of the slice."""

    gather: Callable[[], int] | None = None
    gather_rows: int = 256
    gather_seconds: float = 0.002
    before_slice: Callable[[], None] | None = None
    yield_when: Callable[[], bool] | None = None


NO_SHARING = LoopSharing()  # run in slices, nothing more


class Scheduler:
    def __init__(self, clock: Clock = time.perf_counter) -> None:
        self.operators: set[Operator] = set()
        self.clock = clock
        self.transitions = 0
        self.busy_seconds = 0.0
        self._wakeup: asyncio.Event | None = None
        self._stopping = False
        # Called with an operator whose transition raised (the Fjord fails the queries using
        # it); without a handler the exception propagates.
        self.on_error: ErrorHandler | None = None
        self.errors = 0
        self.gathered_turns = 0  # loop turns spent gathering (`LoopSharing.gather`)

    # -- membership ---------------------------------------------------------------
    def add(self, op: Operator) -> None:
        self.operators.add(op)
        for q in op.inputs:
            if isinstance(q, PushQueue):
                q.set_on_ready(functools.partial(self.wake, op))
        if op.has_input():
            self.wake(op)

    def remove(self, op: Operator) -> None:
        self.operators.discard(op)
        for q in op.inputs:
            if isinstance(q, PushQueue):
                q.set_on_ready(None)
        op.scheduled = False

    def wake(self, op: Operator) -> None:
        if op.scheduled or op not in self.operators:
            return
        op.scheduled = True
        self._push(op)
        if self._wakeup is not None:
            self._wakeup.set()

    # -- policy (subclasses) --------------------------------------------------------
    def _push(self, op: Operator) -> None:
        raise NotImplementedError

    def _pop(self) -> Operator | None:
        raise NotImplementedError

    def _charge(self, op: Operator, seconds: float) -> None:
        pass

    def has_ready(self) -> bool:
        raise NotImplementedError

    # -- running ----------------------------------------------------------------
    def step(self) -> bool:
        """Run one transition of the next ready operator; False when none is ready."""
        while True:
            op = self._pop()
            if op is None:
                return False
            if op in self.operators:
                break
        clock = self.clock
        start = clock()
        try:
            op.transition()
        except Exception as exc:
            if self.on_error is None:
                raise
            self.errors += 1
            op.scheduled = False
            self.on_error(op, exc)  # usually removes `op` (and its query's other operators)
            if op in self.operators and op.has_input():
                self.wake(op)
            return True
        spent = clock() - start
        op.transitions += 1
        op.cpu_seconds += spent
        self.transitions += 1
        self.busy_seconds += spent
        self._charge(op, spent)
        if op.has_input():
            self._push(op)
        else:
            op.scheduled = False
        return True

    def run_until_idle(self, max_steps: int | None = None) -> int:
        """Transition ready operators until none has input (or `max_steps`); returns steps run."""
        n = 0
        while (max_steps is None or n < max_steps) and self.step():
            n += 1
        return n

    async def run(self, sharing: LoopSharing = NO_SHARING, slice_seconds: float = 0.005) -> None:
        """Run until `stop()`: await input when idle, yield to the event loop every slice
        (and as `sharing` says)."""
        import asyncio

        self._wakeup = asyncio.Event()
        clock = time.perf_counter
        before_slice = sharing.before_slice
        try:
            while not self._stopping:
                if not self.has_ready():
                    self._wakeup.clear()
                    if not self.has_ready():
                        await self._wakeup.wait()
                    continue
                if sharing.gather is not None:
                    await self._gather(sharing)
                if before_slice is not None:
                    before_slice()
                deadline = clock() + slice_seconds
                flush = sharing.yield_when
                while self.step() and clock() < deadline:
                    if flush is not None and flush():
                        break
                await asyncio.sleep(0)
        finally:
            self._wakeup = None
            self._stopping = False  # a stop() that came before run() started still counts

    async def _gather(self, sharing: LoopSharing) -> None:
        """Yield event-loop turns while the waiting input grows (`LoopSharing.gather`). Two
        turns without growth end it: a message read in one turn is pushed in the next."""
        import asyncio

        gather = sharing.gather
        assert gather is not None
        size = gather()
        if size == 0 or size >= sharing.gather_rows:  # woken by other work, or enough already
            return
        deadline = time.perf_counter() + sharing.gather_seconds
        still = 0
        while still < 2 and size < sharing.gather_rows and time.perf_counter() < deadline:
            await asyncio.sleep(0)
            self.gathered_turns += 1
            new = gather()
            still = still + 1 if new == size else 0
            size = new

    def stop(self) -> None:
        self._stopping = True
        if self._wakeup is not None:
            self._wakeup.set()


class RoundRobinScheduler(Scheduler):
    def __init__(self, clock: Clock = time.perf_counter) -> None:
        super().__init__(clock)
        self._ready: deque[Operator] = deque()

    def _push(self, op: Operator) -> None:
        self._ready.append(op)

    def _pop(self) -> Operator | None:
        return self._ready.popleft() if self._ready else None

    def has_ready(self) -> bool:
        return bool(self._ready)


class TicketScheduler(Scheduler):
    STRIDE = 1_000_000.0

    def __init__(self, clock: Clock = time.perf_counter) -> None:
        super().__init__(clock)
        self._heap: list[tuple[float, int, Operator]] = []
        self._seq = itertools.count()
        self._global_pass = 0.0

    def _push(self, op: Operator) -> None:
        # A newly woken operator joins at the current pass: sleeping earns no credit.
        if op.pass_value < self._global_pass:
            op.pass_value = self._global_pass
        heapq.heappush(self._heap, (op.pass_value, next(self._seq), op))

    def _pop(self) -> Operator | None:
        if not self._heap:
            return None
        p, _, op = heapq.heappop(self._heap)
        self._global_pass = p
        return op

    def _charge(self, op: Operator, seconds: float) -> None:
        op.pass_value += max(seconds, 1e-9) * self.STRIDE / max(op.tickets, 1)

    def has_ready(self) -> bool:
        return bool(self._heap)


#: The schedulers by their configuration name (`[runtime] scheduler`).
SCHEDULERS: dict[str, type[Scheduler]] = {
    "ticket": TicketScheduler,
    "round-robin": RoundRobinScheduler,
}
# Ticket: a query's PRIORITY sets its operators' share when the gateway is saturated
# (benchmarks/priority.py: the high-priority query keeps its latency); round-robin ignores it.
DEFAULT_SCHEDULER = "ticket"


def make_scheduler(name: str = DEFAULT_SCHEDULER, clock: Clock = time.perf_counter) -> Scheduler:
    """The scheduler called `name` ("ticket" or "round-robin"); ValueError names the choices."""
    try:
        cls = SCHEDULERS[name]
    except KeyError:
        raise ValueError(
            f"unknown scheduler {name!r}; the schedulers are {', '.join(SCHEDULERS)}"
        ) from None
    return cls(clock)
