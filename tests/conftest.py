"""Hermetic runs: a daemon started by a test without `--state-dir` keeps its queries in the
per-user data directory ($XDG_DATA_HOME/fjords-gateway); each test gets its own, so no test
sees another's queries and none writes to the real home directory."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _private_xdg_data_home(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path_factory.mktemp("xdg-data")))
