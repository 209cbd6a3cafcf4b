"""Recorded traces (CSV or Parquet, in time order) as streams of tuples, each row extended with
its station's static attributes (e.g. METR-LA's stations.csv: latitude, longitude, segment)."""

from __future__ import annotations

import csv
import os
from collections.abc import Iterator
from pathlib import Path

from fjords.schema import Field, Schema, convert
from fjords.tables import Table, TableError, _is_identifier, infer_type

SENSOR_COLUMNS = ("station", "sensor", "sensor_id", "mote")
_SNIFF_ROWS = 2000


class Trace:
    """A trace file plus optional station attributes; iterate `rows()` for tuples in file order."""

    def __init__(
        self, path: str | os.PathLike[str], stations: str | os.PathLike[str] | None = None
    ) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise TableError(f"trace file not found: {self.path}")
        self.stations = Table.from_file("stations", stations) if stations else None
        self._columns, self._types = self._sniff()
        if "time" not in self._columns:
            raise TableError(f"{self.path}: a trace needs a 'time' column (epoch seconds)")
        self.sensor_field = next((c for c in SENSOR_COLUMNS if c in self._columns), None)
        extra: list[Field] = []
        self._attrs: dict[object, tuple] = {}
        if self.stations is not None:
            st = self.stations.schema
            key = next((c for c in SENSOR_COLUMNS if c in st), None)
            if key is None or key not in self._columns:
                raise TableError(
                    f"stations file needs a column matching the trace's sensor column ({self.sensor_field})"
                )
            ki = st.index(key)
            keep = [i for i, n in enumerate(st.names) if n != key and n not in self._columns]
            extra = [st.fields[i] for i in keep]
            self._attrs = {row[ki]: tuple(row[i] for i in keep) for row in self.stations.rows}
            self._pad = (None,) * len(keep)
        self.schema = Schema(
            [Field(c, t) for c, t in zip(self._columns, self._types, strict=True)] + extra,
            time="time",
        )

    def _sniff(self) -> tuple[list[str], list[str]]:
        if self.path.suffix.lower() in (".parquet", ".pq"):
            import pyarrow.parquet as pq

            schema = pq.read_schema(self.path)
            types = []
            for f in schema:
                t = str(f.type)
                kind = (
                    "int"
                    if t.startswith(("int", "uint"))
                    else "float"
                    if t.startswith(("float", "double"))
                    else "str"
                )
                types.append("str" if _is_identifier(f.name) else kind)
            return list(schema.names), types
        with self.path.open(newline="") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if not header:
                raise TableError(f"{self.path}: empty trace (a header row is required)")
            sample = [r for _, r in zip(range(_SNIFF_ROWS), reader, strict=False)]
        header = [h.strip() for h in header]
        types = []
        for i, h in enumerate(header):
            t = infer_type(r[i] for r in sample if i < len(r))
            types.append(
                "str" if _is_identifier(h) else ("float" if t == "int" and h != "time" else t)
            )
        return header, types

    def rows(self) -> Iterator[tuple]:
        """Tuples in the stream's schema, in file order; a malformed line raises TableError."""
        attrs, pad = self._attrs, getattr(self, "_pad", ())
        si = self._columns.index(self.sensor_field) if self.sensor_field and self._attrs else None
        types, names = self._types, self._columns
        for lineno, raw in self._raw_rows():
            if len(raw) != len(names):
                raise TableError(
                    f"{self.path}:{lineno}: expected {len(names)} values, got {len(raw)}"
                )
            try:
                base = tuple(convert(v, t, n) for v, t, n in zip(raw, types, names, strict=True))
            except Exception as e:
                raise TableError(f"{self.path}:{lineno}: {e}") from None
            yield base + attrs.get(base[si], pad) if si is not None else base

    def _raw_rows(self) -> Iterator[tuple[int, list]]:
        if self.path.suffix.lower() in (".parquet", ".pq"):
            import pyarrow.parquet as pq

            pf = pq.ParquetFile(self.path)
            n = 1
            for batch in pf.iter_batches(batch_size=65536):
                cols = [c.to_pylist() for c in batch.columns]
                for vals in zip(*cols, strict=True):
                    n += 1
                    yield n, list(vals)
            return
        with self.path.open(newline="") as f:
            reader = csv.reader(f)
            next(reader, None)
            for lineno, row in enumerate(reader, start=2):
                if row:
                    yield lineno, row
