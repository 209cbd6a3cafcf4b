"""Result streams write a batch as soon as it is published: no timer, no extra task between
the result hub and the client's socket (counted in event-loop turns, not wall time)."""

from __future__ import annotations

import asyncio

import pytest

from gateway import http_api
from gateway.results import ResultHub


class Response:
    """What `_pump` writes to: records each write."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    async def write(self, data: bytes) -> None:
        self.writes.append(data)


@pytest.mark.parametrize("fmt", ["sse", "ndjson"])
async def test_a_published_batch_is_written_on_the_next_loop_turn(monkeypatch, fmt: str) -> None:
    monkeypatch.setattr(http_api, "KEEPALIVE_SECONDS", 3600.0)  # no timer can be what flushes
    hub = ResultHub()
    sub = hub.subscribe("q")
    resp = Response()
    pump = asyncio.create_task(http_api._pump(sub, resp, fmt))  # type: ignore[arg-type]
    try:
        for _ in range(5):
            await asyncio.sleep(0)
        assert resp.writes == []  # waiting for rows
        hub.publish("q", [{"a": 1}, {"a": 2}])
        turns = 0
        while not resp.writes and turns < 10:
            await asyncio.sleep(0)
            turns += 1
        assert turns == 1, f"the batch took {turns} event-loop turns to be written"
        # The whole batch is one write.
        assert len(resp.writes) == 1
        for row in (b'{"a": 1}', b'{"a": 2}'):
            assert (b"data: " + row if fmt == "sse" else row) in resp.writes[0]
    finally:
        sub.close()
        await asyncio.wait_for(pump, 5)
