"""The real daemon (`fjords-gateway run` in a subprocess): a query registered with a file sink
writes the rows SSE clients get, and a restart (SIGTERM, start again) keeps the sink and never
reuses a row id."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

from tests.daemon import Daemon
from tests.support import eventually

SIM = "[simulation]\nstations = 20\nsegments = 4\nspeedup = 600\ntraffic_pair = false\n"


def _sse(url: str, n: int, headers: dict[str, str] | None = None) -> list[dict]:
    """The first `n` SSE events with data, as {field: value} (comments skipped)."""
    req = urllib.request.Request(url, headers=headers or {})
    events: list[dict] = []
    current: dict[str, str] = {}
    with urllib.request.urlopen(req, timeout=60) as resp:
        for raw in resp:
            line = raw.decode().rstrip("\n")
            if not line:
                if "data" in current:
                    events.append(current)
                    if len(events) >= n:
                        break
                current = {}
            elif not line.startswith(":"):
                key, _, value = line.partition(": ")
                current[key] = value
    return events


def test_file_sink_and_replay_across_a_restart(tmp_path: Path) -> None:
    state = tmp_path / "state"
    gw = Daemon(tmp_path, f'[state]\ndir = "{state}"\n{SIM}')
    sink = {"type": "file", "path": "speeds", "batch_ms": 0}
    with gw:
        q = gw.post("/queries", {"sql": "SELECT station, speed FROM traffic", "sinks": [sink]})
        qid = q["id"]
        assert q["options"]["sinks"][0]["path"] == "speeds"
        # ?since=0: every row still kept, from the first (what the sink got from the start).
        events = _sse(f"{gw.url}/queries/{qid}/results?since=0", 200)
        assert all(e.get("event") is None for e in events), events[0]  # nothing was gone yet
        ids = [int(e["id"]) for e in events]
        assert ids == list(range(1, 201))
        seen = [json.loads(e["data"]) for e in events]
        eventually(
            lambda: gw.get(f"/queries/{qid}"),
            lambda q: q["sinks"][0]["rows_sent"] >= 200,
            message="the file sink has sent 200 rows",
            timeout=60,
        )
    directory = state / "sinks" / "speeds"
    files = sorted(directory.glob(f"{qid}-*.ndjson"))
    written = [json.loads(line) for p in files for line in p.read_text().splitlines()]
    assert written[:200] == seen
    with gw.start():
        d = gw.get(f"/queries/{qid}")
        assert [s["type"] for s in d["sinks"]] == ["file"]
        assert d["sinks"][0]["directory"] == str(directory.resolve())
        # A client that remembers a row id from before the restart is told those rows are gone
        # and gets new ids, all above the old ones.
        events = _sse(f"{gw.url}/queries/{qid}/results", 1, {"Last-Event-ID": str(ids[-1])})
        assert events[0]["event"] == "gone"
        gone = json.loads(events[0]["data"])["gone"]
        assert gone["first_id"] > len(written)
        eventually(
            lambda: gw.get(f"/queries/{qid}"),
            lambda q: q["sinks"][0]["rows_sent"] >= 1,
            message="the restarted file sink sends a row",
            timeout=60,
        )
    assert len(sorted(directory.glob(f"{qid}-*.ndjson"))) > len(files)  # appended, not rewritten
