"""How long until a slot comes free: the wait the door promises, and the Retry-After it answers.

From what the pool is doing now, not from a rate averaged over the past: a pool holding `n`
requests, each of which takes `service` seconds from admission to release, frees a slot every
`service / n` seconds on average (Little's law). The service time is measured the same way: the
area under the in-flight count (request-seconds) divided by the requests that ended, folded into an
exponentially weighted average at most every `_fold_s`. Only completions move it: an idle pool
keeps what it learnt, so the first wait estimated after a silence is the time to the next free
slot at the pace the requests last took, not a rate decayed toward zero by the silence.
"""

from __future__ import annotations

from collections.abc import Callable
from time import monotonic

MIN_RETRY_S = 1.0
MAX_RETRY_S = 60.0


class Pace:
    """Service time (admission to release) of one pool's requests, by Little's law."""

    __slots__ = ("_area", "_clock", "_done", "_last", "_n", "_since", "service_s")

    _fold_s = 0.5
    _alpha = 0.3  # weight of each fold's sample

    def __init__(self, clock: Callable[[], float] = monotonic) -> None:
        self._clock = clock
        self._n = 0  # requests in flight, as last told
        self._last = clock()  # when `_n` last changed
        self._area = 0.0  # request-seconds since the last fold
        self._done = 0  # releases since the last fold
        self._since = self._last
        self.service_s = 0.0  # seconds; 0.0 until the first fold

    def took(self, n_before: int, now: float) -> None:
        """A request was admitted: the pool held `n_before` until `now`."""
        self._area += n_before * (now - self._last)
        self._last = now
        self._n = n_before + 1

    def released(self, n_before: int, now: float) -> None:
        """A request ended: the pool held `n_before` until `now`."""
        self._area += n_before * (now - self._last)
        self._last = now
        self._n = n_before - 1
        self._done += 1
        if now - self._since >= self._fold_s:
            sample = self._area / self._done
            a = self._alpha
            self.service_s = sample if self.service_s == 0.0 else (1 - a) * self.service_s + a * sample
            self._area = 0.0
            self._done = 0
            self._since = now


def expected_wait(ahead: int, in_flight: int, limit: int, service_s: float) -> float:
    """Seconds until a request with `ahead` requests before it in the queue gets a slot: the pool
    must first come below its limit, then free one slot per request ahead, at `in_flight` slots
    per `service_s`."""
    n = max(in_flight, 1)
    return (ahead + 1 + max(0, in_flight - limit)) * service_s / n


def retry_after(ahead: int, in_flight: int, limit: int, service_s: float) -> float:
    """Retry-After (seconds, clamped to [1, 60]) for a request refused with `ahead` queued."""
    return min(MAX_RETRY_S, max(MIN_RETRY_S, expected_wait(ahead, in_flight, limit, service_s)))
