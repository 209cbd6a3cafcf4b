"""The control channel to one mote, as an explicit sans-IO state machine (as h11 is for HTTP).

A mote hears the gateway only in the receive windows it announces, and answers each control with
an ack. The channel holds the controls that take the mote from what the proxy believes it runs to
what it should run, and turns the proxy's inputs into events; it does no I/O and reads no clock:

    channel.want([...controls...])  -> [Superseded]         a newer decision replaces pending ones
    channel.window(wall)            -> [Send | GiveUp ...]  a receive window opened
    channel.ack(ack)                -> [Acked | Refused | UnknownAck]
    channel.send_failed(control, permanent) -> [GiveUp]      the transport could not send it

Each control moves through these states:

    QUEUED --window--> SENT --ack ok--> (acked, gone)
                        |  --ack error--> (refused, gone)
                        |  --window, retry due--> SENT again (a retry; same seq)
                        |  --window, retry due, max_sends reached--> (given up, gone)
    QUEUED/SENT --want() without it--> (superseded, gone)

A retry is due once `retry_windows` windows AND `retry_after_s` seconds of the caller's wall
clock passed since the last send (no wall clock given: windows alone), so a mote replayed so fast
that its windows are milliseconds apart gets the time of a round trip to answer. Controls are
idempotent at the mote: a repeated one is applied and acked again; an ack for a control no longer
pending (a retry's second ack) is an `UnknownAck`. A mote that rebooted lost what it had not
acked: `restart()` makes every pending control QUEUED again.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass
from enum import Enum
from typing import Any

import msgspec

from sensors.protocol import Ack, Control, ControlOp

__all__ = [
    "DEFAULT_RETRY_AFTER_S",
    "Acked",
    "ChannelEvent",
    "ControlChannel",
    "ControlState",
    "GiveUp",
    "Pending",
    "Refused",
    "Send",
    "Superseded",
    "UnknownAck",
    "describe",
    "freeze",
    "same_control",
    "thaw",
]

#: Wall seconds a control waits for its ack before it is re-sent (besides `retry_windows`
#: windows): a few round trips through a busy broker and gateway.
DEFAULT_RETRY_AFTER_S = 2.0
_INFLIGHT = 64  # sent controls remembered to match late acks


class ControlState(Enum):
    QUEUED = "queued"  # waiting for a window
    SENT = "sent"  # sent at least once, no ack yet


@dataclass(slots=True)
class Pending:
    control: Control
    sent_window: int | None = None
    sends: int = 0
    sent_wall: float | None = None  # the caller's wall clock at the last send

    @property
    def state(self) -> ControlState:
        return ControlState.QUEUED if self.sent_window is None else ControlState.SENT


# -- events ------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Send:
    """Put `control` on the air in this window (`retry`: it was sent before)."""

    control: Control
    window: int
    retry: bool


@dataclass(frozen=True, slots=True)
class GiveUp:
    """No ack after `sends` sends (or it cannot be sent): the control is dropped. `unanswered`:
    the mote never said no (its ack may have been lost), so it may be asked again later."""

    control: Control
    why: str
    unanswered: bool = False


@dataclass(frozen=True, slots=True)
class Acked:
    control: Control
    window: int


@dataclass(frozen=True, slots=True)
class Refused:
    control: Control
    error: str


@dataclass(frozen=True, slots=True)
class UnknownAck:
    ack_seq: int


@dataclass(frozen=True, slots=True)
class Superseded:
    controls: tuple[Control, ...]


ChannelEvent = Send | GiveUp | Acked | Refused | UnknownAck | Superseded


class ControlChannel:
    """See the module docstring. `stats` (optional) is any object with the counters
    controls_sent, retries, superseded, acks, refused, unanswered, unknown_acks."""

    def __init__(
        self,
        *,
        retry_windows: int = 2,
        max_sends: int = 5,
        retry_after_s: float = DEFAULT_RETRY_AFTER_S,
        stats: Any = None,
    ) -> None:
        if retry_windows < 1 or max_sends < 1:
            raise ValueError("retry_windows and max_sends must be >= 1")
        if not retry_after_s >= 0:
            raise ValueError("retry_after_s must be >= 0")
        self.retry_windows = retry_windows
        self.max_sends = max_sends
        self.retry_after_s = retry_after_s
        self.stats = stats
        self.pending: list[Pending] = []
        self.windows = 0  # receive windows seen
        self._seq = itertools.count(1)
        self._inflight: OrderedDict[int, Control] = OrderedDict()

    def _count(self, name: str, n: int = 1) -> None:
        if self.stats is not None:
            setattr(self.stats, name, getattr(self.stats, name) + n)

    # -- inputs -------------------------------------------------------------------------------
    def want(self, wanted: list[Control]) -> list[ChannelEvent]:
        """The controls that take the mote from belief to choice (in order). One already
        pending keeps its seq and its sends; the others are QUEUED with a new seq; pending
        controls not wanted any more are superseded."""
        keep: list[Pending] = []
        for w in wanted:
            same = next((p for p in self.pending if same_control(p.control, w)), None)
            if same is not None:
                keep.append(same)
            else:
                keep.append(Pending(msgspec.structs.replace(w, seq=next(self._seq))))
        dropped = tuple(p.control for p in self.pending if p not in keep)
        self.pending = keep
        if not dropped:
            return []
        self._count("superseded", len(dropped))
        return [Superseded(dropped)]

    def window(self, wall: float | None = None) -> list[ChannelEvent]:
        """A receive window opened: what to send in it, and what to give up."""
        self.windows += 1
        out: list[ChannelEvent] = []
        for p in list(self.pending):
            if p.sent_window is not None and (
                self.windows - p.sent_window < self.retry_windows
                or (
                    wall is not None
                    and p.sent_wall is not None
                    and wall - p.sent_wall < self.retry_after_s
                )
            ):
                continue  # its ack may still be on the way
            if p.sends >= self.max_sends:
                self.pending.remove(p)
                self._count("unanswered")
                out.append(GiveUp(p.control, f"no ack after {p.sends} windows", unanswered=True))
                continue
            retry = p.sends > 0
            if retry:
                self._count("retries")
            p.sends += 1
            p.sent_window = self.windows
            p.sent_wall = wall
            self._inflight[p.control.seq] = p.control
            while len(self._inflight) > _INFLIGHT:
                self._inflight.popitem(last=False)
            self._count("controls_sent")
            out.append(Send(p.control, self.windows, retry))
        return out

    def ack(self, ack: Ack) -> list[ChannelEvent]:
        control = self._inflight.pop(ack.ack_seq, None)
        if control is None:
            self._count("unknown_acks")
            return [UnknownAck(ack.ack_seq)]
        self._count("acks")
        self.pending = [p for p in self.pending if p.control.seq != ack.ack_seq]
        if not ack.ok:
            self._count("refused")
            return [Refused(control, ack.error)]
        return [Acked(control, self.windows)]

    def send_failed(self, control: Control, error: str, *, permanent: bool) -> list[ChannelEvent]:
        """The transport could not send `control`; a permanent failure (it never will, e.g.
        unencodable) gives it up, a passing one leaves it to the retry."""
        if not permanent:
            return []
        self.pending = [p for p in self.pending if p.control.seq != control.seq]
        return [GiveUp(control, f"cannot be sent: {error}")]

    def restart(self) -> None:
        """The mote rebooted: it lost whatever it had not acked, so all is QUEUED again."""
        for p in self.pending:
            p.sent_window = None


# -- helpers -------------------------------------------------------------------------------------
def freeze(v: Any) -> Any:
    """A hashable, order-independent form of program parameters."""
    if isinstance(v, dict):
        return tuple(sorted((k, freeze(x)) for k, x in v.items()))
    if isinstance(v, list | tuple):
        return tuple(freeze(x) for x in v)
    return v


def thaw(v: Any) -> Any:
    if isinstance(v, tuple) and all(
        isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str) for x in v
    ):
        return {k: thaw(x) for k, x in v}
    if isinstance(v, tuple):
        return [thaw(x) for x in v]
    return v


def same_control(a: Control, b: Control) -> bool:
    return (
        a.op == b.op
        and a.program == b.program
        and freeze(dict(a.params)) == freeze(dict(b.params))
        and a.period_ms == b.period_ms
        and a.duration_ms == b.duration_ms
    )


def describe(c: Control) -> str:
    if c.op == ControlOp.LOAD_PROGRAM:
        return f"load_program {c.program} {dict(c.params)} (seq {c.seq})"
    if c.op == ControlOp.SET_PERIOD:
        return f"set_period {c.period_ms:g} ms (seq {c.seq})"
    if c.op == ControlOp.SLEEP:
        return f"sleep {c.duration_ms:g} ms (seq {c.seq})"
    return f"{c.op} (seq {c.seq})"
