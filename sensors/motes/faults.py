"""Fault injection for simulated motes (paper section 2.2.2: sensors drop, garble, lag, vanish).

Everything is driven by mote time and a seeded RNG, so a run is reproducible whatever the
transport and however fast the simulation goes.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field

from sensors.protocol import Message
from sensors.transports.base import Corrupt

__all__ = ["FaultConfig", "FaultInjector", "MoteClock"]


@dataclass(frozen=True, slots=True)
class MoteClock:
    """A mote's clock: reported = true x (1 + drift_ppm / 1e6) + offset_s."""

    offset_s: float = 0.0
    drift_ppm: float = 0.0

    def __call__(self, t: float) -> float:
        return t * (1.0 + self.drift_ppm * 1e-6) + self.offset_s


@dataclass(frozen=True, slots=True)
class FaultConfig:
    """Per-packet probabilities and the mote's offline spells, all in mote (true) seconds.

    `delay` is the probability that a packet is held back for uniform(0, max_delay_s); a
    held packet overtakes nothing but is overtaken by later ones, which is how reordering
    happens on a real multi-hop radio path.
    """

    loss: float = 0.0
    garble: float = 0.0
    garble_bytes: int = 1
    delay: float = 0.0
    max_delay_s: float = 0.5
    offline: tuple[tuple[float, float], ...] = ()  # (start, end) spells
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("loss", "garble", "delay"):
            p = getattr(self, name)
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"{name} must be a probability in [0, 1], not {p}")
        if self.garble_bytes < 1 or self.max_delay_s < 0:
            raise ValueError("garble_bytes must be >= 1 and max_delay_s >= 0")
        for start, end in self.offline:
            if end < start:
                raise ValueError(f"offline spell ({start}, {end}) ends before it starts")


@dataclass(slots=True)
class FaultStats:
    lost: int = 0
    garbled: int = 0
    delayed: int = 0
    offline_dropped: int = 0


@dataclass
class FaultInjector:
    """Decides the fate of each outgoing packet; sans-IO (the mote does the sending)."""

    config: FaultConfig = field(default_factory=FaultConfig)
    stats: FaultStats = field(default_factory=FaultStats)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.config.seed)
        self._held: list[tuple[float, int, Message]] = []
        self._n = 0

    def offline(self, t: float) -> bool:
        return any(start <= t < end for start, end in self.config.offline)

    def submit(self, t: float, msg: Message) -> list[Message]:
        """Packet `msg` leaves the mote at `t`; returns the packets that go on air now."""
        out = self.release(t)
        cfg = self.config
        if cfg.loss and self._rng.random() < cfg.loss:
            self.stats.lost += 1
            return out
        if cfg.delay and self._rng.random() < cfg.delay:
            self.stats.delayed += 1
            self._n += 1
            heapq.heappush(self._held, (t + self._rng.uniform(0, cfg.max_delay_s), self._n, msg))
            return out
        out.append(msg)
        return out

    def release(self, t: float) -> list[Message]:
        """Held packets whose delay has passed by `t`."""
        out = []
        while self._held and self._held[0][0] <= t:
            out.append(heapq.heappop(self._held)[2])
        return out

    def flush(self) -> list[Message]:
        out = [m for _, _, m in sorted(self._held)]
        self._held.clear()
        return out

    def corruption(self) -> Corrupt | None:
        """A byte-corrupting function for this packet, or None (most packets)."""
        cfg = self.config
        if not cfg.garble or self._rng.random() >= cfg.garble:
            return None
        self.stats.garbled += 1
        rng = random.Random(self._rng.getrandbits(64))

        def corrupt(data: bytes) -> bytes:
            b = bytearray(data)
            for _ in range(cfg.garble_bytes):
                i = rng.randrange(len(b))
                b[i] ^= rng.randrange(1, 256)
            return bytes(b)

        return corrupt
