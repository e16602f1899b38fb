"""The router: backends from discovery, kept honest by probes and failures, one pool per model.

Active health: every `health_interval_s` each backend's /health and /v1/models are probed; a
failed probe makes it unavailable at once, a passed one makes it available (and tells which models
it serves). Passive health: `eject_after_failures` consecutive request failures eject a backend for
`eject_for_s`, so a replica that dies between probes stops taking traffic after a few requests;
after the ejection it is readmitted if its probes still pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection

from gateway.routing.backend import Backend
from gateway.routing.discovery.base import Discovery
from gateway.routing.policy import RouteRequest, RoutingPolicy
from gateway.routing.probe import Prober

log = logging.getLogger("gateway.router")


class Router:
    def __init__(
        self,
        discovery: Discovery,
        prober: Prober,
        policy: RoutingPolicy,
        *,
        health_interval_s: float,
        eject_after_failures: int,
        eject_for_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._discovery = discovery
        self._prober = prober
        self._policy = policy
        self._interval = health_interval_s
        self._eject_after = eject_after_failures
        self._eject_for = eject_for_s
        self._clock = clock
        self._backends: dict[str, Backend] = {}
        # model -> backends serving it; rebuilt on probe results, read per request.
        self._pools: dict[str, list[Backend]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._changed = asyncio.Event()

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._follow_discovery(), name="router-discovery"),
            asyncio.create_task(self._probe_loop(), name="router-probe"),
        ]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks = []

    async def wait_ready(self, timeout: float) -> bool:
        deadline = asyncio.get_running_loop().time() + timeout
        while not self.ready():
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return False
            self._changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(left, 0.1))
        return True

    # -- per request (hot path: no awaits, no logging) -------------------------------------------

    def pick(self, model: str, exclude: Collection[Backend] = ()) -> Backend | None:
        pool = self._pools.get(model)
        if not pool:
            return None
        now = self._clock()
        candidates = [b for b in pool if b.available(now) and b not in exclude]
        return self._policy.pick(candidates, RouteRequest(model))

    def report_success(self, b: Backend) -> None:
        b.failures = 0

    def report_failure(self, b: Backend) -> None:
        b.failures += 1
        if b.failures >= self._eject_after:
            b.ejected_until = self._clock() + self._eject_for
            b.failures = 0
            log.warning("ejected %s for %ss after %s consecutive failures", b.url,
                        self._eject_for, self._eject_after)

    # -- views -----------------------------------------------------------------------------------

    def models(self) -> list[str]:
        now = self._clock()
        return sorted(m for m, pool in self._pools.items() if any(b.available(now) for b in pool))

    def knows_model(self, model: str) -> bool:
        """Served by some known backend, up or down: tells 503 (down) from 404 (no such model)."""
        return model in self._pools

    def knows_any_model(self) -> bool:
        """False until some backend has told us its models: before that, 404 would be a guess."""
        return bool(self._pools)

    def ready(self) -> bool:
        now = self._clock()
        return any(b.available(now) for b in self._backends.values())

    def backends(self) -> list[Backend]:
        return list(self._backends.values())

    # -- background ------------------------------------------------------------------------------

    def _rebuild_pools(self) -> None:
        pools: dict[str, list[Backend]] = {}
        for b in self._backends.values():
            for m in b.models:
                pools.setdefault(m, []).append(b)
        self._pools = pools
        self._changed.set()

    async def set_backends(self, urls: frozenset[str]) -> None:
        """Apply a discovery update; new backends are probed at once, gone ones dropped."""
        added = [Backend(u) for u in urls if u not in self._backends]
        for gone in set(self._backends) - urls:
            del self._backends[gone]
        for b in added:
            self._backends[b.url] = b
        self._rebuild_pools()
        if added:
            await asyncio.gather(*(self._probe(b) for b in added))
            self._rebuild_pools()

    async def _follow_discovery(self) -> None:
        async for urls in self._discovery.updates():
            log.info("discovered %d backend(s)", len(urls))
            await self.set_backends(urls)

    async def _probe(self, b: Backend) -> None:
        ok = await self._prober.health(b.url)
        models = await self._prober.models(b.url) if ok else None
        was = b.probe_ok
        b.probe_ok = ok and models is not None
        if models is not None:
            b.models = frozenset(models)
        if was != b.probe_ok:
            log.info("%s is %s", b.url, "up" if b.probe_ok else "down")

    async def probe_all(self) -> None:
        await asyncio.gather(*(self._probe(b) for b in list(self._backends.values())))
        self._rebuild_pools()

    async def _probe_loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            await self.probe_all()
