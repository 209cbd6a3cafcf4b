"""The verifier and sealer around the primitives: what the gateway admits, what a mote obeys."""

from __future__ import annotations

import asyncio
import itertools
import timeit

import pytest

from sensors.auth import Keyring, derive_key, seal
from sensors.framing import frame_payload
from sensors.protocol import Control, Hello, Samples, Status, encode_message
from sensors.sealing import GatewayAuth, MoteAuth, topic_class
from sensors.transports.base import ControlInbox
from sensors.transports.inprocess import InProcessHub
from sensors.transports.serial import PtyBaseStation, SerialTransport
from tests.support import async_eventually

MASTER = bytes(range(16))
KEY = derive_key(MASTER, "S1")
WRONG_KEY = bytes(16)


def _clock() -> itertools.count[int]:
    return itertools.count(1_000_000_000, 1000)


def _samples(seq: int, sid: str = "S1") -> bytes:
    return encode_message(Samples(sensor_id=sid, seq=seq, times=(1.0,), rows=((2.0,),)))


def _gateway(require_mac: bool = True) -> GatewayAuth:
    return GatewayAuth(Keyring(master=MASTER), require_mac=require_mac)


def test_authentic_messages_pass_once_and_forgeries_are_counted_by_reason() -> None:
    gw, mote = _gateway(), MoteAuth("S1", KEY, clock=_clock().__next__)
    rejects: list[tuple[str, str]] = []
    gw.on_reject = lambda sid, reason: rejects.append((sid, reason))
    first = mote.seal_bytes(_samples(0))
    assert gw.admit("S1", "samples", first)
    assert not gw.admit("S1", "samples", first)  # replayed
    assert not gw.admit("S1", "samples", _samples(1))  # unsigned
    assert not gw.admit("S1", "samples", seal(_samples(2), bytes(16), 10**15))  # wrong key
    assert gw.rejected == {"unsigned": 1, "bad_mac": 1, "replay": 1, "unknown_key": 0}
    assert rejects == [("S1", "replay"), ("S1", "unsigned"), ("S1", "bad_mac")]


def test_no_key_is_unknown_key_and_leaves_no_state() -> None:
    gw = GatewayAuth(Keyring(keys={"S1": KEY}))
    gw.on_reject = lambda sid, reason: pytest.fail("an unknown id is not counted per sensor")
    for i in range(1000):
        assert not gw.admit(f"junk{i}", "samples", _samples(0, f"junk{i}"))
    assert gw.rejected["unknown_key"] == 1000
    assert not gw._windows and not gw._verified_keys and len(gw._logged) == 0


def test_floods_of_made_up_ids_log_one_line_a_minute(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    gw = GatewayAuth(Keyring(master=MASTER), monotonic=lambda: now[0])
    mote = MoteAuth("S1", KEY, clock=_clock().__next__)
    assert gw.admit("S1", "samples", mote.seal_bytes(_samples(0)))
    with caplog.at_level("WARNING", logger="sensors.auth"):
        for i in range(5000):  # every id has a derived key: all bad_mac
            assert not gw.admit(f"x{i}", "samples", seal(_samples(0, f"x{i}"), WRONG_KEY, 1))
        assert not gw.admit("S1", "samples", _samples(1))  # the real sensor's first: logged
        now[0] = 61.0
        assert not gw.admit("y", "samples", seal(_samples(0, "y"), WRONG_KEY, 1))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3, lines
    assert "'S1' (unsigned" in lines[1] and "4999 similar ones not logged" in lines[2]
    assert gw.rejected["bad_mac"] == 5001 and not gw._logged - {("S1", "unsigned")}


def test_topic_classes_have_their_own_windows() -> None:
    """A last will sealed at connect time arrives after later data: not a replay."""
    gw, mote = _gateway(), MoteAuth("S1", KEY, clock=_clock().__next__)
    will = mote.seal(Status(sensor_id="S1", online=False))
    for seq in range(100):
        assert gw.admit("S1", "samples", mote.seal_bytes(_samples(seq)))
    assert gw.admit("S1", "status", will)
    assert topic_class("ack") == topic_class("listen") == "data"


def test_retained_messages_are_verified_but_not_replay_checked() -> None:
    gw, mote = _gateway(), MoteAuth("S1", KEY, clock=_clock().__next__)
    hello = mote.seal(Hello(sensor_id="S1", schema=(("v", "float"),)))
    assert gw.admit("S1", "hello", hello)
    assert gw.admit("S1", "hello", hello, retained=True)  # the broker's copy after a restart
    assert gw.admit("S1", "hello", hello, retained=True)
    forged = encode_message(Hello(sensor_id="S1", schema=(("v", "float"),), attributes={"x": 1}))
    assert not gw.admit("S1", "hello", forged, retained=True)
    assert not gw.admit("S1", "hello", seal(forged, bytes(16), 5), retained=True)
    assert gw.rejected["unsigned"] == gw.rejected["bad_mac"] == 1


def test_restored_counters_refuse_what_came_before_a_restart() -> None:
    gw, mote = _gateway(), MoteAuth("S1", KEY, clock=_clock().__next__)
    old = [mote.seal_bytes(_samples(i)) for i in range(3)]
    for data in old[1:]:
        assert gw.admit("S1", "samples", data)
    restarted = _gateway()
    restarted.restore(gw.counters())
    assert not any(restarted.admit("S1", "samples", data) for data in old)
    assert restarted.rejected["replay"] == 3
    assert restarted.admit("S1", "samples", mote.seal_bytes(_samples(3)))
    assert "S1" in restarted._verified_keys  # its key is kept, not derived per message
    restarted.restore({"S1": {"bogus": 5, "data": "x"}})  # type: ignore[dict-item]
    assert set(restarted.counters()["S1"]) == {"data"}


def test_require_mac_false_accepts_unsigned_but_still_checks_sealed() -> None:
    gw = _gateway(require_mac=False)
    assert gw.admit("S1", "samples", _samples(0))
    assert gw.admit("S9", "samples", _samples(0, "S9"))
    assert not gw.admit("S1", "samples", seal(_samples(1), bytes(16), 7))
    assert gw.unsigned_accepted == 2 and gw.rejected["bad_mac"] == 1


def test_controls_sealed_by_the_gateway_are_obeyed_once_by_their_mote() -> None:
    clock = _clock()
    gw = GatewayAuth(Keyring(master=MASTER), clock=clock.__next__)
    inbox = ControlInbox(sensor_id="S1", auth=MoteAuth("S1", KEY))
    control = Control.sleep("S1", 60_000)
    sealed = gw.seal_control(control)
    again = gw.seal_control(control)
    assert again != sealed  # a re-sent control is sealed afresh, with a new counter
    assert inbox.receive(sealed) == control
    assert inbox.receive(sealed) is None  # replayed
    assert inbox.receive(encode_message(control)) is None  # forged: no tag
    assert inbox.receive(seal(encode_message(control), bytes(16), 10**16)) is None
    other = GatewayAuth(Keyring(master=MASTER), clock=clock.__next__)
    assert inbox.receive(other.seal_control(Control.sleep("S2", 1.0))) is None  # for S2
    assert inbox.receive(again) == control
    assert inbox.auth is not None
    assert inbox.auth.rejected == {"replay": 1, "unsigned": 1, "bad_mac": 2}
    assert inbox.poll() == [control, control]


def test_control_counters_never_go_back_even_when_the_clock_does() -> None:
    times = iter([5_000_000, 4_000_000, 4_000_000, 9_000_000])
    gw = GatewayAuth(Keyring(master=MASTER), clock=lambda: next(times))
    inbox = ControlInbox(sensor_id="S1", auth=MoteAuth("S1", KEY))
    for _ in range(4):
        assert inbox.receive(gw.seal_control(Control.wake("S1"))) is not None


def test_one_hmac_per_message_on_the_hot_path() -> None:
    """The cost of admitting one sealed message (printed: `pytest -s`); a loose sanity bound
    only, never a timing assertion that a loaded machine could fail."""
    gw, mote = _gateway(), MoteAuth("S1", KEY)
    batch = [mote.seal_bytes(_samples(i)) for i in range(20_000)]
    it = iter(batch)
    n = 10_000
    seconds = timeit.timeit(lambda: gw.admit("S1", "samples", next(it)), number=n)
    print(f"admit: {seconds / n * 1e6:.2f} us per message")
    assert gw.accepted == n


async def test_serial_and_in_process_links_seal_and_verify_both_ways() -> None:
    """Every transport the gateway runs: sealed messages pass once, forged ones are refused
    before the proxies, and a mote takes only its gateway's sealed controls."""
    async with PtyBaseStation(baudrate=None) as station, SerialTransport(station.path) as serial:
        hub = InProcessHub()
        async with hub:
            for t in (serial, hub):
                t.auth = _gateway()
            await serial.wait_connected(10)
            links = {"serial": station.link("S1", KEY), "hub": hub.link("S1", KEY)}
            for name, link in links.items():
                transport = serial if name == "serial" else hub
                forged = encode_message(
                    Samples(sensor_id="S1", seq=99, times=(9.0,), rows=((9.0,),))
                )
                if name == "serial":
                    station.write_frame(frame_payload(forged))
                else:
                    hub._receive("S1", forged)
                await link.send(Samples(sensor_id="S1", seq=1, times=(1.0,), rows=((2.0,),)))
                inbound = await asyncio.wait_for(anext(aiter(transport.messages())), 10)
                assert inbound.message.seq == 1  # the forged one never got through
                assert transport.auth is not None and transport.auth.rejected["unsigned"] == 1
                assert transport.seqs.gaps == 0
                await transport.send("S1", Control.wake("S1", seq=5))
                assert (await asyncio.wait_for(link.next_control(), 10)).seq == 5
            # A forged control on the serial line (unsealed) is ignored and counted.
            serial_link = links["serial"]
            assert serial_link.auth is not None
            serial._asyncio_transport.write(  # type: ignore[union-attr]
                frame_payload(encode_message(Control.sleep("S1", 1.0)))
            )
            auth = serial_link.auth
            await async_eventually(lambda: auth.rejected.get("unsigned"), timeout=10)
            assert serial_link.poll_controls() == []
