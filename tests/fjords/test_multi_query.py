"""Many queries over one stream (issue 14): installing and removing them keeps every shared
stage's priority exact; the batch paths give the same rows as the per-row paths."""

from __future__ import annotations

import random

import pytest

from fjords.fjord import Fjord
from fjords.schema import Schema
from fjords.sql import ast

SCHEMA = Schema(
    [("time", "int"), ("station", "str"), ("speed", "float"), ("segment", "str")], time="time"
)
AGG = "SELECT segment, AVG(speed) AS v FROM traffic [RANGE 1 MINUTE] GROUP BY segment"


def _fjord(*, fuse: bool = True) -> Fjord:
    f = Fjord(fuse=fuse)
    f.add_stream("traffic", SCHEMA, sensor_field="station")
    return f


@pytest.mark.parametrize("fuse", [True, False])
def test_shared_stage_tickets_stay_the_max_of_their_users(fuse: bool) -> None:
    """The incremental tickets (counted per stream and per shared aggregate) equal the
    maximum recomputed from scratch after every install and removal."""
    rng = random.Random(5)
    f = _fjord(fuse=fuse)
    live: list[str] = []
    for step in range(200):
        if live and rng.random() < 0.35:
            qid = live.pop(rng.randrange(len(live)))
            f.remove_query(qid)
        else:
            qid = f"q{step}"
            prio = rng.choice([1, 50, 100, 300, 1000])
            sql = (
                AGG if rng.random() < 0.5 else "SELECT station, speed FROM traffic WHERE speed > 3"
            )
            f.add_query(f"{sql} PRIORITY {prio}", query_id=qid)
            live.append(qid)
        router = f.streams["traffic"].router
        want = max((f.queries[q].ast.tickets for q in live), default=ast.DEFAULT_PRIORITY)
        assert router.tickets == want
        for shared in f._shared.values():
            top = max(f.queries[u].ast.tickets for u in shared.users)
            assert shared.aggregate.tickets == top
            assert router._priority[shared.router_key] == top
