"""The archive and the Spark queries are consumers: with `[archive] dir` set, the sensors of the
archived streams keep sampling (at `[archive] sample_period_s`, by default their own period)
though no query asks; a Spark query adds the demand its SQL implies, until it is removed; and
/sensors and EXPLAIN say whom a sensor samples for."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import pyarrow.parquet as pq
import pytest

from gateway.archive import segments
from gateway.config import Config, ConfigError
from gateway.daemon import Gateway
from proxies.manager import ProxyManager
from tests.daemon import Daemon
from tests.gateway.test_openapi import call
from tests.proxies.helpers import traffic_hello
from tests.support import ROOT, Broker, eventually, fleet_command, shared_file


def config(tmp_path: Path, sample_period_s: float | None = None) -> Config:
    cfg = Config()
    cfg.http.port = 0
    cfg.simulation = None
    cfg.archive.dir = str(tmp_path / "archive")
    cfg.archive.sample_period_s = sample_period_s
    return cfg


def with_sensors(gw: Gateway, n: int = 2) -> ProxyManager:
    """The gateway's proxies (as its sensor source makes them), with `n` sensors said hello."""
    pm = ProxyManager(gw.fjord, [], standing=gw.demands)
    gw.attach_proxies(pm)
    for i in range(n):
        pm.registry.create(traffic_hello(i, i % 2), 0.0)
    return pm


def entry(gw: Gateway, sid: str) -> dict[str, Any]:
    found = gw.sensor(sid)
    assert found is not None
    return found


def test_the_archive_keeps_every_sensor_sampling_at_its_own_period(tmp_path: Path) -> None:
    gw = Gateway(config(tmp_path))
    with_sensors(gw)
    for sid in ("s0", "s1"):
        e = entry(gw, sid)
        assert e["consumers"] == ["archive"] and e["queries"] == []
        # Every reading, at the sensor's own rate (300 s, as its hello says).
        assert e["wanted"]["program"] == "raw"
        assert e["wanted"]["sample_rate_hz"] == pytest.approx(1 / 300)
    qid = gw.add_query("SELECT speed FROM traffic WHERE segment = 'S1' AND speed > 50").id
    assert entry(gw, "s1")["consumers"] == ["archive", qid]
    assert entry(gw, "s1")["queries"] == [qid]
    assert entry(gw, "s1")["wanted"]["program"] == "raw"  # the archive takes every reading
    gw.remove_query(qid)
    assert entry(gw, "s1")["consumers"] == ["archive"]


def test_the_archive_samples_at_its_configured_period(tmp_path: Path) -> None:
    gw = Gateway(config(tmp_path, sample_period_s=60.0))
    pm = with_sensors(gw, 1)
    assert pm.proxies["s0"].demand.sample_period_s == 60.0
    assert entry(gw, "s0")["wanted"]["sample_rate_hz"] == pytest.approx(1 / 60)


def test_sample_period_zero_adds_no_demand_the_motes_sleep(tmp_path: Path) -> None:
    gw = Gateway(config(tmp_path, sample_period_s=0.0))
    with_sensors(gw)
    for sid in ("s0", "s1"):
        e = entry(gw, sid)
        assert e["consumers"] == [] and e["wanted"]["program"] == "sleep", e
    qid = gw.add_query("SELECT speed FROM traffic WHERE speed > 50").id
    assert entry(gw, "s0")["consumers"] == [qid]
    assert entry(gw, "s0")["wanted"]["program"] == "filter"  # only what the query takes


def test_sample_period_s_is_a_number_of_seconds_zero_or_more() -> None:
    assert Config.from_dict({"archive": {"sample_period_s": 0}}).archive.sample_period_s == 0
    assert Config.from_dict({}).archive.sample_period_s is None
    with pytest.raises(ConfigError, match="sample_period_s"):
        Config.from_dict({"archive": {"sample_period_s": -1}})


def test_without_an_archive_dir_sample_period_adds_nothing(tmp_path: Path) -> None:
    cfg = config(tmp_path, sample_period_s=60.0)
    cfg.archive.dir = None
    gw = Gateway(cfg)
    with_sensors(gw, 1)
    assert entry(gw, "s0")["wanted"]["program"] == "sleep"


def test_explain_names_the_archive_as_what_a_sensor_samples_for(tmp_path: Path) -> None:
    gw = Gateway(config(tmp_path))
    with_sensors(gw)
    plan = gw.explain("SELECT speed FROM traffic SAMPLE PERIOD 1 SECONDS")
    changes = {c["sensor"]: c for c in plan["sensor_changes"]}
    assert changes.keys() == {"s0", "s1"}
    assert changes["s0"]["consumers"] == ["archive"]
    assert changes["s0"]["before"]["program"] == "raw"
    assert changes["s0"]["after"]["sample_rate_hz"] == 1.0
    # The archive already takes every reading at the sensors' own rate.
    assert gw.explain("SELECT speed FROM traffic WHERE speed > 3")["sensor_changes"] == []


class FakeSpark:
    """SparkQueries as the registry uses it, without a JVM: jobs stay `starting`."""

    def __init__(self) -> None:
        self.jobs: dict[str, str] = {}

    def launch(self, qid: str, sql: str, **_: Any) -> dict[str, Any]:
        self.jobs[qid] = sql
        return self.status(qid)

    def status(self, qid: str) -> dict[str, Any]:
        return {"state": "starting", "engine": "spark"}

    async def stop(self, qid: str) -> None:
        del self.jobs[qid]

    async def __aexit__(self, *exc: object) -> None:
        self.jobs.clear()


@pytest.fixture
def fake_spark(monkeypatch: pytest.MonkeyPatch) -> FakeSpark:
    import gateway.queries as queries

    spark = FakeSpark()

    async def started(self: queries.QueryRegistry, archive: str) -> Any:
        self._spark = spark  # type: ignore[assignment]
        return spark

    monkeypatch.setattr(queries, "require_pyspark", lambda: None)
    monkeypatch.setattr(queries.QueryRegistry, "_spark_queries", started)
    return spark


async def test_a_spark_query_demands_what_its_sql_needs_until_it_is_removed(
    tmp_path: Path, fake_spark: FakeSpark
) -> None:
    gw = Gateway(config(tmp_path, sample_period_s=0.0))  # only what the queries take
    with_sensors(gw)
    assert entry(gw, "s1")["wanted"]["program"] == "sleep"
    sql = "SELECT station, speed FROM traffic WHERE segment = 'S1' AND speed > 50"
    qid = await gw.register(f"{sql} SAMPLE PERIOD 60 SECONDS", {"engine": "spark"})
    assert qid in fake_spark.jobs
    e = entry(gw, "s1")
    assert e["consumers"] == [qid] and e["queries"] == [qid]
    # Spark filters the archive, so the mote may send only what the query keeps.
    assert e["wanted"]["program"] == "filter"
    assert e["wanted"]["sample_rate_hz"] == pytest.approx(1 / 60)
    assert entry(gw, "s0")["wanted"]["program"] == "sleep"  # segment S0: not its concern
    assert gw.describe_query(qid)["demand"] == {
        "sample_period_s": 60.0,
        "lifetime_s": None,
        "fields": ["station", "speed", "segment"],
    }
    await gw.end_query(qid)
    assert entry(gw, "s1")["consumers"] == [] and entry(gw, "s1")["wanted"]["program"] == "sleep"


async def test_a_spark_query_and_the_archive_both_show_and_the_spec_holds(
    tmp_path: Path, fake_spark: FakeSpark
) -> None:
    """/sensors and a dry run answer as gateway/openapi.yaml says, consumers included."""
    cfg = config(tmp_path)
    async with Gateway(cfg) as gw:
        with_sensors(gw)
        qid = await gw.register("SELECT speed FROM traffic", {"engine": "spark"})
        host, port = await gw.start_http()
        base = f"http://{host}:{port}"
        async with aiohttp.ClientSession() as http:
            r = await call(http, base, "GET", "/sensors")
            sensors = json.loads(r.data)["sensors"]
            assert [s["consumers"] for s in sensors] == [["archive", qid]] * 2
            assert [s["queries"] for s in sensors] == [[qid]] * 2
            r = await call(http, base, "GET", "/sensors/s0")
            assert json.loads(r.data)["consumers"] == ["archive", qid]
            body = {"sql": "SELECT speed FROM traffic SAMPLE PERIOD 1 SECONDS", "dry_run": True}
            r = await call(http, base, "POST", "/queries", body)
            changes = json.loads(r.data)["sensor_changes"]
            assert [c["consumers"] for c in changes] == [["archive", qid]] * 2


# -- the real daemon, a real broker, a simulated fleet and no query ------------------------------


def half_day(tmp_path: Path) -> Path:
    """The first 12 hours of the METR-LA trace (every station)."""
    src = shared_file("data/metr-la/readings.csv")
    trace = tmp_path / "half-day.csv"
    with src.open() as f, trace.open("w") as out:
        out.write(f.readline())
        t0 = None
        for line in f:
            t = float(line.split(",", 1)[0])
            t0 = t if t0 is None else t0
            if t >= t0 + 43_200:
                break
            out.write(line)
    return trace


def archived_rows(archive: Path) -> int:
    return sum(pq.read_metadata(p).num_rows for p in segments(archive / "traffic"))


@pytest.mark.timeout(300)
def test_with_no_query_the_motes_sample_for_the_archive_and_it_gets_every_reading(
    broker: Broker, tmp_path: Path
) -> None:
    """Issue 28: with `[archive] dir` and no query the proxies put every mote to sleep and the
    archive stopped. Now the motes stay awake, /sensors says they sample for the archive, and
    every reading of the fleet ends up in the archive's segments."""
    stations = shared_file("data/metr-la/stations.csv")
    archive = tmp_path / "archive"
    report = tmp_path / "motes.json"
    conf = (
        f'[mqtt]\nurl = "mqtt://{broker.host}:{broker.port}"\n'
        f'[state]\ndir = "{tmp_path / "state"}"\n'
        f'[archive]\ndir = "{archive}"\nsegment_rows = 16\n'
    )
    n_motes = 3
    # 12 hours of 5-minute readings at 3,600 x real time: about 12 s of wall time, long
    # enough for a mote to be put to sleep many times over if nothing needed it.
    cmd = fleet_command(
        broker,
        half_day(tmp_path),
        stations,
        "--limit",
        str(n_motes),
        "--speedup",
        "3600",
        "--report",
        str(report),
    )
    with Daemon(tmp_path, conf) as gw:
        fleet = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.PIPE, text=True)
        try:

            def sampling() -> list[tuple[Any, ...]]:
                return [
                    (
                        s.get("consumers"),
                        s.get("queries"),
                        s["status"],
                        (s.get("wanted") or {}).get("program"),
                    )
                    for s in gw.get("/sensors")["sensors"]
                ]

            seen = eventually(
                sampling,
                lambda got: (
                    len(got) == n_motes
                    and all(g == (["archive"], [], "online", "raw") for g in got)
                ),
                message="every mote online, running raw for the archive",
                timeout=60,
                retry_on=(OSError,),
            )
            assert len(seen) == n_motes
            # Segments are written while the fleet runs (16 rows each), not only at shutdown.
            eventually(lambda: archived_rows(archive), lambda n: n >= 48, timeout=60)
            assert gw.get("/healthz")["status"] == "ok"
            _, err = fleet.communicate(timeout=240)
            assert fleet.returncode == 0, err
        finally:
            if fleet.poll() is None:
                fleet.kill()
                fleet.wait(timeout=10)
        m = re.search(r"sent (\d+) samples", err)
        assert m is not None, err
        sent = int(m.group(1))
        eventually(
            lambda: gw.metric("fjords_stream_tuples_in_total"),
            lambda n: n >= sent,
            message=f"{sent} readings taken in",
            timeout=60,
        )
    # Stopped (SIGTERM): the archive flushed its last segment.
    motes = json.loads(report.read_text())
    assert {sid: m["transitions"] for sid, m in motes.items()} == {sid: [] for sid in motes}
    assert sum(m["taken"] for m in motes.values()) == sent  # no mote skipped a reading
    assert archived_rows(archive) == sent
