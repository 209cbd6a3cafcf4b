"""The embedded defaults' loop pair (`fjords-gateway run` with `[simulation]`, as `make run`):
no query needs it, so its proxies put it to sleep; it must show `asleep`, never an offline
spell, while its duty-cycled listen windows come every wake check.

The pair runs at 1x real time beside a fleet replayed 60x, and the proxies' clock is stream
time: the pair sends one timed message (a vehicle event) before its sleep is acknowledged, and
on stream time alone the asleep limit of 3 x 30 s would pass in 1.5 s of wall time, leaving the
pair offline until its first window after the sleep. So liveness also needs silence on the
gateway's wall clock at each sensor's own pace (proxies/liveness.py).

Wake checks every 10 s (30 by default): the stream-time limit still passes (in 0.5 s) long
before the pair's first window after its sleep, and the test ends at that window."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.daemon import Daemon
from tests.support import eventually

pytestmark = pytest.mark.timeout(120)


def test_embedded_loop_pair_sleeps_without_going_offline(tmp_path: Path) -> None:
    config = f'[state]\ndir = "{tmp_path / "state"}"\n[simulation]\n[sensors]\nwake_check_s = 10\n'
    with Daemon(tmp_path, config) as gw:
        seen: list[tuple[str, str, int]] = []

        def pair() -> list[dict]:
            """The pair's entries; no offline spell, ever."""
            them = [s for s in gw.get("/sensors")["sensors"] if s["id"].startswith("pair1-")]
            seen.extend((s["id"], s["status"], s["counters"]["offline_spells"]) for s in them)
            assert all(s["counters"]["offline_spells"] == 0 for s in them), seen[-6:]
            return them

        # asleep with more than two listen windows: its first wake check after the sleep has
        # come, past the span a stream-time-only limit would have marked it offline
        eventually(
            pair,
            lambda them: (
                len(them) == 2
                and all(
                    s["status"] == "asleep" and s["counters"]["listen_windows"] > 2 for s in them
                )
            ),
            message=lambda: f"the pair asleep past a wake check: {seen[-6:]}",
            timeout=60,
            interval=1.0,
        )
