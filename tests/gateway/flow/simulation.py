"""Flow control on virtual time: the real admission `Pool` in front of a simulated engine.

The event loop is asyncio's own selector loop with a clock that jumps to the next timer instead of
waiting for it (`VirtualLoop`), so a 30 s overload runs in about a second, and the same seed gives
the same arrivals, the same decisions and the same figures on any machine, however loaded. Only
public asyncio API is used: a selector whose `select(timeout)` advances the clock by `timeout`, and
a loop whose `time()` reads that clock.

What is simulated is the seam the door decides on: the engine (sequence slots served first come,
first served; a first token `first_token_s` after a slot is taken, then `tokens` tokens
`token_s` apart) and the clients (open-loop Poisson arrivals, or closed-loop users who think between
requests). What is real is everything the gateway decides: `Pool.try_acquire` / `acquire` /
`sample` / `release`, exactly as `gateway/api/proxy.py` calls them.
"""

from __future__ import annotations

import asyncio
import random
import selectors
import statistics
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.errors import Unavailable
from gateway.flow.admission import Admission
from gateway.metrics import GatewayMetrics
from gateway.settings import FlowSettings


class _VirtualSelector(selectors.BaseSelector):
    """Never waits: a `select(timeout)` moves the clock `timeout` on and reports nothing ready."""

    def __init__(self) -> None:
        self.now = 0.0
        self._map: dict[int, selectors.SelectorKey] = {}

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        key = selectors.SelectorKey(fileobj, fd, events, data)
        self._map[fd] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        return self._map.pop(fd)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            raise RuntimeError("simulation stalled: nothing scheduled and nothing ready")
        self.now += max(0.0, timeout)
        return []

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._map

    def close(self) -> None:
        self._map.clear()


class VirtualLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self._selector_clock = _VirtualSelector()
        super().__init__(self._selector_clock)

    def time(self) -> float:
        return self._selector_clock.now


def run_virtual(main: Callable[[], Awaitable[Any]]) -> Any:
    loop = VirtualLoop()
    try:
        return loop.run_until_complete(main())
    finally:
        loop.close()


@dataclass(frozen=True)
class Engine:
    """An engine's pace: `slots` sequences at once (0: unlimited), then its tokens."""

    slots: int
    first_token_s: float
    token_s: float
    tokens: int


@dataclass
class Outcome:
    sent: float
    status: int  # 200 or the refusal's status
    ttft_s: float = 0.0  # admitted: client-seen time to first token (door wait included)
    answered_s: float = 0.0  # refused: how long the refusal took
    retry_after: float | None = None
    overflow: bool = False
    done_at: float = 0.0  # admitted: when its last token came


@dataclass
class Run:
    outcomes: list[Outcome] = field(default_factory=list)
    duration_s: float = 0.0

    @property
    def admitted(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status == 200]

    @property
    def refused(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status != 200]

    def ttft_p99(self) -> float:
        return quantile([o.ttft_s for o in self.admitted], 0.99)

    def refusal_p99(self) -> float:
        return quantile([o.answered_s for o in self.refused], 0.99)

    def goodput(self) -> float:
        """Requests per second answered in full within the run's duration."""
        return sum(o.done_at <= self.duration_s for o in self.admitted) / self.duration_s


def quantile(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    if len(xs) == 1:
        return xs[0]
    return statistics.quantiles(xs, n=1000, method="inclusive")[int(q * 1000) - 1]


class _Gateway:
    """The door and the engine behind it; `None` settings: the engine alone."""

    def __init__(self, engine: Engine, flow: FlowSettings | None) -> None:
        self.engine = engine
        self.slots = asyncio.Semaphore(engine.slots) if engine.slots else None
        self.metrics = GatewayMetrics()
        self.admission = (Admission(flow, self.metrics, asyncio.get_running_loop().time)
                          if flow is not None else None)

    def overflows(self) -> float:
        v = self.metrics.registry.get_sample_value("llmserve_queue_overflows_total",
                                                   {"pool": "demo"})
        return v or 0.0

    async def request(self, out: Outcome) -> None:
        loop = asyncio.get_running_loop()
        pool = self.admission.pool("demo") if self.admission is not None else None
        if pool is not None:
            tenant = self.admission.tenants.for_key(None)  # type: ignore[union-attr]
            if not pool.try_acquire(tenant.name, tenant.weight):
                overflows = self.overflows()
                try:
                    await pool.acquire(tenant, 1)
                except Unavailable as exc:
                    out.status, out.answered_s = exc.status, loop.time() - out.sent
                    out.retry_after = exc.retry_after
                    return
                out.overflow = self.overflows() > overflows
        dispatched = loop.time()
        try:
            if self.slots is not None:
                await self.slots.acquire()
            try:
                await asyncio.sleep(self.engine.first_token_s)
                now = loop.time()
                out.ttft_s = now - out.sent
                if pool is not None:
                    pool.sample(now - dispatched, dispatched)
                await asyncio.sleep(self.engine.tokens * self.engine.token_s)
                out.done_at = loop.time()
            finally:
                if self.slots is not None:
                    self.slots.release()
        finally:
            if pool is not None:
                pool.release()


def open_loop(engine: Engine, flow: FlowSettings | None, rate: float, duration_s: float,
              seed: int = 1) -> Run:
    """Poisson arrivals at `rate`/s for `duration_s`; every request runs to its end."""

    async def main() -> Run:
        gw = _Gateway(engine, flow)
        loop = asyncio.get_running_loop()
        rng = random.Random(seed)
        run = Run(duration_s=duration_s)
        tasks = []
        t = 0.0
        while True:
            t += rng.expovariate(rate)
            if t >= duration_s:
                break
            await asyncio.sleep(max(0.0, t - loop.time()))
            out = Outcome(sent=loop.time(), status=200)
            run.outcomes.append(out)
            tasks.append(asyncio.create_task(gw.request(out)))
        await asyncio.gather(*tasks)
        return run

    result: Run = run_virtual(main)
    return result


def closed_loop(engine: Engine, flow: FlowSettings | None, users: int, think_s: float,
                duration_s: float, seed: int = 1, start_s: float = 0.0) -> Run:
    """`users` clients, each sending its next request `think_s` (exponential, that mean) after its
    last one was answered or refused, for `duration_s`. Their first requests are spread
    uniformly over `start_s`: 0 for all at once (a cold gateway meets the whole load in one
    instant), tens of milliseconds for a load generator's connections reaching it one by one,
    `think_s` for users already in their rhythm."""

    async def main() -> Run:
        gw = _Gateway(engine, flow)
        loop = asyncio.get_running_loop()
        rng = random.Random(seed)
        run = Run(duration_s=duration_s)

        async def user() -> None:
            await asyncio.sleep(rng.uniform(0.0, start_s) if start_s else 0.0)
            while loop.time() < duration_s:
                out = Outcome(sent=loop.time(), status=200)
                run.outcomes.append(out)
                await gw.request(out)
                await asyncio.sleep(rng.expovariate(1.0 / think_s))

        await asyncio.gather(*(user() for _ in range(users)))
        return run

    result: Run = run_virtual(main)
    return result
