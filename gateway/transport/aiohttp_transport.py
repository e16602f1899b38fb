"""Upstream transport on aiohttp.

Why aiohttp and not httpx's default transport: on one pinned core httpx's transport served several
times fewer streamed requests/s (bench/gateway_overhead.py, docs/benchmarks.md).

The default transport is `h1` (gateway/transport/h1.py), which measured faster; this one stays
as a second implementation of the interface, selectable with GATEWAY_TRANSPORT=aiohttp.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping

import aiohttp

from gateway.errors import UpstreamFailed, UpstreamTimeout
from gateway.settings import Timeouts
from gateway.transport.base import BodySink
from gateway.transport.deadline import Deadline


class AiohttpResponse:
    __slots__ = ("_content", "_deadline", "_loop", "_resp", "status")

    def __init__(self, resp: aiohttp.ClientResponse, deadline: Deadline) -> None:
        self._resp = resp
        self._content = resp.content
        self._deadline = deadline
        self._loop = deadline._loop
        self.status = resp.status

    def _failure(self, exc: BaseException) -> Exception:
        if self._deadline.expired is not None:
            return UpstreamTimeout(f"upstream timed out: {self._deadline.expired}")
        return UpstreamFailed(f"upstream connection broke: {type(exc).__name__}")

    async def read(self) -> bytes:
        try:
            data = await self._resp.read()
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            self.close()
            raise self._failure(exc) from None
        if self._deadline.expired is not None:
            raise UpstreamTimeout(f"upstream timed out: {self._deadline.expired}")
        return data

    async def readany(self) -> bytes:
        try:
            data = await self._content.readany()
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            self.close()
            raise self._failure(exc) from None
        d = self._deadline
        if d.expired is not None:
            raise UpstreamTimeout(f"upstream timed out: {d.expired}")
        # The hot path: one clock read and two stores per chunk; the timer re-arms itself lazily.
        d.last = self._loop.time()
        d.got_first = True
        return data

    async def push(self, sink: BodySink) -> None:
        # aiohttp owns its read callback: a plain pull loop feeds the sink.
        while chunk := await self.readany():
            if not sink(chunk):
                return

    def close(self) -> None:
        self._deadline.cancel()
        self._resp.close()

    def release(self) -> None:
        self._deadline.cancel()
        self._resp.release()


class AiohttpTransport:
    def __init__(self, timeouts: Timeouts) -> None:
        self._timeouts = timeouts
        self._session: aiohttp.ClientSession | None = None

    def _ensure(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=0,  # admission control is the gateway's job, not the connection pool's
                keepalive_timeout=30,
                enable_cleanup_closed=False,
                ttl_dns_cache=10,
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(
                    total=None, connect=None, sock_connect=self._timeouts.connect_s
                ),
                auto_decompress=False,
                skip_auto_headers=("User-Agent", "Accept-Encoding"),
                json_serialize=json.dumps,
            )
        return self._session

    async def post(
        self, url: str, body: bytes, headers: Mapping[str, str], *, streaming: bool
    ) -> AiohttpResponse:
        session = self._ensure()
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        holder: list[aiohttp.ClientResponse] = []

        def expire() -> None:
            # Before the head arrives there is no response to close: cancel the waiting task.
            if holder:
                holder[0].close()
            elif task is not None:
                task.cancel()

        t = self._timeouts
        if not streaming:
            # A non-streamed answer sends its first byte only after the last token.
            t = Timeouts(connect_s=t.connect_s, first_byte_s=t.total_s, idle_s=t.idle_s,
                         total_s=t.total_s)
        deadline = Deadline(loop, t, expire)
        try:
            resp = await session.post(url, data=body, headers=headers)
        except asyncio.CancelledError:
            if deadline.expired is not None:
                raise UpstreamTimeout(f"upstream timed out: {deadline.expired}") from None
            deadline.cancel()
            raise
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            deadline.cancel()
            raise UpstreamFailed(f"upstream unreachable: {type(exc).__name__}") from None
        holder.append(resp)
        return AiohttpResponse(resp, deadline)

    async def get(self, url: str, timeout_s: float) -> tuple[int, bytes]:
        session = self._ensure()
        try:
            async with session.get(
                url, timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as resp:
                return resp.status, await resp.read()
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise UpstreamFailed(f"GET {url} failed: {type(exc).__name__}") from None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
