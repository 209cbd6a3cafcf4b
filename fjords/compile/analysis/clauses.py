"""Clause checks: every clause must change the result or be refused at its position.

HAVING without groups, a window or EMIT EVERY on a query without aggregates, a SLIDE longer
than its RANGE, ORDER BY or LIMIT without windows, a stream-stream join without the same
tumbling window on both sides: each is an error naming the clause, never silently ignored.
SELECT DISTINCT and ORDER BY are rewritten here into what both engines run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from itertools import pairwise

from fjords.catalog import StreamInfo
from fjords.compile.analysis.bound import MAX_DURATION_S, WINDOW_COLUMNS
from fjords.compile.analysis.nodes import nodes_of, query_exprs
from fjords.compile.analysis.scope import Scope, output_name
from fjords.compile.expressions import children
from fjords.compile.sql import ast
from fjords.errors import ClauseError, QueryPlanError
from fjords.limits import Limits
from fjords.schema import Schema
from fjords.tables import Table


def check_stream_join(query: ast.Query, scope: Scope, windowed: bool) -> None:
    """The rule of a stream-stream join: both streams have the same tumbling time window
    (`[RANGE r]`, no SLIDE), and a pair joins when both tuples fall in the same window; ROWS
    windows, SLIDE, EMIT EVERY and NOW are refused (each at its position), and so are the
    window bounds where there are no windowed results (no aggregates)."""
    assert scope.right is not None
    if not windowed:
        for e in query_exprs(query):
            for node in nodes_of(e):
                if (
                    isinstance(node, ast.Column)
                    and node.table is None
                    and node.name in WINDOW_COLUMNS
                    and not scope.known(node)
                ):
                    raise QueryPlanError(
                        f"{node.name} is a column of windowed results: without GROUP BY or an "
                        "aggregate a join of two streams outputs each pair as it is found; "
                        "select the streams' time columns instead",
                        *(node.pos or (None, None)),
                    )
    sides = (
        (scope.stream_alias, scope.window, query.sources[0].pos),
        (scope.right_alias, scope.right_window, scope.right_pos),
    )
    rule = (
        "a join of two streams pairs tuples that fall in the same tumbling window, so both "
        "streams need the same [RANGE r] window without SLIDE, e.g. FROM traffic AS a "
        "[RANGE 5 MINUTES], traffic AS b [RANGE 5 MINUTES]"
    )
    for alias, w, pos in sides:
        if w is None:
            raise ClauseError(f"stream {alias!r} has no window: {rule}", pos)
        if w.rows is not None:
            raise ClauseError(
                f"ROWS windows cannot scope a join of two streams (stream {alias!r}): {rule}",
                w.pos,
            )
        if w.slide_s is not None:
            raise ClauseError(f"SLIDE on stream {alias!r}: {rule}", w.pos)
    (_, lw, _), (ralias, rw, _) = sides
    assert lw is not None and rw is not None
    if lw.range_s != rw.range_s:
        raise ClauseError(
            f"the windows differ (RANGE {duration_text(lw.range_s or 0.0)} and "
            f"RANGE {duration_text(rw.range_s or 0.0)}): {rule}",
            rw.pos,
        )
    if query.emit_every_s is not None:
        raise ClauseError(
            f"EMIT EVERY cannot be used with a join of two streams: {rule}; the results of "
            "each window are output when it closes",
            query.pos_of("EMIT EVERY"),
        )
    for e in query_exprs(query):
        for node in nodes_of(e):
            if isinstance(node, ast.Now):
                raise QueryPlanError(
                    "NOW is not supported in a join of two streams; compare the streams' time "
                    f"columns instead (e.g. {scope.stream_alias}.time <= {ralias}.time)",
                    *(node.pos or (None, None)),
                )


def rewrite_distinct(query: ast.Query, scope: Scope) -> tuple[ast.Query, bool]:
    """SELECT DISTINCT without aggregates is GROUP BY its items, per window (both engines run
    that); with aggregates or GROUP BY it removes duplicate result rows of each window.
    Returns the query to plan and whether result rows are deduplicated."""
    if not query.distinct:
        return query, False
    if scope.window is None:
        raise ClauseError(
            "SELECT DISTINCT over a stream needs a window (an unbounded stream never ends, so "
            "its distinct values never do): e.g. SELECT DISTINCT segment FROM traffic "
            "[RANGE 15 MINUTES]",
            query.pos_of("DISTINCT"),
        )
    exprs = [i.expr for i in query.select if isinstance(i, ast.SelectItem)]
    if query.having is not None:
        exprs.append(query.having)
    if query.group_by or any(isinstance(n, ast.Aggregate) for e in exprs for n in nodes_of(e)):
        return query, True
    items: list[ast.SelectItem] = []
    for item in query.select:
        if isinstance(item, ast.SelectItem):
            items.append(item)
            continue
        sides: list[tuple[str, Schema]] = []
        if item.table in (None, scope.stream_alias):
            sides.append((scope.stream_alias, scope.schema))
        if scope.right is not None and item.table in (None, scope.right_alias):
            sides.append((scope.right_alias, scope.right.schema))
        if scope.table is not None and item.table in (None, scope.table_alias):
            sides.append((scope.table_alias, scope.table.schema))
        for alias, schema in sides:
            if scope.right is not None:  # named as `select_names` names a join's stars
                items += [
                    ast.SelectItem(ast.Column(alias, n), f"{alias}.{n}") for n in schema.names
                ]
                continue
            items += [ast.SelectItem(ast.Column(alias, n)) for n in schema.names]
    rewritten = replace(
        query, select=tuple(items), group_by=tuple(i.expr for i in items), distinct=False
    )
    return rewritten, False


def _is_output_ref(e: ast.Expr, names: list[str]) -> bool:
    if isinstance(e, ast.Literal) and isinstance(e.value, int) and not isinstance(e.value, bool):
        return True
    return (
        isinstance(e, ast.Column)
        and e.table is None
        and (e.name in names or e.name in WINDOW_COLUMNS)
    )


def order_hidden(query: ast.Query, names: list[str], distinct: bool) -> list[ast.Expr]:
    """ORDER BY expressions that are not result columns: computed as hidden sort columns."""
    hidden: list[ast.Expr] = []
    for item in query.order_by:
        e = item.expr
        if _is_output_ref(e, names) or e in hidden:
            continue
        if distinct:
            raise QueryPlanError(
                f"with SELECT DISTINCT, ORDER BY must name result columns; "
                f"{ast.to_sql(e)} is not one",
                *(e.pos or (None, None)),
            )
        hidden.append(e)
    return hidden


def check_order_limit(query: ast.Query, windowed: bool) -> None:
    """ORDER BY and LIMIT apply to each window's results: refused where there is none."""
    if not query.order_by and query.limit is None:
        return
    clause = "ORDER BY" if query.order_by else "LIMIT"
    if not windowed:
        raise ClauseError(
            f"{clause} applies to each window's results, and this query has no windowed "
            "aggregate: an unbounded stream cannot be sorted; aggregate over a window, e.g. "
            "SELECT segment, AVG(speed) AS s FROM traffic [RANGE 15 MINUTES] GROUP BY segment "
            "ORDER BY s LIMIT 5",
            query.pos_of(clause),
        )
    if query.limit is not None:
        if not query.order_by:
            raise ClauseError(
                "LIMIT needs ORDER BY to say which rows of each window to keep, e.g. "
                "ORDER BY avg_speed LIMIT 5",
                query.pos_of("LIMIT"),
            )
        if query.limit < 1:
            raise ClauseError("LIMIT must be at least 1", query.pos_of("LIMIT"))


def order_positions(
    query: ast.Query, columns: tuple[str, ...] | list[str], hidden: list[ast.Expr]
) -> tuple[tuple[int, bool], ...]:
    out: list[tuple[int, bool]] = []
    n = len(query.select)
    for item in query.order_by:
        e = item.expr
        if (
            isinstance(e, ast.Literal)
            and isinstance(e.value, int)
            and not isinstance(e.value, bool)
        ):
            if not 1 <= e.value <= n:
                raise QueryPlanError(
                    f"ORDER BY {e.value}: the SELECT list has {n} item{'s' if n != 1 else ''}",
                    *(e.pos or (None, None)),
                )
            pos = e.value - 1
        elif isinstance(e, ast.Column) and e.table is None and e.name in columns:
            pos = list(columns).index(e.name)
        else:
            pos = len(columns) + hidden.index(e)
        out.append((pos, item.descending))
    return tuple(out)


def check_grouped(query: ast.Query, refs: Mapping, hidden: list[ast.Expr]) -> None:
    """Outside aggregates, a windowed query's SELECT and HAVING read only its groups' keys
    (a GROUP BY expression or column) and the window bounds."""
    key_refs = [refs.get((k.table, k.name)) for k in query.group_by if isinstance(k, ast.Column)]

    def visit(e: ast.Expr) -> None:
        if isinstance(e, ast.Aggregate) or e in query.group_by:
            return
        if isinstance(e, ast.Column):
            r = refs.get((e.table, e.name))
            if r is None or r in key_refs:
                return  # a window bound, or a key
            raise QueryPlanError(
                f"column {e.name!r} must appear in GROUP BY or inside an aggregate",
                *(e.pos or (None, None)),
            )
        for c in children(e):
            visit(c)

    for item in query.select:
        if isinstance(item, ast.SelectItem):
            visit(item.expr)
    if query.having is not None:
        visit(query.having)
    for e in hidden:
        visit(e)


def check_unique(names: Iterable[str], query: ast.Query) -> None:
    seen = set()
    for n in names:
        if n in seen:
            pos = next(
                (
                    i.expr.pos
                    for k, i in enumerate(query.select)
                    if isinstance(i, ast.SelectItem) and output_name(i, k) == n
                ),
                None,
            )
            raise QueryPlanError(
                f"two result columns are named {n!r}; give one an alias with AS",
                *(pos or (None, None)),
            )
        seen.add(n)


def duration_text(seconds: float) -> str:
    for unit, size in (("DAY", 86400.0), ("HOUR", 3600.0), ("MINUTE", 60.0), ("SECOND", 1.0)):
        if seconds >= size and seconds % size == 0:
            n = int(seconds // size)
            return f"{n} {unit}{'S' if n != 1 else ''}"
    return f"{seconds:g} SECONDS"


def check_clauses(query: ast.Query, windowed: bool, window: ast.Window | None) -> None:
    """Every clause must change the result or be refused: a clause that would be silently
    ignored (HAVING without groups, a window or EMIT EVERY on a query without aggregates) or
    would silently skip samples (a SLIDE longer than the RANGE) is an error at the clause.
    Shared by both engines through `analyze`."""
    if query.having is not None and not windowed:
        raise ClauseError(
            "HAVING filters groups, but this query has no GROUP BY and no aggregate; "
            "use WHERE to filter rows",
            query.pos_of("HAVING"),
        )
    if query.emit_every_s is not None:
        if not windowed:
            raise ClauseError(
                "EMIT EVERY sets how often an aggregate's window is output, but this query has "
                "no aggregate or GROUP BY: each row is output as it arrives; remove EMIT EVERY",
                query.pos_of("EMIT EVERY"),
            )
        if window is None:
            raise ClauseError(
                "EMIT EVERY needs a window on the stream, e.g. [RANGE 15 MINUTES]",
                query.pos_of("EMIT EVERY"),
            )
        if window.rows is not None:
            raise ClauseError(
                "EMIT EVERY applies to time windows; use [ROWS n SLIDE m]",
                query.pos_of("EMIT EVERY"),
            )
    if window is None:
        return
    if not windowed:
        shown = (
            f"[ROWS {window.rows}]"
            if window.rows is not None
            else f"[RANGE {duration_text(window.range_s or 0.0)}]"
        )
        raise ClauseError(
            f"the window {shown} changes nothing: this query has no aggregate or GROUP BY, so "
            "each row is output as it arrives; remove the window, or aggregate over it "
            "(e.g. SELECT station, AVG(speed) ... GROUP BY station)",
            window.pos,
        )
    if window.rows is not None:
        if window.rows_slide is not None and window.rows_slide > window.rows:
            raise ClauseError(
                f"SLIDE {window.rows_slide} is larger than ROWS {window.rows}: the rows between "
                "windows would be ignored; use a SLIDE of at most the window size",
                window.pos,
            )
        return
    rng = window.range_s
    slide, what, pos = window.slide_s, "SLIDE", window.pos
    if query.emit_every_s is not None and slide is None:
        slide, what, pos = query.emit_every_s, "EMIT EVERY", query.pos_of("EMIT EVERY")
    if rng is not None and slide is not None and slide > rng:
        raise ClauseError(
            f"{what} {duration_text(slide)} is longer than RANGE {duration_text(rng)}: the "
            f"samples between windows would be ignored; use a {what} of at most the RANGE, "
            "or a longer RANGE",
            pos,
        )


def check_changes(
    query: ast.Query, windowed: bool, window: ast.Window | None, joined: bool
) -> None:
    """`EMIT CHANGES [EVERY d | EVERY n ROWS]`: early rows of an aggregate, so an aggregate
    it needs; over a time window `d` must divide the RANGE and the SLIDE (every window then
    has its early rows at the same instants, the last one being its close); without a window
    it is online aggregation since the query began. Each refusal at its clause."""
    c = query.changes
    if c is None:
        return
    at = query.pos_of("EMIT CHANGES")
    if not windowed:
        raise ClauseError(
            "EMIT CHANGES outputs an aggregate while it builds up, but this query has no "
            "aggregate or GROUP BY: each row is output as it arrives; remove EMIT CHANGES",
            at,
        )
    if query.emit_every_s is not None:
        raise ClauseError(
            "give EMIT EVERY or EMIT CHANGES, not both (EMIT CHANGES ... EVERY sets the rhythm "
            "of the early rows)",
            at,
        )
    if joined:
        raise ClauseError("EMIT CHANGES is not supported on a join: aggregate one stream", at)
    if query.grouping_sets:
        raise ClauseError(
            "EMIT CHANGES cannot be combined with ROLLUP or GROUPING SETS (yet): early rows "
            "come at one level of detail",
            at,
        )
    if query.distinct or query.order_by or query.limit is not None:
        raise ClauseError(
            "EMIT CHANGES cannot be combined with DISTINCT, ORDER BY or LIMIT: those shape a "
            "window's final rows",
            at,
        )
    for e in query_exprs(query):
        for node in nodes_of(e):
            if isinstance(node, ast.Aggregate) and node.distinct:
                raise ClauseError(
                    "EMIT CHANGES cannot be combined with COUNT(DISTINCT ...) (yet)", node.pos
                )
    if c.every_rows is not None and c.every_rows < 1:
        raise ClauseError(
            f"EVERY {c.every_rows} ROWS would never output: give at least 1 row", c.pos
        )
    if c.every_s is not None:
        if round(c.every_s * 1000) < 1:
            raise ClauseError(
                f"EVERY {c.every_s:g} seconds: the rhythm must be at least 1 millisecond", c.pos
            )
        if c.every_s > MAX_DURATION_S:
            raise ClauseError(
                f"EVERY {c.every_s:g} seconds is too large (at most {MAX_DURATION_S:g})", c.pos
            )
    if window is None:
        return
    if window.rows is not None:
        raise ClauseError(
            "EMIT CHANGES applies to time windows ([RANGE r]) or to no window (online "
            "aggregation), not to ROWS windows",
            at,
        )
    if c.every_s is None or window.range_s is None:
        return
    every_ms, range_ms = round(c.every_s * 1000), round(window.range_s * 1000)
    slide_ms = range_ms if window.slide_s is None else round(window.slide_s * 1000)
    what = duration_text(c.every_s)
    if every_ms > range_ms:
        raise ClauseError(
            f"EVERY {what} is longer than RANGE {duration_text(window.range_s)}: a window "
            "would close before its first early row; use a shorter EVERY",
            c.pos,
        )
    if range_ms % every_ms or slide_ms % every_ms:
        raise ClauseError(
            f"EVERY {what} must divide the window's RANGE and SLIDE, so that every window has "
            "its early rows at the same instants and the last one at its close (e.g. EVERY 10 "
            "MINUTES on [RANGE 1 HOUR])",
            c.pos,
        )


def check_emit_rows(query: ast.Query, scope: Scope, windowed: bool) -> None:
    """`EMIT EVERY n ROWS [PARTITIONED BY col]` emits `(t - r, t]` at each partition's n-th
    reading: it needs an aggregate over one stream's `[RANGE r]` (the look-back r; a SLIDE or
    a ROWS window would say a second rhythm), and a partition column of that stream."""
    if query.emit_every_rows is None:
        return
    pos = query.pos_of("EMIT EVERY ROWS")
    window = scope.window
    if not windowed:
        raise ClauseError(
            "EMIT EVERY n ROWS sets when an aggregate is output, but this query has no "
            "aggregate or GROUP BY: each row is output as it arrives; remove EMIT EVERY",
            pos,
        )
    if scope.right is not None or scope.table is not None:
        raise ClauseError(
            "EMIT EVERY n ROWS is supported on an aggregate of one stream alone (no join)", pos
        )
    if query.changes is not None:
        raise ClauseError(
            "give EMIT EVERY n ROWS or EMIT CHANGES, not both (EMIT CHANGES EVERY n ROWS outputs "
            "a window's groups every n rows while it is open)",
            pos,
        )
    if query.grouping_sets:
        raise ClauseError(
            "EMIT EVERY n ROWS cannot be combined with ROLLUP or GROUPING SETS (yet): its rows "
            "come at one level of detail",
            pos,
        )
    if window is None or window.rows is not None:
        raise ClauseError(
            "EMIT EVERY n ROWS needs a time window, [RANGE r]: each output covers the r before "
            "the reading that triggers it"
            + ("; a ROWS window has a rhythm of its own ([ROWS n SLIDE m])" if window else ""),
            window.pos if window is not None else pos,
        )
    if window.slide_s is not None:
        raise ClauseError(
            "EMIT EVERY n ROWS outputs (t - r, t] at the readings it counts, so a SLIDE would be "
            "a second rhythm: give [RANGE r] alone",
            window.pos,
        )
    for clause in ("ORDER BY", "LIMIT", "DISTINCT"):
        if query.pos_of(clause) is not None:
            raise ClauseError(
                f"{clause} is not supported with EMIT EVERY n ROWS: each output is one "
                "partition's groups at one reading",
                query.pos_of(clause),
            )
    for e in query_exprs(query):
        for node in nodes_of(e):
            if isinstance(node, ast.Aggregate) and node.distinct:
                raise ClauseError(
                    "COUNT(DISTINCT ...) is not supported with EMIT EVERY n ROWS", node.pos
                )
    col = query.emit_partition
    if col is not None:
        assert scope.stream is not None
        names = scope.stream.schema.names
        if col.name not in names:
            raise ClauseError(
                f"PARTITIONED BY {col.name}: the stream {scope.stream.name} has no such column "
                f"(its columns: {', '.join(names)})",
                col.pos,
            )


def check_options(query: ast.Query) -> None:
    """SAMPLE PERIOD and LIFETIME reach the proxies' cost model: positive, finite, sane.
    SAMPLE EVERY n ROWS is the other way to slow the sensors: with SAMPLE PERIOD it would say
    two rates at once, so the pair is refused."""
    if query.sample_every_rows is not None and query.sample_period_s is not None:
        raise ClauseError(
            "SAMPLE EVERY n ROWS and SAMPLE PERIOD both set the sample rate: keep one",
            query.pos_of("SAMPLE EVERY"),
        )
    for name, seconds, least in (
        ("SAMPLE PERIOD", query.sample_period_s, 0.001),
        ("LIFETIME", query.lifetime_s, 1.0),
    ):
        if seconds is None:
            continue
        if seconds < least:
            raise ClauseError(
                f"{name} must be at least {least:g} seconds (got {seconds:g})", query.pos_of(name)
            )
        if seconds > MAX_DURATION_S:
            raise ClauseError(
                f"{name} {seconds:g} seconds is too large (at most {MAX_DURATION_S:g})",
                query.pos_of(name),
            )


def check_in_lists(query: ast.Query, limits: Limits) -> None:
    exprs = [i.expr for i in query.select if isinstance(i, ast.SelectItem)]
    exprs += [e for e in (query.where, query.having) if e is not None]
    for e in exprs:
        for node in nodes_of(e):
            if isinstance(node, ast.InList):
                limits.check("max_in_list", len(node.values), "IN list length")


def _is_grouping(e: ast.Expr) -> bool:
    return isinstance(e, ast.Func) and e.name == "GROUPING"


def check_grouping(
    query: ast.Query, refs: Mapping, aggs: list[ast.Aggregate], joined: bool
) -> None:
    """ROLLUP / GROUPING SETS and GROUPING(col): the coarser levels are merged from the
    finest level's groups, so every aggregate must be one whose groups' values merge (COUNT,
    SUM, MIN, MAX; AVG from a sum and a count); GROUPING names a GROUP BY column and is read
    from a result row (SELECT, HAVING, ORDER BY), nowhere else."""
    key_refs = [refs.get((k.table, k.name)) for k in query.group_by if isinstance(k, ast.Column)]
    where = [query.where] if query.where is not None else []
    inner = [a.arg for a in aggs if a.arg is not None]
    for e in [*where, *query.group_by, *inner]:
        for node in nodes_of(e):
            if _is_grouping(node):
                raise QueryPlanError(
                    "GROUPING() tells a result row's level: it may be used in SELECT, HAVING "
                    "and ORDER BY, not in WHERE, GROUP BY or inside an aggregate",
                    *(node.pos or (None, None)),
                )
    outside = [i.expr for i in query.select if isinstance(i, ast.SelectItem)]
    outside += [query.having] if query.having is not None else []
    outside += [o.expr for o in query.order_by]
    for e in outside:
        for node in nodes_of(e):
            if not _is_grouping(node):
                continue
            arg = node.args[0]  # type: ignore[union-attr]
            if not query.group_by:
                raise QueryPlanError(
                    "GROUPING() needs GROUP BY (e.g. GROUP BY ROLLUP(segment, station))",
                    *(node.pos or (None, None)),
                )
            known = arg in query.group_by or (
                isinstance(arg, ast.Column)
                and refs.get((arg.table, arg.name)) is not None
                and refs.get((arg.table, arg.name)) in key_refs
            )
            if not known:
                raise QueryPlanError(
                    f"GROUPING({ast.to_sql(arg)}): {ast.to_sql(arg)} is not a GROUP BY column",
                    *(getattr(arg, "pos", None) or node.pos or (None, None)),
                )
    if not query.grouping_sets:
        return
    kind = "ROLLUP / GROUPING SETS"
    if joined:
        raise ClauseError(
            f"{kind} is not supported with a join (of a table or a second stream); "
            "group one stream",
            query.pos_of("GROUP BY"),
        )
    for a in aggs:
        if a.distinct:
            raise QueryPlanError(
                f"{ast.to_sql(a)} cannot be rolled up: the coarser levels are merged from the "
                "finest level's groups, and distinct counts of groups do not add up; use "
                "COUNT, SUM, AVG, MIN or MAX, or a plain GROUP BY per level",
                *(a.pos or (None, None)),
            )


def rollup_helpers(aggs: list[ast.Aggregate]) -> list[ast.Aggregate]:
    """The aggregates a rollup's finest level computes besides the query's: AVG(x) of a
    coarser group is SUM(x) / COUNT(x) of its finer groups' sums and counts."""
    out: list[ast.Aggregate] = []
    for a in aggs:
        if a.func == "AVG":
            for func in ("SUM", "COUNT"):
                h = ast.Aggregate(func, a.arg)
                if h not in aggs and h not in out:
                    out.append(h)
    return out


def check_drilldown(
    query: ast.Query, stream: StreamInfo | None, tables: Iterable[Table] = ()
) -> None:
    """DRILLDOWN descends to a finer level: each value of the finer column lies under one value
    of its parent (a functional dependency). Known from the stream's declared hierarchies
    (`[[hierarchies]]`, a built-in stream's), from any catalog table holding both columns, and
    from the sensors' static attributes (the stations table); each step one of them contradicts
    is refused at the child, naming it. Where none knows both columns, the step is accepted."""
    if query.drilldown is None:
        return
    for parent, child in pairwise(query.group_by):
        if isinstance(parent, ast.Column) and isinstance(child, ast.Column):
            why = _not_finer(parent.name, child.name, stream, tables)
            if why is not None:
                raise QueryPlanError(
                    f"DRILLDOWN {child.name}: {child.name} is not a finer level of "
                    f"{parent.name} ({why})",
                    *(child.pos or (None, None)),
                )


def _not_finer(p: str, c: str, stream: StreamInfo | None, tables: Iterable[Table]) -> str | None:
    """Why `c` is known not to be a finer level of `p`, or None when nothing says so."""
    reverse = f"; drill down from the coarser level: GROUP BY {c} DRILLDOWN {p}"
    for h in stream.hierarchies if stream is not None else ():
        if h.finer(p, c) is False:
            return f"{h.source} declares the hierarchy {h}, coarse to fine{reverse}"
    known: list[tuple[str, list[tuple[str, object, object]]]] = []
    for t in tables:
        if p in t.schema.names and c in t.schema.names:
            ip, ic = t.schema.index(p), t.schema.index(c)
            rows = [(f"row {n}", r[ic], r[ip]) for n, r in enumerate(t.rows, 1)]
            known.append((f"table {t.name}", rows))
    if stream is not None and stream.sensors:
        sensor = stream.sensor_field
        attrs = {k for a in stream.sensors.values() for k in a} | {sensor}
        if p in attrs and c in attrs:
            rows = [
                (
                    f"sensor {sid!r}",
                    sid if c == sensor else a.get(c),
                    sid if p == sensor else a.get(p),
                )
                for sid, a in stream.sensors.items()
            ]
            known.append(("the stations table", rows))
    for where, rows in known:
        found = _two_parents(rows)
        if found is not None:
            (a, pa), (b, pb), cv = found
            upside_down = _two_parents([(k, pv, cv) for k, cv, pv in rows]) is None
            return (
                f"{c} {cv!r} lies under {p} {pa!r} and {pb!r} in {where}, its {a} and {b}"
                f"{reverse if upside_down else ''}"
            )
    return None


def _two_parents(
    pairs: Iterable[tuple[str, object, object]],
) -> tuple[tuple[str, object], tuple[str, object], object] | None:
    """A child value under two parent values, from (label, child, parent) triples: the first
    (label, parent) seen with it, the one that differs, and the child value; None when each
    child value has one parent (NULLs tell nothing)."""
    under: dict[object, tuple[str, object]] = {}
    for label, cv, pv in pairs:
        if cv is None or pv is None:
            continue
        seen = under.setdefault(cv, (label, pv))
        if seen[1] != pv:
            return seen, (label, pv), cv
    return None
