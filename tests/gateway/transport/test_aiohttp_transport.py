"""The transport's deadlines and failure mapping, against a real loopback HTTP server."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from gateway.errors import UpstreamFailed, UpstreamTimeout
from gateway.settings import Timeouts
from gateway.transport.aiohttp_transport import AiohttpTransport


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


def transport(**kw: float) -> AiohttpTransport:
    return AiohttpTransport(Timeouts(**{"connect_s": 1, "first_byte_s": 5, "idle_s": 5,
                                        "total_s": 10, **kw}))


async def drain(resp) -> list[bytes]:  # type: ignore[no-untyped-def]
    out = []
    while chunk := await resp.readany():
        out.append(chunk)
    return out


async def test_stream_within_deadlines_is_read_whole(server: str) -> None:
    t = transport(idle_s=0.5)
    resp = await t.post(server + "/stream?gaps=0,0.1,0.1", b"{}", {}, streaming=True)
    assert b"".join(await drain(resp)) == b"data: x\n\n" * 3
    resp.release()
    await t.close()


async def test_idle_gap_times_out(server: str) -> None:
    t = transport(idle_s=0.3)
    resp = await t.post(server + "/stream?gaps=0,0.8", b"{}", {}, streaming=True)
    with pytest.raises(UpstreamTimeout, match="no data for 0.3s"):
        await drain(resp)
    await t.close()


async def test_first_byte_deadline_on_stream(server: str) -> None:
    t = transport(first_byte_s=0.3)
    resp = await t.post(server + "/stream?gaps=0.8", b"{}", {}, streaming=True)
    with pytest.raises(UpstreamTimeout, match="first byte"):
        await drain(resp)
    await t.close()


async def test_total_deadline_while_waiting_for_the_head(server: str) -> None:
    t = transport(connect_s=0.2, first_byte_s=0.3, total_s=0.4)
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(UpstreamTimeout):
        await t.post(server + "/slow?s=3", b"{}", {}, streaming=False)
    assert loop.time() - start < 1.5
    await t.close()


async def test_connection_refused_is_upstream_failed() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t = transport()
    with pytest.raises(UpstreamFailed, match="unreachable"):
        await t.post(f"http://127.0.0.1:{port}/x", b"{}", {}, streaming=True)
    await t.close()
