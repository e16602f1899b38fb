"""The upstream transport: a lean HTTP/1.1 client on asyncio + httptools. The rest of the
gateway knows it as `gateway.transport.Transport` and the `UpstreamResponse` it returns.

httptools (the parser uvicorn uses) calls back per body chunk, that is per SSE event; this client
collects the chunks in a list and hands each socket read to the reader once, however many events
it held. It speaks what the gateway needs from an engine: keep-alive POST/GET, Content-Length or
chunked responses, a pool per origin, back-pressure, and an abort that drops the TCP connection so
vLLM stops generating.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

import httptools

from gateway.errors import UpstreamFailed, UpstreamTimeout
from gateway.settings import Timeouts
from gateway.transport.deadline import Deadline

# Takes one body chunk and the loop time it arrived; returns False to stop being fed (the chunk
# itself is consumed either way).
BodySink = Callable[[bytes, float], bool]

# Unread upstream bytes held per stream before we stop reading the socket (back-pressure).
_HIGH_WATER = 256 * 1024


class _Conn(asyncio.Protocol):
    """One upstream connection; carries one request at a time."""

    __slots__ = ("_buffered", "_chunks", "_complete", "_error", "_head", "_keep_alive", "_loop",
                 "_parser", "_paused", "_pool", "_sink", "_sink_stopped", "_time", "_waiter",
                 "deadline", "got_bytes", "on_body", "status", "transport")

    def __init__(self, pool: _Pool) -> None:
        self._pool = pool
        self._loop = pool.loop
        self._time = pool.loop.time
        self.transport: asyncio.Transport | None = None
        self.status = 0
        # The body chunks parsed and not yet consumed. httptools calls the protocol's `on_body`
        # per chunk (an SSE event, at a real pace): the list's own append keeps Python out of it.
        self._chunks: list[bytes] = []
        self.on_body = self._chunks.append
        # The parser calls back into this connection, and this connection holds it: a cycle, so
        # it exists only while the connection is open (made in connection_made, dropped in
        # connection_lost) and the connection is freed by reference counting once closed.
        self._parser: httptools.HttpResponseParser | None = None
        self._buffered = 0  # bytes read while nobody was pushing, for back-pressure
        self._paused = False
        self._complete = False
        self._keep_alive = False
        self._error: str | None = None
        self._head: asyncio.Future[None] | None = None
        self._waiter: asyncio.Future[None] | None = None
        self.got_bytes = False
        self.deadline: Deadline | None = None
        # Push mode (`push`): each read's body goes straight to this sink from data_received.
        self._sink: BodySink | None = None
        self._sink_stopped = False

    # -- asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        self._parser = httptools.HttpResponseParser(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._parser = None
        if not self._complete and self._error is None:
            self._error = "connection closed by the replica"
        self._wake()

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        parser = self._parser
        assert parser is not None  # reads come only between connection_made and connection_lost
        try:
            parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._error = f"malformed response from the replica: {exc}"
            self.abort()
        chunks = self._chunks
        sink = self._sink
        if sink is None:
            # Pull mode: wake the reader; stop reading while too much waits unread.
            self._wake()
            self._buffered += len(data)
            if self._buffered > _HIGH_WATER and not self._paused and self.transport is not None:
                self._paused = True
                self.transport.pause_reading()
            return
        # Push mode: the reader sleeps through the stream; the sink gets what this read carried
        # as one chunk (one downstream write per upstream read, however many SSE events a burst
        # packed into it), with the time it arrived.
        if chunks:
            body = b"".join(chunks)  # one chunk: itself, not a copy
            chunks.clear()
            now = self._time()
            d = self.deadline
            if d is not None:
                d.last = now
                d.got_first = True
            if not sink(body, now):
                self._sink = None
                self._sink_stopped = True
                self._wake()
                return
        if self._complete or self._error is not None:
            self._wake()

    # -- httptools callbacks ---------------------------------------------------------------------

    def on_headers_complete(self) -> None:
        parser = self._parser
        assert parser is not None  # called from data_received's feed_data
        self.status = parser.get_status_code()
        # Asked here: once the message completes the parser resets and forgets the answer.
        self._keep_alive = parser.should_keep_alive()
        if self._head is not None and not self._head.done():
            self._head.set_result(None)

    def on_message_complete(self) -> None:
        self._complete = True

    # -- used by the response --------------------------------------------------------------------

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)
        h = self._head
        if h is not None and not h.done() and self._error is not None:
            h.set_result(None)

    def start(self, request: bytes,
              heads: list[tuple[bytes, bytes]] | None = None) -> asyncio.Future[None]:
        self.status = 0
        self._chunks.clear()
        self._buffered = 0
        self._complete = False
        self._error = None
        self.got_bytes = False
        assert self.transport is not None
        # Response headers are collected only when asked for (`heads`): the completion path
        # reads none, and a callback per header would cost it on every request.
        self._parser = httptools.HttpResponseParser(self if heads is None else _Heads(self, heads))
        self._head = self._loop.create_future()
        self.transport.write(request)
        return self._head

    def failure(self) -> Exception:
        d = self.deadline
        if d is not None and d.expired is not None:
            return UpstreamTimeout(f"upstream timed out: {d.expired}")
        return UpstreamFailed(f"upstream failed: {self._error}")

    async def readany(self) -> bytes:
        while True:
            chunks = self._chunks
            if chunks:
                body = b"".join(chunks)  # one chunk: itself, not a copy
                chunks.clear()
                self._buffered = 0
                if self._paused and self.transport is not None:
                    self._paused = False
                    self.transport.resume_reading()
                d = self.deadline
                if d is not None:
                    d.last = self._time()
                    d.got_first = True
                return body
            if self._complete:
                return b""
            if self._error is not None:
                raise self.failure()
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    async def push(self, sink: BodySink) -> None:
        while True:
            if self._chunks:
                # What arrived while nobody was pushing goes first, as one chunk.
                data = await self.readany()
                if not sink(data, self._time()):
                    return
                continue
            if self._complete:
                return
            if self._error is not None:
                raise self.failure()
            self._sink = sink
            self._sink_stopped = False
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
                self._sink = None
            if self._sink_stopped:
                return

    def reusable(self) -> bool:
        return (self._complete and self.transport is not None and not self._chunks
                and self._keep_alive)

    def abort(self) -> None:
        if self.transport is not None:
            # abort(), not close(): drop the connection now so the engine sees the disconnect.
            self.transport.abort()
            self.transport = None
        if self._error is None and not self._complete:
            self._error = "aborted"


class _Heads:
    """The parser's callbacks of a connection, plus one that collects the response's headers."""

    __slots__ = ("_conn", "heads", "on_body", "on_headers_complete", "on_message_complete")

    def __init__(self, conn: _Conn, heads: list[tuple[bytes, bytes]]) -> None:
        self._conn = conn
        self.heads = heads
        self.on_body = conn.on_body
        self.on_headers_complete = conn.on_headers_complete
        self.on_message_complete = conn.on_message_complete

    def on_header(self, name: bytes, value: bytes) -> None:
        self.heads.append((name.lower(), value))


class H1Response:
    __slots__ = ("_conn", "_done", "headers", "push", "readany", "status")

    def __init__(self, conn: _Conn, headers: list[tuple[bytes, bytes]] | None = None) -> None:
        self._conn = conn
        self.status = conn.status
        # The response's headers (names lower-case), when the request asked for them.
        self.headers: list[tuple[bytes, bytes]] = headers if headers is not None else []
        self.readany = conn.readany  # bound once: the per-chunk call skips one attribute lookup
        self.push = conn.push
        self._done = False

    async def read(self) -> bytes:
        parts = []
        try:
            while chunk := await self._conn.readany():
                parts.append(chunk)
        except BaseException:
            self.close()
            raise
        self.release()
        return b"".join(parts)

    def close(self) -> None:
        if not self._done:
            self._done = True
            c = self._conn
            if c.deadline is not None:
                c.deadline.cancel()
            c.abort()

    def release(self) -> None:
        if not self._done:
            self._done = True
            c = self._conn
            if c.deadline is not None:
                c.deadline.cancel()
            if c.reusable():
                c._pool.put(c)
            else:
                c.abort()


class _Pool:
    """Idle keep-alive connections to one origin (host:port)."""

    def __init__(self, host: str, port: int, loop: asyncio.AbstractEventLoop) -> None:
        self.host = host
        self.port = port
        self.loop = loop
        self.idle: deque[_Conn] = deque()
        self.opened = 0  # connections this pool opened: with keep-alive, few per many requests

    def put(self, conn: _Conn) -> None:
        conn.deadline = None
        self.idle.append(conn)

    def get_idle(self) -> _Conn | None:
        while self.idle:
            conn = self.idle.pop()  # most recently used: least likely to have timed out
            if conn.transport is not None and not conn.transport.is_closing():
                return conn
        return None

    async def connect(self, timeout_s: float) -> _Conn:
        try:
            async with asyncio.timeout(timeout_s):
                _, proto = await self.loop.create_connection(
                    lambda: _Conn(self), self.host, self.port
                )
        except TimeoutError:
            raise UpstreamFailed(
                f"upstream unreachable: connect to {self.host}:{self.port} timed out"
            ) from None
        except OSError as exc:
            raise UpstreamFailed(
                f"upstream unreachable: {self.host}:{self.port}: {exc.strerror or exc}"
            ) from None
        self.opened += 1
        return proto

    def close(self) -> None:
        while self.idle:
            self.idle.pop().abort()


class H1Transport:
    def __init__(self, timeouts: Timeouts) -> None:
        self._timeouts = timeouts
        self._pools: dict[str, tuple[_Pool, bytes, str]] = {}

    def connections_opened(self) -> int:
        """Upstream connections opened so far (read at scrape time; pools live as long as this)."""
        return sum(pool.opened for pool, _, _ in self._pools.values())

    def _pool(self, url: str) -> tuple[_Pool, bytes, str]:
        """(pool, Host header value, path) for a URL; pools are cached per origin."""
        parts = urlsplit(url)
        origin = f"{parts.scheme}://{parts.netloc}"
        entry = self._pools.get(origin)
        if entry is None:
            if parts.scheme != "http" or not parts.hostname:
                raise UpstreamFailed(f"unsupported upstream URL {url!r} (only http://host:port)")
            pool = _Pool(parts.hostname, parts.port or 80, asyncio.get_running_loop())
            entry = (pool, parts.netloc.encode(), "")
            self._pools[origin] = entry
        path = parts.path or "/"
        return entry[0], entry[1], path + (f"?{parts.query}" if parts.query else "")

    async def _send(
        self, method: bytes, url: str, body: bytes, headers: Mapping[str, str], t: Timeouts,
        heads: list[tuple[bytes, bytes]] | None = None,
    ) -> _Conn:
        pool, host, path = self._pool(url)
        head = [b"%s %s HTTP/1.1\r\nhost: %s\r\ncontent-length: %d\r\n"
                % (method, path.encode(), host, len(body))]
        for k, v in headers.items():
            head.append(f"{k}: {v}\r\n".encode("latin-1"))
        request = b"".join(head) + b"\r\n" + body

        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        conn: _Conn | None = None
        in_head = True

        def expire() -> None:
            if in_head:
                # Still waiting for the head: this task is parked in _send, cancel it.
                if task is not None:
                    task.cancel()
            elif conn is not None:
                conn.abort()
                conn._wake()

        deadline = Deadline(loop, t, expire)
        try:
            # A pooled connection may have been closed by the replica while idle; if it dies
            # before sending a single byte, the request never reached the engine: use a new one.
            conn = pool.get_idle()
            for fresh in (conn is None, True):
                if conn is None:
                    conn = await pool.connect(t.connect_s)
                conn.deadline = deadline
                if heads is not None:
                    heads.clear()  # a retry on a fresh connection: its head only
                await conn.start(request, heads)
                if conn.status or conn.got_bytes or fresh:
                    break
                conn = None
            assert conn is not None
            in_head = False
        except asyncio.CancelledError:
            if conn is not None:
                conn.abort()
            if deadline.expired is not None:
                raise UpstreamTimeout(f"upstream timed out: {deadline.expired}") from None
            deadline.cancel()
            raise
        except BaseException:
            deadline.cancel()
            raise
        if not conn.status:
            deadline.cancel()
            conn.abort()
            raise conn.failure()
        return conn

    async def post(
        self, url: str, body: bytes, headers: Mapping[str, str], *, streaming: bool
    ) -> H1Response:
        t = self._timeouts
        if not streaming:
            # A non-streamed answer sends its first byte only after the last token.
            t = t.model_copy(update={"first_byte_s": t.total_s})
        return H1Response(await self._send(b"POST", url, body, headers, t))

    async def request(
        self, method: str, url: str, body: bytes, headers: Mapping[str, str], *, streaming: bool
    ) -> H1Response:
        t = self._timeouts
        if not streaming:
            t = t.model_copy(update={"first_byte_s": t.total_s})
        heads: list[tuple[bytes, bytes]] = []
        conn = await self._send(method.encode("ascii"), url, body, headers, t, heads)
        return H1Response(conn, heads)

    async def get(self, url: str, timeout_s: float) -> tuple[int, bytes]:
        t = Timeouts(connect_s=timeout_s, first_byte_s=timeout_s, idle_s=timeout_s,
                     total_s=timeout_s)
        try:
            resp = H1Response(await self._send(b"GET", url, b"", {}, t))
            body = await resp.read()
        except (UpstreamFailed, UpstreamTimeout) as exc:
            raise UpstreamFailed(f"GET {url}: {exc.message}") from None
        return resp.status, body

    async def close(self) -> None:
        for pool, _, _ in self._pools.values():
            pool.close()
        self._pools.clear()
