"""The embedded defaults' loop pair (`fjords-gateway run` with `[simulation]`, as `make run`):
no query needs it, so its proxies put it to sleep; it must show `asleep`, never an offline
spell, while its duty-cycled listen windows come every wake check.

The pair runs at 1x real time beside a fleet replayed 60x, and the proxies' clock is stream
time: the pair sends one timed message (a vehicle event) before its sleep is acknowledged, and
on stream time alone the asleep limit of 3 x 30 s would pass in 1.5 s of wall time, leaving the
pair offline until its first window after the sleep. So liveness also needs silence on the
gateway's wall clock at each sensor's own pace (proxies/liveness.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.daemon import Daemon

pytestmark = pytest.mark.timeout(120)


def test_embedded_loop_pair_sleeps_without_going_offline(tmp_path: Path) -> None:
    with Daemon(tmp_path, f'[state]\ndir = "{tmp_path / "state"}"\n[simulation]\n') as gw:
        deadline = time.monotonic() + 50  # past the first wake check (30 s) after the sleep
        seen: list[tuple[str, str, int]] = []
        asleep_after_window = False
        while time.monotonic() < deadline:
            pair = [s for s in gw.get("/sensors")["sensors"] if s["id"].startswith("pair1-")]
            seen += [(s["id"], s["status"], s["counters"]["offline_spells"]) for s in pair]
            assert all(s["counters"]["offline_spells"] == 0 for s in pair), seen[-6:]
            if pair and all(
                s["status"] == "asleep" and s["counters"]["listen_windows"] > 2 for s in pair
            ):
                asleep_after_window = True
            time.sleep(1)
        assert asleep_after_window, seen[-6:]
