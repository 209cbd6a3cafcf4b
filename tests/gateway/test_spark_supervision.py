"""Spark queries that heal, and Spark outside the gateway process (Spark Connect).

Real daemons (`fjords-gateway run` in a subprocess: killing their JVM must not touch the test
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

pytestmark = pytest.mark.needs_spark

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
#: fast supervision for the tests (a healed job is back within seconds of its new session)
SUPERVISION = "poll_s = 0.5\nrestart_backoff_s = 1\nrestart_backoff_max_s = 4\n"


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
        write_segment(archive / "traffic", seg, i)
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
        assert gw.get("/healthz")["status"] == "ok"
        eventually(lambda: "restarted" in events.events(), timeout=60)
        assert events.events() == ["error", "restarted"], events.seen[-5:]
        error = next(d for e, d in events.seen if e == "error")
        assert error["restarting"] is True and "gone" in error["error"]

        # The next day's segment: its windows come, and no window comes twice.
        write_segment(tmp_path / "archive" / "traffic", days[1], 1)
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
        write_segment(tmp_path / "archive" / "traffic", days[1], 1)
        day2_start = days[1]["time"][0].as_py()
        eventually(
            lambda: any(r["window_start"] >= day2_start + 3600 for r in events.rows),
            timeout=240,
            message=lambda: f"{gw.tail()}\n{connect_server.tail()}",
        )
        keys = [(r["segment"], r["window_start"]) for r in events.rows]
        assert len(keys) == len(set(keys)), "a window was delivered twice"
        assert _javas(gw.proc.pid) == []  # type: ignore[union-attr]
