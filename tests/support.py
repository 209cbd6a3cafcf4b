"""Helpers shared by the tests: optional system dependencies and the shared data folder.

Outside CI a missing tool skips the test with the reason; under CI=true it fails, so CI
always exercises the real broker, Spark and the AVR toolchain.
"""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
IN_CI = os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def require(available: bool, what: str) -> None:
    """Skip (or, under CI, fail) unless `available`; `what` names the missing thing and its package."""
    if available:
        return
    if IN_CI:
        pytest.fail(f"{what} is required under CI=true but is missing")
    pytest.skip(f"{what} is not available on this machine")


def require_binary(name: str, package: str) -> str:
    """The path of executable `name`, else skip/fail naming the Debian package that provides it."""
    path = shutil.which(name)
    require(
        path is not None,
        f"`{name}` (Debian package {package}; scripts/install-system-deps installs it)",
    )
    return path or ""


def shared_file(relative: str) -> Path:
    """A file under ../shared (beside the clone), else skip/fail: the product never needs it."""
    path = SHARED / relative
    require(path.is_file(), f"shared data file {path}")
    return path


def free_port() -> int:
    """A loopback TCP port nobody listens on right now (for a broker or a daemon)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fleet_command(
    broker: object, trace: Path | str, stations: Path | str, *extra: str
) -> list[str]:
    """`fjords-gateway simulate-motes` over MQTT: one mote per station of `trace`, replayed to
    `broker` (host and port), as a user starts the README's fleet; `extra` are more flags."""
    import sys

    return [
        sys.executable, "-m", "gateway.cli", "simulate-motes", "--transport", "mqtt",
        "--broker", f"{broker.host}:{broker.port}",  # type: ignore[attr-defined]
        "--trace", str(trace), "--stations", str(stations), *extra,
    ]  # fmt: skip
