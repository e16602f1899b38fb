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
from gateway.speedups import FrameSplice

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


class Splice(FrameSplice):
    """The sink the upstream transport feeds (transport.base.BodySink): relay, time, write.

    `gaps` collects the inter-token gaps as the pull path does (one per chunk, 0 for each further
    event in the same chunk). It stops being fed (returns False) at the chunk holding `[DONE]`,
    which it keeps in `final` for the proxy to send through ASGI, or when the client's buffer is
    full (`blocked`), for the proxy to wait on `drain` and push again.
    """

    # `frame`, the whole-frame entry, and the slots it reads are FrameSplice's (gateway/speedups.py:
    # C when built): an event that arrives as one whole frame runs no Python.
    __slots__ = ("_feed", "_now", "_relay", "final")

    def __init__(self, relay: SseRelay, writer: ClientWriter, gaps: list[float], last: float,
                 now: Callable[[], float]) -> None:
        self._relay = relay
        # Kept in step with the relay's partial event by __call__, the only feeder while armed.
        self.held = bool(relay.pending)
        self._feed = relay.feed
        self._write = writer.transport.write
        self._closing = writer.transport.is_closing
        self._flow = writer.flow
        self._now = now
        self.gaps = gaps
        self.last = last
        self.final = b""
        self.blocked = False

    def __call__(self, chunk: bytes) -> bool:
        # SseRelay.feed's common case inlined (whole events, no usage, not the end): the same four
        # C-level checks it makes, and one Python call less per event.
        relay = self._relay
        if (relay.pending or not chunk.endswith(EVENT_END) or USAGE_KEY in chunk
                or chunk.endswith(DONE_EVENT)):
            out = self._feed(chunk)
            self.held = bool(relay.pending)
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
        if relay.saw_done:
            self.final = out
            return False
        if self._closing():
            return True  # as uvicorn's send: dropped; the disconnect cancels the relay
        self._write(b"%x\r\n%b\r\n" % (len(out), out))
        if self._flow.write_paused:
            self.blocked = True
            return False
        return True
