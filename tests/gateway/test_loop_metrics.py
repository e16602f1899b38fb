"""gateway/loop_metrics.py: the lock-free families export exactly what prometheus_client's own
families export for the same updates (less the `_created` samples), so dashboards and alerts are
unaffected by which one a series uses."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from gateway.loop_metrics import LoopCounter, LoopHistogram


def exposition(registry: CollectorRegistry) -> list[str]:
    return [line for line in generate_latest(registry).decode().splitlines()
            if "_created" not in line]


def test_histogram_exposition_matches_prometheus_client() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    bounds = [0.01, 0.1, 1.0]
    a = LoopHistogram("x_seconds", "doc", ["model"], buckets=bounds, registry=ours)
    b = Histogram("x_seconds", "doc", ["model"], buckets=bounds, registry=theirs)
    values = [0.0, 0.01, 0.05, 0.1, 0.5, 7.0]
    for v in values:  # a value equal to a bound is in that bound's bucket (Prometheus's `le`)
        a.labels("a").observe(v)
        b.labels("a").observe(v)
    a.labels("b").observe_many([2.0, 0.2])
    a.labels("b").observe_many([])
    for v in (2.0, 0.2):
        b.labels("b").observe(v)
    assert exposition(ours) == exposition(theirs)
    assert 'x_seconds_bucket{le="0.01",model="a"} 2.0' in exposition(ours)


def test_counter_exposition_matches_prometheus_client() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    c1 = LoopCounter("requests", "doc", ["model", "status"], registry=ours)
    c2 = Counter("requests", "doc", ["model", "status"], registry=theirs)
    for c in (c1, c2):
        c.labels("demo", "200").inc()
        c.labels("demo", "200").inc(2.5)
        c.labels("demo", "503").inc()
    assert exposition(ours) == exposition(theirs)
    assert 'requests_total{model="demo",status="200"} 3.5' in exposition(ours)


def test_wrong_label_count_is_refused_and_names_are_unique_per_registry() -> None:
    r = CollectorRegistry()
    c = LoopCounter("requests", "doc", ["model"], registry=r)
    with pytest.raises(ValueError, match="expected labels"):
        c.labels("demo", "extra")
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        Counter("requests", "doc", ["model"], registry=r)
