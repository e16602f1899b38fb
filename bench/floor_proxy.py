"""The floor of a Python relay: the least any proxy written in Python on uvloop can cost per stream.

Not a product and not a gateway: it forwards each request's bytes unchanged to a pooled keep-alive
upstream connection and each upstream read unchanged to the client, with no parsing beyond finding
where a request and a response end (Content-Length or the chunked terminator), no SSE relay, no
metrics, no admission, no routing, no timeouts. Whatever a real gateway in Python does, it does
at least this: one `data_received` and one `write` per upstream read, in asyncio's protocol
callbacks. Run beside vllm-router in `bench.paired_cpu` (`LABEL=@floor`): if this costs about as
much CPU per request as the Rust router, no trim of the gateway's Python can reach 1.0x; the
interpreter has to leave the per-event path.

    python -m bench.floor_proxy --port 9200 --upstream 127.0.0.1:9100
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections import deque

_HEAD_END = b"\r\n\r\n"
_CHUNKED_END = b"0\r\n\r\n"


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


class _Upstream(asyncio.Protocol):
    """One keep-alive upstream connection; relays every read to the current client."""

    def __init__(self, idle: deque[_Upstream]) -> None:
        self._idle = idle
        self.transport: asyncio.Transport | None = None
        self.client: _Client | None = None
        self._head = b""
        self._tail = b""
        self._in_head = True
        self._chunked = False
        self._left = 0  # body bytes still due (Content-Length)
        self._reusable = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.client is not None:
            self.client.transport.close()

    def begin(self, client: _Client, request: bytes) -> None:
        self.client = client
        self._head = self._tail = b""
        self._in_head = True
        assert self.transport is not None
        self.transport.write(request)

    def data_received(self, data: bytes) -> None:
        client = self.client
        if client is None:
            return
        client.transport.write(data)
        if self._in_head:
            self._head += data
            end = self._head.find(_HEAD_END)
            if end < 0:
                return
            head = self._head[:end].lower()
            self._in_head = False
            self._chunked = b"chunked" in head
            self._reusable = b"connection: close" not in head
            if not self._chunked:
                self._left = _content_length(head) - (len(self._head) - end - 4)
            data = self._head
        elif not self._chunked:
            self._left -= len(data)
        if self._chunked:
            # The terminator may straddle reads: keep the last 4 bytes of all read so far.
            joined = self._tail + data
            ended = joined.endswith(_CHUNKED_END)
            self._tail = joined[-4:]
        else:
            ended = self._left <= 0
        if ended:
            self.client = None
            if self._reusable:
                self._idle.append(self)
            elif self.transport is not None:
                self.transport.close()
            client.done()


class _Client(asyncio.Protocol):
    """One client connection: buffer a request until it is whole, then hand it upstream."""

    def __init__(self, upstream: tuple[str, int], idle: deque[_Upstream]) -> None:
        self._upstream = upstream
        self._idle = idle
        self._buf = b""
        self._busy = False
        self._connecting: asyncio.Task[None] | None = None  # kept: the loop holds tasks weakly
        self.transport: asyncio.Transport = None  # type: ignore[assignment]

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._buf += data
        self._next()

    def done(self) -> None:
        self._busy = False
        self._next()

    def _next(self) -> None:
        if self._busy:
            return
        end = self._buf.find(_HEAD_END)
        if end < 0:
            return
        total = end + 4 + _content_length(self._buf[:end])
        if len(self._buf) < total:
            return
        request, self._buf = self._buf[:total], self._buf[total:]
        self._busy = True
        while self._idle:
            up = self._idle.pop()
            if up.transport is not None and not up.transport.is_closing():
                up.begin(self, request)
                return
        self._connecting = asyncio.get_running_loop().create_task(self._connect(request))

    async def _connect(self, request: bytes) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, up = await loop.create_connection(lambda: _Upstream(self._idle), *self._upstream)
        except OSError:
            self.transport.close()  # no upstream: the client sees the connection end
            return
        up.begin(self, request)


async def serve(port: int, upstream: tuple[str, int]) -> None:
    idle: deque[_Upstream] = deque()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Client(upstream, idle), "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def floor_args(module: str, doc: str | None) -> argparse.Namespace:
    """The floors' command line (this one, bench.asgi_floor, bench.task_floor): port, upstream."""
    p = argparse.ArgumentParser(prog=f"python -m {module}", description=doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, required=True, help="port to listen on (127.0.0.1)")
    p.add_argument("--upstream", required=True, metavar="HOST:PORT", help="the upstream server")
    return p.parse_args()


def main() -> int:
    args = floor_args("bench.floor_proxy", __doc__)
    host, _, up_port = args.upstream.rpartition(":")
    import uvloop

    uvloop.run(serve(args.port, (host, int(up_port))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
