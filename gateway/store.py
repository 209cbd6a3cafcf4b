"""Registered queries survive restarts: kept in SQLite in the state directory."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any


class QueryStore:
    def __init__(self, state_dir: str | Path) -> None:
        self.path = Path(state_dir).expanduser() / "queries.sqlite3"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(
            self.path, isolation_level=None
        )  # autocommit: each write is durable
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS queries ("
            " id TEXT PRIMARY KEY, sql TEXT NOT NULL, options TEXT NOT NULL, created REAL NOT NULL)"
        )

    def save(self, query_id: str, sql: str, options: dict[str, Any]) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO queries (id, sql, options, created) VALUES (?, ?, ?, ?)",
            (query_id, sql, json.dumps(options), time.time()),
        )

    def delete(self, query_id: str) -> None:
        self._db.execute("DELETE FROM queries WHERE id = ?", (query_id,))

    def load(self) -> list[tuple[str, str, dict[str, Any]]]:
        rows = self._db.execute(
            "SELECT id, sql, options FROM queries ORDER BY created, id"
        ).fetchall()
        return [(qid, sql, json.loads(opts)) for qid, sql, opts in rows]

    def close(self) -> None:
        self._db.close()
