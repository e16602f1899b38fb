"""The streamed relay (gateway/api/stream.py) through a real gateway, with the server's direct writer
(the edge protocol) and without one (uvicorn's plain protocol: every chunk through ASGI `send`).
The proxy's streaming rules (no retry after the first byte, in-band errors, disconnects, usage)
are in test_proxy.py."""

from __future__ import annotations

import socket
import time

import httpx
import pytest

from gateway.api import stream
from gateway.api.splice import Splice
from tests import loopback
from tests.gateway.conftest import UpstreamFactory, run_gateway, url_of
from tests.waiting import wait_for

CHAT = {"model": "demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}


def read_chunked_stream(sock: socket.socket) -> bytes:
    """The body of one chunked HTTP response, framing checked chunk by chunk."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        buf += sock.recv(65536)
    head, buf = buf.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in head.lower()
    body = bytearray()
    while True:
        while b"\r\n" not in buf:
            buf += sock.recv(65536)
        size_line, buf = buf.split(b"\r\n", 1)
        size = int(size_line, 16)
        while len(buf) < size + 2:
            more = sock.recv(65536)
            assert more, "connection closed mid-chunk"
            buf += more
        assert buf[size:size + 2] == b"\r\n"
        if size == 0:
            return bytes(body)
        body += buf[:size]
        buf = buf[size + 2:]


@pytest.mark.parametrize("edge", [True, False], ids=["direct", "asgi"])
def test_a_client_that_reads_slowly_gets_every_event(
    upstreams: UpstreamFactory, monkeypatch: pytest.MonkeyPatch, edge: bool
) -> None:
    # Far more than the socket buffers hold, sent by the upstream at once: the gateway's writes
    # to the stalled client fill its buffer; the relay waits for the drain, then resumes.
    stops = []

    class CountingSplice(Splice):
        def feed(self, chunk: bytes, now: float) -> bool:
            going = super().feed(chunk, now)
            if self.blocked and not going:
                stops.append(1)
            return going

    monkeypatch.setattr(stream, "Splice", CountingSplice)
    n = 20_000
    up = upstreams()
    body = httpx.Request("POST", "http://x/v1/chat/completions",
                         json={**CHAT, "max_tokens": n, "stream": True}).content
    with run_gateway(backends=[url_of(up)], edge=edge) as gw:
        port = int(gw.url.rsplit(":", 1)[1])
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", port))
            sock.settimeout(30)
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                         b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                         % (len(body), body))
            # Read nothing until the gateway's writes met the full buffer (direct writes: their
            # stop is counted; waited for, as a loaded machine may take more than a second to
            # send that much). Under ASGI uvicorn's `send` waits instead: nothing to wait for,
            # so a second of not reading.
            if edge:
                wait_for(lambda: bool(stops), 30, "the writes never met the full buffer")
            else:
                time.sleep(1.0)
            text = read_chunked_stream(sock)
        events = [e for e in text.split(b"\n\n") if e]
        assert sum(e.count(b'"content":" tok"') for e in events) == n
        assert events[-1] == b"data: [DONE]"
        assert up.aborted == 0
        assert gw.metric("llmserve_tpot_seconds_count") == 1
    # The direct writes met the full buffer (under ASGI, uvicorn's `send` waits instead).
    assert bool(stops) is edge


@pytest.mark.parametrize("usage", [False, True])
def test_direct_writes_and_asgi_give_the_same_stream(
    upstreams: UpstreamFactory, usage: bool
) -> None:
    # Same events, same headers, same usage handling, same ITL count either way.
    up = upstreams(token_delay_s=0.005)
    body = {**CHAT, "stream": True, **({"stream_options": {"include_usage": True}} if usage else {})}
    seen = {}
    for edge in (True, False):
        with run_gateway(backends=[url_of(up)], edge=edge) as gw:
            r = loopback.post(gw.url + "/v1/chat/completions", json=body,
                           headers={"x-request-id": "abc-123"})
            head = sorted((k, v) for k, v in r.headers.items() if k != "date")
            seen[edge] = ([e for e in r.text.split("\n\n") if e.strip()], head,
                          gw.metric("llmserve_itl_seconds_count"),
                          gw.metric("llmserve_output_tokens_total"))
    assert seen[True] == seen[False]
    events, head, itl, tokens = seen[True]
    assert ("x-request-id", "abc-123") in head and ("transfer-encoding", "chunked") in head
    assert events[-1] == "data: [DONE]"
    assert any('"usage"' in e for e in events) is usage
    assert (itl, tokens) == (6, 5)
