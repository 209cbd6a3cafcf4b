"""What a query needs from a stream's sensors: the one contract between the query compiler,
which derives it from a query (`fjords.compile.analysis`), and the sensor proxies, which turn
it into programs, sample rates and sleep (`proxies.demand`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Demand:
    """What a query needs from its sensors: the proxies turn this into programs and sample rates."""

    stream: str
    sample_period_s: float | None
    lifetime_s: float | None
    fields: tuple[str, ...]
    atoms: tuple[tuple[str, str, object], ...]  # (field, op, constant) every result satisfies
    filtered_only_by_atoms: bool  # no other condition on the stream (a pushed-down filter is exact)
    aggregates: tuple[tuple[str, str | None], ...]  # (func, field or None for COUNT(*))
    window: tuple[float, float] | None  # (range_s, slide_s) of a time window
    group_by: tuple[str, ...]
    sample_every_rows: int | None = None  # SAMPLE EVERY n ROWS: each sensor's n-th readings
