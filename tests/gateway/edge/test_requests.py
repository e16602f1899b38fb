"""Ordinary HTTP/1.1 through the edge protocol: keep-alive, a body in pieces, pipelining and
Expect: 100-continue, all as uvicorn serves them without the edge."""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import AsyncIterator

import orjson
import pytest

from tests.gateway.conftest import (
    BackgroundStream,
    UpstreamFactory,
    gateway_process,
    run_gateway,
    url_of,
)
from tests.gateway.edge.conftest import ended_log, until_closed
from tests.openai_error import openai_error

_KEEP_ALIVE_S = 0.6
_REQUEST = b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n"


def _ask(s: socket.socket) -> None:
    s.sendall(_REQUEST)
    got = b""
    while b"\r\n\r\n" not in got or not got.endswith(b"}"):
        data = s.recv(4096)
        assert data, "the connection closed under a request"
        got += data
    assert got.startswith(b"HTTP/1.1 200 ")


def _closed_within(s: socket.socket, seconds: float) -> float | None:
    """Seconds until the server closes the connection, or None if it stays open that long."""
    start = time.monotonic()
    s.settimeout(seconds)
    try:
        return time.monotonic() - start if s.recv(1) == b"" else None
    except TimeoutError:
        return None


@pytest.mark.slow  # waits out the keep-alive timeout 6 times over: seconds of real time
def test_idle_connections_close_after_the_keep_alive_timeout_and_busy_ones_never(
        upstreams: UpstreamFactory) -> None:
    with run_gateway(backends=[url_of(upstreams())], keep_alive_s=_KEEP_ALIVE_S) as gw:
        port = int(gw.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port)) as s:
            _ask(s)
            waited = _closed_within(s, 3)
            assert waited is not None and _KEEP_ALIVE_S * 0.8 <= waited <= _KEEP_ALIVE_S + 1
        with socket.create_connection(("127.0.0.1", port)) as s:
            # Busy across several timeouts: a request every third of one, 3 timeouts long.
            end = time.monotonic() + 3 * _KEEP_ALIVE_S
            _ask(s)
            while time.monotonic() < end:
                time.sleep(_KEEP_ALIVE_S / 3)
                _ask(s)
            # Then idle: closed a whole timeout after the LAST response, not the first.
            waited = _closed_within(s, 3)
            assert waited is not None and _KEEP_ALIVE_S * 0.8 <= waited <= _KEEP_ALIVE_S + 1
        with socket.create_connection(("127.0.0.1", port)) as s:
            # Half a head sent, then silence: not idle (a request is arriving), so the keep-alive
            # timer does not close it; the edge's head deadline (10 s by default) would.
            _ask(s)
            s.sendall(_REQUEST[:10])
            assert _closed_within(s, 2 * _KEEP_ALIVE_S) is None


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


def _one_answer(s: socket.socket) -> tuple[bytes, bytes]:
    """The status line and body of one Content-Length response."""
    out = b""
    while b"\r\n\r\n" not in out:
        data = s.recv(65536)
        assert data, f"the connection closed before an answer: {out!r}"
        out += data
    head, body = out.split(b"\r\n\r\n", 1)
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:")))
    while len(body) < length:
        data = s.recv(65536)
        assert data, "the connection closed within an answer"
        body += data
    return head.split(b"\r\n")[0], body


_WS = b"connection: upgrade\r\nupgrade: websocket\r\n"
_WS_KEY = b"sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\n"
_CHAT = b'{"model": "demo", "messages": [{"role": "user", "content": "hi"}]}'


def test_upgrade_requests_are_plain_http_logged_once_and_do_not_break_the_drain(
        upstreams: UpstreamFactory) -> None:
    # The gateway serves no WebSockets: an Upgrade header is ignored (RFC 9110 allows it), so
    # each request gets the gateway's own answer, errors in OpenAI's shape. Before, a WebSocket
    # upgrade went to uvicorn's WebSocket protocol (403 or 400 in text/plain, or no answer for a
    # POST), uvicorn logged a warning per other upgrade, and SIGTERM with an unanswered
    # WebSocket POST open crashed the shutdown, cutting the drain.
    up = upstreams(token_delay_s=0.02)
    with gateway_process(up, "--log-level", "warning") as (gw, url):
        port = int(url.rsplit(":", 1)[1])
        hello = b"GET /v1/models HTTP/1.1\r\nhost: x\r\n"
        nowhere = b"GET /v1/nowhere HTTP/1.1\r\nhost: x\r\n"
        for _ in range(10):
            for head, status in ((hello + _WS + _WS_KEY, 200), (hello + _WS, 200),
                                 (nowhere + _WS, 404),
                                 (hello + b"connection: upgrade\r\nupgrade: h2c\r\n", 200)):
                with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                    s.sendall(head + b"\r\n")
                    line, body = _one_answer(s)
                    assert line.startswith(b"HTTP/1.1 %d " % status), (head, line, body)
                    if status != 200:
                        assert set(orjson.loads(body)["error"]) == {"message", "type", "param",
                                                                    "code"}
        stream = BackgroundStream(url)
        # A POST with a WebSocket upgrade, refused (test below), its connection left open.
        post = socket.create_connection(("127.0.0.1", port), timeout=10)
        post.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: "
                     b"application/json\r\ncontent-length: %d\r\n" % len(_CHAT) + _WS + b"\r\n"
                     + _CHAT)
        line, body = _one_answer(post)
        assert line.startswith(b"HTTP/1.1 400 "), line
        assert "message" in orjson.loads(body)["error"]
        stream.flowing()  # 50 tokens x 20 ms: a second of stream left
        os.kill(gw.pid, signal.SIGTERM)
        text = stream.join()
        post.close()
        assert text.rstrip().endswith("data: [DONE]")
        log = ended_log(gw)
        # 40 upgrade requests and a POST: one line, not one per request.
        assert sum("answered as plain http" in line.lower() for line in log.splitlines()) == 1, log


def test_what_follows_an_upgrade_head_is_never_lost_nor_parsed_as_a_request(
        upstreams: UpstreamFactory) -> None:
    # httptools skips the body of a request with an Upgrade header (or CONNECT) and drops the rest
    # of the read it came in; a later read is parsed as a new request. Before, `curl --http2 -d`
    # on an http:// URL got "request body is empty", a body sent after the head was run as a
    # request of its own (smuggled past whatever checked the POST), and a request pipelined
    # behind an upgrade was never answered, its connection left open.
    h2c = (b"connection: upgrade, http2-settings\r\nupgrade: h2c\r\n"
           b"http2-settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n")
    get = b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n"
    post = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n")
    with gateway_process(upstreams(), "--log-level", "warning") as (gw, url):
        port = int(url.rsplit(":", 1)[1])
        for upgrade in (h2c, _WS):
            # The body in the head's read (as curl sends it), or in a read of its own.
            answers = until_closed(port, post % len(_CHAT) + upgrade + b"\r\n" + _CHAT)
            assert [status for status, _ in answers] == [400], answers
            assert "Upgrade header" in str(openai_error(answers[0][1])["message"])
            assert until_closed(port, post % len(get) + upgrade + b"\r\n", get) == answers
            # No body: answered, then closed, the request behind it (in the same read) not read.
            answers = until_closed(port, get.replace(b"\r\n\r\n", b"\r\n" + upgrade + b"\r\n")
                                   + get)
            assert [status for status, _ in answers] == [200], answers
        os.kill(gw.pid, signal.SIGTERM)
        log = ended_log(gw)
    lines = log.splitlines()
    assert sum("answered as plain http" in line.lower() for line in lines) == 1, log
    assert sum("bad_request" in line for line in lines) == 1, log


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_body_over_the_limit_is_a_413_to_clients_that_send_it_all_first(
    upstreams: UpstreamFactory, chunked: bool,
) -> None:
    # Async clients (httpx.AsyncClient, AsyncOpenAI) write the whole body before they read: the
    # gateway answers 413 early, and must then read and drop the rest, not reset the connection
    # under the answer (a connection error to the client).
    import asyncio

    import httpx
    import openai

    up = upstreams()
    body = b'{"model": "demo", "prompt": "' + b"x" * (4 * 1024 * 1024) + b'"}'

    async def pieces() -> AsyncIterator[bytes]:
        yield body[:1000]
        yield body[1000:]

    async def run(url: str) -> None:
        async with httpx.AsyncClient() as client:
            for _ in range(3):
                r = await client.post(url + "/v1/completions",
                                      content=pieces() if chunked else body)
                assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0) as c:
            with pytest.raises(openai.APIStatusError) as info:
                await c.completions.create(model="demo", prompt="x" * (4 * 1024 * 1024))
            assert info.value.status_code == 413

    with run_gateway(backends=[url_of(up)], max_body_bytes=64 * 1024) as gw:
        asyncio.run(run(gw.url))
        assert up.completions == 0


def test_an_answer_before_a_small_body_keeps_the_connection_for_the_next_request(
        upstreams: UpstreamFactory) -> None:
    # A trailing slash is answered (307) without reading the body. When the body comes in a read
    # after the head (clients write them apart), the answer is out before it: the rest is read
    # and dropped, and the client's next request on the connection (the redirect followed, as
    # httpx does with follow_redirects) is served; the 307 announced no close.
    head = (b"POST /v1/chat/completions/ HTTP/1.1\r\nhost: x\r\n"
            b"content-type: application/json\r\ncontent-length: %d\r\n\r\n")
    with run_gateway(backends=[url_of(upstreams())], keep_alive_s=_KEEP_ALIVE_S) as gw:
        port = int(gw.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            for _ in range(2):
                s.sendall(head % len(_CHAT))
                status, _ = _one_answer(s)
                assert status.startswith(b"HTTP/1.1 307 "), status
                time.sleep(0.05)  # the answer is out before the body
                s.sendall(_CHAT[:10])
                time.sleep(0.05)
                s.sendall(_CHAT[10:])
                _ask(s)
            # Idle after that: closed at the keep-alive timeout, as after any answer.
            waited = _closed_within(s, 3)
            assert waited is not None and waited <= _KEEP_ALIVE_S + 1
        # A rest past the bound is not read to keep the connection: the answer, then the close.
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(head % (1024 * 1024))
            status, _ = _one_answer(s)
            assert status.startswith(b"HTTP/1.1 307 ")
            assert _closed_within(s, 3) is not None
