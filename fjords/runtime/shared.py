"""Windowed aggregates shared between queries (paper section 3.3: work done once for many).

Queries with the same filter, groups, aggregates and window share one `WindowAggregate`
(`SharedAggregate`); each adds only its own end, a `Finish` (its start time, HAVING and SELECT
list) and its sink. Fused, the aggregate hands each window to a `WindowFanOut`, which calls
every user's Finish and sink directly; unfused, a `Multiplex` copies the window's rows into
each user's Finish input queue, as scheduled steps.

Users that want some groups only (a `segment IN (...)` moved after the aggregate, see
`fjords.compile.planner.sharing`) gate what the router lets into the aggregate (the union of
their groups) and are handed only their groups' rows of each window.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable
from dataclasses import replace
from typing import Any, ClassVar

from fjords.limits import Limits
from fjords.runtime.operators.aggregate import Finish, WindowAggregate
from fjords.runtime.operators.simple import Multiplex
from fjords.runtime.operators.sink import QuerySink
from fjords.runtime.plan import GroupGate, SharedWindow
from fjords.runtime.predicate_index import Residual

UserFailed = Callable[[str, str, Exception], None]  # (query id, where, what it raised)


class WindowFanOut:
    """A fused shared aggregate's output: each window's rows (or the end-of-input watermark)
    to every user's Finish (its start time, HAVING and SELECT list) and sink, one list per
    user. A user whose part raises is recorded and failed after the aggregate's transition
    (`settle`), not the others. Stops after STEP_BUDGET (`pending`; the aggregate resumes it
    with `drain` and closes nothing newer before it is out); the users are those of the
    moment the window was emitted.

    A gated user (`picks`) is handed only the rows of its groups: 200 dashboards of two
    segments each over a window of 200 segments check 400 rows, not 40,000 (a close of that
    size held the event loop ~3 ms, and every sample arriving meanwhile waited). Its HAVING
    (less the condition the pick met) and SELECT list run on those rows, in their order."""

    # Work per aggregate transition on a window's fan-out: a user costs its rows plus
    # USER_COST (its finalize, sink and consumers' calls). ~0.5 ms here: a window of 10,000
    # dashboards goes out over many transitions, with the stream's samples routed between
    # them, instead of holding the event loop for one long step.
    STEP_BUDGET: ClassVar[int] = 2048
    USER_COST: ClassVar[int] = 16

    __slots__ = ("users", "picks", "errors", "on_failed", "_fanning")

    def __init__(self, on_failed: UserFailed) -> None:
        self.users: dict[str, tuple[Finish, QuerySink]] = {}
        # Gated users, by query id: the groups each wants (see GroupGate).
        self.picks: dict[str, GroupGate] = {}
        self.errors: list[tuple[str, str, Exception]] = []
        self.on_failed = on_failed
        # Windows' fan-outs cut short: (items, their rows by value, the users still to serve,
        # last first). A list, not a deque: rarely more than one item.
        self._fanning: list[tuple[list, _RowsByValue | None, list[str]]] = []

    def add(self, qid: str, finish: Finish, sink: QuerySink, window: SharedWindow) -> None:
        self.users[qid] = (finish, sink)
        gate = window.gate
        if gate is not None and gate.position is not None:
            self.picks[qid] = gate

    def discard(self, qid: str) -> None:
        self.users.pop(qid, None)
        self.picks.pop(qid, None)

    def deliver(self, items: list) -> None:
        by_value = _RowsByValue(items) if self.picks else None
        self._fanning.append((items, by_value, list(self.users)[::-1]))
        self.drain()

    @property
    def pending(self) -> bool:
        """Whether a window's fan-out was cut short (`drain` goes on with it)."""
        return bool(self._fanning)

    def drain(self) -> bool:
        """Go on with the fan-outs cut short, within one STEP_BUDGET; True when all are out."""
        budget = self.STEP_BUDGET
        fanning, users, picks = self._fanning, self.users, self.picks
        while fanning:
            items, by_value, todo = fanning[0]
            while todo:
                if budget <= 0:
                    return False
                qid = todo.pop()
                user = users.get(qid)
                if user is None:  # removed since
                    continue
                fin, sink = user
                mine, pick = items, None
                if by_value is not None:
                    pick = picks.get(qid)
                    if pick is not None:
                        mine = by_value.select(pick.position, pick.values)  # type: ignore[arg-type]
                budget -= len(mine) + self.USER_COST
                if mine:
                    self._deliver(qid, fin, sink, mine, pick)
            del fanning[0]
        return True

    def settle(self) -> None:
        """Fail the users whose Finish or sink raised (after the aggregate's transition)."""
        if not self.errors:
            return
        errors, self.errors = self.errors, []
        for qid, where, exc in errors:
            self.on_failed(qid, where, exc)

    def _deliver(
        self, qid: str, fin: Finish, sink: QuerySink, items: list, pick: GroupGate | None
    ) -> None:
        try:
            if pick is None:  # start, HAVING, SELECT: one batch
                out, mark = fin.finish_batch(items)
            else:  # its HAVING without the condition the pick met
                out, mark = fin.finish_batch(items, pick.finalize, pick.finalize_batch)
            if mark is not None and mark > sink.watermark:
                sink.watermark = mark
        except Exception as e:  # noqa: BLE001 - this query fails, not the others
            self.errors.append((qid, fin.name, e))
            return
        if out:
            try:
                sink.deliver(out)
            except Exception as e:  # noqa: BLE001
                self.errors.append((qid, sink.name, e))


class _RowsByValue:
    """A window's items indexed by the value at one position of its rows, built for the first
    user that asks about that position (`WindowFanOut.deliver`)."""

    __slots__ = ("items", "marks", "_at")

    def __init__(self, items: list) -> None:
        self.items = items
        self.marks = [t for t in items if t.__class__ is not tuple]  # watermarks go to all
        self._at: dict[int, dict[Hashable, list[int]]] = {}

    def select(self, position: int, values: frozenset) -> list:
        """The rows whose value at `position` is one of `values`, in order, then the marks."""
        index = self._at.get(position)
        if index is None:
            index = self._at[position] = {}
            for i, t in enumerate(self.items):
                if t.__class__ is tuple:
                    index.setdefault(t[position], []).append(i)
        found = [index[v] for v in values if v in index]
        if not found:
            return self.marks
        at = found[0] if len(found) == 1 else sorted(i for f in found for i in f)
        items = self.items
        return [items[i] for i in at] + self.marks


class SharedAggregate:
    """A running windowed aggregate and the queries using it: their priorities (it runs with
    the highest) and the groups gated users want. `fanout` is a WindowFanOut (fused) or a
    Multiplex (its rows copied to each user's Finish input queue)."""

    def __init__(
        self,
        aggregate: WindowAggregate,
        fanout: WindowFanOut | Multiplex,
        router_key: str,
        limits: Limits,
        *,
        key: tuple = (),
        complete_from: float = float("-inf"),
    ) -> None:
        self.aggregate = aggregate
        self.fanout = fanout
        self.router_key = router_key
        self.key = key  # what the Fjord files it under (the plans' sharing key, or its own)
        #: windows that start at or after it hold every reading: it joined the stream then,
        #: or was filled from the stream's history from then on
        self.complete_from = complete_from
        self.limits = limits  # a user's limits; the aggregate's grow with its users (gated)
        self.users: set[str] = set()
        self.priorities: Counter[int] = Counter()  # its users' PRIORITY values
        # Users that want some groups only: column index -> how many of them want each
        # value; `ungated`: users that want every group.
        self.gates: dict[int, Counter] = {}
        self.ungated = 0

    @property
    def fused(self) -> bool:
        return isinstance(self.fanout, WindowFanOut)

    def join(self, qid: str, window: SharedWindow, sink: QuerySink, tickets: int) -> None:
        """A query starts using the aggregate (its Finish after it)."""
        if isinstance(self.fanout, WindowFanOut):
            self.fanout.add(qid, window.finish, sink, window)
        else:
            self.fanout.subscribe(window.finish.inputs[0])
        self.users.add(qid)
        self.priorities[tickets] += 1
        self._gate(window, +1)

    def leave(self, qid: str, window: SharedWindow, tickets: int) -> bool:
        """A query stops using it; True when it was the last."""
        if isinstance(self.fanout, WindowFanOut):
            self.fanout.discard(qid)
        else:
            self.fanout.unsubscribe(window.finish.inputs[0])
        self.users.discard(qid)
        self.priorities[tickets] -= 1
        if self.priorities[tickets] <= 0:
            del self.priorities[tickets]
        self._gate(window, -1)
        return not self.users

    def _gate(self, window: SharedWindow, step: int) -> None:
        """Count a user's groups in (+1) or out (-1); the aggregate's limits follow."""
        gate = window.gate
        if gate is None:
            self.ungated += step
        else:
            counts = self.gates.setdefault(gate.column, Counter())
            for v in gate.values:
                counts[v] += step
                if counts[v] <= 0:
                    del counts[v]
        if not self.gates:
            return
        # Shared by users of different groups, it may hold what they would apart: the group
        # and state limits times its users (it holds at most the union of theirs).
        n = max(1, len(self.users))
        lim = self.limits
        self.aggregate.limits = replace(
            lim,
            max_groups_per_window=lim.max_groups_per_window * n,
            max_state_bytes_per_query=lim.max_state_bytes_per_query * n,
        )

    def admits(self, rest: Residual) -> Callable[[tuple], bool]:
        """The router's check for the aggregate: a row of a group some user wants, then the
        rest of the shared filter. (Installed when the aggregate starts with a gated user.)"""
        gates = self.gates

        def admit(t: tuple) -> bool:
            if self.ungated:
                return rest is None or rest(t)
            for i, c in gates.items():  # a loop, not any(<genexpr>): this runs per row
                if t[i] in c:
                    return rest is None or rest(t)
            return False

        return admit

    @property
    def top_priority(self) -> int | None:
        return max(self.priorities) if self.priorities else None

    def describe(self) -> dict[str, Any]:
        return {**self.aggregate.describe(), "queries_sharing": len(self.users)}
