"""What a bound query needs from its sensors (`fjords.demand.Demand`): fields, filters,
aggregates and windows the proxies may push down to the motes.
"""

from __future__ import annotations

from fjords.compile.analysis.bound import RIGHT, STREAM, BoundQuery, interned
from fjords.compile.analysis.nodes import nodes_of, query_exprs
from fjords.compile.sql import ast
from fjords.demand import Demand


def join_demand(b: BoundQuery, side: str) -> Demand:
    """What a stream-stream join needs from one of its streams' sensors: every reading with
    the fields it reads (the join needs raw readings; each side's filter differs, so no
    filter or aggregate is pushed down: the safe side, see proxies.demand)."""
    query = b.query
    schema = b.schema if side == STREAM else b.right.schema  # type: ignore[union-attr]
    stream = b.stream if side == STREAM else b.right.stream  # type: ignore[union-attr]
    used: list[str] = []
    if any(isinstance(i, ast.Star) for i in query.select):
        used = list(schema.names)
    same = b.right is not None and b.right.stream == b.stream  # a self-join: both sides
    for e in query_exprs(query):
        for node in nodes_of(e):
            if isinstance(node, ast.Column):
                r = b.ref(node)
                if r is None:
                    continue
                if (r.side == side or (same and r.side in (STREAM, RIGHT))) and r.name not in used:
                    used.append(r.name)
    if schema.time is not None and schema.time not in used:
        used.append(schema.time)  # the window of each tuple
    return Demand(
        stream=stream,
        sample_period_s=query.sample_period_s,
        lifetime_s=query.lifetime_s,
        fields=tuple(used),
        atoms=(),
        filtered_only_by_atoms=False,
        aggregates=(),
        window=None,
        group_by=(),
    )


def stream_demand(b: BoundQuery) -> Demand:
    s = b.schema
    query = b.query
    used: list[str] = []
    if any(isinstance(i, ast.Star) for i in query.select):
        used = list(s.names)
    for e in query_exprs(query):
        for node in nodes_of(e):
            if isinstance(node, ast.Column):
                r = b.ref(node)
                if r is not None and r.side == STREAM and r.name not in used:
                    used.append(r.name)
    window = None
    if b.window is not None and not b.window.rows and query.emit_every_rows is None:
        window = (b.window.range, b.window.slide)
    group_by = tuple(
        r.name for g in query.group_by if isinstance(g, ast.Column) and (r := b.ref(g)) is not None
    )
    agg_list: list[tuple[str, str | None]] = []
    for a in b.aggregates:
        if a.distinct:
            # not a mote-side aggregate (fjords.partial has no distinct values)
            agg_list.append((f"{a.func} DISTINCT", "<expr>"))
        elif a.arg is None:
            agg_list.append((a.func, None))
        elif isinstance(a.arg, ast.Column) and (r := b.ref(a.arg)) is not None:
            agg_list.append((a.func, r.name))
        else:
            agg_list.append((a.func, "<expr>"))
    return Demand(
        stream=b.stream,
        sample_period_s=query.sample_period_s,
        lifetime_s=query.lifetime_s,
        fields=interned(tuple(used)),
        atoms=tuple((s.names[a.field], a.op, a.value) for a in b.atoms),
        filtered_only_by_atoms=not b.residual
        and not b.join_keys
        and not any(STREAM in b.sides(o) for o in b.post_join),
        aggregates=tuple(agg_list),
        window=window,
        group_by=group_by,
        sample_every_rows=query.sample_every_rows,
    )
