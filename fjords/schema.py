"""Schemas of streams and tables; tuples themselves are plain Python tuples.

A sample is one `tuple`, allocated once by the sensor proxy and shared by every query over
its stream (benchmarks/tuple_repr.py measured it as the fastest representation to build and
to index in CPython). A schema maps field names to positions, so compiled expressions read
`t[i]` with a constant `i`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fjords.errors import SchemaError

TYPES: dict[str, type] = {"int": int, "float": float, "str": str, "bool": bool}


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    type: str = "float"  # one of TYPES
    unit: str | None = None  # of measurement, where known ("mph"): shown to Home Assistant

    def __post_init__(self) -> None:
        if self.type not in TYPES:
            raise SchemaError(
                f"field {self.name!r}: unknown type {self.type!r} (known: {', '.join(TYPES)})"
            )


class Schema:
    """Named, typed fields; `time` names the sample timestamp (event time, epoch seconds)."""

    __slots__ = ("fields", "names", "time", "_index")

    def __init__(self, fields: Iterable[Field | tuple[str, str]], time: str | None = "time"):
        self.fields = tuple(f if isinstance(f, Field) else Field(*f) for f in fields)
        self.names = tuple(f.name for f in self.fields)
        if len(set(self.names)) != len(self.names):
            raise SchemaError(f"duplicate field names in {self.names}")
        self._index = {n: i for i, n in enumerate(self.names)}
        if time is not None and time not in self._index:
            raise SchemaError(f"time field {time!r} is not one of {self.names}")
        self.time = time

    def index(self, name: str) -> int:
        try:
            return self._index[name]
        except KeyError:
            raise SchemaError(f"no field {name!r}; fields are {', '.join(self.names)}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._index

    def __len__(self) -> int:
        return len(self.fields)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Schema) and self.fields == other.fields and self.time == other.time

    def __hash__(self) -> int:
        return hash((self.fields, self.time))

    def __repr__(self) -> str:
        inner = ", ".join(f"{f.name}:{f.type}" for f in self.fields)
        return f"Schema({inner}; time={self.time})"

    def type_of(self, name: str) -> str:
        return self.fields[self.index(name)].type

    @property
    def time_index(self) -> int | None:
        return None if self.time is None else self._index[self.time]

    def concat(self, other: Schema, time: str | None = None) -> Schema:
        """The schema of a joined tuple `left + right`; clashing names must be renamed first."""
        return Schema(self.fields + other.fields, time=time if time is not None else self.time)

    def make(self, values: Mapping[str, object] | Sequence[object]) -> tuple:
        """Build a tuple from a mapping (missing fields -> None) or a sequence, converting types."""
        if isinstance(values, Mapping):
            raw = [values.get(n) for n in self.names]
        else:
            if len(values) != len(self.fields):
                raise SchemaError(
                    f"expected {len(self.fields)} values for {self.names}, got {len(values)}"
                )
            raw = list(values)
        out = []
        for f, v in zip(self.fields, raw, strict=True):
            out.append(convert(v, f.type, f.name))
        return tuple(out)

    def as_dict(self, row: Sequence[object]) -> dict[str, object]:
        return dict(zip(self.names, row, strict=True))


def convert(value: Any, type_name: str, field: str = "?") -> object:
    """Convert one value to a field's type; '' and None become None (SQL NULL)."""
    if value is None or value == "":
        return None
    try:
        if type_name == "float":
            return float(value)
        if type_name == "int":
            return int(value)
        if type_name == "bool":
            if isinstance(value, str):
                return value.strip().lower() in {"1", "true", "yes", "t"}
            return bool(value)
        return str(value)
    except (TypeError, ValueError):
        raise SchemaError(f"field {field!r}: cannot read {value!r} as {type_name}") from None


def infer_type(values: Iterable[str]) -> str:
    """The narrowest of int, float, str that reads every non-empty text value."""
    kind = "int"
    for v in values:
        if v == "":
            continue
        if kind == "int":
            try:
                int(v)
                continue
            except ValueError:
                kind = "float"
        if kind == "float":
            try:
                float(v)
                continue
            except ValueError:
                return "str"
    return kind
