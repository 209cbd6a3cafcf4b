"""The one way from query text to running operators: parse, analyze, plan, install.

    text --parse--> syntax tree --analyze--> bound query --plan--> physical plan --install--> operators
         (compile.sql)        (compile.analysis)       (compile.planner)         (runtime.Fjord)

`Engine` does the first three steps against its Fjord's catalog and hands the plan to the Fjord
(`Fjord.install`); the runtime never imports the compiler. The gateway, `python -m fjords` and
the benchmarks go through here; the Spark compiler (`gateway.spark.compiler`) shares the
analysis alone.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

from fjords.compile.analysis import BoundQuery, BoundUnion, analyze, analyze_union
from fjords.compile.planner import plan_query
from fjords.compile.sql import ast
from fjords.errors import QueryError
from fjords.runtime.fjord import Fjord
from fjords.runtime.plan import QueryPlan
from fjords.runtime.query import RunningQuery
from fjords.sqltext import atom as atom_text

Query = str | ast.Statement


@dataclass
class PreparedQuery:
    """A parsed and planned query, not installed yet (`Engine.prepare`, then `add_query`)."""

    id: str
    sql: str | None
    tree: ast.Statement
    plan: QueryPlan
    start_time: float
    backfill_from: float | None = None  # handed the stream's history from then on


class Engine:
    """Compiles queries for one Fjord and installs them into it.

    `fuse`: filters, projections, sinks and window updates run inside the router's transition,
    per batch (False keeps one operator and queue per step: the reference the tests compare
    against). `share_group_filters`: over a tumbling or sliding window, WHERE conditions on the
    groups alone run after the aggregate, so that queries differing only in their groups share
    it (False: each such query aggregates only its own groups)."""

    def __init__(
        self, fjord: Fjord | None = None, *, fuse: bool = True, share_group_filters: bool = True
    ) -> None:
        self.fjord = fjord if fjord is not None else Fjord()
        self.fuse = fuse
        self.share_group_filters = share_group_filters
        self._ids = itertools.count(1)

    def parse(self, query: Query) -> tuple[str | None, ast.Statement]:
        """The query's text (None for a tree) and its syntax tree; QuerySyntaxError on bad text."""
        if not isinstance(query, str):
            return None, query
        from fjords.compile.sql.parser import parse

        self.fjord.limits.check("max_sql_chars", len(query), "query text length (characters)")
        return query, parse(query)

    def analyze(self, query: Query) -> BoundQuery | BoundUnion:
        """The analysis alone (names, types, clauses), as the Spark compiler uses it."""
        _, tree = self.parse(query)
        fjord = self.fjord
        if isinstance(tree, ast.Union):
            return analyze_union(tree, fjord.catalog, fjord.limits)
        return analyze(tree, fjord.catalog, fjord.limits)

    def plan(self, query: Query, *, start_time: float = -math.inf) -> QueryPlan:
        """The physical plan a query would get, without installing anything (no side effects).
        Raises QuerySyntaxError / QueryError."""
        _, tree = self.parse(query)
        fjord = self.fjord
        return plan_query(
            tree,
            fjord.catalog,
            queue_bound=fjord.queue_bound,
            start_time=start_time,
            limits=fjord.limits,
            share_group_filters=self.share_group_filters,
            fuse=self.fuse,
            stream_idle=fjord.stream_idle,
        )

    def prepare(
        self, query: Query, *, query_id: str | None = None, since: float | None = None
    ) -> PreparedQuery:
        """Parse and plan a query without installing anything, so the caller can save it first
        and install it after. Raises QuerySyntaxError / QueryError.

        Where the stream keeps a history, a windowed query's windows still open are filled
        from it (its first window is whole); `since`: every window (every row, without
        aggregates) from then on is emitted first, then live ones."""
        sql, tree = self.parse(query)
        qid = query_id or f"q{next(self._ids)}"
        self.fjord.check_new_id(qid)
        # Windows that began before the query did would be incomplete: they are skipped.
        streams = [r.name for r in tree.sources if r.name in self.fjord.streams]
        start = self.fjord.stream_time(streams[0]) if streams else -math.inf
        backfill = self._backfill_from(tree, streams, since)
        if backfill is not None:
            start = backfill
        return PreparedQuery(qid, sql, tree, self.plan(tree, start_time=start), start, backfill)

    def _backfill_from(
        self, tree: ast.Statement, streams: list[str], since: float | None
    ) -> float | None:
        """From when a new query is filled from its stream's history (None: not at all)."""
        fjord = self.fjord
        history = fjord.histories.get(streams[0]) if streams else None
        if isinstance(tree, ast.Union) or len(set(streams)) != 1 or history is None:
            if since is not None:
                raise QueryError(
                    "since needs a query over one stream that keeps a history ([history] keep_s)"
                )
            return None
        watermark = fjord.streams[streams[0]].router.progress.watermark
        if since is None and (not history.rows or watermark == -math.inf):
            return None  # nothing to fill windows with (a restart restoring its queries)
        b = self.analyze(tree)
        assert isinstance(b, BoundQuery)
        older = None
        if since is not None:
            older = fjord.held_since(streams[0], since)
            if since < history.complete_from and (older is None or not older.complete):
                raise QueryError(
                    f"since {since:g} is before what the history of {streams[0]!r} holds in "
                    f"full (from {history.complete_from:g} on; see [history] keep_s"
                    + ("" if older is None else "; the archive misses some of it")
                    + ")"
                )
            t0 = since
        else:
            w = b.window
            if not b.windowed or w is None or w.rows or watermark == -math.inf:
                return None
            t0 = (math.floor((watermark - w.range) / w.slide) + 1) * w.slide  # oldest open window
            if t0 < history.complete_from:
                t0 = math.ceil(history.complete_from / w.slide) * w.slide
            if t0 >= fjord.stream_time(streams[0]):
                return None  # nothing earlier to fill its windows with
        n = history.count(max(t0, history.complete_from), math.inf)
        n += older.count if older is not None else 0
        if n > fjord.limits.max_backfill_readings:
            if since is not None:
                fjord.limits.check("max_backfill_readings", n, "history readings since then")
            return None  # too many to take at once: it starts from now, as without history
        return t0

    def add_query(
        self,
        query: Query | PreparedQuery,
        *,
        query_id: str | None = None,
        since: float | None = None,
    ) -> RunningQuery:
        """Fold a query into the running plan. Raises QuerySyntaxError / QueryError."""
        p = (
            query
            if isinstance(query, PreparedQuery)
            else self.prepare(query, query_id=query_id, since=since)
        )
        return self.fjord.install(
            p.id,
            p.plan,
            sql=p.sql,
            tickets=p.tree.tickets,
            start_time=p.start_time,
            backfill_from=p.backfill_from,
        )

    def explain(self, query: Query | QueryPlan) -> dict[str, Any]:
        """The plan a query would get (or `query`, a plan already), as JSON, and what it would
        share with the running queries, without installing it."""
        tree = None if isinstance(query, QueryPlan) else self.parse(query)[1]
        plan = query if isinstance(query, QueryPlan) else self.plan(tree)  # type: ignore[arg-type]
        fjord = self.fjord
        atoms = plan.demand.atoms
        same_filter = [
            qid
            for qid, q in fjord.queries.items()
            if atoms and q.plan.stream == plan.stream and set(q.demand.atoms) == set(atoms)
        ]
        window = plan.window
        shared = fjord.shared_aggregate(window.key) if window is not None else None
        gate = window.gate if window is not None else None
        if gate is not None:  # the router's filter is what is left of WHERE
            names = fjord.catalog.streams[plan.stream].schema.names
            predicates = [atom_text(names[a.field], a.op, a.value) for a in window.atoms]  # type: ignore[union-attr]
        else:
            predicates = [atom_text(*a) for a in atoms]
        return {
            "aggregate_shared_with": sorted(shared.users) if shared else [],
            "stream": plan.stream,
            "shape": plan.shape,
            "columns": list(plan.columns),
            "shared": {
                "operator": "stream_router",
                "stream": plan.stream,
                "queries_already_sharing": fjord.streams[plan.stream].router.queries,
                "same_filter_as": same_filter,  # one index entry serves them all
            },
            **_sampling(plan),
            "predicates": predicates,
            **({"group_filter": [gate.text]} if gate is not None else {}),
            "operators": [op.describe() for op in plan.operators],
            **({} if tree is None else {"priority": tree.tickets}),
        }


def _sampling(plan: QueryPlan) -> dict[str, Any]:
    """EXPLAIN's word on SAMPLE EVERY n ROWS: where the readings are taken out."""
    every = plan.demand.sample_every_rows
    if every is None:
        return {}
    return {
        "sampling": {
            "clause": f"SAMPLE EVERY {every} ROWS",
            "every": every,
            "counted": "per sensor, from the first reading the query sees, before WHERE",
            "where": "the sensors sample that much slower when all their queries allow it; "
            "otherwise the router takes every n-th reading of each sensor for this query",
        }
    }
