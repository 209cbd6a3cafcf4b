"""The catalog: streams and static tables by name, with their schemas (paper section 2.1).

A sensor's static attributes (segment, location, ...) are columns of its stream, filled in by
its proxy, so queries can filter on them like on any reading.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from fjords.errors import QueryError
from fjords.schema import Schema
from fjords.tables import Table


@dataclass(frozen=True)
class Hierarchy:
    """Columns of a stream, coarse to fine (segment > station): each value of a level lies
    under one value of the level before, so DRILLDOWN may only descend it. `source` names who
    says so, for the refusals (a config entry, a built-in stream)."""

    levels: tuple[str, ...]
    source: str

    def finer(self, parent: str, child: str) -> bool | None:
        """Whether `child` is a finer level than `parent` here; None when not both are levels."""
        if parent not in self.levels or child not in self.levels:
            return None
        return self.levels.index(child) > self.levels.index(parent)

    def __str__(self) -> str:
        return " > ".join(self.levels)


@dataclass
class StreamInfo:
    name: str
    schema: Schema
    sensor_field: str | None = None  # which column identifies the sensor (for progress)
    sensors: dict[str, dict[str, object]] = field(default_factory=dict)  # id -> static attributes
    hierarchies: list[Hierarchy] = field(default_factory=list)  # declared, coarse to fine


class Catalog:
    def __init__(self) -> None:
        self.streams: dict[str, StreamInfo] = {}
        self.tables: dict[str, Table] = {}

    def add_stream(self, info: StreamInfo) -> None:
        if info.name in self.streams or info.name in self.tables:
            raise QueryError(f"name {info.name!r} is already registered")
        self.streams[info.name] = info

    def add_table(self, table: Table) -> None:
        if table.name in self.streams:
            raise QueryError(f"name {table.name!r} is already a stream")
        self.tables[table.name] = table

    def add_hierarchy(self, stream: str, levels: Sequence[str], source: str) -> Hierarchy:
        """Declare `levels` (coarse to fine) a hierarchy of `stream`'s columns; a QueryError
        names what is wrong (an unknown stream or column, fewer than two levels, one twice)."""
        info = self.streams.get(stream)
        if info is None:
            known = ", ".join(sorted(self.streams)) or "none"
            raise QueryError(f"{source}: unknown stream {stream!r}; known: {known}")
        problem = hierarchy_problem(levels, info.schema.names)
        if problem is not None:
            raise QueryError(f"{source}: {problem}")
        h = Hierarchy(tuple(levels), source)
        info.hierarchies.append(h)
        return h

    def lookup(self, name: str) -> StreamInfo | Table:
        if name in self.streams:
            return self.streams[name]
        if name in self.tables:
            return self.tables[name]
        known = sorted([*self.streams, *self.tables])
        raise QueryError(f"unknown stream or table {name!r}; known: {', '.join(known) or 'none'}")


def hierarchy_problem(levels: Sequence[str], columns: Sequence[str]) -> str | None:
    """Why `levels` cannot be a hierarchy of a stream with `columns`, or None."""
    if len(levels) < 2:
        return f"a hierarchy needs at least two levels (coarse to fine), got {list(levels)}"
    for i, level in enumerate(levels):
        if level not in columns:
            return f"{level!r} is not a column of the stream; its columns: {', '.join(columns)}"
        if level in levels[:i]:
            return f"{level!r} is a level twice"
    return None
