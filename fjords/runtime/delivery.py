"""Fused deliveries: a query's work after its filter, called by the stream router per batch.

A filter query (SELECT *) is its sink's `deliver`; a filter with plain or computed columns is
its projection then its sink (`ProjectThenSink`). The compiler's fusion pass
(`fjords.compile.planner.fusion`) builds these; the router calls them inside its transition,
with no queue and no scheduler step per row. What one raises is wrapped in a `DeliveryError`
naming the operator, so the Fjord fails that query with the right reason and no other.
"""

from __future__ import annotations

from fjords.runtime.operators.simple import Project
from fjords.runtime.operators.sink import QuerySink
from fjords.runtime.predicate_index import BatchTarget, Projection


class DeliveryError(Exception):
    """An operator of a fused delivery raised while the router delivered a batch: `where`
    names the operator, `error` is what it raised (the query fails with both)."""

    def __init__(self, where: str, error: Exception) -> None:
        super().__init__(f"{where}: {error!r}")
        self.where = where
        self.error = error


class Guarded:
    """`fn`, with what it raises wrapped in a DeliveryError naming `where` (a small object,
    not a closure: one per installed query, and memory per query counts at 10,000)."""

    __slots__ = ("fn", "where")

    def __init__(self, fn: BatchTarget, where: str) -> None:
        self.fn, self.where = fn, where

    def __call__(self, rows: list[tuple]) -> None:
        try:
            self.fn(rows)
        except Exception as e:
            raise DeliveryError(self.where, e) from e


class ProjectThenSink:
    """A filter query's projection and sink as one callback per batch."""

    __slots__ = ("project", "sink")

    def __init__(self, project: Project, sink: QuerySink) -> None:
        self.project, self.sink = project, sink

    def __call__(self, rows: list[tuple]) -> None:
        try:
            out = self.project.map_batch(rows)
        except Exception as e:
            raise DeliveryError(self.project.name, e) from e
        self.projected(out)

    def projected(self, rows: list[tuple]) -> None:
        """Rows the router already projected with this query's columns (`projection`)."""
        n = len(rows)
        self.project.tuples_in += n
        self.project.tuples_out += n
        try:
            self.sink.deliver(rows)
        except Exception as e:
            raise DeliveryError(self.sink.name, e) from e

    def projection(self) -> Projection | None:
        """For the router: the columns it picks, when all are plain (None: computed)."""
        positions = self.project.positions
        if positions is None:
            return None
        return Projection(positions, self.project.fn, self.projected)
