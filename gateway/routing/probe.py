"""What the router needs from the network, as a Protocol: the transport layer implements it."""

from __future__ import annotations

from typing import Protocol


class Prober(Protocol):
    async def health(self, base_url: str) -> bool:
        """GET /health answered 200."""
        ...

    async def models(self, base_url: str) -> list[str] | None:
        """Model ids from GET /v1/models, or None on any failure."""
        ...
