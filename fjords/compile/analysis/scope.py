"""Name resolution over a query's sources (which stream, table or second stream a column
means) and the names of its result columns.
"""

from __future__ import annotations

from fjords.catalog import Catalog, StreamInfo
from fjords.compile.analysis.bound import RIGHT, STREAM, TABLE, ColumnRef, interned
from fjords.compile.sql import ast
from fjords.errors import ClauseError, QueryError, QueryPlanError, UnknownNameError
from fjords.schema import Schema
from fjords.tables import Table


class Scope:
    """Name resolution over the query's sources: one stream and at most one static table, or
    two streams (a stream-stream join, `right`)."""

    def __init__(self, query: ast.Query, catalog: Catalog) -> None:
        self.stream: StreamInfo | None = None
        self.stream_alias = ""
        self.window: ast.Window | None = None
        self.tables: list[tuple[str, Table]] = []
        # A stream-stream join's second stream (`check_stream_join` checks the rule).
        self.right: StreamInfo | None = None
        self.right_alias = ""
        self.right_window: ast.Window | None = None
        self.right_pos: ast.Pos = None
        self._resolved: dict[tuple[str | None, str], ColumnRef] = {}
        for ref in query.sources:
            if ref.name not in catalog.streams and ref.name not in catalog.tables:
                known = sorted([*catalog.streams, *catalog.tables])
                raise UnknownNameError("stream or table", ref.name, known, ref.pos)
            obj = catalog.lookup(ref.name)
            alias = ref.alias or ref.name
            if isinstance(obj, StreamInfo):
                if self.right is not None:
                    raise QueryPlanError(
                        f"a query joins at most two streams; {ref.name!r} would be the third",
                        *(ref.pos or (None, None)),
                    )
                if self.stream is not None:
                    if alias == self.stream_alias:
                        raise QueryPlanError(
                            f"two sources are named {alias!r}: give each stream of the join "
                            f"its own alias, e.g. FROM {self.stream.name} AS a [RANGE 5 MINUTES], "
                            f"{obj.name} AS b [RANGE 5 MINUTES]",
                            *(ref.pos or (None, None)),
                        )
                    self.right, self.right_alias, self.right_window = obj, alias, ref.window
                    self.right_pos = ref.pos
                    continue
                self.stream, self.stream_alias, self.window = obj, alias, ref.window
            else:
                if ref.window is not None:
                    raise ClauseError(
                        f"a window applies to a stream; {ref.name!r} is a static table",
                        ref.window.pos,
                    )
                self.tables.append((alias, obj))
        if self.stream is None:
            first = query.sources[0].pos if query.sources else None
            raise QueryPlanError(
                "a continuous query needs a sensor stream in FROM", *(first or (None, None))
            )
        if len(self.tables) > 1:
            second = [r for r in query.sources if r.name in catalog.tables][1].pos
            raise QueryPlanError(
                "joining more than one static table per query is not supported yet",
                *(second or (None, None)),
            )
        self.table: Table | None
        self.table_alias, self.table = self.tables[0] if self.tables else ("", None)
        if self.right is not None and self.table is not None:
            raise QueryPlanError(
                "a join of two streams with a static table is not supported; join the two "
                "streams, or one stream with the table",
                *(next(r for r in query.sources if r.name in catalog.tables).pos or (None, None)),
            )

    @property
    def schema(self) -> Schema:
        assert self.stream is not None
        return self.stream.schema

    def _ref(self, side: str, schema: Schema, name: str) -> ColumnRef:
        i = schema.index(name)
        return interned(ColumnRef(side, i, name, schema.fields[i].type))

    def resolve(self, col: ast.Column) -> ColumnRef:
        """The column a name means (QueryError if none, or two): each name once per query,
        for the several checks that ask."""
        key = (col.table, col.name)
        got = self._resolved.get(key)
        if got is None:
            got = self._resolved[key] = self._resolve(col)
        return got

    def _resolve(self, col: ast.Column) -> ColumnRef:
        s = self.schema
        if col.table is not None:
            if col.table == self.stream_alias:
                if col.name not in s:
                    raise UnknownNameError(
                        "column", col.name, s.names, col.pos, f" in stream {self.stream_alias!r}"
                    )
                return self._ref(STREAM, s, col.name)
            if self.right is not None and col.table == self.right_alias:
                rs = self.right.schema
                if col.name not in rs:
                    raise UnknownNameError(
                        "column", col.name, rs.names, col.pos, f" in stream {self.right_alias!r}"
                    )
                return self._ref(RIGHT, rs, col.name)
            if self.table is not None and col.table == self.table_alias:
                ts = self.table.schema
                if col.name not in ts:
                    raise UnknownNameError(
                        "column", col.name, ts.names, col.pos, f" in table {self.table_alias!r}"
                    )
                return self._ref(TABLE, ts, col.name)
            raise UnknownNameError(
                "table or alias", col.table, self.aliases, col.pos, f" in {col.table}.{col.name}"
            )
        in_s = col.name in s
        if self.right is not None:
            in_r = col.name in self.right.schema
            if in_s and in_r:
                raise QueryPlanError(
                    f"column {col.name!r} is ambiguous: qualify it with {self.stream_alias!r} "
                    f"or {self.right_alias!r}",
                    *(col.pos or (None, None)),
                )
            if in_r:
                return self._ref(RIGHT, self.right.schema, col.name)
        in_t = self.table is not None and col.name in self.table.schema
        if in_s and in_t:
            raise QueryPlanError(
                f"column {col.name!r} is ambiguous: qualify it with {self.stream_alias!r} "
                f"or {self.table_alias!r}",
                *(col.pos or (None, None)),
            )
        if in_s:
            return self._ref(STREAM, s, col.name)
        if in_t and self.table is not None:
            return self._ref(TABLE, self.table.schema, col.name)
        raise UnknownNameError("column", col.name, self.column_names, col.pos)

    def known(self, col: ast.Column) -> bool:
        try:
            self.resolve(col)
            return True
        except QueryError:
            return False

    @property
    def aliases(self) -> list[str]:
        return [a for a in (self.stream_alias, self.right_alias, self.table_alias) if a]

    @property
    def column_names(self) -> list[str]:
        """Every column a bare name can mean, stream first, each once."""
        names = list(self.schema.names)
        if self.right is not None:
            names += [n for n in self.right.schema.names if n not in names]
        if self.table is not None:
            names += [n for n in self.table.schema.names if n not in names]
        return names


def select_names(query: ast.Query, scope: Scope) -> list[str]:
    names: list[str] = []
    s = scope.schema
    t = scope.table.schema if scope.table is not None else None
    for n, item in enumerate(query.select):
        if isinstance(item, ast.Star) and scope.right is not None:
            # Two streams: star columns are named by alias (`a.speed`), so both sides'
            # columns (the same ones, in a self-join) keep apart.
            for alias, schema in (
                (scope.stream_alias, s),
                (scope.right_alias, scope.right.schema),
            ):
                if item.table in (None, alias):
                    names += [f"{alias}.{c}" for c in schema.names]
            continue
        if isinstance(item, ast.Star):
            if item.table in (None, scope.stream_alias):
                names += s.names
            if t is not None and item.table in (None, scope.table_alias):
                names += t.names
            continue
        names.append(output_name(item, n))
    return names


def output_name(item: ast.SelectItem, n: int) -> str:
    """A result column's name: the alias, else the column's name (`i.description` ->
    `description`), `max_speed` for `MAX(speed)`, `count` for `COUNT(*)`, else `col<n>`."""
    if item.alias:
        return item.alias
    e = item.expr
    if isinstance(e, ast.Column):
        return e.name
    if isinstance(e, ast.Func) and e.name == "GROUPING" and isinstance(e.args[0], ast.Column):
        return f"grouping_{e.args[0].name}"
    if isinstance(e, ast.Aggregate):
        if e.arg is None:
            return f"{e.func.lower()}"
        if isinstance(e.arg, ast.Column):
            return f"{e.func.lower()}_{e.arg.name}"
    return f"col{n}"
