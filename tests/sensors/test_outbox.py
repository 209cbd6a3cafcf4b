"""A device's outbound queue wakes its producer as the sender goes (high and low water marks),
and says when everything was sent; nothing polls."""

from __future__ import annotations

import asyncio

import pytest

from sensors.transports.base import Outbox

pytestmark = pytest.mark.timeout(10)


async def test_room_waits_past_half_until_a_quarter_is_left() -> None:
    out: Outbox[int] = Outbox(8)
    for i in range(4):
        out.put_nowait(i)
    await asyncio.wait_for(out.room(), 0.1)  # half full: room at once
    out.put_nowait(4)
    waiting = asyncio.create_task(out.room())
    await asyncio.sleep(0)
    assert not waiting.done()  # more than half full: wait
    for _ in range(2):  # down to 4, then 3 queued: still above a quarter
        await out.take()
        out.done()
        await asyncio.sleep(0)
        assert len(out) > 2 and not waiting.done()
    await out.take()
    out.done()  # 2 left: a quarter
    await asyncio.wait_for(waiting, 1)
    assert out.dropped == 0


async def test_sent_waits_for_the_item_in_hand() -> None:
    out: Outbox[int] = Outbox(4)
    await asyncio.wait_for(out.sent(), 0.1)  # nothing queued
    out.put_nowait(1)
    sent = asyncio.create_task(out.sent())
    item = await out.take()
    await asyncio.sleep(0)
    assert item == 1 and not sent.done()  # taken, not yet handed on
    out.push_front(item)  # the send failed: it keeps its place
    out.done()
    await asyncio.sleep(0)
    assert not sent.done()
    await out.take()
    out.done()
    await asyncio.wait_for(sent, 1)
