"""Waiting in tests: on a condition, never a fixed sleep before asserting that something did
not happen. One home for the polling helpers the suite shares."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping

from prometheus_client.parser import text_string_to_metric_families

from tests import loopback


def wait_for(predicate: Callable[[], bool], timeout_s: float = 10.0,
             what: str = "condition not reached in time") -> None:
    """Poll `predicate` until it holds; fail the test with `what` if it does not within
    `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


async def settle(predicate: Callable[[], bool], timeout_s: float = 5.0,
                 what: str = "condition not reached in time") -> None:
    """As wait_for, on the running event loop: the loop's other tasks run between the polls."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.005)


def scrape(url: str) -> dict[str, float]:
    """`url`/metrics -> {"name{labels}": value}, labels sorted, through prometheus_client's
    parser (the format's escapes and special values are its business)."""
    out: dict[str, float] = {}
    text = loopback.get(url + "/metrics", timeout=5).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            out[sample.name + (f"{{{labels}}}" if labels else "")] = sample.value
    return out


def metric_sum(samples: Mapping[str, float], name: str, label: str = "") -> float:
    """The sum of series `name` (exactly: `name` or `name{...}`) in `scrape`'s samples, only
    those whose labels hold `label` (as `key="value"`) when given."""
    return sum(v for k, v in samples.items()
               if (k == name or k.startswith(name + "{")) and label in k)
