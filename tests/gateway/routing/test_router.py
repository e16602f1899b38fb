from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterator

import pytest

from gateway.routing.backend import Backend
from gateway.routing.discovery.static import Static
from gateway.routing.policy import LeastOutstanding
from gateway.routing.router import Router
from tests.waiting import settle


class FakeProber:
    """Scripted replica answers: which URLs are healthy and what they serve."""

    def __init__(self, models: dict[str, list[str]]) -> None:
        self.models_by_url = models
        self.down: set[str] = set()
        self.raises: set[str] = set()
        # Health probes asked, per URL: the router has acted on a probe once the next one is
        # asked, or, for a failed one, once the probing task has run past it.
        self.probes: Counter[str] = Counter()

    async def health(self, base_url: str) -> bool:
        self.probes[base_url] += 1
        if base_url in self.raises:
            raise ConnectionResetError("prober bug or unexpected transport error")
        return base_url in self.models_by_url and base_url not in self.down

    async def models(self, base_url: str) -> list[str] | None:
        if base_url in self.down or base_url not in self.models_by_url:
            return None
        return self.models_by_url[base_url]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class PushDiscovery:
    """Discovery driven by the test: each put() is one update."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[frozenset[str]] = asyncio.Queue()

    def put(self, *urls: str) -> None:
        self.queue.put_nowait(frozenset(urls))

    async def updates(self) -> AsyncGenerator[frozenset[str], None]:
        while True:
            yield await self.queue.get()


A, B, C = "http://a:1", "http://b:1", "http://c:1"


def least(model: str) -> LeastOutstanding:
    """One least-outstanding policy per model pool."""
    return LeastOutstanding()
Setup = tuple[Router, FakeProber, Clock]


def url(b: Backend | None) -> str:
    assert b is not None
    return b.url


def backend(router: Router, u: str) -> Backend:
    return next(b for b in router.backends() if b.url == u)


@pytest.fixture
async def setup() -> AsyncIterator[Setup]:
    prober = FakeProber({A: ["llama"], B: ["llama"], C: ["qwen"]})
    clock = Clock()
    router = Router(Static([A, B, C]), prober, least,
                    health_interval_s=3600, eject_after_failures=2, eject_for_s=10, clock=clock)
    await router.start()
    await settle(router.ready)
    yield router, prober, clock
    await router.stop()


async def test_one_pool_per_model(setup: Setup) -> None:
    router, _, _ = setup
    assert router.models() == ["llama", "qwen"]
    assert {url(router.pick("llama")) for _ in range(4)} == {A, B}
    assert {url(router.pick("qwen")) for _ in range(4)} == {C}
    assert router.pick("nope") is None and not router.knows_model("nope")


async def test_least_outstanding_within_the_pool(setup: Setup) -> None:
    router, _, _ = setup
    backend(router, A).outstanding += 1
    assert {url(router.pick("llama")) for _ in range(4)} == {B}
    backend(router, A).outstanding -= 1
    assert {url(router.pick("llama")) for _ in range(4)} == {A, B}


async def test_exclude_skips_tried_backends(setup: Setup) -> None:
    router, _, _ = setup
    first = router.pick("llama")
    assert first is not None
    second = router.pick("llama", [first])
    assert second is not None and second is not first
    assert router.pick("llama", [first, second]) is None


async def test_passive_ejection_and_readmission(setup: Setup) -> None:
    router, _, clock = setup
    a = backend(router, A)
    router.report_failure(a)
    assert a.available(clock.now)  # one failure is not enough
    router.report_failure(a)
    assert not a.available(clock.now)
    assert {url(router.pick("llama")) for _ in range(4)} == {B}
    clock.now += 9.9
    assert router.pick("llama", [backend(router, B)]) is None
    clock.now += 0.1
    assert a.available(clock.now)
    assert {url(router.pick("llama")) for _ in range(4)} == {A, B}


async def test_a_replica_failing_every_other_request_is_ejected_but_never_the_last() -> None:
    """A brownout never fails `eject_after_failures` in a row; its failure rate ejects it."""
    for cap in (50, 100):
        clock = Clock()
        router = Router(Static([A, B, C]), FakeProber({A: ["llama"], B: ["llama"], C: ["qwen"]}),
                        least, health_interval_s=3600, eject_after_failures=2, eject_for_s=10,
                        eject_failure_rate=0.3, max_ejection_percent=cap, clock=clock)
        await router.start()
        try:
            await settle(router.ready)
            a, b = backend(router, A), backend(router, B)
            for i in range(10):
                router.report_success(a) if i % 2 else router.report_failure(a)
                if not a.available(clock.now):
                    break
            assert not a.available(clock.now) and i < 10
            clock.now += 10
            assert a.available(clock.now) and a.failure_rate == 0.0  # a clean slate again
            router.report_failure(a), router.report_failure(a)  # consecutive: ejected
            for i in range(40):
                router.report_success(b) if i % 2 else router.report_failure(b)
            assert b.available(clock.now)
            router.report_failure(b), router.report_failure(b)  # two in a row
            # At most 50% of the pool may be ejected: the last one available is kept (some of
            # its answers succeed, none would without it). Without the cap it goes too.
            assert b.available(clock.now) == (cap == 50)
        finally:
            await router.stop()


async def test_passing_probe_does_not_cut_an_ejection_short(setup: Setup) -> None:
    router, _, clock = setup
    a = backend(router, A)
    router.report_failure(a)
    router.report_failure(a)
    await router.probe_all()  # /health still says 200
    assert not a.available(clock.now)
    clock.now += 10
    assert a.available(clock.now)


async def test_failing_probe_during_ejection_keeps_it_out(setup: Setup) -> None:
    router, prober, clock = setup
    a = backend(router, A)
    router.report_failure(a)
    router.report_failure(a)
    prober.down = {A}
    await router.probe_all()
    clock.now += 10
    assert not a.available(clock.now)
    prober.down = set()
    await router.probe_all()
    assert a.available(clock.now)


async def test_success_resets_the_failure_count(setup: Setup) -> None:
    router, _, clock = setup
    a = backend(router, A)
    router.report_failure(a)
    router.report_success(a)
    router.report_failure(a)
    assert a.available(clock.now)


async def test_all_ejected_is_not_ready_but_panic_still_routes() -> None:
    prober = FakeProber({A: ["llama"], B: ["llama"], C: ["qwen"]})
    clock = Clock()
    # No ejection cap: every backend can be ejected at once.
    router = Router(Static([A, B, C]), prober, least, health_interval_s=3600,
                    eject_after_failures=2, eject_for_s=10, max_ejection_percent=100, clock=clock)
    await router.start()
    try:
        await settle(router.ready)
        for b in router.backends():
            router.report_failure(b)
            router.report_failure(b)
        assert not router.ready() and router.models() == []
        assert router.knows_model("llama")
        # Panic mode: only passive ejection holds them back, so they still take traffic.
        assert {url(router.pick("llama")) for _ in range(4)} == {A, B}
        assert router.panics["llama"] == 4
        clock.now += 10
        assert router.ready()
    finally:
        await router.stop()


async def test_failed_probe_makes_unavailable_but_model_still_known(setup: Setup) -> None:
    router, prober, _ = setup
    prober.down = {C}
    await router.probe_all()
    assert router.pick("qwen") is None
    assert router.knows_model("qwen")  # 503, not 404
    assert not router.knows_model("gpt-5")  # 404
    assert router.models() == ["llama"]
    prober.down = set()
    await router.probe_all()
    assert url(router.pick("qwen")) == C


async def test_prober_exception_counts_as_down_and_probing_goes_on(setup: Setup) -> None:
    router, prober, _ = setup
    prober.raises = {C}
    await router.probe_all()
    assert router.pick("qwen") is None and url(router.pick("llama")) in {A, B}
    prober.raises = set()
    await router.probe_all()
    assert url(router.pick("qwen")) == C


async def test_probe_loop_marks_down_and_up() -> None:
    prober = FakeProber({A: ["llama"], B: ["llama"]})
    router = Router(Static([A, B]), prober, least, health_interval_s=0.01,
                    eject_after_failures=1, eject_for_s=1)
    await router.start()
    try:
        await settle(router.ready)
        await settle(lambda: len(router.models()) == 1)
        prober.down = {B}
        await settle(lambda: {url(router.pick("llama")) for _ in range(4)} == {A})
        prober.down = set()
        await settle(lambda: {url(router.pick("llama")) for _ in range(4)} == {A, B})
    finally:
        await router.stop()


async def test_discovery_churn_through_updates() -> None:
    prober = FakeProber({A: ["llama"], B: ["llama"], C: ["qwen"]})
    disco = PushDiscovery()
    router = Router(disco, prober, least, health_interval_s=3600,
                    eject_after_failures=1, eject_for_s=60)
    await router.start()
    try:
        disco.put(A)
        await settle(router.ready)
        assert router.models() == ["llama"]

        disco.put(A, B + "/", C)  # scale-up; a trailing slash is the same base URL
        await settle(lambda: router.models() == ["llama", "qwen"])
        assert sorted(b.url for b in router.backends()) == [A, B, C]
        assert {url(router.pick("llama")) for _ in range(4)} == {A, B}

        in_flight = router.pick("qwen")
        assert in_flight is not None
        in_flight.outstanding += 1
        router.report_failure(in_flight)  # ejected
        disco.put(A, B)  # C's pod went away mid-request
        await settle(lambda: len(router.backends()) == 2)
        assert router.pick("qwen") is None and not router.knows_model("qwen")
        in_flight.outstanding -= 1  # the request still holds its reference and finishes normally
        assert in_flight.outstanding == 0

        disco.put(A, B, C)  # C comes back: a fresh backend, no ejection carried over
        await settle(lambda: router.pick("qwen") is not None)
        assert backend(router, C) is not in_flight
    finally:
        await router.stop()


async def test_new_backend_is_unavailable_until_its_first_probe_passes() -> None:
    prober = FakeProber({A: ["llama"]})
    disco = PushDiscovery()
    router = Router(disco, prober, least, health_interval_s=0.02,
                    eject_after_failures=1, eject_for_s=1)
    await router.start()
    try:
        disco.put(A)
        await settle(router.ready)
        disco.put(A, B)  # B still loading its model: /health fails
        await settle(lambda: len(router.backends()) == 2)
        assert not backend(router, B).available(0.0)
        assert {url(router.pick("llama")) for _ in range(4)} == {A}
        prober.models_by_url[B] = ["llama"]
        await settle(lambda: {url(router.pick("llama")) for _ in range(4)} == {A, B})
    finally:
        await router.stop()


async def test_not_ready_until_first_probe_passes() -> None:
    prober = FakeProber({})
    router = Router(Static([A]), prober, least, health_interval_s=0.05,
                    eject_after_failures=1, eject_for_s=1)
    await router.start()
    try:
        await settle(lambda: prober.probes[A] >= 4)  # four failed probes, acted on
        assert not router.ready()
        prober.models_by_url[A] = ["llama"]
        await settle(router.ready)
    finally:
        await router.stop()


async def test_no_model_known_before_any_probe_passes() -> None:
    prober = FakeProber({})
    router = Router(Static([A]), prober, least,
                    health_interval_s=3600, eject_after_failures=1, eject_for_s=1)
    await router.start()
    try:
        # The first probe failed, and the probing task ran past it (no await after a failure).
        await settle(lambda: prober.probes[A] == 1)
        assert not router.knows_any_model() and not router.knows_model("llama")
        assert router.pick("llama") is None and not router.ready()
    finally:
        await router.stop()


async def test_stop_cancels_background_tasks() -> None:
    router = Router(PushDiscovery(), FakeProber({}), least, health_interval_s=0.01,
                    eject_after_failures=1, eject_for_s=1)
    await router.start()
    tasks = [t for t in asyncio.all_tasks() if t.get_name().startswith("router-")]
    assert len(tasks) == 2
    await router.stop()
    assert all(t.done() for t in tasks)


# -- ejection limits, panic mode, per-pool policies ---------------------------------------------

D = "http://d:1"


async def limited_router(prober: FakeProber, urls: list[str], percent: int,
                         **kw: object) -> Router:
    router = Router(Static(urls), prober, least, health_interval_s=3600,
                    eject_after_failures=1, eject_for_s=10, max_ejection_percent=percent,
                    **kw)  # type: ignore[arg-type]
    await router.start()
    await settle(router.ready)
    await settle(lambda: len(router.models()) == 1)
    return router


async def test_at_most_the_configured_share_of_a_pool_is_ejected() -> None:
    clock = Clock()
    prober = FakeProber({u: ["llama"] for u in (A, B, C, D)})
    router = await limited_router(prober, [A, B, C, D], 50, clock=clock)
    try:
        for u in (A, B, C):
            router.report_failure(backend(router, u))
        now = clock.now
        assert [backend(router, u).available(now) for u in (A, B, C, D)] == [
            False, False, True, True]  # C spared: 2 of 4 are out already
        clock.now += 10  # A and B are back; now C may go
        router.report_failure(backend(router, C))
        assert not backend(router, C).available(clock.now)
    finally:
        await router.stop()


async def test_zero_percent_never_ejects() -> None:
    clock = Clock()
    router = await limited_router(FakeProber({A: ["llama"], B: ["llama"]}), [A, B], 0,
                                  clock=clock)
    try:
        router.report_failure(backend(router, A))
        assert backend(router, A).available(clock.now)
    finally:
        await router.stop()


async def test_panic_routes_to_ejected_backends_but_never_to_probe_failed_ones() -> None:
    clock = Clock()
    prober = FakeProber({A: ["llama"], B: ["llama"]})
    router = await limited_router(prober, [A, B], 50, clock=clock)
    try:
        prober.down = {A}
        await router.probe_all()  # A fails its probe (not an ejection)
        router.report_failure(backend(router, B))  # B ejected: 1 of 2, within the cap
        assert not backend(router, B).available(clock.now)
        # Every backend looks bad: B (only ejected) takes the traffic, not a 503; A stays out.
        assert {url(router.pick("llama")) for _ in range(3)} == {B}
        assert router.panics == {"llama": 3}
        assert list(router.routing_stats()) == [("llama", 0, 0, {}, 0, 0, 3)]
        # A retry that already tried B finds nothing else: the caller answers 503.
        assert router.pick("llama", [backend(router, B)]) is None
        prober.down = set()
        await router.probe_all()
        assert {url(router.pick("llama")) for _ in range(3)} == {A}  # no panic: A is up
        assert router.panics == {"llama": 3}
    finally:
        await router.stop()


async def test_policy_per_pool_and_an_engine_restart_forgets_its_cache() -> None:
    from gateway.routing.affinity import PrefixAffinity
    from gateway.routing.policy import RouteRequest

    prober = FakeProber({A: ["llama"], B: ["llama"], C: ["qwen"]})
    made: dict[str, object] = {}

    def policy_for(model: str) -> PrefixAffinity | LeastOutstanding:
        p = PrefixAffinity() if model == "llama" else LeastOutstanding()
        made[model] = p
        return p

    router = Router(Static([A, B, C]), prober, policy_for, health_interval_s=3600,
                    eject_after_failures=1, eject_for_s=10)
    await router.start()
    try:
        await settle(router.ready)
        await settle(lambda: router.models() == ["llama", "qwen"])
        assert router.wants_affinity("llama") and not router.wants_affinity("qwen")
        policy = made["llama"]
        assert isinstance(policy, PrefixAffinity)
        prompt = b"system prompt " * 200
        home = router.pick("llama", (), RouteRequest("llama", None, prompt))
        assert home is not None
        assert router.pick("llama", (), RouteRequest("llama", None, prompt + b"more")) is home
        assert policy.stats.hits == 1
        # The engine restarts: its probe fails (vLLM takes minutes to come back), then passes.
        prober.down = {home.url}
        await router.probe_all()
        prober.down = set()
        await router.probe_all()
        router.pick("llama", (), RouteRequest("llama", None, prompt + b"more again"))
        assert policy.stats.hits == 1 and policy.stats.misses == 2  # not trusted: a miss
        stats = {m: rest for m, *rest in router.routing_stats()}
        assert set(stats) == {"llama"} and stats["llama"][0] == 1
    finally:
        await router.stop()


async def test_a_draining_engine_forgets_its_cache_like_a_failed_probe() -> None:
    # A worker's 'draining' 503 (a rolling restart) takes it out before its probe fails; the
    # engine that comes back has an empty cache, so what was learnt about it must count as a miss.
    from gateway.routing.affinity import PrefixAffinity
    from gateway.routing.policy import RouteRequest

    prober = FakeProber({A: ["llama"], B: ["llama"]})
    policy = PrefixAffinity()
    router = Router(Static([A, B]), prober, lambda _: policy, health_interval_s=3600,
                    eject_after_failures=1, eject_for_s=10)
    await router.start()
    try:
        await settle(router.ready)
        await settle(lambda: router.models() == ["llama"])
        prompt = b"system prompt " * 200
        home = router.pick("llama", (), RouteRequest("llama", None, prompt))
        assert home is not None
        assert router.pick("llama", (), RouteRequest("llama", None, prompt + b"x")) is home
        assert policy.stats.hits == 1
        router.report_draining(home)
        assert not home.available(router._clock())
        await router.probe_all()  # its probe passes again: back in, with a new cache life
        assert home.available(router._clock())
        router.pick("llama", (), RouteRequest("llama", None, prompt + b"xy"))
        assert policy.stats.hits == 1 and policy.stats.misses == 2
    finally:
        await router.stop()


async def test_a_model_that_may_scale_to_zero_is_known_listed_and_ready_without_replicas() -> None:
    prober = FakeProber({A: ["llama"]})
    disco = PushDiscovery()
    router = Router(disco, prober, least, health_interval_s=3600,
                    eject_after_failures=1, eject_for_s=60, standby=["qwen"])
    changes: list[bool] = []
    router.listen(lambda: changes.append(router.routable("qwen")))
    await router.start()
    try:
        # Nothing discovered yet: the declared model is known (not a 404), listed with 0
        # replicas, and the gateway is ready (it must take the requests that wake the pool).
        assert router.knows_model("qwen") and router.knows_any_model()
        assert not router.knows_model("llama")
        assert router.models() == ["qwen"] and router.replicas() == {"qwen": 0}
        assert router.ready() and not router.routable("qwen")
        assert router.pick("qwen") is None

        disco.put(A)
        await settle(lambda: router.models() == ["llama", "qwen"])
        assert changes == [False]  # A came up, serving another model
        assert router.replicas() == {"llama": 1, "qwen": 0}

        prober.models_by_url[C] = ["qwen"]
        disco.put(A, C)  # the autoscaler started a replica; discovery sees it, probed at once
        await settle(lambda: router.routable("qwen"))
        assert changes == [False, True]
        assert url(router.pick("qwen")) == C and router.replicas()["qwen"] == 1

        disco.put(A)  # scaled back to zero: still known and listed
        await settle(lambda: not router.routable("qwen"))
        assert router.knows_model("qwen") and "qwen" in router.models()
    finally:
        await router.stop()


async def test_routable_counts_ejected_replicas_but_not_failed_probes(setup: Setup) -> None:
    router, prober, _ = setup
    qwen = backend(router, C)
    for _ in range(2):
        router.report_failure(qwen)  # ejected: panic mode still routes to it
    assert not qwen.available(100.0) and router.routable("qwen")
    prober.down.add(C)
    await router.probe_all()
    assert not router.routable("qwen") and router.knows_model("qwen")
