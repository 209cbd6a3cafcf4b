"""Scans: where a static table enters a plan, through a pull queue."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fjords.runtime.operators.base import Operator
from fjords.runtime.queues import Queue

if TYPE_CHECKING:
    from fjords.tables import Table


class TableScan(Operator):
    """Produces a static table's rows, `batch` per transition; `rewind` starts over (new version)."""

    kind = "table_scan"

    def __init__(self, table: Table, output: Queue, **kw: Any) -> None:
        super().__init__([], [output], name=kw.pop("name", f"scan:{table.name}"), **kw)
        self.table = table
        self._pos = 0
        self._rows = table.rows
        self.version = table.version

    def rewind(self) -> None:
        self._pos = 0
        self._rows = self.table.rows
        self.version = self.table.version

    @property
    def exhausted(self) -> bool:
        return self._pos >= len(self._rows)

    def transition(self) -> bool:
        rows, pos = self._rows, self._pos
        if pos >= len(rows):
            return False
        end = min(pos + self.batch, len(rows))
        for i in range(pos, end):
            self.emit(rows[i])
        self.tuples_out += end - pos
        self._pos = end
        return True

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "table": self.table.name, "rows": len(self.table.rows)}
