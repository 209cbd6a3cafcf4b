"""Static tables and traces from CSV and Parquet, with clear errors for bad files."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import fjords.trace
from fjords.schema import Schema
from fjords.tables import Table, TableError
from fjords.trace import Trace


@pytest.fixture(autouse=True)
def _pyarrow_even_for_small_files(monkeypatch) -> None:
    """Small files are read by the Python rules alone; these tests read theirs with pyarrow."""
    import fjords.tables
    import fjords.trace

    monkeypatch.setattr(fjords.tables, "SMALL_BYTES", 0)
    monkeypatch.setattr(fjords.trace, "SMALL_BYTES", 0)


def test_csv_table_types_and_identifiers(tmp_path) -> None:
    p = tmp_path / "incidents.csv"
    p.write_text(
        "incident_id,time,segment,description,severity\n001,1330614600,S25,Collision,2.5\n"
    )
    t = Table.from_file("incidents", p)
    assert t.schema.names == ("incident_id", "time", "segment", "description", "severity")
    assert [f.type for f in t.schema.fields] == ["str", "int", "str", "str", "float"]
    assert t.rows == [("001", 1330614600, "S25", "Collision", 2.5)]


def test_parquet_table_equals_csv_table(tmp_path) -> None:
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
def test_bad_csv_files(tmp_path, content: str, message: str) -> None:
    p = tmp_path / "bad.csv"
    p.write_text(content)
    with pytest.raises(TableError, match=message):
        Table.from_file("bad", p)


def test_missing_and_unsupported_files(tmp_path) -> None:
    with pytest.raises(TableError, match="not found"):
        Table.from_file("x", tmp_path / "missing.csv")
    (tmp_path / "x.xlsx").write_text("?")
    with pytest.raises(TableError, match="unsupported"):
        Table.from_file("x", tmp_path / "x.xlsx")
    with pytest.raises(TableError, match="not found"):
        Trace(tmp_path / "missing.csv")


def test_trace_rows_extended_with_station_attributes(tmp_path) -> None:
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


def test_trace_reports_the_bad_line(tmp_path) -> None:
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


# -- the pyarrow readers give exactly what the value-at-a-time rules give -----------------------


@pytest.mark.parametrize("block", [None, 4096])  # one batch; many, most without a NULL
def test_trace_fast_path_equals_python_rules(tmp_path, monkeypatch, block: int | None) -> None:
    if block is not None:
        monkeypatch.setattr(fjords.trace, "BLOCK_BYTES", block)
    r = tmp_path / "readings.csv"
    lines = [f"{60 * i},{700 + i % 7},{i % 90}.25" for i in range(5000)]
    lines[10] = "600,701,"  # an empty value is NULL
    lines[11] = '660,"",3'  # a quoted empty value too
    r.write_text("time, station ,speed\n" + "\n".join(lines) + "\n\n")
    s = tmp_path / "stations.csv"
    s.write_text("station,segment,lat\n700,S1,34.5\n701,S2,34.6\n702,S3,\n")
    tr = Trace(r, s)
    fast = list(tr.rows())
    assert fast == list(tr._python_rows())
    assert fast[10] == (600, "701", None, "S2", 34.6)
    assert fast[11] == (660, None, 3.0, None, None)
    assert fast[0] == (0, "700", 0.25, "S1", 34.5)
    assert sum(len(b) for b in tr.batches()) == 5000
    assert block is None or len(list(tr.batches())) > 10


@pytest.mark.parametrize(
    "bad, message",
    [
        ("999999,a,fast", r":5003: field 'speed': cannot read 'fast' as float"),
        ("999999,a", ":5003: expected 3 values, got 2"),
        ("0x10,a,1", r":5003: field 'time': cannot read '0x10' as int"),  # pyarrow reads 16
        ("12.5,a,1", r":5003: field 'time': cannot read '12.5' as int"),
    ],
)
def test_trace_bad_line_after_many_batches(tmp_path, monkeypatch, bad: str, message: str) -> None:
    """An error deep in the file (after whole batches were read by pyarrow) names its line."""
    import fjords.trace as trace_mod

    r = tmp_path / "readings.csv"
    good = "".join(f"{60 * i},a,{i}.5\n" for i in range(5001))
    r.write_text("time,station,speed\n" + good + bad + "\n" + "1,a,2\n")
    monkeypatch.setattr(trace_mod, "BLOCK_BYTES", 4096)  # many pyarrow batches first
    monkeypatch.setattr(trace_mod, "BATCH_ROWS", 1000)
    fast = Trace(r)._arrow_batches()
    assert len(next(fast)) > 100  # pyarrow read the first block itself
    fast.close()
    got = []
    with pytest.raises(TableError, match=message):
        for row in Trace(r).rows():
            got.append(row)
    assert len(got) == 5001 and got[-1] == (300000, "a", 5000.5)  # every good row, once


def test_trace_numerals_only_python_reads_still_read(tmp_path) -> None:
    """pyarrow refuses '1_000' and '+5'; the rows from there on are read by the Python rules."""
    r = tmp_path / "readings.csv"
    r.write_text("time,station,speed\n0,a,1.5\n60,a,1_000\n120,a,+5\n+180,a,2\n")
    tr = Trace(r)
    assert list(tr.rows()) == [
        (0, "a", 1.5),
        (60, "a", 1000.0),
        (120, "a", 5.0),
        (180, "a", 2.0),
    ]


@pytest.mark.parametrize(
    "times",
    [
        ["0", "60", "-120", "007", "999999999999999999"],  # plain numerals: cast by pyarrow
        ["0", "+60", "120"],  # '+60', ' 120', 19 digits: Python's int() per value
        ["0", " 60", "120"],
        ["0", "60", "1234567890123456789"],
    ],
)
@pytest.mark.parametrize("many", [False, True])
def test_trace_int_times_read_as_python_reads_them(
    tmp_path,
    monkeypatch: pytest.MonkeyPatch,
    times: list[str],
    many: bool,
) -> None:
    """Each distinct time is read by int() when there are few (a time per sampling round);
    when there are many, plain decimal numerals are cast by pyarrow (in C), any other by
    int(): the rows are those of the Python rules either way."""
    import fjords.trace

    if many:
        monkeypatch.setattr(fjords.trace, "MANY_WORDS", 0)
    r = tmp_path / "readings.csv"
    r.write_text("time,station,speed\n" + "".join(f"{t},a,1.5\n" for t in times))
    tr = Trace(r)
    rows = list(tr.rows())
    assert rows == list(tr._python_rows())
    assert [t for t, _, _ in rows] == [int(t) for t in times]


def test_parquet_trace_equals_csv_trace(tmp_path) -> None:
    csv_path = tmp_path / "r.csv"
    csv_path.write_text("time,station,speed\n0,700,1.5\n60,701,\n120,,3\n")
    pq.write_table(
        pa.table(
            {
                "time": pa.array([0, 60, 120], pa.int64()),
                "station": pa.array([700, 701, None], pa.int64()),
                "speed": pa.array([1.5, None, 3.0], pa.float64()),
            }
        ),
        tmp_path / "r.parquet",
    )
    s = tmp_path / "stations.csv"
    s.write_text("station,segment\n700,S1\n701,S2\n")
    a, b = Trace(csv_path, s), Trace(tmp_path / "r.parquet", s)
    assert a.schema == b.schema
    assert (
        list(a.rows())
        == list(b.rows())
        == [
            (0, "700", 1.5, "S1"),
            (60, "701", None, "S2"),
            (120, None, 3.0, None),
        ]
    )


@pytest.mark.parametrize(
    "column, kind",
    [
        (["1", "-2", ""], "int"),
        (["1", "2.5", "1e3", ".5"], "float"),
        ([" 5", "+6"], "int"),  # Python reads these; pyarrow does not
        (["1_000", "2"], "int"),
        (["0x10", "1"], "str"),  # pyarrow would read 16
        ([str(2**70), "1"], "int"),  # past int64
        (["inf", "nan", "1"], "float"),
        (["a", "1"], "str"),
        (["", ""], "int"),
    ],
)
def test_csv_table_types_as_python_rules(tmp_path, column: list[str], kind: str) -> None:
    from fjords.schema import convert, infer_type
    from fjords.tables import _load_csv_python

    p = tmp_path / "t.csv"
    p.write_text("v,w\n" + "".join(f"{v},x\n" for v in column))
    t = Table.from_file("t", p)
    assert t.schema.type_of("v") == kind == infer_type(column)
    expect = [convert(v, kind, "v") for v in column]
    got = [r[0] for r in t.rows]
    assert [repr(x) for x in got] == [repr(x) for x in expect]  # nan == nan by repr
    assert repr(_load_csv_python(p)[1]) == repr(t.rows)


def test_csv_table_not_utf8(tmp_path) -> None:
    p = tmp_path / "t.csv"
    p.write_bytes(b"a,b\n\xff\xfe,1\n")
    with pytest.raises(TableError, match="not a text CSV file"):
        Table.from_file("t", p)


def test_ndjson_rows_parse_to_the_rows(tmp_path) -> None:
    """The batch encoder writes one JSON object per row, keys in order, like the dict rules."""
    import io
    import json

    from fjords.output import ndjson_printer

    out = io.StringIO()
    rows = [("S1", 1.5, 0.0), (None, 2, 2**70), ('é\n"%s', True, float("inf")), ("x", 1e16, -1)]
    COLS = ("segment", "avg speed", "window_start")
    ndjson_printer(3, ("segment", "avg speed", "window_start"), out)(rows)
    ndjson_printer(1, ("query", "x"), out)([(5, 1)])  # a column named "query" wins over the number
    got = [json.loads(line) for line in out.getvalue().splitlines()]
    assert got == [
        {"query": 3, **dict(zip(("segment", "avg speed", "window_start"), r, strict=True))}
        for r in rows
    ] + [{"query": 5, "x": 1}]
    assert [list(g) for g in got[:1]] == [["query", "segment", "avg speed", "window_start"]]
    # The same text as json.dumps of the row's dict: the Spark engine's lines compare equal.
    expect = "".join(
        json.dumps({"query": 3, **dict(zip(COLS, r, strict=True))}) + "\n" for r in rows
    )
    assert out.getvalue().startswith(expect)


def test_reading_a_trace_does_not_import_pandas(tmp_path) -> None:
    """pyarrow's conversions to numpy import pandas where it is installed (~170 ms of a
    `python -m fjords` run): the trace reader takes its dictionary indices from their
    buffer instead. In a fresh interpreter, as the command line runs."""
    import subprocess
    import sys

    r = tmp_path / "readings.csv"
    r.write_text("time,station,speed\n" + "".join(f"{i},{i % 7},{i}.5\n" for i in range(500)))
    code = (
        "import sys, fjords.trace as t; t.SMALL_BYTES = 0; "
        f"rows = list(t.Trace({str(r)!r}).rows()); "
        "assert len(rows) == 500 and rows[1] == (1, '1', 1.5), rows[:2]; "
        "print('pandas' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
