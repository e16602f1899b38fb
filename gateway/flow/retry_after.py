"""Retry-After from the pool's own queue: how long the requests ahead take at the observed pace.

The drain rate is an exponentially weighted average of completions per second, folded in at most
every `_fold_s` (no timer). Until a completion is seen, Little's law stands in: `limit` requests
each taking about the TTFT target drain at `limit / target` per second.
"""

from __future__ import annotations

from collections.abc import Callable
from time import monotonic

MIN_RETRY_S = 1.0
MAX_RETRY_S = 60.0


class DrainRate:
    __slots__ = ("_clock", "_count", "_since", "rate")

    _fold_s = 0.5
    _alpha = 0.3  # weight of each fold's sample

    def __init__(self, clock: Callable[[], float] = monotonic) -> None:
        self._clock = clock
        self._count = 0
        self._since = clock()
        self.rate = 0.0  # completions per second; 0.0 until the first fold

    def tick(self, now: float) -> None:
        self._count += 1
        elapsed = now - self._since
        if elapsed >= self._fold_s:
            self._fold(elapsed)
            self._since = now

    def _fold(self, elapsed: float) -> None:
        sample = self._count / elapsed
        self._count = 0
        # A long interval weighs as the several folds it spans: a silence decays the rate fast.
        keep = (1 - self._alpha) ** (elapsed / self._fold_s)
        self.rate = sample if self.rate == 0.0 else (1 - keep) * sample + keep * self.rate

    def current(self) -> float:
        """The rate, with a long silence folded in (a stalled pool must not look fast)."""
        now = self._clock()
        elapsed = now - self._since
        if elapsed >= 4 * self._fold_s and self.rate > 0.0:
            self._fold(elapsed)
            self._since = now
        return self.rate


def expected_wait(ahead: int, rate: float, limit: int, target_s: float) -> float:
    """Seconds until a request with `ahead` requests before it in the queue gets a slot."""
    if rate <= 0.0:
        rate = max(limit, 1) / target_s
    return (ahead + 1) / rate


def retry_after(ahead: int, rate: float, limit: int, target_s: float) -> float:
    """Retry-After (seconds, clamped to [1, 60]) for a request refused with `ahead` queued."""
    return min(MAX_RETRY_S, max(MIN_RETRY_S, expected_wait(ahead, rate, limit, target_s)))
