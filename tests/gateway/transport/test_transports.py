"""The h1 transport's contract: deadlines, failure mapping, keep-alive and push, against real
loopback HTTP servers."""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from gateway.errors import UpstreamFailed, UpstreamTimeout
from gateway.settings import Timeouts
from gateway.transport.h1 import H1Transport


async def slow_head(request: web.Request) -> web.Response:
    await asyncio.sleep(float(request.query["s"]))
    return web.Response(text="late")


async def gappy_stream(request: web.Request) -> web.StreamResponse:
    """One event after each of `gaps` (seconds); with `stamp`, each event carries the loop time
    it was sent at (the client's loop: the server runs in the test's own)."""
    resp = web.StreamResponse()
    await resp.prepare(request)
    loop = asyncio.get_running_loop()
    for gap in (float(g) for g in request.query["gaps"].split(",")):
        await asyncio.sleep(gap)
        await resp.write(b"data: %r\n\n" % loop.time() if "stamp" in request.query
                         else b"data: x\n\n")
    return resp


@pytest.fixture
async def server() -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/slow", slow_head)
    app.router.add_post("/stream", gappy_stream)
    # At teardown, handlers still sleeping through a gap the client gave up on are cancelled
    # rather than awaited (aiohttp's default waits up to 60 s for them).
    runner = web.AppRunner(app, shutdown_timeout=0.05)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


@pytest.fixture
def transport():  # type: ignore[no-untyped-def]
    def make(**kw: float) -> H1Transport:
        return H1Transport(Timeouts(**{"connect_s": 1, "first_byte_s": 5, "idle_s": 5,
                                       "total_s": 10, **kw}))
    return make


async def drain(resp) -> list[bytes]:  # type: ignore[no-untyped-def]
    out = []
    while chunk := await resp.readany():
        out.append(chunk)
    return out


async def test_stream_within_deadlines_is_read_whole(server: str, transport) -> None:
    # Gaps of 0.1 s under 2 s: room for a stalled test loop (see the push test below).
    t = transport(idle_s=2)
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
        await t.post(server + "/slow?s=10", b"{}", {}, streaming=False)
    assert loop.time() - start < 5  # the 0.4 s deadline, not the 10 s answer
    await t.close()


async def test_connection_refused_is_upstream_failed(transport) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t = transport()
    with pytest.raises(UpstreamFailed, match="unreachable"):
        await t.post(f"http://127.0.0.1:{port}/x", b"{}", {}, streaming=True)
    await t.close()


class KeepAliveServer:
    """A raw HTTP/1.1 server that answers keep-alive requests and counts what it saw.

    With `close_after=n`, it reads the (n+1)th request on a connection and closes that connection
    without a byte of answer: what a replica does when its idle timeout fires just as a reused
    connection's request arrives."""

    def __init__(self, close_after: int | None = None) -> None:
        self.close_after = close_after
        self.connections = 0
        self.requests = 0
        self._server: asyncio.Server | None = None

    async def _handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.connections += 1
        served = 0
        try:
            while True:
                head = await r.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                await r.readexactly(length)
                self.requests += 1
                if self.close_after is not None and served >= self.close_after:
                    return
                body = b"data: x\n\n"
                w.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
                await w.drain()
                served += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            w.close()

    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *_: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()


async def test_keep_alive_connection_is_reused() -> None:
    srv = KeepAliveServer()
    async with srv as url:
        t = H1Transport(Timeouts(connect_s=1, first_byte_s=5, idle_s=5, total_s=10))
        for _ in range(3):
            resp = await t.post(url + "/x", b"{}", {}, streaming=True)
            assert await resp.read() == b"data: x\n\n"
        await t.close()
    assert (srv.connections, srv.requests) == (1, 3)  # one connection served all three


async def test_request_on_a_connection_the_replica_closed_is_resent_on_a_new_one() -> None:
    # The replica answers one request per connection and drops the next one unanswered: the
    # second request goes out on the pooled connection, dies without a byte of answer, and must
    # be sent again on a fresh connection instead of failing (gateway/transport/h1.py, _send).
    srv = KeepAliveServer(close_after=1)
    async with srv as url:
        t = H1Transport(Timeouts(connect_s=1, first_byte_s=5, idle_s=5, total_s=10))
        for _ in range(2):
            resp = await t.post(url + "/x", b"{}", {}, streaming=True)
            assert await resp.read() == b"data: x\n\n"
        await t.close()
    # Request 2 reached the server twice: on the reused connection, then on a new one.
    assert (srv.connections, srv.requests) == (2, 3)


async def test_abort_mid_stream_closes_the_connection(server: str) -> None:
    t = H1Transport(Timeouts(connect_s=1, first_byte_s=5, idle_s=5, total_s=10))
    resp = await t.post(server + "/stream?gaps=0,0.5,0.5", b"{}", {}, streaming=True)
    assert await resp.readany() == b"data: x\n\n"
    resp.close()
    # An aborted connection is never pooled: the next request opens a new one.
    resp = await t.post(server + "/stream?gaps=0", b"{}", {}, streaming=True)
    assert await resp.read() == b"data: x\n\n"
    await t.close()


async def test_push_feeds_the_sink_until_the_body_ends(server: str, transport) -> None:
    # 17 gaps of 0.1 s under an idle deadline of 1.5 s, 1.7 s in all: each read in push mode
    # moves the deadline (the relay's task sleeps meanwhile and reads nothing itself). A deadline
    # that did not move would fire 1.5 s in, whatever the load; one that does tolerates a stall
    # of the loop of 1.4 s in any gap (a full GC of a loaded test process takes 0.4 s here, and
    # twice that for a process starved of CPU meanwhile).
    t = transport(idle_s=1.5)
    resp = await t.post(server + "/stream?stamp&gaps=0" + ",0.1" * 17, b"{}", {},
                        streaming=True)
    got: list[bytes] = []
    times: list[float] = []

    def sink(chunk: bytes, now: float) -> bool:
        got.append(chunk)
        times.append(now)
        return True

    await resp.push(sink)
    assert len(got) == 18 and all(re.fullmatch(rb"data: [0-9.]+\n\n", c) for c in got), got
    # Each chunk comes with the loop time it arrived: after the upstream sent it and before the
    # upstream sent the next (0.1 s later). Ordered by causality, not measured against a
    # tolerance, so a stalled loop cannot break it.
    sent = [float(c[6:]) for c in got]
    interleaved = [x for pair in zip(sent, times, strict=True) for x in pair]
    assert interleaved == sorted(interleaved), (sent, times)
    assert await resp.readany() == b""  # the body is complete
    resp.release()
    await t.close()


async def test_push_stops_when_the_sink_says_so_and_the_rest_is_still_readable(
    server: str, transport
) -> None:
    t = transport(idle_s=2)  # gaps of 0.05 s: room for a stalled test loop
    resp = await t.post(server + "/stream?gaps=0,0.05,0.05", b"{}", {}, streaming=True)
    got: list[bytes] = []
    await resp.push(lambda chunk, now: got.append(chunk) and False)  # stop after the first chunk
    assert got == [b"data: x\n\n"]
    assert b"".join(await drain(resp)) == b"data: x\n\n" * 2  # nothing lost
    resp.release()
    await t.close()


async def test_push_times_out_on_an_idle_gap(server: str, transport) -> None:
    # The deadline's idle clock is refreshed from the read callback in push mode: the 10 s gap is
    # cut 1.5 s after the LAST chunk (0.3 s after the first), not after the first. Gaps of 0.1 s
    # under 1.5 s leave a stalled test loop 1.4 s; a lower bound on the time no stall can break.
    t = transport(idle_s=1.5)
    resp = await t.post(server + "/stream?gaps=0,0.1,0.1,0.1,10", b"{}", {}, streaming=True)
    times: list[float] = []
    with pytest.raises(UpstreamTimeout, match="no data for 1.5s"):
        await resp.push(lambda chunk, now: times.append(now) is None)
    assert len(times) == 4
    assert asyncio.get_running_loop().time() - times[-1] >= 1.5
    await t.close()


async def test_push_from_before_the_first_byte_times_out_on_an_idle_gap(
    server: str, transport
) -> None:
    # The relay pushes from the response head on, so the first event, too, arrives in push mode:
    # from then on the idle deadline applies, not the (longer) first-byte one.
    # (Gaps of 0.1-0.2 s under 1.5 s: room for a stalled test loop. Were the first-byte deadline
    # still the one, the 10 s gap would be cut at 5 s, saying so.)
    t = transport(idle_s=1.5, first_byte_s=5)
    resp = await t.post(server + "/stream?gaps=0.2,0.1,10", b"{}", {}, streaming=True)
    times: list[float] = []
    with pytest.raises(UpstreamTimeout, match="no data for 1.5s"):
        await resp.push(lambda chunk, now: times.append(now) is None)
    assert len(times) == 2
    assert asyncio.get_running_loop().time() - times[-1] >= 1.5  # from the last chunk on
    await t.close()


async def test_push_hands_over_one_read_as_one_chunk() -> None:
    # Three chunked-encoding chunks (SSE events) in one upstream write reach the sink as one
    # chunk: one downstream write per upstream read, as the pull path's readany joins them.
    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await r.readuntil(b"\r\n\r\n")
        await r.readexactly(2)
        w.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        await w.drain()
        await asyncio.sleep(0.05)
        w.write(b"9\r\ndata: a\n\n\r\n" * 3)
        await w.drain()
        await asyncio.sleep(0.05)
        w.write(b"0\r\n\r\n")
        await w.drain()
        w.close()

    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    t = H1Transport(Timeouts(connect_s=1, first_byte_s=5, idle_s=5, total_s=10))
    resp = await t.post(f"http://127.0.0.1:{port}/x", b"{}", {}, streaming=True)
    got: list[bytes] = []
    await resp.push(lambda chunk, now: got.append(chunk) is None)
    assert got == [b"data: a\n\n" * 3]
    resp.release()
    await t.close()
    srv.close()
    await srv.wait_closed()


def test_the_transport_is_one_client_behind_the_packages_two_names() -> None:
    """The other layers import `Transport` and `UpstreamResponse` from gateway.transport: h1.py's
    client itself, not a Protocol with a single implementation beside it."""
    import gateway.transport
    from gateway.transport.h1 import H1Response, H1Transport

    assert gateway.transport.Transport is H1Transport
    assert gateway.transport.UpstreamResponse is H1Response
    package = Path(gateway.transport.__file__).parent
    assert sorted(p.name for p in package.glob("*.py")) == [
        "__init__.py", "deadline.py", "h1.py", "prober.py"]
