"""The catalog: streams and static tables by name, with their schemas (paper section 2.1).

A sensor's static attributes (segment, location, ...) are columns of its stream, filled in by
its proxy, so queries can filter on them like on any reading.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fjords.errors import QueryError
from fjords.schema import Schema
from fjords.tables import Table


@dataclass
class StreamInfo:
    name: str
    schema: Schema
    sensor_field: str | None = None  # which column identifies the sensor (for progress)
    sensors: dict[str, dict[str, object]] = field(default_factory=dict)  # id -> static attributes


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

    def lookup(self, name: str) -> StreamInfo | Table:
        if name in self.streams:
            return self.streams[name]
        if name in self.tables:
            return self.tables[name]
        known = sorted([*self.streams, *self.tables])
        raise QueryError(f"unknown stream or table {name!r}; known: {', '.join(known) or 'none'}")
