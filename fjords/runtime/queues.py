"""Queues connect operators. Push queues buffer what a producer put; pull queues make the producer
run when the consumer asks. Operators see one interface and cannot tell them apart.

Every queue is bounded. A full queue drops its OLDEST item (for sensors the oldest sample is the
least relevant, paper section 3.1.1) and counts the drop in `drops`.

Items are data tuples (plain `tuple`) or control items from fjords.runtime.progress (watermarks,
heartbeats); operators tell them apart with `item.__class__ is tuple`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from fjords.runtime.operators.base import Operator

DEFAULT_BOUND = 65_536
_NO_ITEMS: tuple = ()  # a PushQueue's items until its first put


class Queue(Protocol):
    """What an operator may do with any queue."""

    name: str

    @property
    def bound(self) -> int: ...
    @property
    def drops(self) -> int: ...

    def put(self, item: object) -> None: ...
    def get(self) -> object | None: ...
    def get_batch(self, limit: int) -> list[object]: ...
    def __len__(self) -> int: ...


class PushQueue:
    """The producer puts now; the consumer gets later. Wakes its consumer when it becomes non-empty."""

    __slots__ = ("name", "bound", "drops", "puts", "_items", "_on_ready")

    def __init__(self, bound: int = DEFAULT_BOUND, name: str = "") -> None:
        if bound < 1:
            raise ValueError("a queue bound must be at least 1")
        self.name = name
        self.bound = bound
        self.drops = 0
        self.puts = 0
        # An empty deque is ~600 bytes; a queue never used (a fused query's) keeps none.
        self._items: deque[object] = _NO_ITEMS  # type: ignore[assignment]
        self._on_ready: Callable[[], None] | None = None

    def set_on_ready(self, callback: Callable[[], None] | None) -> None:
        """Called (by the scheduler) whenever the queue goes from empty to non-empty."""
        self._on_ready = callback

    def put(self, item: object) -> None:
        items = self._items
        n = len(items)
        if n == 0:
            if items is _NO_ITEMS:
                items = self._items = deque()
            if self._on_ready is not None:
                self._on_ready()
        elif n >= self.bound:
            items.popleft()
            self.drops += 1
        self.puts += 1
        items.append(item)

    def put_many(self, batch: Sequence[object]) -> None:
        """Put every item of `batch` in order (as many `put`s, at the cost of one)."""
        if not batch:
            return
        items = self._items
        if items is _NO_ITEMS:
            items = self._items = deque()
        if not items and self._on_ready is not None:
            self._on_ready()
        items.extend(batch)
        self.puts += len(batch)
        over = len(items) - self.bound
        if over > 0:
            pop = items.popleft
            for _ in range(over):
                pop()
            self.drops += over

    def get(self) -> object | None:
        items = self._items
        return items.popleft() if items else None

    def get_batch(self, limit: int) -> list[object]:
        """Up to `limit` items at once (cheaper than `limit` calls to get)."""
        items = self._items
        n = len(items)
        if not n:
            return []
        if n <= limit:
            out = list(items)
            items.clear()
            return out
        pop = items.popleft
        return [pop() for _ in range(limit)]

    def peek(self) -> list[object]:
        """The items waiting, oldest first (left in the queue)."""
        return list(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)

    def __repr__(self) -> str:
        return f"PushQueue({self.name!r}, len={len(self._items)}, bound={self.bound}, drops={self.drops})"


class PullQueue:
    """A get runs the producer's `transition` until it yields an item or reports nothing available.

    Never blocks the thread: if the producer makes no progress, get returns None, exactly like an
    empty push queue. What the producer emits goes to `buffer`, one of its outputs (bounded,
    drop-oldest like any queue): build the buffer, the producer with it, then the pull queue.
    """

    __slots__ = ("name", "producer", "_buffer", "max_transitions")

    def __init__(
        self,
        producer: Operator,
        buffer: PushQueue,
        max_transitions: int = 1024,
    ) -> None:
        if not any(q is buffer for q in producer.outputs):
            raise ValueError(f"{producer!r} does not output to {buffer!r}")
        self.name = buffer.name
        self.producer = producer
        self._buffer = buffer
        self.max_transitions = max_transitions

    @property
    def bound(self) -> int:
        return self._buffer.bound

    @property
    def drops(self) -> int:
        return self._buffer.drops

    def put(self, item: object) -> None:
        self._buffer.put(item)

    def get(self) -> object | None:
        buf = self._buffer
        tries = self.max_transitions
        while not buf:
            if tries == 0 or not self.producer.transition():
                return None
            tries -= 1
        return buf.get()

    def get_batch(self, limit: int) -> list[object]:
        out: list[object] = []
        while len(out) < limit:
            item = self.get()
            if item is None:
                break
            out.append(item)
        return out

    def __len__(self) -> int:
        return len(self._buffer)

    def __bool__(self) -> bool:
        # A pull queue may always have something: asking runs the producer.
        return True

    def __repr__(self) -> str:
        return f"PullQueue({self.name!r}, producer={self.producer!r})"
