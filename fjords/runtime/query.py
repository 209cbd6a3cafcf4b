"""A query folded into the Fjord: its plan, its sink, its state, and what it shares."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from fjords.catalog import Catalog
from fjords.demand import Demand
from fjords.runtime.operators.base import Operator
from fjords.runtime.operators.sink import QuerySink
from fjords.runtime.plan import QueryPlan
from fjords.runtime.predicate_index import Atom
from fjords.runtime.shared import SharedAggregate
from fjords.sqltext import atom as atom_text


class RunningQuery:
    """A query folded into the Fjord: its id, text, plan, result columns and sink.

    `state` is "running" or "failed" (then `error` says why: an operator raised, and the query
    alone was taken out of the plan)."""

    __slots__ = (
        "id",
        "sql",
        "plan",
        "tickets",
        "start_time",
        "state",
        "error",
        "shared",
        "_catalog",
    )

    def __init__(
        self,
        qid: str,
        sql: str | None,
        plan: QueryPlan,
        tickets: int,
        start_time: float,
        catalog: Catalog,
    ) -> None:
        self.id = qid
        self.sql = sql
        self.plan = plan
        self.tickets = tickets  # its PRIORITY
        self.start_time = start_time
        self.state = "running"
        self.error: str | None = None
        self.shared: SharedAggregate | None = None  # the aggregate it shares, once installed
        self._catalog = catalog

    @property
    def columns(self) -> tuple[str, ...]:
        return self.plan.columns

    @property
    def sink(self) -> QuerySink:
        return self.plan.sink

    @property
    def fused(self) -> bool:
        """Whether its operators run inside the router's transition, not as scheduled steps."""
        return self.plan.fused

    @property
    def demand(self) -> Demand:
        return self.plan.demand

    @property
    def demands(self) -> tuple[Demand, ...]:
        """Every input's demand: a UNION ALL's per branch, a stream-stream join's per side."""
        return self.plan.demands

    @property
    def operators(self) -> list[Operator]:
        return self.plan.operators

    def as_dict(self, row: tuple) -> dict[str, Any]:
        return dict(zip(self.columns, row, strict=True))

    def on_row(self, fn: Callable[[dict[str, Any]], None]) -> None:
        """Call `fn` with each result row as a dict."""
        cols = self.columns
        self.sink.add_callback(lambda row: fn(dict(zip(cols, row, strict=True))))

    def _predicates(self, stream: str, atoms: Sequence[Atom]) -> list[str]:
        names = self._catalog.streams[stream].schema.names
        return [atom_text(names[a.field], a.op, a.value) for a in atoms]

    def _shared(self) -> list[dict[str, Any]]:
        """The stages it shares with other queries: a router entry per input (with what the
        router checks for it), then its shared aggregate, if any."""
        plan = self.plan
        window = plan.window
        inputs = [(window.stream, window.atoms)] if window is not None else []
        inputs += [(r.stream, r.atoms) for r in plan.routes]
        out: list[dict[str, Any]] = [
            {
                "operator": "stream_router",
                "stream": stream,
                "predicates": self._predicates(stream, atoms),
            }
            for stream, atoms in inputs
        ]
        if self.shared is not None:
            out.append(self.shared.describe())
            if window is not None and window.gate is not None:
                out[-1]["groups_of_this_query"] = [window.gate.text]
        return out

    def describe(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "sql": self.sql,
            "stream": self.plan.stream,
            "shape": self.plan.shape,
            "columns": list(self.columns),
            "shared": self._shared(),
            "operators": [op.describe() for op in self.plan.operators],
            "rows": self.sink.rows,
            "priority": self.tickets,
            "state": self.state,
            "error": self.error,
        }
