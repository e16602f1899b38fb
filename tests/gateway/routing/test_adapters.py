"""The adapter set across replicas and gateways: what is learned, re-applied, retried and
forgotten (routing/adapters.py), with the router's view and the transport faked at the seam."""

from __future__ import annotations

from collections.abc import Mapping

import orjson
import pytest

from gateway.routing.adapters import RETRY_FIRST_S, Adapters
from gateway.routing.backend import Backend, CacheLife
from gateway.settings import LoraSettings
from gateway.transport.prober import ModelCard

BASE = "base"


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Answer:
    def __init__(self, status: int, body: bytes) -> None:
        self.status = status
        self._body = body

    async def read(self) -> bytes:
        return self._body

    def release(self) -> None:
        pass

    def close(self) -> None:
        pass


class Engines:
    """The replicas' adapter state, as their load and unload endpoints change it."""

    def __init__(self, urls: list[str]) -> None:
        self.loaded: dict[str, dict[str, str]] = {u: {} for u in urls}
        self.posts: list[tuple[str, str]] = []
        self.refuse: set[str] = set()  # urls whose loads fail
        self.keep: set[str] = set()  # urls whose unloads fail (the adapter stays loaded)

    async def post(self, url: str, body: bytes, headers: Mapping[str, str], *,
                   streaming: bool) -> Answer:
        base, _, path = url.partition("/v1/")
        doc = orjson.loads(body)
        name = doc["lora_name"]
        self.posts.append((base, f"{path}:{name}"))
        if path == "load_lora_adapter":
            if base in self.refuse:
                return Answer(500, b'{"error": {"message": "boom"}}')
            self.loaded[base][name] = doc["lora_path"]
        else:
            if base in self.keep:
                return Answer(500, b"no")
            self.loaded[base].pop(name, None)
        return Answer(200, b"ok")

    def cards(self, url: str) -> list[ModelCard]:
        return [ModelCard(BASE), *(ModelCard(n, BASE, p) for n, p in self.loaded[url].items())]


class FakeRouter:
    """What the registry reads of the router: backends, their availability and lives."""

    def __init__(self, adapters: Adapters, engines: Engines, urls: list[str]) -> None:
        self.adapters, self.engines = adapters, engines
        self.list = [Backend(u) for u in urls]

    def backends(self) -> list[Backend]:
        return self.list

    async def probe_all(self) -> None:
        for b in self.list:
            if b.probe_ok:
                self.adapters.observe(b.url, self.engines.cards(b.url))

    async def restart(self, b: Backend) -> None:
        """Down (a failed probe: a new life) and up with no adapters, then probed."""
        self.engines.loaded[b.url] = {}
        b.cache_life = CacheLife(b)
        await self.probe_all()


Setup = tuple[Adapters, FakeRouter, Engines, Clock]


@pytest.fixture
async def setup() -> Setup:
    urls = ["http://r0:8000", "http://r1:8000"]
    engines = Engines(urls)
    clock = Clock()
    adapters = Adapters(engines, LoraSettings(), clock=clock)  # type: ignore[arg-type]
    router = FakeRouter(adapters, engines, urls)
    adapters.attach(router)  # type: ignore[arg-type]
    for b in router.list:
        b.probe_ok = True
    await router.probe_all()
    return adapters, router, engines, clock


def listed(engines: Engines) -> dict[str, set[str]]:
    return {u: set(d) for u, d in engines.loaded.items()}


async def test_added_adapters_come_back_after_a_restart(setup: Setup) -> None:
    adapters, router, engines, _ = setup
    results = await adapters.add("a", BASE, "/m/a")
    assert all(r.ok for r in results) and adapters.parent_of("a") == BASE
    await router.restart(router.list[1])
    assert listed(engines)["http://r1:8000"] == set()
    assert await adapters.reconcile() == 1
    assert listed(engines) == {"http://r0:8000": {"a"}, "http://r1:8000": {"a"}}
    assert await adapters.reconcile() == 0  # up to date: nothing more


async def test_a_learned_adapter_is_not_pushed_onto_replicas_up_now(setup: Setup) -> None:
    """Another gateway's adapter, seen on r0 only (its removal on r1 done, say): r1 is left as it
    is; only a life that starts later (a restart) is brought up to date."""
    adapters, router, engines, _ = setup
    engines.loaded["http://r0:8000"]["b"] = "/m/b"
    await router.probe_all()
    assert adapters.parent_of("b") == BASE
    assert await adapters.reconcile() == 0 and "b" not in engines.loaded["http://r1:8000"]
    await router.restart(router.list[1])
    assert await adapters.reconcile() == 1 and "b" in engines.loaded["http://r1:8000"]


async def test_a_learned_adapter_without_its_path_is_not_reloaded(setup: Setup) -> None:
    """A replica lists an adapter with no `root`: it is served where it is, but nothing says
    where to load it from, so a restarted replica is not sent a load of an empty path."""
    adapters, router, engines, _ = setup
    engines.loaded["http://r0:8000"]["b"] = ""
    await router.probe_all()
    assert adapters.parent_of("b") == BASE
    await router.restart(router.list[1])
    posts = len(engines.posts)
    assert await adapters.reconcile() == 0 and len(engines.posts) == posts
    assert adapters.loads["failed"] == 0


async def test_removed_through_another_gateway_is_forgotten(setup: Setup) -> None:
    adapters, router, engines, _ = setup
    await adapters.add("a", BASE, "/m/a")
    for u in engines.loaded:  # the other gateway's DELETE
        engines.loaded[u].clear()
    await router.probe_all()
    await adapters.reconcile()
    assert adapters.get("a") is None and adapters.parent_of("a") is None
    await router.restart(router.list[0])
    assert await adapters.reconcile() == 0  # not loaded back onto a restarted replica


async def test_a_restart_of_every_replica_keeps_the_set(setup: Setup) -> None:
    adapters, router, engines, _ = setup
    await adapters.add("a", BASE, "/m/a")
    for b in router.list:
        await router.restart(b)
    # Nobody lists "a" now, but no life was brought up to date yet: it is kept and re-applied.
    assert await adapters.reconcile() == 2
    assert listed(engines) == {"http://r0:8000": {"a"}, "http://r1:8000": {"a"}}


async def test_a_failed_load_is_retried_with_a_backoff(setup: Setup) -> None:
    adapters, router, engines, clock = setup
    await adapters.add("a", BASE, "/m/a")
    engines.refuse.add("http://r1:8000")
    await router.restart(router.list[1])
    assert await adapters.reconcile() == 0
    tries = len(engines.posts)
    assert await adapters.reconcile() == 0 and len(engines.posts) == tries  # backing off
    clock.t += RETRY_FIRST_S
    engines.refuse.clear()
    assert await adapters.reconcile() == 1
    assert adapters.loads["failed"] == 1


async def test_a_removal_completes_before_the_name_is_learned_again(setup: Setup) -> None:
    adapters, _, engines, _ = setup
    await adapters.add("a", BASE, "/m/a")
    engines.keep.add("http://r1:8000")  # r1 keeps "a": its unload fails
    results = await adapters.remove("a")
    assert sorted(r.ok for r in results) == [False, True]
    # Still listed by r1: not learned again from there while the removal is incomplete.
    assert adapters.get("a") is None
    await adapters.reconcile()
    assert adapters.get("a") is None
