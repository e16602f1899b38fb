"""The router: backends from discovery, kept honest by probes and failures, one pool per model.

Active health: every `health_interval_s` each backend's /health and /v1/models are probed. A
failed probe makes the backend unavailable at once; a passed one makes it probe-healthy and says
which models it serves. A newly discovered backend is probed at once and takes no traffic before
its first passed probe (a replica still loading its model would fail the first requests).

Passive health: `eject_after_failures` consecutive request failures eject a backend for
`eject_for_s`, so a replica that dies between probes stops taking traffic after a few requests.

Decision: a passing probe does NOT cut an ejection short. The failures were real requests failing
while /health still answered 200 (a wedged engine, a broken pipe, an overloaded replica), so a
green /health is no evidence against them. When the ejection ends the backend is readmitted only
if its latest probe passed; a probe that fails during the ejection keeps it out afterwards.
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
        if health_interval_s <= 0 or eject_after_failures < 1 or eject_for_s < 0:
            raise ValueError(
                "Router: health_interval_s must be > 0, eject_after_failures >= 1, "
                "eject_for_s >= 0"
            )
        self._discovery = discovery
        self._prober = prober
        self._policy = policy
        self._interval = health_interval_s
        self._eject_after = eject_after_failures
        self._eject_for = eject_for_s
        self._clock = clock
        self._backends: dict[str, Backend] = {}
        # model -> (backends that serve it, the RouteRequest for it); rebuilt off the hot path,
        # read per request. Tuples: `pick` may hand a pool to the policy as is. The request is
        # cached because building a frozen dataclass costs about 1 us, half of a whole pick.
        self._pools: dict[str, tuple[tuple[Backend, ...], RouteRequest]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._changed = asyncio.Event()

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._tasks:
            raise RuntimeError("Router.start() called twice")
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
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not self.ready():
            left = deadline - loop.time()
            if left <= 0:
                return False
            self._changed.clear()
            # Short slices: an ejection that runs out changes readiness without any event.
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(left, 0.1))
        return True

    # -- per request (hot path: no awaits, no logging, at most one small list) -------------------

    def pick(self, model: str, exclude: Collection[Backend] = ()) -> Backend | None:
        entry = self._pools.get(model)
        if entry is None:
            return None
        pool, request = entry
        now = self._clock()
        # Common case, everything up and nothing excluded: hand over the pool without copying.
        for b in pool:
            if not b.available(now) or (exclude and b in exclude):
                break
        else:
            return self._policy.pick(pool, request)
        candidates = [b for b in pool if b.available(now) and b not in exclude]
        return self._policy.pick(candidates, request)

    def report_success(self, b: Backend) -> None:
        b.failures = 0

    def report_failure(self, b: Backend) -> None:
        """Count one failed request; the Nth in a row ejects `b` for `eject_for_s` (see module)."""
        b.failures += 1
        if b.failures >= self._eject_after:
            b.ejected_until = self._clock() + self._eject_for
            # Readmitted with a clean slate: N more failures in a row eject it again.
            b.failures = 0
            log.warning("ejected %s for %ss after %d consecutive failures", b.url,
                        self._eject_for, self._eject_after)

    # -- views -----------------------------------------------------------------------------------

    def models(self) -> list[str]:
        """Models served by at least one available backend, sorted."""
        now = self._clock()
        return sorted(
            m for m, (pool, _) in self._pools.items() if any(b.available(now) for b in pool)
        )

    def replicas(self) -> dict[str, int]:
        """Available backends per model (a multi-node replica counts once: only its leader is a
        backend)."""
        now = self._clock()
        return {m: sum(1 for b in pool if b.available(now)) for m, (pool, _) in self._pools.items()}

    def knows_model(self, model: str) -> bool:
        """Served by some known backend, up or down: tells 503 (down) from 404 (no such model).

        A backend keeps the models of its last passed probe while it is down, so a model whose
        every replica crashed is still known (503), not unknown (404).
        """
        return model in self._pools

    def knows_any_model(self) -> bool:
        """False until some backend has told us its models: before that, 404 would be a guess."""
        return bool(self._pools)

    def ready(self) -> bool:
        now = self._clock()
        return any(b.available(now) for b in self._backends.values())

    def backends(self) -> list[Backend]:
        return list(self._backends.values())

    def backend_states(self) -> list[tuple[str, bool, int]]:
        """(url, available for routing, requests in flight) per backend, for the metrics."""
        now = self._clock()
        return [(b.url, b.available(now), b.outstanding) for b in self._backends.values()]

    # -- background ------------------------------------------------------------------------------

    def _rebuild_pools(self) -> None:
        pools: dict[str, list[Backend]] = {}
        for b in self._backends.values():
            for m in b.models:
                pools.setdefault(m, []).append(b)
        self._pools = {m: (tuple(bs), RouteRequest(m)) for m, bs in pools.items()}
        self._changed.set()

    async def set_backends(self, urls: frozenset[str]) -> None:
        """Apply a discovery update: new backends are probed at once, vanished ones dropped.

        A dropped backend's in-flight requests keep their reference and finish normally; it just
        takes no new ones. A backend that comes back is a new object with a clean record.
        """
        wanted = {u.rstrip("/") for u in urls}
        for gone in set(self._backends) - wanted:
            del self._backends[gone]
        added = [Backend(u) for u in sorted(wanted) if u not in self._backends]
        for b in added:
            self._backends[b.url] = b
        self._rebuild_pools()
        if added:
            await asyncio.gather(*(self._probe(b) for b in added))
            self._rebuild_pools()

    async def _follow_discovery(self) -> None:
        try:
            async for urls in self._discovery.updates():
                log.info("discovered %d backend(s)", len(urls))
                await self.set_backends(urls)
        except asyncio.CancelledError:
            raise
        except Exception:
            # Keep routing to the last known set; a dead discovery must at least be loud.
            log.exception("backend discovery stopped; keeping the last known backends")
            raise

    async def _probe(self, b: Backend) -> None:
        try:
            ok = await self._prober.health(b.url)
            models = await self._prober.models(b.url) if ok else None
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a prober bug must not end probing for all
            log.warning("probing %s raised %r; counting it as down", b.url, exc)
            ok, models = False, None
        was = b.probe_ok
        b.probe_ok = ok and models is not None
        if models is not None and frozenset(models) != b.models:
            b.models = frozenset(models)
            # At once, before any other task runs: a backend must never be available (ready)
            # while the pools do not yet list it under its models.
            self._rebuild_pools()
        if was != b.probe_ok:
            self._changed.set()
            log.info("%s is %s (models: %s)", b.url, "up" if b.probe_ok else "down",
                     ", ".join(sorted(b.models)) or "none")

    async def probe_all(self) -> None:
        await asyncio.gather(*(self._probe(b) for b in list(self._backends.values())))
        self._rebuild_pools()

    async def _probe_loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            await self.probe_all()
