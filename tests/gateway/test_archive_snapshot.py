"""The archive answers the part of a snapshot older than the history holds completely
(gateway/archive_reader.py): merged with the history at its `complete_from` (B) with no reading
counted twice or missed, late readings still pending in the writer included, a segment being
renamed into place counted once, earlier runs' segments read whole, and an unreadable segment
skipped, counted and named. An in-process gateway, readings pushed into its Fjord."""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from pathlib import Path

from gateway import metrics
from gateway.archive import commit_segment, segments, write_segment
from gateway.config import Config
from gateway.daemon import TRAFFIC_SCHEMA, Gateway
from tests.support import async_eventually

STATIONS = 3
GROUPED = "SELECT station, COUNT(*) AS n, SUM(speed) AS s FROM traffic {where} GROUP BY station"


def reading(t: float, i: int, speed: float | None = None) -> tuple:
    return (t, f"st{i % STATIONS}", float(i) if speed is None else speed, 34.0, -118.0, "S1")


def fleet(n: int = 360, step: float = 10.0) -> list[tuple]:
    """A reading every `step` s, stations in turn: times on every bucket edge of 60 s."""
    return [reading(i * step, i) for i in range(n)]


def config(tmp: Path, keep_s: float = 600.0) -> Config:
    cfg = Config()
    cfg.archive.dir = str(tmp)
    cfg.archive.segment_rows = 40
    cfg.archive.segment_seconds = 1e9  # segments of 40 rows each
    cfg.history.keep_s = keep_s
    cfg.max_lag_seconds = 1.0  # the watermark follows the readings (no idleness needed)
    return cfg


def brute(rows: list[tuple], t0: float, t1: float) -> dict[str, tuple[int, float]]:
    acc: dict[str, list[float]] = defaultdict(list)
    for t, st, v, *_ in rows:
        if t0 <= t < t1:
            acc[st].append(v)
    return {st: (len(vs), sum(vs)) for st, vs in acc.items()}


def grouped(body: dict) -> dict[str, tuple[int, float]]:
    return {r["station"]: (r["n"], r["s"]) for r in body["rows"]}


def feed(gw: Gateway, rows: list[tuple]) -> None:
    """Push one by one, routed as they come (the history evicts bucket by bucket)."""
    for t in rows:
        gw.fjord.push("traffic", t)
        gw.fjord.run_until_idle()


async def written(gw: Gateway) -> None:
    """Until the writer has nothing left to write (its input routed, its segments on disk)."""
    gw.fjord.run_until_idle()
    gw.archives["traffic"].op.cut()
    await async_eventually(
        lambda: gw.archives["traffic"].stats()["rows_pending"], lambda n: n == 0, interval=0.02
    )


async def test_the_archive_answers_what_the_history_evicted_and_b_is_counted_once(
    tmp_path,
) -> None:
    data = fleet()
    async with Gateway(config(tmp_path)) as gw:
        feed(gw, data)
        await written(gw)
        b = gw.histories["traffic"].complete_from
        to = gw.fjord.streams["traffic"].router.progress.watermark
        assert 0 < b < to
        assert any(t[0] == b for t in data)  # evicted up to a bucket edge a reading is on
        whole = gw.snapshot(GROUPED.format(where=""))
        assert whole["complete"] is True
        assert grouped(whole) == brute(data, 0, to)
        n = sum(c for c, _ in brute(data, 0, to).values())
        assert whole["sources"]["memory"] + whole["sources"]["archive"] == n
        assert whole["sources"]["archive"] == len([t for t in data if t[0] < b])
        # Around B: readings exactly on it, just before and just after, by cells and by readings.
        lo, hi = b - 30, b + 30
        for expr in ("SUM(speed)", "SUM(speed + 0)"):
            sql = GROUPED.format(where=f"WHERE time >= {lo} AND time < {hi}").replace(
                "SUM(speed)", expr
            )
            body = gw.snapshot(sql)
            assert body["complete"] is True, body
            assert grouped(body) == brute(data, lo, hi), expr
            assert body["sources"]["archive"] > 0 and body["sources"]["memory"] > 0
        rows = gw.snapshot(f"SELECT time, station FROM traffic WHERE time >= {lo} AND time < {hi}")
        want = Counter((t, st) for t, st, *_ in data if lo <= t < hi)
        assert Counter((r["time"], r["station"]) for r in rows["rows"]) == want
        # Entirely older than the history: the archive alone.
        old = gw.snapshot(GROUPED.format(where="WHERE time >= 100 AND time < 1000"))
        assert old["sources"]["memory"] == 0 and old["complete"] is True
        assert grouped(old) == brute(data, 100, 1000)


async def test_late_readings_still_pending_in_the_writer_are_counted(tmp_path) -> None:
    data = fleet()
    async with Gateway(config(tmp_path)) as gw:
        feed(gw, data)
        await written(gw)
        late = [reading(5.5, 1, speed=1000.0), reading(17.0, 2, speed=2000.0)]
        for t in late:
            gw.fjord.push("traffic", t)  # no await: the writer has not run since
        gw.fjord.run_until_idle()
        assert gw.archives["traffic"].stats()["rows_pending"] == 2
        to = gw.fjord.streams["traffic"].router.progress.watermark
        body = gw.snapshot(GROUPED.format(where=""))
        assert grouped(body) == brute(data + late, 0, to)
        await written(gw)
        assert gw.snapshot(GROUPED.format(where="")) == body  # written now: the same answer


async def test_a_segment_renamed_into_place_before_the_writer_hears_is_counted_once(
    tmp_path,
) -> None:
    data = fleet()
    async with Gateway(config(tmp_path)) as gw:
        feed(gw, data)
        await written(gw)
        arch = gw.archives["traffic"]
        extra = [reading(100.5 + i, i, speed=7.0) for i in range(40)]  # late: one segment
        for t in extra:
            gw.fjord.push("traffic", t)
        gw.fjord.run_until_idle()
        assert len(arch.ready) == 1
        # What the worker thread does before the event loop pops the segment off `ready`.
        commit_segment(
            arch.storage, "traffic", arch.gateway, arch.seq, TRAFFIC_SCHEMA, arch.ready[0]
        )
        to = gw.fjord.streams["traffic"].router.progress.watermark
        body = gw.snapshot(GROUPED.format(where=""))
        assert grouped(body) == brute(data + extra, 0, to)
        arch.ready.clear()  # the hand-written copy stands for the writer's
        arch.op.pending_rows = 0
        arch.seq += 1


async def test_earlier_runs_segments_are_read_whatever_their_time(tmp_path) -> None:
    before = [reading(3000.0 + i, i, speed=50.0) for i in range(6)]  # the last run's, recent
    write_segment(tmp_path / "traffic", 0, TRAFFIC_SCHEMA, before)
    data = fleet()
    async with Gateway(config(tmp_path)) as gw:
        feed(gw, data)
        await written(gw)
        to = gw.fjord.streams["traffic"].router.progress.watermark
        body = gw.snapshot(GROUPED.format(where=""))
        assert body["complete"] is True
        assert grouped(body) == brute(data + before, 0, to)


async def test_legacy_and_earlier_runs_segments_come_first_other_gateways_not_at_all(
    tmp_path,
) -> None:
    """A root shared with another gateway, holding this gateway's legacy flat segment and an
    earlier run's segment of the new layout: both are read whole (numbered below `first_seq`),
    the other gateway's readings never."""
    legacy = [reading(3000.0 + i, i, speed=50.0) for i in range(6)]
    write_segment(tmp_path / "traffic", 0, TRAFFIC_SCHEMA, legacy)
    cfg = config(tmp_path)
    async with Gateway(cfg) as gw:
        mine = gw.gateway_id
        arch = gw.archives["traffic"]
        assert arch.first_seq == 1
        earlier = [reading(3100.0 + i, i, speed=60.0) for i in range(4)]
        commit_segment(arch.storage, "traffic", mine, 1, TRAFFIC_SCHEMA, earlier)
        other = [reading(10.0 + i, i, speed=99.0) for i in range(5)]
        commit_segment(arch.storage, "traffic", f"not-{mine}", 0, TRAFFIC_SCHEMA, other)
    async with Gateway(cfg) as gw:
        arch = gw.archives["traffic"]
        assert arch.first_seq == arch.seq == 2
        data = fleet()
        feed(gw, data)
        await written(gw)
        to = gw.fjord.streams["traffic"].router.progress.watermark
        body = gw.snapshot(GROUPED.format(where=""))
        assert body["complete"] is True
        assert grouped(body) == brute(data + legacy + earlier, 0, to)


async def test_an_unreadable_segment_is_skipped_counted_and_named(tmp_path) -> None:
    data = fleet()
    async with Gateway(config(tmp_path)) as gw:
        feed(gw, data)
        await written(gw)
        parts = segments(tmp_path / "traffic")
        bad = parts[1]
        bad.write_bytes(b"not a parquet file at all")
        (bad.parent / ".part-99999999-abcdef.parquet.tmp").write_bytes(b"half")
        lost = [t for t in data if t in set(_rows_of(parts[1], data))]
        to = gw.fjord.streams["traffic"].router.progress.watermark
        for _ in range(2):
            body = gw.snapshot(GROUPED.format(where=""))
            assert body["complete"] is False
            assert body["skipped"] == [bad.name]
        want = brute([t for t in data if t not in lost], 0, to)
        assert grouped(body) == want
        # Counted once per file, however often a snapshot meets it.
        assert gw.archive_history is not None
        text = metrics.render(
            gw.fjord,
            gw.sensors,
            gw.hub_stats,
            unreadable=gw.archive_history.unreadable_counts(),
        ).decode()
        assert re.search(
            r'^fjords_archive_segments_unreadable_total\{stream="traffic"\} 1\.0$', text, re.M
        )


def _rows_of(path: Path, data: list[tuple]) -> list[tuple]:
    """The 40 readings segment `path` held (segments are cut every 40 in order of arrival)."""
    seq = int(path.name[5:13])
    return data[seq * 40 : (seq + 1) * 40]


async def test_without_an_archive_the_older_part_is_missing_and_said_so(tmp_path) -> None:
    cfg = config(tmp_path)
    cfg.archive.dir = None
    async with Gateway(cfg) as gw:
        feed(gw, fleet())
        body = gw.snapshot(GROUPED.format(where=""))
        assert body["complete"] is False and "archive" not in body["sources"]
