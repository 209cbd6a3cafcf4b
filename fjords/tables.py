"""Static tables (e.g. incidents): loaded from CSV or Parquet, reloaded when the file changes."""

from __future__ import annotations

import csv
import os
from pathlib import Path

from fjords.errors import FjordsError
from fjords.schema import Field, Schema, convert, infer_type


class TableError(FjordsError):
    """A table file that is missing or cannot be read."""


class Table:
    """A named, typed, in-memory relation. `version` changes on every (re)load."""

    def __init__(
        self, name: str, schema: Schema, rows: list[tuple], path: Path | None = None
    ) -> None:
        self.name = name
        self.schema = schema
        self.rows = rows
        self.path = path
        self.version = 0
        self._mtime = _mtime(path) if path else None

    @classmethod
    def from_file(cls, name: str, path: str | os.PathLike[str]) -> Table:
        p = Path(path)
        schema, rows = _load(p)
        return cls(name, schema, rows, p)

    def reload_if_changed(self) -> bool:
        """Re-read the file if its modification time moved; True when the rows changed."""
        if self.path is None:
            return False
        m = _mtime(self.path)
        if m == self._mtime:
            return False
        schema, rows = _load(self.path)
        self.schema, self.rows, self._mtime = schema, rows, m
        self.version += 1
        return True

    def __repr__(self) -> str:
        return f"Table({self.name!r}, {len(self.rows)} rows, {self.schema})"


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


def _load(path: Path) -> tuple[Schema, list[tuple]]:
    if not path.is_file():
        raise TableError(f"table file not found: {path}")
    suffix = path.suffix.lower()
    if suffix in (".parquet", ".pq"):
        return _load_parquet(path)
    if suffix in (".csv", ".txt", ""):
        return _load_csv(path)
    raise TableError(f"{path}: unsupported table format {suffix!r} (use .csv or .parquet)")


def read_csv_columns(path: Path) -> tuple[list[str], list[list[str]]]:
    """Header and raw text rows of a CSV file, with clear errors for empty or ragged files."""
    try:
        with path.open(newline="") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if not header:
                raise TableError(f"{path}: empty file (a header row is required)")
            rows = []
            for lineno, row in enumerate(reader, start=2):
                if not row:
                    continue
                if len(row) != len(header):
                    raise TableError(
                        f"{path}:{lineno}: expected {len(header)} values, got {len(row)}"
                    )
                rows.append(row)
    except UnicodeDecodeError as e:
        raise TableError(f"{path}: not a text CSV file ({e})") from None
    return [h.strip() for h in header], rows


def _load_csv(path: Path) -> tuple[Schema, list[tuple]]:
    header, raw = read_csv_columns(path)
    types = [infer_type(r[i] for r in raw) for i in range(len(header))]
    # Identifier-like columns (ids, stations, segments) stay text even when they look numeric.
    types = [("str" if _is_identifier(h) else t) for h, t in zip(header, types, strict=True)]
    time = "time" if "time" in header else None
    if time is not None and types[header.index("time")] == "str":
        raise TableError(f"{path}: column 'time' must hold epoch seconds")
    schema = Schema([Field(h, t) for h, t in zip(header, types, strict=True)], time=time)
    rows = [tuple(convert(v, t, h) for v, t, h in zip(r, types, header, strict=True)) for r in raw]
    return schema, rows


def _is_identifier(name: str) -> bool:
    n = name.lower()
    return (
        n in {"station", "segment", "sensor", "sensor_id", "lane"} or n.endswith("_id") or n == "id"
    )


def _load_parquet(path: Path) -> tuple[Schema, list[tuple]]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as e:  # pyarrow raises several types for a bad file
        raise TableError(f"{path}: cannot read Parquet ({e})") from None
    fields = []
    for f in table.schema:
        t = str(f.type)
        kind = (
            "int"
            if t.startswith(("int", "uint"))
            else "float"
            if t.startswith(("float", "double", "decimal"))
            else "bool"
            if t == "bool"
            else "str"
        )
        if _is_identifier(f.name):
            kind = "str"
        fields.append(Field(f.name, kind))
    schema = Schema(fields, time="time" if "time" in table.column_names else None)
    cols = [table.column(i).to_pylist() for i in range(table.num_columns)]
    rows = (
        [
            tuple(convert(v, f.type, f.name) for v, f in zip(vals, fields, strict=True))
            for vals in zip(*cols, strict=True)
        ]
        if cols
        else []
    )
    return schema, rows
