"""Fixtures shared by the gateway tests: one SparkSession for the whole run (a JVM start is slow)."""

from __future__ import annotations

import importlib.util
import shutil

import pytest

from tests.support import require


@pytest.fixture(scope="session")
def spark():  # noqa: ANN201
    """`local[2]`; outside CI the tests skip without pyspark or a JDK, under CI=true they fail."""
    require(importlib.util.find_spec("pyspark") is not None, "pyspark (pip install -e '.[dev]')")
    require(shutil.which("java") is not None, "a JDK on PATH (Debian package openjdk-17-jre)")
    from gateway.spark.session import SparkConfig, get_session

    session = get_session(
        SparkConfig(master="local[2]", shuffle_partitions=2, app_name="fjords-tests")
    )
    yield session
    session.stop()
