"""Waiting in tests: on a condition, never a fixed sleep before asserting that something did
not happen. One home for the polling helpers the suite shares."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


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


def metric_sum(exposition: str, name: str, label: str = "") -> float:
    """The sum of the samples of series `name` (exactly: `name{...}` or `name value`) in a
    Prometheus text exposition, only those whose line holds `label` when given."""
    total = 0.0
    for line in exposition.splitlines():
        if line.startswith((name + "{", name + " ")) and label in line:
            total += float(line.rsplit(" ", 1)[1])
    return total
