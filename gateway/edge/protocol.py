"""uvicorn's httptools protocol with the edge's limits, enforced before the parser sees the bytes.

- head size: the parser gets at most `max_head_bytes` of an incomplete head (431);
- header count: headers past `max_headers` are not kept, and the head is refused (431);
- chunked body framing (chunk sizes, extensions, trailers): at most `max_head_bytes` of it in a
  row, counted as reads of a body that bring no body data (431); httptools keeps a trailer's value
  whole, copying it at every read;
- head deadline: from the connection's opening (or the read that left a later head incomplete)
  to the end of the head (408, or a plain close for a connection that never sent a byte);
- body deadline: the longest gap between two reads of a body the app is reading (408);
- a response finished while the request body still arrives (a 307 for a trailing slash, a 401,
  a 404 that needs no body): a rest of known length up to `_LINGER_BYTES` is read and dropped,
  so the connection serves the client's next request (clients reuse it, unwarned); a longer or
  chunked rest closes the connection instead of reading it (a 413 before a big upload);
- connections over `max_connections` are closed at accept;
- a request with an `Upgrade` header (or CONNECT): httptools skips its body and drops the rest of
  the read it came in, so one with a body is refused (400), and one without is answered as plain
  HTTP with `connection: close`, nothing after its head being parsed.

Deadlines are armed only when a read leaves a head or a body incomplete. A refusal is answered
where the client can still read it, then input is dropped until the client closes (or for
`_LINGER_S` / `_LINGER_BYTES`): closing with unread input would reset the answer away.

uvicorn copies `app_state` into every request's `scope["state"]`: that is how a request finds its
connection's `ClientWriter` (api/splice.py). The protocol's own state has class-private names, so
that no attribute a later uvicorn adds can collide with it.
"""

from __future__ import annotations

import asyncio
from asyncio import TimerHandle
from collections.abc import Callable
from typing import Any, ClassVar, cast

from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from gateway.api.splice import WRITER_KEY, ClientWriter
from gateway.edge.limits import Edge, raw_response
from gateway.errors import GatewayError, HeadTooLarge, InvalidRequest, RequestTimeout

_LINGER_S = 0.5
_LINGER_BYTES = 256 * 1024


class EdgeProtocol(HttpToolsProtocol):
    """Bind an `Edge` with `EdgeProtocol.bound(edge)`: uvicorn builds protocols from a class and
    fixed arguments."""

    edge: ClassVar[Edge]

    @classmethod
    def bound(cls, edge: Edge) -> type[EdgeProtocol]:
        return cast("type[EdgeProtocol]", type("BoundEdgeProtocol", (cls,), {"edge": edge}))

    def __init__(self, config: Config, server_state: ServerState, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.__writer = ClientWriter()
        super().__init__(config, server_state, {**app_state, WRITER_KEY: self.__writer}, _loop)
        s = self.edge.settings
        self.__loop = _loop or asyncio.get_running_loop()
        self.__state = server_state
        self.__transport: asyncio.Transport = None  # type: ignore[assignment]  # at connection_made
        self.__max_head = s.max_head_bytes
        self.__max_headers = s.max_headers
        self.__head_room = s.max_head_bytes  # head bytes the parser may still be fed
        self.__in_head = True  # between two requests a connection waits for a head
        self.__head_begun = False  # the parser saw the first byte of the awaited head
        self.__headers = 0  # headers of the head being parsed
        self.__in_body = False  # a head was dispatched and its body has not all arrived
        self.__heads = 0  # heads dispatched to the app
        self.__answered = 0  # responses complete
        self.__timer: TimerHandle | None = None
        self.__body_at = 0.0  # loop time of the last body read (or of the end of the head)
        self.__refused = False
        self.__deferred: bytes | None = None  # a refusal's answer, due after the running response
        self.__linger_room = 0
        self.__last = False  # the head of the connection's last request was parsed
        self.__framing = 0  # bytes of the body's reads since the last one with body data
        self.__body_read = False  # the read being parsed brought body data
        self.__body_bytes = 0  # body bytes of the request being read
        self.__draining = False  # reading the rest of an answered request's body, to drop it
        self.__idle = False  # the timer is the idle deadline after a dropped rest
        self.__keep_alive_s = config.timeout_keep_alive

    # -- the connection (asyncio's callbacks) ----------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.__transport = self.__writer.transport = transport
        if len(self.__state.connections) > self.edge.settings.max_connections:
            self.__refused = True
            self.edge.event("connection_cap", self.__peer(),
                            f"{len(self.__state.connections) - 1} open")
            transport.abort()  # nothing was asked, nothing to answer: free the fd now
            return
        self.__arm(self.edge.settings.head_timeout_s, self.__head_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.__disarm()
        self.__writer.connection_lost()  # a proxied request still running is cancelled

    def pause_writing(self) -> None:
        super().pause_writing()
        self.__writer.pause_writing()

    def resume_writing(self) -> None:
        super().resume_writing()
        self.__writer.resume_writing()

    def data_received(self, data: bytes) -> None:
        if self.__refused or self.__last:  # drop what the client still sends, up to a point
            self.__linger_room -= len(data)
            if self.__linger_room < 0:
                self.__transport.abort()
            return
        if self.__in_body:
            self.__body_at = self.__loop.time()
        if not self.__in_head:
            super().data_received(data)
            self.__count_framing(len(data))
        elif len(data) <= self.__head_room:
            self.__head_room -= len(data)
            super().data_received(data)
        else:
            # Feed the parser only up to the cap; if the head ended inside it, the rest is body
            # (or the next request) and is fed as usual.
            view = memoryview(data)
            room, self.__head_room = self.__head_room, 0
            heads = self.__heads
            super().data_received(view[:room])  # type: ignore[arg-type]
            if self.__refused or self.__transport.is_closing():
                return
            if self.__heads == heads:
                if self.__headers > self.__max_headers:
                    self.__refuse_too_many_headers()
                else:
                    self.__refuse("head_too_large", HeadTooLarge(
                        f"request head exceeds {self.__max_head} bytes"))
                return
            super().data_received(view[room:])  # type: ignore[arg-type]
        self.__arm_deadline()

    # -- the parser's callbacks (httptools') -----------------------------------------------------

    def on_message_begin(self) -> None:
        if self.__refused:
            return
        super().on_message_begin()
        if self.__idle:  # the idle deadline after a dropped rest (__rest_dropped) ends here
            self.__disarm()
        self.__head_begun = True
        self.__headers = 0

    def on_header(self, name: bytes, value: bytes) -> None:
        self.__headers += 1
        if self.__headers <= self.__max_headers:
            super().on_header(name, value)
        # Past the cap a header is not kept; the head is refused when it ends (or at its cap).

    def on_headers_complete(self) -> None:
        self.__in_head = self.__head_begun = False
        self.__disarm()
        if self.__refused:
            return
        if self.__headers > self.__max_headers:
            self.__refuse_too_many_headers()
            return
        upgrade = self.parser.should_upgrade()
        if upgrade and self.__has_body():
            self.__refuse("bad_request", InvalidRequest(
                "a request with a body cannot carry an Upgrade header: the gateway speaks "
                "HTTP/1.1 only (curl: no --http2 on an http:// URL)"))
            return
        self.__heads += 1
        self.__in_body = True
        self.__body_bytes = 0
        super().on_headers_complete()
        if upgrade:
            # The rest of this read is lost to the parser, so nothing after this head is parsed:
            # the request is answered, announcing the close, and the connection closes.
            self.__last = True
            self.__linger_room = _LINGER_BYTES
            self.cycle.keep_alive = False

    def on_body(self, body: bytes) -> None:
        if not self.__refused:
            self.__body_read = True
            self.__body_bytes += len(body)
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self.__refused:
            return
        self.__in_body = False
        self.__in_head = True
        self.__head_room = self.__max_head
        self.__disarm()
        super().on_message_complete()
        if self.__draining:
            self.__rest_dropped()

    # -- uvicorn's own hooks ---------------------------------------------------------------------

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self.__answered += 1
        if self.__transport.is_closing() or self.__answered < self.__heads:
            return
        if self.__deferred is not None:
            self.__transport.write(self.__deferred)
            self.__deferred = None
            self.__linger()
        elif self.__in_body and not self.__refused:
            rest = self.__rest()
            if rest is not None and rest <= _LINGER_BYTES:
                # Answered before a small body was all read (a 307 for a trailing slash): the
                # rest is read and dropped (uvicorn drops body bytes after the response), and the
                # connection kept. The client was not told to close it, and reuses it: a close
                # here would fail its next request (a redirect followed on the same connection).
                self.__draining = True
                self.__body_at = self.__loop.time()
                self.__arm(self.edge.settings.body_timeout_s, self.__body_timeout)
                return
            # A large or chunked rest (a 413, a 401 before a big upload): reading it only to keep
            # the connection would let the client make us read it all.
            self.edge.event("body_unread", self.__peer())
            self.__linger()

    def __rest(self) -> int | None:
        # Body bytes still to come of the request being read, if its head declared a length
        # (uvicorn's list of its headers, names lower-cased).
        for name, value in self.headers:
            if name == b"content-length":
                return int(value) - self.__body_bytes
        return None

    def __rest_dropped(self) -> None:
        # The rest of an answered body is read: the connection is idle, as after any response.
        # (uvicorn's keep-alive timer, armed at the response, was cancelled by the rest's reads.)
        self.__draining = False
        self.__arm(self.__keep_alive_s, self.__idle_timeout)
        self.__idle = True

    def __idle_timeout(self) -> None:
        self.__timer = None
        self.__idle = False
        if not self.__transport.is_closing() and self.__in_head and not self.__head_begun:
            self.__transport.close()

    def send_400_response(self, msg: str) -> None:
        # uvicorn's answer to a request httptools cannot parse: text/plain there, OpenAI's JSON
        # here, counted and lingered like every refusal. (Not again for the bytes behind a head
        # already refused, which the parser still reads to the end of that feed.)
        if not self.__refused:
            self.__refuse("bad_request", InvalidRequest(f"invalid HTTP request: {msg}"))

    # -- deadlines -------------------------------------------------------------------------------

    def __arm_deadline(self) -> None:
        # After a read: a deadline only for a head or a body that this read left incomplete.
        if self.__timer is not None or self.__refused:
            return
        if self.__in_head:
            if self.__head_begun:
                self.__arm(self.edge.settings.head_timeout_s, self.__head_timeout)
        elif self.__in_body and (self.__answered < self.__heads or self.__draining):
            self.__body_at = self.__loop.time()
            self.__arm(self.edge.settings.body_timeout_s, self.__body_timeout)

    def __arm(self, delay: float, callback: Callable[[], None]) -> None:
        self.__disarm()
        self.__timer = self.__loop.call_later(delay, callback)

    def __disarm(self) -> None:
        self.__idle = False
        if self.__timer is not None:
            self.__timer.cancel()
            self.__timer = None

    def __head_timeout(self) -> None:
        self.__timer = None
        if self.__transport.is_closing() or not self.__in_head:
            return
        started = self.__head_room < self.__max_head  # some of this head arrived
        self.__refuse("head_timeout", RequestTimeout(
            f"request head not received within {self.edge.settings.head_timeout_s:g} s"),
            answer=started)

    def __body_timeout(self) -> None:
        self.__timer = None
        if (self.__transport.is_closing() or not self.__in_body
                or (self.__answered >= self.__heads and not self.__draining)):
            return
        timeout = self.edge.settings.body_timeout_s
        if not self.__transport.is_reading():
            # uvicorn paused reading: the app is not taking the body, so the wait is not the
            # client's doing.
            self.__arm(timeout, self.__body_timeout)
            return
        idle = self.__loop.time() - self.__body_at
        if idle < timeout:
            self.__arm(timeout - idle, self.__body_timeout)
            return
        if self.__draining:
            # The rest of an answered body stalled: nothing is left to answer, and nothing unread.
            self.edge.event("body_timeout", self.__peer(), "the rest of an answered body stalled")
            self.__transport.close()
            return
        self.__refuse("body_timeout", RequestTimeout(f"request body stalled for {timeout:g} s"))

    # -- refusals --------------------------------------------------------------------------------

    def __peer(self) -> tuple[str, int] | None:
        peer = self.__transport.get_extra_info("peername")
        return (str(peer[0]), int(peer[1])) if isinstance(peer, tuple) else None

    def __count_framing(self, n: int) -> None:
        # After a read of a body: one that brought body data (or ended the body) ends the run of
        # framing (whatever framing it also held, a read's worth at most, goes uncounted).
        if self.__body_read or not self.__in_body:
            self.__body_read, self.__framing = False, 0
            return
        if self.__refused:
            return
        self.__framing += n
        if self.__framing > self.__max_head:
            self.__refuse("head_too_large", HeadTooLarge(
                f"chunk sizes, extensions or trailers exceed {self.__max_head} bytes"))

    def __has_body(self) -> bool:
        # uvicorn's list of the head's headers; the parser already refused a malformed length.
        return any(name == b"transfer-encoding" or (name == b"content-length" and int(value) > 0)
                   for name, value in self.headers)

    def __refuse_too_many_headers(self) -> None:
        self.__refuse("too_many_headers",
                      HeadTooLarge(f"request has more than {self.__max_headers} headers"))

    def __refuse(self, reason: str, error: GatewayError, *, answer: bool = True) -> None:
        self.__refused = True
        self.__linger_room = _LINGER_BYTES  # input is dropped from here on, up to a point
        self.__disarm()
        self.edge.event(reason, self.__peer(), error.message)
        if not answer:
            self.__transport.close()  # nothing was sent, nothing to answer: no reason to linger
            return
        response = raw_response(error, self.__state.default_headers)
        if self.__answered < self.__heads and not self.__in_body:
            # Requests ahead of the refused one are still being answered: its answer follows
            # theirs, in order (on_response_complete).
            self.__deferred = response
            return
        # Nothing is being answered, or the app still waits for this request's body (the body
        # deadline): the refusal is the answer, and the app sees the disconnect at the close.
        self.__transport.write(response)
        self.__linger()

    def __linger(self) -> None:
        # The answer and a FIN go out now. Input is still read (and dropped, unparsed), so a client
        # that reads the answer and closes frees the connection at once; one that keeps sending
        # is reset after _LINGER_BYTES more, or after _LINGER_S.
        self.__refused = True
        self.__linger_room = _LINGER_BYTES
        transport = self.__transport
        if not transport.is_reading():
            transport.resume_reading()
        if transport.can_write_eof():
            transport.write_eof()
        self.__loop.call_later(_LINGER_S, transport.abort)
