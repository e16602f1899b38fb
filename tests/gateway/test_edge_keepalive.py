"""The edge's keep-alive timer (gateway/edge.py): one lazy timer per connection, not one per
request, with uvicorn's behaviour: an idle connection is closed after the timeout, a busy one never,
and the clock restarts at each response's end."""

from __future__ import annotations

import socket
import time

from tests.gateway.conftest import UpstreamFactory, run_gateway, url_of

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


def test_idle_connections_close_after_the_timeout_and_busy_ones_never(
        upstreams: UpstreamFactory) -> None:
    with run_gateway(backends=[url_of(upstreams())], keep_alive_s=_KEEP_ALIVE_S) as gw:
        port = int(gw.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port)) as s:
            _ask(s)
            waited = _closed_within(s, 3)
            assert waited is not None and _KEEP_ALIVE_S * 0.8 <= waited <= _KEEP_ALIVE_S + 1
        with socket.create_connection(("127.0.0.1", port)) as s:
            # Busy across several timeouts: a request every third of one, 3 timeouts long. The
            # timer armed by the first response fires in the middle of this and must stand down.
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
