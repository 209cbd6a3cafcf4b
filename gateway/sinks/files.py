"""File sink: a query's rows appended to NDJSON or Parquet files under the sinks directory.

Files are `<dir>/<query id>-<UTC start>-<n>.ndjson|.parquet`, never rewritten, rotated after
`rotate_mb` MiB or `rotate_s` seconds. An NDJSON line is the row exactly as an SSE client gets it
(`json.dumps`), written at once (a reader may tail it). A Parquet file becomes visible when it is
complete: it is written under a hidden name and renamed on rotation, so a reader never sees a
file without its footer. Writing runs in a worker thread: a slow disk never stalls the Fjord.
A write that fails drops its batch (counted, `write_error`) and the next batch opens a new file.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from pathlib import Path
from typing import IO, Any

from gateway.results import Subscription
from gateway.sinks.base import ResultSink
from gateway.sinks.spec import FileSinkSpec, MiB, resolve_under

log = logging.getLogger("gateway.sinks")


def _default(o: object) -> object:
    if isinstance(o, float | int):
        return o
    return str(o)


class _Writer:
    """One open file: NDJSON lines, or Parquet row groups (pyarrow)."""

    def __init__(self, directory: Path, stem: str, fmt: str) -> None:
        self.fmt = fmt
        self.final = directory / f"{stem}.{fmt}"
        self.opened = time.monotonic()
        self.bytes = 0
        self.rows = 0
        self._ndjson: IO[bytes] | None = None
        self._parquet: Any = None
        self._parquet_file: IO[bytes] | None = None
        self._schema: Any = None
        if fmt == "ndjson":
            self.path = self.final
            self._ndjson = open(self.path, "xb")  # noqa: SIM115 - kept open across batches
        else:
            self.path = directory / f".{stem}.{fmt}.part"

    def write(self, rows: list[dict[str, Any]]) -> None:
        if self._ndjson is not None:
            data = "".join(json.dumps(r, default=_default) + "\n" for r in rows).encode()
            self._ndjson.write(data)
            self._ndjson.flush()
            self.bytes += len(data)
        else:
            import pyarrow as pa
            import pyarrow.parquet as pq

            table = pa.Table.from_pylist(rows)
            if self._parquet is None:
                self._schema = table.schema
                self._parquet_file = open(self.path, "wb")  # noqa: SIM115 - closed in close()
                self._parquet = pq.ParquetWriter(self._parquet_file, self._schema)
            elif table.schema != self._schema:
                table = table.cast(self._schema)  # a mismatch raises: the caller rotates
            self._parquet.write_table(table)
            assert self._parquet_file is not None
            self.bytes = self._parquet_file.tell()
        self.rows += len(rows)

    def close(self) -> Path | None:
        """Finish the file; returns its final path (None for an empty Parquet file)."""
        if self._ndjson is not None:
            self._ndjson.flush()
            os.fsync(self._ndjson.fileno())
            self._ndjson.close()
            self._ndjson = None
            return self.final
        if self._parquet is None:
            return None
        self._parquet.close()
        self._parquet = None
        assert self._parquet_file is not None
        self._parquet_file.flush()
        os.fsync(self._parquet_file.fileno())
        self._parquet_file.close()
        os.replace(self.path, self.final)
        return self.final


class FileSink(ResultSink):
    kind = "file"

    def __init__(
        self, query_id: str, spec: FileSinkSpec, sub: Subscription, root: str | Path
    ) -> None:
        super().__init__(query_id, spec, sub)
        self.spec: FileSinkSpec = spec
        self.directory = resolve_under(root, spec.path or query_id)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._writer: _Writer | None = None
        self._seq = 0
        self.files: list[str] = []  # finished files, newest last (the last 20)
        self.current: str | None = None

    def _open(self) -> _Writer:
        """A new file, never one that exists (a restart within the same second included)."""
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        for _ in range(10_000):
            self._seq += 1
            stem = f"{self.query_id}-{stamp}Z-{self._seq:04d}"
            if (self.directory / f"{stem}.{self.spec.format}").exists():
                continue
            try:
                return _Writer(self.directory, stem, self.spec.format)
            except FileExistsError:
                continue
        raise OSError(f"no free file name in {self.directory}")

    def _rotate(self) -> None:
        w, self._writer = self._writer, None
        self.current = None
        if w is not None:
            done = w.close()
            if done is not None:
                self.files = [*self.files[-19:], done.name]

    def _due(self) -> bool:
        w = self._writer
        if w is None:
            return False
        age = time.monotonic() - w.opened
        return w.bytes >= self.spec.rotate_mb * MiB or age >= self.spec.rotate_s

    def _write(self, rows: list[dict[str, Any]]) -> None:
        """In a worker thread: one batch, opening or rotating files as needed."""
        if self._due():
            self._rotate()
        if self._writer is None:
            self._writer = self._open()
            self.current = self._writer.final.name
        try:
            self._writer.write(rows)
        except (TypeError, ValueError, ArithmeticError) as e:  # Parquet: the schema changed
            if self._writer.rows == 0:
                raise
            log.info("file sink of query %s: new file for a new row shape (%s)", self.query_id, e)
            self._rotate()
            self._writer = self._open()
            self.current = self._writer.final.name
            self._writer.write(rows)
        if self._due():
            self._rotate()

    async def _flush(self, rows: list[dict[str, Any]]) -> None:
        try:
            await asyncio.to_thread(self._write, rows)
        except Exception as e:  # noqa: BLE001 - a disk error: counted, the sink goes on
            self.error(f"{type(e).__name__}: {e}"[:300])
            self.drop("write_error", len(rows))
            try:
                await asyncio.to_thread(self._rotate)
            except Exception:  # noqa: BLE001
                self._writer = None
        else:
            self.sent(len(rows))

    async def run(self) -> None:
        linger = self.spec.batch_ms / 1000
        while True:
            wait = self.spec.rotate_s
            if self._writer is not None:
                wait = max(0.0, self.spec.rotate_s - (time.monotonic() - self._writer.opened))
            rows = await self.collect(self.spec.batch_rows, linger, first_wait=wait)
            if rows is None:
                break
            if rows:
                await self._flush(rows)
            elif self._due():  # an idle file still rotates on time
                await asyncio.to_thread(self._rotate)
        await asyncio.to_thread(self._rotate)

    async def close(self) -> None:
        rows = self.take_pending()
        if rows:
            await self._flush(rows)
        await asyncio.to_thread(self._rotate)

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out.update(directory=str(self.directory), current_file=self.current, files=self.files)
        return out
