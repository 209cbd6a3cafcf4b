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
        # A query that failed at run time is kept with its error and restored as failed.
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(queries)")}
        if "error" not in columns:
            self._db.execute("ALTER TABLE queries ADD COLUMN error TEXT")
        # Result row ids below this were (or may have been) given out: a restart goes on after
        # them, so an id a client remembers (?since=, Last-Event-ID) is never reused.
        if "row_ids_leased" not in columns:
            self._db.execute("ALTER TABLE queries ADD COLUMN row_ids_leased INTEGER")

    def save(self, query_id: str, sql: str, options: dict[str, Any]) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO queries (id, sql, options, created) VALUES (?, ?, ?, ?)",
            (query_id, sql, json.dumps(options), time.time()),
        )

    def mark_failed(self, query_id: str, error: str) -> None:
        self._db.execute("UPDATE queries SET error = ? WHERE id = ?", (error, query_id))

    def first_row_id(self, query_id: str) -> int:
        """The first result row id this run may give the query (1 for a new query)."""
        row = self._db.execute(
            "SELECT row_ids_leased FROM queries WHERE id = ?", (query_id,)
        ).fetchone()
        return int(row[0]) if row and row[0] else 1

    def lease_row_ids(self, query_id: str, below: int) -> None:
        """Ids below `below` may be given out by this run."""
        self._db.execute(
            "UPDATE queries SET row_ids_leased = ? WHERE id = ?", (int(below), query_id)
        )

    def load_all(self) -> list[tuple[str, str, dict[str, Any], str | None]]:
        """Every saved query with its error (None unless it failed at run time)."""
        rows = self._db.execute(
            "SELECT id, sql, options, error FROM queries ORDER BY created, id"
        ).fetchall()
        return [(qid, sql, json.loads(opts), err) for qid, sql, opts, err in rows]

    def rename(self, query_id: str, new_id: str) -> None:
        """The saved query under another id, with everything saved with it."""
        self._db.execute("UPDATE queries SET id = ? WHERE id = ?", (new_id, query_id))

    def delete(self, query_id: str) -> None:
        self._db.execute("DELETE FROM queries WHERE id = ?", (query_id,))

    def load(self) -> list[tuple[str, str, dict[str, Any]]]:
        rows = self._db.execute(
            "SELECT id, sql, options FROM queries ORDER BY created, id"
        ).fetchall()
        return [(qid, sql, json.loads(opts)) for qid, sql, opts in rows]

    def close(self) -> None:
        self._db.close()
