"""Sequence gaps are messages that were really missed: a broker restart that loses nothing (QoS 1
motes and gateway, a broker that keeps its sessions) counts none and leaves the gateway healthy,
however the motes' reconnects interleave their hellos with the backlog they then send."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from tests.daemon import Daemon
from tests.support import ROOT, Broker, eventually, fleet_command

MOTES = 3
READINGS = 3000  # one a second of trace time; at SPEEDUP far more than the test needs
SPEEDUP = 40
#: how long the broker stays down once everyone has noticed (SPEEDUP readings a mote a second)
OUTAGE_S = 2.0


def _files(tmp: Path) -> tuple[Path, Path]:
    trace, stations = tmp / "trace.csv", tmp / "stations.csv"
    with stations.open("w") as f:
        f.write("station,latitude,longitude,segment\n")
        for i in range(MOTES):
            f.write(f"m{i},34.{i},-118.{i},S{i}\n")
    with trace.open("w") as f:
        f.write("time,station,speed\n")
        for k in range(READINGS):
            for i in range(MOTES):
                f.write(f"{1_700_000_000 + k},m{i},{50 + (k + i) % 20}\n")
    return trace, stations


def test_a_broker_restart_that_loses_nothing_counts_no_gaps(
    persistent_broker: Broker, tmp_path: Path
) -> None:
    broker = persistent_broker
    trace, stations = _files(tmp_path)
    config = f'[mqtt]\nurl = "mqtt://{broker.host}:{broker.port}"\nqos = 1\n'
    fleet_log = tmp_path / "fleet.log"
    with Daemon(tmp_path, config, args=("--no-state",)) as gw:
        gw.post("/queries", {"sql": "SELECT station, speed FROM traffic"})
        cmd = fleet_command(broker, trace, stations, "--qos", "1", "--speedup", str(SPEEDUP))
        with fleet_log.open("w") as err:
            fleet = subprocess.Popen(cmd, cwd=ROOT, stderr=err)
        try:
            received = lambda: gw.metric("fjords_transport_received_total")  # noqa: E731
            eventually(received, lambda n: n >= 10 * MOTES, timeout=60, message="data flows")
            assert gw.metric("fjords_transport_seq_gaps_total") == 0

            broker.proc.terminate()  # type: ignore[union-attr]
            broker.proc.wait(timeout=10)  # type: ignore[union-attr]
            # Down until the gateway has seen it go and every mote has been refused on a
            # reconnect, then OUTAGE_S more: the motes keep sampling into their queues.
            eventually(
                lambda: gw.metric("fjords_transport_up"),
                lambda n: n == 0,
                timeout=30,
                message="the gateway sees the broker gone",
            )
            eventually(
                lambda: fleet_log.read_text(),
                lambda log: all(
                    f"mote m{i}: connection to broker {broker.host}:{broker.port} refused" in log
                    for i in range(MOTES)
                ),
                timeout=30,
                message=lambda: f"every mote retries; fleet: {fleet_log.read_text()[-2000:]}",
            )
            time.sleep(OUTAGE_S)
            broker.start()

            before = received()
            eventually(
                received,
                lambda n: n >= before + 20 * MOTES,
                timeout=60,
                message=lambda: f"data flows again; fleet: {fleet_log.read_text()[-2000:]}",
            )
            assert gw.metric("fjords_transport_reconnects_total") >= 1
            assert gw.metric("fjords_transport_seq_gaps_total") == 0, gw.tail()
            health = eventually(
                lambda: gw.get("/healthz"),
                lambda h: h["status"] == "ok",
                timeout=30,
                message="the gateway is healthy again",
            )
            assert health["reasons"] == []
            assert gw.metric("fjords_transport_seq_gaps_total") == 0
        finally:
            fleet.kill()
            fleet.wait(timeout=10)
