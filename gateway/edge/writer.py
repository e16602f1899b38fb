"""A client connection as the proxy's streamed relay writes to it (api/splice.py's ClientWriter):
its transport, whether its write buffer is full (the protocol forwards `pause_writing` and
`resume_writing`), whether it is lost, and a hang-up callback the proxy sets per request, so that
no task has to wait on `receive()` for the disconnect.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class ConnectionWriter:
    """One per connection, offered to each of its requests in `scope["state"]`."""

    __slots__ = ("_writable", "closed", "lost", "transport", "write_paused")

    def __init__(self) -> None:
        # Set once the connection is made, before any request can see the writer.
        self.transport: asyncio.WriteTransport = None  # type: ignore[assignment]
        self.write_paused = False
        self.closed = False
        # Set by the proxy for the request it serves on this connection: cancels that request.
        self.lost: Callable[[], None] | None = None
        self._writable: asyncio.Future[None] | None = None

    async def drain(self) -> None:
        """Until the client's socket buffer has room again, or the connection is gone."""
        if self.write_paused:
            if self._writable is None:
                self._writable = asyncio.get_running_loop().create_future()
            # Shielded: one waiter's cancellation must not cancel the future another waits on.
            await asyncio.shield(self._writable)

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        writable, self._writable = self._writable, None
        if writable is not None and not writable.done():
            writable.set_result(None)

    def connection_lost(self) -> None:
        self.closed = True
        self.resume_writing()  # nothing waits for a buffer that will never drain
        if self.lost is not None:
            self.lost()
