"""The proxy's requests in flight, so that the drain can end them cleanly when it expires.

uvicorn's graceful-shutdown timeout cancels every request task: a stream just stops (as if it
lost its tail), a queued request gets no answer, and a traceback is logged per task. So the
gateway's drain timer fires first (gateway/server.py): `InFlight.expire` cancels each open
exchange's task, marked, and the proxy answers a 503, or one in-band error event mid-stream.
"""

from __future__ import annotations

import asyncio

from gateway.api.splice import ClientWriter
from gateway.errors import Unavailable

# What a request cut by the drain is told: retryable, and not the replica's fault.
DRAIN_EXPIRED = Unavailable(
    "the gateway is shutting down and its drain timeout expired; retry the request",
    code="shutting_down", retry_after=1.0)


class Exchange:
    """One client request through the proxy."""

    __slots__ = ("expired", "gone", "head_sent", "responded", "rid", "started", "task", "writer")

    def __init__(self, task: asyncio.Task[object] | None, started: float, rid: str,
                 writer: ClientWriter | None) -> None:
        self.task = task
        self.writer = writer  # the server's direct body writer, if it offers one (api/splice.py)
        self.started = started  # loop time the request arrived
        self.rid = rid  # the request id, for log lines about this request
        self.head_sent = False  # the response head reached uvicorn: only in-band errors now
        self.responded = False  # the last body byte was sent: the client has its answer
        self.expired = False  # cancelled by the drain timeout, not by a disconnect
        self.gone = False  # cancelled because the client hung up before its answer was complete

    def hang_up(self) -> None:
        """The client's connection dropped: cancel the request unless it was already answered
        (after a complete response a closed connection is not a hang-up)."""
        if not self.responded and self.task is not None and not self.gone:
            self.gone = True
            self.task.cancel()


class InFlight(set[Exchange]):
    def expire(self) -> int:
        """End every exchange still unanswered; returns how many were cut."""
        n = 0
        for ex in list(self):
            if ex.responded or ex.expired or ex.task is None:
                continue
            ex.expired = True
            ex.task.cancel()
            n += 1
        return n
