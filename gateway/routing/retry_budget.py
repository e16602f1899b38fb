"""A retry budget (Finagle's RetryBudget, Envoy's retry_budget): when replicas fail broadly,
every retry is load on the ones still answering, so retries are at most `ratio` of recent
requests (20%: 1.2x at worst) plus `min_retries` per window, for light traffic. "Recent" is a
sliding window of WINDOW_S, approximated by two fixed windows.
"""

from __future__ import annotations

from collections.abc import Callable
from time import monotonic

# The window the budget counts requests and retries over (GATEWAY_RETRY_BUDGET says "last 10 s").
WINDOW_S = 10.0


class RetryBudget:
    __slots__ = ("_clock", "_min", "_prev_requests", "_prev_retries", "_ratio", "_requests",
                 "_retries", "_start", "_window")

    def __init__(
        self, ratio: float = 0.2, min_retries: int = 3, clock: Callable[[], float] = monotonic,
    ) -> None:
        self._ratio = ratio
        self._min = min_retries
        self._window = WINDOW_S
        self._clock = clock
        self._start = clock()
        self._requests = self._retries = 0
        self._prev_requests = self._prev_retries = 0

    def request(self) -> None:
        """One client request (its first attempt): it earns `ratio` of a retry."""
        if self._clock() - self._start >= self._window:
            self._roll()
        self._requests += 1

    def try_retry(self) -> bool:
        """Take one retry from the budget; False when it is spent."""
        now = self._clock()
        if now - self._start >= self._window:
            self._roll()
        prev = max(0.0, 1.0 - (now - self._start) / self._window)
        requests = self._requests + prev * self._prev_requests
        retries = self._retries + prev * self._prev_retries
        if retries + 1 > self._ratio * requests + self._min:
            return False
        self._retries += 1
        return True

    def _roll(self) -> None:
        now = self._clock()
        # A gap of more than one window leaves nothing of the old counts in the sliding window.
        fresh = now - self._start < 2 * self._window
        self._prev_requests = self._requests if fresh else 0
        self._prev_retries = self._retries if fresh else 0
        self._requests = self._retries = 0
        self._start = now if not fresh else self._start + self._window
