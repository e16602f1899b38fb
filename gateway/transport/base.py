"""The upstream transport interface: how the gateway talks HTTP to an engine.

The proxy and the health prober depend only on these two small protocols, so the HTTP client can be
swapped (`h1`, the httptools client, is the default: it beat the aiohttp one on the overhead
benchmark, docs/benchmarks.md) and tests can substitute a transport without a network.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol


class UpstreamResponse(Protocol):
    status: int

    async def read(self) -> bytes:
        """The whole body (non-streaming responses)."""
        ...

    async def readany(self) -> bytes:
        """The next bytes available, as they arrived; b"" at the end of the body."""
        ...

    def close(self) -> None:
        """Abort: drop the connection so the engine notices and stops generating."""
        ...

    def release(self) -> None:
        """Done with a fully-read body: the connection may be reused."""
        ...


class Transport(Protocol):
    async def post(
        self, url: str, body: bytes, headers: Mapping[str, str], *, streaming: bool
    ) -> UpstreamResponse:
        """Send a request and wait for the response head.

        Raises `errors.UpstreamFailed` when the backend cannot be reached or drops the connection,
        `errors.UpstreamTimeout` when a deadline expires first. Both mean nothing reached the
        client yet, so the caller may retry elsewhere.
        """
        ...

    async def get(self, url: str, timeout_s: float) -> tuple[int, bytes]:
        """A small GET (health and model probes). Raises `errors.UpstreamFailed` on failure."""
        ...

    async def close(self) -> None: ...
