"""Push and pull queues: one interface, bounded, drop-oldest with counted drops."""

from __future__ import annotations

import sys

import pytest

from fjords.runtime.operators.base import Operator
from fjords.runtime.queues import PullQueue, PushQueue


def test_push_queue_fifo() -> None:
    q = PushQueue(bound=10)
    for i in range(5):
        q.put((i,))
    assert [q.get() for _ in range(5)] == [(i,) for i in range(5)]
    assert q.get() is None


def test_full_push_queue_drops_oldest_and_counts() -> None:
    q = PushQueue(bound=3)
    for i in range(10):
        q.put((i,))
    assert len(q) == 3
    assert q.drops == 7
    assert q.get_batch(10) == [(7,), (8,), (9,)]


def test_memory_stays_bounded() -> None:
    q = PushQueue(bound=1000)
    for i in range(100_000):
        q.put((i, float(i)))
    assert len(q) == 1000
    assert q.drops == 99_000
    assert sys.getsizeof(q._items) < 100_000  # the deque holds 1000 slots, not 100,000


def test_bound_must_be_positive() -> None:
    with pytest.raises(ValueError):
        PushQueue(bound=0)


def test_on_ready_fires_only_when_becoming_non_empty() -> None:
    q = PushQueue(bound=10)
    calls = []
    q.set_on_ready(lambda: calls.append(1))
    q.put((1,))
    q.put((2,))
    assert calls == [1]
    q.get_batch(10)
    q.put((3,))
    assert calls == [1, 1]


@pytest.mark.parametrize(
    "bound, batches", [(3, [[(i,) for i in range(10)]]), (5, [[(1,)], [], [(2,), (3,)]])]
)
def test_put_many_is_put_of_each(bound: int, batches: list[list[tuple]]) -> None:
    """A batch read from a file in one call: same order, drops, counts and wake-ups as `put`."""
    a, b = PushQueue(bound=bound), PushQueue(bound=bound)
    woke = {"a": 0, "b": 0}
    a.set_on_ready(lambda: woke.__setitem__("a", woke["a"] + 1))
    b.set_on_ready(lambda: woke.__setitem__("b", woke["b"] + 1))
    for batch in batches:
        a.put_many(batch)
        for item in batch:
            b.put(item)
    assert (a.get_batch(99), a.drops, a.puts, woke["a"]) == (
        b.get_batch(99),
        b.drops,
        b.puts,
        woke["b"],
    )


class Counter(Operator):
    """Produces 0..n-1, `per` items per transition, then reports nothing available."""

    def __init__(self, out: PushQueue, n: int, per: int = 1) -> None:
        super().__init__(outputs=[out])
        self.n, self.per, self.i, self.calls = n, per, 0, 0

    def transition(self) -> bool:
        self.calls += 1
        if self.i >= self.n:
            return False
        for _ in range(self.per):
            if self.i < self.n:
                self.emit((self.i,))
                self.i += 1
        return True


def test_pull_queue_runs_the_producer_on_demand() -> None:
    buffer = PushQueue()
    prod = Counter(buffer, 5, per=2)
    q = PullQueue(prod, buffer)
    assert prod.calls == 0  # nothing runs until asked
    assert q.get() == (0,)
    assert prod.calls == 1
    assert q.get() == (1,)  # buffered from the same transition
    assert prod.calls == 1
    assert [q.get() for _ in range(3)] == [(2,), (3,), (4,)]
    assert q.get() is None  # the producer reports nothing: no blocking, no spinning


class Lazy(Operator):
    """Makes progress without output for a few transitions before producing."""

    def __init__(self, out: PushQueue) -> None:
        super().__init__(outputs=[out])
        self.step = 0

    def transition(self) -> bool:
        self.step += 1
        if self.step == 4:
            self.emit(("done",))
        return self.step <= 4


def test_pull_queue_keeps_pulling_while_the_producer_progresses() -> None:
    buffer = PushQueue()
    q = PullQueue(Lazy(buffer), buffer)
    assert q.get() == ("done",)
    assert q.get() is None


def test_pull_and_push_share_one_interface() -> None:
    push = PushQueue()
    for i in range(3):
        push.put((i,))
    buffer = PushQueue()
    pull = PullQueue(Counter(buffer, 3), buffer)
    for q in (push, pull):
        assert q.get_batch(10) == [(0,), (1,), (2,)]
        assert q.get() is None
        assert q.drops == 0


def test_a_pull_queue_reads_what_its_producer_outputs() -> None:
    """The producer is built with the pull queue's buffer as its output: nothing is attached
    to it afterwards, and a buffer it does not write to is refused."""
    buffer = PushQueue()
    with pytest.raises(ValueError, match="does not output"):
        PullQueue(Counter(PushQueue(), 1), buffer)
