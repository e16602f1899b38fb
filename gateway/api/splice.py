"""The streamed relay's per-event step, run from the upstream transport's read callback.

At a real decode pace every SSE event arrives alone, so the per-chunk work is paid once per token.
The transport hands each read's body to a `Splice` (`UpstreamResponse.push`); the proxy's task
sleeps until the stream ends, the client's buffer fills, or the splice holds something to send.
Where the server offers a `ClientWriter` in `scope["state"]` (the gateway's edge protocol does), the
splice writes each chunk, framed, to the client's connection itself; the head, the first and last
events and any in-band error go through ASGI `send`, so the server's bookkeeping stays whole.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from gateway.api.sse import DONE_EVENT, EVENT_END, FINISH_KEY, USAGE_KEY, Usage, stamp_fingerprint

# The key under which a server offers a ClientWriter in `scope["state"]`.
WRITER_KEY = "llmserve.client_writer"


class ClientWriter:
    """A client connection as the relay writes a chunked body to it (its head and end go through
    ASGI `send`): the transport, whether its write buffer is full (the edge protocol forwards
    `pause_writing` and `resume_writing`), whether it is lost, and a hang-up callback the proxy
    sets per request, so that no task has to wait on `receive()` for the disconnect. One per
    connection, offered to each of its requests in `scope["state"]`."""

    __slots__ = ("_writable", "closed", "lost", "transport", "write_paused")

    def __init__(self) -> None:
        # Set once the connection is made, before any request can see the writer.
        self.transport: asyncio.WriteTransport = None  # type: ignore[assignment]
        self.write_paused = False
        # True once the connection is lost: what is written then is dropped, as uvicorn's send.
        self.closed = False
        # Set by the proxy for the request it serves on this connection: cancels that request.
        self.lost: Callable[[], None] | None = None
        self._writable: asyncio.Future[None] | None = None

    async def drain(self) -> None:
        """Until the client's socket buffer has room again, or the connection is gone."""
        if self.write_paused:
            if self._writable is None:
                self._writable = asyncio.get_running_loop().create_future()
            # Shielded: one waiter's cancellation must not cancel the future another waits on.
            await asyncio.shield(self._writable)

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        writable, self._writable = self._writable, None
        if writable is not None and not writable.done():
            writable.set_result(None)

    def connection_lost(self) -> None:
        self.closed = True
        self.resume_writing()  # nothing waits for a buffer that will never drain
        if self.lost is not None:
            self.lost()


def whole_events(partial: bytes, chunk: bytes) -> tuple[bytes, bytes]:
    """The whole events that a held `partial` event and `chunk` make, and the partial event
    left after them (b"" when `chunk` ends an event)."""
    if partial:
        chunk = partial + chunk
    if chunk.endswith(EVENT_END):
        return chunk, b""
    cut = chunk.rfind(EVENT_END)
    if cut < 0:
        return b"", chunk
    return chunk[: cut + 2], chunk[cut + 2 :]


class Splice:
    """`feed` is the sink the upstream transport calls with each read's body.

    Chunks are forwarded as they arrive. Held back are only a trailing partial event, until its end
    arrives, the usage event the client did not ask for (api/sse.py), and, while that event is
    awaited, the terminal events (finish_reason set): vLLM moves `system_fingerprint` from the
    terminal events to the usage event when usage is asked for, so the gateway puts it back where
    the client, who did not ask, would have found it (`deferred`). Other events in a chunk with a
    terminal one go on at once: with n > 1 the other choices' tokens are not held.

    `gaps` has one entry per event: the TTFT first, then the gap since the previous chunk (0
    within a chunk). `feed` stops
    (returns False) at the chunk holding `[DONE]` (kept in `final`), when the client's buffer is
    full (`blocked`), and, until `write_directly`, at each chunk (kept in `held` for the task).
    """

    __slots__ = ("_stamp", "_write", "_writer", "blocked", "deferred", "final", "gaps", "held",
                 "last", "pending", "saw_done", "usage")

    # Set with `_write` by write_directly, and read only when it was.
    _writer: ClientWriter

    def __init__(self, started: float, strip_usage: bool, lenient_usage: bool = False) -> None:
        self.usage = Usage(strip_usage, lenient_usage)
        self._stamp = strip_usage
        self.deferred = b""
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
        self._writer = writer
        self._write = writer.transport.write

    def feed(self, chunk: bytes, now: float) -> bool:
        """Relay one read's body, which arrived at `now`; False: stop feeding me."""
        if self.pending or chunk[-2:] != EVENT_END:
            chunk, self.pending = whole_events(self.pending, chunk)
            if not chunk:
                return True  # a partial event: held until its end arrives
        # find(), not `in`: for bytes, `in` first tries its operand as an integer, and raises and
        # clears a TypeError on every call.
        if chunk.find(USAGE_KEY) >= 0:
            chunk = self._with_usage(chunk, now)
            if not chunk:
                return True  # the usage event alone, stripped
        else:
            self.gaps.append(now - self.last)
            self.last = now
            extra = chunk.count(EVENT_END) - 1
            if extra:
                self.gaps += [0.0] * extra
            if self._stamp and chunk.find(FINISH_KEY) >= 0:
                chunk = self._defer_terminal(chunk)
                if not chunk:
                    return True  # terminal events only: held until the usage event
        if chunk.endswith(DONE_EVENT):
            self.saw_done = True
            # Terminal events still deferred (an upstream that sent no usage) go before [DONE].
            self.final = self.deferred + chunk if self.deferred else chunk
            self.deferred = b""
            return False
        write = self._write
        if write is None:
            self.held = chunk
            return False
        writer = self._writer
        if writer.closed:
            return True  # as uvicorn's send: dropped; the disconnect cancels the relay
        write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
        if writer.write_paused:
            self.blocked = True
            return False
        return True

    def _with_usage(self, chunk: bytes, now: float) -> bytes:
        """A chunk holding a usage marker: the usage recorded (and its event dropped when the
        client did not ask for it), the gaps of the events left counted, and the deferred
        terminal events released before them, stamped with the usage event's fingerprint."""
        chunk = self.usage.take(chunk)
        if chunk:
            self.gaps.append(now - self.last)
            self.last = now
            extra = chunk.count(EVENT_END) - 1
            if extra:
                self.gaps += [0.0] * extra
        if self._stamp:
            chunk = self.deferred + chunk
            self.deferred = b""
            fingerprint = self.usage.fingerprint
            if fingerprint is not None and chunk.find(FINISH_KEY) >= 0:
                chunk = stamp_fingerprint(chunk, fingerprint)
        return chunk

    def _defer_terminal(self, chunk: bytes) -> bytes:
        """`chunk` (whole events) without its terminal events, which join `deferred` until the
        usage event brings the fingerprint. Only those are held: with n > 1 the other choices'
        events, in this chunk and after it, go on at once, and each choice's events stay in
        order (its terminal event is its last)."""
        rest: list[bytes] = []
        for event in chunk.split(EVENT_END)[:-1]:
            if event.find(FINISH_KEY) >= 0:
                self.deferred += event + EVENT_END
            else:
                rest.append(event + EVENT_END)
        return b"".join(rest)

    def flush(self) -> bytes:
        """At upstream EOF: the terminal events still deferred and whatever partial event is
        left (a well-formed stream leaves neither)."""
        rest = self.deferred + self.pending
        self.deferred = self.pending = b""
        return rest

    def take_deferred(self) -> bytes:
        """The terminal events still deferred (whole events): before an in-band error."""
        rest, self.deferred = self.deferred, b""
        return rest
