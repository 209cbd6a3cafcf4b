"""gateway/archive_layout.py: where segments go, which ones a reader takes, how URLs are kept."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fjords.schema import Field, Schema
from gateway.archive_layout import (
    GATEWAY_ID,
    Segment,
    Storage,
    arrow_schema,
    compact_name,
    date_of,
    declared_schema,
    gateways,
    live,
    next_seq,
    parse_name,
    part_name,
    schema_version,
    segment_metadata,
    segments,
)

SCHEMA = Schema([Field("time", "float"), Field("station", "str"), Field("speed", "float")], "time")


def seg(first: int, last: int | None = None) -> Segment:
    last = first if last is None else last
    return Segment(f"d/{first}-{last}", "g", "2026-01-01", first, last, last != first)


def test_names_parse_back_and_foreign_files_are_not_segments() -> None:
    p7 = parse_name("d", part_name(7), "g", "2026-01-01")
    assert p7 is not None and (p7.first, p7.last, p7.compacted, p7.date) == (
        7,
        7,
        False,
        "2026-01-01",
    )
    assert p7.path.startswith("d/part-00000007-") and p7.name == p7.path[2:]
    s = parse_name("d", compact_name(3, 9), "g", "2026-01-01")
    assert s is not None and (s.first, s.last, s.compacted) == (3, 9, True)
    p = parse_name("d", part_name(12), None, None)
    assert p is not None and (p.first, p.last, p.compacted, p.gateway) == (12, 12, False, None)
    for name in (".part-00000001-ab.parquet.tmp", "_SUCCESS", "notes.txt", "part-1.parquet"):
        assert parse_name("d", name, "g", None) is None
    assert parse_name("d", "compact-00000009-00000003-ab.parquet", "g", None) is None


def test_a_reader_takes_each_part_once_preferring_the_compacted_file() -> None:
    # parts 0..5; a compacted 0..3 whose inputs 2 and 3 were not yet deleted (a crash)
    found = sorted(
        [seg(2), seg(3), seg(4), seg(5), seg(0, 3)], key=lambda s: (s.first, -s.last, s.path)
    )
    assert [(s.first, s.last) for s in live(found)] == [(0, 3), (4, 4), (5, 5)]
    # a second compaction 0..5 over the first one and the later parts
    found = sorted(found + [seg(0, 5)], key=lambda s: (s.first, -s.last, s.path))
    assert [(s.first, s.last) for s in live(found)] == [(0, 5)]
    assert next_seq(found) == 6 and next_seq([]) == 0


def test_segments_lists_a_gateways_dates_and_the_legacy_flat_layout(tmp_path) -> None:
    st = Storage(tmp_path)
    t = pa.table({"x": [1]})
    d1 = st.path("traffic", "gateway=a", "date=2026-01-01")
    d2 = st.path("traffic", "gateway=a", "date=2026-01-02")
    st.commit(d1, part_name(0), t)
    st.commit(d2, part_name(1), t)
    st.commit(st.path("traffic", "gateway=b", "date=2026-01-01"), part_name(0), t)
    st.commit(st.path("traffic"), part_name(0), t)  # a legacy segment
    (tmp_path / "traffic" / "gateway=a" / "date=2026-01-01" / ".part-x.tmp").write_bytes(b"")
    assert gateways(st, "traffic") == ["a", "b"]
    a = segments(st, "traffic", "a")
    assert [(s.first, s.date) for s in a] == [(0, "2026-01-01"), (1, "2026-01-02")]
    assert [s.gateway for s in segments(st, "traffic", None)] == [None]
    assert segments(st, "missing", "a") == [] and gateways(st, "missing") == []
    assert pq.read_table(st.open_input(a[1].path)).num_rows == 1


def test_file_urls_and_paths_name_the_same_root_and_spark_gets_urls(tmp_path) -> None:
    assert Storage(f"file://{tmp_path}").root == Storage(tmp_path).root == str(tmp_path)
    st = Storage(tmp_path)
    assert st.local and st.spark_url(st.path("traffic")) == f"file://{tmp_path}/traffic"
    with pytest.raises(ValueError, match="nosuch://x"):
        Storage("nosuch://x/archive")


def test_commit_is_whole_and_leaves_no_temporary_file(tmp_path) -> None:
    st = Storage(tmp_path)
    d = st.path("traffic", "gateway=a", "date=2026-01-01")
    path = st.commit(d, part_name(0), pa.table({"x": [1, 2]}))
    assert [p.name for p in (tmp_path / "traffic" / "gateway=a" / "date=2026-01-01").iterdir()] == [
        path.rsplit("/", 1)[1]
    ]
    st.delete(path)
    st.delete(path)  # gone already: nothing to do
    assert segments(st, "traffic", "a") == []


def test_metadata_carries_the_gateway_stream_and_declared_schema() -> None:
    meta = segment_metadata("gw-1", "traffic", SCHEMA)
    assert declared_schema(meta) == [("time", "float"), ("station", "str"), ("speed", "float")]
    assert declared_schema(None) is None and declared_schema({}) is None
    other = Schema([Field("time", "float"), Field("speed", "int")], "time")
    assert schema_version(SCHEMA) != schema_version(other) == schema_version(other)
    assert arrow_schema(SCHEMA, gateway=True).names == ["gateway", "time", "station", "speed"]
    assert arrow_schema(SCHEMA).names == ["time", "station", "speed"]


def test_dates_and_ids() -> None:
    assert date_of(0) == "1970-01-01" and date_of(1.7e9) == "2023-11-14"
    assert date_of(1e15) == "9999-12-31" and date_of(-1e15) == "0000-00-00"
    assert GATEWAY_ID.match("cabinet-7.site_2") and not GATEWAY_ID.match("../etc")
    assert not GATEWAY_ID.match("a/b") and not GATEWAY_ID.match("")
