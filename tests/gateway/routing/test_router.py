from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from gateway.routing.discovery.static import StaticDiscovery
from gateway.routing.policy import LeastOutstanding
from gateway.routing.router import Router


class FakeProber:
    """Scripted replica answers: which URLs are healthy and what they serve."""

    def __init__(self, models: dict[str, list[str]]) -> None:
        self.models_by_url = models
        self.down: set[str] = set()

    async def health(self, base_url: str) -> bool:
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


A, B, C = "http://a:1", "http://b:1", "http://c:1"


@pytest.fixture
async def setup() -> AsyncIterator[tuple[Router, FakeProber, Clock]]:
    prober = FakeProber({A: ["llama"], B: ["llama"], C: ["qwen"]})
    clock = Clock()
    router = Router(StaticDiscovery([A, B, C]), prober, LeastOutstanding(),
                    health_interval_s=3600, eject_after_failures=2, eject_for_s=10, clock=clock)
    await router.start()
    assert await router.wait_ready(2)
    yield router, prober, clock
    await router.stop()


async def test_one_pool_per_model(setup: tuple[Router, FakeProber, Clock]) -> None:
    router, _, _ = setup
    assert router.models() == ["llama", "qwen"]
    assert {router.pick("llama").url for _ in range(4)} == {A, B}  # type: ignore[union-attr]
    assert router.pick("qwen").url == C  # type: ignore[union-attr]
    assert router.pick("nope") is None and not router.knows_model("nope")


async def test_exclude_skips_tried_backends(setup: tuple[Router, FakeProber, Clock]) -> None:
    router, _, _ = setup
    first = router.pick("llama")
    assert first is not None
    second = router.pick("llama", [first])
    assert second is not None and second is not first
    assert router.pick("llama", [first, second]) is None


async def test_passive_ejection_and_readmission(setup: tuple[Router, FakeProber, Clock]) -> None:
    router, _, clock = setup
    a = next(b for b in router.backends() if b.url == A)
    router.report_failure(a)
    assert a.available(clock.now)  # one failure is not enough
    router.report_failure(a)
    assert not a.available(clock.now)
    assert {router.pick("llama").url for _ in range(4)} == {B}  # type: ignore[union-attr]
    clock.now += 10
    assert a.available(clock.now)


async def test_success_resets_the_failure_count(setup: tuple[Router, FakeProber, Clock]) -> None:
    router, _, clock = setup
    a = next(b for b in router.backends() if b.url == A)
    router.report_failure(a)
    router.report_success(a)
    router.report_failure(a)
    assert a.available(clock.now)


async def test_failed_probe_makes_unavailable_but_model_still_known(
    setup: tuple[Router, FakeProber, Clock],
) -> None:
    router, prober, _ = setup
    prober.down = {C}
    await router.probe_all()
    assert router.pick("qwen") is None
    assert router.knows_model("qwen")  # 503, not 404
    assert router.models() == ["llama"]
    prober.down = set()
    await router.probe_all()
    assert router.pick("qwen") is not None


async def test_discovery_churn_adds_and_drops(setup: tuple[Router, FakeProber, Clock]) -> None:
    router, prober, _ = setup
    prober.models_by_url["http://d:1"] = ["qwen"]
    await router.set_backends(frozenset({A, "http://d:1"}))
    assert {b.url for b in router.backends()} == {A, "http://d:1"}
    assert router.pick("qwen").url == "http://d:1"  # type: ignore[union-attr]
    assert {router.pick("llama").url for _ in range(3)} == {A}  # type: ignore[union-attr]


async def test_not_ready_until_first_probe_passes() -> None:
    prober = FakeProber({})
    router = Router(StaticDiscovery([A]), prober, LeastOutstanding(), health_interval_s=0.05,
                    eject_after_failures=1, eject_for_s=1)
    await router.start()
    try:
        assert not await router.wait_ready(0.2)
        prober.models_by_url[A] = ["llama"]
        assert await router.wait_ready(2)
    finally:
        await router.stop()
        await asyncio.sleep(0)


async def test_no_model_known_before_any_probe_passes() -> None:
    router = Router(StaticDiscovery([A]), FakeProber({}), LeastOutstanding(),
                    health_interval_s=3600, eject_after_failures=1, eject_for_s=1)
    await router.start()
    try:
        await asyncio.sleep(0.05)
        assert not router.knows_any_model() and not router.knows_model("llama")
    finally:
        await router.stop()
