"""Plans read as SQL: EXPLAIN and /queries show `segment IN ('S05', 'S14')` and `AVG(speed)`,
not `segment in frozenset({...})` and `AVG(0)`."""

from __future__ import annotations

from fjords.compile.sql.parser import parse
from fjords.compile.sql.text import expr
from fjords.engine import Engine
from fjords.runtime.fjord import Fjord
from fjords.schema import Field, Schema
from fjords.sqltext import atom, literal

SCHEMA = Schema(
    [
        Field("time", "float"),
        Field("station", "str"),
        Field("segment", "str"),
        Field("speed", "float"),
    ],
    time="time",
)


def test_literals_and_atoms() -> None:
    assert literal("it's") == "'it''s'"
    assert literal(None) == "NULL" and literal(True) == "TRUE" and literal(2.5) == "2.5"
    assert atom("segment", "in", frozenset({"S14", "S05"})) == "segment IN ('S05', 'S14')"
    assert atom("speed", "<", 40) == "speed < 40"


def test_expressions() -> None:
    q = parse("SELECT AVG(s.speed * 2), COUNT(*) FROM traffic s WHERE speed BETWEEN 1 AND 2")
    assert expr(q.select[0].expr) == "AVG((s.speed * 2))"
    assert expr(q.select[1].expr) == "COUNT(*)"
    assert expr(q.where) == "speed BETWEEN 1 AND 2"


def test_explain_and_describe_read_as_sql() -> None:
    fjord = Engine(Fjord())
    fjord.fjord.add_stream("traffic", SCHEMA, sensor_field="station")
    sql = (
        "SELECT segment, AVG(speed) AS a, COUNT(*) AS n FROM traffic [RANGE 15 MINUTES] "
        "WHERE segment IN ('S14', 'S05') AND speed < 40 GROUP BY segment"
    )
    out = fjord.explain(sql)
    # the condition on the groups alone runs after the aggregate (so it can be shared)
    assert out["predicates"] == ["speed < 40"]
    assert out["group_filter"] == ["segment IN ('S14', 'S05')"]  # as the query says it
    rq = fjord.add_query(sql)
    shared = rq.describe()["shared"]
    assert shared[0]["predicates"] == out["predicates"]
    assert shared[1]["groups_of_this_query"] == out["group_filter"]
    assert shared[1]["aggregates"] == ["AVG(speed)", "COUNT(*)"]
    assert "frozenset" not in repr(rq.describe())
