"""Spark settings from the gateway config, and the one SparkSession a process uses.

`local[*]` (embedded) by default; any cluster by `master` (spark://, yarn, k8s://...). Nothing
here assumes one machine: tables and archives are read through Spark, results written by it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass(frozen=True)
class SparkConfig:
    """The `[spark]` section of the gateway config."""

    master: str = "local[*]"
    app_name: str = "fjords-gateway"
    driver_memory: str | None = None  # e.g. "2g"; only effective before the JVM starts
    executor_memory: str | None = None
    shuffle_partitions: int = 8  # Spark's default of 200 is far too many for window partials
    ui: bool = False
    conf: Mapping[str, str] = field(default_factory=dict)  # any other spark.* setting

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None) -> SparkConfig:
        """From a parsed TOML/JSON table; unknown keys are an error, not silently ignored."""
        data = dict(data or {})
        known = set(cls.__dataclass_fields__)
        bad = sorted(set(data) - known)
        if bad:
            raise ValueError(f"unknown [spark] settings: {', '.join(bad)}; known: {sorted(known)}")
        if "conf" in data:
            data["conf"] = {str(k): str(v) for k, v in dict(data["conf"]).items()}
        return cls(**data)

    def settings(self) -> dict[str, str]:
        out = {
            "spark.sql.shuffle.partitions": str(self.shuffle_partitions),
            "spark.ui.enabled": str(self.ui).lower(),
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.session.timeZone": "UTC",
            # Filled windows only: no surprise NULL-for-error changes between Spark 3 and 4.
            "spark.sql.ansi.enabled": "false",
            "spark.sql.execution.arrow.pyspark.enabled": "true",
        }
        if self.driver_memory:
            out["spark.driver.memory"] = self.driver_memory
        if self.executor_memory:
            out["spark.executor.memory"] = self.executor_memory
        out.update(self.conf)
        return out


def get_session(config: SparkConfig | None = None) -> SparkSession:
    """The process's SparkSession (created on first use with `config`, reused afterwards)."""
    import logging

    from pyspark.sql import SparkSession

    # py4j logs each connection it opens and closes at INFO, the last ones from `__del__` at
    # interpreter exit, onto streams already closed ("--- Logging error ---" after a test run).
    logging.getLogger("py4j").setLevel(logging.WARNING)

    config = config or SparkConfig()
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
