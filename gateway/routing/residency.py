"""Routing by LoRA residency: an adapter's requests go where the adapter already sits, within a
load bound, when its base has more adapters than a replica holds at once (`--max-loras`).

vLLM batches requests of at most `--max-loras` adapters and swaps the others in as the running
ones drain, so spreading every adapter everywhere keeps every replica swapping. The gateway cannot
see the engines' slots; it keeps, per replica life, the `--max-loras` adapters it sent there most
recently (vLLM's own LRU order). `ResidentFirst` narrows the candidates of the pool's own policy
to the replicas holding the adapter (a hit), unless they are above `(1 + balance) x` the mean
load plus `slack`; else (a miss) to replicas at or under the mean, one with a free slot first,
else the one whose least recently used adapter is the oldest. docs/lora.md has the measurements.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from gateway.routing.adapters import Adapters
from gateway.routing.backend import Backend
from gateway.routing.policy import RouteRequest, RoutingPolicy
from gateway.settings import LoraSettings

OUTCOMES = ("hit", "miss", "overloaded", "idle")


class Residency:
    """Which adapters each replica's engine holds, as far as this gateway sent them (in each
    replica life's `adapters`), and the outcomes per base."""

    def __init__(self, adapters: Adapters, settings: LoraSettings) -> None:
        self.adapters = adapters
        self.settings = settings
        self._tick = 0
        # base -> outcome -> requests, read at scrape time: `hit` (sent where the adapter is
        # resident), `miss` (resident nowhere), `overloaded` (every holder over the bound), `idle`
        # (the base has no more adapters than --max-loras: not narrowed).
        self.counts: dict[str, dict[str, int]] = {}

    def count(self, base: str, outcome: str) -> None:
        per = self.counts.get(base)
        if per is None:
            per = self.counts[base] = dict.fromkeys(OUTCOMES, 0)
        per[outcome] += 1

    def touch(self, b: Backend, adapter: str, slots: int) -> None:
        held = b.cache_life.adapters
        self._tick += 1
        held[adapter] = self._tick
        held.move_to_end(adapter)
        while len(held) > slots:
            held.popitem(last=False)


class ResidentFirst:
    """The pool's policy, with candidates narrowed by residency (module docstring)."""

    def __init__(self, inner: RoutingPolicy, residency: Residency) -> None:
        self.inner = inner
        # Per-request keys exactly when `inner` routes by them.
        self.uses_affinity = inner.uses_affinity
        self._r = residency
        s = residency.settings
        self._balance = 1.0 + s.balance
        self._slack = s.slack

    def pick(self, candidates: Sequence[Backend], request: RouteRequest) -> Backend | None:
        n = len(candidates)
        if n == 0:
            return None
        r = self._r
        adapter = request.model
        base = r.adapters.parent_of(adapter)
        if base is None:  # removed meanwhile, or not an adapter: nothing to narrow
            return self.inner.pick(candidates, request)
        slots = r.settings.max_loras_of(base)
        if n == 1 or r.adapters.count(base) <= slots:
            r.count(base, "idle")
            chosen = self.inner.pick(candidates, request)
        else:
            chosen = self._narrowed(candidates, request, adapter, base, slots)
        if chosen is not None:
            r.touch(chosen, adapter, slots)
        return chosen

    def _narrowed(self, candidates: Sequence[Backend], request: RouteRequest, adapter: str,
                  base: str, slots: int) -> Backend | None:
        r = self._r
        n = len(candidates)
        total = 0
        for c in candidates:
            total += c.outstanding
        bound = math.ceil(self._balance * (total + 1) / n) + self._slack
        holders = [c for c in candidates if adapter in c.cache_life.adapters]
        home = [c for c in holders if c.outstanding + 1 <= bound]
        if home:
            r.count(base, "hit")
            return self.inner.pick(home, request)
        r.count(base, "overloaded" if holders else "miss")
        cap = math.ceil((total + 1) / n)
        under = [c for c in candidates if c.outstanding + 1 <= cap]
        free = [c for c in under if len(c.cache_life.adapters) < slots]
        if free:
            return self.inner.pick(free, request)
        return min(under, key=lambda c: next(iter(c.cache_life.adapters.values()), 0))
