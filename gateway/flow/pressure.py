"""Engine pressure: the engines' own queue and KV cache, scraped from their /metrics, off the hot
path. The limiter's TTFT signal arrives one prefill late; vLLM says earlier. A pool backs off when
an engine reports waiting requests on two scrapes in a row (one is often a request caught
between arrival and the next engine step), or KV cache usage at `kv_cache_high` or above.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from gateway.errors import GatewayError
from gateway.flow.admission import Admission
from gateway.routing.backend import Backend
from gateway.settings import FlowSettings
from gateway.transport import Transport

WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
_FAMILIES = (WAITING, KV_USAGE, f"# TYPE {WAITING} ", f"# TYPE {KV_USAGE} ")


@dataclass(frozen=True, slots=True)
class EngineLoad:
    waiting: float
    kv_usage: float


def parse_engine_load(text: str) -> EngineLoad | None:
    """Sum of waiting requests and the highest KV usage over the engine's series; None if the
    page has neither (not a vLLM engine, or an unknown version). The scrape runs on the event
    loop, so prometheus_client's parser reads only the two families' lines, not the whole page."""
    lines = [line for line in text.splitlines() if line.startswith(_FAMILIES)]
    waiting = kv = 0.0
    seen = False
    for family in text_string_to_metric_families("\n".join(lines) + "\n"):
        # `vllm:num_requests_waiting_by_reason` starts alike and is its own family: skipped here.
        if family.name == WAITING:
            waiting += sum(s.value for s in family.samples)
            seen = True
        elif family.name == KV_USAGE:
            kv = max([kv, *(s.value for s in family.samples)])
            seen = True
    return EngineLoad(waiting, kv) if seen else None


class PressureWatch:
    """Scrapes every backend and backs off the limit of every model of a strained one."""

    def __init__(self, settings: FlowSettings, admission: Admission,
                 backends: Callable[[], list[Backend]], transport: Transport) -> None:
        self._s = settings
        self._admission = admission
        self._backends = backends
        self._transport = transport
        self._waiting_before: set[str] = set()

    async def scrape_once(self) -> None:
        backends = [b for b in self._backends() if b.probe_ok and b.models]
        loads = await asyncio.gather(*(self._load(b.url) for b in backends))
        waiting_now: set[str] = set()
        strained: set[str] = set()
        for b, load in zip(backends, loads, strict=True):
            if load is None:
                continue
            if load.waiting > 0:
                waiting_now.add(b.url)
                if b.url in self._waiting_before:
                    strained.update(b.models)
            if load.kv_usage >= self._s.kv_cache_high:
                strained.update(b.models)
        self._waiting_before = waiting_now
        for m in strained:
            self._admission.pool(m).limiter.on_pressure()

    async def _load(self, url: str) -> EngineLoad | None:
        try:
            status, body = await self._transport.get(url + "/metrics", self._s.scrape_interval_s)
        except GatewayError:
            return None
        if status != 200:
            return None
        return parse_engine_load(body.decode("utf-8", "replace"))
