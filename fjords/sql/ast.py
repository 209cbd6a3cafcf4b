"""The syntax tree of the SQL dialect: what the parser produces and the planner consumes.

Plain frozen dataclasses, so trees compare by value (tests compare parsed trees) and can be
hashed (the planner shares identical predicates across queries). Durations are already
converted to seconds (floats) by the parser.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Column:
    """A column reference, optionally qualified: `s.speed` -> Column("s", "speed")."""

    table: str | None
    name: str


@dataclass(frozen=True, slots=True)
class Literal:
    value: int | float | str | bool | None


@dataclass(frozen=True, slots=True)
class Now:
    """`NOW`: the end of the window being emitted (event time), or a tuple's sample time."""


@dataclass(frozen=True, slots=True)
class Interval:
    """A duration used as a value, e.g. the `30 MINUTES` in `NOW - 30 MINUTES`."""

    seconds: float


@dataclass(frozen=True, slots=True)
class BinaryOp:
    op: str  # one of + - * /
    left: Expr
    right: Expr


@dataclass(frozen=True, slots=True)
class Neg:
    operand: Expr


@dataclass(frozen=True, slots=True)
class Compare:
    op: str  # one of = != < <= > >=  (`<>` is normalised to `!=`)
    left: Expr
    right: Expr


@dataclass(frozen=True, slots=True)
class InList:
    expr: Expr
    values: tuple[Expr, ...]
    negated: bool = False


@dataclass(frozen=True, slots=True)
class Between:
    expr: Expr
    low: Expr
    high: Expr
    negated: bool = False


@dataclass(frozen=True, slots=True)
class IsNull:
    expr: Expr
    negated: bool = False


@dataclass(frozen=True, slots=True)
class And:
    items: tuple[Expr, ...]


@dataclass(frozen=True, slots=True)
class Or:
    items: tuple[Expr, ...]


@dataclass(frozen=True, slots=True)
class Not:
    operand: Expr


AGGREGATE_FUNCTIONS = ("COUNT", "SUM", "AVG", "MIN", "MAX")


@dataclass(frozen=True, slots=True)
class Aggregate:
    """An aggregate call; `arg` is None for COUNT(*)."""

    func: str  # one of AGGREGATE_FUNCTIONS, upper case
    arg: Expr | None


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
class Window:
    """`[RANGE r [SLIDE s]]` (seconds) or `[ROWS n [SLIDE m]]` (row counts)."""

    range_s: float | None = None
    slide_s: float | None = None
    rows: int | None = None
    rows_slide: int | None = None


@dataclass(frozen=True, slots=True)
class TableRef:
    name: str
    alias: str | None = None
    window: Window | None = None


@dataclass(frozen=True, slots=True)
class Query:
    select: tuple[SelectItem | Star, ...]
    sources: tuple[TableRef, ...]
    where: Expr | None = None
    group_by: tuple[Expr, ...] = ()
    having: Expr | None = None
    sample_period_s: float | None = None
    emit_every_s: float | None = None
    lifetime_s: float | None = None
