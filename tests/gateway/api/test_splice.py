"""The streamed relay's fast lane (gateway/api/splice.py): the sink on its own, and through a real
gateway with a client that reads slowly and with a server that offers no direct writer."""

from __future__ import annotations

import socket
import time

import httpx
import pytest

from gateway.api import stream
from gateway.api.splice import Splice
from gateway.api.sse import SseRelay
from tests.gateway.conftest import ClientWriter, UpstreamFactory, run_gateway, url_of

CHAT = {"model": "demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}


def splice(writer: ClientWriter, gaps: list[float], clock: list[float]) -> Splice:
    return Splice(SseRelay(strip_usage=True), writer, gaps, 0.0,  # type: ignore[arg-type]
                  lambda: clock[0])


def test_whole_events_are_written_and_timed_partial_ones_held() -> None:
    w, gaps, clock = ClientWriter(), [], [0.0]
    s = splice(w, gaps, clock)
    clock[0] = 0.02
    assert s(b"data: a\n\n") is True
    clock[0] = 0.05
    assert s(b"data: b") is True  # half an event: nothing written, no gap yet
    assert w.written == [b"data: a\n\n"]
    clock[0] = 0.06
    assert s(b"\n\ndata: c\n\n") is True  # the end of b and all of c, in one read
    assert w.written == [b"data: a\n\n", b"data: b\n\ndata: c\n\n"]
    assert gaps == pytest.approx([0.02, 0.04, 0.0])


def test_a_held_partial_event_makes_frame_refuse_until_its_end_came() -> None:
    # `frame` (C when built) reads `held`, not the relay: __call__, the only feeder while the
    # splice is armed, keeps the two in step. A whole frame after half an event must not jump it.
    w, gaps, clock = ClientWriter(), [], [0.0]
    relay = SseRelay(strip_usage=True)
    relay.feed(b"data: early")  # held before the splice was made (the first read's tail)
    s = Splice(relay, w, gaps, 0.0, lambda: clock[0])  # type: ignore[arg-type]
    assert s.held
    assert s.frame(b"9\r\ndata: x\n\n\r\n", 0.01) is None  # refused: parsed, in order
    assert s(b"\n\n") is True and not s.held
    assert w.written == [b"data: early\n\n"]
    assert s(b"data: b") is True and s.held  # half of the next one
    assert s.frame(b"9\r\ndata: y\n\n\r\n", 0.02) is None
    assert s(b"\n\n") is True and not s.held
    assert s.frame(b"9\r\ndata: z\n\n\r\n", 0.03) is True  # nothing held: taken whole
    assert w.written == [b"data: early\n\n", b"data: b\n\n", b"data: z\n\n"]


def test_done_is_kept_for_asgi_and_usage_stripped() -> None:
    w, gaps, clock = ClientWriter(), [], [0.0]
    s = splice(w, gaps, clock)
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}\n\n'
    assert s(b"data: a\n\n") is True
    assert s(usage + b"data: [DONE]\n\n") is False  # stop: the proxy sends the end itself
    assert s.final == b"data: [DONE]\n\n" and not s.blocked
    assert w.written == [b"data: a\n\n"]
    assert s._relay.completion_tokens == 2


def test_a_full_client_buffer_stops_the_feed_after_writing() -> None:
    w, gaps, clock = ClientWriter(room=2), [], [0.0]
    s = splice(w, gaps, clock)
    assert s(b"data: a\n\n") is True
    assert s(b"data: b\n\n") is False  # written, but the buffer is full now
    assert s.blocked and w.written == [b"data: a\n\n", b"data: b\n\n"]


def test_a_whole_frame_is_written_as_it_came_and_timed() -> None:
    w, gaps, clock = ClientWriter(), [], [0.0]
    s = splice(w, gaps, clock)
    frame = b"0012\r\ndata: a\n\ndata: B\n\n\r\n"  # leading zeros are valid HTTP/1.1
    assert s.frame(frame, 0.02) is True
    assert w.frames == [frame]
    assert s.frame(b"9\r\ndata: c\n\n\r\n", 0.05) is True
    assert w.written == [b"data: a\n\ndata: B\n\n", b"data: c\n\n"]
    assert gaps == pytest.approx([0.02, 0.0, 0.03])  # the second event of a frame arrived with it


@pytest.mark.parametrize("read", [
    b"9\r\ndata: a\n\n\r\n9\r\ndata: b\n\n\r\n",  # two frames: the parser's
    b"9\r\ndata: a\n\n",  # half a frame
    b"9;x=1\r\ndata: a\n\n\r\n",  # a chunk extension
    b"+9\r\ndata: a\n\n\r\n",  # int() takes these; HTTP/1.1 does not
    b"0x9\r\ndata: a\n\n\r\n",
    b" 9\r\ndata: a\n\n\r\n",
    b"8\r\ndata: a\n\n\r\n",  # the size is not the payload's
    b"7\r\ndata: a\r\n",  # not whole events
    b"f\r\ndata: [DONE]\n\n\r\n",  # the end: the proxy sends it itself
    b'1a\r\ndata: {"usage":null}\n\n\r\n',  # usage: recorded by the relay
    b"0\r\n\r\n",  # the last chunk
])
def test_anything_but_one_frame_of_plain_events_is_left_to_the_parser(read: bytes) -> None:
    w, gaps, clock = ClientWriter(), [], [0.0]
    s = splice(w, gaps, clock)
    assert s.frame(read, 0.02) is None
    assert w.frames == [] and gaps == []


def test_a_frame_after_half_an_event_is_left_to_the_parser() -> None:
    w, gaps, clock = ClientWriter(), [], [0.0]
    s = splice(w, gaps, clock)
    assert s(b"data: a") is True  # held by the relay until its end arrives
    assert s.frame(b"9\r\ndata: b\n\n\r\n", 0.02) is None


def test_a_whole_frame_to_a_full_buffer_stops_the_feed() -> None:
    w, gaps, clock = ClientWriter(room=1), [], [0.0]
    s = splice(w, gaps, clock)
    assert s.frame(b"9\r\ndata: a\n\n\r\n", 0.02) is False
    assert s.blocked and w.written == [b"data: a\n\n"]


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


def test_a_client_that_reads_slowly_gets_every_event(
    upstreams: UpstreamFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Far more than the socket buffers hold, sent by the upstream at once: the gateway's writes
    # to the stalled client fill its buffer, the fast lane stops, waits for the drain, resumes.
    stops = []

    class CountingSplice(Splice):
        # Either entry may be the one that meets the full buffer: a read that is one whole frame
        # goes to `frame`, any other to `__call__`.
        def __call__(self, chunk: bytes) -> bool:
            going = super().__call__(chunk)
            if self.blocked and not going:
                stops.append(1)
            return going

        def frame(self, data: bytes, now: float) -> bool | None:
            more = super().frame(data, now)
            if self.blocked and more is False:
                stops.append(1)
            return more

    monkeypatch.setattr(stream, "Splice", CountingSplice)
    n = 20_000
    up = upstreams()
    body = httpx.Request("POST", "http://x/v1/chat/completions",
                         json={**CHAT, "max_tokens": n, "stream": True}).content
    with run_gateway(backends=[url_of(up)]) as gw:
        port = int(gw.url.rsplit(":", 1)[1])
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", port))
            sock.settimeout(30)
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                         b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                         % (len(body), body))
            time.sleep(1.0)  # read nothing while the upstream has sent it all
            text = read_chunked_stream(sock)
        events = [e for e in text.split(b"\n\n") if e]
        assert sum(e.count(b'"content":" tok"') for e in events) == n
        assert events[-1] == b"data: [DONE]"
        assert up.aborted == 0
        assert gw.metric("llmserve_tpot_seconds_count") == 1
    assert stops, "the client's buffer never filled: the test did not exercise back-pressure"


@pytest.mark.parametrize("usage", [False, True])
def test_fast_lane_and_asgi_relay_give_the_same_stream(
    upstreams: UpstreamFactory, usage: bool
) -> None:
    # `edge=False`: uvicorn's plain protocol offers no writer, so the proxy pulls and sends each
    # chunk through ASGI. Same events, same usage handling, same ITL count either way.
    up = upstreams(token_delay_s=0.005)
    body = {**CHAT, "stream": True, **({"stream_options": {"include_usage": True}} if usage else {})}
    seen = {}
    for edge in (True, False):
        with run_gateway(backends=[url_of(up)], edge=edge) as gw:
            r = httpx.post(gw.url + "/v1/chat/completions", json=body,
                           headers={"x-request-id": "abc-123"})
            # The fast lane writes the head itself: the same headers as uvicorn's send writes
            # (its date and server too), the request id echoed as RequestIdMiddleware does.
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
