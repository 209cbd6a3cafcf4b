"""What authentication costs the protocol image, measured in simavr (cycles.json's `auth`).

Each workload runs twice on the same trace, in the loop (firmware_sim.loop): with a key in
EEPROM (every message sealed, avr/auth.c) and without. The firmware must send the same
messages both times; the extra awake cycles of the keyed runs are fitted as

    extra = boot + message * sealed messages + block * SHA-256 compressions

(least squares; a message's compressions are firmware_sim.wire.hmac_blocks of its size, the
`message` term holds the 19 more bytes framed and sent and the counter written). A verified
control is measured the same way: a keyed run with genuine sealed `wake` controls against an
unkeyed run with the same controls unsealed, less the sealing of every message the keyed run
sent; a rejected forgery against a keyed run without it. simavr does not model the EEPROM's
write time (the boot count at boot, the control counter per accepted control).
"""

from __future__ import annotations

import asyncio
import statistics
from dataclasses import dataclass
from typing import Any

from firmware_sim import measure
from firmware_sim.loop import FirmwareMote, Image, MoteConfig
from firmware_sim.wire import SEAL_BYTES, hmac_blocks

__all__ = ["KEY", "measure_auth"]

KEY = bytes(range(16))
#: (program, params, sample period ms): message sizes from one reading to a raw batch of 8. The
#: periods are slow enough for the keyed mote to keep time (a seal takes 0.1-0.2 s at 1 MHz;
#: faster, its conversions fall late and it reads other samples than the unkeyed mote).
WORKLOADS: tuple[tuple[str, dict[str, Any], int], ...] = (
    ("raw", {"batch": 1}, 250),
    ("raw", {"batch": 4}, 250),
    ("raw", {"batch": 8}, 250),
    ("vehicle", {"role": "upstream"}, 250),
    ("aggregate", {"window_ms": 1000}, 250),
)
SECONDS = 16.0
SEED = 7
CONTROLS = 4


@dataclass(frozen=True)
class _Run:
    awake: int
    payloads: list[bytes]
    stats: dict[str, Any]


def _mote(program: str, params: dict[str, Any], period_ms: int, key: bytes | None) -> MoteConfig:
    base = measure.config(program, period_ms)
    return MoteConfig(
        base.sensor_id,
        period_ms=period_ms,
        start_ms=base.start_ms,
        program=program,
        params=params,
        listen_ms=base.listen_ms,
        listen_every_ms=base.listen_every_ms,
        key=key,
    )


def _payloads(wire: bytes) -> list[bytes]:
    from cobs import cobs

    return [cobs.decode(f)[:-2] for f in wire.split(b"\x00") if f]


async def _run(
    image: Image, cfg: MoteConfig, counts: list[int], period_ms: int, frames: list[bytes]
) -> _Run:
    wire = bytearray()
    async with FirmwareMote(cfg, counts, period_ms, image=image, window_wall_ms=20) as mote:
        for f in frames:
            await mote.write(f)
        while data := await mote.read():
            wire += data
        stats = await mote.wait()
    return _Run(stats["awake_cycles"], _payloads(bytes(wire)), stats)


def _blocks(run: _Run) -> int:
    return sum(hmac_blocks(len(p) - SEAL_BYTES) for p in run.payloads)


async def _measure(image: Image) -> dict[str, Any]:
    from sensors.auth import seal, unseal
    from sensors.framing import frame_payload
    from sensors.protocol import Control, encode_message

    rows, extra, sizes = [], [], []
    for program, params, period in WORKLOADS:
        counts = measure.trace_counts(program, period, SEED, SECONDS)
        keyed = await _run(image, _mote(program, params, period, KEY), counts, period, [])
        plain = await _run(image, _mote(program, params, period, None), counts, period, [])
        opened = [unseal(p, KEY)[0] for p in keyed.payloads]
        if opened != plain.payloads:
            raise measure.MeasurementError(
                f"{program}: the keyed firmware sent other messages than the unkeyed one"
            )
        rows.append([1.0, float(len(keyed.payloads)), float(_blocks(keyed))])
        extra.append(float(keyed.awake - plain.awake))
        sizes += [len(p) for p in plain.payloads]
    boot, message, block = measure.lstsq(rows, extra)
    fit = [boot + message * r[1] + block * r[2] for r in rows]
    worst = max(abs(f / e - 1) for f, e in zip(fit, extra, strict=True))

    # Controls: genuine ones verified and applied; forgeries rejected.
    # A constant trace, one reading a second: a keyed mote busy verifying reads late samples.
    program, params, period = "raw", {"batch": 1}, 1000
    counts = [512] * round(SECONDS)
    sensor = measure.SENSOR
    plain_controls = [Control.wake(sensor, seq=i) for i in range(CONTROLS)]
    sealed = [seal(encode_message(c), KEY, 1000 + i) for i, c in enumerate(plain_controls)]
    keyed = await _run(
        image,
        _mote(program, params, period, KEY),
        counts,
        period,
        [frame_payload(s) for s in sealed],
    )
    plain = await _run(
        image,
        _mote(program, params, period, None),
        counts,
        period,
        [frame_payload(encode_message(c)) for c in plain_controls],
    )
    if [unseal(p, KEY)[0] for p in keyed.payloads] != plain.payloads:
        raise measure.MeasurementError("controls: the keyed firmware answered otherwise")
    sealing = boot + message * len(keyed.payloads) + block * _blocks(keyed)
    verify = (keyed.awake - plain.awake - sealing) / CONTROLS
    forged = [bytearray(s) for s in sealed]
    for f in forged:
        f[-1] ^= 1
    rejected = await _run(
        image,
        _mote(program, params, period, KEY),
        counts,
        period,
        [frame_payload(bytes(f)) for f in forged],
    )
    quiet = await _run(image, _mote(program, params, period, KEY), counts, period, [])
    if rejected.stats["rejected"]["bad_mac"] != CONTROLS:
        raise measure.MeasurementError(f"forgeries: {rejected.stats['rejected']}")
    forgery = (rejected.awake - quiet.awake) / CONTROLS
    control_bytes = len(encode_message(plain_controls[0]))
    return {
        "key_bytes": len(KEY),
        "tag_bytes": 8,
        "seal_bytes": SEAL_BYTES,
        "model": "extra awake cycles of a keyed run = boot + message * sealed messages + block * "
        "SHA-256 compressions (wire.hmac_blocks of each message's unsealed size); least squares "
        "over the workloads; control and forgery from paired runs",
        "boot": round(boot, 1),
        "message": round(message, 1),
        "block": round(block, 1),
        "fit_worst_error": round(worst, 5),
        "control": round(verify, 1),
        "control_bytes": control_bytes,
        "control_blocks": hmac_blocks(control_bytes),
        "forgery": round(forgery, 1),
        "runs": {
            "workloads": [{"program": p, "params": q, "period_ms": t} for p, q, t in WORKLOADS],
            "seconds": SECONDS,
            "seed": SEED,
            "controls": CONTROLS,
            "message_bytes_median": statistics.median(sizes),
        },
    }


def measure_auth(image: Image) -> dict[str, Any]:
    """The `auth` section of cycles.json, measured on `image`."""
    return asyncio.run(_measure(image))
