"""The serial transport through a real pseudo-terminal (pyserial on the gateway side)."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from fjords.supervision import Backoff
from sensors.framing import frame_payload
from sensors.protocol import Control, Samples
from sensors.transports.base import Inbound, Transport, TransportUnavailable
from sensors.transports.serial import PtyBaseStation, SerialTransport
from tests.support import async_eventually

pytestmark = pytest.mark.timeout(60)


def sample(sensor: str, i: int) -> Samples:
    return Samples(sensor_id=sensor, seq=i, times=(i / 180,), rows=((400.0 + i % 7,),))


async def collect(t: SerialTransport, n: int, timeout: float = 20) -> list[Inbound]:
    out: list[Inbound] = []

    async def take() -> None:
        async for item in t.messages():
            out.append(item)
            if len(out) == n:
                return

    await asyncio.wait_for(take(), timeout)
    return out


async def test_frames_both_ways_over_a_pty(tmp_path: Path) -> None:
    async with PtyBaseStation(baudrate=None) as station, SerialTransport(station.path) as t:
        assert isinstance(t, Transport)
        await t.wait_connected(10)
        a, b = station.link("a"), station.link("b")
        for i in range(200):
            await (a if i % 2 else b).send(sample("a" if i % 2 else "b", i))
        got = await collect(t, 200)
        for sensor in "ab":
            seqs = [m.seq for sid, m in got if sid == sensor]
            assert seqs == sorted(seqs) and len(seqs) == 100
        await t.send("b", Control.set_period("b", 50.0, seq=9))
        await t.send("a", Control.wake("a", seq=10))
        assert (await asyncio.wait_for(b.next_control(), 10)).period_ms == 50.0
        assert (await asyncio.wait_for(a.next_control(), 10)).seq == 10
        assert b.poll_controls() == [] and a.poll_controls() == []
        with pytest.raises(ValueError):
            await t.send("a", Control.wake("b"))


async def test_one_percent_garbled_bytes_over_a_pty(tmp_path: Path) -> None:
    rng = random.Random(11)
    n = 1500
    damaged: set[int] = set()

    def garbler(i: int):
        def corrupt(frame: bytes) -> bytes:
            b = bytearray(frame)
            for j in range(len(b)):
                if rng.random() < 0.01:
                    b[j] ^= rng.randrange(1, 256)
                    damaged.add(i)
            return bytes(b)

        return corrupt

    async with PtyBaseStation(baudrate=None) as station, SerialTransport(station.path) as t:
        await t.wait_connected(10)
        link = station.link("m")
        for i in range(n):
            await link.send(sample("m", i), corrupt=garbler(i))
        await link.send(sample("m", n))  # a clean last frame marks the end
        await station.drain()
        received: list[int] = []

        async def take() -> None:
            async for _, m in t.messages():
                received.append(m.seq)
                if m.seq == n:
                    return

        await asyncio.wait_for(take(), 20)
    assert 10 < len(damaged) < n // 2
    assert received == sorted(set(range(n + 1)) - damaged)
    frames = t.stats.frames
    # a byte garbled into 00 splits its frame in two dropped pieces, hence >=
    assert frames["frames_dropped"] == t.stats.dropped_bad >= len(damaged)
    assert frames["frames_ok"] == n + 1 - len(damaged)


async def test_device_disappears_and_comes_back(tmp_path: Path) -> None:
    path = tmp_path / "ttyMOTE"  # a stable name, like /dev/serial/by-id/...
    async with SerialTransport(path, backoff=Backoff(0.02, 0.2)) as t:
        async with PtyBaseStation(baudrate=None, link_path=path) as station:
            await t.wait_connected(10)
            await station.link("m").send(sample("m", 1))
            assert (await collect(t, 1))[0].message.seq == 1
        # unplugged: the transport notices and keeps trying
        await async_eventually(lambda: not t.stats.connected, interval=0.01)
        assert not t.stats.connected
        with pytest.raises(TransportUnavailable):
            await t.send("m", Control.wake("m"))
        async with PtyBaseStation(baudrate=None, link_path=path) as station:
            await t.wait_connected(10)
            await station.link("m").send(sample("m", 2))
            assert (await collect(t, 1))[0].message.seq == 2
            await t.send("m", Control.wake("m", seq=3))
            assert (await asyncio.wait_for(station.link("m").next_control(), 10)).seq == 3
        assert t.stats.reconnects == 1


async def test_paced_station_keeps_to_its_baud_rate_budget() -> None:
    # Not a timing assertion: the paced writer must still deliver everything, in order.
    async with PtyBaseStation(baudrate=115_200) as station, SerialTransport(station.path) as t:
        await t.wait_connected(10)
        link = station.link("m")
        for i in range(100):
            await link.send(sample("m", i))
        got = await collect(t, 100)
        assert [m.seq for _, m in got] == list(range(100))


async def test_a_hostile_frame_between_good_ones_in_one_chunk_keeps_them() -> None:
    # msgpack nested 2,000 deep, framed with a valid CRC so that it reaches the decoder.
    deep = frame_payload(b"\x93\x01\xa7samples" + b"\x91" * 2000 + b"\x01")
    async with PtyBaseStation(baudrate=None) as station, SerialTransport(station.path) as t:
        await t.wait_connected(10)
        link = station.link("m")
        for i in range(3):
            # Queued together, so the station writes them in one chunk: good, bad, good.
            await link.send(sample("m", 2 * i))
            station._queue(deep)
            await link.send(sample("m", 2 * i + 1))
        got = await collect(t, 6)
        assert [m.seq for _, m in got] == list(range(6))
        assert t.stats.bad == {"frame_protocol": 3} and t.stats.dropped_bad == 3
        assert t.stats.reconnects == 0 and t.stats.restarts == 0 and t.health() == []


async def test_a_device_link_gets_the_gateways_control_bytes_unchanged() -> None:
    """Firmware in the loop checks a control's seal over the bytes the gateway sent: the
    station hands those over (a forged one too: the device judges it), never a re-encoding."""
    from sensors.auth import Keyring, unseal
    from sensors.protocol import decode_message
    from sensors.sealing import GatewayAuth

    key = bytes(range(16))
    async with PtyBaseStation(baudrate=None) as station, SerialTransport(station.path) as t:
        t.auth = GatewayAuth(Keyring(keys={"d": key}))
        await t.wait_connected(10)
        device = station.device_link("d")
        with pytest.raises(ValueError, match="device link"):
            station.link("d")
        await t.send("d", Control.set_period("d", 50.0, seq=9))
        sealed = await asyncio.wait_for(device.next_control(), 10)
        inner, counter = unseal(sealed, key)
        assert decode_message(inner) == Control.set_period("d", 50.0, seq=9) and counter > 0
        forged = bytearray(sealed)
        forged[-1] ^= 1
        t._asyncio_transport.write(frame_payload(bytes(forged)))  # type: ignore[union-attr]
        assert await asyncio.wait_for(device.next_control(), 10) == bytes(forged)
        assert device.received == 2 and station.bad_frames == 0
