"""What authenticated mote messages cost: the gateway's CPU per message, and the mote's energy.

    python -m benchmarks.auth               # 31 rounds of 2,000 messages per contender
    python -m benchmarks.auth --quick       # a smoke run (nothing recorded)

(a) The gateway, per mote message, over the same realistic messages from a 207-mote fleet
(METR-LA-like: a `samples` message of 4 readings, a `listen`, a 200-byte batch), each
contender in turn every round (the order rotated), a batch of messages timed at once:

- `decode_message` of the unsealed message: today's path without keys;
- the sealed message as the transports take it with keys (`Supervisor.accept_message`):
  `decode_message`, then `GatewayAuth.admit` (HMAC-SHA256 tag, per-sensor replay window);
  every message has its own counter, so none is refused as a replay (checked);
- `GatewayAuth.admit` alone, and the bare MAC over the same bytes: `KeyedMac` (what
  GatewayAuth uses), the stdlib's `hmac.new` and `hmac.digest` (what a careful programmer
  would write), and AES-CMAC from `cryptography` when it is installed (not a dependency).

(b) The mote, from what the AVR image measured in simavr (firmware-sim/cycles.json `auth`,
`firmware_sim.measure_auth`): cycles and energy per sealed message and per verified control,
and the lifetime `fjords-power simulate --mac` gives the paper profile's programs at a few
rates (its own code, called as the CLI: nothing re-modelled here).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import hmac
import io
import itertools
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from firmware_sim.cli import main as fjords_power
from firmware_sim.cycles import load_auth_cycles, load_cycle_table

from benchmarks.common import console, markdown, record, table, under_load
from sensors.auth import TAG_BYTES, KeyedMac, Keyring, derive_key, seal
from sensors.protocol import Listen, Message, Samples, decode_message, encode_message
from sensors.sealing import GatewayAuth

FLEET = 207  # METR-LA's stations
PERIOD_S = 300.0  # a METR-LA reading every 5 minutes
T0 = 1_338_508_800.0  # 2012-06-01, in METR-LA's span
RATE = 10_000  # mote messages per second at the gateway, for the share of a core
PROGRAMS = ("raw", "vehicle", "count")
RATES_HZ = (10, 60, 180)
#: The paper's mote (1 MHz) and a MICA2 (the ATmega128L at 7.37 MHz), both on the packed wire.
PROFILES = ("paper", "mica2")
CONTROLS_PER_DAY = 48.0  # a program change every half hour: more than a real fleet sees


def _ids() -> list[str]:
    return [str(716_000 + 37 * i) for i in range(FLEET)]


def _samples(sid: str, seq: int, rows: int) -> Samples:
    t = T0 + seq * PERIOD_S * rows
    return Samples(
        sensor_id=sid,
        seq=seq,
        times=tuple(t + PERIOD_S * i for i in range(rows)),
        rows=tuple((round(40.0 + (seq * 7 + i * 13) % 300 / 10, 2),) for i in range(rows)),
        listen_ms=20.0,
    )


def _batch_rows() -> int:
    """Rows of a samples message of about 200 bytes (unsealed)."""
    n = 1
    while len(encode_message(_samples("716000", 1, n + 1))) <= 200:
        n += 1
    return n


def _listen(sid: str, seq: int, _rows: int) -> Listen:
    return Listen(sensor_id=sid, seq=seq, duration_ms=20.0, time=T0 + seq * PERIOD_S)


@dataclass
class Kind:
    """One kind of message: the plain and the sealed bytes of `n` messages of the fleet."""

    name: str
    kind: str
    plain: list[bytes]
    sealed: list[bytes]
    keys: dict[str, bytes]


def make_kind(name: str, build: Callable[[str, int, int], Message], rows: int, n: int) -> Kind:
    """`n` messages round-robin over the fleet, each with its own seq and counter."""
    master = bytes(range(16))
    ids = _ids()
    keys = {sid: derive_key(master, sid) for sid in ids}
    macs = {sid: KeyedMac(k) for sid, k in keys.items()}
    plain, sealed = [], []
    counter = 1_764_633_600_000_000  # a mote's first counter: wall-clock microseconds
    for i in range(n):
        sid = ids[i % FLEET]
        data = encode_message(build(sid, i // FLEET + 1, rows))
        plain.append(data)
        sealed.append(seal(data, macs[sid], counter + i))
    msg = decode_message(plain[0])
    return Kind(name, msg.kind, plain, sealed, keys)


def contenders(k: Kind) -> dict[str, Callable[[int, int], None]]:
    """name -> run(start, stop): the work for messages [start, stop) of `k`."""
    plain, sealed, kind = k.plain, k.sealed, k.kind
    keyring = Keyring(keys=k.keys)
    full = GatewayAuth(keyring, require_mac=True)
    alone = GatewayAuth(keyring, require_mac=True)
    first = decode_message(sealed[0]).sensor_id
    key = k.keys[first]
    mac = KeyedMac(key)
    covered = b"\x94" + sealed[0][1 : -TAG_BYTES - 2]  # what the tag is computed over
    sha256 = hashlib.sha256

    def unkeyed(start: int, stop: int) -> None:
        for i in range(start, stop):
            decode_message(plain[i])

    def keyed(start: int, stop: int) -> None:
        admit = full.admit
        for i in range(start, stop):
            data = sealed[i]
            msg = decode_message(data)
            if not admit(msg.sensor_id, msg.kind, data):
                raise AssertionError(f"refused: {full.rejected}")

    sids = [decode_message(s).sensor_id for s in sealed[:FLEET]]

    def admit_only(start: int, stop: int) -> None:
        admit = alone.admit
        for i in range(start, stop):
            if not admit(sids[i % FLEET], kind, sealed[i]):
                raise AssertionError(f"refused: {alone.rejected}")

    def keyed_mac(start: int, stop: int) -> None:
        digest = mac.digest
        for _ in range(start, stop):
            digest(covered)[:TAG_BYTES]

    def hmac_new(start: int, stop: int) -> None:
        new = hmac.new
        for _ in range(start, stop):
            new(key, covered, sha256).digest()[:TAG_BYTES]

    def hmac_digest(start: int, stop: int) -> None:
        one_shot = hmac.digest
        for _ in range(start, stop):
            one_shot(key, covered, "sha256")[:TAG_BYTES]

    out: dict[str, Callable[[int, int], None]] = {
        "decode_message, unsealed (no keys)": unkeyed,
        "decode + GatewayAuth.admit, sealed (keys)": keyed,
        "GatewayAuth.admit alone": admit_only,
        "KeyedMac.digest": keyed_mac,
        "hmac.new(...).digest()": hmac_new,
        "hmac.digest (one-shot)": hmac_digest,
    }
    cmac = _aes_cmac(key)
    if cmac is not None:
        out["AES-128-CMAC (cryptography)"] = lambda start, stop: cmac(covered, stop - start)
    return out


def _aes_cmac(key: bytes) -> Callable[[bytes, int], None] | None:
    try:
        from cryptography.hazmat.primitives.ciphers import algorithms
        from cryptography.hazmat.primitives.cmac import CMAC
    except ImportError:
        return None

    def run(data: bytes, n: int) -> None:
        for _ in range(n):
            c = CMAC(algorithms.AES(key))
            c.update(data)
            c.finalize()[:TAG_BYTES]

    return run


def measure(kinds: list[Kind], rounds: int, batch: int) -> list[dict[str, list[float]]]:
    """ns per message of each contender on each kind, one figure per round (after a warm-up
    round); every kind and contender in each round, so a change of load hits them all alike."""
    runs = [contenders(k) for k in kinds]
    ns: list[dict[str, list[float]]] = [{name: [] for name in r} for r in runs]
    for r in range(rounds + 1):
        start, stop = r * batch, (r + 1) * batch
        for these, out in zip(runs, ns, strict=True):
            names = list(these)
            for name in names[r % len(names) :] + names[: r % len(names)]:
                t = time.perf_counter_ns()
                these[name](start, stop)
                elapsed = time.perf_counter_ns() - t
                if r:  # round 0 warms up
                    out[name].append(elapsed / batch)
    return ns


def _mmm(xs: Sequence[float]) -> list[float]:
    return [min(xs), statistics.median(xs), max(xs)]


def gateway(rounds: int, batch: int) -> tuple[list[list[object]], list[list[object]]]:
    n = (rounds + 1) * batch
    kinds = [
        make_kind("samples, 4 readings", _samples, 4, n),
        make_kind("listen", _listen, 0, n),
        make_kind(f"samples, {_batch_rows()} readings (~200 B)", _samples, _batch_rows(), n),
    ]
    detail: list[list[object]] = []
    summary: list[list[object]] = []
    for k, ns in zip(kinds, measure(kinds, rounds, batch), strict=True):
        base = statistics.median(ns["decode_message, unsealed (no keys)"])
        for name, xs in ns.items():
            med = statistics.median(xs)
            detail.append([f"{k.name}: {name}", *_mmm(xs), med / base, RATE * med / 1e7])
        keyed = statistics.median(ns["decode + GatewayAuth.admit, sealed (keys)"])
        summary.append(
            [
                k.name,
                len(k.plain[0]),
                len(k.sealed[0]),
                base,
                keyed,
                keyed / base,
                RATE * base / 1e7,
                RATE * keyed / 1e7,
            ]
        )
    return detail, summary


def simulate_mac(program: str, rate: float, profile: str = "paper") -> dict[str, Any] | str:
    """`fjords-power simulate --mac --json` for `profile`, or its error message."""
    argv = ["simulate", "--program", program, "--rate", f"{rate:g}", "--json", "--mac"]
    argv += ["--profile", profile]
    argv += ["--controls-per-day", f"{CONTROLS_PER_DAY:g}"]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = fjords_power(argv)
    if code != 0:
        return (
            err.getvalue().strip().removeprefix("fjords-power simulate: ").removeprefix("error: ")
        )
    result: dict[str, Any] = json.loads(out.getvalue())
    return result


def mote() -> tuple[list[list[object]], list[list[object]], list[str]]:
    auth = load_auth_cycles()
    f_cpu = load_cycle_table("protocol").f_cpu_hz
    measured: list[list[object]] = [
        [what, cycles, cycles / f_cpu * 1e3]
        for what, cycles in (
            ("boot: the key's padded blocks hashed once", auth.boot),
            ("per sealed message, beyond its compressions", auth.message),
            ("one SHA-256 compression", auth.block),
            (
                f"a genuine control of {auth.control_bytes} B verified "
                f"({auth.control_blocks} blocks)",
                auth.control,
            ),
            (f"a forged control of {auth.control_bytes} B rejected", auth.forgery),
        )
    ]
    rows: list[list[object]] = []
    refused: list[str] = []
    for profile, program, rate in itertools.product(PROFILES, PROGRAMS, RATES_HZ):
        r = simulate_mac(program, rate, profile)
        if isinstance(r, str):
            where = f"{program} at {rate} Hz"
            refused.append(f"- {profile}: " + (r if r.startswith(where) else f"{where}: {r}"))
            continue
        m = r["mac"]
        rows.append(
            [
                profile,
                program,
                rate,
                m["sealed_messages_per_s"],
                m["hmac_blocks_per_message"],
                m["cycles_per_message"],
                m["mj_per_message"],
                m["mj_per_control"],
                r["power_mw"],
                m["power_mw"],
                r["lifetime_days"],
                m["lifetime_days"],
                f"{100 * m['lifetime_change']:+.2f}%",
            ]
        )
    return measured, rows, refused


GATEWAY_COLS = ["message: path", "min ns", "median ns", "max ns", "/ unkeyed", "core % at 10k/s"]
SUMMARY_COLS = [
    "message",
    "bytes",
    "sealed bytes",
    "unkeyed ns",
    "keyed ns",
    "keyed / unkeyed",
    "core % at 10k/s unkeyed",
    "keyed",
]
MEASURED_COLS = ["on the ATmega128 (1 MHz)", "cycles", "ms awake"]
MOTE_COLS = [
    "profile",
    "program",
    "rate Hz",
    "sealed msg/s",
    "blocks/msg",
    "cycles/msg",
    "mJ/msg",
    "mJ/control",
    "mW",
    "mW sealed",
    "lifetime d",
    "sealed d",
    "lifetime change",
]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.auth", description=__doc__)
    p.add_argument("--rounds", type=int, default=31, help="timed rounds per contender")
    p.add_argument("--batch", type=int, default=2000, help="messages per contender per round")
    p.add_argument("--quick", action="store_true", help="3 rounds of 200; nothing recorded")
    args = p.parse_args(argv)
    rounds, batch = (3, 200) if args.quick else (args.rounds, args.batch)
    load = under_load()
    detail, summary = gateway(rounds, batch)
    console.print(table("Gateway: ns per mote message", GATEWAY_COLS, detail))
    console.print(table("Gateway: with and without keys", SUMMARY_COLS, summary))
    measured, rows, refused = mote()
    console.print(table("Mote: authentication measured in simavr", MEASURED_COLS, measured))
    console.print(table("Mote: fjords-power simulate --mac", MOTE_COLS, rows))
    console.print("\n".join(refused))
    if args.quick:
        return
    body = (
        f"`python -m benchmarks.auth`. (a) The gateway's CPU per mote message: {rounds} rounds "
        f"of {batch:,} messages per contender, every contender in turn each round (order "
        f"rotated, after a warm-up round), over the same messages of a {FLEET}-mote fleet "
        "(METR-LA-like ids and readings, a key per mote, each message its own seq and counter). "
        "Unkeyed: `decode_message` of the unsealed message. Keyed: the sealed message as the "
        "transports take it with keys, `decode_message` then `GatewayAuth.admit` (HMAC-SHA256 "
        "tag truncated to 8 bytes, replay window per sensor; no message refused). The bare MACs "
        "are over the bytes the tag covers. `/ unkeyed`: median against the unkeyed median; "
        f"core %: what {RATE:,} such messages a second take of one core at the median.\n\n"
        + markdown(SUMMARY_COLS, summary)
        + "\n\n"
        + "\n".join(
            f"- {r[0]}: keys add {r[4] - r[3]:,.0f} ns a message, "
            f"{RATE * (r[4] - r[3]) / 1e7:.1f}% of a core at {RATE:,} messages/s"
            for r in summary
        )
        + "\n\n"
        + markdown(GATEWAY_COLS, detail)
        + "\n\n(b) The mote: what the AVR image measured in simavr (firmware-sim/cycles.json "
        "`auth`, `python -m firmware_sim.measure_auth`; not re-measured here), and "
        "`fjords-power simulate --mac --controls-per-day "
        f"{CONTROLS_PER_DAY:g}` for the paper profile (1 MHz) and a MICA2 (the ATmega128L at "
        "7.37 MHz), both on the packed wire (the profiles' own: the HMAC covers the packed "
        "message; the seal adds 19 bytes on the air to each). mJ/msg: the seal's cycles and its "
        "bytes on the air, less the idle CPU they replace; mW and lifetime without and with "
        "authentication.\n\n"
        + markdown(MEASURED_COLS, measured)
        + "\n\n"
        + markdown(MOTE_COLS, rows)
        + ("\n\nNot possible with authentication:\n\n" + "\n".join(refused) if refused else "")
    )
    record("auth", body, note=load and f"gateway timings {load}")


if __name__ == "__main__":
    main()
