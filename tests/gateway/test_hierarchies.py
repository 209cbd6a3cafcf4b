"""DRILLDOWN's levels on the real daemon and on the Spark compiler: a step that is not down a
known hierarchy is a 400 with line and column naming what knows it (the built-in traffic
stream, a `[[hierarchies]]` entry, a `[tables]` table's row pair); a parameterized measure
naming a level the query does not have is one too. One daemon serves every case: no readings
are needed to refuse a query."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from fjords.catalog import Hierarchy
from fjords.errors import QueryPlanError
from fjords.schema import Schema
from fjords.tables import Table
from gateway.spark.compiler import compile_query
from tests.daemon import Daemon
from tests.support import Broker, require_binary

UPSIDE_DOWN = (
    "SELECT station, segment, COUNT(*) FROM traffic [RANGE 1 HOUR]\n"
    "GROUP BY station DRILLDOWN segment"
)
CLIMATE = "SELECT floor, room, AVG(temperature) AS t FROM climate [RANGE 1 HOUR]\nGROUP BY "
CONFIG = """
[mqtt]
url = "mqtt://{host}:{port}"
[[mqtt.streams]]
name = "climate"
topic = "tele/+/SENSOR"
sensor_id_level = 1
[mqtt.streams.columns]
temperature = {{ path = "temperature", type = "float" }}
floor = {{ path = "floor", type = "str" }}
room = {{ path = "room", type = "str" }}
zone = {{ path = "zone", type = "str" }}

[[hierarchies]]
stream = "climate"
levels = ["floor", "room"]

[tables]
zones = "{zones}"
"""


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("hierarchies")
    broker = Broker(require_binary("mosquitto", "mosquitto"), tmp)
    broker.start()
    zones = tmp / "zones.csv"
    zones.write_text("zone,room\nz1,r1\nz1,r2\nz2,r1\n")  # r1 lies in two zones
    config = CONFIG.format(host=broker.host, port=broker.port, zones=zones)
    try:
        with Daemon(tmp, f'{config}[state]\ndir = "{tmp / "state"}"\n') as daemon:
            yield daemon
    finally:
        broker.stop()


def _post(gw: Daemon, sql: str) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(
        f"{gw.url}/queries",
        data=json.dumps({"sql": sql}).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _refused(gw: Daemon, sql: str, words: str, at: tuple[int, int]) -> str:
    status, body = _post(gw, sql)
    assert status == 400, body
    assert words in body["error"], body
    assert (body["line"], body["column"]) == at, body
    return body["error"]


def test_the_built_in_traffic_hierarchy_refuses_a_step_up(gw: Daemon) -> None:
    said = _refused(
        gw,
        UPSIDE_DOWN,
        "DRILLDOWN segment: segment is not a finer level of station (the built-in traffic "
        "stream declares the hierarchy segment > station, coarse to fine",
        (2, 28),
    )
    assert "GROUP BY segment DRILLDOWN station" in said


def test_a_declared_hierarchy_of_an_mqtt_stream(gw: Daemon) -> None:
    _refused(
        gw,
        CLIMATE + "room DRILLDOWN floor",
        "floor is not a finer level of room ([[hierarchies]] #1 declares the hierarchy "
        "floor > room",
        (2, 25),
    )
    status, body = _post(gw, CLIMATE + "floor DRILLDOWN room")
    assert status == 201, body


def test_a_table_whose_rows_break_the_dependency(gw: Daemon) -> None:
    sql = "SELECT zone, room, COUNT(*) FROM climate [RANGE 1 HOUR] GROUP BY zone DRILLDOWN room"
    _refused(
        gw,
        sql,
        "room is not a finer level of zone (room 'r1' lies under zone 'z1' and 'z2' in table "
        "zones, its row 1 and row 3)",
        (1, sql.rindex("room") + 1),
    )


def test_a_parameterized_measure_of_a_level_the_query_lacks(gw: Daemon) -> None:
    sql = (
        "SELECT segment, station, AVG(speed) AS avg_speed FROM traffic [RANGE 1 HOUR]\n"
        "GROUP BY segment DRILLDOWN station HAVING avg_speed(lane) < 55"
    )
    _refused(
        gw,
        sql,
        "has no level lane; its levels are segment, station",
        (2, sql.split("\n")[1].index("lane") + 1),
    )


TRAFFIC = Schema(
    [("time", "int"), ("station", "str"), ("speed", "float"), ("segment", "str")], time="time"
)


def test_the_spark_compiler_refuses_alike() -> None:
    """The one analysis: compile_query takes the hierarchies and tables (with their rows)."""
    builtin = {"traffic": [Hierarchy(("segment", "station"), "the built-in traffic stream")]}
    with pytest.raises(QueryPlanError) as e:
        compile_query(UPSIDE_DOWN, {"traffic": TRAFFIC}, hierarchies=builtin)
    assert "the built-in traffic stream declares the hierarchy segment > station" in str(e.value)
    assert (e.value.line, e.value.column) == (2, 28)
    lanes = Table("lanes", Schema([("station", "str"), ("segment", "str")], time=None), [])
    lanes.rows = [("s1", "A"), ("s1", "B")]
    with pytest.raises(QueryPlanError) as e:
        compile_query(
            UPSIDE_DOWN.replace("station DRILLDOWN segment", "segment DRILLDOWN station"),
            {"traffic": TRAFFIC},
            {"lanes": lanes},
        )
    assert "station 's1' lies under segment 'A' and 'B' in table lanes" in str(e.value)
    assert (e.value.line, e.value.column) == (2, 28)
