"""Home Assistant MQTT discovery for published queries: one entity per query and result group.

A query's rows interleave its groups (`segment = S05`, `S14`, ...) on `{prefix}/results/{id}`;
one Home Assistant sensor on that topic would flip between them. So each group gets its own
retained state topic, `{prefix}/results/{id}/{group}`, and its own discovery config whose
`value_template` reads the query's aggregate (or first numeric) value, with the stream schema's
unit where it knows one, and whose availability follows the gateway's status topic. Deleting
the query deletes its entities (empty retained configs).

A ROLLUP, GROUPING SETS or DRILLDOWN query's coarser rows carry NULL in the columns they roll
up: such a group is labelled "all <column>s" and its object id says `all` (hashed apart from a
real value "all"). Each group's retained state is its latest row, early (`final` false, with
its `as_of`) or final: Home Assistant shows the figure as it builds up.

Sans-IO: `Announcer` turns rows into (topic, payload, retain) publications; the bridge sends them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass
from typing import Any

from fjords.compile.sql import ast
from fjords.schema import Schema

log = logging.getLogger("gateway.home_assistant")

Publication = tuple[str, bytes, bool]  # topic, payload, retain
_OBJECT_ID = re.compile(r"[^A-Za-z0-9_-]")
_VALUE_UNITS = {"AVG", "MIN", "MAX", "SUM"}  # aggregates that keep their argument's unit


@dataclass(frozen=True)
class EntityShape:
    """Which result columns name a group, and which one is the entity's value (and its unit)."""

    group_columns: tuple[str, ...]
    value_column: str
    unit: str | None = None
    # the group columns some grouping set leaves out: NULL there means every value
    rolled_up: tuple[str, ...] = ()

    def label(self, key: tuple) -> str:
        """The group's readable name: its values, a rolled-up one as "all <column>s"."""
        return " ".join(
            f"all {c}s" if v is None and c in self.rolled_up else str(v)
            for c, v in zip(self.group_columns, key, strict=True)
        )


def entity_shape(query: ast.Statement, columns: list[str], schema: Schema | None) -> EntityShape:
    """From the query's SELECT list: GROUP BY columns are the group; the first aggregate (else
    the first numeric column that is not time) is the value."""
    grouped = {e.name for e in query.group_by if isinstance(e, ast.Column)}
    rolled = _rolled_up(query)
    groups: list[str] = []
    rolled_names: list[str] = []
    value: tuple[str, str | None] | None = None
    items = [i for i in query.select if isinstance(i, ast.SelectItem)]
    if len(items) == len(query.select) and len(items) <= len(columns):
        for item, name in zip(items, columns, strict=False):
            e = item.expr
            if isinstance(e, ast.Column) and e.name in grouped:
                groups.append(name)
                if e.name in rolled:
                    rolled_names.append(name)
            elif value is None and isinstance(e, ast.Aggregate):
                unit = None
                if e.func in _VALUE_UNITS and isinstance(e.arg, ast.Column):
                    unit = _unit(schema, e.arg.name)
                value = (name, unit)
    if value is None:
        for name in columns:
            if name in groups or name in ("time", "window_start", "window_end"):
                continue
            if schema is not None and name in schema.names:
                if schema.fields[schema.index(name)].type not in ("int", "float"):
                    continue
            value = (name, _unit(schema, name))
            break
    if value is None:
        value = (columns[0], None)
    return EntityShape(tuple(groups), value[0], value[1], tuple(rolled_names))


def _rolled_up(query: ast.Statement) -> set[str]:
    """The GROUP BY columns that some grouping set (ROLLUP, GROUPING SETS, DRILLDOWN) omits."""
    sets = getattr(query, "grouping_sets", ())
    out: set[str] = set()
    for i, e in enumerate(getattr(query, "group_by", ())):
        if isinstance(e, ast.Column) and any(i not in s for s in sets):
            out.add(e.name)
    return out


def _unit(schema: Schema | None, name: str) -> str | None:
    if schema is None or name not in schema.names:
        return None
    return schema.fields[schema.index(name)].unit


def object_id(*parts: object) -> str:
    """A Home Assistant object id ([A-Za-z0-9_-]); a hash keeps ids of unlike values apart. A
    None part (a rolled-up group value) reads `all`, hashed apart from the value "all"."""
    raw = "_".join("\0" if p is None else str(p) for p in parts)
    clean = _OBJECT_ID.sub("_", "_".join("all" if p is None else str(p) for p in parts))
    if clean != raw:
        clean += "_" + hashlib.sha1(raw.encode()).hexdigest()[:8]
    return clean[:200]


class Announcer:
    """Discovery configs and per-group retained state for one published query."""

    def __init__(
        self,
        query_id: str,
        shape: EntityShape,
        *,
        prefix: str,
        status_topic: str,
        max_entities: int = 1000,
    ) -> None:
        self.query_id = query_id
        self.shape = shape
        self.prefix = prefix
        self.status_topic = status_topic
        self.max_entities = max_entities
        self.entities: dict[tuple, str] = {}  # group values -> object id
        self.refused = 0  # rows of groups beyond max_entities (not shown in Home Assistant)

    def rows(self, rows: list[dict[str, Any]]) -> list[Publication]:
        out: list[Publication] = []
        for row in rows:
            key = tuple(row.get(c) for c in self.shape.group_columns)
            oid = self.entities.get(key)
            if oid is None:
                if len(self.entities) >= self.max_entities:
                    if not self.refused:
                        log.warning(
                            "query %s: more than %d groups; Home Assistant gets no entity for "
                            "the rest (counted)", self.query_id, self.max_entities,
                        )  # fmt: skip
                    self.refused += 1
                    continue
                oid = self.entities[key] = object_id("fjords", self.query_id, *key)
                out.append(self.config(oid, key))
            out.append((self._state_topic(oid), json.dumps(row, default=str).encode(), True))
        return out

    def retract(self) -> list[Publication]:
        """The query is gone: empty retained messages delete its entities and their state."""
        out: list[Publication] = []
        for oid in self.entities.values():
            out.append((f"homeassistant/sensor/{oid}/config", b"", True))
            out.append((self._state_topic(oid), b"", True))
        self.entities.clear()
        return out

    def _state_topic(self, oid: str) -> str:
        return f"{self.prefix}/results/{self.query_id}/{oid}"

    def config(self, oid: str, key: tuple) -> Publication:
        """The retained discovery config of the entity `oid` (the group `key`)."""
        label = self.shape.label(key)
        config: dict[str, Any] = {
            "name": f"{self.shape.value_column} {label}".strip(),
            "unique_id": oid,
            "object_id": oid,
            "state_topic": self._state_topic(oid),
            "value_template": f"{{{{ value_json.{self.shape.value_column} }}}}",
            "json_attributes_topic": self._state_topic(oid),
            "availability_topic": self.status_topic,
            "payload_available": "online",
            "payload_not_available": "offline",
            "device": {
                "identifiers": [f"{self.prefix}-query-{self.query_id}"],
                "name": f"Fjords query {self.query_id}",
                "via_device": f"{self.prefix}-gateway",
            },
        }
        if self.shape.unit is not None:
            config["unit_of_measurement"] = self.shape.unit
            config["state_class"] = "measurement"
        return (f"homeassistant/sensor/{oid}/config", json.dumps(config).encode(), True)

    def configs(self) -> list[Publication]:
        """Every entity's config (again: after a reconnect the broker may have lost them)."""
        return [self.config(oid, key) for key, oid in self.entities.items()]
