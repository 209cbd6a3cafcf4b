"""What a sensor proxy answers with (sans-IO): tuples, heartbeats, paces and releases to push
into the Fjord, controls to send; and the counters it keeps."""

from __future__ import annotations

from dataclasses import dataclass

from sensors.protocol import Control

__all__ = [
    "Action",
    "ProxyStats",
    "PushHeartbeat",
    "PushPace",
    "PushRelease",
    "PushRow",
    "SendControl",
]


@dataclass(frozen=True, slots=True)
class PushRow:
    stream: str
    row: tuple


@dataclass(frozen=True, slots=True)
class PushHeartbeat:
    stream: str
    sensor: object
    time: float


@dataclass(frozen=True, slots=True)
class PushPace:
    """The sensor sends about every `gap_s` seconds (its silence bound, fjords.runtime.progress)."""

    stream: str
    sensor: object
    gap_s: float
    every: int = 1  # it samples this many times slower for SAMPLE EVERY n ROWS (`Pace.every`)


@dataclass(frozen=True, slots=True)
class PushRelease:
    """The sensor will send nothing for a while (asleep): it stops holding the stream."""

    stream: str
    sensor: object


@dataclass(frozen=True, slots=True)
class SendControl:
    sensor_id: str
    control: Control


Action = PushRow | PushHeartbeat | PushPace | PushRelease | SendControl


@dataclass(slots=True)
class ProxyStats:
    messages: int = 0
    tuples: int = 0
    heartbeats: int = 0
    duplicates: int = 0
    out_of_order: int = 0
    bad: int = 0
    stale_partials: int = 0  # windows of a pushed-down program no current demand allows
    misaligned_windows: int = 0
    redundant: int = 0  # downstream counts of a pair (upstream's are pushed)
    listen_windows: int = 0
    controls_sent: int = 0
    retries: int = 0
    superseded: int = 0
    acks: int = 0
    refused: int = 0
    unanswered: int = 0  # controls given up after max_sends windows without an ack
    unknown_acks: int = 0
    send_failures: int = 0
    offline_spells: int = 0
    clock_rejects: int = 0  # readings dated implausibly far ahead (fjords.runtime.progress)
    # messages under its id refused by authentication (sensors.sealing), never handled here;
    # `unsigned`: accepted unsealed (require_mac = false)
    bad_mac: int = 0
    replay: int = 0
    unsigned: int = 0
