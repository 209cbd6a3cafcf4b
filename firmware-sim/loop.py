"""Firmware in the loop: the protocol image (avr/image.c) run in simavr, one process per mote.

:func:`build_image` makes ``fjords-mote.elf`` and the libsimavr runner ``loop`` (avr/loop.c);
:class:`MoteConfig` is what a mote's EEPROM holds (who it is, its clock, its sample period);
:class:`FirmwareMote` runs one mote on a trace of readings: its UART bytes (COBS frames of the
gateway's protocol, exactly as the firmware wrote them) come out of :meth:`FirmwareMote.read`,
and bytes given to :meth:`FirmwareMote.write` reach its receiver in its next listen window.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import shutil
import struct
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO, Self

import msgspec
from firmware_sim.energy import EnergyAccount
from firmware_sim.profiles import Profile

__all__ = [
    "AVR_DIR",
    "DEFAULT_BUILD",
    "PROGRAM_INDEX",
    "FirmwareMote",
    "Image",
    "LoopError",
    "MoteConfig",
    "build_image",
    "eeprom_counters",
    "measured_energy",
    "to_counts",
]

AVR_DIR = Path(__file__).resolve().parent / "avr"
DEFAULT_BUILD = AVR_DIR / "build"
F_CPU = 1_000_000
#: Program indices of the image (avr/image.c `program_names`, sorted by name).
PROGRAM_INDEX = {
    name: i for i, name in enumerate(["aggregate", "count", "deadband", "filter", "raw", "vehicle"])
}
#: EEPROM layout (avr/image.c `struct config`, little-endian, packed); attributes follow it.
_CONFIG = struct.Struct("<2sBBIQfHI33s17sH16sIQ")
_CONFIG_VERSION = 2
#: Offsets in the EEPROM of what the firmware writes there itself.
BOOT_COUNT_AT = _CONFIG.size - 12
CONTROL_COUNTER_AT = _CONFIG.size - 8
NO_KEY = b"\xff" * 16
MAX_ATTRIBUTES = 120
MAX_PARAMS = 160


class LoopError(RuntimeError):
    """The toolchain failed, or a mote could not be configured or run."""


@dataclass(frozen=True)
class Image:
    elf: Path
    runner: Path


def toolchain_missing() -> list[str]:
    missing = [t for t in ("avr-gcc", "make", "gcc") if shutil.which(t) is None]
    if not any(
        Path(p, "simavr/sim_avr.h").exists() for p in ("/usr/include", "/usr/local/include")
    ):
        missing.append("libsimavr-dev")
    return missing


def build_image(build_dir: Path = DEFAULT_BUILD) -> Image:
    """Build (make: only what changed) the image and the runner."""
    missing = toolchain_missing()
    if missing:
        raise LoopError(f"missing {', '.join(missing)} (run scripts/install-system-deps)")
    build_dir.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        ["make", "-s", "-C", str(AVR_DIR), f"BUILD={build_dir.resolve()}", "image"],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise LoopError(f"AVR image build failed:\n{result.stdout}{result.stderr}")
    return Image(build_dir / "fjords-mote.elf", build_dir / "loop")


@dataclass(frozen=True)
class MoteConfig:
    """One mote's EEPROM: identity, clock, sampling, listening, boot program."""

    sensor_id: str
    period_ms: int = 1000
    #: Mote clock at the first sample (ms); a mote knows no epoch, so this is set when flashed.
    start_ms: int = 0
    field: str = "value"
    #: A-to-D counts per reading unit (readings are sent as counts / scale).
    scale: float = 1.0
    program: str = "raw"
    #: The boot program's parameters, as `load_program` would give them (`filter`,
    #: `deadband` and `aggregate` need some; a program whose params the firmware refuses
    #: boots as `raw`).
    params: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    listen_ms: int = 20
    listen_every_ms: int = 1000
    attributes: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    #: The mote's 16-byte key (sensors/auth.py): every message it sends is sealed and only
    #: sealed controls with a new counter are obeyed. None: unauthenticated.
    key: bytes | None = None

    def eeprom(self) -> bytes:
        ident, name = self.sensor_id.encode(), self.field.encode()
        if not 0 < len(ident) <= 32 or not 0 < len(name) <= 16:
            raise LoopError("sensor_id must be 1-32 bytes and field 1-16 bytes")
        if self.program not in PROGRAM_INDEX:
            raise LoopError(
                f"unknown program {self.program!r}; expected one of {list(PROGRAM_INDEX)}"
            )
        if not 0 < self.listen_ms <= 500:
            raise LoopError("listen_ms must be in 1..500")
        if self.key is not None and (len(self.key) != 16 or self.key == NO_KEY):
            raise LoopError("key must be 16 bytes, not all 0xff (a blank EEPROM)")
        attributes = msgspec.msgpack.encode(dict(self.attributes))
        if len(attributes) > MAX_ATTRIBUTES:
            raise LoopError(f"attributes take {len(attributes)} bytes; at most {MAX_ATTRIBUTES}")
        head = _CONFIG.pack(
            b"FJ",
            _CONFIG_VERSION,
            PROGRAM_INDEX[self.program],
            self.period_ms,
            self.start_ms,
            self.scale,
            self.listen_ms,
            self.listen_every_ms,
            ident,
            name,
            len(attributes),
            NO_KEY if self.key is None else self.key,
            0,  # boot count: the first boot is 1
            (1 << 64) - 1,  # no control accepted yet
        )
        params = msgspec.msgpack.encode(dict(self.params))
        if len(params) > MAX_PARAMS:
            raise LoopError(f"params take {len(params)} bytes; at most {MAX_PARAMS}")
        return head + attributes + bytes([len(params)]) + params


def eeprom_counters(eeprom: bytes) -> tuple[int, int | None]:
    """(boot count, highest control counter accepted or None) from a mote's EEPROM."""
    boot, control = struct.unpack_from("<IQ", eeprom, BOOT_COUNT_AT)
    return boot, None if control == (1 << 64) - 1 else control


def measured_energy(stats: Mapping[str, Any], profile: str | Profile = "paper") -> EnergyAccount:
    """A firmware run's energy from what the runner counted (avr/loop.c's stats): awake cycles,
    A-to-D conversions, radio bytes sent (whole frames, delimiters included) and receiver-on
    time, at `profile`'s costs; the CPU idles for the rest of the run."""
    account = EnergyAccount(profile)
    elapsed = stats["cycles"] / stats["f_cpu_hz"]
    active = account.add_cycles(stats["awake_cycles"] * F_CPU / stats["f_cpu_hz"])
    account.add_adc(stats["conversions"])
    account.add_bits_sent(8 * stats["tx_bytes"], stats.get("tx_frames", 0))
    account.add_listen(stats["listen_s"])
    account.add_idle(max(0.0, elapsed - active))
    account.advance(elapsed)
    return account


def to_counts(values: Sequence[float], scale: float) -> list[int]:
    """Readings as 10-bit A-to-D counts (clipped; NaN reads as 0)."""
    out = []
    for v in values:
        c = 0 if math.isnan(v) else round(v * scale)
        out.append(min(1023, max(0, c)))
    return out


class FirmwareMote:
    """One mote in simavr: an async context manager owning the runner process."""

    def __init__(
        self,
        config: MoteConfig,
        counts: Sequence[int],
        step_ms: float,
        *,
        image: Image,
        speedup: float | None = None,
        window_wall_ms: int = 100,
        eeprom: bytes | None = None,
        preload: bytes = b"",
    ) -> None:
        """`eeprom`: boot from this EEPROM (e.g. a previous run's :attr:`eeprom`: a reboot,
        with its boot count and control counter) instead of `config`'s. `preload`: bytes in
        the receiver before the mote boots, so they reach its first window however loaded the
        machine is (a :meth:`write` lands in whichever window is open when it arrives)."""
        if not counts:
            raise LoopError(f"{config.sensor_id}: empty trace")
        self.config = config
        self.counts = counts
        self.step_ms = step_ms
        self.image = image
        self.speedup = speedup
        self.window_wall_ms = window_wall_ms
        self.preload = preload
        self.stats: dict[str, Any] = {}
        self.stderr = ""
        #: The EEPROM: as flashed, then (after :meth:`wait`) as the firmware left it.
        self.eeprom = config.eeprom() if eeprom is None else eeprom
        self._proc: asyncio.subprocess.Process | None = None
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._stderr: BinaryIO | None = None

    async def __aenter__(self) -> Self:
        self._dir = tempfile.TemporaryDirectory(prefix="fjords-mote-")
        d = Path(self._dir.name)
        (d / "eeprom.bin").write_bytes(self.eeprom)
        (d / "trace.txt").write_text("\n".join(map(str, self.counts)) + "\n")
        self._stderr = (d / "stderr.txt").open("wb")
        self._proc = await asyncio.create_subprocess_exec(
            str(self.image.runner),
            str(self.image.elf),
            str(d / "eeprom.bin"),
            str(d / "trace.txt"),
            repr(float(self.step_ms)),
            repr(float(self.speedup or 0.0)),
            str(self.window_wall_ms),
            str(len(self.preload)),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=self._stderr,  # a file: a chatty simulator can never block on a full pipe
        )
        if self.preload:
            await self.write(self.preload)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.returncode is None:
            proc.kill()
            with contextlib.suppress(ProcessLookupError):
                await proc.wait()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    async def read(self) -> bytes:
        """The next UART bytes the mote sent (b"" once it has ended)."""
        assert self._proc is not None and self._proc.stdout is not None
        return await self._proc.stdout.read(65536)

    async def write(self, data: bytes) -> None:
        """Bytes for the mote's receiver; they wait in the pipe until its next window."""
        assert self._proc is not None and self._proc.stdin is not None
        if self._proc.returncode is not None:
            return
        self._proc.stdin.write(data)
        with contextlib.suppress(ConnectionError):
            await self._proc.stdin.drain()

    async def wait(self) -> dict[str, Any]:
        """After `read` returned b"": the runner's counts (see avr/loop.c) once it exits."""
        assert self._proc is not None and self._dir is not None
        code = await self._proc.wait()
        err = Path(self._dir.name, "stderr.txt").read_text(errors="replace")
        self.stderr = err
        self.eeprom = Path(self._dir.name, "eeprom.bin").read_bytes()
        for line in err.splitlines():
            if line.startswith("stats "):
                self.stats = json.loads(line[6:])
        if code != 0:
            raise LoopError(f"{self.config.sensor_id}: runner exited {code}: {err.strip()}")
        return self.stats
