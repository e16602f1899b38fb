"""Requests for a pool at zero replicas wait here until a replica is routable, or their wake
budget runs out (then 503 `model_waking` with a Retry-After, never a 404).

The wait is counted in the pool's demand (flow/demand.py), which is what its autoscaler reads to
start a replica; when the router sees one pass its probe (`Router.listen`) every waiter goes on
through admission as any request does. Pools not declared `scale_to_zero` never wait.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from gateway.errors import Unavailable, retry_after_s
from gateway.metrics import GatewayMetrics
from gateway.routing.router import Router

# A request refused at its wake budget is told to come back within this long (or the budget, if
# shorter): its pool is on its way up, since the waits were counted in the demand.
WAKE_RETRY_AFTER_S = 30.0


class WakeGate:
    """Waiting rooms of the pools that may scale to zero, one per model."""

    def __init__(self, budgets: Mapping[str, float], router: Router,
                 metrics: GatewayMetrics) -> None:
        self._budgets = dict(budgets)
        self._router = router
        self._metrics = metrics
        self._waiting = dict.fromkeys(self._budgets, 0)
        # Set when the model turns routable; replaced by a fresh one for the next wait.
        self._woken: dict[str, asyncio.Event] = {}
        router.listen(self._changed)

    def asleep(self, model: str) -> bool:
        """`model` may scale to zero and has no routable replica now: the request must wait.
        One dict lookup for every other model (the hot path)."""
        return model in self._budgets and not self._router.routable(model)

    def waiting(self, model: str) -> int:
        return self._waiting.get(model, 0)

    async def wait(self, pool: str, model: str | None = None) -> None:
        """Until `model` (by default `pool` itself; else a LoRA adapter of it) has a routable
        replica; raises `Unavailable` (503, Retry-After) when `pool`'s wake budget is spent first.
        An adapter is loaded on a replica that joins only after the replica's first probe
        (routing/adapters.py): its requests wait for that too, not only for the base, or they
        would meet a 404. Cancellation (client gone, drain) leaves quietly."""
        target = model or pool
        budget = self._budgets[pool]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + budget
        self._waiting[pool] += 1
        try:
            # A loop, not one wait: a replica that passed one probe may fail the next before
            # this request's turn comes.
            while not self._router.routable(target):
                woken = self._woken.get(target)
                if woken is None or woken.is_set():
                    woken = self._woken[target] = asyncio.Event()
                try:
                    async with asyncio.timeout_at(deadline):
                        await woken.wait()
                except TimeoutError:
                    self._metrics.rejections.labels(pool, "wake_timeout").inc()
                    wait = min(budget, WAKE_RETRY_AFTER_S)
                    raise Unavailable(
                        f"model '{target}' has no ready replica yet (its pool is scaling up from "
                        f"zero); retry after {retry_after_s(wait)}s",
                        code="model_waking", retry_after=wait,
                    ) from None
        finally:
            self._waiting[pool] -= 1

    def _changed(self) -> None:
        """The router's view changed: wake the waiters of every model (or adapter) that is
        routable now."""
        for model, woken in self._woken.items():
            if not woken.is_set() and self._router.routable(model):
                woken.set()
