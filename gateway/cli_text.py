"""How the command line prints: result rows as table cells, and a query's plan as text."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

#: Columns holding event times (epoch seconds), printed as UTC times in tables.
TIME_COLUMNS = frozenset({"time", "window_start", "window_end", "as_of", "last_seen", "last_time"})


def cell_text(v: object, column: str = "") -> str:
    """A value for a table cell: times as `2026-11-23 14:15:00Z`, floats to 3 places, NULL empty."""
    if v is None:
        return ""
    if column in TIME_COLUMNS and isinstance(v, int | float) and not isinstance(v, bool):
        return time_text(float(v))
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def time_text(epoch: float) -> str:
    try:
        dt = datetime.fromtimestamp(epoch, UTC)
    except (OverflowError, OSError, ValueError):
        return str(epoch)
    text = dt.strftime("%Y-%m-%d %H:%M:%S")
    if dt.microsecond:
        text += f".{dt.microsecond // 1000:03d}"
    return text + "Z"


def explain_text(sql: str, plan: dict[str, Any]) -> str:
    """A dry run's plan as text an operator reads (`--json` gives the document itself)."""
    shared = plan.get("shared") or {}
    lines = [
        f"query:      {' '.join(sql.split())}",
        f"stream:     {plan.get('stream')} ({plan.get('shape')})",
        f"columns:    {', '.join(plan.get('columns') or [])}",
        "filter:     "
        + (" AND ".join(plan.get("predicates") or []) or "(none)")
        + "   -- in the stream's shared router",
    ]
    if plan.get("group_filter"):
        lines.append(
            "groups:     "
            + " AND ".join(plan["group_filter"])
            + "   -- on the window's rows, after the (shareable) aggregate"
        )
    n = shared.get("queries_already_sharing")
    if n:
        lines.append(f"router:     shared with {n} running quer{'y' if n == 1 else 'ies'}")
    if shared.get("same_filter_as"):
        lines.append(f"same filter as: {', '.join(shared['same_filter_as'])}")
    if plan.get("aggregate_shared_with"):
        lines.append(
            f"aggregate:  shares the running window aggregate of "
            f"{', '.join(plan['aggregate_shared_with'])}"
        )
    ops = []
    for op in plan.get("operators") or []:
        name, kind = op.get("name"), op.get("operator")
        ops.append(kind if not name or name == kind else f"{kind} ({name})")
    lines.append(f"operators:  {' -> '.join(ops)}")
    for op in plan.get("operators") or []:
        if op.get("levels"):  # ROLLUP, GROUPING SETS, DRILLDOWN: the grouping sets
            lines.append(f"levels:     {', '.join(op['levels'])}")
        if op.get("pruning"):
            lines.append(f"pruning:    {op['pruning']}")
        if op.get("emit"):  # EMIT CHANGES: the rhythm of the early rows
            lines.append(f"emit:       {op['emit']}")
        if op.get("emit_every_rows"):  # EMIT EVERY n ROWS [PARTITIONED BY col]
            part = re.search(r"partitioned by ([\w.]+)", str(plan.get("shape")))
            lines.append(
                f"emit:       every {op['emit_every_rows']} rows"
                + (f" of each {part.group(1)}" if part else " of the query's input")
                + f", the aggregate over (t - {op.get('range'):g} s, t] at its reading's time t"
            )
    sampling = plan.get("sampling")
    if sampling:  # SAMPLE EVERY n ROWS
        lines.append(
            f"sample:     {sampling.get('clause')}: counted {sampling.get('counted')}; "
            f"{sampling.get('where')}"
        )
    if plan.get("priority") is not None:
        lines.append(f"priority:   {plan['priority']}   -- the scheduler tickets of its operators")
    changes = plan.get("sensor_changes") or []
    if changes:
        lines.append("sensors that would change:")
        for c in changes:
            before, after = c.get("before") or {}, c.get("after") or {}
            lines.append(
                f"  {c.get('sensor')}: {_program_text(before)} -> {_program_text(after)}"
                + (f"  ({c['reason']})" if c.get("reason") else "")
                + (f"  [now for {', '.join(c['consumers'])}]" if c.get("consumers") else "")
            )
    else:
        lines.append("sensors:    no program or rate change")
    return "\n".join(lines)


def _program_text(p: dict[str, Any]) -> str:
    out = str(p.get("program"))
    if p.get("sample_rate_hz") is not None:
        out += f" at {p['sample_rate_hz']:g} Hz"
    if p.get("power_mw") is not None:
        out += f", {p['power_mw']:.3f} mW"
    if p.get("battery_days") is not None:
        out += f", {p['battery_days']:.1f} days"
    return out
