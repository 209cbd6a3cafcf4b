"""The paper's two Fjord experiments (Figures 8 and 9), measured side by side in one run.

1. Combining queries (Figure 8): n filter queries over one sensor's trace, in ONE shared Fjord
   (one tuple per sample, filters through the predicate index) versus one Fjord PER query (each
   allocates its own copy of every tuple and runs its own router and sink).
2. Scaling (Figure 9): tuples/s and result deliveries/s for n range-filter queries over one stream,
   at selectivity 0% and 1%, for the shared Fjord, the same filters in streamz and in reactivex
   (the stream libraries a Python user would pick), and a naive loop calling every predicate.

  python -m benchmarks.fjord_sharing [--quick] [--no-record]

The trace is generated in the shape of the paper's ({time, lane, station, speed, flow}, 30-second
windows, 10,767 records from one sensor). Ratios are computed within this one run, since these
machines are shared and noisy.
"""

from __future__ import annotations

import argparse
import gc
import random
import time
from collections.abc import Callable

from rich.progress import Progress

from benchmarks.common import OUT, console, drawn, markdown, record, table
from fjords.compile.sql import ast
from fjords.engine import Engine
from fjords.limits import Limits
from fjords.runtime.fjord import Fjord
from fjords.schema import Schema

SCHEMA = Schema(
    [("time", "int"), ("lane", "int"), ("station", "str"), ("speed", "float"), ("flow", "int")]
)
RECORDS = 10_767

# The experiments install up to 10,000 queries (the daemon's default allows 1,000).
NO_QUERY_LIMIT = Limits(max_queries=100_000)


def paper_trace(n: int = RECORDS, seed: int = 1) -> list[tuple]:
    """Raw records (as read from the file buffer) of one station, 30 s apart, June 2000."""
    rng = random.Random(seed)
    start = 959_817_600  # 2000-06-01 UTC
    return [
        (
            start + 30 * i,
            rng.randint(1, 4),
            "400123",
            round(rng.uniform(0, 100), 2),
            rng.randint(0, 40),
        )
        for i in range(n)
    ]


def range_query(lo: float, hi: float) -> ast.Query:
    speed = ast.Column(None, "speed")
    return ast.Query(
        select=(ast.Star(),),
        sources=(ast.TableRef("traffic"),),
        where=ast.And(
            (ast.Compare(">=", speed, ast.Literal(lo)), ast.Compare("<", speed, ast.Literal(hi)))
        ),
    )


def ranges(n: int, selectivity: float, seed: int = 2) -> list[tuple[float, float]]:
    rng = random.Random(seed)
    if selectivity == 0:
        return [(200.0 + i, 200.5 + i) for i in range(n)]  # beyond every speed: match nothing
    width = 100 * selectivity
    return [(lo := rng.uniform(0, 100 - width), lo + width) for _ in range(n)]


# -- engines: each returns (seconds, deliveries) ---------------------------------------------------


def shared_fjord(raw: list[tuple], bounds: list[tuple[float, float]]) -> tuple[float, int]:
    f = Engine(Fjord(limits=NO_QUERY_LIMIT))
    f.fjord.add_stream("traffic", SCHEMA)
    counts = [0]

    def count(rows: list[tuple]) -> None:
        counts[0] += len(rows)

    for lo, hi in bounds:
        f.add_query(range_query(lo, hi)).sink.add_batch_callback(count)
    push = f.fjord.streams["traffic"].queue.put
    run = f.fjord.run_until_idle
    t0 = time.perf_counter()
    for i, r in enumerate(raw):
        push(tuple(r))  # the proxy allocates one tuple per sample
        if i % 4096 == 4095:
            run()
    run()
    return time.perf_counter() - t0, counts[0]


def fjord_per_query(raw: list[tuple], bounds: list[tuple[float, float]]) -> tuple[float, int]:
    fjords = []
    counts = [0]

    def count(rows: list[tuple]) -> None:
        counts[0] += len(rows)

    for lo, hi in bounds:
        f = Engine(Fjord(limits=NO_QUERY_LIMIT))
        f.fjord.add_stream("traffic", SCHEMA)
        f.add_query(range_query(lo, hi)).sink.add_batch_callback(count)
        fjords.append((f.fjord.streams["traffic"].queue.put, f.fjord.run_until_idle))
    t0 = time.perf_counter()
    for i, r in enumerate(raw):
        for push, _ in fjords:
            push(tuple(r))  # every Fjord lays out its own copy of the sample
        if i % 4096 == 4095:
            for _, run in fjords:
                run()
    for _, run in fjords:
        run()
    return time.perf_counter() - t0, counts[0]


def _preds(bounds: list[tuple[float, float]]) -> list[Callable[[tuple], bool]]:
    return [lambda t, lo=lo, hi=hi: lo <= t[3] < hi for lo, hi in bounds]


def naive_loop(raw: list[tuple], bounds: list[tuple[float, float]]) -> tuple[float, int]:
    preds = _preds(bounds)
    out: list[tuple] = []
    deliver = out.append
    n = 0
    t0 = time.perf_counter()
    for r in raw:
        t = tuple(r)
        for p in preds:
            if p(t):
                deliver(t)
        if len(out) > 100_000:
            n += len(out)
            out.clear()
    return time.perf_counter() - t0, n + len(out)


def streamz_engine(raw: list[tuple], bounds: list[tuple[float, float]]) -> tuple[float, int]:
    from streamz import Stream

    source = Stream()
    counts = [0]

    def count(_: tuple) -> None:
        counts[0] += 1

    for p in _preds(bounds):
        source.filter(p).sink(count)
    t0 = time.perf_counter()
    for r in raw:
        source.emit(tuple(r))
    return time.perf_counter() - t0, counts[0]


def reactivex_engine(raw: list[tuple], bounds: list[tuple[float, float]]) -> tuple[float, int]:
    from reactivex import operators as ops
    from reactivex.subject import Subject

    subject: Subject = Subject()
    counts = [0]

    def count(_: tuple) -> None:
        counts[0] += 1

    for p in _preds(bounds):
        subject.pipe(ops.filter(p)).subscribe(on_next=count)
    t0 = time.perf_counter()
    for r in raw:
        subject.on_next(tuple(r))
    return time.perf_counter() - t0, counts[0]


def _tuples_for(n: int, budget: int) -> int:
    """Fewer tuples for many queries, so every engine finishes in seconds (rates stay comparable)."""
    return max(3000, min(RECORDS, budget // max(n, 1)))


def experiment_combining(raw: list[tuple], ns: list[int], progress: Progress) -> list[list[object]]:
    rows = []
    task = progress.add_task("Figure 8: shared vs one Fjord per query", total=len(ns))
    for n in ns:
        bounds = ranges(n, 0.1, seed=n)  # range filters passing 10% of the tuples each
        gc.collect()
        shared, d1 = shared_fjord(raw, bounds)
        gc.collect()
        separate, d2 = fjord_per_query(raw, bounds)
        assert d1 == d2, (d1, d2)
        rows.append(
            [n, shared, separate, shared / n * 1000, separate / n * 1000, separate / shared]
        )
        progress.advance(task)
    return rows


def experiment_scaling(
    raw: list[tuple], ns: list[int], budget: int, progress: Progress
) -> list[list[object]]:
    engines = {
        "shared Fjord": shared_fjord,
        "streamz": streamz_engine,
        "reactivex": reactivex_engine,
        "naive loop": naive_loop,
    }
    rows = []
    task = progress.add_task("Figure 9: scaling to many queries", total=2 * len(ns) * len(engines))
    for sel in (0.0, 0.01):
        for n in ns:
            bounds = ranges(n, sel)
            k = _tuples_for(n, budget)
            data = raw[:k]
            result: dict[str, tuple[float, int]] = {}
            for name, fn in engines.items():
                gc.collect()
                result[name] = fn(data, bounds)
                progress.advance(task)
            deliveries = {v[1] for v in result.values()}
            assert len(deliveries) == 1, result  # every engine found the same matches
            fj = result["shared Fjord"][0]
            rows.append(
                [
                    f"{sel:.0%}",
                    n,
                    k,
                    k / fj,
                    result["shared Fjord"][1] / fj,
                    result["streamz"][0] / fj,
                    result["reactivex"][0] / fj,
                    result["naive loop"][0] / fj,
                ]
            )
    return rows


def plot(comb: list[list[object]], scal: list[list[object]]) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    OUT.mkdir(exist_ok=True)
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    ns = [r[0] for r in comb]
    a.plot(ns, [r[1] for r in comb], "o-", label="single shared Fjord")
    a.plot(ns, [r[2] for r in comb], "s-", label="one Fjord per query")
    a.set_xlabel("queries")
    a.set_ylabel("total time (s)")
    a.set_title("Combining queries (paper Fig. 8a)")
    a.legend()
    for sel in ("0%", "1%"):
        rs = [r for r in scal if r[0] == sel]
        b.plot(
            [r[1] for r in rs], [r[3] for r in rs], "o-", label=f"shared Fjord, selectivity {sel}"
        )
        b.plot(
            [r[1] for r in rs],
            [r[3] / r[7] for r in rs],
            "x--",
            label=f"naive loop, selectivity {sel}",
        )
    b.set_xscale("log")
    b.set_yscale("log")
    b.set_xlabel("queries")
    b.set_ylabel("tuples / s")
    b.set_title("Scaling to many queries (paper Fig. 9a)")
    b.legend(fontsize=8)
    fig.tight_layout()
    path = OUT / "fjord_sharing.png"
    fig.savefig(path, dpi=110)
    return str(path)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="fewer points and tuples (a smoke run)")
    p.add_argument("--no-record", action="store_true", help="do not write benchmarks/RESULTS.md")
    args = p.parse_args(argv)
    raw = paper_trace()
    comb_ns = [1, 2, 5, 10, 20] if args.quick else [1, 2, 5, 10, 20, 50, 100]
    scal_ns = [1, 10, 100, 1000] if args.quick else [1, 10, 100, 1000, 10_000]
    budget = 300_000 if args.quick else 3_000_000
    with Progress(console=console, transient=True) as progress:
        comb = experiment_combining(raw if not args.quick else raw[:3000], comb_ns, progress)
        scal = experiment_scaling(raw, scal_ns, budget, progress)
    c_cols = [
        "queries",
        "shared total s",
        "per-query Fjords total s",
        "shared ms/query",
        "per-query ms/query",
        "per-query / shared",
    ]
    s_cols = [
        "selectivity",
        "queries",
        "tuples",
        "Fjord tuples/s",
        "Fjord deliveries/s",
        "streamz / Fjord",
        "reactivex / Fjord",
        "naive / Fjord",
    ]
    console.print(table("Figure 8: one shared Fjord vs one Fjord per query", c_cols, comb))
    console.print(
        table("Figure 9: scaling (time ratios: >1 means the Fjord is faster)", s_cols, scal)
    )
    zero = {r[1]: r for r in scal if r[0] == "0%"}
    goals = []
    if 1 in zero and 10_000 in zero:
        ratio = zero[1][3] / zero[10_000][3]
        goals.append(
            f"- per-tuple cost at n = 10,000 (no match) vs n = 1: {ratio:.2f}x (goal: within 3x)"
        )
    at100 = [r for r in comb if r[0] == 100]
    if at100:
        goals.append(
            f"- n = 100: shared Fjord {at100[0][5]:.1f}x faster than one Fjord per query (goal: 20x)"
        )
    best = max(r[4] for r in scal)
    goals.append(f"- best result deliveries/s on one core: {best:,.0f} (goal: 1,000,000)")
    for g in goals:
        console.print(g)
    png = plot(comb, scal)
    if png:
        console.print(f"plot: {png}")
    if not args.no_record:
        body = (
            "`python -m benchmarks.fjord_sharing`. Generated trace shaped like the paper's "
            f"({RECORDS:,} records, one station, 30 s windows). "
            + drawn("Plot", "fjord_sharing.png")
            + "\n\n"
            "### Figure 8: combining queries (range filters passing 10% each)\n\n"
            + markdown(c_cols, comb)
            + "\n\n### Figure 9: scaling (range filters; ratios are engine time / Fjord time)\n\n"
            + markdown(s_cols, scal)
            + "\n\n### Against the goals\n\n"
            + "\n".join(goals)
        )
        record("fjord_sharing", body)


if __name__ == "__main__":
    main()
