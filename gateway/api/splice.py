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

from gateway.api.sse import DONE_EVENT, EVENT_END, USAGE_KEY, Usage

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
    """The streamed relay's per-event step: `feed` is the sink the upstream transport calls with
    each read's body (transport.base.BodySink).

    Chunks are forwarded as they arrive (several events may share one chunk under load; that is a
    free win, not buffering). Only two things are ever held back: a trailing partial event, until
    its end arrives, so the client never sees half an event and the usage scan always sees whole
    events; and the usage event, when the gateway asked for usage on its own account and the
    client did not (api/sse.py).

    `gaps` holds one entry per event: the first is the time to it from `started` (the TTFT), each
    later one the gap since the previous chunk, stamped when its chunk arrived (0 for each further
    event in the same chunk). `feed` asks to stop (returns False) at the chunk holding `[DONE]`,
    which it keeps in `final`; when the client's buffer is full (`blocked`); and, until
    `write_directly` armed it, at each chunk of events, which it keeps in `held` for the task to
    send through ASGI.
    """

    __slots__ = ("_closing", "_flow", "_write", "blocked", "final", "gaps", "held", "last",
                 "pending", "saw_done", "usage")

    # Set with `_write` by write_directly, and read only when it was.
    _closing: Callable[[], bool]
    _flow: WriteFlow

    def __init__(self, started: float, strip_usage: bool) -> None:
        self.usage = Usage(strip_usage)
        self.pending = b""
        self.saw_done = False
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

    def feed(self, chunk: bytes, now: float) -> bool:
        """Relay one read's body, which arrived at `now`; False: stop feeding me."""
        if self.pending or chunk[-2:] != EVENT_END:
            chunk = self._whole_events(chunk)
            if not chunk:
                return True  # a partial event: held until its end arrives
        # find(), not `in`: for bytes, `in` first tries its operand as an integer, and raises and
        # clears a TypeError on every call.
        if chunk.find(USAGE_KEY) >= 0:
            chunk = self.usage.take(chunk)
            if not chunk:
                return True  # the usage event alone, stripped
        self.gaps.append(now - self.last)
        self.last = now
        extra = chunk.count(EVENT_END) - 1
        if extra:
            self.gaps += [0.0] * extra
        if chunk.endswith(DONE_EVENT):
            self.saw_done = True
            self.final = chunk
            return False
        write = self._write
        if write is None:
            self.held = chunk
            return False
        if self._closing():
            return True  # as uvicorn's send: dropped; the disconnect cancels the relay
        write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
        if self._flow.write_paused:
            self.blocked = True
            return False
        return True

    def flush(self) -> bytes:
        """At upstream EOF: whatever partial event is left (a well-formed stream leaves none)."""
        rest, self.pending = self.pending, b""
        return rest

    def _whole_events(self, chunk: bytes) -> bytes:
        """The whole events that `pending` and `chunk` make; keep the partial rest in `pending`."""
        if self.pending:
            chunk = self.pending + chunk
            self.pending = b""
        if chunk.endswith(EVENT_END):
            return chunk
        cut = chunk.rfind(EVENT_END)
        if cut < 0:
            self.pending = chunk
            return b""
        self.pending = chunk[cut + 2 :]
        return chunk[: cut + 2]
