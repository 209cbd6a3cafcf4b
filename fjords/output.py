"""Result rows as NDJSON, the form the command-line tools print: one object per row, with the
query's 0-based index under "query" (windowed rows carry window_start and window_end)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TextIO


def ndjson_printer(
    index: int, columns: tuple[str, ...], out: TextIO
) -> Callable[[list[tuple]], None]:
    """A sink batch callback writing each row of query `index` as one JSON line."""

    def emit(rows: list[tuple]) -> None:
        for row in rows:
            obj: dict[str, Any] = {"query": index, **dict(zip(columns, row, strict=True))}
            out.write(json.dumps(obj))
            out.write("\n")

    return emit
