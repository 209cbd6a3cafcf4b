"""The operator: a state machine with one step, `transition`.

`transition` consumes what its inputs have (at most `batch` items), emits any number of items to
any of its outputs, and returns after that bounded amount of work; it returns True when it did
something. It never blocks: with nothing to read it simply returns False (paper section 3.1.3).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fjords.runtime.queues import Queue

# As large as the stream router's batch: an operator fed by the router takes in one transition
# what the router gave it in one, so under a burst its queue does not grow until it drops.
DEFAULT_BATCH = 4096
# An operator's share of the scheduler (`fjords.runtime.scheduler.TicketScheduler`); a query's
# PRIORITY n gives its operators n.
DEFAULT_TICKETS = 100


class Operator:
    """Base of every operator; subclasses implement `transition`."""

    kind = "operator"
    # Thousands of queries each hold a few operators: slots keep each small. `__dict__` stays
    # (created only when a subclass or a caller sets an attribute not named in any slots).
    __slots__ = (
        "inputs",
        "outputs",
        "name",
        "batch",
        "tuples_in",
        "tuples_out",
        "tickets",
        "pass_value",
        "cpu_seconds",
        "transitions",
        "scheduled",
        "__dict__",
        "__weakref__",
    )

    def __init__(
        self,
        inputs: Sequence[Queue] = (),
        outputs: Sequence[Queue] = (),
        name: str = "",
        batch: int = DEFAULT_BATCH,
    ) -> None:
        self.inputs: list[Queue] = list(inputs)
        self.outputs: list[Queue] = list(outputs)
        self.name = name or self.kind
        self.batch = batch
        self.tuples_in = 0
        self.tuples_out = 0
        # Scheduler bookkeeping (see fjords.runtime.scheduler).
        self.tickets = DEFAULT_TICKETS
        self.pass_value = 0.0
        self.cpu_seconds = 0.0
        self.transitions = 0
        self.scheduled = False

    def transition(self) -> bool:
        raise NotImplementedError

    def has_input(self) -> bool:
        """Whether a push input holds items (pull inputs are asked by their consumer)."""
        for q in self.inputs:
            if len(q):
                return True
        return False

    def emit(self, item: object) -> None:
        for q in self.outputs:
            q.put(item)

    def describe(self) -> dict[str, Any]:
        """A JSON-able description for plans and EXPLAIN."""
        return {"operator": self.kind, "name": self.name}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"
