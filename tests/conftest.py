"""Fixtures every test package shares.

Hermetic runs: a daemon started by a test without `--state-dir` keeps its queries in the
per-user data directory ($XDG_DATA_HOME/fjords-gateway); each test gets its own, so no test
sees another's queries and none writes to the real home directory. pytest and the subprocesses
a run starts share one bytecode cache in .pytest_cache (no __pycache__ in the tree).

`broker` / `persistent_broker`: a private Mosquitto per test (`tests.support.Broker`). `spark`: one
SparkSession for the whole run (a JVM start is slow). Where mosquitto, pyspark or a JDK is
missing, the tests that ask for them skip with the reason; under CI=true they fail instead."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support import Broker, require, require_binary

#: undoes what pytest_configure changed, at pytest_unconfigure
_restore: list[Callable[[], None]] = []


def pytest_configure(config: pytest.Config) -> None:
    """This process (collection compiles and assertion-rewrites every test module) and the
    daemons, fleets and CLI runs the tests start (hundreds a run) share one bytecode cache, kept
    between runs in pytest's cache directory: where PYTHONDONTWRITEBYTECODE is set, each would
    otherwise compile the project from source again (~10 s of collection, ~0.5 s a start).
    It is outside the source folders, so the tree stays free of __pycache__ either way."""
    cache = getattr(config, "cache", None)
    # (-p no:cacheprovider: a cache for this run only)
    folder = cache.mkdir("pycache") if cache else Path(tempfile.mkdtemp(prefix="fjords-pyc-"))
    env = {k: os.environ.get(k) for k in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
    flags = sys.dont_write_bytecode, sys.pycache_prefix

    def restore() -> None:
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        sys.dont_write_bytecode, sys.pycache_prefix = flags
        if not cache:
            shutil.rmtree(folder, ignore_errors=True)

    _restore.append(restore)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = str(folder)
    sys.dont_write_bytecode = False
    sys.pycache_prefix = str(folder)


def pytest_unconfigure(config: pytest.Config) -> None:
    while _restore:
        _restore.pop()()


@pytest.fixture(autouse=True)
def _private_xdg_data_home(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path_factory.mktemp("xdg-data")))


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    binary = require_binary("mosquitto", "mosquitto")
    b = Broker(binary, tmp_path)
    b.start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def persistent_broker(tmp_path: Path) -> Iterator[Broker]:
    """Sessions, subscriptions and queued messages survive `restart_cleanly()`."""
    binary = require_binary("mosquitto", "mosquitto")
    b = Broker(binary, tmp_path, persistent=True)
    b.start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture(scope="session")
def spark():
    """`local[2]`; outside CI the tests skip without pyspark or a JDK, under CI=true they fail."""
    require(importlib.util.find_spec("pyspark") is not None, "pyspark (pip install -e '.[dev]')")
    require(shutil.which("java") is not None, "a JDK on PATH (Debian package openjdk-17-jre)")
    from gateway.spark.session import SparkConfig, get_session

    session = get_session(
        SparkConfig(master="local[2]", shuffle_partitions=2, app_name="fjords-tests")
    )
    yield session
    session.stop()
