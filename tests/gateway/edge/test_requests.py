"""Ordinary HTTP/1.1 through the edge protocol: keep-alive, a body in pieces, pipelining and
Expect: 100-continue, all as uvicorn serves them without the edge."""

from __future__ import annotations

import socket
import time

import pytest

from tests.gateway.conftest import UpstreamFactory, gateway_process, run_gateway, url_of

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
