"""Ingest throughput: samples/s decoded end to end by the gateway's transports.

python -m benchmarks.ingest [--quick]

- MQTT: motes (MqttMoteLink) publish `samples` batches of 1, 8 and 32 readings as fast as a
  private Mosquitto takes them; the gateway's MqttTransport decodes them. Samples/s from the
  first publish to the last decoded message.
- Serial: one PtyBaseStation paced at 115200 baud 8N1 (11,520 bytes/s) and unpaced, read by the
  SerialTransport through pyserial. Reported as a fraction of the line rate (decoded frame
  bytes/s over 11,520) and samples/s.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks.common import OUT, console, drawn, markdown, record, table
from sensors.framing import encode_frame
from sensors.protocol import Samples
from sensors.transports.broker import BrokerSettings
from sensors.transports.mqtt import MqttMoteLink, MqttTransport
from sensors.transports.serial import PtyBaseStation, SerialTransport, line_rate

BAUD = 115_200
NOTE = "Motes and gateway share one Python process (and the 2 cores with the broker), so these are lower bounds for the gateway alone; at batch 1 the per-message cost of paho/aiomqtt on both sides dominates, which is why motes batch."


def batch(sensor: str, seq: int, size: int) -> Samples:
    t0 = seq * size / 180.0
    return Samples(
        sensor_id=sensor,
        seq=seq,
        times=tuple(t0 + k / 180.0 for k in range(size)),
        rows=tuple((400.0 + (seq + k) % 50,) for k in range(size)),
    )


class _Broker:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="ingest-mosquitto-"))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        conf = self.dir / "m.conf"
        conf.write_text(
            f"listener {self.port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
            "max_queued_messages 1000000\n"
        )
        self.proc = subprocess.Popen(
            [shutil.which("mosquitto") or "mosquitto", "-c", str(conf)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("mosquitto did not start")

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


async def mqtt_run(port: int, motes: int, size: int, samples_per_mote: int) -> dict[str, float]:
    per_mote = samples_per_mote // size
    broker = BrokerSettings(port=port)
    async with MqttTransport(broker, queue_bound=1_000_000) as gw:
        await gw.wait_connected(10)
        links = [
            MqttMoteLink(f"b{size}m{i}", broker, queue_bound=per_mote + 10) for i in range(motes)
        ]
        for link in links:
            await link.__aenter__()
        try:
            await asyncio.gather(*(link.wait_connected(10) for link in links))
            msgs = [[batch(link.sensor_id, s, size) for s in range(per_mote)] for link in links]
            expected = motes * per_mote
            start = time.perf_counter()
            for round_ in range(per_mote):
                for link, ms in zip(links, msgs, strict=True):
                    await link.send(ms[round_])
                if round_ % 64 == 0:
                    await asyncio.sleep(0)
            got = samples = 0
            deadline = time.perf_counter() + 120
            async for _, m in gw.messages():
                if isinstance(m, Samples):
                    got += 1
                    samples += len(m.times)
                    if got == expected or time.perf_counter() > deadline:
                        break
            elapsed = time.perf_counter() - start
        finally:
            for link in links:
                await link.__aexit__(None, None, None)
    return {
        "messages": got,
        "expected": expected,
        "samples": samples,
        "seconds": elapsed,
        "samples_s": samples / elapsed,
        "lost": expected - got,
    }


async def serial_run(baud: int | None, size: int, seconds: float) -> dict[str, float]:
    frame_len = len(encode_frame(batch("m0", 1, size)))
    n = int(line_rate(baud) * seconds / frame_len) if baud else 20000 // size
    async with (
        PtyBaseStation(baudrate=baud, queue_bound=n + 10) as station,
        SerialTransport(station.path, baudrate=baud or BAUD) as t,
    ):
        await t.wait_connected(10)
        link = station.link("m0")
        start = time.perf_counter()
        for s in range(n):
            await link.send(batch("m0", s, size))
        got = samples = 0
        async for _, m in t.messages():
            got += 1
            samples += len(m.times)
            if got == n:
                break
        elapsed = time.perf_counter() - start
        frames_bytes = t.stats.frames["bytes_in"]
    return {
        "messages": got,
        "samples": samples,
        "seconds": elapsed,
        "samples_s": samples / elapsed,
        "bytes_s": frames_bytes / elapsed,
        "frame_bytes": frame_len,
        "line_fraction": frames_bytes / elapsed / line_rate(BAUD),
        "ideal_samples_s": line_rate(BAUD) / frame_len * size,
    }


async def run(quick: bool) -> tuple[list[list[object]], list[list[object]]]:
    mqtt_rows: list[list[object]] = []
    if shutil.which("mosquitto"):
        broker = _Broker()
        try:
            base = None
            for size in (1, 8, 32):
                r = await mqtt_run(
                    broker.port, motes=20, size=size, samples_per_mote=1600 if quick else 6400
                )
                base = base or r["samples_s"]
                mqtt_rows.append(
                    [
                        f"batch {size}",
                        20,
                        r["samples"],
                        r["messages"],
                        r["lost"],
                        r["seconds"],
                        r["samples_s"],
                        r["samples_s"] / base,
                    ]
                )
        finally:
            broker.close()
    serial_rows: list[list[object]] = []
    for baud, size in ((BAUD, 1), (BAUD, 8), (None, 8)):
        r = await serial_run(baud, size, 1.5 if quick else 4.0)
        serial_rows.append(
            [
                f"{'115200 baud' if baud else 'unpaced pty'}, batch {size}",
                r["frame_bytes"],
                r["samples"],
                r["seconds"],
                r["samples_s"],
                r["ideal_samples_s"],
                r["line_fraction"],
            ]
        )
    return mqtt_rows, serial_rows


MQTT_COLS = [
    "mqtt (20 motes, QoS 0)",
    "motes",
    "samples",
    "messages",
    "lost",
    "s",
    "samples/s",
    "vs batch 1",
]
SERIAL_COLS = [
    "serial via pty",
    "frame bytes",
    "samples",
    "s",
    "samples/s",
    "line-rate samples/s",
    "fraction of 115200 line",
]


def plot(mqtt_rows: list[list[object]], serial_rows: list[list[object]]) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    OUT.mkdir(parents=True, exist_ok=True)
    labels = [f"MQTT {r[0]}" for r in mqtt_rows] + [str(r[0]) for r in serial_rows]
    values = [float(r[6]) for r in mqtt_rows] + [float(r[4]) for r in serial_rows]  # type: ignore[arg-type]
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.barh(labels, values)
    ax.set_xscale("log")
    ax.set_xlabel("samples/s decoded (log)")
    ax.set_title("Gateway ingest throughput")
    fig.tight_layout()
    path = OUT / "ingest.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.ingest", description=__doc__)
    p.add_argument("--quick", action="store_true", help="smaller runs")
    args = p.parse_args(argv)
    mqtt_rows, serial_rows = asyncio.run(run(args.quick))
    if mqtt_rows:
        console.print(table("MQTT ingest through Mosquitto", MQTT_COLS, mqtt_rows))
    console.print(table("Serial ingest through a pseudo-terminal", SERIAL_COLS, serial_rows))
    path = plot(mqtt_rows, serial_rows)
    body = [
        "`python -m benchmarks.ingest`. Samples decoded end to end by the gateway transports "
        "(msgpack + envelope validation; serial adds COBS + CRC16). " + drawn("Plot", "ingest.png")
    ]
    if mqtt_rows:
        body += [
            "",
            "### MQTT through a private Mosquitto (loopback)",
            "",
            NOTE,
            "",
            markdown(MQTT_COLS, mqtt_rows),
        ]
    else:
        body += ["", "MQTT: mosquitto not installed; skipped."]
    body += [
        "",
        "### Serial through a pseudo-terminal (pyserial-asyncio-fast)",
        "",
        "The 115200 rows are paced by the simulated base station at 11,520 bytes/s (8N1); the "
        "fraction is decoded frame bytes/s over that line rate, so 1.0 means the gateway keeps "
        "up with a saturated line. The unpaced row shows the headroom.",
        "",
        markdown(SERIAL_COLS, serial_rows),
    ]
    record("ingest", "\n".join(body))
    if path:
        console.print(f"plot: {path}")


if __name__ == "__main__":
    main()
