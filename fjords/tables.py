"""Static tables (e.g. incidents): loaded from CSV or Parquet, reloaded when the file changes."""

from __future__ import annotations

import csv
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


SMALL_BYTES = 1 << 20  # a smaller CSV table is read by the Python rules alone (no pyarrow import)


def _load_csv(path: Path) -> tuple[Schema, list[tuple]]:
    if path.stat().st_size < SMALL_BYTES:
        return _load_csv_python(path)
    try:
        return _load_csv_arrow(path)
    except _ArrowFallback:
        # pyarrow could not read it as plain CSV: the Python reader gives the exact error (line
        # and value), or reads the file when only pyarrow was stricter.
        return _load_csv_python(path)


class _ArrowFallback(Exception):
    """The pyarrow fast path cannot read this input exactly as the Python reader would."""


# Numerals both pyarrow and Python read alike; anything else is typed by the Python rules.
_INT_RE = r"^-?[0-9]+$"
_FLOAT_RE = r"^-?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$"


def _load_csv_arrow(path: Path) -> tuple[Schema, list[tuple]]:
    """Every column read as text by pyarrow, then typed and converted per column in C."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv

    header = _csv_header(path)
    try:
        table = pacsv.read_csv(
            path,
            read_options=pacsv.ReadOptions(column_names=header, skip_rows=1),
            convert_options=pacsv.ConvertOptions(
                column_types={h: pa.string() for h in header},
                null_values=[""],
                strings_can_be_null=True,
                quoted_strings_can_be_null=True,
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise _ArrowFallback(str(e)) from None
    types: list[str] = []
    cols: list[list[Any]] = []
    for h, col in zip(header, table.columns, strict=True):
        kind, values = "str", None
        if _is_identifier(h):
            values = col.to_pylist()
        elif _all_match(pc, col, _INT_RE):
            kind, values = "int", _cast(pa, pc, col, pa.int64())  # None past int64
        elif _all_match(pc, col, _FLOAT_RE):
            kind, values = "float", _cast(pa, pc, col, pa.float64())
        if values is None:  # text, or numerals only Python reads (" 5", "1_000", "+5", 2**70)
            raw = col.to_pylist()
            kind = infer_type(v for v in raw if v is not None)
            values = [None if v is None else convert(v, kind, h) for v in raw]
        types.append(kind)
        cols.append(values)
    return _csv_schema(path, header, types), list(zip(*cols, strict=True))


def _cast(pa: Any, pc: Any, col: Any, to: Any) -> list[Any] | None:
    try:
        return pc.cast(col, to).to_pylist()
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return None


def _all_match(pc: Any, col: Any, pattern: str) -> bool:
    return col.null_count < len(col) and pc.all(pc.match_substring_regex(col, pattern)).as_py()


def _csv_header(path: Path) -> list[str]:
    try:
        with path.open(newline="") as f:
            header = next(csv.reader(f), None)
    except UnicodeDecodeError:
        raise _ArrowFallback("not text") from None
    if not header or len(set(header)) != len(header):
        raise _ArrowFallback("no header")
    return [h.strip() for h in header]


def _csv_schema(path: Path, header: list[str], types: list[str]) -> Schema:
    # Identifier-like columns (ids, stations, segments) stay text even when they look numeric.
    types = [("str" if _is_identifier(h) else t) for h, t in zip(header, types, strict=True)]
    time = "time" if "time" in header else None
    if time is not None and types[header.index("time")] == "str":
        raise TableError(f"{path}: column 'time' must hold epoch seconds")
    return Schema([Field(h, t) for h, t in zip(header, types, strict=True)], time=time)


def _load_csv_python(path: Path) -> tuple[Schema, list[tuple]]:
    header, raw = read_csv_columns(path)
    types = [infer_type(r[i] for r in raw) for i in range(len(header))]
    schema = _csv_schema(path, header, types)
    types = [f.type for f in schema.fields]
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
    except Exception as e:  # noqa: BLE001 - pyarrow raises several types for a bad file
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
    cols = [
        column_converter(table.column(i).type, f.type, f.name)(table.column(i))
        for i, f in enumerate(fields)
    ]
    return schema, list(zip(*cols, strict=True)) if cols else []


def column_converter(arrow_type: Any, kind: str, name: str) -> Callable[[Any], list[Any]]:
    """One converter for a whole Arrow column into field type `kind`, chosen once per column:
    values already of that type come out as they are (in C); others go through `convert`, the
    same rule as a value at a time ('' and None become None)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    t = arrow_type
    if kind == "int" and pa.types.is_integer(t):
        return lambda col: col.to_pylist()
    if kind == "float" and pa.types.is_floating(t):
        return lambda col: col.to_pylist()
    if kind == "bool" and pa.types.is_boolean(t):
        return lambda col: col.to_pylist()
    if kind == "str" and (pa.types.is_string(t) or pa.types.is_large_string(t)):
        # '' is NULL, as in a CSV file
        return lambda col: pc.if_else(pc.equal(col, ""), pa.scalar(None, t), col).to_pylist()
    if kind == "str" and pa.types.is_integer(t):
        return lambda col: pc.cast(col, pa.string()).to_pylist()
    return lambda col: [convert(v, kind, name) for v in col.to_pylist()]
