"""The LoRA adapters the platform serves, kept the same on every replica of their base model.

An adapter a replica lists in /v1/models (seen through the prober's `observe`) or added through
the admin API belongs to its base's set; a reconcile round every probe period loads it on each
replica life (a join, or a restart) that misses it, once per life, so that an adapter another
gateway removed is not pushed back. docs/lora.md ("The adapter set") has the whole design.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import orjson

from gateway.errors import GatewayError, RateLimitedLog
from gateway.jsonobj import json_object
from gateway.routing.backend import Backend
from gateway.routing.router import Router
from gateway.settings import LoraSettings
from gateway.transport import Transport
from gateway.transport.prober import ModelCard

log = logging.getLogger("gateway.adapters")

LOAD_PATH = "/v1/load_lora_adapter"
UNLOAD_PATH = "/v1/unload_lora_adapter"
# After a failed load on one replica: wait this long before the next try, doubling up to the max.
RETRY_FIRST_S = 2.0
RETRY_MAX_S = 60.0


@dataclass
class Adapter:
    """One adapter of the set: its base model and its directory on the shared volume."""

    name: str
    base: str
    path: str
    # Added through this gateway (kept even while no replica lists it); else learned.
    ours: bool = False


@dataclass(frozen=True)
class LoadResult:
    url: str
    ok: bool
    detail: str


class Adapters:
    """The adapter set per base, what each replica lists, and the reconcile loop."""

    def __init__(self, transport: Transport, settings: LoraSettings,
                 clock: Callable[[], float] = time.monotonic,
                 declared: Mapping[str, str] | None = None) -> None:
        self._transport = transport
        # adapter -> base, as the pools declare them (GATEWAY_POOLS): their workers load them at
        # start, so a gateway that has seen no replica yet (a pool at zero) knows them, and their
        # requests wait for the pool rather than meet a 404.
        self._declared = dict(declared or {})
        self._settings = settings
        self._clock = clock
        self._router: Router | None = None
        self._adapters: dict[str, Adapter] = {}
        # Hot path (`parent_of`): adapter -> base, for every adapter declared, seen or added.
        self._parents: dict[str, str] = dict(self._declared)
        self._counts: dict[str, int] = {}  # base -> adapters in the set
        # url -> the adapters it has: its last listing, with our loads and unloads since
        self._has: dict[str, set[str]] = {}
        self._bases: dict[str, frozenset[str]] = {}  # url -> base models it serves
        self._failures = RateLimitedLog(log)  # failed loads: rate-limited log lines
        self._removed: set[str] = set()
        self._lock = asyncio.Lock()
        self.loads = {"ok": 0, "failed": 0}

    def attach(self, router: Router) -> None:
        self._router = router

    # -- what replicas list (called by the prober, before the router rebuilds its pools) --------

    def observe(self, url: str, cards: list[ModelCard]) -> None:
        url = url.rstrip("/")
        self._has[url] = {c.id for c in cards if c.parent is not None}
        self._bases[url] = frozenset(c.id for c in cards if c.parent is None)
        for c in cards:
            if c.parent is None or c.id in self._removed or c.id in self._adapters:
                continue
            self._adapters[c.id] = Adapter(c.id, c.parent, c.root or "")
            self._recount()
            # Learned, not added: replicas up now may miss it for a reason (another gateway's
            # removal in progress); only lives that come up from now on are brought up to date.
            for b in self._available():
                b.cache_life.ensured.add(c.id)
            log.info("adapter %s of %s seen on %s (%s)", c.id, c.parent, url, c.root)

    # -- per request -----------------------------------------------------------------------------

    def parent_of(self, model: str) -> str | None:
        """The base model of adapter `model`; None for a base model or an unknown name."""
        return self._parents.get(model)

    def count(self, base: str) -> int:
        """Adapters of `base` in the set."""
        return self._counts.get(base, 0)

    # -- views -----------------------------------------------------------------------------------

    def catalog(self) -> list[tuple[Adapter, list[str]]]:
        """Each adapter of the set with the replicas that list it (or loaded it), by name."""
        return [(a, sorted(u for u, names in self._has.items() if a.name in names))
                for a in sorted(self._adapters.values(), key=lambda a: a.name)]

    def served(self) -> list[tuple[str, str]]:
        """(adapter, base) for the adapters some available replica serves: the label values of
        the adapter metrics (never a name a client made up)."""
        up = {b.url for b in self._available()}
        return sorted((a.name, a.base) for a in self._adapters.values()
                      if any(a.name in self._present(u) for u in up))

    # -- admin -----------------------------------------------------------------------------------

    async def add(self, name: str, base: str, path: str) -> list[LoadResult]:
        """Load `name` on every available replica of `base` and keep it in the set if at least
        one took it (otherwise nothing changes; the results say why)."""
        async with self._lock:
            targets = [b for b in self._available() if base in self._bases.get(b.url, ())]
            results = await asyncio.gather(*(self._load(b, name, path) for b in targets))
            if any(r.ok for r in results):
                self._removed.discard(name)
                self._adapters[name] = Adapter(name, base, path, ours=True)
                self._recount()
                for b, r in zip(targets, results, strict=True):
                    if r.ok:
                        b.cache_life.ensured.add(name)
                log.info("adapter %s of %s added: %d of %d replica(s)", name, base,
                         sum(r.ok for r in results), len(results))
        await self._refresh()
        return list(results)

    async def remove(self, name: str) -> list[LoadResult]:
        """Unload `name` from every available replica that lists it, and drop it from the set."""
        async with self._lock:
            adapter = self._adapters.pop(name, None)
            self._removed.add(name)
            self._recount()
            targets = [b for b in self._available() if name in self._present(b.url)]
            results = await asyncio.gather(*(self._unload(b, name) for b in targets))
            for b in self._router.backends() if self._router is not None else []:
                b.cache_life.ensured.discard(name)
                b.cache_life.retry.pop(name, None)
            if adapter is not None:
                log.info("adapter %s of %s removed from %d replica(s)", name, adapter.base,
                         sum(r.ok for r in results))
        await self._refresh()
        return list(results)

    def get(self, name: str) -> Adapter | None:
        return self._adapters.get(name)

    # -- the reconcile round (every probe period: app.py) ----------------------------------------

    async def reconcile(self) -> int:
        """One round: bring every available replica's life up to date; returns the loads that
        succeeded."""
        loaded = 0
        async with self._lock:
            self._prune()
            now = self._clock()
            todo: list[tuple[Backend, Adapter]] = []
            for b in self._available():
                life = b.cache_life
                present = self._present(b.url)
                bases = self._bases.get(b.url, frozenset())
                for a in self._adapters.values():
                    if a.base not in bases or a.name in life.ensured:
                        continue
                    if a.name in present:
                        life.ensured.add(a.name)
                        continue
                    if not a.path:
                        continue  # learned from a listing without its root: nothing to load
                    if now >= life.retry.get(a.name, (0, 0.0))[1]:
                        todo.append((b, a))
            results = await asyncio.gather(*(self._load(b, a.name, a.path) for b, a in todo))
            now = self._clock()  # the loads took time: retries count from their answers
            for (b, a), r in zip(todo, results, strict=True):
                life = b.cache_life
                if r.ok:
                    life.ensured.add(a.name)
                    life.retry.pop(a.name, None)
                    loaded += 1
                    log.info("adapter %s re-applied on %s", a.name, b.url)
                else:
                    tries = life.retry.get(a.name, (0, 0.0))[0] + 1
                    wait = min(RETRY_FIRST_S * 2 ** (tries - 1), RETRY_MAX_S)
                    life.retry[a.name] = (tries, now + wait)
            self._forget()
        if loaded:
            await self._refresh()
        return loaded

    # -- helpers ---------------------------------------------------------------------------------

    def _available(self) -> list[Backend]:
        if self._router is None:
            return []
        now = self._clock()
        return [b for b in self._router.backends() if b.available(now)]

    def _present(self, url: str) -> set[str]:
        return self._has.get(url, set())

    def _recount(self) -> None:
        """Follow a change of the set in the hot path's maps."""
        self._parents = {**{n: b for n, b in self._declared.items() if n not in self._removed},
                         **{a.name: a.base for a in self._adapters.values()}}
        self._counts = Counter(a.base for a in self._adapters.values())

    def _prune(self) -> None:
        """Forget replicas that left."""
        if self._router is None:
            return
        urls = {b.url for b in self._router.backends()}
        for url in [u for u in self._has if u not in urls]:
            del self._has[url]
            self._bases.pop(url, None)

    def _forget(self) -> None:
        """An adapter that no available replica of its base lists, although each of them was
        brought up to date with it, was removed through another gateway: it leaves the set. (A
        replica still waiting for its load, a restarted one say, keeps it.) A removal this
        gateway made is complete when no replica lists the name; it may then be learned again."""
        up = self._available()
        for a in list(self._adapters.values()):
            replicas = [b for b in up if a.base in self._bases.get(b.url, ())]
            if replicas and all(
                a.name not in self._present(b.url) and a.name in b.cache_life.ensured
                for b in replicas
            ):
                del self._adapters[a.name]
                self._recount()
                log.info("adapter %s of %s is on no replica any more: forgotten", a.name, a.base)
        for name in list(self._removed):
            if up and not any(name in self._present(b.url) for b in up):
                self._removed.discard(name)

    async def _refresh(self) -> None:
        """Probe again so that the router's pools follow what was loaded or unloaded now."""
        if self._router is not None:
            await self._router.probe_all()

    async def _load(self, b: Backend, name: str, path: str) -> LoadResult:
        body = orjson.dumps({"lora_name": name, "lora_path": path})
        status, text = await self._post(b.url + LOAD_PATH, body)
        # vLLM answers 400 "has already been loaded" for a name it has: what we wanted.
        ok = status == 200 or (status == 400 and "already been loaded" in text)
        if ok:
            self._has.setdefault(b.url, set()).add(name)
            self.loads["ok"] += 1
        else:
            self.loads["failed"] += 1
            self._failures.warning("loading adapter %s (%s) on %s failed: %s", name, path, b.url,
                              text)
        return LoadResult(b.url, ok, text if not ok else "loaded")

    async def _unload(self, b: Backend, name: str) -> LoadResult:
        status, text = await self._post(b.url + UNLOAD_PATH, orjson.dumps({"lora_name": name}))
        ok = status in (200, 404)  # 404: it was not there (any more)
        if ok:
            self._present(b.url).discard(name)
        return LoadResult(b.url, ok, "unloaded" if ok else text)

    async def _post(self, url: str, body: bytes) -> tuple[int, str]:
        """(status, the answer's text or what went wrong); status 0 when there was no answer."""
        headers = {"content-type": "application/json"}
        try:
            async with asyncio.timeout(self._settings.load_timeout_s):
                resp = await self._transport.post(url, body, headers, streaming=False)
                raw = await resp.read()
        except TimeoutError:
            return 0, f"no answer within {self._settings.load_timeout_s:g} s"
        except GatewayError as exc:
            return 0, exc.message
        return resp.status, _message(raw)


def _message(raw: bytes) -> str:
    """An engine's answer as one line: its error message when it sent an OpenAI error."""
    doc = json_object(raw)
    err = doc.get("error", doc) if doc is not None else None
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        return str(err["message"])
    return raw[:300].decode("utf-8", "replace").strip()
