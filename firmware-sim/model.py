"""Average power and lifetime of a program at a sample rate, and the proxy's choice.

`predict` charges one second of steady-state work (per-second counts of samples,
detector edges and messages, the measured cycles per each) to an EnergyAccount, so a
prediction and an exact per-sample simulation use the same arithmetic.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from fractions import Fraction
from typing import Any

from firmware_sim import wire
from firmware_sim.cycles import (
    AuthCycles,
    CycleTable,
    ProgramCycles,
    load_auth_cycles,
    load_cycle_table,
)
from firmware_sim.energy import Battery, EnergyAccount
from firmware_sim.profiles import Profile, resolve_profile
from firmware_sim.programs import PROGRAMS, RAW_BATCH
from firmware_sim.wire import Mote

SECONDS_PER_DAY = 86_400.0
#: Bytes of one message in the paper's packed format (programs.py: a header byte, then
#: little-endian 16-bit fields; raw: RAW_BATCH readings).
PACKED_BYTES = {
    "raw": 1 + 2 * RAW_BATCH,
    "vehicle": 5,
    "count": 5,
    "filter": 5,
    "aggregate": 13,
    "deadband": 5,
}
# What each need can be served by, cheapest first in the usual case.
NEEDS: dict[str, tuple[str, ...]] = {
    "counts": ("count", "vehicle", "raw"),
    "vehicles": ("vehicle", "raw"),
    "raw": ("raw",),
}
# Slowest useful sample rate per need: vehicles need 180 Hz for one-foot lengths at
# 60 mph (paper section 5.1); counts need two readings inside the shortest gap between
# vehicles (about 0.03 s at 5 vehicles/s), so 60 Hz; raw data has no floor.
MIN_RATE_HZ = {"vehicles": 180.0, "counts": 60.0, "raw": 1.0}


@dataclass(frozen=True)
class Prediction:
    program: str
    rate_hz: float
    profile: str
    power_mw: float
    current_ma: float
    lifetime_s: float
    lifetime_days: float
    breakdown_mw: dict[str, float]
    cycles_per_s: float
    messages_per_s: float
    bits_per_s: float
    workload: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if math.isinf(self.lifetime_s):
            d["lifetime_s"] = d["lifetime_days"] = None
        return d


def predict(
    program: str,
    rate_hz: float,
    profile: str | Profile = "paper",
    *,
    vehicles_per_second: float | None = None,
    listen_ms_per_s: float | None = None,
    period_ms: float = 1000.0,
    window_ms: float = 1000.0,
    selectivity: float = 0.1,
    change_fraction: float = 0.1,
    cycles: CycleTable | None = None,
    wire: str | None = None,
    listen_every_ms: float = 1000.0,
    batch: int = RAW_BATCH,
    burst: float = 1.0,
    value_bytes: float | None = None,
    reading_counts: float = 512.0,
    mote: Mote | None = None,
) -> Prediction:
    """Steady-state power of `program` sampling at `rate_hz`.

    Workload: vehicles_per_second (vehicle, count; default the profile's), period_ms
    (count), window_ms (aggregate), selectivity (filter: fraction of readings sent),
    change_fraction (deadband: fraction sent), listen_ms_per_s (receive window per
    second; default the profile's).

    `wire` says what goes on the air: "packed" (the paper's format: a header byte and 16-bit
    fields, `listen_ms_per_s` of receiver time) or "protocol" (the protocol image, avr/image.c:
    msgpack frames sized by firmware_sim.wire, a receive window of `listen_ms_per_s` x
    `listen_every_ms` / 1000 ms at most every `listen_every_ms`, riding on a data message or
    else on a bare `listen` frame); the default is the profile's. Protocol-only workload:
    batch (raw readings per message), burst (filter, deadband: mean messages per burst, e.g. a
    vehicle over the sensor), value_bytes (mean msgpack bytes of a reading sent; default that
    of `reading_counts`), reading_counts (a typical reading, for partial sums), mote (sensor
    id, clock, sequence width: firmware_sim.wire.Mote).
    """
    prof = resolve_profile(profile)
    if program not in PROGRAMS:
        raise ValueError(f"unknown program {program!r}; expected one of {sorted(PROGRAMS)}")
    if (
        isinstance(rate_hz, bool)
        or not isinstance(rate_hz, int | float)
        or not (math.isfinite(rate_hz) and rate_hz > 0)
    ):
        raise ValueError(f"sample rate must be a positive number of Hz, not {rate_hz!r}")
    vps = prof.vehicles_per_second if vehicles_per_second is None else vehicles_per_second
    listen = prof.listen_ms_per_s if listen_ms_per_s is None else listen_ms_per_s
    _check_range("vehicles_per_second", vps, 0, math.inf)
    _check_range("listen_ms_per_s", listen, 0, 1000)
    _check_range("period_ms", period_ms, 1e-9, math.inf)
    _check_range("window_ms", window_ms, 1e-9, math.inf)
    _check_range("selectivity", selectivity, 0, 1)
    _check_range("change_fraction", change_fraction, 0, 1)
    wire = wire or prof.wire
    if wire not in ("packed", "protocol"):
        raise ValueError(f"wire must be 'packed' or 'protocol', not {wire!r}")
    table = cycles or load_cycle_table(wire)
    cost = table[PROGRAMS[program].cycles_key]
    if wire == "protocol":
        return _predict_protocol(
            program,
            float(rate_hz),
            prof,
            cost,
            vps=vps,
            listen=listen,
            listen_every_ms=listen_every_ms,
            period_ms=period_ms,
            window_ms=window_ms,
            selectivity=selectivity,
            change_fraction=change_fraction,
            batch=batch,
            burst=burst,
            value_bytes=value_bytes,
            reading_counts=reading_counts,
            mote=mote or Mote(),
        )
    edges = 0.0
    workload: dict[str, float] = {"listen_ms_per_s": listen}
    if program == "raw":
        messages = rate_hz / RAW_BATCH
    elif program in ("vehicle", "count"):
        if 2 * vps > rate_hz:
            raise ValueError(
                f"{rate_hz:g} Hz is too slow to see {vps:g} vehicles/s "
                f"(each vehicle needs a covered and an uncovered reading)"
            )
        edges = 2 * vps
        messages = vps if program == "vehicle" else 1000.0 / period_ms
        workload["vehicles_per_second"] = vps
        if program == "count":
            workload["period_ms"] = period_ms
    elif program == "aggregate":
        messages = min(rate_hz, 1000.0 / window_ms)
        workload["window_ms"] = window_ms
    elif program == "filter":
        messages = rate_hz * selectivity
        workload["selectivity"] = selectivity
    else:  # deadband
        messages = rate_hz * change_fraction
        workload["change_fraction"] = change_fraction
    cycles_per_s = rate_hz * cost.sample + edges * cost.edge + messages * cost.message
    bits_per_s = messages * PACKED_BYTES[program] * 8
    if program == "raw":
        bits_per_s = rate_hz * (16 + 8 / RAW_BATCH)  # partial batches cost their share
    active_s = cycles_per_s * prof.cycles_scale / prof.clock_hz
    if active_s > 1.0:
        raise ValueError(
            f"{program} at {rate_hz:g} Hz needs {cycles_per_s:.0f} cycles/s, more than the "
            f"{prof.clock_hz:.0f} Hz CPU of profile {prof.name!r}"
        )
    account = EnergyAccount(prof)
    account.charge(1.0, cycles=cycles_per_s, adc=0, bits=0, messages=0, listen_s=listen / 1000.0)
    # fractional per-second counts: add them directly rather than through int fields
    account.joules["adc"] += rate_hz * prof.adc_joules
    account.joules["radio"] += (
        bits_per_s + messages * prof.packet_overhead_bits
    ) * prof.tx_joules_per_bit
    power = account.power_mw
    lifetime = account.lifetime_s
    return Prediction(
        program=program,
        rate_hz=float(rate_hz),
        profile=prof.name,
        power_mw=power,
        current_ma=account.current_ma,
        lifetime_s=lifetime,
        lifetime_days=lifetime / SECONDS_PER_DAY,
        breakdown_mw=account.breakdown_mw(),
        cycles_per_s=cycles_per_s,
        messages_per_s=messages,
        bits_per_s=bits_per_s,
        workload=workload,
    )


@dataclass(frozen=True)
class Choice:
    """The proxy's decision; `program` is None when no program meets the lifetime."""

    needs: str
    lifetime_s: float
    program: str | None
    rate_hz: float | None
    prediction: Prediction | None
    reason: str
    candidates: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["prediction"] = self.prediction.to_dict() if self.prediction else None
        return d


def choose(
    needs: str,
    lifetime_s: float,
    profile: str | Profile = "paper",
    rates: Iterable[float] | None = None,
    *,
    min_rate_hz: float | None = None,
    **workload: Any,
) -> Choice:
    """Cheapest program serving `needs`, at the highest rate that still lasts `lifetime_s`."""
    if needs not in NEEDS:
        raise ValueError(f"unknown need {needs!r}; expected one of {sorted(NEEDS)}")
    _check_range("lifetime", lifetime_s, 1e-9, math.inf)
    grid = sorted({float(r) for r in (rates if rates is not None else range(1, 1001))})
    if not grid or grid[0] <= 0:
        raise ValueError("rates must be a non-empty set of positive sample rates")
    floor = MIN_RATE_HZ[needs] if min_rate_hz is None else min_rate_hz
    usable = [r for r in grid if r >= floor]
    if not usable:
        raise ValueError(f"no rate in the grid reaches the {floor:g} Hz that {needs} need")
    rows: list[tuple[Prediction, Prediction | None]] = []
    for program in NEEDS[needs]:
        lasting: Prediction | None = None
        cheapest: Prediction | None = None
        for rate in usable:
            try:
                p = predict(program, rate, profile, **workload)
            except ValueError:
                continue  # e.g. too slow to see the vehicles, or CPU saturated
            cheapest = cheapest or p
            if p.lifetime_s >= lifetime_s:
                lasting = p  # rates ascend: the last one that lasts is the highest
        if cheapest is not None:
            rows.append((cheapest, lasting))
    rows.sort(key=lambda row: row[0].power_mw)
    chosen = next((lasting for _, lasting in rows if lasting is not None), None)
    candidates = [
        {
            "program": cheapest.program,
            "power_mw_at_min_rate": cheapest.power_mw,
            "lifetime_days_at_min_rate": cheapest.lifetime_days,
            "best_rate_hz": lasting.rate_hz if lasting else None,
            "chosen": chosen is not None and lasting is chosen,
        }
        for cheapest, lasting in rows
    ]
    if chosen is None:
        longest = max(candidates, key=lambda c: c["lifetime_days_at_min_rate"], default=None)
        detail = (
            f"; the longest-lived, {longest['program']} at {floor:g} Hz, lasts "
            f"{longest['lifetime_days_at_min_rate']:.2f} days"
            if longest
            else ""
        )
        return Choice(
            needs,
            lifetime_s,
            None,
            None,
            None,
            f"none does: no program serving {needs} lasts "
            f"{lifetime_s / SECONDS_PER_DAY:.2f} days at >= {floor:g} Hz{detail}",
            candidates,
        )
    reason = (
        f"{chosen.program} is the cheapest program serving {needs}; {chosen.rate_hz:g} Hz is "
        f"the highest rate lasting {lifetime_s / SECONDS_PER_DAY:.2f} days "
        f"({chosen.lifetime_days:.2f} days at {chosen.power_mw:.3f} mW)"
    )
    return Choice(needs, lifetime_s, chosen.program, chosen.rate_hz, chosen, reason, candidates)


def _check_range(name: str, value: Any, lo: float, hi: float) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not (math.isfinite(value) or value == math.inf == hi)
        or not lo <= value <= hi
    ):
        raise ValueError(f"{name} must be a number in [{lo:g}, {hi:g}], not {value!r}")


# -- the protocol image ---------------------------------------------------------------------
def whole_fraction(period_ms: float, every: int = 1) -> float:
    """Fraction of the times of samples 0, every, 2*every, ... that are whole seconds (the
    firmware sends those as integers, the rest as float64), the clock starting on one."""
    per_s = Fraction(1000) / Fraction(period_ms).limit_denominator(1_000_000)
    whole_every = per_s.numerator  # sample k is whole iff numerator divides k
    return math.gcd(whole_every, every) / whole_every


def listen_windows(
    period_s: float,
    listen_every_s: float,
    *,
    every: int | None = None,
    phase: int = 0,
    burst_p: float = 0.0,
) -> tuple[float, float]:
    """(receive windows per second, bare listen frames per second) of image.c's rule: a
    window is due `listen_every_s` after the last one and rides on the first data message
    from then on, or goes on a bare listen one more `listen_every_s` later.

    Messages are periodic (sample k sends when k % every == phase) or random (a burst starts
    at a sample with probability burst_p)."""
    n1 = math.ceil(listen_every_s / period_s - 1e-9)
    n2 = math.ceil(2 * listen_every_s / period_s - 1e-9)
    if every is not None:
        # What follows a window depends only on its sample modulo `every`: run to the first
        # repeated residue and take the rates of that cycle (exact, at most `every` steps).
        seen: dict[int, tuple[int, int, int]] = {}
        at = bare = 0
        for i in range(every + 1):
            if at % every in seen:
                i0, at0, bare0 = seen[at % every]
                span = (at - at0) * period_s
                return (i - i0) / span, (bare - bare0) / span
            seen[at % every] = (i, at, bare)
            first = at + n1
            msg = first + (phase - first) % every
            bare += msg > at + n2
            at = min(msg, at + n2)
        raise AssertionError("unreachable: a residue repeats within `every` windows")
    q = min(1.0, max(0.0, burst_p))
    miss = 1.0 - q
    wait = sum(miss**j for j in range(1, n2 - n1 + 1))
    interval = (n1 + wait) * period_s
    return 1.0 / interval, miss ** (n2 - n1 + 1) / interval


def _predict_protocol(
    program: str,
    rate_hz: float,
    prof: Profile,
    cost: ProgramCycles,
    *,
    vps: float,
    listen: float,
    listen_every_ms: float,
    period_ms: float,
    window_ms: float,
    selectivity: float,
    change_fraction: float,
    batch: int,
    burst: float,
    value_bytes: float | None,
    reading_counts: float,
    mote: Mote,
) -> Prediction:
    """`predict` for the protocol image: what image.c sends, listens and computes per second."""
    _check_range("listen_every_ms", listen_every_ms, 1e-9, math.inf)
    _check_range("burst", burst, 1, math.inf)
    _check_range("reading_counts", reading_counts, 0, math.inf)
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= 8:
        raise ValueError(f"batch must be an integer in [1, 8], not {batch!r}")
    sample_ms = 1000.0 / rate_hz
    f = whole_fraction(sample_ms)
    vb = float(wire.uint_bytes(reading_counts)) if value_bytes is None else value_bytes
    window_len_ms = listen * listen_every_ms / 1000.0
    mote = replace(mote, listen_ms=max(1, round(window_len_ms)))
    edges = 0.0
    workload: dict[str, float] = {"listen_ms_per_s": listen, "listen_every_ms": listen_every_ms}
    periodic: tuple[int, int] | None = None  # (every, phase) in samples
    if program == "raw":
        messages, times, whole, readings = rate_hz / batch, batch, f, batch
        frame = wire.samples(mote, batch, f, vb)
        periodic = (batch, batch - 1)
        workload["batch"] = batch
    elif program in ("filter", "deadband"):
        share = selectivity if program == "filter" else change_fraction
        messages, times, whole, readings = rate_hz * share, 1, f, 1
        frame = wire.samples(mote, 1, f, vb)
        workload["selectivity" if program == "filter" else "change_fraction"] = share
        workload["burst"] = burst
    elif program == "aggregate":
        n = max(1, round(window_ms / sample_ms))
        whole = whole_fraction(sample_ms, n)
        messages, times, readings = rate_hz / n, 2, 4
        frame = wire.partial_aggregate(mote, whole, n, vb, wire.uint_bytes(n * reading_counts))
        periodic = (n, 0)
        workload["window_ms"] = window_ms
    else:  # vehicle, count
        if 2 * vps > rate_hz:
            raise ValueError(
                f"{rate_hz:g} Hz is too slow to see {vps:g} vehicles/s "
                f"(each vehicle needs a covered and an uncovered reading)"
            )
        edges = 2 * vps
        workload["vehicles_per_second"] = vps
        if program == "vehicle":
            messages, times, whole, readings = vps, 2, f, 0
            frame = wire.events(mote, "upstream", f)
        else:
            n = max(1, round(period_ms / sample_ms))
            whole = whole_fraction(sample_ms, n)
            messages, times, readings = rate_hz / n, 2, 1
            frame = wire.count_aggregate(mote, whole, vps * n / rate_hz)
            periodic = (n, 0)
            workload["period_ms"] = period_ms
    if window_len_ms <= 0:
        windows = bare = 0.0
    elif periodic is not None:
        windows, bare = listen_windows(
            1 / rate_hz, listen_every_ms / 1000, every=periodic[0], phase=periodic[1]
        )
    else:
        windows, bare = listen_windows(
            1 / rate_hz, listen_every_ms / 1000, burst_p=messages / burst / rate_hz
        )
    bytes_per_s = messages * frame + bare * wire.listen(mote)
    cycles_per_s = (
        rate_hz * cost.sample
        + edges * cost.edge
        + messages
        * (
            cost.message
            + times * (whole * cost.int_time + (1 - whole) * cost.float_time)
            + readings * cost.reading
        )
        + windows * cost.window
        + bare * cost.listen
        + bytes_per_s * cost.byte
    )
    active_s = cycles_per_s * prof.cycles_scale / prof.clock_hz
    if active_s > 1.0:
        raise ValueError(
            f"{program} at {rate_hz:g} Hz needs {cycles_per_s:.0f} cycles/s, more than the "
            f"{prof.clock_hz:.0f} Hz CPU of profile {prof.name!r}"
        )
    account = EnergyAccount(prof)
    account.add_cycles(cycles_per_s)
    account.add_idle(max(0.0, 1.0 - active_s))
    account.joules["adc"] += rate_hz * prof.adc_joules
    account.joules["radio"] += (
        8 * bytes_per_s + (messages + bare) * prof.packet_overhead_bits
    ) * prof.tx_joules_per_bit
    account.add_listen(windows * window_len_ms / 1000.0)
    account.advance(1.0)
    per_message = (
        (
            cost.message
            + times * (whole * cost.int_time + (1 - whole) * cost.float_time)
            + readings * cost.reading
            + frame * cost.byte
        )
        * prof.cycles_scale
        * prof.joules_per_cycle
    )
    per_message += (8 * frame + prof.packet_overhead_bits) * prof.tx_joules_per_bit
    if periodic is not None and bare == 0 and messages > 0:  # each window rides a message
        window_j = window_len_ms * 1e-3 * prof.rx_mw * 1e-3
        window_j += cost.window * prof.cycles_scale * prof.joules_per_cycle
        per_message += windows / messages * window_j
    workload.update(
        windows_per_s=windows,
        bare_listens_per_s=bare,
        frame_bytes=frame,
        message_j=per_message,
    )
    if periodic is not None:
        workload.update(every_samples=periodic[0], phase_samples=periodic[1])
    return Prediction(
        program=program,
        rate_hz=rate_hz,
        profile=prof.name,
        power_mw=account.power_mw,
        current_ma=account.current_ma,
        lifetime_s=account.lifetime_s,
        lifetime_days=account.lifetime_s / SECONDS_PER_DAY,
        breakdown_mw=account.breakdown_mw(),
        cycles_per_s=cycles_per_s,
        messages_per_s=messages,
        bits_per_s=8 * bytes_per_s,
        workload=workload,
    )


def predict_run(
    program: str,
    rate_hz: float,
    seconds: float,
    profile: str | Profile = "paper",
    *,
    mote: Mote | None = None,
    period_ms: int | None = None,
    attributes_bytes: int = 1,
    tail_s: float = 0.0,
    **workload: Any,
) -> float:
    """Joules of a protocol-image mote running `program` for `seconds` from boot: its hello,
    `seconds` of `predict` (with the sequence numbers such a run uses), and a last status
    followed by `tail_s` seconds idle (the supply failing)."""
    prof = resolve_profile(profile)
    base = mote or Mote()
    table = workload.get("cycles") or load_cycle_table("protocol")
    cost = table[PROGRAMS[program].cycles_key]
    workload = {**workload, "wire": "protocol"}
    first = predict(program, rate_hz, prof, mote=base, **workload)
    frames = 2 + seconds * (first.messages_per_s + first.workload["bare_listens_per_s"])
    mote = replace(base, seq_bytes=wire.mean_uint_bytes(0, max(1, round(frames))))
    steady = predict(program, rate_hz, prof, mote=mote, **workload)
    joules = steady.power_mw * 1e-3 * seconds
    w = steady.workload
    if "every_samples" in w:  # periodic: only whole windows (batches, periods) are sent
        n, every, phase = round(seconds * rate_hz), int(w["every_samples"]), w["phase_samples"]
        start = phase if phase else every  # sample 0 closes no window
        sent = max(0, (n - 1 - start) // every + 1) if n > start else 0
        joules += (sent - steady.messages_per_s * seconds) * w["message_j"]
    ends = wire.hello(mote, program, period_ms or round(1000 / rate_hz), attributes_bytes)
    ends += wire.status(mote)
    account = EnergyAccount(prof)
    account.add_cycles(cost.boot + ends * cost.byte)
    account.add_bits_sent(round(8 * ends), 2)
    account.add_idle(tail_s)
    return joules + account.total_j


# -- authentication -------------------------------------------------------------------------
def mac_cost(
    p: Prediction,
    profile: str | Profile = "paper",
    *,
    wire_name: str | None = None,
    controls_per_day: float = 0.0,
    auth: AuthCycles | None = None,
) -> dict[str, Any]:
    """What sealing every message (and verifying `controls_per_day` controls) adds to the mote
    of prediction `p`, at the cost measured on the AVR image (cycles.json `auth`): per message
    its HMAC's compressions and the seal's 19 bytes on the air (CPU, not idle, meanwhile),
    per day, and the lifetime it leaves. Raises ValueError if the CPU cannot keep up."""
    prof = resolve_profile(profile)
    a = auth or load_auth_cycles()
    _check_range("controls_per_day", controls_per_day, 0, math.inf)
    w = p.workload
    if (wire_name or prof.wire) == "protocol":
        # frame_bytes: the data message on the air; less the framing, what the HMAC covers.
        data_bytes = w["frame_bytes"] - wire.FRAMING
        bare = w.get("bare_listens_per_s", 0.0)
        listen_bytes = wire.listen(Mote()) - wire.FRAMING
    else:
        data_bytes, bare, listen_bytes = float(PACKED_BYTES[p.program]), 0.0, 0.0
    per_s = p.messages_per_s + bare
    sealed_bytes = (p.messages_per_s * data_bytes + bare * listen_bytes) / per_s if per_s else 0.0
    cycles = (
        (p.messages_per_s * a.seal(data_bytes) + bare * a.seal(listen_bytes)) / per_s
        if per_s
        else a.seal(data_bytes)
    )

    def joules(c: float, bits: float) -> float:
        active = c * prof.cycles_scale / prof.clock_hz
        return (
            c * prof.cycles_scale * prof.joules_per_cycle
            + bits * prof.tx_joules_per_bit
            - active * prof.cpu_idle_mw * 1e-3
        )

    message_j = joules(cycles, 8 * a.seal_bytes)
    control_cycles = a.verify(a.control_bytes)
    control_j = joules(control_cycles, 0.0)
    extra_cycles_per_s = per_s * cycles + controls_per_day * control_cycles / SECONDS_PER_DAY
    if (p.cycles_per_s + extra_cycles_per_s) * prof.cycles_scale > prof.clock_hz:
        raise ValueError(
            f"{p.program} at {p.rate_hz:g} Hz cannot seal its messages: it needs "
            f"{p.cycles_per_s + extra_cycles_per_s:.0f} cycles/s with authentication, more than "
            f"the {prof.clock_hz:.0f} Hz CPU of profile {prof.name!r} ({per_s:.3g} messages/s "
            f"x {cycles:.0f} cycles each)"
        )
    day_j = per_s * SECONDS_PER_DAY * message_j + controls_per_day * control_j
    power = p.power_mw + day_j / SECONDS_PER_DAY * 1e3
    battery = Battery.of(prof)
    lifetime_s = battery.lifetime_s(power)
    return {
        "sealed_messages_per_s": per_s,
        "sealed_message_bytes": sealed_bytes,
        "hmac_blocks_per_message": wire.hmac_blocks(data_bytes),
        "cycles_per_message": cycles,
        "extra_bytes_per_message": a.seal_bytes,
        "mj_per_message": message_j * 1e3,
        "cycles_per_control": control_cycles,
        "control_bytes": a.control_bytes,
        "mj_per_control": control_j * 1e3,
        "controls_per_day": controls_per_day,
        "mj_per_day": day_j * 1e3,
        "extra_power_mw": power - p.power_mw,
        "power_mw": power,
        "lifetime_days": lifetime_s / SECONDS_PER_DAY,
        "lifetime_change_days": (lifetime_s - p.lifetime_s) / SECONDS_PER_DAY,
        "lifetime_change": lifetime_s / p.lifetime_s - 1.0,
    }
