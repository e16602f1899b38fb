"""The scaling signal: each pool's demand, as an autoscaler should read it.

Demand = requests waiting for a replica of a pool at zero (routing/wake.py) + requests waiting in
the pool's admission queue + admitted requests in flight: what the pool is asked to carry,
whatever admission does with it (the engines' own queue stays short under admission control, so
it cannot serve). Read at scrape time; every model the router knows is listed, 0 when idle, so an
autoscaler's query finds a series even for a pool that never had a request. docs/autoscaling.md.
"""

from __future__ import annotations

from collections.abc import Iterator

from gateway.flow.admission import Admission
from gateway.routing.router import Router
from gateway.routing.wake import WakeGate


class Demand:
    def __init__(self, router: Router, admission: Admission | None,
                 wake: WakeGate | None) -> None:
        self._router = router
        self._admission = admission
        self._wake = wake

    def view(self) -> Iterator[tuple[str, int, int]]:
        """(pool, demand, ready replicas) per pool, sorted by pool."""
        ready = self._router.replicas()
        admitted: dict[str, int] = {}
        if self._admission is not None:
            for name, queued, _, _, in_flight in self._admission.view():
                admitted[name] = queued + in_flight
        wake = self._wake
        for pool in sorted(ready.keys() | admitted.keys()):
            waking = wake.waiting(pool) if wake is not None else 0
            yield pool, admitted.get(pool, 0) + waking, ready.get(pool, 0)
