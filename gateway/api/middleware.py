"""Pure ASGI middleware: request id, body limit. Not `BaseHTTPMiddleware`, which buffers through an
anyio stream (breaking SSE pass-through, hiding `http.disconnect`); anything that wraps `send`
runs once per SSE event, so each class touches only the messages it must.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Awaitable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import PayloadTooLarge, send_error


class RequestIdMiddleware:
    """Take the client's X-Request-Id or mint one; echo it on the response; expose it in scope."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        # A per-process random prefix and a counter: unique, and cheaper than uuid4.
        self._prefix = os.urandom(6).hex()
        self._seq = itertools.count(1)

    # A plain function handing back the inner app's awaitable, as app.FastLane.
    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        if scope["type"] != "http":
            return self.app(scope, receive, send)
        rid: bytes | None = None
        for k, v in scope["headers"]:
            if k == b"x-request-id":
                # Bound and sanitise: it is echoed into our logs and response headers.
                rid = bytes(c for c in v[:128] if 33 <= c < 127) or None
                break
        if rid is None:
            rid = f"{self._prefix}-{next(self._seq)}".encode()
        scope.setdefault("state", {})["request_id"] = rid.decode()
        header = (b"x-request-id", rid)

        # Runs once per SSE event (when the relay sends through ASGI): no coroutine of its own.
        def send_with_id(message: Message) -> Awaitable[None]:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), header]
            return send(message)

        return self.app(scope, receive, send_with_id)


class BodyLimitMiddleware:
    """Refuse bodies over `max_bytes`: a declared Content-Length over it before the app sees it,
    an undeclared (chunked) body by counting what arrives.

    The 413 closes the connection; the rest of the body is read and dropped first, up to
    `discard_bytes` in all: a client that writes its whole body before reading (async HTTP
    clients do) would otherwise find the connection reset under the answer. A body declared
    larger than that is answered at once.

    A Content-Length within the limit is trusted: httptools (gateway/edge/) delivers exactly that
    many body bytes and refuses a head with Transfer-Encoding beside it or a second
    Content-Length. (h11, whose Transfer-Encoding wins, would need the count for every body.)"""

    def __init__(self, app: ASGIApp, max_bytes: int, discard_bytes: int = 0) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.discard_bytes = discard_bytes

    # A plain function, as RequestIdMiddleware's: most requests need no frame here.
    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        if scope["type"] != "http":
            return self.app(scope, receive, send)
        limit = self.max_bytes
        for k, v in scope["headers"]:
            if k == b"content-length":
                if not v.isdigit():
                    break  # the server's parser refuses it; counted below all the same
                if int(v) > limit:
                    # Declared too large: the app never sees it.
                    return self._refuse(receive, send, True, 0, int(v) <= self.discard_bytes)
                # Within the limit: the parser delivers exactly that many bytes, nothing to count.
                return self.app(scope, receive, send)
        return self._counted(scope, receive, send)

    async def _counted(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A body of undeclared length (chunked): counted as it arrives."""
        limit = self.max_bytes
        received = 0
        more = True  # more body to come after what was received

        async def counting_receive() -> Message:
            nonlocal received, more
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                more = message.get("more_body", False)
                if received > limit:
                    raise self._too_large()
            return message

        # `send` is not wrapped (a call per SSE event). The proxy lets PayloadTooLarge escape
        # (its body read is this receive); FastAPI's handlers would answer it themselves.
        try:
            await self.app(scope, counting_receive, send)
        except PayloadTooLarge:
            await self._refuse(receive, send, more, received, True)

    async def _refuse(self, receive: Receive, send: Send, more: bool, received: int,
                      drain: bool) -> None:
        """The 413. With `drain`, the rest of the body (`more` of it to come) is read and
        dropped first, up to discard_bytes in all, and the answer closes the connection. A body
        left unread (past the bound) is the server's to cut: the edge protocol drops a little
        more input after the answer, then closes (gateway/edge/)."""
        while drain and more and received <= self.discard_bytes:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left: nobody to answer
            received += len(message.get("body", b""))
            more = message.get("more_body", False)
        await send_error(send, self._too_large(), [] if more else [(b"connection", b"close")])

    def _too_large(self) -> PayloadTooLarge:
        return PayloadTooLarge(f"request body exceeds the limit of {self.max_bytes} bytes")

