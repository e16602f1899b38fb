"""api/splice.py's ClientWriter: a connection's write flow and hang-up, as the relay uses them."""

from __future__ import annotations

import asyncio
import time

from gateway.api.splice import ClientWriter
from tests import loopback
from tests.gateway.conftest import UpstreamFactory, run_gateway, url_of

CHAT = {"model": "demo", "messages": [{"role": "user", "content": "hi"}], "stream": True}


async def _pending(coro: object) -> asyncio.Task[None]:
    task = asyncio.ensure_future(coro)  # type: ignore[call-overload]
    for _ in range(3):
        await asyncio.sleep(0)
    return task


async def test_drain_returns_at_once_unless_paused_then_when_resumed() -> None:
    w = ClientWriter()
    await asyncio.wait_for(w.drain(), 1)
    w.pause_writing()
    first, second = await _pending(w.drain()), await _pending(w.drain())
    assert not first.done() and not second.done()
    first.cancel()  # one waiter gone must not take the other's wake-up with it
    await asyncio.sleep(0)
    assert not second.done()
    w.resume_writing()
    await asyncio.wait_for(second, 1)
    assert not w.write_paused


async def test_a_lost_connection_wakes_the_drain_and_tells_the_request() -> None:
    w = ClientWriter()
    told = []
    w.lost = lambda: told.append(1)
    w.pause_writing()
    waiting = await _pending(w.drain())
    assert not w.closed
    w.connection_lost()
    await asyncio.wait_for(waiting, 1)
    assert told == [1]
    assert w.closed  # the relay drops what it would write from now on


def test_the_hang_up_reaches_the_second_request_of_a_keep_alive_connection(
        upstreams: UpstreamFactory) -> None:
    # The first request's task outlives its response: it reads the upstream's terminator, which
    # comes 0.5 s after [DONE]. Meanwhile the second request on the same connection registers for
    # the connection's hang-up; the first one's end must not unregister it.
    up = upstreams(token_delay_s=0.05, end_delay_s=0.5)
    with run_gateway(backends=[url_of(up)]) as gw, loopback.client() as c:
        r = c.post(gw.url + "/v1/chat/completions", json={**CHAT, "max_tokens": 2})
        assert r.text.rstrip().endswith("data: [DONE]")
        with c.stream("POST", gw.url + "/v1/chat/completions",
                      json={**CHAT, "max_tokens": 200}) as second:
            chunks = second.iter_bytes()  # held: a dropped iterator closes the response
            next(chunks)
            time.sleep(0.8)  # past the first request's end
            assert up.aborted == 0
        # Closed mid-stream: the gateway cancels the second request and drops its upstream.
        deadline = time.monotonic() + 3
        while up.aborted == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert up.aborted == 1
