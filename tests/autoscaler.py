"""A test harness that plays the autoscaler's part, as KEDA's Prometheus trigger does it.

It reads the gateway's scaling signal the way a KEDA query would (`sum(llmserve_pool_demand{pool=
P})` over the gateway's /metrics), and decides a replica count the way KEDA and the HPA behind it
do: at zero, one replica as soon as the demand exceeds the activation threshold; above zero,
ceil(demand / target) within [1, max_replicas]. Scaling is the test's callback (start a fake
upstream, start a real engine). Only scale-up is played: the tests here are about waking a pool.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Self

from prometheus_client.parser import text_string_to_metric_families

from tests import loopback


def sample_value(gateway_url: str, name: str, **labels: str) -> float | None:
    """The value of the sample `name` (e.g. `llmserve_rejections_total`) whose labels include
    `labels`, in the gateway's /metrics; None when absent."""
    text = loopback.get(gateway_url + "/metrics", timeout=5).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                return sample.value
    return None


def pool_gauge(gateway_url: str, name: str, pool: str) -> float | None:
    """The value of gauge `name` for `pool`, None when absent."""
    return sample_value(gateway_url, name, pool=pool)


def desired_replicas(demand: float, current: int, target: float, max_replicas: int,
                     activation: float = 0.0) -> int:
    """KEDA's decision for a Prometheus trigger with metricType AverageValue."""
    if current == 0:
        return 1 if demand > activation else 0
    return max(1, min(max_replicas, math.ceil(demand / target)))


@dataclass
class Autoscaler:
    gateway_url: str
    pool: str
    scale: Callable[[int], None]
    target: float = 8.0
    max_replicas: int = 1
    poll_s: float = 0.1
    replicas: int = 0
    # (seconds since start, demand) per poll, and when each scaling decision was taken.
    samples: list[tuple[float, float]] = field(default_factory=list)
    decisions: list[tuple[float, int]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _started: float = 0.0

    def __enter__(self) -> Self:
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="autoscaler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            demand = pool_gauge(self.gateway_url, "llmserve_pool_demand", self.pool) or 0.0
            now = self.now()
            self.samples.append((now, demand))
            want = desired_replicas(demand, self.replicas, self.target, self.max_replicas)
            if want > self.replicas:
                self.decisions.append((now, want))
                self.scale(want)
                self.replicas = want
            self._stop.wait(self.poll_s)

    def now(self) -> float:
        """Seconds since the harness started (the clock of `samples` and `decisions`)."""
        return time.monotonic() - self._started

    def first_seen(self, demand: float) -> float | None:
        """Seconds from start to the first poll that read at least `demand`."""
        return next((t for t, d in self.samples if d >= demand), None)
