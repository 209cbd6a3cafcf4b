"""A query is a unit of failure: an exception in one query's operators, its filter or its sink
stops that query alone (marked failed with the reason); other queries and the stream go on."""

from __future__ import annotations

import functools
from dataclasses import replace

from fjords.engine import Engine, PreparedQuery
from fjords.limits import Limits
from fjords.runtime.fjord import Fjord
from fjords.runtime.operators.base import Operator
from fjords.runtime.scheduler import RoundRobinScheduler
from tests.fjords.test_fjord import make_trace, new_engine

GOOD = "SELECT station, speed FROM traffic WHERE speed > 10"
GOOD_AGG = "SELECT segment, COUNT(*) AS n FROM traffic [RANGE 5 MINUTES] GROUP BY segment"


def _boom(*args: object) -> None:
    raise OverflowError("int too large to convert to float")


def _broken(f: Engine, sql: str, qid: str, part: str) -> PreparedQuery:
    """A planned query with one part replaced by code that raises. Typing and the limits keep
    SQL from doing this; the point is what happens if anything raises anyway."""
    prep = f.prepare(sql, query_id=qid)
    plan = prep.plan
    if part == "project":
        plan.operators[0]._fn = _boom  # type: ignore[attr-defined]
    elif part == "filter":
        routes = (replace(plan.routes[0], residual=_boom), *plan.routes[1:])
        prep.plan = replace(plan, routes=routes)
    else:
        assert plan.window is not None
        spec = replace(plan.window.spec, arg_fns=(_boom,))
        prep.plan = replace(plan, window=replace(plan.window, spec=spec))
    return prep


def _run(
    f: Engine, queries: dict[str, str | PreparedQuery]
) -> tuple[dict[str, list], list[tuple[str, str]]]:
    outs: dict[str, list] = {}
    failed: list[tuple[str, str]] = []
    f.fjord.on_query_failed.append(lambda qid, reason: failed.append((qid, reason)))
    for qid, sql in queries.items():
        outs[qid] = []
        f.add_query(sql, query_id=qid).sink.add_batch_callback(outs[qid].extend)
    for i, t in enumerate(make_trace()):
        f.fjord.push("traffic", t)
        if i % 200 == 0:
            f.fjord.run_until_idle()
    f.fjord.end_of_stream()
    f.fjord.run_until_idle()
    return outs, failed


def _expected(queries: dict[str, str]) -> dict[str, list]:
    outs, failed = _run(new_engine(), queries)
    assert not failed
    return outs


def test_a_raising_projection_fails_only_its_query() -> None:
    f = new_engine()
    good = {"good": GOOD, "agg": GOOD_AGG}
    bad = _broken(f, "SELECT speed * 2 AS x FROM traffic", "bad", "project")
    outs, failed = _run(f, {**good, "bad": bad})
    assert [q for q, _ in failed] == ["bad"]
    assert "OverflowError" in failed[0][1] and "project" in failed[0][1]
    assert f.fjord.failed["bad"].state == "failed" and f.fjord.failed["bad"].error == failed[0][1]
    assert "bad" not in f.fjord.queries and f.fjord.queries["good"].state == "running"
    assert f.fjord.stats()["query_failures"] == 1
    expected = _expected(good)
    assert outs["good"] == expected["good"] and outs["agg"] == expected["agg"]
    # Its operators are gone from the scheduler and its filter from the router.
    # (A fused query's operators run inside the router's transition: never scheduled.)
    assert all(
        op in f.fjord.scheduler.operators
        for q in f.fjord.queries.values()
        if not q.fused
        for op in q.operators
    )
    assert not any(op in f.fjord.scheduler.operators for op in f.fjord.failed["bad"].operators)
    assert "bad" not in f.fjord.streams["traffic"].router.index


def test_a_raising_filter_fails_only_its_query_and_the_tuple_reaches_the_others() -> None:
    f = new_engine()
    bad = _broken(f, "SELECT * FROM traffic WHERE speed * 2 > 1 AND speed > 0", "bad", "filter")
    outs, failed = _run(f, {"good": GOOD, "bad": bad})
    assert [q for q, _ in failed] == ["bad"] and failed[0][1].startswith("filter: OverflowError")
    assert outs["good"] == _expected({"good": GOOD})["good"]
    assert "bad" not in f.fjord.streams["traffic"].router.index


def test_a_shared_aggregate_that_raises_fails_the_queries_using_it_only() -> None:
    bad = "SELECT segment, SUM(speed * 2) AS s FROM traffic [RANGE 5 MINUTES] GROUP BY segment"
    bad2 = bad.replace("AS s", "AS total")  # same aggregate: shares it
    f = new_engine()
    bad1 = _broken(f, bad, "bad1", "aggregate")
    outs, failed = _run(f, {"good": GOOD_AGG, "bad1": bad1, "bad2": bad2})
    assert sorted(q for q, _ in failed) == ["bad1", "bad2"]
    assert all("window_aggregate" in reason for _, reason in failed)
    assert outs["good"] == _expected({"good": GOOD_AGG})["good"]
    assert not f.fjord._shared or all(s.users == {"good"} for s in f.fjord._shared.values())


def test_a_sink_callback_that_raises_fails_its_query() -> None:
    f = new_engine()

    def boom(rows: list) -> None:
        raise RuntimeError("client went away badly")

    f.add_query(GOOD, query_id="bad").sink.add_batch_callback(boom)
    outs, failed = _run(f, {"good": GOOD})
    assert failed == [("bad", "sink: RuntimeError: client went away badly")]
    assert outs["good"] == _expected({"good": GOOD})["good"]


def test_groups_over_the_limit_fail_the_query_at_run_time() -> None:
    f = new_engine(limits=Limits(max_groups_per_window=3))
    by_station = "SELECT station, COUNT(*) AS n FROM traffic [RANGE 5 MINUTES] GROUP BY station"
    _outs, failed = _run(f, {"good": GOOD_AGG, "many": by_station})  # 4 segments is over 3 too
    assert sorted(q for q, _ in failed) == ["good", "many"]
    assert all("max_groups_per_window" in reason for _, reason in failed)


def test_state_over_the_limit_fails_the_query_at_run_time() -> None:
    f = new_engine(limits=Limits(max_state_bytes_per_query=2000))
    q = "SELECT station, COUNT(*) AS n FROM traffic [RANGE 1 HOUR] GROUP BY station"
    outs, failed = _run(f, {"big": q, "good": GOOD})
    assert [qid for qid, _ in failed] == ["big"] and "max_state_bytes_per_query" in failed[0][1]
    assert outs["good"]


def test_a_failed_query_can_be_removed_and_its_id_reused() -> None:
    f = new_engine()
    _run(f, {"bad": _broken(f, "SELECT speed * 2 AS x FROM traffic", "bad", "project")})
    assert "bad" in f.fjord.failed
    f.fjord.remove_query("bad")
    assert "bad" not in f.fjord.failed
    f.add_query(GOOD, query_id="bad")


class _Boom(Operator):
    def __init__(self, q) -> None:
        super().__init__([q], [])

    def transition(self) -> bool:
        self.inputs[0].get_batch(10)
        raise ValueError("boom")


def test_without_a_handler_the_scheduler_still_raises() -> None:
    import pytest

    from fjords.runtime.queues import PushQueue

    s = RoundRobinScheduler()
    q = PushQueue(10)
    s.add(_Boom(q))
    q.put(1)
    with pytest.raises(ValueError, match="boom"):
        s.run_until_idle()
    s = RoundRobinScheduler()
    s.on_error = lambda op, exc: s.remove(op)
    s.add(_Boom(q))
    q.put(1)
    assert s.run_until_idle() == 1 and s.errors == 1 and not s.operators


def test_the_file_cli_ends_with_the_error_of_a_failed_query(tmp_path, capsys, monkeypatch) -> None:
    from fjords.__main__ import main

    monkeypatch.setattr(
        "fjords.__main__.Fjord", functools.partial(Fjord, limits=Limits(max_groups_per_window=2))
    )
    trace = tmp_path / "t.csv"
    trace.write_text("time,station,speed\n" + "".join(f"{i},s{i % 3},{i}.5\n" for i in range(50)))
    code = main(
        [
            "--readings",
            str(trace),
            "--query",
            "SELECT station FROM traffic WHERE speed > 1",
            "--query",
            "SELECT station, COUNT(*) AS n FROM traffic [RANGE 1 HOURS] GROUP BY station",
        ]
    )
    captured = capsys.readouterr()
    assert code == 2 and "query 1 failed: " in captured.err
    assert "max_groups_per_window" in captured.err


def test_large_group_keys_count_against_the_state_limit() -> None:
    """The same groups fit with small keys and do not with big-number keys."""
    queries = {
        "small": "SELECT COUNT(*) AS n FROM traffic [RANGE 1 HOUR] GROUP BY time",
        "big": f"SELECT COUNT(*) AS n FROM traffic [RANGE 1 HOUR] GROUP BY time, '{'x' * 2000}'",
    }
    f = new_engine(limits=Limits(max_state_bytes_per_query=22_000))
    outs, failed = _run(f, queries)
    assert [qid for qid, _ in failed] == ["big"] and "max_state_bytes_per_query" in failed[0][1]
    assert outs["small"]


def test_a_router_error_outside_routing_drops_its_batch_and_the_stream_goes_on(caplog) -> None:
    f = new_engine()
    out: list = []
    f.add_query(GOOD, query_id="good").sink.add_batch_callback(out.extend)
    router = f.fjord.streams["traffic"].router
    real = router.transition
    calls = []

    def once() -> bool:
        if not calls:
            calls.append(1)
            router.inputs[0].get_batch(router.batch)
            raise RuntimeError("progress bug")
        return real()

    router.transition = once  # type: ignore[method-assign]
    f.fjord.push("traffic", (2_000_000, "st1", 50.0, "S1"))
    f.fjord.run_until_idle()
    f.fjord.push("traffic", (2_000_060, "st1", 50.0, "S1"))
    f.fjord.run_until_idle()
    assert f.fjord.stats()["operator_errors"] == 1 and "router:traffic" in caplog.text
    assert out == [("st1", 50.0)] and f.fjord.queries["good"].state == "running"


def test_a_failed_query_keeps_its_listing_not_its_windows() -> None:
    f = new_engine(limits=Limits(max_groups_per_window=3))
    q = "SELECT station, COUNT(*) AS n FROM traffic [RANGE 1 HOUR] GROUP BY station"
    f.add_query(q, query_id="many")
    agg = f.fjord._shared[next(iter(f.fjord._shared))].aggregate
    _run(f, {})
    assert "many" in f.fjord.failed and not agg._panes and agg._bytes == 0
