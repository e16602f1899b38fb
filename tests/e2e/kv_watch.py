"""The stack's KV cache events followed for the whole engine session, so that a later test can
check what the gateway's index did while another test restarted the workers (the restarts are
test_rolling_restart.py's; a new engine start of this test's own would cost minutes of CI).

A thread of its own runs the gateway's subscriber (gateway/routing/kv_events.py) on its own event
loop; every 10 ms it notes each replica's index resets, and every 200 ms each replica's /health.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

import httpx

from gateway.routing.kv_events import KvEvents
from gateway.routing.kv_index import Hash
from gateway.settings import KvSettings
from tests import loopback


@dataclass(frozen=True)
class Reset:
    """The index of a replica emptied because its engine's cache was gone."""

    at: float  # monotonic
    held_before: frozenset[Hash]  # the blocks it held up to then
    held_after: int  # the blocks it held when the reset was seen


@dataclass(frozen=True)
class Back:
    """A replica's /health answering 200 again after it was down: it may be routed to now."""

    at: float
    generation_down: int  # the index's generation (one more per reset) when its port closed
    generation: int  # and when it answered again
    blocks: frozenset[Hash]  # the blocks the index held then


@dataclass
class Replica:
    resets: list[Reset] = field(default_factory=list)
    backs: list[Back] = field(default_factory=list)
    blocks: frozenset[Hash] = frozenset()
    generation: int = 0
    down: bool = False
    generation_down: int = 0


class KvWatch:
    def __init__(self, urls: list[str], endpoints: dict[str, str]) -> None:
        self.settings = KvSettings(endpoints=endpoints)
        self.replicas = {u: Replica() for u in urls}
        self.events = KvEvents(self.settings)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="kv-watch",
                                        daemon=True)
        self._stop: asyncio.Event | None = None
        self._main: Future[None] | None = None

    def start(self) -> None:
        self._thread.start()
        self._main = asyncio.run_coroutine_threadsafe(self._run(), self._loop)

    def stop(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._main is not None:
            self._main.result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    async def _run(self) -> None:
        self._stop = asyncio.Event()
        self.events.follow(self.replicas)
        health = asyncio.create_task(self._health())
        try:
            while not self._stop.is_set():
                for url, r in self.replicas.items():
                    index = self.events.indexes[url]
                    if index.generation != r.generation:
                        r.resets.append(Reset(time.monotonic(), r.blocks, len(index.blocks)))
                        r.generation = index.generation
                    r.blocks = frozenset(index.blocks)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), 0.01)
        finally:
            health.cancel()
            await asyncio.gather(health, return_exceptions=True)
            await self.events.close()

    async def _health(self) -> None:
        """A replica is down from the first /health that finds nothing listening (its process is
        gone: a slow or 503 answer is not that) until one answers 200."""
        async with loopback.async_client(timeout=2) as c:
            while True:
                for url, r in self.replicas.items():
                    index = self.events.indexes[url]
                    try:
                        ok = (await c.get(url + "/health")).status_code == 200
                    except httpx.ConnectError:
                        if not r.down:
                            r.down = True
                            r.generation_down = index.generation
                        continue
                    except httpx.HTTPError:
                        continue
                    if ok and r.down:
                        r.backs.append(Back(time.monotonic(), r.generation_down,
                                            index.generation, frozenset(index.blocks)))
                        r.down = False
                await asyncio.sleep(0.2)
