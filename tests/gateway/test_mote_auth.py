"""Issue 29, items 1 and 4: nobody but a mote speaks for it, nobody but its gateway commands it.

The real daemon with `[sensors] keys_file` against a real Mosquitto, and a fleet of simulated
Python motes holding their keys (derived from one master key). An intruder on the broker
publishes forged controls, samples, hellos (one retained, so it is there after a restart), an
offline status, a huge sequence number, and replays of genuine messages captured from the
broker. The motes ignore what is not their gateway's and count it; the gateway refuses what is
not its motes' and counts it (/metrics, /sensors), and none of it reaches a query, the catalog,
liveness, the sequence counters or the stream's progress. A genuine retained hello is still
accepted after a restart, and a message captured before it is still a replay after it.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiomqtt
import pytest

from sensors.auth import derive_key, seal
from sensors.motes.mote import SimulatedMote
from sensors.protocol import Control, Hello, Samples, Status, encode_message
from sensors.transports.broker import BrokerSettings
from sensors.transports.mqtt import MqttMoteLink
from tests.daemon import Daemon
from tests.support import Broker, ResultRows, async_eventually

pytestmark = [pytest.mark.needs_mosquitto, pytest.mark.timeout(180)]

MASTER = bytes.fromhex("000102030405060708090a0b0c0d0e0f")
WRONG = bytes(16)
IDS = ("m1", "m2", "m3")
FORGED_SPEED = -999.0
PERIOD_S = 0.1


def _config(tmp_path: Path, broker: Broker) -> str:
    keys = tmp_path / "motes.keys"
    keys.write_text(f"# the fleet's master key\n* {MASTER.hex()}\n")
    return (
        f'[mqtt]\nurl = "mqtt://{broker.host}:{broker.port}"\n'
        f'[sensors]\nkeys_file = "{keys}"\n'
        f'[state]\ndir = "{tmp_path / "state"}"\n'
    )


async def _readings() -> AsyncIterator[tuple[float, float]]:
    while True:
        yield time.time(), 50.0
        await asyncio.sleep(PERIOD_S)


class Fleet:
    """Keyed motes on the broker, sampling in real time."""

    def __init__(self, broker: Broker) -> None:
        settings = BrokerSettings(broker.host, broker.port)
        self.links: dict[str, MqttMoteLink] = {}
        self.motes: dict[str, SimulatedMote] = {}
        for sid in IDS:
            link = MqttMoteLink(sid, settings, key=derive_key(MASTER, sid))
            mote = SimulatedMote(
                sid,
                link,
                field="speed",
                period_s=PERIOD_S,
                attributes={"station": sid, "segment": "S1", "latitude": 34.0},
                listen_every_s=0.3,
            )
            link.hello = mote.hello
            self.links[sid], self.motes[sid] = link, mote
        self._stack = AsyncExitStack()
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> Fleet:
        for link in self.links.values():
            await self._stack.enter_async_context(link)
        await asyncio.gather(*(link.wait_connected(30) for link in self.links.values()))
        for mote in self.motes.values():
            self._tasks.append(asyncio.create_task(mote.run(_readings(), send_hello=False)))
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._stack.aclose()

    def ignored(self, sid: str) -> int:
        auth = self.links[sid].auth
        assert auth is not None
        return sum(auth.rejected.values())


async def _get(gw: Daemon, path: str) -> Any:
    return await asyncio.to_thread(gw.get, path)


async def _metric(gw: Daemon, name: str) -> float:
    return await asyncio.to_thread(gw.metric, name)


async def _sensor(gw: Daemon, sid: str) -> dict[str, Any] | None:
    sensors = (await _get(gw, "/sensors"))["sensors"]
    return next((s for s in sensors if s["id"] == sid), None)


async def _query(gw: Daemon) -> ResultRows:
    qid = (await asyncio.to_thread(gw.post, "/queries", {"sql": "SELECT * FROM traffic"}))["id"]
    rows = ResultRows(f"{gw.url}/queries/{qid}/results?format=ndjson")
    rows.start()
    return rows


async def _rows_flow(rows: ResultRows, sids: tuple[str, ...] = IDS, more: int = 5) -> None:
    """Every mote in `sids` gets at least `more` new rows through."""
    base = {sid: rows.of(sid) for sid in sids}
    await async_eventually(
        lambda: all(rows.of(s) >= base[s] + more for s in sids),
        message=lambda: (
            f"rows keep arriving from {sids} (had {base}, now { {s: rows.of(s) for s in sids} })"
        ),
        timeout=60,
    )


async def test_forged_controls_are_ignored_by_the_motes_and_counted(
    broker: Broker, tmp_path: Path
) -> None:
    with Daemon(tmp_path, _config(tmp_path, broker)) as gw:
        async with Fleet(broker) as fleet:
            rows = await _query(gw)
            await _rows_flow(rows)
            forged = [
                Control.sleep("m1", 600_000),
                Control.load_program("m1", "filter", {"ranges": [[1000.0, 2000.0]]}),
                Control.set_period("m2", 3_600_000),
            ]
            async with aiomqtt.Client(broker.host, broker.port, identifier="intruder") as c:
                for control in forged:
                    topic = f"fjords/sensors/{control.sensor_id}/control"
                    await c.publish(topic, encode_message(control), qos=1)  # unsealed
                    wrong = seal(encode_message(control), WRONG, time.time_ns() // 1000)
                    await c.publish(topic, wrong, qos=1)  # sealed with a key not the mote's
            await async_eventually(
                lambda: (fleet.ignored("m1"), fleet.ignored("m2")),
                lambda n: n == (4, 2),
                message="the motes count the forged controls they ignore",
                timeout=30,
            )
            for sid in ("m1", "m2"):
                mote = fleet.motes[sid]
                assert mote.program_name == "raw" and mote.period_s == PERIOD_S
                assert not mote.stats.transitions  # never put to sleep
                auth = fleet.links[sid].auth
                assert auth is not None and set(auth.rejected) == {"unsigned", "bad_mac"}
            await _rows_flow(rows)  # the victims' rows keep arriving
            for sid in ("m1", "m2"):
                entry = await _sensor(gw, sid)
                assert entry is not None and entry["status"] == "online"


async def _capture(broker: Broker, topic: str) -> tuple[str, bytes]:
    async with aiomqtt.Client(broker.host, broker.port, identifier="sniffer") as c:
        await c.subscribe(topic, qos=1)
        async for m in c.messages:
            if isinstance(m.payload, bytes) and not m.retain:
                return m.topic.value, m.payload
    raise AssertionError("no message captured")


async def test_forged_and_replayed_messages_are_refused_and_retained_hellos_checked(
    broker: Broker, tmp_path: Path
) -> None:
    config = _config(tmp_path, broker)
    gw = Daemon(tmp_path, config)
    with gw:
        async with Fleet(broker):
            rows = await _query(gw)
            await _rows_flow(rows)
            before = await _sensor(gw, "m1")
            assert before is not None
            gaps_before = await _metric(gw, "fjords_transport_seq_gaps_total")
            now = time.time()
            forged_rows = Samples(
                sensor_id="m1", seq=9_999_999, times=(now + 20,), rows=((FORGED_SPEED,),)
            )
            hacked = Hello(
                sensor_id="m1",
                seq=10_000_000,
                schema=(("speed", "float"),),
                attributes={"station": "m1", "segment": "HACKED", "latitude": 0.0},
            )
            sniffed = asyncio.create_task(_capture(broker, "fjords/sensors/m2/data"))
            async with aiomqtt.Client(broker.host, broker.port, identifier="intruder") as c:
                await asyncio.sleep(0.5)  # the sniffer is subscribed
                for i in range(20):
                    data = encode_message(forged_rows)
                    forged = data if i % 2 else seal(data, WRONG, 10**16 + i)
                    await c.publish("fjords/sensors/m1/data", forged, qos=1)
                await c.publish("fjords/sensors/m1/hello", encode_message(hacked), qos=1)
                offline = Status(sensor_id="m1", online=False, reason="forged")
                await c.publish("fjords/sensors/m1/status", encode_message(offline), qos=1)
                topic, genuine = await asyncio.wait_for(sniffed, 30)
                await c.publish(topic, genuine, qos=1)  # a replay of m2's own message
                await c.publish(topic, genuine, qos=1)
            await async_eventually(
                lambda: _metric(gw, "fjords_auth_rejected_total"),
                lambda n: n >= 24,
                message="forged and replayed messages are refused and counted",
                timeout=30,
            )
            metrics = await asyncio.to_thread(
                lambda: urllib.request.urlopen(f"{gw.url}/metrics", timeout=10).read().decode()
            )
            assert 'fjords_auth_rejected_total{reason="bad_mac"} 10.0' in metrics
            assert 'fjords_auth_rejected_total{reason="unsigned"} 12.0' in metrics
            assert 'fjords_auth_rejected_total{reason="replay"} 2.0' in metrics
            await _rows_flow(rows)
            after = await _sensor(gw, "m1")
            assert after is not None
            assert after["attributes"] == before["attributes"]  # the catalog is unchanged
            assert after["counters"]["bad_mac"] == 10 and after["counters"]["unsigned"] == 12
            assert after["status"] == "online"  # a forged offline status changed nothing
            m2 = await _sensor(gw, "m2")
            assert m2 is not None and m2["counters"]["replay"] == 2
            assert await _metric(gw, "fjords_transport_seq_gaps_total") == gaps_before
            assert not [r for r in rows.rows if r.get("speed") == FORGED_SPEED]
            assert not [r for r in rows.rows if r.get("segment") == "HACKED"]
            watermark = await _metric(gw, "fjords_stream_watermark_seconds")
            assert watermark < now + 10  # the forged times never moved progress
        # The motes left cleanly: their genuine retained hellos stay on the broker, and one
        # forged retained hello replaces m3's.
        async with aiomqtt.Client(broker.host, broker.port, identifier="intruder") as c:
            forged_hello = Hello(
                sensor_id="m3",
                schema=(("speed", "float"),),
                attributes={"station": "m3", "segment": "HACKED", "latitude": 0.0},
            )
            await c.publish(
                "fjords/sensors/m3/hello", encode_message(forged_hello), qos=1, retain=True
            )
    with Daemon(tmp_path, config) as gw2:
        # A genuine retained hello is accepted after the restart; the forged one is refused.
        await async_eventually(
            lambda: _get(gw2, "/sensors"),
            lambda s: {"m1", "m2"} <= {e["id"] for e in s["sensors"]},
            message="the genuine retained hellos are in the catalog after a restart",
            timeout=30,
        )
        await async_eventually(
            lambda: _metric(gw2, "fjords_auth_rejected_total"),
            lambda n: n >= 1,
            message="the forged retained hello is refused after the restart",
            timeout=30,
        )
        m1 = await _sensor(gw2, "m1")
        assert m1 is not None and m1["attributes"]["segment"] == "S1"
        assert await _sensor(gw2, "m3") is None
        # The counters outlive the restart: the message captured before it is still a replay.
        async with aiomqtt.Client(broker.host, broker.port, identifier="intruder") as c:
            await c.publish(topic, genuine, qos=1)
        await async_eventually(
            lambda: asyncio.to_thread(
                lambda: urllib.request.urlopen(f"{gw2.url}/metrics", timeout=10).read().decode()
            ),
            lambda text: 'fjords_auth_rejected_total{reason="replay"} 1.0' in text,
            message="a message captured before the restart is refused as a replay after it",
            timeout=30,
        )
