"""The archive writes whole, ordered Parquet segments; a crash never leaves a partial one visible."""

from __future__ import annotations

import asyncio

import pyarrow.parquet as pq

from fjords.runtime.fjord import Fjord
from gateway.archive import ArchiveWriter, segments, write_segment
from gateway.daemon import TRAFFIC_SCHEMA
from tests.support import async_eventually


def rows(n: int, start: float = 0.0, step: float = 1.0) -> list[tuple]:
    return [(start + i * step, f"st{i % 3}", float(i), 34.0, -118.0, "S1") for i in range(n)]


async def test_segments_roll_by_rows_and_time_and_flush_on_exit(tmp_path) -> None:
    f = Fjord()
    f.add_stream("traffic", TRAFFIC_SCHEMA, sensor_field="station")
    data = rows(250) + rows(10, start=10_000)  # a jump in event time cuts a segment too
    async with ArchiveWriter(
        f, "traffic", tmp_path, segment_rows=100, segment_seconds=3600
    ) as arch:
        for t in data:
            f.push("traffic", t)
        f.run_until_idle()
        await async_eventually(  # the writer works in the background
            lambda: len(segments(tmp_path / "traffic")), lambda n: n >= 3, interval=0.05
        )
        assert len(segments(tmp_path / "traffic")) == 3  # 100 + 100 + 50 rows cut so far
    parts = segments(tmp_path / "traffic")
    assert [p.name[:13] for p in parts] == [
        "part-00000000",
        "part-00000001",
        "part-00000002",
        "part-00000003",
    ]
    got = [
        tuple(r.values())
        for p in parts
        for r in pq.read_table(p, columns=list(TRAFFIC_SCHEMA.names)).to_pylist()
    ]
    assert got == data
    assert pq.read_schema(parts[0]).names == ["gateway", *TRAFFIC_SCHEMA.names]
    assert len(arch.written) == 4


async def test_restart_continues_numbering_and_removes_crash_leftovers(tmp_path) -> None:
    d = tmp_path / "traffic"
    write_segment(d, 0, TRAFFIC_SCHEMA, rows(5))  # a legacy flat segment
    (d / ".part-00000001-deadbeef.parquet.tmp").write_bytes(b"half a file")  # what a crash leaves
    day = d / "gateway=gw1" / "date=1970-01-01"
    day.mkdir(parents=True)
    (day / ".part-00000002-deadbeef.parquet.tmp").write_bytes(b"half a file")
    f = Fjord()
    f.add_stream("traffic", TRAFFIC_SCHEMA, sensor_field="station")
    async with ArchiveWriter(f, "traffic", tmp_path, gateway="gw1") as arch:
        assert arch.seq == 1 and arch.temp_files_removed == 2
        assert not any(p.name.startswith(".") for p in d.rglob("*"))
        for t in rows(3, start=100):
            f.push("traffic", t)
    async with ArchiveWriter(f, "traffic", tmp_path, gateway="gw1") as arch:
        assert arch.seq == 2  # after the gateway's highest
        for t in rows(2, start=86_400 * 3):
            f.push("traffic", t)
    names = [p.relative_to(d).as_posix() for p in segments(d)]
    assert [n.rsplit("-", 1)[0] for n in names] == [
        "part-00000000",
        "gateway=gw1/date=1970-01-01/part-00000001",
        "gateway=gw1/date=1970-01-04/part-00000002",
    ]
    for p in segments(d):
        pq.read_table(p)  # every visible segment is whole


async def test_gateway_archives_its_stream_and_flushes_on_shutdown(tmp_path) -> None:
    from gateway.config import Config
    from gateway.daemon import Gateway

    cfg = Config()
    cfg.archive.dir = str(tmp_path)
    async with Gateway(cfg) as gw:
        for t in rows(7):
            gw.fjord.push("traffic", t)
    parts = segments(tmp_path / "traffic")
    assert sum(pq.read_table(p).num_rows for p in parts) == 7


async def test_many_small_segments_behind_a_slow_disk_are_all_written(
    tmp_path, monkeypatch
) -> None:
    """METR-LA readings come every 300 s: a segment per 5 minutes of event time is ~200 rows, and
    a fleet replayed as fast as possible cuts hundreds of them a second. None may be lost."""
    import time

    import gateway.archive as archive

    real = archive.commit_segment

    def slow(*a, **kw):
        time.sleep(0.002)
        return real(*a, **kw)

    monkeypatch.setattr(archive, "commit_segment", slow)
    f = Fjord()
    f.add_stream("traffic", TRAFFIC_SCHEMA, sensor_field="station")
    data = rows(3000, step=30.0)  # 10 rows per 300 s segment: 300 segments
    async with ArchiveWriter(f, "traffic", tmp_path, segment_seconds=300) as arch:
        for i in range(0, len(data), 500):
            for t in data[i : i + 500]:
                f.push("traffic", t)
            f.run_until_idle()  # cuts segments far faster than the disk writes them
            await asyncio.sleep(0)
    got = [
        tuple(r.values())
        for p in segments(tmp_path / "traffic")
        for r in pq.read_table(p, columns=list(TRAFFIC_SCHEMA.names)).to_pylist()
    ]
    assert got == data
    assert arch.stats()["rows_written"] == len(data)
    assert arch.stats()["rows_dropped"] == 0


async def test_a_full_writer_holds_the_stream_back_instead_of_dropping(tmp_path) -> None:
    f = Fjord()
    f.add_stream("traffic", TRAFFIC_SCHEMA, sensor_field="station")
    data = rows(2000)
    async with ArchiveWriter(
        f, "traffic", tmp_path, segment_rows=100, max_pending_rows=300, headroom_rows=200
    ) as arch:
        for t in data:
            f.push("traffic", t)
        f.run_until_idle()
        # bounded: behind at 300, then room for 200 more (and the segment that crossed it)
        assert arch.op.behind
        assert arch.pending_rows() <= 300 + 200 + 100
        assert arch.stats()["backpressure"] >= 1
        for _ in range(400):
            if arch.stats()["rows_written"] + arch.pending_rows() >= 1900:
                break
            f.run_until_idle()
            await asyncio.sleep(0.01)
    got = [
        tuple(r.values())
        for p in segments(tmp_path / "traffic")
        for r in pq.read_table(p, columns=list(TRAFFIC_SCHEMA.names)).to_pylist()
    ]
    assert got == data


async def test_a_failing_disk_is_retried_and_loses_nothing(tmp_path, monkeypatch) -> None:
    import gateway.archive as archive

    real = archive.commit_segment
    failures = {"n": 3}

    def flaky(*a, **kw):
        if failures["n"]:
            failures["n"] -= 1
            raise OSError(28, "No space left on device")
        return real(*a, **kw)

    monkeypatch.setattr(archive, "commit_segment", flaky)
    f = Fjord()
    f.add_stream("traffic", TRAFFIC_SCHEMA, sensor_field="station")
    data = rows(250)
    async with ArchiveWriter(f, "traffic", tmp_path, segment_rows=100, retry_seconds=0.01) as arch:
        for t in data:
            f.push("traffic", t)
        f.run_until_idle()
    got = [
        tuple(r.values())
        for p in segments(tmp_path / "traffic")
        for r in pq.read_table(p, columns=list(TRAFFIC_SCHEMA.names)).to_pylist()
    ]
    assert got == data
    assert arch.stats()["write_errors"] == 3


async def test_late_samples_are_archived_though_no_window_takes_them(tmp_path) -> None:
    """The archive is the stream as accepted: a sample too late for the Fjord's windows is still
    a reading (Spark jobs over the archive apply their own watermark)."""
    from fjords.runtime.progress import Watermark

    f = Fjord()
    f.add_stream("traffic", TRAFFIC_SCHEMA, sensor_field="station")
    data = rows(5, start=1000)
    late = rows(2, start=10)
    async with ArchiveWriter(f, "traffic", tmp_path) as arch:
        for t in data:
            f.push("traffic", t)
        f.streams["traffic"].queue.put(Watermark(2000.0))  # progress passes them by
        f.run_until_idle()
        for t in late:
            f.push("traffic", t)
        f.run_until_idle()
        assert f.streams["traffic"].router.late == 2
    got = [
        tuple(r.values())
        for p in segments(tmp_path / "traffic")
        for r in pq.read_table(p, columns=list(TRAFFIC_SCHEMA.names)).to_pylist()
    ]
    assert sorted(got) == sorted(data + late)
    assert arch.stats()["rows_written"] == 7
