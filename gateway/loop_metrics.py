"""Metric families updated on the event loop only: plain numbers, no lock per update (the proxy
updates about fifteen values per request). The exposition is prometheus_client's (names, `_total`,
`_bucket{le}`, `_sum`, `_count`), built when Prometheus scrapes. A scrape from another thread may
read a histogram between its bucket and its sum, as prometheus_client's own can.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from typing import Generic, TypeVar

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry


class CounterValue:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class HistogramValue:
    """Counts per bucket (the last is +Inf) and the sum."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # first bound >= value: Prometheus's le
        self.sum += value

    def observe_many(self, values: Iterable[float]) -> None:
        """Many observations in one call (a stream's inter-token gaps, at its end)."""
        for v in values:
            self.observe(v)


V = TypeVar("V", CounterValue, HistogramValue)


class _Family(Collector, Generic[V]):
    """Children by label values, made on first use (by `_new`); exported when Prometheus
    scrapes."""

    _new: Callable[[], V]

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str],
                 registry: CollectorRegistry) -> None:
        self._name = name
        self._doc = documentation
        self._labelnames = tuple(labelnames)
        self._children: dict[tuple[str, ...], V] = {}
        registry.register(self)

    def labels(self, *values: str) -> V:
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self._labelnames):
                raise ValueError(f"{self._name}: expected labels {self._labelnames}, got {values}")
            child = self._children[values] = self._new()
        return child

    def describe(self) -> Iterable[Metric]:
        return self.collect()  # the names, for the registry's duplicate check


class LoopCounter(_Family[CounterValue]):
    _new = CounterValue

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(self._name, self._doc, labels=self._labelnames)
        for key, child in list(self._children.items()):
            family.add_metric(list(key), child.value)
        yield family


class LoopHistogram(_Family[HistogramValue]):
    def __init__(self, name: str, documentation: str, labelnames: Sequence[str],
                 buckets: Sequence[float], registry: CollectorRegistry) -> None:
        bounds = tuple(float(b) for b in buckets)
        self._edges = [*(repr(b) for b in bounds), "+Inf"]
        self._new = partial(HistogramValue, bounds)
        super().__init__(name, documentation, labelnames, registry)

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self._name, self._doc, labels=self._labelnames)
        for key, child in list(self._children.items()):
            cumulative, acc = [], 0.0
            for edge, n in zip(self._edges, list(child.counts), strict=True):
                acc += n
                cumulative.append((edge, acc))
            family.add_metric(list(key), cumulative, child.sum)
        yield family
