"""The streamed relay's fast lane: upstream SSE chunks written to the client from the read callback.

At a real decode pace every SSE event arrives alone, so whatever the relay does per chunk is paid
~65 times per request. Through ASGI an event costs: a future and a task wake-up for the reader, a
message dict, the middleware's `send` wrapper, uvicorn's `send` coroutine with its state checks,
and the chunked framing. Here the upstream transport's parser callback hands each chunk to a
`Splice`, which frames it and writes it to the client's socket itself: one Python call and one
`write` per event, with the proxy's task asleep until the stream ends (bench/paired_cpu.py; figures
in docs/benchmarks.md).

The head leaves with the first events in one write (`ClientWriter.start`, which also marks the
response started in the server's books). The final event (`[DONE]`, sent with `more_body=False`)
and any in-band error still go through ASGI `send`, so the server's own bookkeeping (keep-alive,
response completion) stays whole. The lane is only taken when the server offers a `ClientWriter`
in the scope (the gateway's edge protocol does; a test client or another server does not);
otherwise the relay pulls chunks and sends them through ASGI as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Protocol

from gateway.api.sse import DONE_EVENT, EVENT_END, USAGE_KEY, SseRelay

# A frame's last bytes when it holds whole events (an event's end, then the chunk's CRLF).
_FRAME_END = EVENT_END + b"\r\n"
_DONE_FRAME = DONE_EVENT + b"\r\n"
_HEX_DIGITS = b"0123456789abcdefABCDEF"

# The scope key under which a server offers a ClientWriter for the current request.
WRITER_KEY = "llmserve.client_writer"


class WriteFlow(Protocol):
    """The server's write-side flow control for one connection (uvicorn's FlowControl)."""

    write_paused: bool

    def drain(self) -> Awaitable[None]:
        """Until the client's socket buffer has room again (or the client is gone)."""
        ...


class ClientWriter(Protocol):
    """A server's direct response writes for the proxy's streamed relay (gateway/edge.py): the
    head with the first events (`start`), then raw chunks; the last chunk goes through ASGI.

    The Splice writes each framed chunk with `transport.write` itself and reads `flow.write_paused`
    after it: a method of this class in between would be one more Python call per event."""

    transport: asyncio.WriteTransport
    flow: WriteFlow
    # Called by the server when the client's connection drops (set by the proxy per request).
    lost: Callable[[], None] | None

    def can_start(self) -> bool:
        """No response started yet on a live connection, and not to a HEAD request."""
        ...

    def start(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> bool:
        """Write the head of a chunked response and its first chunk of body in one write (the
        server's own default headers included); the response is then the server's as if sent
        through ASGI. False when the client's buffer is full (wait on `flow.drain()`)."""
        ...


class Splice:
    """The sink the upstream transport feeds (transport.base.BodySink): relay, time, write.

    `gaps` collects the inter-token gaps as the pull path does (one per chunk, 0 for each further
    event in the same chunk). It stops being fed (returns False) at the chunk holding `[DONE]`,
    which it keeps in `final` for the proxy to send through ASGI, or when the client's buffer is
    full (`blocked`), for the proxy to wait on `drain` and push again.
    """

    __slots__ = ("_closing", "_feed", "_flow", "_now", "_relay", "_write", "blocked", "final",
                 "gaps", "last")

    def __init__(self, relay: SseRelay, writer: ClientWriter, gaps: list[float], last: float,
                 now: Callable[[], float]) -> None:
        self._relay = relay
        self._feed = relay.feed
        self._write = writer.transport.write
        self._closing = writer.transport.is_closing
        self._flow = writer.flow
        self._now = now
        self.gaps = gaps
        self.last = last
        self.final = b""
        self.blocked = False

    def frame(self, data: bytes, now: float) -> bool | None:
        """A read that may be one whole chunk frame (transport.base.FrameSink): the common case of
        `__call__`, with the upstream's own framing written through unchanged. None for anything
        else (several frames, a partial one, a chunk extension, usage, [DONE], a held event).
        Its tail repeats `__call__`'s on purpose: a shared helper is one more call per event."""
        end = data.find(b"\r\n", 0, 18)
        if (end <= 0 or not data.endswith(_FRAME_END) or self._relay.pending
                or USAGE_KEY in data or data.endswith(_DONE_FRAME)):
            return None
        size = data[:end]
        # Hex digits only, as HTTP/1.1 and the transport's parser require (int() would also take
        # a sign, spaces, underscores or 0x), and the size must be the payload's: the frame then
        # goes to the client as it came.
        if size.translate(None, _HEX_DIGITS) or int(size, 16) != len(data) - end - 4:
            return None
        self.gaps.append(now - self.last)
        self.last = now
        extra = data.count(EVENT_END, end + 2) - 1
        if extra > 0:
            self.gaps += [0.0] * extra
        if self._closing():
            return True  # as uvicorn's send: dropped; the disconnect cancels the relay
        self._write(data)
        if self._flow.write_paused:
            self.blocked = True
            return False
        return True

    def __call__(self, chunk: bytes) -> bool:
        # SseRelay.feed's common case inlined (whole events, no usage, not the end): the same four
        # C-level checks it makes, and one Python call less per event.
        if (self._relay.pending or not chunk.endswith(EVENT_END) or USAGE_KEY in chunk
                or chunk.endswith(DONE_EVENT)):
            out = self._feed(chunk)
            if not out:
                return True  # a partial event: held by the relay until its end arrives
        else:
            out = chunk
        t = self._now()
        self.gaps.append(t - self.last)
        self.last = t
        extra = out.count(EVENT_END) - 1  # a C scan of a short chunk
        if extra > 0:
            self.gaps += [0.0] * extra
        if self._relay.saw_done:
            self.final = out
            return False
        if self._closing():
            return True  # as uvicorn's send: dropped; the disconnect cancels the relay
        self._write(b"%x\r\n%b\r\n" % (len(out), out))
        if self._flow.write_paused:
            self.blocked = True
            return False
        return True
