"""`"engine": "spark"` on a snapshot: the archive's part aggregated per sensor key by a Spark
batch job gives the same answer as the archive read here (exact counts, float sums within
1e-9 relative), across the history's `complete_from` (B), with null readings, pending rows
and an earlier run's segment; a query that needs every reading is refused before any job."""

from __future__ import annotations

import json
import math

import aiohttp
import pytest

from fjords.errors import QueryError
from gateway.archive import write_segment
from gateway.daemon import TRAFFIC_SCHEMA, Gateway
from tests.gateway.test_archive_snapshot import GROUPED, config, feed, fleet, reading, written
from tests.gateway.test_openapi import call


def same(a: dict, b: dict) -> None:
    """The same answer: rows equal, floats within 1e-9 relative."""
    assert a["columns"] == b["columns"] and a["complete"] == b["complete"], (a, b)
    assert a["sources"] == b["sources"] and a["from"] == b["from"] and a["to"] == b["to"]
    assert len(a["rows"]) == len(b["rows"]), (a["rows"], b["rows"])
    key = lambda r: tuple(str(v) for k, v in sorted(r.items()) if isinstance(v, str))  # noqa: E731
    for x, y in zip(sorted(a["rows"], key=key), sorted(b["rows"], key=key), strict=True):
        assert x.keys() == y.keys()
        for k, v in x.items():
            if isinstance(v, float) and isinstance(y[k], float):
                assert math.isclose(v, y[k], rel_tol=1e-9, abs_tol=1e-12), (k, x, y)
            else:
                assert v == y[k], (k, x, y)


async def test_the_archive_part_on_spark_is_the_same_answer(spark, tmp_path) -> None:
    earlier = [reading(3000.0 + i, i, speed=0.1 * i) for i in range(6)]  # an earlier run's, recent
    write_segment(tmp_path / "traffic", 0, TRAFFIC_SCHEMA, earlier)
    data = fleet()
    for i in range(0, len(data), 7):  # null readings, in the archive and the history
        t, st, _, *rest = data[i]
        data[i] = (t, st, None, *rest)
    cfg = config(tmp_path)
    cfg.http.port = 0
    async with Gateway(cfg) as gw:
        feed(gw, data)
        await written(gw)
        late = [reading(5.5, 1, speed=1000.25), (17.0, "st2", None, 34.0, -118.0, "S1")]
        for t in late:
            gw.fjord.push("traffic", t)  # no await: still pending in the writer
        gw.fjord.run_until_idle()
        assert gw.archives["traffic"].stats()["rows_pending"] == 2
        b = gw.histories["traffic"].complete_from
        assert b > 0
        lo, hi = b - 30, b + 30
        queries = [
            GROUPED.format(where=""),
            GROUPED.format(where=f"WHERE time >= {lo} AND time < {hi}"),
            GROUPED.format(where="WHERE time >= 100 AND time < 1000"),  # older than B only
            GROUPED.format(where=f"WHERE time >= {b}"),  # the history only (and the earlier run)
            "SELECT segment, COUNT(speed) AS c, COUNT(*) AS n, AVG(speed) AS a, MIN(speed) AS lo, "
            "MAX(speed) AS hi FROM traffic WHERE station <> 'st1' GROUP BY segment",
            "SELECT COUNT(*) AS n, SUM(speed) AS s FROM traffic HAVING COUNT(*) > 1",
        ]
        for sql in queries:
            here = await gw.snapshot_async(sql)
            there = await gw.snapshot_async(sql, engine="spark")
            assert there.pop("engine") == "spark"
            assert "engine" not in here
            same(there, here)
            assert there["sources"].get("archive", 0) > 0, sql
        whole = await gw.snapshot_async(GROUPED.format(where=""), engine="spark")
        assert whole.pop("engine") == "spark"
        n = sum(r["n"] for r in whole["rows"])
        assert n == len([t for t in earlier + data + late if t[0] < whole["to"]])
        assert whole["sources"]["memory"] + whole["sources"]["archive"] == n
        host, port = await gw.start_http()
        async with aiohttp.ClientSession() as http:  # the answer as gateway/openapi.yaml says
            body = {"sql": GROUPED.format(where=""), "engine": "spark"}
            r = await call(http, f"http://{host}:{port}", "POST", "/snapshot", body)
        assert r.status_code == 200 and json.loads(r.data) == {**whole, "engine": "spark"}
        with pytest.raises(QueryError, match="needs every reading"):
            await gw.snapshot_async("SELECT time, station FROM traffic", engine="spark")
        with pytest.raises(QueryError, match="needs every reading"):
            await gw.snapshot_async("SELECT SUM(speed + 0) AS s FROM traffic", engine="spark")
