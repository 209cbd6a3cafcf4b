"""The daemon runs the scheduler `[runtime] scheduler` names (ticket by default), and shows a
query's PRIORITY in explain (dry run) and GET /queries/{id}."""

from __future__ import annotations

import json
import urllib.request

import aiohttp
import pytest

from fjords.runtime.scheduler import RoundRobinScheduler, TicketScheduler
from gateway.cli import main
from gateway.config import Config
from gateway.daemon import Gateway

SQL = "SELECT station, speed FROM traffic WHERE speed > 10"


def _config(tmp_path) -> Config:
    cfg = Config()
    cfg.state_dir = str(tmp_path / "state")
    cfg.http.port = 0
    return cfg


def test_explain_text_shows_the_priority(tmp_path) -> None:
    from gateway.cli_text import explain_text

    sql = f"{SQL} PRIORITY 800"
    assert "priority:   800" in explain_text(sql, Gateway(_config(tmp_path)).explain(sql))


def test_the_daemon_runs_the_ticket_scheduler_by_default(tmp_path) -> None:
    assert isinstance(Gateway(_config(tmp_path)).fjord.scheduler, TicketScheduler)
    gw = Gateway(_config(tmp_path), scheduler="round-robin")
    assert isinstance(gw.fjord.scheduler, RoundRobinScheduler)
    with pytest.raises(ValueError, match="unknown scheduler"):
        Gateway(_config(tmp_path), scheduler="fifo")
    cfg = _config(tmp_path)
    cfg.runtime.scheduler = "round-robin"  # [runtime] scheduler in the configuration
    assert isinstance(Gateway(cfg).fjord.scheduler, RoundRobinScheduler)


async def test_priority_in_explain_and_get_query(tmp_path) -> None:
    gw = Gateway(_config(tmp_path))
    async with gw:
        host, port = await gw.start_http()
        async with aiohttp.ClientSession(f"http://{host}:{port}") as http:
            r = await http.post("/queries", json={"sql": f"{SQL} PRIORITY 800", "dry_run": True})
            assert r.status == 200 and (await r.json())["priority"] == 800
            r = await http.post("/queries", json={"sql": f"{SQL} PRIORITY 800"})
            assert r.status == 201
            qid = (await r.json())["id"]
            body = await (await http.get(f"/queries/{qid}")).json()
            assert body["priority"] == 800
            assert {op.tickets for op in gw.fjord.queries[qid].operators} == {800}
            r = await http.post("/queries", json={"sql": SQL})
            body = await (await http.get(f"/queries/{(await r.json())['id']}")).json()
            assert body["priority"] == 100
            r = await http.post("/queries", json={"sql": f"{SQL} PRIORITY 0"})
            assert r.status == 400
            err = await r.json()
            assert "PRIORITY must be a whole number from 1 to 1000" in err["error"]
            assert (err["line"], err["column"]) == (1, 62)


def test_the_real_daemon_registers_and_explains_priority(daemon, capsys) -> None:
    """`fjords-gateway run` (a subprocess, ticket scheduler by default) and the CLI client."""
    url, _ = daemon
    assert main(["explain", f"{SQL} PRIORITY 900", "--url", url]) == 0
    assert "priority:   900" in capsys.readouterr().out
    req = urllib.request.Request(
        f"{url}/queries",
        data=json.dumps({"sql": f"{SQL} PRIORITY 900"}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        qid = json.loads(r.read())["id"]
    with urllib.request.urlopen(f"{url}/queries/{qid}", timeout=10) as r:
        assert json.loads(r.read())["priority"] == 900
    assert main(["explain", f"{SQL} PRIORITY 5000", "--url", url]) == 2
    assert "PRIORITY must be a whole number from 1 to 1000" in capsys.readouterr().err
