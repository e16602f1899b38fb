"""Health and model probes over the transport: what the router asks of each replica.

A replica's /v1/models lists its base model and every LoRA adapter it has loaded, each adapter
with its base as `parent` and its directory as `root` (as vLLM answers). The router needs the ids
only; the whole cards go to `on_cards` first, so that whoever tracks adapters knows an adapter's
base before the router builds a pool for it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.errors import UpstreamFailed
from gateway.transport import Transport


@dataclass(frozen=True, slots=True)
class ModelCard:
    """One entry of a replica's /v1/models: `parent` is set for a LoRA adapter (its base)."""

    id: str
    parent: str | None = None
    root: str | None = None
    # The whole card as the replica wrote it (max_model_len, permission, ...): /v1/models keeps it.
    fields: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


def _opt_str(v: object) -> str | None:
    return v if isinstance(v, str) and v else None


class HttpProber:
    def __init__(self, transport: Transport, timeout_s: float,
                 on_cards: Callable[[str, list[ModelCard]], None]) -> None:
        self._transport = transport
        self._timeout_s = timeout_s
        self._on_cards = on_cards

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
            cards = [ModelCard(str(m["id"]), _opt_str(m.get("parent")), _opt_str(m.get("root")),
                               m)
                     for m in data]
        except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
            return None
        self._on_cards(base_url, cards)
        return [c.id for c in cards]
