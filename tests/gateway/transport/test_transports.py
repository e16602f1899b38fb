"""Both transports' deadlines and failure mapping, against a real loopback HTTP server."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from gateway.errors import UpstreamFailed, UpstreamTimeout
from gateway.settings import Timeouts
from gateway.transport.aiohttp_transport import AiohttpTransport
from gateway.transport.base import Transport
from gateway.transport.h1 import H1Transport


async def slow_head(request: web.Request) -> web.Response:
    await asyncio.sleep(float(request.query["s"]))
    return web.Response(text="late")


async def gappy_stream(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse()
    await resp.prepare(request)
    for gap in (float(g) for g in request.query["gaps"].split(",")):
        await asyncio.sleep(gap)
        await resp.write(b"data: x\n\n")
    return resp


@pytest.fixture
async def server() -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/slow", slow_head)
    app.router.add_post("/stream", gappy_stream)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


@pytest.fixture(params=[H1Transport, AiohttpTransport], ids=["h1", "aiohttp"])
def transport(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    def make(**kw: float) -> Transport:
        return request.param(Timeouts(**{"connect_s": 1, "first_byte_s": 5, "idle_s": 5,  # type: ignore[no-any-return]
                                         "total_s": 10, **kw}))
    return make


async def drain(resp) -> list[bytes]:  # type: ignore[no-untyped-def]
    out = []
    while chunk := await resp.readany():
        out.append(chunk)
    return out


async def test_stream_within_deadlines_is_read_whole(server: str, transport) -> None:
    t = transport(idle_s=0.5)
    resp = await t.post(server + "/stream?gaps=0,0.1,0.1", b"{}", {}, streaming=True)
    assert b"".join(await drain(resp)) == b"data: x\n\n" * 3
    resp.release()
    await t.close()


async def test_idle_gap_times_out(server: str, transport) -> None:
    t = transport(idle_s=0.3)
    resp = await t.post(server + "/stream?gaps=0,0.8", b"{}", {}, streaming=True)
    with pytest.raises(UpstreamTimeout, match="no data for 0.3s"):
        await drain(resp)
    await t.close()


async def test_first_byte_deadline_on_stream(server: str, transport) -> None:
    t = transport(first_byte_s=0.3)
    resp = await t.post(server + "/stream?gaps=0.8", b"{}", {}, streaming=True)
    with pytest.raises(UpstreamTimeout, match="first byte"):
        await drain(resp)
    await t.close()


async def test_total_deadline_while_waiting_for_the_head(server: str, transport) -> None:
    t = transport(connect_s=0.2, first_byte_s=0.3, total_s=0.4)
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(UpstreamTimeout):
        await t.post(server + "/slow?s=1", b"{}", {}, streaming=False)
    assert loop.time() - start < 0.9  # the 0.4 s deadline, not the 1 s answer
    await t.close()


async def test_connection_refused_is_upstream_failed(transport) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t = transport()
    with pytest.raises(UpstreamFailed, match="unreachable"):
        await t.post(f"http://127.0.0.1:{port}/x", b"{}", {}, streaming=True)
    await t.close()


async def test_keep_alive_connection_is_reused_and_stale_one_replaced(server: str) -> None:
    t = H1Transport(Timeouts(connect_s=1, first_byte_s=5, idle_s=5, total_s=10))
    for _ in range(3):
        resp = await t.post(server + "/stream?gaps=0", b"{}", {}, streaming=True)
        assert await resp.read() == b"data: x\n\n"
        resp.release()
    (pool, _, _), = t._pools.values()
    assert len(pool.idle) == 1  # one connection served all three
    # The replica closes the idle connection; the next request must not fail because of it.
    conn = pool.idle[0]
    assert conn.transport is not None
    conn.transport.abort()
    resp = await t.post(server + "/stream?gaps=0", b"{}", {}, streaming=True)
    assert await resp.read() == b"data: x\n\n"
    resp.release()
    await t.close()


async def test_abort_mid_stream_closes_the_connection(server: str) -> None:
    t = H1Transport(Timeouts(connect_s=1, first_byte_s=5, idle_s=5, total_s=10))
    resp = await t.post(server + "/stream?gaps=0,0.5,0.5", b"{}", {}, streaming=True)
    assert await resp.readany() == b"data: x\n\n"
    resp.close()
    (pool, _, _), = t._pools.values()
    assert not pool.idle  # an aborted connection is never pooled
    await t.close()
