"""Routing by LoRA residency: an adapter's requests go where the adapter already sits, within a
load bound, when its base has more adapters than a replica holds at once.

vLLM batches requests of at most `--max-loras` different adapters at a time and keeps that many
in its LoRA slots (least recently used out). A request whose adapter is not among those running
waits until they drain, then the adapter is swapped in (read from the host cache or the volume).
When a base model has no more adapters than `--max-loras`, every replica holds them all and
placement does not matter; with more, sending an adapter's requests to replicas that run it keeps
each replica's batches on few adapters, where least-outstanding spreads every adapter everywhere
and every replica keeps swapping (docs/lora.md has the benchmark).

The policy wraps the pool's own policy (prefix affinity by default) and only narrows its
candidates, so prefix affinity still chooses among the replicas it is given:

- **Resident.** Per replica (per life of its engine: a restart empties it) the gateway keeps the
  adapters it sent there most recently, `--max-loras` of them, least recently used out: vLLM's
  own order, as the gateway cannot see the engine's slots (`vllm:lora_requests_info` lists only
  adapters with requests in flight). Replicas holding the adapter, and not above
  `(1 + balance) x` the mean load plus `slack` requests, are the candidates (a hit).
- **Miss** (resident nowhere, or every holder over the bound): like a new prefix, never above the
  mean load; among those, replicas with a free slot (no eviction) through the inner policy, else
  the replica whose least recently used adapter was used longest ago: the eviction an LRU over
  all the pool's slots would make, so a hot adapter keeps its place and a cold one goes.
- Load is the gateway's in-flight count per replica, base-model requests included: they share
  the engine.

The state is shared by every adapter pool of a gateway (adapters of one base share replicas).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from typing import ClassVar

from gateway.routing.adapters import Adapters
from gateway.routing.backend import Backend, CacheLife
from gateway.routing.policy import RouteRequest, RoutingPolicy
from gateway.settings import LoraSettings

OUTCOMES = ("hit", "miss", "overloaded", "idle")
# Dead lives kept in the table before a sweep (a replica's life ends with each restart).
_SWEEP_SLACK = 64


class ResidencyStats:
    """Plain counters per base model, read at scrape time: `hit` (sent where the adapter is
    resident), `miss` (resident nowhere), `overloaded` (every holder over the bound), `idle`
    (the base has no more adapters than --max-loras: not narrowed)."""

    __slots__ = ("counts",)

    def __init__(self) -> None:
        self.counts: dict[str, dict[str, int]] = {}

    def add(self, base: str, outcome: str) -> None:
        per = self.counts.get(base)
        if per is None:
            per = self.counts[base] = dict.fromkeys(OUTCOMES, 0)
        per[outcome] += 1


class Residency:
    """Which adapters each replica's engine holds, as far as this gateway sent them."""

    def __init__(self, adapters: Adapters, settings: LoraSettings) -> None:
        self.adapters = adapters
        self.settings = settings
        # Per life: adapter -> the tick of its last use there, least recent first.
        self._held: dict[CacheLife, OrderedDict[str, int]] = {}
        self._tick = 0
        self.stats = ResidencyStats()

    def held(self, b: Backend) -> OrderedDict[str, int]:
        found = self._held.get(b.cache_life)
        if found is None:
            if len(self._held) > _SWEEP_SLACK:
                self._sweep()
            found = self._held[b.cache_life] = OrderedDict()
        return found

    def touch(self, b: Backend, adapter: str, slots: int) -> None:
        held = self.held(b)
        self._tick += 1
        held[adapter] = self._tick
        held.move_to_end(adapter)
        while len(held) > slots:
            held.popitem(last=False)

    def _sweep(self) -> None:
        for life in [x for x in self._held if x.backend.cache_life is not x]:
            del self._held[life]


class ResidentFirst:
    """The pool's policy, with candidates narrowed by residency (module docstring)."""

    uses_affinity: ClassVar[bool] = False

    def __init__(self, inner: RoutingPolicy, residency: Residency) -> None:
        self.inner = inner
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
            r.stats.add(base, "idle")
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
        holders = [c for c in candidates if adapter in r.held(c)]
        home = [c for c in holders if c.outstanding + 1 <= bound]
        if home:
            r.stats.add(base, "hit")
            return self.inner.pick(home, request)
        r.stats.add(base, "overloaded" if holders else "miss")
        cap = math.ceil((total + 1) / n)
        under = [c for c in candidates if c.outstanding + 1 <= cap]
        free = [c for c in under if len(r.held(c)) < slots]
        if free:
            return self.inner.pick(free, request)
        return min(under, key=lambda c: next(iter(r.held(c).values()), 0))


class ResidentFirstAffinity(ResidentFirst):
    """ResidentFirst around a policy that routes by prefix or session key."""

    uses_affinity: ClassVar[bool] = True


def resident_first(inner: RoutingPolicy, residency: Residency) -> ResidentFirst:
    """Wrap `inner`; the wrapper asks for per-request keys exactly when `inner` does."""
    cls = ResidentFirstAffinity if inner.uses_affinity else ResidentFirst
    return cls(inner, residency)
