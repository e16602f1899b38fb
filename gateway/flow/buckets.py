"""Token buckets for per-key limits: requests per minute and tokens per minute.

Lazily refilled from the time since the last touch (no timers). Tokens are only known after a
request (from its usage), so the token bucket is debited afterwards and may go negative: the key
is then refused until the refill brings it above zero, which is its Retry-After.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from time import monotonic


class TokenBucket:
    __slots__ = ("_clock", "_last", "capacity", "level", "rate")

    def __init__(self, per_minute: float, *, clock: Callable[[], float] = monotonic) -> None:
        self.rate = per_minute / 60.0
        # The burst is a full minute's allowance: a client may spend its minute at once.
        self.capacity = float(per_minute)
        self.level = self.capacity
        self._clock = clock
        self._last = clock()

    def _refill(self) -> None:
        now = self._clock()
        elapsed = now - self._last
        if elapsed > 0:
            self._last = now
            self.level = min(self.capacity, self.level + elapsed * self.rate)

    def try_take(self, n: float = 1.0) -> float:
        """Take `n` if the bucket holds them: 0.0. Otherwise take nothing and return the wait."""
        self._refill()
        if self.level >= n:
            self.level -= n
            return 0.0
        return (n - self.level) / self.rate

    def positive(self) -> float:
        """0.0 if the level is above zero (a debit-after bucket admits), else the wait until it is."""
        self._refill()
        if self.level > 0:
            return 0.0
        # A hair past zero: at exactly zero the next check would still refuse.
        return (1e-6 - self.level) / self.rate

    def debit(self, n: float) -> None:
        self._refill()
        self.level -= n

    def give_back(self, n: float = 1.0) -> None:
        self.level = min(self.capacity, self.level + n)


@dataclass(slots=True)
class Refusal:
    reason: str  # "rpm", "tpm", or "unavailable" (shared limits failing closed)
    retry_after_s: float


class KeyLimits:
    """The two buckets of one API key; either may be absent (unlimited)."""

    __slots__ = ("requests", "tokens")

    def __init__(
        self, rpm: float | None, tpm: float | None, clock: Callable[[], float] = monotonic
    ) -> None:
        self.requests = TokenBucket(rpm, clock=clock) if rpm else None
        self.tokens = TokenBucket(tpm, clock=clock) if tpm else None

    def admit(self) -> Refusal | None:
        """Charge one request, or say which limit refuses it and for how long."""
        if self.tokens is not None:
            wait = self.tokens.positive()
            if wait > 0:
                return Refusal("tpm", wait)
        if self.requests is not None:
            wait = self.requests.try_take(1.0)
            if wait > 0:
                return Refusal("rpm", wait)
        return None

    def refund(self) -> None:
        """Give the request back: it was charged, then refused further on (queue full)."""
        if self.requests is not None:
            self.requests.give_back(1.0)

    def used(self, tokens: int) -> None:
        if self.tokens is not None and tokens > 0:
            self.tokens.debit(tokens)
