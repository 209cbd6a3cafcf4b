"""Spark queries that heal, and Spark outside the gateway process (Spark Connect).

Unit tests of the parts (the supervisor with a job whose driver dies, the hub's notices, the
Connect results read back, the config), then real daemons (`fjords-gateway run` in a subprocess: killing their JVM must not touch the test
process's own Spark) over an archive of the METR-LA week's first day; a Spark Connect server
started once for the module from the pyspark wheel. Outside CI the tests skip without pyspark or
a JDK; under CI=true they fail instead.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from gateway.spark.sources import trace_table, write_segment
from tests.daemon import Daemon
from tests.support import eventually, free_port, require, shared_file

needs_spark = pytest.mark.needs_spark

Q1 = (
    "SELECT segment, AVG(speed) AS avg_speed FROM traffic [RANGE 15 MINUTES] "
    "WHERE segment IN ('S05','S14') GROUP BY segment"
)
Q_OTHER = (
    "SELECT segment, COUNT(*) AS n FROM traffic [RANGE 1 HOUR] "
    "WHERE segment = 'S05' GROUP BY segment"
)
DAY = 86400
WATERMARK_S = 300  # the supervisor's default watermark, "5 minutes"
#: fast supervision for the tests (a healed job is back within seconds of its new session);
#: the first restart waits 8 s, so `/healthz` stays degraded that long at least (a loaded
#: machine's test process still sees it)
SUPERVISION = (
    'poll_s = 0.5\nrestart_backoff_s = 8\nrestart_backoff_max_s = 8\ntrigger = "2 seconds"\n'
)


@pytest.fixture(scope="module")
def week() -> pa.Table:
    require(importlib.util.find_spec("pyspark") is not None, "pyspark (pip install -e '.[dev]')")
    require(shutil.which("java") is not None, "a JDK on PATH (Debian package openjdk-17-jre)")
    return trace_table(
        shared_file("data/metr-la/readings.csv"), shared_file("data/metr-la/stations.csv")
    )


@pytest.fixture(scope="module")
def days(week: pa.Table) -> list[pa.Table]:
    """The week's first two days, each one archive segment."""
    t0 = week["time"][0].as_py()
    return [
        week.filter(
            pc.and_(
                pc.greater_equal(week["time"], t0 + d * DAY),
                pc.less(week["time"], t0 + (d + 1) * DAY),
            )
        )
        for d in range(2)
    ]


# -- the parts --------------------------------------------------------------------------------


class _FakeJob:
    """A StreamingJob whose driver can die (`status()` raises) and whose start can be held."""

    def __init__(self, spark: object, hold: threading.Event | None) -> None:
        self.spark = spark
        self.hold = hold
        self.dead = False
        self.started = False

        class _Query:
            columns = ("segment", "avg_speed")

        self.query = _Query()

    def start(self) -> None:
        if self.hold is not None:
            assert self.hold.wait(30), "the test never let the restart through"
        self.started = True

    def stop(self) -> None:
        pass

    def status(self) -> dict[str, Any]:
        if self.dead:
            raise ConnectionRefusedError("[Errno 111] Connection refused")
        return {"engine": "spark", "state": "running", "columns": list(self.query.columns)}


async def test_a_status_call_that_raises_restarts_the_job_on_a_fresh_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    from gateway.spark import supervisor
    from gateway.spark.session import SparkConfig

    sessions = iter(["session-1", "session-2"])
    discarded: list[object] = []
    monkeypatch.setattr(supervisor, "get_session", lambda config: next(sessions))
    monkeypatch.setattr(supervisor, "session_alive", lambda spark: spark != "session-1")
    monkeypatch.setattr(supervisor, "discard_session", discarded.append)
    hold = threading.Event()
    jobs: list[_FakeJob] = []
    events: list[tuple[str, dict]] = []
    changed = asyncio.Event()

    def on_event(event: str, data: dict) -> None:
        events.append((event, data))
        changed.set()

    cfg = SparkConfig(poll_s=0.01, restart_backoff_s=0, restart_backoff_max_s=0)
    async with supervisor.SparkQueries(cfg, archive_root=tmp_path, state_dir=tmp_path) as q:

        def make_job(query_id: str, sql: str, streams: object, sink: object) -> _FakeJob:
            spark = supervisor.get_session(cfg)
            if not supervisor.session_alive(spark) and jobs:
                supervisor.discard_session(spark)
                spark = supervisor.get_session(cfg)
            jobs.append(_FakeJob(spark, hold if jobs else None))
            return jobs[-1]

        monkeypatch.setattr(q, "_make_job", make_job)
        q.launch("q", "SELECT ...", on_event=on_event)
        async with asyncio.timeout(30):
            while q.status("q")["state"] != "running":
                await asyncio.sleep(0.01)
        assert q.health() == []
        jobs[0].dead = True  # the JVM killed
        async with asyncio.timeout(30):
            await changed.wait()
        assert events == [("error", {"error": events[0][1]["error"], "restarting": True})]
        assert "the Spark driver is gone: ConnectionRefusedError" in events[0][1]["error"]
        st = q.status("q")
        assert st["state"] == "restarting" and st["restarts"] == 1, st
        (reason,) = q.health()
        assert "spark query q is down" in reason and "Connection refused" in reason
        changed.clear()
        hold.set()
        async with asyncio.timeout(30):
            await changed.wait()
        assert [e for e, _ in events] == ["error", "restarted"]
        assert events[1][1]["restarts"] == 1
        st = q.status("q")
        assert st["state"] == "running" and st["restarts"] == 1
        assert "Connection refused" in st["last_error"]
        assert discarded == ["session-1"] and jobs[1].spark == "session-2" and jobs[1].started
        assert q.health() == []


async def test_a_job_down_more_than_max_restarts_times_fails_for_good(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    from gateway.spark import supervisor
    from gateway.spark.session import SparkConfig

    monkeypatch.setattr(supervisor, "session_alive", lambda spark: True)
    failed: list[tuple[str, bool]] = []
    done = asyncio.Event()
    cfg = SparkConfig(poll_s=0.01, restart_backoff_s=0, restart_backoff_max_s=0, max_restarts=1)
    async with supervisor.SparkQueries(cfg, archive_root=tmp_path, state_dir=tmp_path) as q:
        jobs: list[_FakeJob] = []

        def make_job(*args: object) -> _FakeJob:
            jobs.append(_FakeJob("s", None))
            jobs[-1].dead = len(jobs) > 1 or bool(failed)  # every restart dies again
            return jobs[-1]

        def on_failed(reason: str, ran: bool) -> None:
            failed.append((reason, ran))
            done.set()

        monkeypatch.setattr(q, "_make_job", make_job)
        q.launch("q", "SELECT ...", on_failed=on_failed)
        async with asyncio.timeout(30):
            while not jobs or not jobs[0].started:
                await asyncio.sleep(0.01)
        jobs[0].dead = True
        async with asyncio.timeout(30):
            await done.wait()
        ((reason, ran),) = failed
        assert ran and reason.startswith("failed 2 times: the Spark driver is gone")
        assert q.status("q")["state"] == "failed" and q.status("q")["restarts"] == 1


async def test_notices_reach_the_subscribers_that_asked_in_their_place() -> None:
    from gateway.results import ResultHub

    hub = ResultHub()
    told = hub.subscribe("q", notices=True)
    plain = hub.subscribe("q")
    hub.publish("q", [{"a": 1}, {"a": 2}])
    hub.notify("q", "error", {"error": "gone", "restarting": True})
    hub.publish("q", [{"a": 3}])
    hub.notify("q", "restarted", {"restarts": 1})
    got = [await told.next_batch() for _ in range(4)]
    assert [(b.rows, b.notices) for b in got if b is not None] == [
        ([{"a": 1}, {"a": 2}], []),
        ([], [{"event": "error", "error": "gone", "restarting": True}]),
        ([{"a": 3}], []),
        ([], [{"event": "restarted", "restarts": 1}]),
    ]
    batch = await plain.next_batch()
    assert batch is not None and batch.rows == [{"a": 1}, {"a": 2}, {"a": 3}]
    assert plain.pending() == 0 and batch.notices == []


def test_connect_results_are_read_back_once_each_in_order(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    from gateway.spark.supervisor import BatchFiles

    def batch(i: int, rows: list[dict], complete: bool = True) -> None:
        d = tmp_path / f"batch={i}"
        d.mkdir()
        pq.write_table(pa.Table.from_pylist(rows), d / "part-0.parquet")
        if complete:
            (d / "_SUCCESS").touch()

    batch(0, [{"w": 0.0}])  # an earlier run's: delivered then
    got: list[tuple[int, list[dict]]] = []
    files = BatchFiles(tmp_path, lambda i, rows: got.append((i, rows)))
    batch(1, [{"w": 2.0}, {"w": 1.0}])
    batch(2, [{"w": 3.0}], complete=False)  # still being written
    assert files.poll() == 1
    assert got == [(1, [{"w": 1.0}, {"w": 2.0}])]
    (tmp_path / "batch=2" / "_SUCCESS").touch()
    assert files.poll() == 1 and files.poll() == 0
    assert got[-1] == (2, [{"w": 3.0}])
    shutil.rmtree(tmp_path / "batch=2")  # a replay of the last batch rewrites it
    batch(2, [{"w": 3.0}])
    assert files.poll() == 0 and len(got) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["batch=2"]  # delivered ones pruned


def test_spark_remote_and_cores_max_settings(tmp_path: Path) -> None:
    from gateway.config import Config, ConfigError
    from gateway.spark.session import SparkConfig

    with pytest.raises(ValueError, match="master and remote are exclusive"):
        SparkConfig.from_mapping({"master": "local[1]", "remote": "sc://h:15002"})
    with pytest.raises(ValueError, match="sc://host:port"):
        SparkConfig(remote="http://h:15002")
    with pytest.raises(ValueError, match="cores_max sizes the gateway's own driver"):
        SparkConfig(remote="sc://h:15002", cores_max=2)
    with pytest.raises(ValueError, match="driver_memory: set on the Connect server"):
        SparkConfig(remote="sc://h:15002", driver_memory="1g")
    assert SparkConfig(cores_max=2).settings()["spark.cores.max"] == "2"
    remote = SparkConfig(remote="sc://h:15002").settings()
    assert "spark.ui.enabled" not in remote and remote["spark.sql.session.timeZone"] == "UTC"
    path = tmp_path / "g.toml"
    path.write_text('[spark]\nmaster = "local[1]"\nremote = "sc://h:15002"\n')
    with pytest.raises(ConfigError, match="master and remote are exclusive"):
        Config.load(path)
    path.write_text('[spark]\nremote = "sc://h:15002"\nrestart_backoff_max_s = 4\n')
    spark = SparkConfig.from_mapping(Config.load(path).spark)
    assert spark.remote == "sc://h:15002" and spark.restart_backoff_max_s == 4


# -- real daemons -------------------------------------------------------------------------------


def _expected(day: pa.Table) -> dict[tuple[str, float], float]:
    """Q1 over one day by pandas: (segment, window_start) -> avg_speed, for the windows the
    watermark has closed at the day's end."""
    df = day.to_pandas()
    df = df[df.segment.isin(["S05", "S14"])]
    df = df.assign(window_start=(df.time // 900) * 900)
    avg = df.groupby(["segment", "window_start"]).speed.mean()
    closed = df.time.max() - WATERMARK_S
    return {(s, float(w)): float(v) for (s, w), v in avg.items() if w + 900 <= closed}


def _windows(rows: list[dict]) -> dict[tuple[str, float], float]:
    return {(r["segment"], r["window_start"]): r["avg_speed"] for r in rows}


def _assert_matches(got: dict[tuple[str, float], float], want: dict[tuple[str, float], float]):
    assert set(want) <= set(got), sorted(set(want) - set(got))[:5]
    for k, v in want.items():
        assert abs(got[k] - v) < 1e-6, (k, got[k], v)


class Events(threading.Thread):
    """A query's SSE stream read in the background: rows and the other events, in order."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.resp = urllib.request.urlopen(url, timeout=600)
        self.seen: list[tuple[str, Any]] = []  # ("row", {...}) / ("error", {...}) / ...

    def run(self) -> None:
        event, data = "row", ""
        try:
            for raw in self.resp:
                line = raw.decode().rstrip("\n")
                if line.startswith("event: "):
                    event = line.removeprefix("event: ")
                elif line.startswith("data: "):
                    data = line.removeprefix("data: ")
                elif line == "" and data:
                    self.seen.append((event, json.loads(data)))
                    event, data = "row", ""
        except (OSError, ValueError):
            pass

    @property
    def rows(self) -> list[dict]:
        return [d for e, d in list(self.seen) if e == "row"]

    def events(self) -> list[str]:
        return [e for e, _ in list(self.seen) if e != "row"]


def _children(pid: int) -> list[tuple[int, str]]:
    """(pid, command name) of every descendant of `pid`, from /proc."""
    parents: dict[int, list[int]] = {}
    names: dict[int, str] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        parents.setdefault(ppid, []).append(int(d.name))
        names[int(d.name)] = name
    out, todo = [], list(parents.get(pid, []))
    while todo:
        p = todo.pop()
        out.append((p, names.get(p, "?")))
        todo += parents.get(p, [])
    return out


def _javas(pid: int) -> list[int]:
    return [p for p, name in _children(pid) if name == "java"]


def _spark_daemon(tmp: Path, spark: str, segments: list[pa.Table]) -> Daemon:
    archive = tmp / "archive"
    for i, seg in enumerate(segments):
        write_segment(archive, seg, i, gateway="edge-1")
    return Daemon(
        tmp,
        f'[simulation]\nenabled = false\n[archive]\ndir = "{archive}"\n'
        f'[state]\ndir = "{tmp / "state"}"\n'
        f"[spark]\n{spark}shuffle_partitions = 2\n{SUPERVISION}",
    )


def _query(gw: Daemon, qid: str) -> dict:
    return gw.get(f"/queries/{qid}")


def _running(gw: Daemon, sql: str, timeout: float = 240) -> str:
    qid = gw.post("/queries", {"sql": sql, "engine": "spark"})["id"]
    body = eventually(
        lambda: _query(gw, qid),
        lambda b: b["state"] != "starting",
        timeout=timeout,
        message=lambda: f"query {qid} started; {gw.tail()}",
    )
    assert body["state"] == "running", body
    return qid


#: day-1 windows as each mode gave them, compared by the Connect test
SEEN: dict[str, dict[tuple[str, float], float]] = {}


@needs_spark
def test_killing_the_spark_jvm_heals_the_query(tmp_path: Path, days: list[pa.Table]) -> None:
    want = _expected(days[0])
    gw = _spark_daemon(tmp_path, 'master = "local[1]"\ndriver_memory = "512m"\n', days[:1])
    with gw:
        qid = _running(gw, Q1)
        events = Events(f"{gw.url}/queries/{qid}/results")
        events.start()
        eventually(lambda: len(events.rows) >= len(want), timeout=240, message=lambda: gw.tail())
        day1 = _windows(events.rows)
        _assert_matches(day1, want)
        SEEN["master"] = day1
        assert gw.get("/healthz")["status"] == "ok"

        (java,) = _javas(gw.proc.pid)  # type: ignore[union-attr]
        os.kill(java, signal.SIGKILL)
        health = eventually(
            lambda: gw.get("/healthz"),
            lambda h: h["status"] == "degraded",
            timeout=60,
            message=lambda: gw.tail(),
        )
        assert any(qid in r for r in health["reasons"]), health
        body = eventually(
            lambda: _query(gw, qid),
            lambda b: b["state"] == "running",
            timeout=240,
            message=lambda: gw.tail(),
        )
        assert body["spark"]["restarts"] == 1, body
        assert "gone" in body["spark"]["last_error"], body
        assert gw.metric(f'fjords_spark_restarts_total{{query="{qid}"}}') == 1
        assert gw.get("/healthz")["status"] == "ok"
        eventually(lambda: "restarted" in events.events(), timeout=60)
        assert events.events() == ["error", "restarted"], events.seen[-5:]
        error = next(d for e, d in events.seen if e == "error")
        assert error["restarting"] is True and "gone" in error["error"]

        # The next day's segment: its windows come, and no window comes twice.
        write_segment(tmp_path / "archive", days[1], 1, gateway="edge-1")
        day2_start = days[1]["time"][0].as_py()
        eventually(
            lambda: any(r["window_start"] >= day2_start + 3600 for r in events.rows),
            timeout=240,
            message=lambda: gw.tail(),
        )
        keys = [(r["segment"], r["window_start"]) for r in events.rows]
        assert len(keys) == len(set(keys)), "a window was delivered twice"
        assert {k for k in keys if k[1] < day2_start - 900} >= set(want)

        # A new Spark query after the crash runs on the fresh session.
        other = _running(gw, Q_OTHER)
        assert _query(gw, other)["spark"]["restarts"] == 0


# -- Spark Connect ----------------------------------------------------------------------------


class ConnectServer:
    """A Spark Connect server from the wheel on 127.0.0.1 (local[1], 1g); its Python workers
    (foreachBatch) run this venv's python, which imports `gateway`."""

    def __init__(self, log: Path) -> None:
        import pyspark

        self.home = Path(pyspark.__file__).parent
        (self.jar,) = (self.home / "jars").glob("spark-connect_*.jar")
        self.log = log
        self.port = free_port()
        self.url = f"sc://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_HOME": str(self.home)}
        cmd = [
            str(self.home / "bin" / "spark-submit"),
            "--class",
            "org.apache.spark.sql.connect.service.SparkConnectServer",
            "--master",
            "local[1]",
            "--driver-memory",
            "1g",
            *("--conf", "spark.connect.grpc.binding.address=127.0.0.1"),
            *("--conf", f"spark.connect.grpc.binding.port={self.port}"),
            *("--conf", "spark.ui.enabled=false"),
            str(self.jar),
        ]
        with self.log.open("a") as out:
            self.proc = proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=out)

        def listening() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"the Connect server exited: {self.tail()}")
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True

        eventually(listening, timeout=180, retry_on=(OSError,))

    def kill(self) -> None:
        """kill -9 of its JVM (spark-submit execs java) and every process under it."""
        assert self.proc is not None
        for pid, _ in _children(self.proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.kill()
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def tail(self) -> str:
        return self.log.read_text()[-3000:] if self.log.exists() else ""


@pytest.fixture(scope="module")
def connect_server(
    tmp_path_factory: pytest.TempPathFactory, week: pa.Table
) -> Iterator[ConnectServer]:
    server = ConnectServer(tmp_path_factory.mktemp("connect") / "server.log")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@needs_spark
def test_spark_connect_runs_the_query_outside_the_gateway_process(
    tmp_path: Path, days: list[pa.Table], connect_server: ConnectServer
) -> None:
    want = _expected(days[0])
    gw = _spark_daemon(tmp_path, f'remote = "{connect_server.url}"\n', days[:1])
    with gw:
        qid = _running(gw, Q1)
        events = Events(f"{gw.url}/queries/{qid}/results")
        events.start()
        eventually(
            lambda: len(events.rows) >= len(want),
            timeout=240,
            message=lambda: f"{gw.tail()}\n{connect_server.tail()}",
        )
        day1 = _windows(events.rows)
        _assert_matches(day1, want)
        if "master" in SEEN:  # the same rows as the driver in the gateway process gave
            assert day1 == pytest.approx(SEEN["master"])
        assert _javas(gw.proc.pid) == [], _children(gw.proc.pid)  # type: ignore[union-attr]

        # The Connect server killed and started again: the query heals as in-process.
        connect_server.kill()
        health = eventually(
            lambda: gw.get("/healthz"),
            lambda h: h["status"] == "degraded",
            timeout=60,
            message=lambda: gw.tail(),
        )
        assert any(qid in r for r in health["reasons"]), health
        connect_server.start()
        body = eventually(
            lambda: _query(gw, qid),
            lambda b: b["state"] == "running",
            timeout=240,
            message=lambda: f"{gw.tail()}\n{connect_server.tail()}",
        )
        assert body["spark"]["restarts"] == 1, body
        assert "gone" in body["spark"]["last_error"], body
        eventually(lambda: "restarted" in events.events(), timeout=60)
        assert events.events() == ["error", "restarted"], events.seen[-5:]
        write_segment(tmp_path / "archive", days[1], 1, gateway="edge-1")
        day2_start = days[1]["time"][0].as_py()
        eventually(
            lambda: any(r["window_start"] >= day2_start + 3600 for r in events.rows),
            timeout=240,
            message=lambda: f"{gw.tail()}\n{connect_server.tail()}",
        )
        keys = [(r["segment"], r["window_start"]) for r in events.rows]
        assert len(keys) == len(set(keys)), "a window was delivered twice"
        assert _javas(gw.proc.pid) == []  # type: ignore[union-attr]
