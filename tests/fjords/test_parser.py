"""The SQL dialect: the issue's queries parse to the right trees; bad ones say where and why."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fjords.errors import QuerySyntaxError
from fjords.sql import ast as A
from fjords.sql.parser import parse

ISSUE_QUERIES = [
    "SELECT segment, AVG(speed) AS avg_speed FROM traffic [RANGE 15 MINUTES] WHERE segment IN ('S05','S14') GROUP BY segment",
    "SELECT * FROM traffic WHERE speed < 30 AND station = '773869'",
    "SELECT station, MAX(speed) FROM traffic [RANGE 1 HOUR SLIDE 15 MINUTES] GROUP BY station HAVING MAX(speed) > 65",
    "SELECT i.incident_id, i.description, s.segment, AVG(s.speed) AS avg_speed FROM traffic AS s [RANGE 30 MINUTES], "
    "incidents AS i WHERE i.segment = s.segment AND i.time >= NOW - 30 MINUTES AND i.time < NOW "
    "GROUP BY i.incident_id, i.description, s.segment HAVING AVG(s.speed) < 40",
    "SELECT AVG(speed) FROM traffic [RANGE 5 MINUTES] SAMPLE PERIOD 100 MILLISECONDS EMIT EVERY 1 MINUTE LIFETIME 30 DAYS",
]


@pytest.mark.parametrize("sql", ISSUE_QUERIES)
def test_issue_queries_parse(sql: str) -> None:
    assert isinstance(parse(sql), A.Query)


def test_query1_tree() -> None:
    assert parse(ISSUE_QUERIES[0]) == A.Query(
        select=(
            A.SelectItem(A.Column(None, "segment")),
            A.SelectItem(A.Aggregate("AVG", A.Column(None, "speed")), "avg_speed"),
        ),
        sources=(A.TableRef("traffic", None, A.Window(range_s=900.0)),),
        where=A.InList(A.Column(None, "segment"), (A.Literal("S05"), A.Literal("S14"))),
        group_by=(A.Column(None, "segment"),),
    )


def test_query2_tree() -> None:
    q = parse(ISSUE_QUERIES[3])
    assert q.sources == (
        A.TableRef("traffic", "s", A.Window(range_s=1800.0)),
        A.TableRef("incidents", "i"),
    )
    assert q.where == A.And(
        (
            A.Compare("=", A.Column("i", "segment"), A.Column("s", "segment")),
            A.Compare(">=", A.Column("i", "time"), A.BinaryOp("-", A.Now(), A.Interval(1800.0))),
            A.Compare("<", A.Column("i", "time"), A.Now()),
        )
    )
    assert q.having == A.Compare("<", A.Aggregate("AVG", A.Column("s", "speed")), A.Literal(40))


def test_sensor_clauses() -> None:
    q = parse(ISSUE_QUERIES[4])
    assert (q.sample_period_s, q.emit_every_s, q.lifetime_s) == (0.1, 60.0, 30 * 86400.0)
    q = parse("SELECT * FROM t LIFETIME 2 WEEKS SAMPLE PERIOD 1 SECOND")
    assert (q.sample_period_s, q.lifetime_s) == (1.0, 14 * 86400.0)


def test_windows_and_aliases() -> None:
    assert parse("SELECT * FROM traffic [ROWS 10 SLIDE 2] AS t").sources == (
        A.TableRef("traffic", "t", A.Window(rows=10, rows_slide=2)),
    )
    assert parse("SELECT * FROM traffic t [RANGE 1 HOUR SLIDE 90 SECONDS]").sources == (
        A.TableRef("traffic", "t", A.Window(range_s=3600.0, slide_s=90.0)),
    )
    assert parse('SELECT "from" AS "x y" FROM t').select == (
        A.SelectItem(A.Column(None, "from"), "x y"),
    )


def test_expressions_precedence_and_flattening() -> None:
    w = parse("SELECT * FROM t WHERE a = 1 OR b = 2 AND NOT c <> 3 OR d IS NOT NULL").where
    assert w == A.Or(
        (
            A.Compare("=", A.Column(None, "a"), A.Literal(1)),
            A.And(
                (
                    A.Compare("=", A.Column(None, "b"), A.Literal(2)),
                    A.Not(A.Compare("!=", A.Column(None, "c"), A.Literal(3))),
                )
            ),
            A.IsNull(A.Column(None, "d"), negated=True),
        )
    )
    w = parse(
        "SELECT * FROM t WHERE x * 2 + 1 > -3.5 AND y NOT BETWEEN 1 AND 2 AND z NOT IN ('a')"
    ).where
    assert w == A.And(
        (
            A.Compare(
                ">",
                A.BinaryOp("+", A.BinaryOp("*", A.Column(None, "x"), A.Literal(2)), A.Literal(1)),
                A.Literal(-3.5),
            ),
            A.Between(A.Column(None, "y"), A.Literal(1), A.Literal(2), negated=True),
            A.InList(A.Column(None, "z"), (A.Literal("a"),), negated=True),
        )
    )
    assert parse("SELECT 'it''s', TRUE, NULL, COUNT(*) FROM t").select == (
        A.SelectItem(A.Literal("it's")),
        A.SelectItem(A.Literal(True)),
        A.SelectItem(A.Literal(None)),
        A.SelectItem(A.Aggregate("COUNT", None)),
    )


def test_case_whitespace_and_comments_do_not_matter() -> None:
    a = parse(ISSUE_QUERIES[2])
    b = parse(
        "select station,max(speed)\n  from traffic [range 1 hour slide 15 minutes] -- hourly\n"
        "group  by station having max(speed)>65 ;"
    )
    assert a == b


@pytest.mark.parametrize(
    "sql, line, column, fragment, expected",
    [
        ("SELECT speed WHERE x = 1", 1, 14, "unexpected 'WHERE'", "FROM"),
        ("SELECT FROM t", 1, 8, "unexpected 'FROM'", "identifier"),
        ("SELECT * FROM t WHERE name = 'abc", 1, 30, "unterminated string", "closing '"),
        ("SELECT FOO(x) FROM t", 1, 8, "unknown function FOO", "AVG"),
        ("SELECT * FROM t [RANGE 5 FURLONGS]", 1, 26, "unexpected 'FURLONGS'", "time unit"),
        (
            "SELECT * FROM t SAMPLE PERIOD 1 SECOND\nSAMPLE PERIOD 2 SECONDS",
            2,
            1,
            "given twice",
            None,
        ),
        (
            "SELECT * FROM t WHERE a = 1 trailing garbage",
            1,
            29,
            "unexpected 'trailing'",
            "end of query",
        ),
        ("SELECT * FROM t WHERE a # 3", 1, 25, "unexpected character '#'", None),
        ("", 1, 1, "empty query", "SELECT"),
        ("SELECT *\nFROM traffic\nWHERE speed >", 3, 14, "unexpected end of query", "number"),
        ("SELECT AVG(*) FROM t", 1, 8, "only COUNT(*)", None),
    ],
)
def test_errors_say_line_column_and_expected(
    sql: str, line: int, column: int, fragment: str, expected: str | None
) -> None:
    with pytest.raises(QuerySyntaxError) as info:
        parse(sql)
    e = info.value
    assert fragment in e.message
    assert (e.line, e.column) == (line, column)
    if expected is not None:
        assert any(expected in x for x in e.expected), e.expected
    assert e.to_dict()["line"] == line


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80))
def test_arbitrary_text_raises_only_syntax_errors(text: str) -> None:
    try:
        parse(text)
    except QuerySyntaxError:
        pass


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            [
                "SELECT",
                "*",
                "FROM",
                "t",
                "WHERE",
                "a",
                "=",
                "1",
                "(",
                ")",
                "AND",
                "[",
                "RANGE",
                "5",
                "MINUTES",
                "]",
                ",",
                "'x'",
                "GROUP",
                "BY",
                "COUNT",
                "NOW",
                "-",
            ]
        ),
        max_size=14,
    )
)
def test_token_soup_raises_only_syntax_errors(tokens: list[str]) -> None:
    try:
        parse(" ".join(tokens))
    except QuerySyntaxError:
        pass
