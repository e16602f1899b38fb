"""Residency routing: an adapter's requests go where it is resident, within a load bound, and
only when its base has more adapters than a replica holds (--max-loras)."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

from gateway.routing.adapters import Adapters
from gateway.routing.affinity import PrefixAffinity
from gateway.routing.backend import Backend, CacheLife
from gateway.routing.factory import build_router
from gateway.routing.policy import LeastOutstanding, RouteRequest
from gateway.routing.residency import Residency, ResidentFirst
from gateway.settings import GatewaySettings, LoraSettings
from gateway.transport.prober import ModelCard
from tests.gateway.routing.conftest import probed_backends

BASE = "base"


def registry(names: list[str], settings: LoraSettings) -> Adapters:
    """The registry as the prober feeds it: one replica listing `names` as adapters of BASE."""
    adapters = Adapters(transport=None, settings=settings)  # type: ignore[arg-type]
    adapters.observe("http://lister:8000", [ModelCard(BASE), *(
        ModelCard(n, BASE, f"/models/adapters/{n}") for n in names)])
    return adapters


def policy(names: list[str], **lora: Any) -> ResidentFirst:
    settings = LoraSettings(**lora)
    return ResidentFirst(LeastOutstanding(), Residency(registry(names, settings), settings))


def test_few_adapters_are_not_narrowed() -> None:
    # Two adapters, two slots per replica: every replica holds both, least-outstanding decides.
    p = policy(["a", "b"], max_loras={BASE: 2})
    pool = probed_backends(2)
    picks = Counter(p.pick(pool, RouteRequest("a")).url for _ in range(10))  # type: ignore[union-attr]
    assert len(picks) == 2 and set(picks.values()) == {5}
    assert p._r.counts[BASE]["idle"] == 10


def test_an_adapter_stays_where_it_is_resident() -> None:
    p = policy(["a", "b", "c", "d"])  # one slot per replica (vLLM's default --max-loras)
    pool = probed_backends(2)
    first = p.pick(pool, RouteRequest("a"))
    assert first is not None
    # Sequential requests (nothing in flight): least-outstanding would alternate; residency
    # keeps "a" where it went first.
    assert {p.pick(pool, RouteRequest("a")) for _ in range(20)} == {first}
    other = p.pick(pool, RouteRequest("b"))
    assert other is not None and other is not first  # the free slot, not an eviction
    counts = p._r.counts[BASE]
    assert counts["hit"] == 20 and counts["miss"] == 2


def test_the_load_bound_spills_a_hot_adapter() -> None:
    p = policy(["a", "b", "c"], balance=0.25, slack=0)
    pool = probed_backends(2)
    home = p.pick(pool, RouteRequest("a"))
    assert home is not None
    home.outstanding += 1
    placed = [home]
    for _ in range(7):  # "a" only, each request kept in flight
        b = p.pick(pool, RouteRequest("a"))
        assert b is not None
        b.outstanding += 1
        placed.append(b)
    per = Counter(b.url for b in placed)
    # ceil(1.25 x 8 / 2) = 5 at most on the home: the rest spilled, and "a" is resident there too.
    assert per[home.url] <= 5 and len(per) == 2
    assert p._r.counts[BASE]["overloaded"] >= 1


def test_a_miss_never_goes_above_the_mean_and_prefers_a_free_slot() -> None:
    p = policy(["a", "b", "c"], max_loras={BASE: 2})
    pool = probed_backends(3)
    busy = pool[0]
    for _ in range(4):
        busy.outstanding += 1
    b = p.pick(pool, RouteRequest("a"))
    assert b is not busy
    # "b" too: the replica that took "a" still has a free slot, the third replica two.
    c = p.pick(pool, RouteRequest("b"))
    assert c is not busy and c is not b


def test_a_restart_empties_the_replicas_slots() -> None:
    p = policy(["a", "b", "c"])
    pool = probed_backends(2)
    home = p.pick(pool, RouteRequest("a"))
    assert home is not None and "a" in home.cache_life.adapters
    home.cache_life = CacheLife(home)  # what the router does when its probe fails
    assert "a" not in home.cache_life.adapters


def test_lru_order_of_the_slots() -> None:
    p = policy(["a", "b", "c"], max_loras={BASE: 2})
    (b,) = probed_backends(1)
    for name in ("a", "b", "a", "c"):
        p.pick((b,), RouteRequest(name))
    assert list(b.cache_life.adapters) == ["a", "c"]  # "b" was the least recently used


def test_skewed_mix_keeps_each_replica_on_few_adapters() -> None:
    """The benchmark's workload in miniature: 6 adapters, one slot per replica, a skewed mix,
    two requests in flight at a time. Adapter switches per replica (what vLLM pays for) against
    least-outstanding."""
    rng = random.Random(7)
    names = ["a", "b", "c", "d", "e", "f"]
    weights = [0.4, 0.2, 0.15, 0.1, 0.1, 0.05]
    mix = rng.choices(names, weights, k=600)

    def switches(pick: Any) -> int:
        pool = probed_backends(2)
        last: dict[str, str] = {}
        n = 0
        flight: list[Backend] = []
        for name in mix:
            b = pick(pool, RouteRequest(name))
            b.outstanding += 1
            flight.append(b)
            if len(flight) > 2:
                flight.pop(0).outstanding -= 1
            if last.get(b.url) not in (None, name):
                n += 1
            last[b.url] = name
        return n

    resident = switches(policy(names).pick)
    least = switches(LeastOutstanding().pick)
    assert resident < least * 0.8, (resident, least)


def test_the_factory_wraps_adapter_pools_only() -> None:
    s = GatewaySettings(backends=["http://a:1"])
    lora = LoraSettings()
    residency = Residency(registry(["a", "b"], lora), lora)
    router = build_router(s, prober=None, residency=residency)  # type: ignore[arg-type]
    adapter_policy = router._policy_of("a")
    assert isinstance(adapter_policy, ResidentFirst)
    # Around the configured policy: prefix affinity still routes within the narrowed candidates.
    assert isinstance(adapter_policy.inner, PrefixAffinity) and adapter_policy.uses_affinity
    assert isinstance(router._policy_of(BASE), PrefixAffinity)
