"""A stream's window as both engines run it, checked against the limits."""

from __future__ import annotations

import math

from fjords.compile.analysis.bound import MAX_DURATION_S
from fjords.compile.sql import ast
from fjords.errors import QueryError
from fjords.limits import DEFAULT_LIMITS, Limits


def window_spec(
    w: ast.Window, emit_every: float | None, limits: Limits = DEFAULT_LIMITS
) -> tuple[float, float, bool]:
    if w.rows is not None:
        if emit_every is not None:
            raise QueryError("EMIT EVERY applies to time windows; use [ROWS n SLIDE m]")
        if w.rows < 1 or (w.rows_slide is not None and w.rows_slide < 1):
            raise QueryError("ROWS windows need positive sizes")
        limits.check("max_rows_window", w.rows, "ROWS window size")
        step = w.rows_slide or w.rows
        limits.check("max_windows_per_pane", -(-w.rows // step), "ROWS windows holding each row")
        return float(w.rows), float(step), True
    range_s, slide = time_window(w, emit_every)
    for name, seconds in (("RANGE", range_s), ("SLIDE", slide)):
        if seconds > MAX_DURATION_S:
            raise QueryError(
                f"{name} {seconds:g} seconds is too large (at most {MAX_DURATION_S:g})"
            )
    range_ms, slide_ms = round(range_s * 1000), round(slide * 1000)
    if range_ms < 1:
        raise QueryError(f"RANGE must be at least 1 millisecond (got {range_s:g} seconds)")
    if slide_ms < 1:
        raise QueryError(f"SLIDE must be at least 1 millisecond (got {slide:g} seconds)")
    pane = math.gcd(range_ms, slide_ms)
    limits.check(
        "max_panes_per_window",
        range_ms // pane,
        f"RANGE {range_s:g} s with SLIDE {slide:g} s cuts each window into panes",
    )
    limits.check(
        "max_windows_per_pane",
        -(-range_ms // slide_ms),
        f"RANGE {range_s:g} s with SLIDE {slide:g} s: windows holding each sample",
    )
    return range_s, slide, False


def time_window(w: ast.Window, emit_every: float | None) -> tuple[float, float]:
    if w.range_s is None or w.range_s <= 0:
        raise QueryError("a window needs a positive RANGE")
    slide = w.slide_s
    if emit_every is not None:
        if slide is not None:
            raise QueryError(
                "give either SLIDE or EMIT EVERY, not both (EMIT EVERY sets how often the window is output)"
            )
        slide = emit_every
    slide = w.range_s if slide is None else slide
    if slide <= 0:
        raise QueryError("SLIDE must be positive")
    if not (math.isfinite(w.range_s) and math.isfinite(slide)):
        raise QueryError("RANGE and SLIDE must be finite durations")
    return w.range_s, slide
