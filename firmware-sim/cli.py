"""`fjords-power`: mote power consumption by program and sample rate (paper section 5.2)."""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from firmware_sim.energy import COMPONENTS, EnergyAccount
from firmware_sim.model import NEEDS, SECONDS_PER_DAY, Prediction, choose, mac_cost, predict
from firmware_sim.profiles import Profile, list_profiles, load_profile, parse_profile
from firmware_sim.programs import PROGRAMS, make_program
from firmware_sim.traces import vehicle_pair_trace
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

# Section 5.2's figures at 180 Hz: power (mW) and the lifetime it states.
PAPER = {
    "raw": (13.0, "~1.5 d", (1.0, 2.0)),
    "vehicle": (1.1, "~2.5 wk", (14.0, 21.0)),
    "count": (0.38, "-", None),
}
TOLERANCE = 0.15


class UsageError(Exception):
    """Bad command-line input: reported as one line, exit status 2."""


def parse_rates(text: str) -> list[float]:
    """'1:200' (step 1), '1:200:5', or '1,10,180'."""
    try:
        if ":" in text:
            parts = [float(p) for p in text.split(":")]
            if len(parts) not in (2, 3):
                raise ValueError
            start, stop = parts[0], parts[1]
            step = parts[2] if len(parts) == 3 else 1.0
            if step <= 0 or start > stop:
                raise ValueError
            n = math.floor((stop - start) / step + 1e-9) + 1
            rates = [start + i * step for i in range(n)]
        else:
            rates = [float(p) for p in text.split(",")]
    except ValueError:
        raise UsageError(f"bad rates {text!r}: use START:STOP[:STEP] or a comma list") from None
    if not rates or any(not math.isfinite(r) or r <= 0 for r in rates):
        raise UsageError(f"bad rates {text!r}: sample rates must be positive")
    return rates


_UNITS = {
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
    "d": SECONDS_PER_DAY,
    "w": 7 * SECONDS_PER_DAY,
    "y": 365 * SECONDS_PER_DAY,
}


def parse_duration(text: str) -> float:
    """'30d', '2w', '12h', '90m', '3600s' or plain seconds."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([smhdwy]?)\s*", text)
    if not m or float(m.group(1)) <= 0:
        raise UsageError(f"bad lifetime {text!r}: use a positive number with s, m, h, d, w or y")
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


def _program(name: str) -> str:
    if name not in PROGRAMS:
        raise UsageError(f"unknown program {name!r}; expected one of {', '.join(sorted(PROGRAMS))}")
    return name


def _profile(name: str) -> Profile:
    """A bundled profile by name, or a profile file (TOML, as in firmware-sim/profiles/)."""
    if name in list_profiles():
        return load_profile(name)
    path = Path(name).expanduser()
    if not (path.suffix == ".toml" or path.exists() or "/" in name):
        raise UsageError(
            f"unknown profile {name!r}; expected one of {', '.join(list_profiles())} "
            "or a profile file (.toml)"
        )
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"cannot read profile file {name}: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"profile file {name} is not valid TOML: {exc}") from None
    try:
        return parse_profile(data)
    except ValueError as exc:
        raise UsageError(f"profile file {name}: {exc}") from None


def _known_params(program: str, params: dict[str, Any]) -> dict[str, Any]:
    """`params` when `program` has all of them; a typo is an error, not silently ignored."""
    known = PROGRAMS[program].PARAMS
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise UsageError(
            f"unknown --param {', '.join(unknown)} for program {program!r}; "
            + (f"it takes {', '.join(sorted(known))}" if known else "it takes none")
        )
    return params


def _rate(text: str) -> float:
    try:
        rate = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad rate {text!r}") from None
    if not math.isfinite(rate) or rate <= 0:
        raise argparse.ArgumentTypeError(f"sample rate must be positive, not {text!r}")
    return rate


def _params(items: Sequence[str]) -> dict[str, Any]:
    params = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(
                f"bad --param {item!r}: use KEY=JSON, e.g. epsilon=2 or ranges=[[0,5]]"
            )
        try:
            params[key] = json.loads(value)
        except json.JSONDecodeError:
            params[key] = value
    return params


def _workload(args: argparse.Namespace) -> dict[str, Any]:
    w: dict[str, Any] = {}
    if getattr(args, "vehicles_per_second", None) is not None:
        w["vehicles_per_second"] = args.vehicles_per_second
    if getattr(args, "listen_ms", None) is not None:
        w["listen_ms_per_s"] = args.listen_ms
    return w


def _summary(p: Prediction) -> dict[str, Any]:
    d = p.to_dict()
    return {
        "power_mw": d["power_mw"],
        "current_ma": d["current_ma"],
        "lifetime_days": d["lifetime_days"],
        "breakdown_mw": d["breakdown_mw"],
        **d,
    }


def _days(days: float | None) -> str:
    if days is None or math.isinf(days):
        return "forever"
    return f"{days:.2f} d" if days < 14 else f"{days:.1f} d ({days / 7:.1f} wk)"


# -- commands ---------------------------------------------------------------------------
def cmd_simulate(args: argparse.Namespace, out: Console) -> int:
    program, profile = _program(args.program), _profile(args.profile)
    params = _known_params(program, _params(args.param))
    if args.controls_per_day is not None and not args.mac:
        raise UsageError("--controls-per-day needs --mac")
    if args.trace_seconds:
        if args.mac:
            raise UsageError("--mac works on the steady-state model, not with --trace-seconds")
        result = _simulate_trace(program, params, args.rate, profile, args)
    else:
        extra = {k: params[k] for k in ("period_ms", "window_ms") if k in params}
        prediction = predict(program, args.rate, profile, **_workload(args), **extra)
        result = _summary(prediction)
        if args.mac:
            result["mac"] = mac_cost(
                prediction, profile, controls_per_day=args.controls_per_day or 0.0
            )
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    table = Table(
        title=f"{program} at {args.rate:g} Hz, profile {profile.name}"
        + (f" (simulated {args.trace_seconds:g} s)" if args.trace_seconds else "")
    )
    table.add_column("quantity")
    table.add_column("value", justify="right")
    table.add_row("power", f"{result['power_mw']:.4f} mW")
    table.add_row("current", f"{result['current_ma']:.4f} mA")
    table.add_row("lifetime", _days(result["lifetime_days"]))
    for k in COMPONENTS:
        table.add_row(f"  {k}", f"{result['breakdown_mw'][k]:.4f} mW")
    if "mac" in result:
        m = result["mac"]
        table.add_row("with --mac (HMAC-SHA256)", "")
        table.add_row(
            "  per message",
            f"{m['mj_per_message']:.4f} mJ ({m['cycles_per_message']:,.0f} cycles, "
            f"{m['hmac_blocks_per_message']} blocks, +{m['extra_bytes_per_message']} bytes)",
        )
        table.add_row(
            "  per control verified",
            f"{m['mj_per_control']:.4f} mJ ({m['cycles_per_control']:,.0f} cycles)",
        )
        table.add_row("  per day", f"{m['mj_per_day']:.1f} mJ")
        table.add_row("  power", f"{m['power_mw']:.4f} mW (+{m['extra_power_mw']:.4f})")
        table.add_row(
            "  lifetime",
            f"{_days(m['lifetime_days'])} ({m['lifetime_change_days']:+.2f} d, "
            f"{m['lifetime_change']:+.1%})",
        )
    out.print(table)
    return 0


def _simulate_trace(
    program: str, params: dict[str, Any], rate: float, prof: Profile, args: argparse.Namespace
) -> dict[str, Any]:
    """Run the program on a synthetic loop-pair trace, charging every sample exactly."""
    vps = prof.vehicles_per_second if args.vehicles_per_second is None else args.vehicles_per_second
    listen = prof.listen_ms_per_s if args.listen_ms is None else args.listen_ms
    role = params.get("role", "upstream") if program == "vehicle" else "upstream"
    trace = vehicle_pair_trace(
        args.trace_seconds, rate_hz=rate, vehicles_per_second=vps, seed=args.seed
    )
    prog = make_program(program, params)
    account = EnergyAccount(prof)
    period = 1.0 / rate
    records = 0
    for t, value in trace.samples(role):
        records += len(prog.feed(t, value))
        c = prog.last
        account.charge(
            period,
            cycles=c.cycles,
            adc=c.adc,
            bits=c.bits,
            messages=c.messages,
            listen_s=period * listen / 1000.0,
        )
    lifetime = account.lifetime_s
    return {
        "power_mw": account.power_mw,
        "current_ma": account.current_ma,
        "lifetime_days": None if math.isinf(lifetime) else lifetime / SECONDS_PER_DAY,
        "breakdown_mw": account.breakdown_mw(),
        "program": program,
        "rate_hz": rate,
        "profile": prof.name,
        "simulated_seconds": account.elapsed_s,
        "vehicles": len(trace.vehicles),
        "vehicles_per_second_seen": len(trace.vehicles) / args.trace_seconds,
        "records": records,
        "messages": prog.total.messages,
        "bits": prog.total.bits,
        "overrun_s": account.overrun_s,
    }


def paper_rows(profile: str | Profile = "paper") -> list[dict[str, Any]]:
    rows = []
    for program, (paper_mw, paper_life, band) in PAPER.items():
        p = predict(program, 180.0, profile)
        rel = (p.power_mw - paper_mw) / paper_mw
        rows.append(
            {
                "program": program,
                "rate_hz": 180.0,
                "power_mw": p.power_mw,
                "paper_power_mw": paper_mw,
                "relative_difference": rel,
                "within_tolerance": abs(rel) <= TOLERANCE,
                "current_ma": p.current_ma,
                "lifetime_days": p.lifetime_days,
                "paper_lifetime": paper_life,
                "lifetime_in_paper_band": None
                if band is None
                else band[0] <= p.lifetime_days <= band[1],
                "breakdown_mw": p.breakdown_mw,
            }
        )
    return rows


def cmd_paper(args: argparse.Namespace, out: Console) -> int:
    rows = paper_rows(_profile(args.profile))
    ok = all(r["within_tolerance"] for r in rows) and all(
        r["lifetime_in_paper_band"] is not False for r in rows
    )
    if args.json:
        print(json.dumps({"tolerance": TOLERANCE, "ok": ok, "scenarios": rows}, indent=2))
    else:
        table = Table(title="Paper section 5.2 at 180 Hz: ours vs published")
        for col in ("program", "mW", "paper mW", "diff", "mA", "lifetime", "paper", "radio", "cpu"):
            table.add_column(col, justify="left" if col == "program" else "right")
        for r in rows:
            b = r["breakdown_mw"]
            table.add_row(
                r["program"],
                f"{r['power_mw']:.3f}",
                f"{r['paper_power_mw']:.2f}",
                f"{r['relative_difference']:+.1%}",
                f"{r['current_ma']:.3f}",
                _days(r["lifetime_days"]),
                r["paper_lifetime"],
                f"{b['radio']:.3f}",
                f"{b['cpu']:.3f}",
            )
        out.print(table)
        out.print(f"{'all within' if ok else 'NOT all within'} {TOLERANCE:.0%} of the paper")
    return 0 if ok or not args.check else 1


def cmd_sweep(args: argparse.Namespace, out: Console) -> int:
    programs = [_program(p) for p in (args.compare.split(",") if args.compare else [args.program])]
    profile = _profile(args.profile)
    rates = parse_rates(args.rates)
    results: dict[str, list[Prediction]] = {p: [] for p in programs}
    skipped: dict[str, list[str]] = {p: [] for p in programs}
    with Progress(
        console=Console(stderr=True),
        disable=args.json or len(rates) * len(programs) < 200,
        transient=True,
    ) as progress:
        task = progress.add_task("sweeping", total=len(rates) * len(programs))
        for program in programs:
            for rate in rates:
                try:
                    results[program].append(predict(program, rate, profile, **_workload(args)))
                except ValueError as exc:
                    skipped[program].append(f"{rate:g} Hz: {exc}")
                progress.advance(task)
    if not any(results.values()):
        raise UsageError(
            "no rate in the sweep is feasible: "
            + "; ".join([s for why in skipped.values() for s in why][:3])
        )
    if args.plot:
        _plot(results, profile.name, Path(args.plot))
    if args.json:
        print(json.dumps({p: [_summary(x) for x in xs] for p, xs in results.items()}, indent=2))
        return 0
    for program, preds in results.items():
        table = Table(title=f"{program}, profile {profile.name}")
        for col in ("rate Hz", "power mW", *COMPONENTS, "lifetime"):
            table.add_column(col, justify="right")
        step = max(1, len(preds) // 25)
        for p in preds[::step] + ([preds[-1]] if preds and (len(preds) - 1) % step else []):
            table.add_row(
                f"{p.rate_hz:g}",
                f"{p.power_mw:.4f}",
                *(f"{p.breakdown_mw[k]:.4f}" for k in COMPONENTS),
                _days(p.lifetime_days),
            )
        out.print(table)
        if skipped[program]:
            out.print(
                f"[yellow]{program}: skipped {len(skipped[program])} rate(s), e.g. "
                f"{skipped[program][0]}[/yellow]"
            )
    if args.plot:
        out.print(f"wrote {args.plot}")
    return 0


def _plot(results: dict[str, list[Prediction]], profile: str, path: Path) -> None:
    try:
        import matplotlib
    except ImportError as e:  # an optional extra: say what to install, not a traceback
        raise UsageError(
            "--plot needs matplotlib, which is not installed: pip install 'fjords-gateway[plot]'"
        ) from e

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 4), squeeze=False)
    for ax, (program, preds) in zip(axes[0], results.items(), strict=True):
        rates = [p.rate_hz for p in preds]
        ax.stackplot(
            rates,
            *[[p.breakdown_mw[k] for p in preds] for k in COMPONENTS],
            labels=list(COMPONENTS),
        )
        ax.set_title(f"{program} ({profile})")
        ax.set_xlabel("sample rate (Hz)")
        ax.set_ylabel("power (mW)")
        ax.legend(loc="upper left", fontsize="small")
    fig.suptitle("Power consumption by component (cf. paper Figure 11)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def cmd_choose(args: argparse.Namespace, out: Console) -> int:
    lifetime = parse_duration(args.lifetime)
    rates = parse_rates(args.rates) if args.rates else None
    c = choose(
        args.needs,
        lifetime,
        _profile(args.profile),
        rates,
        min_rate_hz=args.min_rate,
        **_workload(args),
    )
    if args.json:
        print(json.dumps(c.to_dict(), indent=2))
    else:
        out.print(c.reason)
        table = Table()
        for col in ("program", "mW at min rate", "days at min rate", "highest rate lasting"):
            table.add_column(col)
        for cand in c.candidates:
            table.add_row(
                cand["program"],
                f"{cand['power_mw_at_min_rate']:.4f}",
                f"{cand['lifetime_days_at_min_rate']:.2f}",
                "-" if cand["best_rate_hz"] is None else f"{cand['best_rate_hz']:g} Hz",
            )
        out.print(table)
    return 0 if c.program else 1


def cmd_profiles(args: argparse.Namespace, out: Console) -> int:
    profiles = [load_profile(n) for n in list_profiles()]
    if args.json:
        print(
            json.dumps([{"name": p.name, "description": p.description} for p in profiles], indent=2)
        )
    else:
        for p in profiles:
            out.print(f"{p.name:8} {p.description}")
    return 0


def cmd_measure(args: argparse.Namespace, out: Console) -> int:
    """Both tables: the protocol image's (cycles.json) and, with --packed, the paper's
    packed-format programs' (cycles-packed.json)."""
    from firmware_sim import measure, measure_packed

    argv = ["--write"] if args.write else []
    code = measure.main(argv)
    if code == 0 and args.packed:
        code = measure_packed.main(argv)
    return code


def cmd_calibrate(args: argparse.Namespace, out: Console) -> int:
    """The cost model against the AVR protocol image's own energy, every program, in simavr."""
    from firmware_sim.calibrate import calibrate
    from firmware_sim.loop import LoopError

    try:
        result = calibrate(args.profile)
    except LoopError as exc:
        print(f"fjords-power calibrate: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    table = Table(title=f"cost model vs firmware in the loop ({result['profile']} profile)")
    for col in ("program", "rate Hz", "predicted J", "measured J", "error"):
        table.add_column(col, justify="left" if col == "program" else "right")
    for r in result["rows"]:
        table.add_row(
            r["program"],
            f"{r['rate_hz']:g}",
            f"{r['predicted_j']:.6f}",
            f"{r['measured_j']:.6f}",
            f"{100 * r['error']:+.2f}%",
        )
    out.print(table)
    out.print(
        f"mean |error| {100 * result['mean_abs_error']:.2f}%, "
        f"worst {100 * result['max_abs_error']:.2f}% over {len(result['rows'])} runs"
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fjords-power", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser, workload: bool = True) -> None:
        p.add_argument(
            "--profile",
            default="paper",
            help=f"one of {', '.join(list_profiles())}, or a profile file (TOML, like "
            "firmware-sim/profiles/paper.toml)",
        )
        p.add_argument("--json", action="store_true", help="machine-readable output")
        if workload:
            p.add_argument(
                "--vehicles-per-second",
                type=float,
                default=None,
                help="traffic for vehicle/count (default: the profile's, 5)",
            )
            p.add_argument(
                "--listen-ms",
                type=float,
                default=None,
                help="receive window per second in ms (default: the profile's)",
            )

    p = sub.add_parser("simulate", help="average power, current, lifetime and breakdown")
    p.add_argument("--program", required=True, help=f"one of {', '.join(sorted(PROGRAMS))}")
    p.add_argument("--rate", required=True, type=_rate, help="sample rate in Hz")
    p.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="program parameter, e.g. --param window_ms=500 (repeatable; one the program does "
        "not take is an error)",
    )
    p.add_argument(
        "--trace-seconds",
        type=float,
        default=0.0,
        help="instead of the steady-state model, run the program on a synthetic trace",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--mac",
        action="store_true",
        help="authenticated messages: add the cost the AVR image measured in simavr (cycles.json "
        "`auth`: HMAC-SHA256 of every message sent, 19 more bytes each) and report it: mJ per "
        "message and per verified control, mJ per day, power and lifetime with it (in --json: "
        "`mac`)",
    )
    p.add_argument(
        "--controls-per-day",
        type=float,
        default=None,
        metavar="N",
        help="with --mac: authenticated controls the mote verifies a day (default 0)",
    )
    common(p)
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("paper", help="the paper's three scenarios at 180 Hz vs its figures")
    p.add_argument(
        "--check",
        action="store_true",
        help=f"exit 1 unless all within {TOLERANCE:.0%}".replace("%", "%%"),
    )
    common(p, workload=False)
    p.set_defaults(func=cmd_paper)

    p = sub.add_parser("sweep", help="power against sample rate (Figure 11)")
    p.add_argument("--program", default="raw")
    p.add_argument("--rates", default="1:200", help="START:STOP[:STEP] or a comma list")
    p.add_argument("--compare", help="comma-separated programs to show side by side")
    p.add_argument("--plot", help="write a PNG of the stacked components")
    common(p)
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("choose", help="cheapest program and highest rate meeting a lifetime")
    p.add_argument("--needs", required=True, choices=sorted(NEEDS))
    p.add_argument("--lifetime", required=True, help="e.g. 30d, 2w, 12h")
    p.add_argument("--rates", help="candidate rates (default 1:1000)")
    p.add_argument(
        "--min-rate", type=float, default=None, help="override the need's slowest useful rate"
    )
    common(p)
    p.set_defaults(func=cmd_choose)

    p = sub.add_parser("profiles", help="list the hardware profiles")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_profiles)

    p = sub.add_parser(
        "measure", help="rebuild the protocol image and re-measure its cycles in simavr"
    )
    p.add_argument("--write", action="store_true", help="update the packaged cycles.json")
    p.add_argument(
        "--packed",
        action="store_true",
        help="also the paper's packed-format programs (cycles-packed.json)",
    )
    p.set_defaults(func=cmd_measure)

    p = sub.add_parser(
        "calibrate",
        help="the cost model's energy against the firmware's own, every program, in simavr",
    )
    p.add_argument("--profile", default="paper", help=f"one of {', '.join(list_profiles())}")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_calibrate)
    return parser


def _version() -> str:
    from fjords import version

    return version()


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    out = Console()
    try:
        return args.func(args, out)
    except (UsageError, ValueError) as exc:
        print(f"fjords-power {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
