"""Schedulers: only ready operators run; round-robin is fair; tickets set shares; asyncio-friendly."""

from __future__ import annotations

import asyncio

from fjords.runtime.operators.base import Operator
from fjords.runtime.operators.simple import Select
from fjords.runtime.queues import PushQueue
from fjords.runtime.scheduler import LoopSharing, RoundRobinScheduler, TicketScheduler


class Busy(Operator):
    """Always has work; each transition 'costs' `cost` seconds on a fake clock."""

    def __init__(
        self, name: str, clock: list[float], cost: float = 1.0, tickets: int = 100
    ) -> None:
        super().__init__(name=name)
        self.clock, self.cost, self.tickets = clock, cost, tickets

    def has_input(self) -> bool:
        return True

    def transition(self) -> bool:
        self.clock[0] += self.cost
        return True


def test_round_robin_is_fair() -> None:
    clock = [0.0]
    s = RoundRobinScheduler(clock=lambda: clock[0])
    ops = [Busy(f"op{i}", clock) for i in range(5)]
    for op in ops:
        s.add(op)
        s.wake(op)
    s.run_until_idle(max_steps=1000)
    assert [op.transitions for op in ops] == [200] * 5


def test_tickets_give_cpu_in_proportion() -> None:
    clock = [0.0]
    s = TicketScheduler(clock=lambda: clock[0])
    cheap = Busy("low", clock, cost=1.0, tickets=100)
    rich = Busy("high", clock, cost=1.0, tickets=300)
    for op in (cheap, rich):
        s.add(op)
        s.wake(op)
    s.run_until_idle(max_steps=4000)
    assert abs(rich.cpu_seconds / cheap.cpu_seconds - 3.0) < 0.05


def test_tickets_charge_for_time_computed() -> None:
    clock = [0.0]
    s = TicketScheduler(clock=lambda: clock[0])
    slow = Busy("slow", clock, cost=10.0)
    fast = Busy("fast", clock, cost=1.0)
    for op in (slow, fast):
        s.add(op)
        s.wake(op)
    s.run_until_idle(max_steps=1100)
    # Equal tickets -> equal CPU time: the fast one gets about 10x the transitions.
    assert abs(slow.cpu_seconds - fast.cpu_seconds) <= 10.0
    assert fast.transitions > 9 * slow.transitions


def test_idle_operators_are_never_polled() -> None:
    s = RoundRobinScheduler()
    qs = [PushQueue() for _ in range(1000)]
    outs = [PushQueue() for _ in range(1000)]
    ops = [Select(lambda t: True, q, o) for q, o in zip(qs, outs, strict=True)]
    for op in ops:
        s.add(op)
    qs[7].put((1,))
    assert s.run_until_idle() == 1
    assert ops[7].transitions == 1
    assert sum(op.transitions for op in ops) == 1
    assert outs[7].get() == (1,)


def test_removed_operator_does_not_run() -> None:
    s = RoundRobinScheduler()
    q, o = PushQueue(), PushQueue()
    op = Select(lambda t: True, q, o)
    s.add(op)
    q.put((1,))
    s.remove(op)
    assert s.run_until_idle() == 0


async def test_async_run_waits_for_input_and_yields_to_the_loop() -> None:
    s = RoundRobinScheduler()
    q, o = PushQueue(), PushQueue()
    s.add(Select(lambda t: t[0] % 2 == 0, q, o))
    task = asyncio.create_task(s.run())
    try:
        await asyncio.sleep(0.01)
        assert s.transitions == 0  # idle: awaiting, not spinning
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            for _ in range(5):
                ticks += 1
                await asyncio.sleep(0)

        for i in range(10):
            q.put((i,))
        await asyncio.gather(ticker(), asyncio.sleep(0.02))
        assert ticks == 5
        assert o.get_batch(100) == [(0,), (2,), (4,), (6,), (8,)]
    finally:
        s.stop()
        await asyncio.wait_for(task, 1)


async def test_stop_before_run_starts_still_stops() -> None:
    s = RoundRobinScheduler()
    task = asyncio.create_task(s.run())
    s.stop()  # the task has not started yet
    await asyncio.wait_for(task, 1)


class Drain(Operator):
    """Takes everything from its push queue per transition; records each batch's size."""

    def __init__(self, q: PushQueue, on_batch=None) -> None:
        super().__init__([q], [], name="drain", batch=10_000)
        self.sizes: list[int] = []
        self.on_batch = on_batch

    def transition(self) -> bool:
        items = self.inputs[0].get_batch(self.batch)  # type: ignore[attr-defined]
        if not items:
            return False
        self.sizes.append(len(items))
        if self.on_batch is not None:
            self.on_batch(items)
        return True


async def test_gather_lets_input_arriving_turn_by_turn_join_one_batch() -> None:
    """A transport that hands over one message per event-loop turn (as aiomqtt does): with
    `gather`, the scheduler waits while the input grows, so the messages form one batch."""
    q = PushQueue(bound=1000)
    op = Drain(q)
    s = RoundRobinScheduler()
    s.add(op)
    # no deadline: the turns decide
    sharing = LoopSharing(gather=lambda: len(q), gather_rows=1000, gather_seconds=60.0)

    async def transport() -> None:
        for i in range(20):
            q.put((i,))
            await asyncio.sleep(0)  # one message per turn

    task = asyncio.create_task(s.run(sharing))
    await transport()
    for _ in range(10):
        await asyncio.sleep(0)
    s.stop()
    await task
    assert sum(op.sizes) == 20
    assert op.sizes[0] >= 15, op.sizes  # without gather: 1, then small batches
    assert s.gathered_turns > 0


async def test_gather_stops_at_its_row_bound() -> None:
    q = PushQueue(bound=1000)
    op = Drain(q)
    s = RoundRobinScheduler()
    s.add(op)
    sharing = LoopSharing(gather=lambda: len(q), gather_rows=5, gather_seconds=60.0)

    async def transport() -> None:
        for i in range(20):
            q.put((i,))
            await asyncio.sleep(0)

    task = asyncio.create_task(s.run(sharing))
    await transport()
    for _ in range(10):
        await asyncio.sleep(0)
    s.stop()
    await task
    assert sum(op.sizes) == 20
    assert max(op.sizes) <= 6, op.sizes  # the bound (plus what one turn brought)


async def test_slice_ends_when_results_wait_for_the_loop() -> None:
    """`LoopSharing.yield_when`: the scheduler gives the loop a turn after a transition that
    left rows for clients, instead of running the rest of its time slice."""
    q1, q2 = PushQueue(bound=10), PushQueue(bound=10)
    seen: list[str] = []
    due = [False]
    first = Drain(q1, on_batch=lambda items: (seen.append("first"), due.__setitem__(0, True)))
    second = Drain(q2, on_batch=lambda items: seen.append("second"))
    s = RoundRobinScheduler()
    s.add(first)
    s.add(second)

    def flush_due() -> bool:
        d, due[0] = due[0], False
        return d

    sharing = LoopSharing(yield_when=flush_due)

    async def client() -> None:
        await asyncio.sleep(0)
        while "first" not in seen:
            await asyncio.sleep(0)
        seen.append("client")

    q1.put((1,))
    q2.put((2,))
    reader = asyncio.create_task(client())
    task = asyncio.create_task(s.run(sharing, slice_seconds=60.0))
    await reader
    for _ in range(5):
        await asyncio.sleep(0)
    s.stop()
    await task
    assert seen == ["first", "client", "second"], seen
