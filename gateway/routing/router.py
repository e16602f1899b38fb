"""The router: backends from discovery, kept honest by probes and failures, one pool per model.

Active health: every `health_interval_s` each backend's /health and /v1/models are probed. A
failed probe takes the backend out at once and gives it a new `CacheLife` (a restarted engine lost
its KV cache); a new backend takes no traffic before its first passed probe.

Passive health: `eject_after_failures` consecutive failures, or a moving average of failures at
`eject_failure_rate` (a brownout that never fails three in a row, yet draws ever more traffic since
its failures answer fast), eject a backend for `eject_for_s`, within `max_ejection_percent` of its
pool; with no backend available the pool routes to the ejected ones (panic mode, docs/routing.md).
A passing probe does not cut an ejection short: the failures were real requests failing while
/health answered 200.

Models that may scale to zero (`standby`) are known without a backend: listed, not a 404, and
the gateway is ready with none up, to take the requests that wake the pool (routing/wake.py).
Every other declared pool's model (`declared`) is known too: before its first replica it answers
503 with Retry-After, not 404, and has its scaling signal at 0, but is not listed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection, Iterator

from gateway.routing.affinity import PrefixAffinity
from gateway.routing.backend import Backend, CacheLife
from gateway.routing.discovery.base import Discovery
from gateway.routing.policy import RouteRequest, RoutingPolicy
from gateway.routing.retry_budget import RetryBudget
from gateway.transport.prober import HttpProber

log = logging.getLogger("gateway.router")

# Weight of each request in a backend's failure moving average: about the last 20 requests count.
FAILURE_ALPHA = 0.1


class Router:
    def __init__(
        self,
        discovery: Discovery,
        prober: HttpProber,
        policy_for: Callable[[str], RoutingPolicy],
        *,
        health_interval_s: float,
        eject_after_failures: int,
        eject_for_s: float,
        eject_failure_rate: float = 1.0,
        retry_budget: RetryBudget | None = None,
        max_ejection_percent: int = 50,
        standby: Collection[str] = (),
        declared: Collection[str] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._discovery = discovery
        self._prober = prober
        self._interval = health_interval_s
        self._eject_after = eject_after_failures
        self._eject_for = eject_for_s
        self._eject_rate = eject_failure_rate
        self._max_eject = max_ejection_percent
        # One policy object per model pool, kept across rebuilds: its state and metrics per pool.
        self._policy_for = policy_for
        self._policies: dict[str, RoutingPolicy] = {}
        self._clock = clock
        self.retry_budget = retry_budget or RetryBudget(clock=clock)
        self._backends: dict[str, Backend] = {}
        # model -> (backends that serve it, the RouteRequest for it, its policy); rebuilt off the
        # hot path, read per request (affinity policies get a RouteRequest per request instead).
        self._pools: dict[str, tuple[tuple[Backend, ...], RouteRequest, RoutingPolicy]] = {}
        self.panics: dict[str, int] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._standby = frozenset(standby)
        # Standby models are declared too.
        self._declared = self._standby | frozenset(declared)
        self._listeners: list[Callable[[], None]] = []

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

    # -- per request (hot path: no awaits, no logging, at most one small list) -------------------

    def wants_affinity(self, model: str) -> bool:
        """True if `model`'s policy routes by key or prefix: pass a RouteRequest to `pick`."""
        entry = self._pools.get(model)
        return entry is not None and entry[2].uses_affinity

    def pick(
        self, model: str, exclude: Collection[Backend] = (), request: RouteRequest | None = None
    ) -> Backend | None:
        entry = self._pools.get(model)
        if entry is None:
            return None
        pool, cached, policy = entry
        now = self._clock()
        # Common case, everything up and nothing excluded: hand over the pool without copying.
        for b in pool:
            if not b.available(now) or (exclude and b in exclude):
                break
        else:
            return policy.pick(pool, request or cached)
        candidates = [b for b in pool if b.available(now) and b not in exclude]
        if not candidates and not any(b.available(now) for b in pool):
            # Panic: every backend is out; route to the ones only passive ejection holds back.
            candidates = [b for b in pool if b.probe_ok and b not in exclude]
            if candidates:
                self.panics[model] = self.panics.get(model, 0) + 1
        return policy.pick(candidates, request or cached)

    def report_success(self, b: Backend) -> None:
        b.failures = 0
        b.failure_rate -= b.failure_rate * FAILURE_ALPHA

    def report_failure(self, b: Backend) -> None:
        """Count one failed request; the Nth in a row, or a failure rate at
        `eject_failure_rate`, ejects `b` for `eject_for_s` (see module)."""
        b.failures += 1
        b.failure_rate += (1.0 - b.failure_rate) * FAILURE_ALPHA
        if b.failures >= self._eject_after:
            why = f"{self._eject_after} consecutive failures"
        elif b.failure_rate >= self._eject_rate and self._others_available(b):
            why = f"a failure rate of {b.failure_rate:.0%}"
        else:
            return
        # Readmitted (or spared) with a clean slate: it has to fail again to be ejected again.
        b.failures = 0
        b.failure_rate = 0.0
        now = self._clock()
        full = self._ejection_cap_reached(b, now)
        if full is not None:
            log.warning("not ejecting %s: %d%% of pool %r is ejected already", b.url,
                        self._max_eject, full)
            return
        b.ejected_until = now + self._eject_for
        log.warning("ejected %s for %ss after %s", b.url, self._eject_for, why)

    def report_draining(self, b: Backend) -> None:
        """`b` said it drains for a restart: out now, as if its probe had failed (its /health says
        503 too, so the next probe agrees); back in when a probe passes again."""
        if not b.probe_ok:
            return
        b.probe_ok = False
        self._went_down(b)
        log.info("%s is draining; out until its probe passes", b.url)

    def _went_down(self, b: Backend) -> None:
        # The engine may be restarting, and a restarted engine has an empty cache: what routing
        # learnt about this one counts as a miss from now on.
        b.cache_life = CacheLife(b)

    def _others_available(self, b: Backend) -> bool:
        """Another backend available for some model `b` serves."""
        now = self._clock()
        return any(o is not b and o.available(now) and o.models & b.models
                   for o in self._backends.values())

    def _ejection_cap_reached(self, b: Backend, now: float) -> str | None:
        """The first pool of `b` whose ejection share is used up, or None."""
        for m in sorted(b.models):
            entry = self._pools.get(m)
            if entry is None:
                continue
            pool = entry[0]
            allowed = len(pool) * self._max_eject // 100
            if self._max_eject > 0:
                allowed = max(allowed, 1)
            ejected = sum(1 for x in pool if x is not b and now < x.ejected_until)
            if ejected + 1 > allowed:
                return m
        return None

    # -- views -----------------------------------------------------------------------------------

    def models(self) -> list[str]:
        """Models served by at least one available backend, and those that may scale to zero,
        sorted."""
        return sorted(m for m, n in self.replicas().items() if n or m in self._standby)

    def replicas(self) -> dict[str, int]:
        """Available backends per model (a multi-node replica counts once: only its leader is a
        backend); a declared model is there with 0 when it has none."""
        now = self._clock()
        out = dict.fromkeys(self._declared, 0)
        out.update((m, sum(1 for b in pool if b.available(now)))
                   for m, (pool, _, _) in self._pools.items())
        return out

    def knows_model(self, model: str) -> bool:
        """Served by some known backend, up or down (it keeps the models of its last passed
        probe), or declared (a pool of the chart): tells 503 or a wait from 404 (no such
        model)."""
        return model in self._pools or model in self._declared

    def knows_any_model(self) -> bool:
        """False until some backend has told us its models (or a model was declared): before
        that, 404 would be a guess."""
        return bool(self._pools) or bool(self._declared)

    def routable(self, model: str) -> bool:
        """Some backend of `model` passed its probe: `pick` finds one (available, or in panic
        mode only ejected). False for a pool at zero replicas, or whose replicas all fail."""
        entry = self._pools.get(model)
        return entry is not None and any(b.probe_ok for b in entry[0])

    def listen(self, callback: Callable[[], None]) -> None:
        """Call `callback` (no awaits, on the loop) whenever a backend's probe changes its state
        or its models: the moment a pool may have become routable."""
        self._listeners.append(callback)

    def ready(self) -> bool:
        """A backend is available, or some model may scale to zero: requests for it must reach
        this gateway (and wait here) for its pool to be woken at all."""
        if self._standby:
            return True
        now = self._clock()
        return any(b.available(now) for b in self._backends.values())

    def policies(self) -> dict[str, RoutingPolicy]:
        """Each model pool's policy object (for the metrics, read at scrape time)."""
        return dict(self._policies)

    def backends(self) -> list[Backend]:
        return list(self._backends.values())

    def available(self) -> list[Backend]:
        """The backends available for routing now, whatever they serve."""
        now = self._clock()
        return [b for b in self._backends.values() if b.available(now)]

    def available_at(self, url: str) -> Backend | None | bool:
        """The backend at `url` if it is available now; False if it is known but unavailable;
        None if no backend is at `url`."""
        for b in self._backends.values():
            if b.url == url:
                return b if b.available(self._clock()) else False
        return None

    def backend_states(self) -> list[tuple[str, bool, int]]:
        """(url, available for routing, requests in flight) per backend, for the metrics."""
        now = self._clock()
        return [(b.url, b.available(now), b.outstanding) for b in self._backends.values()]

    def routing_stats(self) -> Iterator[tuple[str, int, int, dict[str, int], int, int, int]]:
        """(pool, hits, misses, fallbacks, keys moved, entries, panics) for the metrics: pools
        with an affinity policy or a panic so far."""
        for m in sorted(set(self._policies) | set(self.panics)):
            p = self._policies.get(m)
            # Wrappers (LoRA residency) and policies that defer to prefix affinity (kv_aware)
            # name the policy they defer to `inner`.
            while p is not None and not isinstance(p, PrefixAffinity) and hasattr(p, "inner"):
                p = p.inner
            panics = self.panics.get(m, 0)
            if isinstance(p, PrefixAffinity):
                st = p.stats
                yield m, st.hits, st.misses, dict(st.fallbacks), st.keys_moved, p.entries, panics
            elif panics:
                yield m, 0, 0, {}, 0, 0, panics

    # -- background ------------------------------------------------------------------------------

    def _rebuild_pools(self) -> None:
        pools: dict[str, list[Backend]] = {}
        for b in self._backends.values():
            for m in b.models:
                pools.setdefault(m, []).append(b)
        self._pools = {m: (tuple(bs), RouteRequest(m), self._policy_of(m))
                       for m, bs in pools.items()}

    def _policy_of(self, model: str) -> RoutingPolicy:
        policy = self._policies.get(model)
        if policy is None:
            policy = self._policies[model] = self._policy_for(model)
        return policy

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
        except Exception:
            # Keep routing to the last known set; a dead discovery must at least be loud.
            log.exception("backend discovery stopped; keeping the last known backends")
            raise

    async def _probe(self, b: Backend) -> None:
        try:
            ok = await self._prober.health(b.url)
            models = await self._prober.models(b.url) if ok else None
        except Exception as exc:  # noqa: BLE001 - a prober bug must not end probing for all
            log.warning("probing %s raised %r; counting it as down", b.url, exc)
            ok, models = False, None
        was = b.probe_ok
        b.probe_ok = ok and models is not None
        if was and not b.probe_ok:
            self._went_down(b)
        changed = was != b.probe_ok
        if models is not None and frozenset(models) != b.models:
            changed = True
            b.models = frozenset(models)
            # At once, before any other task runs: a backend must never be available (ready)
            # while the pools do not yet list it under its models.
            self._rebuild_pools()
        if was != b.probe_ok:
            log.info("%s is %s (models: %s)", b.url, "up" if b.probe_ok else "down",
                     ", ".join(sorted(b.models)) or "none")
        if changed:
            for callback in self._listeners:
                callback()

    async def probe_all(self) -> None:
        await asyncio.gather(*(self._probe(b) for b in list(self._backends.values())))
        self._rebuild_pools()

    async def _probe_loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            await self.probe_all()
