"""EdgeCycle's `receive` against uvicorn's contract, driven as the edge protocol drives it, plus the
edge serving a body that arrives in pieces, a pipelined pair and Expect: 100-continue."""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

from gateway.edge_cycle import EdgeCycle
from tests.gateway.conftest import UpstreamFactory, gateway_process


class _Transport:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def is_closing(self) -> bool:
        return self.closing


class _Flow:
    def __init__(self) -> None:
        self.resumed = 0

    def resume_reading(self) -> None:
        self.resumed += 1


def _cycle(expect_100: bool = False) -> tuple[EdgeCycle, _Transport, _Flow]:
    transport, flow = _Transport(), _Flow()
    scope: Any = {"type": "http", "method": "POST", "headers": []}
    cycle = EdgeCycle(scope, transport, flow, [], True, expect_100,  # type: ignore[arg-type]
                      lambda: None)
    return cycle, transport, flow


async def _pending(coro: Any) -> asyncio.Task[Any]:
    task = asyncio.ensure_future(coro)
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    return task


async def test_a_body_that_is_all_here_is_handed_over_without_waiting() -> None:
    cycle, _, flow = _cycle()
    cycle.add_body(b"abc")
    cycle.end_body()
    assert await cycle.receive() == {"type": "http.request", "body": b"abc", "more_body": False}
    assert flow.resumed == 0  # nothing to wait for: reading was never resumed


async def test_receive_waits_for_the_body_and_wakes_on_each_read() -> None:
    cycle, _, flow = _cycle()
    task = await _pending(cycle.receive())
    assert not task.done() and flow.resumed == 1
    cycle.add_body(b"ab")
    assert await task == {"type": "http.request", "body": b"ab", "more_body": True}
    cycle.add_body(b"cd")
    cycle.add_body(b"ef")  # two reads before the app asks again: one message, in order
    msg = await cycle.receive()
    assert msg == {"type": "http.request", "body": b"cdef", "more_body": True}
    assert type(msg["body"]) is bytes  # type: ignore[typeddict-item]
    task = await _pending(cycle.receive())
    cycle.end_body()
    assert await task == {"type": "http.request", "body": b"", "more_body": False}


async def test_after_the_last_body_message_receive_waits_for_the_disconnect() -> None:
    cycle, _, _ = _cycle()
    cycle.add_body(b"x")
    cycle.end_body()
    await cycle.receive()
    task = await _pending(cycle.receive())
    assert not task.done()  # as uvicorn: nothing more until the request is over
    cycle.disconnected = True
    cycle.message_event.set()  # what uvicorn's connection_lost calls
    assert await task == {"type": "http.disconnect"}


async def test_a_disconnect_wins_over_body_still_held() -> None:
    cycle, _, _ = _cycle()
    cycle.add_body(b"x")
    cycle.disconnected = True
    assert await cycle.receive() == {"type": "http.disconnect"}


async def test_a_completed_response_ends_a_waiting_receive() -> None:
    cycle, _, _ = _cycle()
    task = await _pending(cycle.receive())
    cycle.response_complete = True
    cycle.message_event.set()
    assert await task == {"type": "http.disconnect"}


async def test_100_continue_is_written_once_when_the_body_is_first_asked_for() -> None:
    cycle, transport, _ = _cycle(expect_100=True)
    assert transport.written == []
    task = await _pending(cycle.receive())
    assert transport.written == [b"HTTP/1.1 100 Continue\r\n\r\n"]
    cycle.add_body(b"x")
    cycle.end_body()
    await task
    assert transport.written == [b"HTTP/1.1 100 Continue\r\n\r\n"]


def test_add_body_reports_what_it_holds() -> None:
    cycle, _, _ = _cycle()
    first = b"a" * 10
    assert cycle.add_body(first) == 10
    assert cycle.body is first  # one read: kept as it came, no copy
    assert cycle.add_body(b"b" * 5) == 15


# -- through the server ----------------------------------------------------------------------------


def _read_answers(s: socket.socket, n: int) -> bytes:
    out = b""
    while out.count(b"HTTP/1.1 200 ") < n or not out.endswith(b"}"):
        data = s.recv(65536)
        if not data:
            break
        out += data
    return out


def test_the_gateway_serves_a_body_in_pieces_a_pipelined_pair_and_100_continue(
        upstreams: UpstreamFactory) -> None:
    body = b'{"model": "demo", "messages": [{"role": "user", "content": "hi"}]}'
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n" % len(body))
    with gateway_process(upstreams()) as (_, url):
        port = int(url.rsplit(":", 1)[1])
        # The body in three reads: the app waits for all of it, then answers.
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            for part in (head + b"\r\n", body[:10], body[10:]):
                s.sendall(part)
                time.sleep(0.05)
            out = _read_answers(s, 1)
            assert out.startswith(b"HTTP/1.1 200 ") and b'"chat.completion"' in out
        # Two requests in one write: both answered, in order, on the one connection.
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall((head + b"\r\n" + body) * 2)
            assert _read_answers(s, 2).count(b'"chat.completion"') == 2
        # Expect: 100-continue: the interim answer first, the real one once the body came.
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(head + b"expect: 100-continue\r\n\r\n")
            assert s.recv(65536) == b"HTTP/1.1 100 Continue\r\n\r\n"
            s.sendall(body)
            assert _read_answers(s, 1).startswith(b"HTTP/1.1 200 ")
