"""The syntax tree of the SQL dialect: what the parser produces and the planner consumes.

Plain frozen dataclasses, so trees compare by value (tests compare parsed trees) and can be
hashed (the planner shares identical predicates across queries). Durations are already
converted to seconds (floats) by the parser.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fjords.runtime.operators.base import DEFAULT_TICKETS

# Where an expression starts in the query text, (line, column), 1-based; None when unknown.
# Not compared nor hashed: trees still compare by value and identical predicates still share.
Pos = tuple[int, int] | None


def _pos() -> Pos:
    return field(default=None, compare=False, hash=False, repr=False)


@dataclass(frozen=True, slots=True)
class Column:
    """A column reference, optionally qualified: `s.speed` -> Column("s", "speed")."""

    table: str | None
    name: str
    pos: Pos = _pos()


@dataclass(frozen=True, slots=True)
class Literal:
    value: int | float | str | bool | None
    pos: Pos = _pos()


@dataclass(frozen=True, slots=True)
class Now:
    """`NOW`: the end of the window being emitted (event time), or a tuple's sample time."""

    pos: Pos = _pos()


@dataclass(frozen=True, slots=True)
class Interval:
    """A duration used as a value, e.g. the `30 MINUTES` in `NOW - 30 MINUTES`."""

    seconds: float
    pos: Pos = _pos()


@dataclass(frozen=True, slots=True)
class BinaryOp:
    op: str  # one of + - * /
    left: Expr
    right: Expr
    pos: Pos = _pos()


@dataclass(frozen=True, slots=True)
class Neg:
    operand: Expr
    pos: Pos = _pos()


@dataclass(frozen=True, slots=True)
class Compare:
    op: str  # one of = != < <= > >=  (`<>` is normalised to `!=`)
    left: Expr
    right: Expr
    pos: Pos = _pos()


@dataclass(frozen=True, slots=True)
class InList:
    expr: Expr
    values: tuple[Expr, ...]
    negated: bool = False
    pos: Pos = _pos()


@dataclass(frozen=True, slots=True)
class Between:
    expr: Expr
    low: Expr
    high: Expr
    negated: bool = False
    pos: Pos = _pos()


@dataclass(frozen=True, slots=True)
class IsNull:
    expr: Expr
    negated: bool = False
    pos: Pos = _pos()


@dataclass(frozen=True, slots=True)
class And:
    items: tuple[Expr, ...]
    pos: Pos = _pos()


@dataclass(frozen=True, slots=True)
class Or:
    items: tuple[Expr, ...]
    pos: Pos = _pos()


@dataclass(frozen=True, slots=True)
class Not:
    operand: Expr
    pos: Pos = _pos()


AGGREGATE_FUNCTIONS = ("COUNT", "SUM", "AVG", "MIN", "MAX")
# Scalar functions: name -> (least, most) arguments (None: any number).
SCALAR_FUNCTIONS: dict[str, tuple[int, int | None]] = {
    "ABS": (1, 1),
    "ROUND": (1, 2),
    "COALESCE": (1, None),
    "LEAST": (2, None),
    "GREATEST": (2, None),
}

# `PRIORITY n`: the scheduler tickets of the query's operators (fjords.runtime.scheduler). Bounded so
# one query cannot take (nearly) all of a shared gateway's CPU from the others.
DEFAULT_PRIORITY = DEFAULT_TICKETS  # PRIORITY n: the query's operators' tickets
MIN_PRIORITY = 1
MAX_PRIORITY = 1000


@dataclass(frozen=True, slots=True)
class Aggregate:
    """An aggregate call; `arg` is None for COUNT(*); `distinct` for COUNT(DISTINCT x)."""

    func: str  # one of AGGREGATE_FUNCTIONS, upper case
    arg: Expr | None
    pos: Pos = _pos()
    distinct: bool = False


@dataclass(frozen=True, slots=True)
class Func:
    """A scalar function call: `ABS(x)`, `ROUND(x, 1)`, `COALESCE(a, b)`, `LEAST(a, b)`..."""

    name: str  # one of SCALAR_FUNCTIONS, upper case
    args: tuple[Expr, ...]
    pos: Pos = _pos()


@dataclass(frozen=True, slots=True)
class Case:
    """`CASE WHEN c1 THEN v1 [WHEN ...] [ELSE e] END`: the value of the first true condition."""

    whens: tuple[tuple[Expr, Expr], ...]
    otherwise: Expr | None = None
    pos: Pos = _pos()


Expr = (
    Column
    | Literal
    | Now
    | Interval
    | BinaryOp
    | Neg
    | Compare
    | InList
    | Between
    | IsNull
    | And
    | Or
    | Not
    | Aggregate
    | Func
    | Case
)


@dataclass(frozen=True, slots=True)
class SelectItem:
    expr: Expr
    alias: str | None = None


@dataclass(frozen=True, slots=True)
class Star:
    """`*` or `s.*`."""

    table: str | None = None


@dataclass(frozen=True, slots=True)
class OrderItem:
    """One key of ORDER BY: an expression over the result row (or an output column's name or
    1-based position), ascending unless `descending`."""

    expr: Expr
    descending: bool = False


@dataclass(frozen=True, slots=True)
class Window:
    """`[RANGE r [SLIDE s]]` (seconds) or `[ROWS n [SLIDE m]]` (row counts)."""

    range_s: float | None = None
    slide_s: float | None = None
    rows: int | None = None
    rows_slide: int | None = None
    pos: Pos = _pos()  # of RANGE or ROWS


@dataclass(frozen=True, slots=True)
class Changes:
    """`EMIT CHANGES [EVERY d | EVERY n ROWS]`: a window's aggregate so far while it is open
    (early rows), every `every_s` seconds of event time or every `every_rows` input rows of
    the window; neither given means every row."""

    every_s: float | None = None
    every_rows: int | None = None
    pos: Pos = _pos()  # of the number after EVERY (or of EMIT)


@dataclass(frozen=True, slots=True)
class TableRef:
    name: str
    alias: str | None = None
    window: Window | None = None
    pos: Pos = _pos()


@dataclass(frozen=True, slots=True)
class Query:
    select: tuple[SelectItem | Star, ...]
    sources: tuple[TableRef, ...]
    where: Expr | None = None
    group_by: tuple[Expr, ...] = ()
    # ROLLUP / GROUPING SETS: each set as positions in `group_by` (the union of the sets'
    # columns, the finest level); empty for a plain GROUP BY.
    grouping_sets: tuple[tuple[int, ...], ...] = ()
    # GROUP BY a DRILLDOWN b ...: its grouping sets are (a), (a, b)...; per level, the HAVING
    # condition its rows meet (None: none; for EXPLAIN: `having` itself is rewritten over the
    # levels, `transform._drilldown_having`). None: not a drill-down.
    drilldown: tuple[Expr | None, ...] | None = None
    having: Expr | None = None
    sample_period_s: float | None = None
    sample_every_rows: int | None = None  # SAMPLE EVERY n ROWS: each sensor's n-th readings
    emit_every_s: float | None = None
    # EMIT EVERY n ROWS [PARTITIONED BY col]: each partition's n-th, 2n-th, ... reading
    emit_every_rows: int | None = None
    emit_partition: Column | None = None
    lifetime_s: float | None = None
    priority: int | None = None  # PRIORITY n (None: DEFAULT_PRIORITY)
    distinct: bool = False  # SELECT DISTINCT
    order_by: tuple[OrderItem, ...] = ()
    limit: int | None = None
    changes: Changes | None = None  # EMIT CHANGES ...
    # Where each clause keyword starts ("HAVING", "GROUP BY", "SAMPLE PERIOD", "SAMPLE EVERY",
    # "EMIT EVERY", "EMIT EVERY ROWS", "EMIT CHANGES", "LIFETIME", "PRIORITY", "DISTINCT",
    # "ORDER BY", "LIMIT"), for errors that point at a clause; not compared.
    clause_pos: tuple[tuple[str, Pos], ...] = field(
        default=(), compare=False, hash=False, repr=False
    )

    @property
    def tickets(self) -> int:
        """The scheduler tickets of this query's operators: PRIORITY n, else the default."""
        return DEFAULT_PRIORITY if self.priority is None else self.priority

    def pos_of(self, clause: str) -> Pos:
        """Where the clause keyword starts, if the query has it (None otherwise)."""
        return dict(self.clause_pos).get(clause)


_PRECEDENCE = {"OR": 1, "AND": 2, "NOT": 3, "CMP": 4, "+": 5, "-": 5, "*": 6, "/": 6, "NEG": 7}


def to_sql(expr: Expr) -> str:
    """An expression as query text (for error messages): `speed + station`, `MIN(station) + 1`."""
    return _sql(expr, 0)


def _sql(e: Expr, outer: int) -> str:
    match e:
        case Column(table=t, name=n):
            return f"{t}.{n}" if t else n
        case Literal(value=v):
            if v is None:
                return "NULL"
            if isinstance(v, bool):
                return "TRUE" if v else "FALSE"
            if isinstance(v, str):
                return "'" + v.replace("'", "''") + "'"
            return repr(v) if isinstance(v, float) else str(v)
        case Now():
            return "NOW"
        case Interval(seconds=s):
            return f"{s:g} SECONDS"
        case Aggregate(func=f, arg=a, distinct=d):
            return f"{f}({'DISTINCT ' if d else ''}{'*' if a is None else _sql(a, 0)})"
        case Func(name=f, args=args):
            return f"{f}({', '.join(_sql(a, 0) for a in args)})"
        case Case(whens=whens, otherwise=o):
            parts = [f"WHEN {_sql(c, 0)} THEN {_sql(v, 0)}" for c, v in whens]
            if o is not None:
                parts.append(f"ELSE {_sql(o, 0)}")
            return f"CASE {' '.join(parts)} END"
        case BinaryOp(op=op, left=a, right=b):
            p = _PRECEDENCE[op]
            text = f"{_sql(a, p)} {op} {_sql(b, p + 1)}"
        case Neg(operand=o):
            p = _PRECEDENCE["NEG"]
            text = f"-{_sql(o, p)}"
        case Compare(op=op, left=a, right=b):
            p = _PRECEDENCE["CMP"]
            text = f"{_sql(a, p + 1)} {op} {_sql(b, p + 1)}"
        case InList(expr=x, values=vs, negated=neg):
            p = _PRECEDENCE["CMP"]
            shown = ", ".join(_sql(v, 0) for v in vs[:5]) + (", ..." if len(vs) > 5 else "")
            text = f"{_sql(x, p + 1)} {'NOT IN' if neg else 'IN'} ({shown})"
        case Between(expr=x, low=lo, high=hi, negated=neg):
            p = _PRECEDENCE["CMP"]
            kw = "NOT BETWEEN" if neg else "BETWEEN"
            text = f"{_sql(x, p + 1)} {kw} {_sql(lo, p + 1)} AND {_sql(hi, p + 1)}"
        case IsNull(expr=x, negated=neg):
            p = _PRECEDENCE["CMP"]
            text = f"{_sql(x, p + 1)} IS {'NOT ' if neg else ''}NULL"
        case And(items=items) | Or(items=items):
            kw = "AND" if isinstance(e, And) else "OR"
            p = _PRECEDENCE[kw]
            text = f" {kw} ".join(_sql(i, p + 1) for i in items)
        case Not(operand=o):
            p = _PRECEDENCE["NOT"]
            text = f"NOT {_sql(o, p)}"
        case _:
            return repr(e)
    return f"({text})" if p < outer else text


@dataclass(frozen=True, slots=True)
class Union:
    """`query UNION ALL query [UNION ALL ...]`: the branches' rows merged in sample-time order.

    The options after the last branch (SAMPLE PERIOD, LIFETIME, PRIORITY) apply to every branch:
    the parser copies them into each branch, so each branch's demand and tickets carry them.
    The result is named by the first branch (`select`, `group_by` read it)."""

    branches: tuple[Query, ...]
    # Where each UNION keyword starts: union_pos[i] precedes branches[i + 1]; not compared.
    union_pos: tuple[Pos, ...] = field(default=(), compare=False, hash=False, repr=False)

    @property
    def sources(self) -> tuple[TableRef, ...]:
        return tuple(r for b in self.branches for r in b.sources)

    @property
    def select(self) -> tuple[SelectItem | Star, ...]:
        return self.branches[0].select

    @property
    def group_by(self) -> tuple[Expr, ...]:
        return self.branches[0].group_by

    @property
    def priority(self) -> int | None:
        return self.branches[0].priority

    @property
    def sample_period_s(self) -> float | None:
        return self.branches[0].sample_period_s

    @property
    def lifetime_s(self) -> float | None:
        return self.branches[0].lifetime_s

    @property
    def tickets(self) -> int:
        return self.branches[0].tickets

    def pos_of(self, clause: str) -> Pos:
        return self.branches[-1].pos_of(clause)


Statement = Query | Union
