"""The request cycle the edge runs: uvicorn's, with less Python per request.

At a real decode pace the C relay makes each streamed event cheaper than vllm-router's; what kept the
gateway above it was per request (docs/benchmarks.md, issue 16). uvicorn's `RequestResponseCycle`
spends part of that on machinery a request seldom needs: an `asyncio.Event` per request (a Python
object, a coroutine per `receive`, a Python call per `set` from each parser callback), the body
copied into a bytearray and out again, and an eleven-keyword constructor. `EdgeCycle` keeps uvicorn's
contract, the attributes its protocol, the edge and `ChunkWriter` read and write (`disconnected`,
`response_started`, `response_complete`, `more_body`, `keep_alive`, `message_event.set()`), and its
`send` and `run_asgi` as they are. What changes is how a waiting `receive` is woken: from the
cycle's own state (is there body to hand over, did the client go), with a future made only when the
app really waits, which a request whose head and body arrive in one read never does.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from uvicorn._types import ASGIReceiveEvent, HTTPScope
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

_logger = logging.getLogger("uvicorn.error")
_access_logger = logging.getLogger("uvicorn.access")
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class EdgeCycle(RequestResponseCycle):
    """One request's cycle on an edge connection (gateway/edge.py builds it per request head)."""

    def __init__(self, scope: HTTPScope, transport: asyncio.Transport, flow: FlowControl,
                 default_headers: list[tuple[bytes, bytes]], keep_alive: bool,
                 expect_100_continue: bool, on_response: Callable[[], None],
                 access_log: bool = False) -> None:
        # Not super().__init__(): it makes the asyncio.Event this class exists to avoid. Every
        # attribute uvicorn's `send`, `run_asgi` and protocol read is set here.
        self.scope = scope
        self.transport = transport
        self.flow = flow
        self.logger = _logger
        self.access_logger = _access_logger
        self.access_log = access_log
        self.default_headers = default_headers
        # uvicorn's protocol and the edge call `message_event.set()` when anything a waiting
        # `receive` cares about changes (body, end of body, disconnect, response complete).
        self.message_event = self  # type: ignore[assignment]
        self.on_response = on_response
        self.disconnected = False
        self.keep_alive = keep_alive
        self.waiting_for_100_continue = expect_100_continue
        self.body = b""  # type: ignore[assignment]  # bytes until a second read appends
        self.more_body = True
        self.response_started = False
        self.response_complete = False
        self.chunked_encoding = None
        self.expected_content_length = 0
        self._waiter: asyncio.Future[None] | None = None
        self._last_given = False  # the message with more_body=False was handed to the app

    # -- the parser's side (EdgeProtocol.on_body / on_message_complete) ---------------------------

    def add_body(self, body: bytes) -> int:
        """Append a read of the body; the bytes now held (the protocol pauses reading above its
        high-water mark)."""
        held: bytes | bytearray = self.body
        if not held:
            self.body = body  # type: ignore[assignment]  # the usual case: one read, no copy
        else:
            if type(held) is bytes:  # a second read: a bytearray from here on (linear appends)
                held = self.body = bytearray(held)
            held += body
        self.set()
        return len(self.body)

    def end_body(self) -> None:
        self.more_body = False
        self.set()

    # -- message_event: what uvicorn's protocol and the edge call --------------------------------

    def set(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def clear(self) -> None:  # uvicorn's Event API; the state, not a flag, says what is ready
        pass

    # -- ASGI receive ----------------------------------------------------------------------------

    def _ready(self) -> bool:
        return (self.disconnected or self.response_complete or bool(self.body)
                or (not self.more_body and not self._last_given))

    async def receive(self) -> ASGIReceiveEvent:
        # As uvicorn's: 100 Continue when the app first asks for the body, then wait until there
        # is body to give, the body ended, or the request is over (disconnect, response sent).
        if self.waiting_for_100_continue and not self.transport.is_closing():
            self.transport.write(_CONTINUE)
            self.waiting_for_100_continue = False
        if not self._ready():
            self.flow.resume_reading()
            while not self._ready():
                self._waiter = asyncio.get_running_loop().create_future()
                try:
                    await self._waiter
                finally:
                    self._waiter = None
        if self.disconnected or self.response_complete:
            return {"type": "http.disconnect"}
        body: bytes | bytearray = self.body
        self.body = b""  # type: ignore[assignment]
        if not self.more_body:
            self._last_given = True
        return {"type": "http.request", "body": body if type(body) is bytes else bytes(body),
                "more_body": self.more_body}
