"""Health and model probes over the transport; satisfies `gateway.routing.probe.Prober`."""

from __future__ import annotations

import orjson

from gateway.errors import UpstreamFailed
from gateway.transport.base import Transport


class HttpProber:
    def __init__(self, transport: Transport, timeout_s: float) -> None:
        self._transport = transport
        self._timeout_s = timeout_s

    async def health(self, base_url: str) -> bool:
        try:
            status, _ = await self._transport.get(base_url + "/health", self._timeout_s)
        except UpstreamFailed:
            return False
        return status == 200

    async def models(self, base_url: str) -> list[str] | None:
        try:
            status, body = await self._transport.get(base_url + "/v1/models", self._timeout_s)
        except UpstreamFailed:
            return None
        if status != 200:
            return None
        try:
            data = orjson.loads(body)["data"]
            return [str(m["id"]) for m in data]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return None
