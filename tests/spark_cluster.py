"""A real Spark standalone cluster for the tests, started from the pyspark wheel.

The wheel has `bin/spark-class` but no `sbin/start-master.sh`, so the master and the worker are
started here as `spark-class org.apache.spark.deploy.master.Master ...` and `...worker.Worker
spark://...`, on 127.0.0.1 and free ports, with their logs, work and conf directories in a
temporary directory (nothing is written into the virtualenv). The worker has 1 core and 1g.

`standalone_cluster()` is a context manager; `cluster_fixture()` makes a pytest fixture of it
(module scope by default: a cluster start costs two JVMs). Each process starts in a session of
its own, so what it spawns (executor JVMs, their Python workers) is found by session id at the
end: terminate, then kill, then nothing of the cluster may be left in /proc.

`java_descendants(pid)` lists the JVMs a process started (a daemon's Spark driver, say).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest

from tests.support import eventually, free_port, require

HOST = "127.0.0.1"
# The tests' JVMs live seconds on a tiny data set: C1 alone and the serial collector start them
# in about half the time, and change no result.
QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


# -- processes, from /proc -------------------------------------------------------------------


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(comm, ppid, session id) of `pid`, or None once it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # comm is in parentheses and may hold spaces or parentheses itself: split at the last ')'.
    comm = raw[raw.index("(") + 1 : raw.rindex(")")]
    rest = raw[raw.rindex(")") + 2 :].split()
    if rest[0] == "Z":  # a zombie holds no memory; its parent has yet to reap it
        return None
    return comm, int(rest[1]), int(rest[3])


def _processes() -> dict[int, tuple[str, int, int]]:
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(int(entry))) is not None:
            out[int(entry)] = st
    return out


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` in the process tree (children, theirs, ...)."""
    procs = _processes()
    children: dict[int, list[int]] = {}
    for p, (_, ppid, _) in procs.items():
        children.setdefault(ppid, []).append(p)
    out: list[int] = []
    todo = list(children.get(pid, []))
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return sorted(out)


def _is_java(pid: int) -> bool:
    st = _stat(pid)
    return st is not None and st[0] == "java"


def java_descendants(pid: int) -> list[int]:
    """The JVMs among `pid`'s descendants: a gateway's Spark driver, a CLI run's, a worker's
    executors. An empty list means the process runs no JVM (or no longer does)."""
    return [p for p in descendants(pid) if _is_java(p)]


def session_processes(sid: int) -> list[int]:
    """Live processes of session `sid` (a process started with `start_new_session=True` and
    everything it spawned, even those its death left to init)."""
    return sorted(p for p, (_, _, s) in _processes().items() if s == sid)


def kill_session(sid: int, *, timeout: float = 30) -> list[int]:
    """SIGKILL every process of session `sid`; the ones that were there (empty: nothing was
    left). Waits until /proc shows none of them."""
    left = session_processes(sid)
    for p in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)
    if left:
        eventually(
            lambda: session_processes(sid),
            lambda ps: not ps,
            message=f"the processes of session {sid} are gone",
            timeout=timeout,
        )
    return left


def stop_process(proc: subprocess.Popen[Any], *, timeout: float = 30) -> None:
    """SIGTERM (a Spark daemon's shutdown hook stops what it started), SIGKILL if it does not
    exit within `timeout`, and reap it."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout)


# -- the cluster ---------------------------------------------------------------------------------


def spark_home() -> Path:
    """The pyspark package directory: the wheel's SPARK_HOME (bin/spark-class, jars/)."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise RuntimeError("pyspark is not installed")
    return Path(spec.origin).parent


def require_spark() -> None:
    """Skip (under CI=true: fail) without pyspark's launcher or a JDK, like the `spark` fixture."""
    found = importlib.util.find_spec("pyspark") is not None
    require(found, "pyspark (pip install -e '.[dev]')")
    require((spark_home() / "bin" / "spark-class").is_file(), "pyspark's bin/spark-class")
    require(shutil.which("java") is not None, "a JDK on PATH (Debian package openjdk-17-jre)")


def cluster_env(base: Path, python: str = sys.executable) -> dict[str, str]:
    """The environment of the cluster's daemons, and of a driver that connects to it: every
    address 127.0.0.1, logs and scratch under `base`, and this virtualenv's Python for the
    executors' Python workers (so they import this project)."""
    env = dict(os.environ)
    conf = base / "conf"  # empty: no spark-defaults.conf or log4j settings from elsewhere
    conf.mkdir(parents=True, exist_ok=True)
    env.update(
        SPARK_HOME=str(spark_home()),
        SPARK_CONF_DIR=str(conf),
        SPARK_LOG_DIR=str(base / "logs"),
        SPARK_WORKER_DIR=str(base / "work"),
        SPARK_LOCAL_DIRS=str(base / "local"),
        SPARK_LOCAL_IP=HOST,
        SPARK_LOCAL_HOSTNAME=HOST,
        SPARK_DAEMON_MEMORY="256m",  # the master's and the worker's own heaps
        SPARK_DAEMON_JAVA_OPTS=QUICK_JVM,
        PYSPARK_PYTHON=python,
        PYSPARK_DRIVER_PYTHON=python,
    )
    return env


@dataclass
class Cluster:
    """A running master and worker; `url` is what `--master` takes."""

    url: str
    web_url: str
    base: Path
    env: dict[str, str]
    master: subprocess.Popen[bytes]
    worker: subprocess.Popen[bytes]
    cores: int
    executor_memory: str = "512m"

    def state(self) -> dict[str, Any]:
        """The master's JSON status page (workers, active and completed applications)."""
        with urllib.request.urlopen(f"{self.web_url}/json/", timeout=10) as r:
            state: dict[str, Any] = json.load(r)
        return state

    def conf(self) -> dict[str, str]:
        """Settings a driver needs on this cluster: a cap on its cores (without one an
        application takes every core, and the next waits until it ends), small executors,
        and the driver on the loopback address the executors call back to."""
        return {
            "spark.cores.max": str(self.cores),
            "spark.executor.cores": str(self.cores),
            "spark.executor.memory": self.executor_memory,
            "spark.driver.host": HOST,
            "spark.driver.bindAddress": HOST,
            "spark.executor.extraJavaOptions": QUICK_JVM,
            **driver_conf(),
        }

    def conf_args(self) -> list[str]:
        """`conf()` as `--conf KEY=VALUE` flags of `fjords-gateway spark ...`."""
        return conf_args(self.conf())

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the daemons' logs (for a failure message)."""
        out = []
        for f in sorted((self.base / "logs").glob("*.log")):
            out.append(f"== {f.name}\n" + "\n".join(f.read_text().splitlines()[-lines:]))
        return "\n".join(out)


def driver_conf() -> dict[str, str]:
    """Test-speed settings of a driver JVM, on the cluster or `local[*]` alike."""
    return {"spark.driver.extraJavaOptions": QUICK_JVM}


def conf_args(conf: dict[str, str]) -> list[str]:
    """Settings as `--conf KEY=VALUE` flags of `fjords-gateway spark ...`."""
    return [a for k, v in conf.items() for a in ("--conf", f"{k}={v}")]


def _spark_class(env: dict[str, str], log: Path, *args: str) -> subprocess.Popen[bytes]:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        # spark-class execs the JVM: the Popen's pid is the daemon's. A session of its own, so
        # the executors it starts can be found (and killed) after it is gone.
        return subprocess.Popen(
            [str(spark_home() / "bin" / "spark-class"), *args],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


@contextlib.contextmanager
def standalone_cluster(
    base: Path | None = None, *, cores: int = 1, memory: str = "1g", timeout: float = 120
) -> Iterator[Cluster]:
    """A master and one worker (`cores`, `memory`) on 127.0.0.1, yielded once the master lists
    the worker ALIVE; stopped on exit (terminate, then kill), and checked: any process of
    theirs still in /proc is killed and fails the exit (a stray JVM is a bug)."""
    require_spark()
    owned = base is None
    base = Path(tempfile.mkdtemp(prefix="fjords-spark-cluster-")) if base is None else base
    env = cluster_env(base)
    port, web, worker_web = free_port(), free_port(), free_port()
    url, web_url = f"spark://{HOST}:{port}", f"http://{HOST}:{web}"
    logs = base / "logs"
    master = _spark_class(
        env, logs / "master.log", MASTER_CLASS,
        "--host", HOST, "--port", str(port), "--webui-port", str(web),
    )  # fmt: skip
    worker: subprocess.Popen[bytes] | None = None
    try:
        worker = _spark_class(
            env, logs / "worker.log", WORKER_CLASS, url,
            "--cores", str(cores), "--memory", memory, "--host", HOST,
            "--webui-port", str(worker_web), "--work-dir", str(base / "work"),
        )  # fmt: skip
        cluster = Cluster(url, web_url, base, env, master, worker, cores)

        def alive_workers() -> list[dict[str, Any]]:
            for name, p in (("master", master), ("worker", worker)):
                if p is not None and p.poll() is not None:
                    raise AssertionError(
                        f"the Spark {name} exited with {p.returncode}:\n{cluster.log_tail()}"
                    )
            return [w for w in cluster.state().get("workers", []) if w.get("state") == "ALIVE"]

        eventually(
            alive_workers,
            message=lambda: f"the master at {web_url} lists a worker ALIVE\n{cluster.log_tail()}",
            timeout=timeout,
            interval=0.25,
            retry_on=(OSError, ValueError),
        )
        yield cluster
    finally:
        for p in (worker, master):
            if p is not None:
                stop_process(p)
        stray = [q for p in (worker, master) if p is not None for q in kill_session(p.pid)]
        if owned:
            shutil.rmtree(base, ignore_errors=True)
    if stray:
        raise AssertionError(f"processes of the Spark cluster outlived it: {stray}")


def cluster_fixture(
    scope: Literal["session", "package", "module", "class", "function"] = "module",
) -> Callable[..., Any]:
    """A pytest fixture (assign it to a name in a test module) yielding a `Cluster`, logs in the
    fixture's tmp directory."""

    @pytest.fixture(scope=scope)
    def fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
        with standalone_cluster(tmp_path_factory.mktemp("spark-cluster")) as cluster:
            yield cluster

    return fixture
