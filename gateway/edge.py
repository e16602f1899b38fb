"""The HTTP edge: what a hostile or slow client can make the gateway hold, bounded in the protocol.

uvicorn's httptools protocol has no cap on the request head (httptools joins a header value piece
by piece, so one 128 MB value costs quadratic copying on the event loop), no deadline for a head
or a body that never completes, and no cap on open connections (`limit_concurrency` is checked
only once a head is complete, so idle connections never meet it and hold their fds: measured with
limit_concurrency=300, 1,000 idle connections were all still open after 6 s, and /health got
uvicorn's text/plain 503 meanwhile, which fails a liveness probe). `EdgeProtocol` subclasses it and
enforces, before the parser sees the bytes:

- head size: bytes fed to the parser while a head is incomplete are counted, and the parser gets
  at most `max_head_bytes` of them (431);
- header count: checked as each header is parsed (431);
- head deadline: from the connection's opening (or the read that left a later head incomplete)
  to the end of the head (408, or a plain close for a connection that never sent a byte);
- body deadline: the longest gap between two body reads while the app waits for it (408);
- a response finished while the request body is still arriving (a 413 for an oversized chunked
  body, a 401 before a big upload) closes the connection instead of reading the rest;
- connections over `max_connections` are closed at accept, before they cost more than an fd.

A refusal is answered in OpenAI's JSON shape where the client can still read it, then the write
side is shut and input is dropped unparsed until the client closes, or for `_LINGER_S` or
`_LINGER_BYTES` at most: closing with unread input resets the connection at once, which can destroy
the answer before the client reads it.
Every refusal counts in `llmserve_edge_events{reason}` and logs at most one line per reason per
`log_interval_s`. `open_probe_listener` serves /health, /ready and /metrics on their own port, so
a flood of the API port cannot starve the kubelet's probes of connections.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import urllib.parse
from asyncio import TimerHandle
from collections.abc import Callable
from typing import Any, ClassVar, cast

import httptools
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.config import Config
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT, service_unavailable
from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)
from uvicorn.server import ServerState

from gateway.api.splice import WRITER_KEY
from gateway.edge_cycle import EdgeCycle
from gateway.errors import (
    GatewayError,
    HeadTooLarge,
    InvalidRequest,
    NotFound,
    RateLimitedLog,
    RequestTimeout,
    send_error,
)
from gateway.metrics import GatewayMetrics
from gateway.settings import EdgeSettings

log = logging.getLogger("gateway.edge")

REASONS = ("head_too_large", "too_many_headers", "head_timeout", "body_timeout", "body_unread",
           "connection_cap", "bad_request")
# How long a refused connection's input is read and dropped before the reset (see the docstring).
_LINGER_S = 0.5
_LINGER_BYTES = 256 * 1024
PROBE_PATHS = frozenset({"/health", "/ready", "/metrics"})


class Edge:
    """Limits and bookkeeping shared by every connection of a process."""

    def __init__(self, settings: EdgeSettings, metrics: GatewayMetrics) -> None:
        self.settings = settings
        # Children made up front: each reason is exported (at 0) before it first happens.
        self._counters = {r: metrics.edge_events.labels(r) for r in REASONS}
        # One limiter per reason: a flood of one kind must not hide the first line of another.
        self._logs = {r: RateLimitedLog(log, settings.log_interval_s, burst=1) for r in REASONS}

    def event(self, reason: str, client: tuple[str, int] | None, detail: str = "") -> None:
        self._counters[reason].inc()
        self._logs[reason].warning(
            "edge: %s from %s%s", reason, f"{client[0]}:{client[1]}" if client else "?",
            f" ({detail})" if detail else "")


def check_fd_limit(settings: EdgeSettings) -> None:
    """Warn when the process cannot open `max_connections` sockets plus room for upstream
    connections and the probes: then fd exhaustion, not the cap, decides who gets refused."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and settings.max_connections + 1024 > soft:
        log.warning("GATEWAY_EDGE__MAX_CONNECTIONS=%d leaves less than 1024 of the %d file "
                    "descriptors this process may open (ulimit -n) for upstreams and probes",
                    settings.max_connections, soft)


class _Refused(Exception):
    """Raised inside a parser callback to stop parsing; feed_data re-raises it as the context of
    an HttpParserCallbackError."""

    def __init__(self, reason: str, error: GatewayError) -> None:
        super().__init__(reason)
        self.reason = reason
        self.error = error


class ChunkWriter:
    """What the proxy's streamed relay needs to write a response itself (api/splice.py's
    ClientWriter), on one of uvicorn's request cycles: `start` writes the head and the first
    events and marks the response started in the cycle; the relay then writes the chunked framing
    with the cycle's transport, exactly what `send` would have written; the last chunk goes
    through the cycle's `send`, which completes the response in uvicorn's books. `lost` is how
    the edge tells the proxy that the client hung up (connection_lost)."""

    __slots__ = ("_cycle", "flow", "lost", "transport")

    def __init__(self, cycle: RequestResponseCycle) -> None:
        self._cycle = cycle
        self.flow = cycle.flow
        self.transport = cycle.transport
        self.lost: Callable[[], None] | None = None  # the proxy's hang-up callback

    def done(self) -> bool:
        return bool(self._cycle.response_complete)

    def can_start(self) -> bool:
        c = self._cycle
        return not (c.response_started or c.disconnected or c.scope["method"] == "HEAD")

    def start(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> bool:
        # What the cycle's `send` does for a response head without Content-Length (uvicorn 0.5x,
        # httptools_impl.RequestResponseCycle.send), less the per-header regex checks, which
        # guard app-supplied headers and these are the proxy's own; then the body's first chunk.
        # The gateway runs without uvicorn's access log, which `send` would also write.
        c = self._cycle
        c.response_started = True
        c.waiting_for_100_continue = False
        c.chunked_encoding = True
        content = [STATUS_LINE[status]]
        for name, value in (*c.default_headers, *headers):
            content += (name, b": ", value, b"\r\n")
        if not c.keep_alive:
            content.append(b"connection: close\r\n")
        content.append(b"transfer-encoding: chunked\r\n\r\n%x\r\n" % len(body))
        content += (body, b"\r\n")
        self.transport.write(b"".join(content))
        return not self.flow.write_paused


class EdgeProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the edge's limits (module docstring). Bind an `Edge` with
    `EdgeProtocol.bound(edge)`: uvicorn builds protocols from a class and fixed arguments."""

    edge: ClassVar[Edge]

    @classmethod
    def bound(cls, edge: Edge) -> type[EdgeProtocol]:
        return cast("type[EdgeProtocol]", type("BoundEdgeProtocol", (cls,), {"edge": edge}))

    def __init__(self, config: Config, server_state: ServerState, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__(config, server_state, app_state, _loop)
        s = self.edge.settings
        self._max_head = s.max_head_bytes
        self._max_headers = s.max_headers
        self._head_room = s.max_head_bytes  # head bytes the parser may still be fed
        self._in_head = True  # between two requests a connection waits for a head
        self._head_begun = False  # the parser saw the first byte of the awaited head
        self._heads = 0  # heads completed, to tell whether a feed completed one
        self._timer: TimerHandle | None = None
        self._body_at = 0.0  # loop time of the last body read (or of the end of the head)
        self._refused = False
        self._linger_room = 0
        self._writers: list[ChunkWriter] = []  # offered to the proxy, one per request
        self._idle_since: float | None = None  # loop time the last response ended, while idle

    # -- connection ------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        if len(self.connections) > self.edge.settings.max_connections:
            self.edge.event("connection_cap", self.client, f"{len(self.connections) - 1} open")
            self._refused = True
            self.transport.abort()  # nothing was asked, nothing to answer: free the fd now
            return
        self._arm(self.edge.settings.head_timeout_s, self._head_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)
        if self.timeout_keep_alive_task is not None:
            # Dropped now: a pending keep-alive timer would hold this protocol for up to a timeout.
            self.timeout_keep_alive_task.cancel()
            self.timeout_keep_alive_task = None
        for writer in self._writers:
            if writer.lost is not None:
                writer.lost()  # a proxied request still running: cancel it

    def data_received(self, data: bytes) -> None:
        if self._refused:  # lingering: drop what the client still sends, up to a point
            self._linger_room -= len(data)
            if self._linger_room < 0:
                self.transport.abort()
            return
        self._unset_keepalive_if_required()
        if self._in_head:
            room = self._head_room
            if len(data) > room:
                # Feed the parser only up to the cap; if the head ended inside it, the rest is
                # body (or the next request) and is fed as usual.
                view = memoryview(data)
                self._head_room = 0
                heads = self._heads
                if not self._feed(view[:room]):
                    return
                if self._heads == heads:
                    self._refuse("head_too_large", HeadTooLarge(
                        f"request head exceeds {self._max_head} bytes"))
                    return
                if self._feed(view[room:]):
                    self._deadlines()
                return
            self._head_room = room - len(data)
        if self._feed(data):
            self._deadlines()

    def _deadlines(self) -> None:
        # Armed only when a read leaves a head or a body incomplete: a request that arrives whole
        # (the usual case) costs no timer at all.
        if self._timer is not None or self._refused:
            return
        if self._in_head:
            if self._head_begun:
                self._arm(self.edge.settings.head_timeout_s, self._head_timeout)
        elif self.cycle.more_body and not self.cycle.response_complete:
            self._body_at = self.loop.time()
            self._arm(self.edge.settings.body_timeout_s, self._body_timeout)

    def _feed(self, data: bytes | memoryview) -> bool:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # No WebSocket routes; uvicorn's own handling (a warning, then plain HTTP).
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
        except httptools.HttpParserError as exc:
            refused = exc.__context__
            if isinstance(refused, _Refused):
                self._refuse(refused.reason, refused.error)
            else:
                self._refuse("bad_request", InvalidRequest(f"invalid HTTP request: {exc}"))
            return False
        return True

    # -- parser callbacks ------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_begun = True

    def on_header(self, name: bytes, value: bytes) -> None:
        # uvicorn's on_header plus the count (copied, not super(): this runs once per header).
        if len(self.headers) >= self._max_headers:
            raise _Refused("too_many_headers",
                           HeadTooLarge(f"request has more than {self._max_headers} headers"))
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_100_continue = True
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._head_begun = False
        self._heads += 1
        self._disarm()
        # uvicorn's on_headers_complete (0.5x), with an EdgeCycle (gateway/edge_cycle.py) for
        # uvicorn's cycle and the writer put in the scope before the app's task first runs.
        parser = self.parser
        scope = self.scope
        http_version = parser.get_http_version()
        scope["method"] = parser.get_method().decode("ascii")
        if http_version != "1.1":
            scope["http_version"] = http_version
        if parser.should_upgrade() and self._should_upgrade():
            return
        url = httptools.parse_url(self.url)
        raw_path = url.path
        path = raw_path.decode("ascii")
        if "%" in path:
            path = urllib.parse.unquote(path)
        scope["path"] = self.root_path + path
        scope["raw_path"] = self.root_path.encode("ascii") + raw_path
        scope["query_string"] = url.query or b""
        app = self.app
        limit = self.limit_concurrency
        if limit is not None and (len(self.connections) >= limit or len(self.tasks) >= limit):
            app = service_unavailable
            self.logger.warning("Exceeded concurrency limit.")
        running = self.cycle
        cycle = self.cycle = EdgeCycle(
            scope, self.transport, self.flow, self.server_state.default_headers,
            http_version != "1.0" and parser.should_keep_alive(), self.expect_100_continue,
            self.on_response_complete, self.access_log)
        writer = ChunkWriter(cycle)
        scope[WRITER_KEY] = writer  # type: ignore[literal-required]
        # Pipelined requests queue behind the one running: each may need telling.
        self._writers = [w for w in self._writers if not w.done()]
        self._writers.append(writer)
        if running is None or running.response_complete:
            self._start_asgi_task(cycle, app)
        else:
            self.flow.pause_reading()
            self.pipeline.appendleft((cycle, app))

    def on_body(self, body: bytes) -> None:
        self._body_at = self.loop.time()
        cycle = self.cycle
        if (self.parser.should_upgrade() and self._should_upgrade()) or cycle.response_complete:
            return
        if cast(EdgeCycle, cycle).add_body(body) > HIGH_WATER_LIMIT:
            self.flow.pause_reading()

    def on_message_complete(self) -> None:
        self._disarm()
        self._in_head = True
        self._head_room = self._max_head
        cycle = self.cycle
        if (self.parser.should_upgrade() and self._should_upgrade()) or cycle.response_complete:
            return
        cast(EdgeCycle, cycle).end_body()

    def on_response_complete(self) -> None:
        if self.cycle.more_body and not self.pipeline and not self.transport.is_closing():
            # Answered before the body was all read (a 413 on a chunked body, a 401): reading the
            # rest only to keep the connection would let the client make us read it all.
            self.cycle.keep_alive = False
            self.edge.event("body_unread", self.client)
            self._linger()
            return
        # uvicorn's on_response_complete (0.5x), with the keep-alive timer below.
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self._idle_since = None
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
            return
        self._idle_since = self.loop.time()
        if self.timeout_keep_alive_task is None:
            self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive,
                                                                self._keep_alive_check)

    # -- keep-alive ------------------------------------------------------------------------------
    # uvicorn arms a new keep-alive timer after every response and cancels it on the next read: a
    # timer made and dropped per request. Here one timer per connection wakes lazily: a response's
    # end records when the connection went idle, any read marks it busy, and the timer closes it
    # only after a whole timeout idle, re-arming for the rest otherwise.

    def _unset_keepalive_if_required(self) -> None:
        # uvicorn calls this on every read (and the edge's data_received does): busy again.
        self._idle_since = None

    def _keep_alive_check(self) -> None:
        self.timeout_keep_alive_task = None
        since = self._idle_since
        if since is None or self.transport.is_closing():
            return  # busy: the next response's end arms the timer again
        left = since + self.timeout_keep_alive - self.loop.time()
        if left > 0:
            self.timeout_keep_alive_task = self.loop.call_later(left, self._keep_alive_check)
            return
        self.transport.close()  # uvicorn's timeout_keep_alive_handler

    # -- deadlines -------------------------------------------------------------------------------

    def _arm(self, delay: float, callback: Any) -> None:
        self._disarm()
        self._timer = self.loop.call_later(delay, callback)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _head_timeout(self) -> None:
        self._timer = None
        if self.transport.is_closing() or not self._in_head:
            return
        started = self._head_room < self._max_head  # some of this head arrived
        self._refuse("head_timeout", RequestTimeout(
            f"request head not received within {self.edge.settings.head_timeout_s:g} s"),
            answer=started)

    def _body_timeout(self) -> None:
        self._timer = None
        cycle = self.cycle
        if self.transport.is_closing() or cycle is None or not cycle.more_body:
            return
        timeout = self.edge.settings.body_timeout_s
        if self.flow.read_paused or cycle.response_started:
            # The app is not reading, or has answered: any delay is not the client's.
            self._arm(timeout, self._body_timeout)
            return
        idle = self.loop.time() - self._body_at
        if idle < timeout:
            self._arm(timeout - idle, self._body_timeout)
            return
        self._refuse("body_timeout", RequestTimeout(
            f"request body stalled for {self.edge.settings.body_timeout_s:g} s"))

    # -- refusals --------------------------------------------------------------------------------

    def send_400_response(self, msg: str) -> None:
        # uvicorn's text/plain 400 (invalid request), in OpenAI's shape.
        self._refuse("bad_request", InvalidRequest(msg))

    def _refuse(self, reason: str, error: GatewayError, *, answer: bool = True) -> None:
        self._refused = True
        self._disarm()
        self.edge.event(reason, self.client, error.message)
        cycle = self.cycle
        in_progress = cycle is not None and not cycle.response_complete
        if in_progress:
            # The app's request ends here: it sees a disconnect; its response, if any, is dropped.
            cycle.disconnected = True
            cycle.message_event.set()
        if not answer:
            self.transport.close()  # nothing was sent, nothing to answer: no reason to linger
            return
        if not (in_progress and cycle.response_started):
            self.transport.write(_raw_response(error, self.server_state.default_headers))
        self._linger()

    def _linger(self) -> None:
        # The answer and a FIN go out now. Input is still read (and dropped, unparsed), so a client
        # that reads the answer and closes frees the connection at once; one that keeps sending
        # is reset after _LINGER_BYTES more, or after _LINGER_S.
        self._refused = True
        self._linger_room = _LINGER_BYTES
        self.flow.resume_reading()
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(_LINGER_S, self.transport.abort)


def _raw_response(error: GatewayError, default_headers: list[tuple[bytes, bytes]]) -> bytes:
    body = error.body()
    out = [STATUS_LINE[error.status]]
    for name, value in (*default_headers, *error.headers(),
                        (b"content-length", str(len(body)).encode()), (b"connection", b"close")):
        out += [name, b": ", value, b"\r\n"]
    out += [b"\r\n", body]
    return b"".join(out)


class ProbeApp:
    """The probe listener's app: the gateway's own /health, /ready and /metrics, nothing else."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in PROBE_PATHS:
            await send_error(send, NotFound("the probe port serves /health, /ready and /metrics"))
            return
        await self.app(scope, receive, send)


async def open_probe_listener(config: Config, edge: Edge, app: ASGIApp, app_state: dict[str, Any],
                              host: str, port: int) -> tuple[asyncio.Server, ServerState]:
    """Listen on `port` with the edge's limits, but with its own connection set: API connections
    do not count against the probes' cap, and uvicorn's shutdown leaves these open for the drain."""
    state = ServerState()
    probe = EdgeProtocol.bound(edge)

    def factory() -> asyncio.Protocol:
        protocol = probe(config=config, server_state=state, app_state=app_state)
        protocol.app = ProbeApp(app)
        return protocol

    server = await asyncio.get_running_loop().create_server(factory, host=host, port=port,
                                                            backlog=config.backlog)
    return server, state
