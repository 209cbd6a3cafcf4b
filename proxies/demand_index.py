"""`DemandIndex`: which queries concern which sensor, kept up to date change by change.

A sensor's demand is the fold of the needs of every query that concerns it
(`proxies.demand.sensor_demand`). Refolding every query for every sensor at each change costs
sensors x queries: registering the 1,000th query with 207 sensors took ~200 ms. The index
keeps, per sensor shape (stream, value field, kind, static columns: what `analyse` depends on),
the queries that concern every sensor of the shape (no condition on a static column) folded
once, and per sensor only the queries whose conditions on static columns it passes. A change
analyses the query once per shape, refolds the shared part of the shapes it touched, tests
static conditions against the shape's sensors, and merges the shared fold with each touched
sensor's own: a change costs queries + sensors, and the demands equal the full fold's.

Pure (no I/O, no clock): the manager applies what `sync` reports as changed.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fjords.planner import Demand
from proxies.demand import (
    Fold,
    QueryNeeds,
    SensorDemand,
    SensorView,
    analyse,
    concerns,
    finish,
    fold,
    merge,
)

__all__ = ["DemandIndex"]

Key = tuple[int, int]  # (seq, branch)
ShapeKey = tuple[str, str, str, str, frozenset[str]]


def shape_of(stream: str, view: SensorView) -> ShapeKey:
    return (stream, view.value_field, view.kind, view.time_field, frozenset(view.static))


@dataclass
class _Shape:
    view: SensorView  # any of its sensors' (analysis reads only what the shape fixes)
    sensors: dict[str, None] = field(default_factory=dict)
    shared: dict[Key, QueryNeeds] = field(default_factory=dict)  # concern every sensor
    own: dict[Key, QueryNeeds] = field(default_factory=dict)  # a static condition decides
    folded: Fold | None = None  # of `shared`; None: stale


@dataclass
class _Sensor:
    view: SensorView
    shape: ShapeKey
    own: dict[Key, QueryNeeds] = field(default_factory=dict)  # the shape's `own` it passes
    folded: Fold | None = None


@dataclass
class _Query:
    seq: int
    demand_id: int  # id() of the query's Demand: a replaced query is removed and added
    demands: tuple[Demand, ...]
    entries: list[tuple[ShapeKey, Key, bool]] = field(default_factory=list)  # (shape, key, own)


class DemandIndex:
    """See the module docstring."""

    def __init__(self, *, default_period_s: float | None = None) -> None:
        self.default_period_s = default_period_s
        self._shapes: dict[ShapeKey, _Shape] = {}
        self._sensors: dict[str, _Sensor] = {}
        self._queries: dict[str, _Query] = {}
        self._seq = itertools.count()

    # -- sensors ---------------------------------------------------------------------------
    def add_sensor(self, sensor_id: str, stream: str, view: SensorView) -> None:
        self.remove_sensor(sensor_id)
        key = shape_of(stream, view)
        shape = self._shapes.get(key)
        if shape is None:
            shape = self._shapes[key] = _Shape(view)
            for qid, q in self._queries.items():  # a new shape: analyse every query for it
                self._place(qid, q, key, set(), set())
        shape.sensors[sensor_id] = None
        s = self._sensors[sensor_id] = _Sensor(view, key)
        for k, needs in shape.own.items():
            if concerns(needs, view.static):
                s.own[k] = needs

    def remove_sensor(self, sensor_id: str) -> None:
        s = self._sensors.pop(sensor_id, None)
        if s is None:
            return
        shape = self._shapes[s.shape]
        shape.sensors.pop(sensor_id, None)
        if not shape.sensors:  # its analyses go with it
            del self._shapes[s.shape]
            for q in self._queries.values():
                q.entries = [e for e in q.entries if e[0] != s.shape]

    # -- queries ---------------------------------------------------------------------------
    def sync(self, queries: Mapping[str, Any]) -> set[str]:
        """Take the running queries (id -> RunningQuery); the sensors whose demand may have
        changed. Costs one lookup per query plus the work of what was added or removed."""
        stale_shapes: set[ShapeKey] = set()
        stale: set[str] = set()
        for qid in [qid for qid in self._queries if qid not in queries]:
            self._remove(qid, stale_shapes, stale)
        for qid, rq in queries.items():
            known = self._queries.get(qid)
            if known is not None and known.demand_id == id(rq.demand):
                continue
            if known is not None:
                self._remove(qid, stale_shapes, stale)
            demands = getattr(rq, "demands", (rq.demand,))
            q = self._queries[qid] = _Query(next(self._seq), id(rq.demand), tuple(demands))
            for key in self._shapes:
                self._place(qid, q, key, stale_shapes, stale)
        for key in stale_shapes:
            stale.update(self._shapes[key].sensors)
        return stale

    def _place(
        self, qid: str, q: _Query, key: ShapeKey, stale_shapes: set[ShapeKey], stale: set[str]
    ) -> None:
        """File the query's branches on the shape's stream under the shape."""
        shape = self._shapes[key]
        stream, statics = key[0], key[4]
        for i, demand in enumerate(q.demands):
            if demand.stream != stream:
                continue
            needs = analyse(qid, demand, shape.view)
            if needs.value_ranges == ():  # no value passes: it concerns no sensor
                continue
            k = (q.seq, i)
            own = any(a[0] in statics for a in needs.static_atoms)
            q.entries.append((key, k, own))
            if not own:
                shape.shared[k] = needs
                shape.folded = None
                stale_shapes.add(key)
                continue
            shape.own[k] = needs
            for sid in shape.sensors:
                s = self._sensors[sid]
                if concerns(needs, s.view.static):
                    s.own[k] = needs
                    s.folded = None
                    stale.add(sid)

    def _remove(self, qid: str, stale_shapes: set[ShapeKey], stale: set[str]) -> None:
        q = self._queries.pop(qid)
        for key, k, own in q.entries:
            shape = self._shapes.get(key)
            if shape is None:
                continue
            if not own:
                shape.shared.pop(k, None)
                shape.folded = None
                stale_shapes.add(key)
                continue
            shape.own.pop(k, None)
            for sid in shape.sensors:
                s = self._sensors[sid]
                if s.own.pop(k, None) is not None:
                    s.folded = None
                    stale.add(sid)

    # -- answers ---------------------------------------------------------------------------
    def demand(self, sensor_id: str, extra: QueryNeeds | None = None) -> SensorDemand:
        """The sensor's demand; with `extra`, as if that query were added too (EXPLAIN)."""
        s = self._sensors[sensor_id]
        shape = self._shapes[s.shape]
        if shape.folded is None:
            shape.folded = fold((k[0], k[1], n) for k, n in sorted(shape.shared.items()))
        if s.folded is None:
            s.folded = fold((k[0], k[1], n) for k, n in sorted(s.own.items()))
        total = merge(shape.folded, s.folded)
        if extra is not None and concerns(extra, s.view.static):
            total = merge(total, fold([(next(self._seq), 0, extra)]))
        return finish(total, s.view.kind, default_period_s=self.default_period_s)
