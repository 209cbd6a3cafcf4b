"""How much one query may ask of the gateway: checked when planned where the plan tells, and at
run time otherwise (the query then fails alone, the others go on).

The defaults suit an edge gateway (one small board, tens of queries, minutes-to-days windows);
every one is a constructor parameter so the daemon's configuration can change it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields

from fjords.errors import LimitExceeded


@dataclass(frozen=True, slots=True)
class Limits:
    # A window is cut into panes of gcd(range, slide): 1 DAY sliding by 1 ms is 86.4M panes.
    max_panes_per_window: int = 10_000
    # How many windows one pane belongs to (range / slide): each is emitted when it closes.
    max_windows_per_pane: int = 10_000
    # Windows emitted per transition of an aggregate: closing yields to the loop in between.
    max_windows_per_transition: int = 64
    max_rows_window: int = 100_000  # ROWS n
    max_groups_per_window: int = 10_000  # also bounds the rows one window emits at once
    max_state_bytes_per_query: int = 64 * 1024 * 1024  # estimated, for windowed state
    # Tuples one side of a stream-stream join holds (its open windows); past it the oldest
    # window is dropped, counted (fjords.runtime.operators.joins.SymmetricHashJoin `dropped`).
    max_join_rows: int = 100_000
    max_in_list: int = 1_000
    max_sql_chars: int = 16 * 1024
    max_queries: int = 1_000
    # Rows a UNION ALL's merge holds for a slow branch before it stops waiting (then counted).
    max_union_held_rows: int = 100_000
    # Readings a snapshot takes one by one (one not answerable from per-sensor aggregates);
    # it runs on the event loop, at about a microsecond each.
    max_snapshot_readings: int = 2_000_000
    # History readings a new query is filled from at once (its open windows, or `since`).
    max_backfill_readings: int = 2_000_000

    @classmethod
    def from_mapping(cls, values: Mapping[str, object]) -> Limits:
        """From a configuration table (`[limits]`): unknown keys and non-positive integers are
        refused with the known names, so a typo is not silently a default."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown limits {unknown}; known: {', '.join(sorted(known))}")
        for k, v in values.items():
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"limit {k} must be a positive integer, not {v!r}")
        return cls(**values)  # type: ignore[arg-type]

    def check(self, limit: str, value: float, what: str) -> None:
        """Raise LimitExceeded when `value` is over the named limit."""
        maximum = getattr(self, limit)
        if value > maximum:
            raise LimitExceeded(limit, value, maximum, what)


DEFAULT_LIMITS = Limits()
