"""Spark settings from the gateway config, and the one SparkSession a process uses.

`local[*]` (embedded) by default; any cluster by `master` (spark://, yarn, k8s://...), the
driver then in the gateway process (client mode); or, by `remote` (`sc://host:15002`), a Spark
Connect server, so the gateway process runs no JVM at all. Nothing here assumes one machine:
tables and archives are read through Spark, results written by it.

A session whose driver died (the JVM killed, the Connect server gone) stays cached by pyspark;
`discard_session` drops it so the next `get_session` makes a fresh one (and a fresh JVM).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass(frozen=True)
class SparkConfig:
    """The `[spark]` section of the gateway config."""

    master: str = "local[*]"
    remote: str | None = None  # sc://host:port: Spark Connect instead of a driver in-process
    cores_max: int | None = None  # spark.cores.max: this gateway's share of a standalone cluster
    app_name: str = "fjords-gateway"
    driver_memory: str | None = None  # e.g. "2g"; only effective before the JVM starts
    executor_memory: str | None = None
    shuffle_partitions: int = 8  # Spark's default of 200 is far too many for window partials
    ui: bool = False
    conf: Mapping[str, str] = field(default_factory=dict)  # any other spark.* setting
    # Supervision of the daemon's jobs (gateway/spark/supervisor.py), not Spark settings:
    max_restarts: int = 3  # restarts of a failed job before it is failed for good
    restart_backoff_s: float = 2.0  # the first restart's delay, doubled each time...
    restart_backoff_max_s: float = 30.0  # ...up to this (a healed job runs within a minute)
    trigger: str = "10 seconds"  # the daemon's jobs' micro-batch interval
    poll_s: float = 2.0  # how often a job's state (and, under Connect, its results) is read
    restart_attempts: int = 20  # tries to start it again within one outage (the server down)

    def __post_init__(self) -> None:
        if self.remote is not None:
            if not self.remote.startswith("sc://"):
                raise ValueError(
                    f"[spark] remote must be an sc://host:port URL, got {self.remote!r}"
                )
            if self.master != "local[*]":
                raise ValueError(
                    "[spark] master and remote are exclusive: master runs the driver in the "
                    "gateway process, remote uses a Spark Connect server's"
                )
            if self.cores_max is not None:
                raise ValueError(
                    "[spark] cores_max sizes the gateway's own driver ([spark] master); under "
                    "remote the Connect server's application owns the cores: start it with "
                    "--conf spark.cores.max=N"
                )
            static = sorted(
                k
                for k, v in (
                    ("driver_memory", self.driver_memory),
                    ("executor_memory", self.executor_memory),
                    ("ui", self.ui),
                )
                if v
            )
            if static:
                raise ValueError(
                    f"[spark] {', '.join(static)}: set on the Connect server under remote "
                    "(they size its driver and executors, not a session)"
                )
        if self.cores_max is not None and self.cores_max < 1:
            raise ValueError(f"[spark] cores_max must be >= 1, got {self.cores_max}")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None) -> SparkConfig:
        """From a parsed TOML/JSON table; unknown keys are an error, not silently ignored."""
        data = dict(data or {})
        known = set(cls.__dataclass_fields__)
        bad = sorted(set(data) - known)
        if bad:
            raise ValueError(f"unknown [spark] settings: {', '.join(bad)}; known: {sorted(known)}")
        if "master" in data and "remote" in data:
            raise ValueError(
                "[spark] master and remote are exclusive: master runs the driver in the "
                "gateway process, remote uses a Spark Connect server's"
            )
        if "conf" in data:
            data["conf"] = {str(k): str(v) for k, v in dict(data["conf"]).items()}
        return cls(**data)

    def settings(self) -> dict[str, str]:
        """The session's settings; under `remote` only the runtime SQL ones (a Connect session
        cannot change the server's static settings)."""
        out = {
            "spark.sql.shuffle.partitions": str(self.shuffle_partitions),
            "spark.sql.session.timeZone": "UTC",
            # Filled windows only: no surprise NULL-for-error changes between Spark 3 and 4.
            "spark.sql.ansi.enabled": "false",
            "spark.sql.execution.arrow.pyspark.enabled": "true",
        }
        if self.remote is not None:
            out.update(self.conf)
            return out
        out["spark.ui.enabled"] = str(self.ui).lower()
        out["spark.ui.showConsoleProgress"] = "false"
        if self.cores_max is not None:
            out["spark.cores.max"] = str(self.cores_max)
        if self.driver_memory:
            out["spark.driver.memory"] = self.driver_memory
        if self.executor_memory:
            out["spark.executor.memory"] = self.executor_memory
        out.update(self.conf)
        return out


log = logging.getLogger("gateway.spark")

#: one session made or discarded at a time (the supervisor heals jobs in worker threads)
_lock = threading.Lock()


def get_session(config: SparkConfig | None = None) -> SparkSession:
    """The process's SparkSession (created on first use with `config`, reused afterwards)."""
    from pyspark.sql import SparkSession

    # py4j logs each connection it opens and closes at INFO, the last ones from `__del__` at
    # interpreter exit, onto streams already closed ("--- Logging error ---" after a test run).
    logging.getLogger("py4j").setLevel(logging.WARNING)

    config = config or SparkConfig()
    with _lock:
        if config.remote is not None:
            from pyspark.sql.connect.client.retries import DefaultPolicy

            spark = SparkSession.builder.remote(config.remote).getOrCreate()
            # The client retries a lost server for 10 minutes by default; the supervisor's
            # status calls must see it gone within seconds (it retries with its own backoff).
            spark.client.set_retry_policies([DefaultPolicy(max_retries=4, max_backoff=2000)])
            for k, v in config.settings().items():
                spark.conf.set(k, v)
            return spark
        if config.master.startswith("local"):
            # the executors decode archive segments with pyarrow (gateway/spark/sources.py): in
            # local mode they are this process's children, so this interpreter (a cluster's
            # workers need a Python with pyarrow: PYSPARK_PYTHON)
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        builder = SparkSession.builder.master(config.master).appName(config.app_name)
        for k, v in config.settings().items():
            builder = builder.config(k, v)
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        return spark


def is_remote(spark: SparkSession) -> bool:
    """A Spark Connect session (its foreachBatch functions run on the server)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def session_alive(spark: SparkSession) -> bool:
    """Whether the session's driver still answers (one cheap round trip)."""
    try:
        if is_remote(spark):
            spark.conf.get("spark.sql.session.timeZone")
            return not getattr(spark, "is_stopped", False)
        jsc = spark.sparkContext._jsc
        return jsc is not None and not jsc.sc().isStopped()
    except Exception:  # noqa: BLE001 - py4j or gRPC failing is the answer
        return False


def discard_session(spark: SparkSession) -> None:
    """Forget `spark` (its driver is dead) so the next `get_session` makes a fresh session: under
    Connect a new server session; in-process, a new SparkContext in a new JVM (pyspark otherwise
    keeps handing out the dead one, and its py4j gateway, to every `getOrCreate`)."""
    with _lock:
        if is_remote(spark):
            try:
                spark.stop()
            except Exception as e:  # noqa: BLE001 - the server is gone; only the handle goes
                log.info("the dead Spark Connect session did not stop cleanly: %s", e)
            return
        from pyspark import SparkContext
        from pyspark.sql import SparkSession, SQLContext

        if SparkSession._instantiatedSession is not spark:
            return  # already replaced (another job healed first)
        sc = SparkContext._active_spark_context
        if sc is not None:
            try:
                sc.stop()  # warns, does not raise, when the JVM is gone
            except Exception as e:  # noqa: BLE001
                log.info("the dead SparkContext did not stop cleanly: %s", e)
        gateway = SparkContext._gateway
        if gateway is not None:
            try:
                gateway.shutdown()  # its callback server (foreachBatch) and connections
            except Exception as e:  # noqa: BLE001
                log.info("the dead JVM's py4j gateway did not shut down cleanly: %s", e)
            proc = getattr(gateway, "proc", None)
            if proc is not None and proc.poll() is None:
                proc.kill()  # a JVM that no longer answers but still runs
                proc.wait()
        SparkContext._active_spark_context = None
        SparkContext._gateway = None
        SparkContext._jvm = None
        SparkSession._instantiatedSession = None
        SparkSession._activeSession = None
        SQLContext._instantiatedContext = None
