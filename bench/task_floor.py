"""The floor of a task-per-request relay without uvicorn: httptools server protocol, one asyncio task
per request, the gateway's own `H1Transport` upstream.

Between `bench/floor_proxy.py` (bytes through protocol callbacks, no task, no parsing) and
`bench/asgi_floor.py` (uvicorn's request cycle and ASGI around the same transport), it isolates
what uvicorn's cycle costs: this does what any gateway does per request (parse the request, run a
task, post upstream, frame the response chunks) with no ASGI scope, messages or cycle object. In
`bench.paired_cpu` as `LABEL=@task-floor`.

    python -m bench.task_floor --port 9400 --upstream 127.0.0.1:9100
"""

from __future__ import annotations

import asyncio
import sys

import httptools

from bench.floor_proxy import floor_args
from gateway.settings import Timeouts
from gateway.transport.h1 import H1Transport

_HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
         b"transfer-encoding: chunked\r\n\r\n")


class _Client(asyncio.Protocol):
    def __init__(self, upstream: str, transport: H1Transport) -> None:
        self._upstream = upstream
        self._up = transport
        self._parser = httptools.HttpRequestParser(self)
        self._url = b""
        self._body: list[bytes] = []
        self.transport: asyncio.Transport | None = None
        self._task: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self._task is not None:
            self._task.cancel()

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            if self.transport is not None:
                self.transport.close()

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        body = b"".join(self._body)
        path = self._url.decode()
        self._url = b""
        self._body = []
        loop = asyncio.get_running_loop()
        if self._parser.get_method() == b"GET":  # readiness checks
            self._task = loop.create_task(self._get(path))
        else:
            self._task = loop.create_task(self._serve(path, body))

    async def _get(self, path: str) -> None:
        status, data = await self._up.get(self._upstream + path, 5)
        if self.transport is not None:
            self.transport.write(b"HTTP/1.1 %d OK\r\ncontent-length: %d\r\n\r\n%b"
                                 % (status, len(data), data))

    async def _serve(self, path: str, body: bytes) -> None:
        resp = await self._up.post(self._upstream + path, body,
                                   {"content-type": "application/json"}, streaming=True)
        t = self.transport
        try:
            first = True
            while chunk := await resp.readany():
                if t is None:
                    break
                frame = b"%x\r\n%b\r\n" % (len(chunk), chunk)
                t.write(_HEAD + frame if first else frame)
                first = False
        except BaseException:
            resp.close()
            raise
        resp.release()
        if t is not None:
            t.write(b"0\r\n\r\n" if not first else _HEAD + b"0\r\n\r\n")
        self._task = None


async def _serve(port: int, upstream: str) -> None:
    transport = H1Transport(Timeouts(connect_s=5, first_byte_s=60, idle_s=60, total_s=600))
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Client(f"http://{upstream}", transport),
                                      "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def main() -> int:
    args = floor_args("bench.task_floor", __doc__)
    import uvloop

    uvloop.run(_serve(args.port, args.upstream))
    return 0


if __name__ == "__main__":
    sys.exit(main())
