"""Stateless operators: select, project, multiplex.

Control items (watermarks, heartbeats) pass through unchanged so downstream windows keep time.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

from fjords.runtime.operators.base import Operator
from fjords.runtime.queues import Queue


class Select(Operator):
    """Pass the tuples for which `predicate` is true."""

    kind = "select"
    __slots__ = ("predicate",)

    def __init__(
        self, predicate: Callable[[tuple], bool], input: Queue, output: Queue, **kw: Any
    ) -> None:
        super().__init__([input], [output], **kw)
        self.predicate = predicate

    def transition(self) -> bool:
        q, out, pred = self.inputs[0], self.outputs[0], self.predicate
        did = False
        for _ in range(self.batch):
            item = q.get()
            if item is None:
                break
            did = True
            if item.__class__ is tuple:
                self.tuples_in += 1
                if pred(item):
                    out.put(item)
                    self.tuples_out += 1
            else:
                out.put(item)
        return did


class Project(Operator):
    """Map each tuple to a new tuple of computed columns."""

    kind = "project"
    __slots__ = ("columns", "positions", "_fn")

    def __init__(
        self,
        columns: Sequence[Callable[[tuple], object]],
        input: Queue,
        output: Queue,
        *,
        positions: Sequence[int] | None = None,
        **kw: Any,
    ) -> None:
        super().__init__([input], [output], **kw)
        self.columns = tuple(columns)
        # Plain columns only: their positions in the input row (None: computed columns).
        self.positions = tuple(positions) if positions is not None else None
        self._fn: Callable[[tuple], tuple]
        if positions is not None and len(positions) > 1:
            # Plain columns, the common case: one C call builds the row.
            self._fn = operator.itemgetter(*positions)
        elif positions is not None:
            i = positions[0]
            self._fn = lambda t: (t[i],)
        else:
            cols = self.columns
            self._fn = lambda t: tuple(c(t) for c in cols)

    @property
    def fn(self) -> Callable[[tuple], tuple]:
        """One input row to its projected row."""
        return self._fn

    def map_batch(self, rows: list[tuple]) -> list[tuple]:
        """The projected rows of one batch (a fused delivery calls this instead of queueing)."""
        out = list(map(self._fn, rows))
        self.tuples_in += len(rows)
        self.tuples_out += len(out)
        return out

    def transition(self) -> bool:
        q, out, fn = self.inputs[0], self.outputs[0], self._fn
        did = False
        for _ in range(self.batch):
            item = q.get()
            if item is None:
                break
            did = True
            if item.__class__ is tuple:
                self.tuples_in += 1
                out.put(fn(item))
                self.tuples_out += 1
            else:
                out.put(item)
        return did


class Multiplex(Operator):
    """One input, many outputs: every item goes to every output (shared, never copied)."""

    kind = "multiplex"
    __slots__ = ()

    def __init__(self, input: Queue, outputs: Sequence[Queue], **kw: Any) -> None:
        super().__init__([input], outputs, **kw)

    def subscribe(self, output: Queue) -> None:
        """One more output (a shared aggregate's new user), from the next item on."""
        self.outputs.append(output)

    def unsubscribe(self, output: Queue) -> None:
        self.outputs.remove(output)

    def transition(self) -> bool:
        q, outs = self.inputs[0], self.outputs
        did = False
        for _ in range(self.batch):
            item = q.get()
            if item is None:
                break
            did = True
            for o in outs:
                o.put(item)
        return did
