"""The upstream transport interface: how the gateway talks HTTP to an engine.

The proxy and the health prober depend only on these two small protocols (implemented by
transport/h1.py), so tests can substitute a transport without a network.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

# Takes one body chunk and the loop time it arrived; returns False to stop being fed (the chunk
# itself is consumed either way).
BodySink = Callable[[bytes, float], bool]


class UpstreamResponse(Protocol):
    status: int
    # The response's headers, names lower-case: filled by `Transport.request` only.
    headers: list[tuple[bytes, bytes]]

    async def read(self) -> bytes:
        """The whole body (non-streaming responses); then the connection is released, or
        closed if reading failed."""
        ...

    async def readany(self) -> bytes:
        """The next bytes available, as they arrived; b"" at the end of the body."""
        ...

    async def push(self, sink: BodySink) -> None:
        """Feed body chunks to `sink` from the read callback as they arrive (no task wake-up per
        SSE event), until it returns False or the body ends (the caller tells which); raises
        like `readany` when the upstream fails or times out."""
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
        """Send a request and wait for the response head. Raises `errors.UpstreamFailed` (cannot
        reach the backend, connection dropped) or `errors.UpstreamTimeout`: nothing reached the
        client yet, so the caller may retry elsewhere."""
        ...

    async def request(
        self, method: str, url: str, body: bytes, headers: Mapping[str, str], *, streaming: bool
    ) -> UpstreamResponse:
        """As `post`, with any method, and the response's headers collected (`headers`): for
        the engine endpoints whose answers the gateway relays as they are."""
        ...

    async def get(self, url: str, timeout_s: float) -> tuple[int, bytes]:
        """A small GET (health and model probes). Raises `errors.UpstreamFailed` on failure."""
        ...

    async def close(self) -> None: ...
