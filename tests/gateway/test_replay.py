"""`fjords-gateway replay`: METR-LA through motes, proxies and the Fjord answers like pandas."""

from __future__ import annotations

import asyncio
import io
import json

import pandas as pd
import pytest

from gateway.cli import main
from gateway.replay import replay_trace
from tests.fjords.test_cli_metr_la import Q1, Q2, _tumbling
from tests.fjords.test_sample_every import first_days
from tests.support import shared_file


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> dict:
    # every station's first 3 days: all of the incidents sample's incidents fall in them
    readings = first_days(tmp_path_factory.mktemp("metr-la"), 3)
    stations = shared_file("data/metr-la/stations.csv")
    incidents = shared_file("data/metr-la/incidents-sample.csv")
    out = io.StringIO()
    result = asyncio.run(
        replay_trace(
            str(readings),
            [Q1, Q2],
            stations=str(stations),
            tables=[("incidents", str(incidents))],
            out=out,
        )
    )
    rows = [json.loads(line) for line in out.getvalue().splitlines()]
    df = pd.read_csv(readings, dtype={"station": str}).merge(
        pd.read_csv(stations, dtype={"station": str}), on="station"
    )
    return {
        "rows": rows,
        "df": df,
        "incidents": pd.read_csv(incidents, dtype={"incidents_id": str}),
        "result": result,
    }


def _query(rows: list[dict], i: int) -> pd.DataFrame:
    return pd.DataFrame(
        [{k: v for k, v in r.items() if k != "query"} for r in rows if r["query"] == i]
    )


def test_query1_through_the_real_path_equals_pandas(replayed: dict) -> None:
    df = replayed["df"]
    d = _tumbling(df[df.segment.isin(["S05", "S14"])], 900)
    want = (
        d.groupby(["segment", "window_start", "window_end"])
        .agg(avg=("speed", "mean"), n=("speed", "size"))
        .reset_index()
    )
    got = _query(replayed["rows"], 0)
    assert len(got) == len(want)
    m = want.merge(got, on=["segment", "window_start", "window_end"], how="outer", indicator=True)
    assert (m._merge == "both").all()
    assert (m.avg - m.avg_speed).abs().max() < 1e-6


def test_query2_through_the_real_path_equals_pandas(replayed: dict) -> None:
    df, inc = replayed["df"], replayed["incidents"]
    seg = (
        _tumbling(df, 1800)
        .groupby(["segment", "window_start", "window_end"])
        .speed.mean()
        .reset_index()
    )
    j = seg.merge(inc, on="segment")
    j = j[(j.time >= j.window_end - 1800) & (j.time < j.window_end) & (j.speed < 40)]
    got = _query(replayed["rows"], 1)
    assert len(got) == len(j) > 0
    m = j.merge(got, on=["incident_id", "description", "segment", "window_start", "window_end"])
    assert len(m) == len(j) and (m.speed - m.avg_speed).abs().max() < 1e-6


def test_every_sample_arrived_once(replayed: dict) -> None:
    fjord = replayed["result"].fjord
    stats = fjord.stats()["streams"]["traffic"]
    assert stats["late"] == 0 and stats["queue_drops"] == 0
    assert replayed["result"].proxies.stats.outbox_drops == 0


async def test_filter_programs_reach_the_motes_over_the_stock_transport(tmp_path) -> None:
    readings = tmp_path / "r.csv"
    stations = tmp_path / "s.csv"
    readings.write_text(
        "time,station,speed\n"
        + "".join(
            f"{1_330_588_800 + 300 * k},{s},{(k * 7 + i * 13) % 80}\n"
            for k in range(200)
            for i, s in enumerate(("a", "b"))
        )
    )
    stations.write_text(
        "station,latitude,longitude,segment\na,34.0,-118.0,S01\nb,34.1,-118.1,S02\n"
    )
    out = io.StringIO()
    qs = [
        "SELECT station, speed FROM traffic WHERE speed < 20",
        "SELECT station, speed FROM traffic WHERE speed > 70",
    ]
    result = await replay_trace(str(readings), qs, stations=str(stations), out=out)
    assert {m.program_name for m in result.fleet.motes.values()} == {"filter"}
    rows = [json.loads(x) for x in out.getvalue().splitlines()]
    want = sum(1 for k in range(200) for i in range(2) if not 20 <= (k * 7 + i * 13) % 80 <= 70)
    assert len(rows) == want  # readings before the switch came raw, after it filtered: none lost


def test_replay_cli_errors(tmp_path, capsys) -> None:
    assert (
        main(
            [
                "replay",
                "--readings",
                str(tmp_path / "no.csv"),
                "--stations",
                str(tmp_path / "no.csv"),
                "--query",
                "SELECT * FROM traffic",
            ]
        )
        == 2
    )
    assert "replay" in capsys.readouterr().err


async def test_explain_says_which_sensors_would_change_and_what_it_costs(tmp_path) -> None:
    from gateway.config import Config
    from gateway.daemon import Gateway
    from proxies.manager import ProxyManager
    from sensors.motes.mote import SimulatedMote
    from sensors.transports.inprocess import InProcessHub

    async with Gateway(Config()) as gw:
        hub = InProcessHub()
        async with hub, ProxyManager(gw.fjord, [hub]) as proxies:
            gw.attach_proxies(proxies)
            motes = [
                SimulatedMote(
                    f"m{i}",
                    hub.link(f"m{i}"),
                    field="speed",
                    period_s=1.0,
                    attributes={"station": f"m{i}", "segment": "S01" if i else "S02"},
                )
                for i in range(2)
            ]
            for m in motes:
                await m.link.send(m.hello())
            await proxies.settle()
            assert {s["program"] for s in gw.sensors()} == {"raw"}
            before = [s["wanted"]["program"] for s in gw.sensors()]
            plan = gw.explain(
                "SELECT segment, AVG(speed) FROM traffic [RANGE 5 MINUTES] WHERE segment = 'S01' "
                "GROUP BY segment"
            )
            assert plan["shape"] == "windowed aggregate"
            changes = {c["sensor"]: c for c in plan["sensor_changes"]}
            assert set(changes) <= {"m0", "m1"} and "m1" in changes  # m1 is in S01
            c = changes["m1"]  # asleep with no query; the new one wakes it, at a predicted cost
            assert c["before"]["program"] == "sleep" and c["after"]["program"] == "aggregate"
            assert c["after"]["power_mw"] > c["before"]["power_mw"] > 0
            assert c["after"]["battery_days"] < c["before"]["battery_days"]
            assert (
                gw.fjord.queries == {} and [s["wanted"]["program"] for s in gw.sensors()] == before
            )
