"""Static tables and traces from CSV and Parquet, with clear errors for bad files."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fjords.schema import Schema
from fjords.tables import Table, TableError
from fjords.trace import Trace


def test_csv_table_types_and_identifiers(tmp_path) -> None:  # noqa: ANN001
    p = tmp_path / "incidents.csv"
    p.write_text(
        "incident_id,time,segment,description,severity\n001,1330614600,S25,Collision,2.5\n"
    )
    t = Table.from_file("incidents", p)
    assert t.schema.names == ("incident_id", "time", "segment", "description", "severity")
    assert [f.type for f in t.schema.fields] == ["str", "int", "str", "str", "float"]
    assert t.rows == [("001", 1330614600, "S25", "Collision", 2.5)]


def test_parquet_table_equals_csv_table(tmp_path) -> None:  # noqa: ANN001
    csv = tmp_path / "t.csv"
    csv.write_text("incident_id,time,segment,description\nI1,10,S1,a\nI2,20,S2,b\n")
    pq.write_table(
        pa.table(
            {
                "incident_id": ["I1", "I2"],
                "time": [10, 20],
                "segment": ["S1", "S2"],
                "description": ["a", "b"],
            }
        ),
        tmp_path / "t.parquet",
    )
    a, b = Table.from_file("t", csv), Table.from_file("t", tmp_path / "t.parquet")
    assert a.rows == b.rows and a.schema == b.schema


@pytest.mark.parametrize(
    "content, message",
    [
        ("", "empty file"),
        ("a,b\n1\n", "expected 2 values"),
        ("time,x\nnoon,1\n", "epoch seconds"),
    ],
)
def test_bad_csv_files(tmp_path, content: str, message: str) -> None:  # noqa: ANN001
    p = tmp_path / "bad.csv"
    p.write_text(content)
    with pytest.raises(TableError, match=message):
        Table.from_file("bad", p)


def test_missing_and_unsupported_files(tmp_path) -> None:  # noqa: ANN001
    with pytest.raises(TableError, match="not found"):
        Table.from_file("x", tmp_path / "missing.csv")
    (tmp_path / "x.xlsx").write_text("?")
    with pytest.raises(TableError, match="unsupported"):
        Table.from_file("x", tmp_path / "x.xlsx")
    with pytest.raises(TableError, match="not found"):
        Trace(tmp_path / "missing.csv")


def test_trace_rows_extended_with_station_attributes(tmp_path) -> None:  # noqa: ANN001
    r = tmp_path / "readings.csv"
    r.write_text("time,station,speed\n0,773869,64\n0,999,50.5\n")
    s = tmp_path / "stations.csv"
    s.write_text("station,latitude,longitude,segment\n773869,34.1,-118.3,S21\n")
    tr = Trace(r, s)
    assert tr.schema.names == ("time", "station", "speed", "latitude", "longitude", "segment")
    assert tr.sensor_field == "station"
    assert list(tr.rows()) == [
        (0, "773869", 64.0, 34.1, -118.3, "S21"),
        (0, "999", 50.5, None, None, None),
    ]


def test_trace_reports_the_bad_line(tmp_path) -> None:  # noqa: ANN001
    r = tmp_path / "readings.csv"
    good = "".join(f"{60 * i},a,{i}.5\n" for i in range(3000))
    r.write_text("time,station,speed\n" + good + "999999,a,fast\n")
    with pytest.raises(TableError, match=":3002:"):
        list(Trace(r).rows())


def test_schema_make_and_errors() -> None:
    s = Schema([("time", "int"), ("v", "float")])
    assert s.make({"time": "3", "v": "1.5"}) == (3, 1.5)
    from fjords.errors import SchemaError

    with pytest.raises(SchemaError):
        s.make({"time": "x"})
    with pytest.raises(SchemaError):
        Schema([("a", "int")], time="time")
