"""Health and model probes over the transport; satisfies `gateway.routing.probe.Prober`."""

from __future__ import annotations

import orjson

from gateway.errors import UpstreamFailed
from gateway.transport.base import Transport


class HttpProber:
    def __init__(self, transport: Transport, timeout_s: float) -> None:
        self._transport = transport
        self._timeout_s = timeout_s

    async def _get(self, url: str) -> bytes | None:
        """The body of a 200 answer; None for any other answer or a failure."""
        try:
            status, body = await self._transport.get(url, self._timeout_s)
        except UpstreamFailed:
            return None
        return body if status == 200 else None

    async def health(self, base_url: str) -> bool:
        return await self._get(base_url + "/health") is not None

    async def models(self, base_url: str) -> list[str] | None:
        body = await self._get(base_url + "/v1/models")
        if body is None:
            return None
        try:
            data = orjson.loads(body)["data"]
            return [str(m["id"]) for m in data]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return None
