"""Recorded traces (CSV or Parquet, in time order) as streams of tuples, each row extended with
its station's static attributes (e.g. METR-LA's stations.csv: latitude, longitude, segment)."""

from __future__ import annotations

import contextlib
import csv
import os
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

from fjords.schema import Field, Schema, convert
from fjords.tables import Table, TableError, _is_identifier, column_converter, infer_type

SENSOR_COLUMNS = ("station", "sensor", "sensor_id", "mote")
_SNIFF_ROWS = 2000
BATCH_ROWS = 65_536  # rows per batch of a Parquet trace (and of the Python reader)
# A decimal numeral that Python's int() and pyarrow's cast to int64 read alike.
_PLAIN_INT = r"^-?[0-9]{1,18}$"
MANY_WORDS = 4_096  # distinct integers in a batch above which they are cast by pyarrow
BLOCK_BYTES = 1 << 20  # bytes of CSV per batch (about 40,000 METR-LA rows)
SMALL_BYTES = 1 << 20  # a smaller CSV file is read by the Python rules alone


class _ArrowFallback(Exception):
    """pyarrow cannot read the rest exactly as the Python rules would."""


def _chunks(rows: Iterator[tuple], n: int) -> Iterator[list[tuple]]:
    """Lists of `n` rows; the rows before an error are yielded before it is raised."""
    batch: list[tuple] = []
    try:
        for row in rows:
            batch.append(row)
            if len(batch) == n:
                yield batch
                batch = []
    except TableError:
        if batch:
            yield batch
        raise
    if batch:
        yield batch


class Trace:
    """A trace file plus optional station attributes; iterate `rows()` for tuples in file order."""

    def __init__(
        self, path: str | os.PathLike[str], stations: str | os.PathLike[str] | None = None
    ) -> None:
        self.path = Path(path)
        self._parquet = self.path.suffix.lower() in (".parquet", ".pq")
        if not self.path.is_file():
            raise TableError(f"trace file not found: {self.path}")
        self.stations = Table.from_file("stations", stations) if stations else None
        self._columns, self._types = self._sniff()
        if "time" not in self._columns:
            raise TableError(f"{self.path}: a trace needs a 'time' column (epoch seconds)")
        self.sensor_field = next((c for c in SENSOR_COLUMNS if c in self._columns), None)
        extra: list[Field] = []
        self._attrs: dict[object, tuple] = {}
        self.attributes: dict[object, dict[str, object]] = {}
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
            names = [st.names[i] for i in keep]
            # each sensor's static attributes (a hierarchy's functional dependencies: DRILLDOWN)
            self.attributes = {k: dict(zip(names, v, strict=True)) for k, v in self._attrs.items()}
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
        for batch in self.batches():
            yield from batch

    def batches(self) -> Iterator[list[tuple]]:
        """The rows in lists of up to BATCH_ROWS, read by pyarrow with one converter per column.

        Where pyarrow cannot read the file exactly as the Python rules would (a bad value, a
        ragged line, a numeral only Python reads), the rest is read value by value from the first
        row not yet returned, so the error names its line."""
        if not self._parquet and self.path.stat().st_size < SMALL_BYTES:
            yield from _chunks(self._python_rows(), BATCH_ROWS)  # not worth importing pyarrow
            return
        done = 0
        reader = self._arrow_batches()
        with contextlib.closing(reader):
            while True:
                try:
                    batch = next(reader)
                except StopIteration:
                    return
                except _ArrowFallback:
                    break
                yield batch
                done += len(batch)
        yield from _chunks(self._python_rows(skip=done), BATCH_ROWS)

    def _arrow_batches(self) -> Generator[list[tuple], None, None]:
        import pyarrow as pa

        convs = self._converters()
        attrs, pad = self._attrs, getattr(self, "_pad", ())
        si = self._columns.index(self.sensor_field) if self.sensor_field and attrs else None
        get = attrs.get
        try:
            for batch in self._arrow_reader():
                cols = [conv(col) for conv, col in zip(convs, batch.columns, strict=True)]
                if si is None:
                    yield list(zip(*cols, strict=True))
                else:  # the station's attributes: one shared tuple per station
                    yield [r + get(r[si], pad) for r in zip(*cols, strict=True)]
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, ValueError) as e:
            raise _ArrowFallback(str(e)) from None

    def _arrow_reader(self) -> Iterator:
        """Record batches of the file's columns, in the sniffed types where pyarrow reads them."""
        import pyarrow as pa

        if self._parquet:
            import pyarrow.parquet as pq

            yield from pq.ParquetFile(self.path).iter_batches(batch_size=BATCH_ROWS)
            return
        import pyarrow.csv as pacsv

        # Integers and text are read as text, dictionary-encoded: a sensor id repeats on every
        # reading and a time on every sensor's reading of a round, so each distinct value
        # becomes a Python object once (`_converters`), by Python's rules (int() refuses the
        # '0x10' that pyarrow's integer parser reads as 16).
        words = pa.dictionary(pa.int32(), pa.string())
        arrow = {"int": words, "float": pa.float64(), "str": words}
        reader = pacsv.open_csv(
            self.path,
            # One thread: a batch is parsed while nothing else waits for it, and pyarrow's
            # threads cost twice the CPU time for the same batch (a core the Fjord could use).
            read_options=pacsv.ReadOptions(
                column_names=self._columns, skip_rows=1, block_size=BLOCK_BYTES, use_threads=False
            ),
            convert_options=pacsv.ConvertOptions(
                column_types={c: arrow[t] for c, t in zip(self._columns, self._types, strict=True)},
                null_values=[""],
                strings_can_be_null=True,
                quoted_strings_can_be_null=True,
            ),
        )
        yield from reader

    def _converters(self) -> list[Callable[[Any], list[Any]]]:
        if self._parquet:
            import pyarrow.parquet as pq

            schema = pq.read_schema(self.path)
            return [
                column_converter(schema.field(c).type, t, c)
                for c, t in zip(self._columns, self._types, strict=True)
            ]

        import numpy as np
        import pyarrow as pa

        def each(col: Any, words_of: Callable[[Any], list[Any]]) -> list[Any]:
            """Every value of a dictionary-encoded column: `words_of` converts the distinct
            values (the dictionary, an Arrow array without nulls) once."""
            if not isinstance(col, pa.DictionaryArray):
                col = col.dictionary_encode()
            words = words_of(col.dictionary)
            if col.null_count:
                return [None if i is None else words[i] for i in col.indices.to_pylist()]
            # The distinct values as an array of those same objects, taken by the indices in
            # numpy: a third of the cost of a Python int and a lookup per value. The indices
            # are read from their buffer: pyarrow's own conversions to numpy import pandas
            # where it is installed (~170 ms).
            ind = col.indices
            kind = np.dtype(f"int{ind.type.bit_width}")
            at = np.frombuffer(ind.buffers()[1], kind, len(ind), ind.offset * kind.itemsize)
            table = np.empty(len(words), dtype=object)
            table[:] = words
            return table[at].tolist()

        def ints(words: Any) -> list[Any]:
            # Few distinct values (a time per sampling round): Python's int() on each. Many (a
            # time per reading): plain decimal numerals that fit 64 bits read the same cast by
            # pyarrow, in C; anything else still goes through int().
            if len(words) > MANY_WORDS:
                import pyarrow.compute as pc

                if pc.all(pc.match_substring_regex(words, _PLAIN_INT)).as_py():
                    return words.cast(pa.int64()).to_pylist()
            return list(map(int, words.to_pylist()))

        def as_int(col: Any) -> list[Any]:
            return each(col, ints)

        def as_text(col: Any) -> list[Any]:
            return each(col, lambda words: words.to_pylist())

        def as_is(col: Any) -> list[Any]:
            return col.to_pylist()

        convs = {"int": as_int, "str": as_text}
        return [convs.get(t, as_is) for t in self._types]

    def _python_rows(self, skip: int = 0) -> Iterator[tuple]:
        """The rows value by value (the exact rules and errors), after the first `skip`."""
        attrs, pad = self._attrs, getattr(self, "_pad", ())
        si = self._columns.index(self.sensor_field) if self.sensor_field and self._attrs else None
        types, names = self._types, self._columns
        for lineno, raw in self._raw_rows():
            if skip:
                skip -= 1
                continue
            if len(raw) != len(names):
                raise TableError(
                    f"{self.path}:{lineno}: expected {len(names)} values, got {len(raw)}"
                )
            try:
                base = tuple(convert(v, t, n) for v, t, n in zip(raw, types, names, strict=True))
            except Exception as e:  # noqa: BLE001 - any conversion error names its line
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
