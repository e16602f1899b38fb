"""One lazily re-armed timer per upstream request: first byte, inter-chunk idle, total. The reader
records the time of each chunk; the timer re-arms itself only when it finds the deadline moved.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from gateway.settings import Timeouts


class Deadline:
    __slots__ = ("_handle", "_loop", "_on_expire", "_start", "_t", "expired", "got_first", "last")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, t: Timeouts, on_expire: Callable[[], None]
    ) -> None:
        self._loop = loop
        self._t = t
        self._start = loop.time()
        self.last = self._start
        self.got_first = False
        self.expired: str | None = None
        self._on_expire = on_expire
        self._handle: asyncio.TimerHandle | None = loop.call_at(self._wake_at(), self._check)

    def _next(self) -> float:
        t = self._t
        gap = self.last + t.idle_s if self.got_first else self._start + t.first_byte_s
        return min(gap, self._start + t.total_s)

    def _wake_at(self) -> float:
        # A first chunk arriving later can pull the deadline in to (its time + idle_s), never
        # earlier than now + idle_s: waking at that bound keeps the timer lazy and never late.
        return min(self._next(), self._loop.time() + self._t.idle_s)

    def _check(self) -> None:
        now = self._loop.time()
        if now < self._next():
            self._handle = self._loop.call_at(self._wake_at(), self._check)
            return
        self._handle = None
        t = self._t
        if now >= self._start + t.total_s:
            self.expired = f"total time of {t.total_s:g}s"
        elif self.got_first:
            self.expired = f"no data for {t.idle_s:g}s"
        else:
            self.expired = f"no first byte within {t.first_byte_s:g}s"
        on_expire = self._on_expire
        self._on_expire = _ignore
        on_expire()

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        # What the deadline calls (a closure over the request's task and connection) refers back
        # to it: once it can no longer fire, it drops that, so that no cycle outlives the request
        # and waits for the cyclic GC.
        self._on_expire = _ignore


def _ignore() -> None:
    pass
