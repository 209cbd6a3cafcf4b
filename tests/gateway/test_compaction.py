"""Archive compaction: the same rows once each, before, during and after; idempotent; only
closed, quiet dates; unreadable segments kept; safe under a Spark file stream."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fjords.schema import Field, Schema
from gateway.archive_layout import (
    COMPACT_QUIET_S,
    STREAM_MAX_FILE_AGE_S,
    Segment,
    Storage,
    arrow_schema,
    date_of,
    live,
    part_name,
    segment_metadata,
    segments,
)
from gateway.cli import main
from gateway.compaction import (
    CompactionError,
    Footer,
    Rewrite,
    commit_rewrite,
    compact,
    file_stats,
    leftovers,
    plan_date,
    read_footer,
    read_inputs,
)

SCHEMA = Schema(
    [Field("time", "float"), Field("station", "str"), Field("speed", "float")], time="time"
)
DAY = 86_400.0
NOW = time.time()
#: midday, ten and nine days ago: two closed dates
D1 = (NOW // DAY - 10) * DAY + DAY / 2
D2 = D1 + DAY
OLD = NOW - 3 * DAY  # the parts' mtime: long quiet


def table(gw: str, t0: float, n: int, stream: str = "traffic") -> pa.Table:
    schema = arrow_schema(SCHEMA, gateway=True).with_metadata(segment_metadata(gw, stream, SCHEMA))
    return pa.table(
        {
            "gateway": [gw] * n,
            "time": [t0 + i for i in range(n)],
            "station": [f"s{i % 7}" for i in range(n)],
            "speed": [float(i % 60) for i in range(n)],
        },
        schema=schema,
    )


def write_part(
    storage: Storage, gw: str, seq: int, t0: float, n: int = 100, mtime: float | None = OLD
) -> str:
    directory = storage.path("traffic", f"gateway={gw}", f"date={date_of(t0)}")
    path = storage.commit(directory, part_name(seq), table(gw, t0, n))
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def read_live(storage: Storage, gw: str) -> list[tuple]:
    out = []
    for s in live(segments(storage, "traffic", gw)):
        out += [tuple(r.values()) for r in pq.read_table(s.path).to_pylist()]
    return out


def fill(storage: Storage, gateways: tuple[str, ...] = ("A", "B"), today: bool = True) -> None:
    """Per gateway: parts 0-4 on D1, 5-9 on D2 (quiet), 10-11 today (fresh)."""
    for gw in gateways:
        for i in range(10):
            write_part(storage, gw, i, (D1 if i < 5 else D2) + i * 1000)
        if today:
            for i in (10, 11):
                write_part(storage, gw, i, NOW - 60 + i, mtime=None)


def names(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*.parquet"))


@pytest.fixture
def storage(tmp_path: Path) -> Storage:
    s = Storage(tmp_path / "archive")
    fill(s)
    return s


# -- what it does ----------------------------------------------------------------------------


def test_compaction_keeps_every_row_per_gateway_in_order(storage: Storage) -> None:
    before = {gw: read_live(storage, gw) for gw in ("A", "B")}
    report = compact(storage)
    assert (report.dates, report.files_in, report.files_out, report.rows) == (4, 20, 4, 2000)
    assert report.skipped == {"today": 2}
    assert {gw: read_live(storage, gw) for gw in ("A", "B")} == before
    found = segments(storage, "traffic", "A")
    assert [(s.compacted, s.first, s.last) for s in found] == [
        (True, 0, 4),
        (True, 5, 9),
        (False, 10, 10),
        (False, 11, 11),
    ]
    meta = pq.read_schema(found[0].path).metadata
    assert {k: v for k, v in meta.items() if k.startswith(b"fjords.")} == segment_metadata(
        "A", "traffic", SCHEMA
    )
    assert pq.read_schema(found[0].path).names == ["gateway", "time", "station", "speed"]


def test_a_second_run_does_nothing(storage: Storage) -> None:
    compact(storage)
    root = Path(storage.root)
    files = names(root)
    again = compact(storage)
    assert (again.dates, again.files_in, again.leftovers_deleted) == (0, 0, 0)
    assert names(root) == files


def test_target_rows_cuts_the_output_and_stays_idempotent(storage: Storage) -> None:
    before = read_live(storage, "A")
    report = compact(storage, gateway="A", target_rows=250)  # 100-row parts: 2 + 2 + 1 a date
    assert (report.files_in, report.files_out) == (8, 4)
    again = compact(storage, gateway="A", target_rows=250)
    assert again.files_in == 0
    assert read_live(storage, "A") == before


def test_a_crash_between_commit_and_delete_is_seen_once_and_finished(storage: Storage) -> None:
    before = read_live(storage, "A")
    found = segments(storage, "traffic", "A")
    day1 = [s for s in found if s.date == date_of(D1)]
    footers = {s.path: read_footer(storage, s.path) for s in day1}
    (group,) = plan_date(live(found), date_of(D1), footers, 10_000)
    rw = Rewrite("traffic", "A", date_of(D1), tuple(group), 500)
    commit_rewrite(
        storage, rw, read_inputs(storage, rw), file_stats(storage, [s.path for s in group])
    )
    # stopped here: the compacted file and its five inputs both exist
    assert len(segments(storage, "traffic", "A")) == len(found) + 1
    assert read_live(storage, "A") == before
    assert len(leftovers(segments(storage, "traffic", "A"))) == 5
    report = compact(storage, gateway="A")
    assert report.leftovers_deleted == 5 and report.files_in == 5  # the deletes, then day 2
    assert read_live(storage, "A") == before
    assert leftovers(segments(storage, "traffic", "A")) == []


def test_two_compacted_copies_of_the_same_parts_leave_one(storage: Storage) -> None:
    """Two runs at once (the daemon's and an operator's): readers take one, the next run
    deletes the other."""
    before = read_live(storage, "A")
    found = segments(storage, "traffic", "A")
    day1 = [s for s in found if s.date == date_of(D1)]
    rw = Rewrite("traffic", "A", date_of(D1), tuple(day1), 500)
    stats = file_stats(storage, [s.path for s in day1])
    for _ in range(2):
        commit_rewrite(storage, rw, read_inputs(storage, rw), stats)
    assert read_live(storage, "A") == before
    compact(storage, gateway="A")
    assert read_live(storage, "A") == before
    d1 = [s for s in segments(storage, "traffic", "A") if s.date == date_of(D1)]
    assert [(s.compacted, s.first, s.last) for s in d1] == [(True, 0, 4)]


def test_the_compacted_file_is_dated_before_its_oldest_input(storage: Storage) -> None:
    compact(storage, gateway="A")
    c = next(s for s in segments(storage, "traffic", "A") if s.compacted)
    assert os.stat(c.path).st_mtime < OLD - STREAM_MAX_FILE_AGE_S


def test_only_closed_quiet_dates_are_rewritten(tmp_path: Path) -> None:
    storage = Storage(tmp_path)
    for i in range(3):  # an old date, written just now (a backlog replayed)
        write_part(storage, "A", i, D1 + i, mtime=None)
    for i in range(3, 6):  # today, written long ago (a clock that jumped)
        write_part(storage, "A", i, NOW - 30 + i, mtime=OLD)
    report = compact(storage)
    assert report.files_in == 0 and report.skipped == {"not quiet": 1, "today": 1}
    forced = compact(storage, quiet_s=0)
    assert forced.files_in == 3 and forced.skipped == {"today": 1}
    assert COMPACT_QUIET_S == 2 * STREAM_MAX_FILE_AGE_S


def test_an_unreadable_segment_is_named_counted_and_kept(storage: Storage) -> None:
    before = read_live(storage, "A")
    bad = next(s for s in segments(storage, "traffic", "A") if s.first == 2)
    good = [r for r in before if not (D1 + 2000 <= r[1] < D1 + 2000 + 100)]
    Path(bad.path).write_bytes(b"not parquet at all")
    os.utime(bad.path, (OLD, OLD))
    report = compact(storage, gateway="A")
    assert report.unreadable == [bad.path]
    assert Path(bad.path).exists()
    d1 = [s for s in segments(storage, "traffic", "A") if s.date == date_of(D1)]
    assert [(s.first, s.last) for s in d1] == [(0, 1), (2, 2), (3, 4)]  # never merged over
    rows = []
    for s in live(segments(storage, "traffic", "A")):
        if s.path != bad.path:
            rows += [tuple(r.values()) for r in pq.read_table(s.path).to_pylist()]
    assert rows == good


# -- planning (pure) -------------------------------------------------------------------------


def seg(n: int, date: str, *, last: int | None = None) -> Segment:
    last = n if last is None else last
    kind = f"compact-{n:08d}-{last:08d}" if last != n else f"part-{n:08d}"
    return Segment(f"/r/date={date}/{kind}-0.parquet", "A", date, n, last, last != n)


def test_plan_keeps_runs_contiguous_in_the_gateways_numbering() -> None:
    """A backlog for an old date written between today's parts: merging 0 and 2 would make a
    compacted file covering part 1 of another date, which readers would then skip."""
    found = [seg(0, "d1"), seg(1, "d2"), seg(2, "d1"), seg(3, "d1")]
    footers = {s.path: Footer(10, "k") for s in found}
    assert plan_date(found, "d1", footers, 1000) == [[found[2], found[3]]]


def test_plan_splits_where_the_schema_changes_and_at_target_rows() -> None:
    found = [seg(i, "d") for i in range(6)]
    footers = {s.path: Footer(10, "v1" if s.first < 3 else "v2") for s in found}
    assert plan_date(found, "d", footers, 1000) == [found[:3], found[3:]]
    assert plan_date(found, "d", footers, 20) == [found[:2], found[3:5]]


def test_leftovers_are_only_wholly_covered_files_of_the_same_date() -> None:
    c = seg(0, "d", last=2)
    found = sorted(
        [c, seg(0, "d"), seg(1, "d"), seg(2, "d"), seg(3, "d")],
        key=lambda s: (s.first, -s.last, s.path),
    )
    assert [s.first for s in leftovers(found)] == [0, 1, 2]


# -- storage it cannot honour ----------------------------------------------------------------


def test_object_storage_needs_no_file_streams() -> None:
    storage = Storage("mock:///archive")
    for i in range(3):
        write_part(storage, "A", i, D1 + i, mtime=None)
    with pytest.raises(CompactionError, match="mtime cannot be set"):
        compact(storage, quiet_s=0)
    report = compact(storage, quiet_s=0, file_streams=False)
    assert (report.files_in, report.files_out) == (3, 1)


def test_a_missing_root_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(CompactionError, match="no such directory"):
        compact(Storage(tmp_path / "nope"))


# -- the CLI ---------------------------------------------------------------------------------


def test_cli_dry_run_json_and_exit_codes(storage: Storage, capsys: pytest.CaptureFixture) -> None:
    root = Path(storage.root)
    files = names(root)
    assert main(["archive", "compact", "--dir", str(root), "--dry-run", "--json"]) == 0
    out, err = capsys.readouterr()
    dry = json.loads(out)
    assert dry["dry_run"] and (dry["files_in"], dry["files_out"], dry["rows"]) == (20, 4, 2000)
    assert "would rewrite 5 files" in err and "date=" in err
    assert names(root) == files  # nothing changed
    assert main(["archive", "compact", "--dir", str(root), "--gateway", "A"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("rewrote 2 dates: 10 files (1,000 rows")
    bad = next(s for s in segments(storage, "traffic", "B") if s.first == 1)
    Path(bad.path).write_bytes(b"garbage")
    os.utime(bad.path, (OLD, OLD))
    assert main(["archive", "compact", "--dir", str(root), "--json"]) == 1
    out, err = capsys.readouterr()
    assert json.loads(out)["unreadable"] == [bad.path] and bad.path in err


def test_cli_refuses_a_stream_or_gateway_it_does_not_find(
    storage: Storage, capsys: pytest.CaptureFixture
) -> None:
    root = str(storage.root)
    assert main(["archive", "compact", "--dir", root, "--stream", "trafic"]) == 2
    assert "no such stream" in capsys.readouterr().err
    assert main(["archive", "compact", "--dir", root, "--gateway", "C"]) == 2
    assert "no such gateway" in capsys.readouterr().err


def test_cli_exit_code_of_a_missing_root(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "archive", "compact", "--dir", str(tmp_path / "x")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2 and "no such directory" in run.stderr


# -- under a Spark file stream ----------------------------------------------------------------


def stream_once(spark, source: str, checkpoint: Path, out: Path) -> None:
    """One `availableNow` run of a file stream over a gateway's directory into Parquet."""
    from pyspark.sql.types import DoubleType, StringType, StructField, StructType

    schema = StructType(
        [
            StructField("gateway", StringType()),
            StructField("time", DoubleType()),
            StructField("station", StringType()),
            StructField("speed", DoubleType()),
        ]
    )
    df = (
        spark.readStream.schema(schema)
        .option("maxFileAge", f"{int(STREAM_MAX_FILE_AGE_S)}s")
        .parquet(source)
    )
    q = (
        df.writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    assert q.awaitTermination(300), "the availableNow run did not end"
    assert q.exception() is None


def sink_rows(spark, out: Path) -> list[tuple]:
    df = spark.read.parquet(str(out)).select("gateway", "time", "station", "speed")
    return sorted(tuple(r) for r in df.collect())


@pytest.mark.needs_spark
def test_a_file_stream_sees_every_reading_once_across_a_compaction(spark, tmp_path: Path) -> None:
    """The stream has seen nothing newer than the date it compacts (a gateway that stopped
    writing): the compacted copy must still be too old for it, yet read by a fresh stream."""
    storage = Storage(tmp_path / "archive")
    for i in range(5):
        write_part(storage, "A", i, D1 + i * 1000)
    source = storage.spark_url(storage.path("traffic", "gateway=A"))
    stream_once(spark, source, tmp_path / "ck", tmp_path / "out")
    assert len(sink_rows(spark, tmp_path / "out")) == 500
    assert compact(storage).files_in == 5
    for i in (5, 6):
        write_part(storage, "A", i, NOW - 60 + i, mtime=None)
    expected = sorted(read_live(storage, "A"))
    assert len(expected) == 700
    stream_once(spark, source, tmp_path / "ck", tmp_path / "out")  # from its checkpoint
    assert sink_rows(spark, tmp_path / "out") == expected
    stream_once(spark, source, tmp_path / "ck2", tmp_path / "out2")  # a fresh stream
    assert sink_rows(spark, tmp_path / "out2") == expected


# -- the daemon's schedule ---------------------------------------------------------------------


async def test_the_daemon_compacts_its_own_days_on_schedule(tmp_path: Path) -> None:
    import aiohttp

    from gateway.config import Config
    from gateway.daemon import Gateway
    from tests.support import async_eventually

    cfg = Config()
    cfg.archive.dir = str(tmp_path / "archive")
    cfg.archive.compact_every_s = 3600.0  # the first run is at start
    cfg.http.port = 0
    storage = Storage(cfg.archive.dir)
    me = cfg.gateway.id
    fill(storage, (me, "other"), today=False)
    before = read_live(storage, me)
    async with Gateway(cfg) as gw:
        stats = gw.compaction_stats
        assert stats is not None
        await async_eventually(lambda: stats.runs, lambda n: n >= 1, timeout=60)
        host, port = await gw.start_http(port=0)
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://{host}:{port}/metrics") as resp,
        ):
            text = await resp.text()
    assert "fjords_archive_compactions_total 1.0" in text
    assert "fjords_archive_compacted_files_total 10.0" in text
    assert "fjords_archive_compacted_rows_total 1000.0" in text
    assert read_live(storage, me) == before
    assert all(s.compacted for s in segments(storage, "traffic", me))
    assert not any(s.compacted for s in segments(storage, "traffic", "other"))  # not its own


def test_a_killed_runs_stale_temporary_file_is_removed(storage: Storage) -> None:
    directory = Path(storage.path("traffic", "gateway=A", f"date={date_of(D1)}"))
    stale = directory / ".compact-00000000-00000004-0123456789ab.parquet.tmp"
    fresh = directory / ".compact-00000000-00000004-ba9876543210.parquet.tmp"
    stale.write_bytes(b"half")
    os.utime(stale, (OLD, OLD))
    fresh.write_bytes(b"another run's, still writing")
    report = compact(storage, gateway="A")
    assert report.temp_files_removed == 1
    assert not stale.exists() and fresh.exists()


def test_the_schedule_is_refused_where_it_cannot_be_safe() -> None:
    from gateway.config import Config, ConfigError

    cfg = Config()
    cfg.archive.dir = "s3://bucket/archive"
    cfg.archive.compact_every_s = 3600.0
    with pytest.raises(ConfigError, match="not local storage"):
        cfg.validate()  # `--check-config` says so too, before any storage is opened
