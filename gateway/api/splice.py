"""The streamed relay's per-event step, run from the upstream transport's read callback.

At a real decode pace every SSE event arrives alone, so whatever the relay does per chunk is paid
~65 times per request. The upstream transport hands each read's body to a `Splice` from its read
callback (`UpstreamResponse.push`); the proxy's task sleeps until the stream ends, the client's
buffer fills, or the splice holds something for the task to send.

Where the server offers a `ClientWriter` in `scope["state"]` (the gateway's edge protocol), the
splice frames each chunk and writes it to the client's connection itself: one Python call and one
`write` per event, no future, task wake-up or ASGI `send`. The response head, the first events, the final
event and any in-band error always go through ASGI `send`, so the server's own bookkeeping
(response started, keep-alive, completion) stays whole. Without a writer the splice hands each
chunk back to the task, which sends it through ASGI.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Protocol

from gateway.api.sse import EVENT_END, SseRelay

# The key under which a server offers a ClientWriter in `scope["state"]`.
WRITER_KEY = "llmserve.client_writer"


class WriteFlow(Protocol):
    """The server's write-side flow control for one connection."""

    write_paused: bool

    def drain(self) -> Awaitable[None]:
        """Until the client's socket buffer has room again (or the client is gone)."""
        ...


class ClientWriter(Protocol):
    """What a server offers for direct writes of a response's body (gateway/edge/writer.py): the
    connection's transport (asyncio's `pause_writing`/`resume_writing` make `flow`), and a hook
    for a hang-up.

    The relay writes only chunks of a chunked response whose head went through ASGI `send`, and
    ends it through `send` too."""

    transport: asyncio.WriteTransport
    flow: WriteFlow
    # Called by the server when the client's connection drops (set by the proxy per request).
    lost: Callable[[], None] | None


class Splice:
    """The sink the upstream transport feeds (transport.base.BodySink): relay, time, write.

    `gaps` holds one entry per event: the first is the time to it from `started` (the TTFT), each
    later one the gap since the previous chunk, stamped when its chunk arrived (0 for each further
    event in the same chunk). The splice stops being fed (returns False) at the chunk holding
    `[DONE]`, which it keeps in `final`; when the client's buffer is full (`blocked`); and, until
    `write_directly` armed it, at each chunk of events, which it keeps in `held` for the task to
    send through ASGI.
    """

    __slots__ = ("_closing", "_feed", "_flow", "_now", "_relay", "_write", "blocked", "final",
                 "gaps", "held", "last")

    # Set with `_write` by write_directly, and read only when it was.
    _closing: Callable[[], bool]
    _flow: WriteFlow

    def __init__(self, relay: SseRelay, started: float, now: Callable[[], float]) -> None:
        self._relay = relay
        self._feed = relay.feed
        self._now = now
        self._write: Callable[[bytes], object] | None = None
        self.gaps: list[float] = []
        self.last = started
        self.final = b""
        self.held = b""
        self.blocked = False

    def write_directly(self, writer: ClientWriter) -> None:
        """From now on write each chunk to the client's connection (the head was sent)."""
        self._closing = writer.transport.is_closing
        self._flow = writer.flow
        self._write = writer.transport.write

    def __call__(self, chunk: bytes) -> bool:
        out = self._feed(chunk)
        if not out:
            return True  # a partial event: held by the relay until its end arrives
        t = self._now()
        self.gaps.append(t - self.last)
        self.last = t
        extra = out.count(EVENT_END) - 1  # a C scan of a short chunk
        if extra > 0:
            self.gaps += [0.0] * extra
        if self._relay.saw_done:
            self.final = out
            return False
        if self._write is None:
            self.held = out
            return False
        if self._closing():
            return True  # as uvicorn's send: dropped; the disconnect cancels the relay
        self._write(b"%x\r\n%b\r\n" % (len(out), out))
        if self._flow.write_paused:
            self.blocked = True
            return False
        return True
