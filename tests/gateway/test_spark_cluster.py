"""Spark on a real standalone cluster (a master and one 1-core worker from the pyspark wheel):
the same rows as local Spark, byte for byte, for a batch and for a streaming job over a fleet's
archive (two gateways under one root, every reading attributed to its gateway), and a
streaming job whose driver is killed mid-run resumes from its checkpoint without duplicates.

Each job on the cluster is a `fjords-gateway spark ...` subprocess, as a user runs it: a
driver in client mode on this box, executors on the worker. The same command on local Spark
runs in this process, on the `spark` fixture's session (no JVM of its own). One cluster for
the module; a day of the METR-LA trace on a few segments keeps each job small.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from tests.spark_cluster import (
    Cluster,
    cluster_fixture,
    java_descendants,
    kill_session,
    require_spark,
    session_processes,
)
from tests.support import ROOT, ResultRows, eventually, free_port, shared_file

pytestmark = pytest.mark.needs_spark

cluster = cluster_fixture("module")

DAY = 86400
SEGMENTS = ("S04", "S06", "S07", "S22", "S25", "S27")  # the day's incidents are on these
#: the fleet: each gateway has the stations of some segments (a cabinet each)
GATEWAYS = {"cabinet-a": SEGMENTS[:3], "cabinet-b": SEGMENTS[3:]}
PIECES = 6  # archive segments the day is cut into

# The paper's Query 2 (test_spark.py): a windowed aggregate joined with the incidents table.
Q2 = (
    "SELECT i.incident_id, i.description, s.segment, AVG(s.speed) AS avg_speed "
    "FROM traffic AS s [RANGE 30 MINUTES], incidents AS i "
    "WHERE i.segment = s.segment AND i.time >= NOW - 30 MINUTES AND i.time < NOW "
    "GROUP BY i.incident_id, i.description, s.segment HAVING AVG(s.speed) < 40"
)
Q_SEGMENTS = (
    "SELECT segment, AVG(speed) AS avg_speed, COUNT(*) AS n FROM traffic [RANGE 15 MINUTES] "
    "GROUP BY segment"
)
Q_GATEWAYS = "SELECT gateway, COUNT(*) AS n FROM traffic [RANGE 1 HOUR] GROUP BY gateway"
# The same on both sides (the `spark` fixture's), so float sums add up in the same order.
SHUFFLE = ["--conf", "spark.sql.shuffle.partitions=2"]
JOB_TIMEOUT = 300  # an upper bound for a loaded machine, never a measurement


@pytest.fixture(scope="module")
def metr_la() -> dict[str, Path]:
    return {
        "readings": shared_file("data/metr-la/readings.csv"),
        "stations": shared_file("data/metr-la/stations.csv"),
        "incidents": shared_file("data/metr-la/incidents-sample.csv"),
    }


@pytest.fixture(scope="module")
def pieces(metr_la: dict[str, Path]) -> list[pa.Table]:
    """The trace's first day on SEGMENTS, as the gateway archives it, cut into PIECES."""
    require_spark()
    from gateway.spark.sources import trace_table

    week = trace_table(metr_la["readings"], metr_la["stations"])
    t0 = week["time"][0].as_py()
    keep = pc.and_(pc.less(week["time"], t0 + DAY), pc.is_in(week["segment"], pa.array(SEGMENTS)))
    day = week.filter(keep)
    step = -(-day.num_rows // PIECES)
    return [day.slice(i * step, step) for i in range(PIECES)]


def write_piece(root: Path, piece: pa.Table, seq: int) -> None:
    """One piece of the day as each gateway archives its own stations' part of it."""
    from gateway.spark.sources import write_segment

    for gateway, segments in GATEWAYS.items():
        mine = piece.filter(pc.is_in(piece["segment"], pa.array(segments)))
        write_segment(root, mine, seq, gateway=gateway)


@pytest.fixture(scope="module")
def archive(pieces: list[pa.Table], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fleet's archive root: ROOT/traffic/gateway=<id>/date=<day>/part-*.parquet."""
    root = tmp_path_factory.mktemp("archive")
    for i, piece in enumerate(pieces):
        write_piece(root, piece, i)
    return root


def _cli(args: list[str]) -> list[str]:
    """`fjords-gateway ARGS` as a subprocess command line."""
    return [sys.executable, "-m", "gateway.cli", *args]


def _local(args: list[str], *, master: str = "local[*]") -> int:
    """`fjords-gateway ARGS` in this process: its driver is the `spark` fixture's session (one
    JVM for the whole run, which getOrCreate reuses; `local[2]`, all cores of a 2-core box)."""
    from gateway.cli import main

    return main([*args, "--master", master, *SHUFFLE])


def _cluster_args(cluster: Cluster, args: list[str]) -> list[str]:
    return _cli([*args, "--master", cluster.url, *cluster.conf_args(), *SHUFFLE])


def _start_on_cluster(cluster: Cluster, args: list[str]) -> subprocess.Popen[str]:
    """`fjords-gateway ARGS` as a driver process on `cluster` (`_finish` waits for it)."""
    return subprocess.Popen(
        _cluster_args(cluster, args), cwd=ROOT, env=cluster.env, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip


def _finish(proc: subprocess.Popen[str]) -> str:
    """The stdout of a driver process run to its end (its stderr in the failure if it exits
    non-zero); killed if it outlives JOB_TIMEOUT."""
    try:
        out, err = proc.communicate(timeout=JOB_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, f"the driver exited {proc.returncode}:\n{err[-4000:]}"
    return out


def _on_cluster(cluster: Cluster, args: list[str]) -> str:
    return _finish(_start_on_cluster(cluster, args))


def _sink_rows(out: Path) -> list[dict[str, Any]]:
    """Every row a `parquet:` sink holds (each batch directory once), in a stable order."""
    from gateway.spark.batch import sort_rows

    rows: list[dict[str, Any]] = []
    for f in sorted(out.glob("batch=*/*.parquet")):
        rows.extend(pq.read_table(f).to_pylist())
    return sort_rows(rows)


def _committed_batches(out: Path) -> list[int]:
    """The batch ids whose output the sink has committed (Spark's _SUCCESS marker)."""
    return sorted(
        int(d.name.split("=", 1)[1]) for d in out.glob("batch=*") if (d / "_SUCCESS").exists()
    )


def _past(batch: int) -> Callable[[list[int]], bool]:
    """Whether a list of committed batches has one after `batch`."""
    return lambda batches: max(batches) > batch


def _stream_args(archive: Path, checkpoint: Path, out: Path, *extra: str) -> list[str]:
    return [
        "spark", "run", "--query", Q_SEGMENTS, "--archive", str(archive), "--checkpoint", str(checkpoint),
        "--sink", f"parquet:{out}", *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def local_streamed(
    spark: Any, archive: Path, tmp_path_factory: pytest.TempPathFactory
) -> list[dict[str, Any]]:
    """`spark run --available-now` over the whole archive on local Spark: the reference rows."""
    d = tmp_path_factory.mktemp("local-stream")
    assert _local(_stream_args(archive, d / "ckpt", d / "out", "--available-now")) == 0
    rows = _sink_rows(d / "out")
    assert len(rows) > 100
    return rows


@pytest.fixture
def driver(cluster: Cluster) -> Iterator[list[subprocess.Popen[Any]]]:
    """Driver processes a test starts (in sessions of their own); killed with all they spawned
    if still there after it."""
    procs: list[subprocess.Popen[Any]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=30)
        kill_session(p.pid)


def test_a_batch_query_on_the_cluster_prints_the_same_bytes_as_local(
    spark: Any,
    cluster: Cluster,
    archive: Path,
    pieces: list[pa.Table],
    metr_la: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
    driver: list[subprocess.Popen[Any]],
) -> None:
    """Query 2 (a windowed join with incidents), a per-segment aggregate and a per-gateway count
    over the fleet's archive: `spark batch --master spark://...` prints exactly what it prints
    on local Spark, and each gateway's count is every reading it archived."""
    args = [
        "spark", "batch", "--archive", str(archive), "--query", Q2, "--query", Q_SEGMENTS,
        "--query", Q_GATEWAYS, "--table", f"incidents={metr_la['incidents']}",
    ]  # fmt: skip
    job = _start_on_cluster(cluster, args)  # its JVMs start while local Spark computes
    driver.append(job)
    assert _local(args) == 0
    local = capsys.readouterr().out
    on_cluster = _finish(job)
    rows = [json.loads(line) for line in local.splitlines()]
    q2 = [r for r in rows if r["query"] == 0]
    assert {r["incident_id"] for r in q2} >= {"I003", "I008", "I010"}, q2
    assert sum(r["query"] == 1 for r in rows) > 100
    counted: dict[str, int] = {}
    for r in rows:
        if r["query"] == 2:
            counted[r["gateway"]] = counted.get(r["gateway"], 0) + r["n"]
    day = pa.concat_tables(pieces)
    assert counted == {
        g: pc.sum(pc.is_in(day["segment"], pa.array(segs)).cast(pa.int64())).as_py()
        for g, segs in GATEWAYS.items()
    }
    assert on_cluster == local
    # The executors ran on the worker: the master lists the finished application.
    apps = cluster.state()["completedapps"]
    assert any(a.get("cores", 0) >= 1 for a in apps), apps


def test_a_driver_killed_mid_run_resumes_from_its_checkpoint_without_duplicates(
    cluster: Cluster,
    pieces: list[pa.Table],
    local_streamed: list[dict[str, Any]],
    driver: list[subprocess.Popen[Any]],
    tmp_path: Path,
) -> None:
    """The gateway goes on archiving while `spark run` streams on the cluster; the driver
    (Python and its JVM) is killed with SIGKILL while the archive still grows; a rerun from the
    checkpoint over the rest gives every window once: the same rows as one uninterrupted
    `spark run --available-now` on local Spark."""
    archive, ckpt, out = tmp_path / "archive", tmp_path / "ckpt", tmp_path / "out"
    log = tmp_path / "driver.log"
    for i in range(2):
        write_piece(archive, pieces[i], i)
    with log.open("wb") as f:
        proc = subprocess.Popen(
            _cluster_args(cluster, _stream_args(archive, ckpt, out, "--trigger", "1 second")),
            cwd=ROOT, env=cluster.env, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    driver.append(proc)

    def committed() -> list[int]:
        if proc.poll() is not None:
            raise AssertionError(f"spark run exited {proc.returncode}:\n{log.read_text()[-4000:]}")
        return _committed_batches(out)

    def tail() -> str:
        return log.read_text()[-4000:]

    seen = eventually(committed, message=tail, timeout=JOB_TIMEOUT, interval=0.25)
    for i in (2, 3):  # more segments while it runs, and it goes on committing batches
        write_piece(archive, pieces[i], i)
        seen = eventually(committed, _past(max(seen)), message=tail, timeout=JOB_TIMEOUT)
    write_piece(archive, pieces[4], 4)
    assert java_descendants(proc.pid), "the driver runs its JVM"
    kill_session(proc.pid)  # SIGKILL to the driver's Python and its JVM at once
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert not session_processes(proc.pid)
    assert _sink_rows(out), "the killed run had written some rows"
    first = (out / "batch=0" / "_SUCCESS").stat().st_mtime_ns

    for i in range(5, PIECES):
        write_piece(archive, pieces[i], i)
    _on_cluster(cluster, _stream_args(archive, ckpt, out, "--available-now"))
    rows = _sink_rows(out)
    keys = [(r["segment"], r["window_start"]) for r in rows]
    assert len(keys) == len(set(keys)), "a window was output twice"
    assert rows == local_streamed
    # The rerun went on from the checkpoint: the killed run's first batch was not redone.
    assert set(seen) <= set(_committed_batches(out))
    assert (out / "batch=0" / "_SUCCESS").stat().st_mtime_ns == first


def _toml(value: str) -> str:
    return json.dumps(value)  # a JSON string is a TOML basic string


def test_the_daemon_runs_a_spark_query_on_the_cluster_in_client_mode(
    cluster: Cluster,
    archive: Path,
    local_streamed: list[dict[str, Any]],
    driver: list[subprocess.Popen[Any]],
    tmp_path: Path,
) -> None:
    """`[spark] master = "spark://..."`: the daemon's driver runs in its process (its JVM a
    child of it), the executors on the worker call back to it; a Spark query POSTed over HTTP
    streams the rows local Spark gives. Stopping the daemon leaves no JVM behind."""
    own = tmp_path / "archive"  # the daemon's own copy: it may write into its archive
    shutil.copytree(archive, own)
    conf = "\n".join(f"{_toml(k)} = {_toml(v)}" for k, v in cluster.conf().items())
    config = tmp_path / "gateway.toml"
    config.write_text(
        f"[archive]\ndir = {_toml(str(own))}\n\n"
        "[simulation]\nenabled = false\n\n"
        f"[spark]\nmaster = {_toml(cluster.url)}\nshuffle_partitions = 2\n\n"
        f"[spark.conf]\n{conf}\n"
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "daemon.log"
    with log.open("wb") as f:
        proc = subprocess.Popen(
            _cli([
                "run", "--config", str(config), "--http", f"127.0.0.1:{port}",
                "--state-dir", str(tmp_path / "state"),
            ]),
            cwd=ROOT, env=cluster.env, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    driver.append(proc)

    def tail() -> str:
        return log.read_text()[-4000:]

    def get(path: str) -> Any:
        if proc.poll() is not None:
            raise AssertionError(f"the daemon exited {proc.returncode}:\n{tail()}")
        with urllib.request.urlopen(url + path, timeout=30) as r:
            return json.load(r)

    eventually(lambda: get("/healthz"), message=tail, timeout=60, retry_on=(OSError,))
    request = urllib.request.Request(
        f"{url}/queries",
        data=json.dumps({"sql": Q_SEGMENTS, "engine": "spark"}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as r:
        assert r.status == 202
        qid = json.load(r)["id"]
    results = ResultRows(f"{url}/queries/{qid}/results?format=ndjson")
    results.start()
    eventually(lambda: len(results.rows), lambda n: n >= 50, message=tail, timeout=JOB_TIMEOUT)
    assert get(f"/queries/{qid}")["state"] == "running"
    # The application is the daemon's, on the cluster, and its driver JVM is the daemon's child.
    apps = cluster.state()["activeapps"]
    assert [a["name"] for a in apps] == ["fjords-gateway"], apps
    assert java_descendants(proc.pid), "the daemon's Spark driver runs in a JVM it started"
    want = {json.dumps(r, sort_keys=True) for r in local_streamed}
    got = [json.dumps(r, sort_keys=True) for r in list(results.rows)]
    assert set(got) <= want, sorted(set(got) - want)[:3]
    # The fleet's `gateway` column is a column like any other for the daemon's Spark queries.
    request = urllib.request.Request(
        f"{url}/queries",
        data=json.dumps({"sql": Q_GATEWAYS, "engine": "spark"}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as r:
        assert r.status == 202
        by_gateway = ResultRows(f"{url}/queries/{json.load(r)['id']}/results?format=ndjson")
    by_gateway.start()
    eventually(
        lambda: {r["gateway"] for r in list(by_gateway.rows)},
        lambda seen: seen == set(GATEWAYS),
        message=tail,
        timeout=JOB_TIMEOUT,
    )

    proc.terminate()
    assert proc.wait(timeout=60) == 0, tail()
    # Its JVM exits once the Python driver is gone (it reads its parent's pipe to EOF).
    eventually(
        lambda: session_processes(proc.pid),
        lambda left: not left,
        message="no process of the stopped daemon is left",
        timeout=60,
    )


# -- a fleet of real gateways ------------------------------------------------------------------

FLEET_STATIONS = 5  # per gateway


@pytest.fixture(scope="module")
def fleet_traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Five stations per gateway: cabinet-a's second day of the trace; cabinet-b's first hour,
    then its backlog (the rest of the first day and the second), which it sends after A's day:
    B is a day behind A in event time."""
    import csv

    d = tmp_path_factory.mktemp("fleet-traces")
    with shared_file("data/metr-la/stations.csv").open() as f:
        ids = [r["station"] for r in csv.DictReader(f)]
    a, b = set(ids[:FLEET_STATIONS]), set(ids[FLEET_STATIONS : 2 * FLEET_STATIONS])
    with shared_file("data/metr-la/readings.csv").open() as f:
        reader = csv.reader(f)
        header = next(reader)
        rows = [r for r in reader if r[1] in a or r[1] in b]
    t0 = min(int(r[0]) for r in rows)
    parts = {
        "a": lambda r: r[1] in a and t0 + DAY <= int(r[0]) < t0 + 2 * DAY,
        "b-first-hour": lambda r: r[1] in b and int(r[0]) < t0 + 3600,
        "b-backlog": lambda r: r[1] in b and t0 + 3600 <= int(r[0]) < t0 + 2 * DAY,
    }
    out = {}
    for name, keep in parts.items():
        out[name] = d / f"{name}.csv"
        with out[name].open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(header)
            w.writerows(r for r in rows if keep(r))
    return out


def _replay(tmp_path: Path, gateway: str, trace: Path, root: Path) -> int:
    """A real daemon with `[gateway] id = gateway` replays `trace` into the archive `root` and
    stops (SIGTERM: its archive flushed); returns the readings it accepted."""
    from tests.daemon import Daemon

    with trace.open() as f:
        rows = sum(1 for _ in f) - 1
    config = (
        f"[gateway]\nid = {_toml(gateway)}\n"
        f"[archive]\ndir = {_toml(str(root))}\nsegment_seconds = 3600\n"
        f"[replay]\ntrace = {_toml(str(trace))}\n"
        f"stations = {_toml(str(shared_file('data/metr-la/stations.csv')))}\n"
        "[simulation]\nenabled = false\n"
    )
    home = tmp_path / f"daemon-{gateway}-{trace.stem}"
    home.mkdir()
    with Daemon(home, config, args=("--state-dir", str(home / "state"))) as gw:
        accepted = eventually(
            lambda: gw.metric("fjords_stream_tuples_in_total"),
            lambda n: n >= rows,
            message=gw.tail,
            timeout=JOB_TIMEOUT,
        )
        assert gw.metric("fjords_stream_late_samples_total") == 0
        assert gw.get("/status")["gateway"] == gateway
    return int(accepted)


def _summary(stdout: str) -> dict[str, Any]:
    """The `--json` summary a `spark run|batch` prints last."""
    return json.loads(stdout.strip().splitlines()[-1])["summary"]


def test_two_gateways_one_root_one_job_on_the_cluster(
    cluster: Cluster,
    fleet_traces: dict[str, Path],
    driver: list[subprocess.Popen[Any]],
    tmp_path: Path,
) -> None:
    """Two real daemons with their own `[gateway] id` write one archive root; B first sends an
    hour, then A a whole day ahead, then B its backlog. One streaming job on the cluster, run
    before and after B's backlog from one checkpoint, counts every reading of both per gateway
    and window (a slow gateway holds windows back instead of being dropped as late: none is
    dropped); a batch job attributes every accepted reading to its gateway, and segments of a
    third gateway with drifted schemas are cast or refused (counted), never failing the job."""
    import csv

    from gateway.spark.sources import write_segment

    root, ckpt, out = tmp_path / "root", tmp_path / "ckpt", tmp_path / "out"
    accepted = {"cabinet-b": _replay(tmp_path, "cabinet-b", fleet_traces["b-first-hour"], root)}
    accepted["cabinet-a"] = _replay(tmp_path, "cabinet-a", fleet_traces["a"], root)
    run = [
        "spark", "run", "--query", Q_GATEWAYS, "--archive", str(root), "--checkpoint", str(ckpt),
        "--sink", f"parquet:{out}",
    ]  # fmt: skip
    log = tmp_path / "live-job.log"
    with log.open("wb") as f:
        live = subprocess.Popen(
            _cluster_args(cluster, [*run, "--trigger", "1 second"]),
            cwd=ROOT, env=cluster.env, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    driver.append(live)

    def tail() -> str:
        if live.poll() is not None:
            return f"spark run exited {live.returncode}:\n{log.read_text()[-4000:]}"
        return log.read_text()[-4000:]

    # The job has read A's day ahead (and B's first hour) before B's backlog is sent.
    eventually(lambda: _committed_batches(out), message=tail, timeout=JOB_TIMEOUT)
    accepted["cabinet-b"] += _replay(tmp_path, "cabinet-b", fleet_traces["b-backlog"], root)

    # Every window the watermark has closed (all but the last hour's), exact per gateway.
    want: dict[tuple[str, float], int] = {}
    last = 0
    for name, gateway in (
        ("a", "cabinet-a"),
        ("b-first-hour", "cabinet-b"),
        ("b-backlog", "cabinet-b"),
    ):
        with fleet_traces[name].open() as trace:
            for r in csv.DictReader(trace):
                t = int(r["time"])
                last = max(last, t)
                key = (gateway, float(t - t % 3600))
                want[key] = want.get(key, 0) + 1
    assert sum(want.values()) == sum(accepted.values())
    closed = {k: n for k, n in want.items() if k[1] + 3600 <= last - 300}

    def out_rows() -> dict[tuple[str, float], int]:
        if live.poll() is not None:
            raise AssertionError(tail())
        return {(r["gateway"], _epoch(r["window_start"])): r["n"] for r in _sink_rows(out)}

    eventually(out_rows, lambda g: closed.keys() <= g.keys(), message=tail, timeout=JOB_TIMEOUT)
    kill_session(live.pid)
    live.wait(timeout=30)
    rows = _sink_rows(out)
    got = {(r["gateway"], _epoch(r["window_start"])): r["n"] for r in rows}
    assert len(got) == len(rows), "a window was output twice"
    assert {k: got[k] for k in closed} == closed
    assert {k for k, _ in got} == {"cabinet-a", "cabinet-b"}
    # The readings the job dropped as late, per gateway, over all its batches: none.
    summary = _summary(_on_cluster(cluster, [*run, "--available-now", "--json"]))
    assert sorted(summary["gateways"]) == ["cabinet-a", "cabinet-b"], summary
    assert not any(summary["late_readings_dropped"].values()), summary
    a_from = min(t for g, t in want if g == "cabinet-a")
    behind = [t for g, t in closed if g == "cabinet-b" and t < a_from]
    assert len(behind) >= 20, "B's day behind A was read and counted"

    # A third gateway of another version: int64 speed and an extra column are read (cast, or
    # ignored), speed as text is refused and counted; the batch job runs to its end.
    base = pa.table({
        "gateway": ["cabinet-c"] * 3, "time": [1330600000.0, 1330600300.0, 1330600600.0],
        "station": ["c1", "c1", "c1"], "latitude": [34.0] * 3, "longitude": [-118.0] * 3,
        "segment": ["S99"] * 3,
    })  # fmt: skip
    write_segment(
        root,
        base.append_column("speed", pa.array([60, 61, 62], pa.int64())),
        0,
        gateway="cabinet-c",
    )
    extra = base.append_column("speed", pa.array([60.0, 61.0, 62.0])).append_column(
        "occupancy", pa.array([0.1, 0.2, 0.3])
    )
    write_segment(root, extra, 1, gateway="cabinet-c")
    write_segment(
        root, base.append_column("speed", pa.array(["fast", "slow", "?"])), 2, gateway="cabinet-c"
    )
    batch = _on_cluster(
        cluster, ["spark", "batch", "--archive", str(root), "--query", Q_GATEWAYS, "--json"]
    )
    counted: dict[str, int] = {}
    for line in batch.strip().splitlines()[:-1]:
        r = json.loads(line)
        counted[r["gateway"]] = counted.get(r["gateway"], 0) + r["n"]
    assert counted == {**accepted, "cabinet-c": 6}
    assert _summary(batch)["segments_refused"] == 1


def _epoch(value: Any) -> float:
    """A window bound as the sink stores it (a timestamp or epoch seconds) in epoch seconds."""
    if isinstance(value, int | float):
        return float(value)
    from datetime import UTC

    return value.replace(tzinfo=value.tzinfo or UTC).timestamp()
