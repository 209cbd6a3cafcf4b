"""Expressions are typed at plan time: mixing kinds is a QueryTypeError naming the expression,
its line and column, before anything runs."""

from __future__ import annotations

import pytest

from fjords.compile.sql import ast
from fjords.compile.sql.parser import parse
from fjords.errors import QueryError, QuerySyntaxError, QueryTypeError
from tests.fjords.test_fjord import new_engine


@pytest.mark.parametrize(
    ("sql", "expression", "line", "column"),
    [
        ("SELECT speed + station AS x FROM traffic", "speed + station", 1, 8),
        ("SELECT -segment AS x FROM traffic", "-segment", 1, 9),
        ("SELECT station FROM traffic\nWHERE speed + segment > 1", "speed + segment", 2, 7),
        (
            "SELECT MIN(station) + 1 AS x FROM traffic [RANGE 1 MINUTES]",
            "MIN(station) + 1",
            1,
            8,
        ),
        ("SELECT station * 2000000 AS x FROM traffic", "station * 2000000", 1, 8),
        ("SELECT station || 'x' FROM traffic", None, None, None),
        ("SELECT * FROM traffic WHERE speed", "speed", 1, 29),
        ("SELECT * FROM traffic WHERE speed > 1 AND station", "station", 1, 43),
        ("SELECT * FROM traffic WHERE NOT segment", "NOT segment", 1, 33),
        ("SELECT * FROM traffic WHERE station > speed", "station > speed", 1, 29),
        ("SELECT * FROM traffic WHERE (speed > 1) + 1 > 0", "(speed > 1) + 1", 1, 30),
        (
            "SELECT segment, SUM(segment || 1) FROM traffic [RANGE 1 MINUTES] GROUP BY segment",
            None,
            None,
            None,
        ),
        (
            "SELECT segment FROM traffic [RANGE 1 MINUTES] GROUP BY segment HAVING MAX(station)",
            "MAX(station)",
            1,
            71,
        ),
        (
            "SELECT segment, AVG(station) FROM traffic [RANGE 1 MINUTES] GROUP BY segment",
            "AVG(station)",
            None,
            None,
        ),
    ],
)
def test_mixed_kinds_are_refused_with_the_expression_and_its_position(
    sql: str, expression: str | None, line: int | None, column: int | None
) -> None:
    f = new_engine()
    with pytest.raises(QueryError) as info:
        f.add_query(sql)
    if expression is None:  # not the dialect at all: a syntax error
        assert isinstance(info.value, QuerySyntaxError)
        return
    if not isinstance(info.value, QueryTypeError):  # AVG(text) keeps its older, clear message
        assert "needs numbers" in str(info.value)
        return
    e = info.value
    assert e.expression == expression, str(e)
    if line is not None:
        assert (e.line, e.column) == (line, column), str(e)
        assert f"line {line}, column {column}" in str(e)
    assert e.to_dict()["expression"] == expression
    assert not f.fjord.queries  # nothing was installed


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT speed * 3.6 AS kmh, -speed AS neg FROM traffic WHERE speed + 1 > 2",
        "SELECT * FROM traffic WHERE station = 773869",  # SQL's implicit cast of a literal
        "SELECT * FROM traffic WHERE speed = '12'",
        "SELECT * FROM traffic WHERE segment IN ('S1', 'S2') AND speed BETWEEN 1 AND 2",
        "SELECT * FROM traffic WHERE station IS NULL OR NOT (speed < 3)",
        "SELECT segment, MIN(station) AS m, MAX(speed) - MIN(speed) AS spread "
        "FROM traffic [RANGE 1 MINUTES] GROUP BY segment HAVING COUNT(*) > 1 AND MIN(station) > 'a'",
        "SELECT segment, window_end - window_start AS w FROM traffic [RANGE 1 MINUTES] "
        "GROUP BY segment",
        "SELECT * FROM traffic WHERE speed > NULL",
        "SELECT * FROM traffic WHERE time >= NOW - 30 MINUTES",
    ],
)
def test_well_typed_queries_still_plan(sql: str) -> None:
    new_engine().add_query(sql)


def test_positions_do_not_change_equality_or_sharing() -> None:
    a = parse("SELECT * FROM traffic WHERE speed > 1")
    b = parse("SELECT *\n  FROM traffic\n  WHERE   speed > 1")
    assert a == b and hash(a.where) == hash(b.where)
    assert a.where.pos == (1, 29) and b.where.pos == (3, 11)  # type: ignore[union-attr]
    assert ast.to_sql(parse("SELECT (a + b) * -c - (d - e) FROM t").select[0].expr) == (
        "(a + b) * -c - (d - e)"
    )


def test_lone_surrogates_are_refused_when_parsed() -> None:
    with pytest.raises(QuerySyntaxError, match="UTF-8") as info:
        parse('SELECT speed AS "\ud800" FROM traffic')
    assert (info.value.line, info.value.column) == (1, 18)


def test_numerals_past_bigint_are_floats_so_integers_stay_bounded() -> None:
    assert parse("SELECT 999999999999999999 FROM t").select[0].expr.value == 999999999999999999  # type: ignore[union-attr]
    big = parse("SELECT 12345678901234567890 FROM t").select[0].expr.value  # type: ignore[union-attr]
    assert isinstance(big, float) and big == 1.2345678901234567e19
    with pytest.raises(QuerySyntaxError, match="too large"):
        parse(f"SELECT {10**400} FROM t")


def test_integer_results_are_bounded_in_digits() -> None:
    f = new_engine()
    a = "99999999999999999"
    f.add_query(f"SELECT {a} * 99 AS ok, COUNT(*) * 1000 AS n FROM traffic [RANGE 1 MINUTES]")
    balanced = f"(({a} * {a}) * ({a} * {a}))"
    with pytest.raises(QueryTypeError, match="digits"):
        f.add_query(f"SELECT {balanced} * {balanced} AS x FROM traffic")
    # Left to right from a float, every step is a float: bounded, allowed.
    f.add_query(f"SELECT 1.0 * {a} * {a} * {a} * {a} * {a} AS x FROM traffic")
