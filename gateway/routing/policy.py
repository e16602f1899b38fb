"""Routing policies: one Protocol with one `pick`, swappable and testable without a network."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

from gateway.routing.backend import Backend


@dataclass(frozen=True, slots=True)
class RouteRequest:
    model: str
    # For affinity policies (prefix caching, sessions): a key that should land on the same replica.
    affinity_key: str | None = None
    # The prompt's bytes from its start (chat messages as JSON, or the prompt), for prefix hashing.
    prefix: bytes | None = None


class RoutingPolicy(Protocol):
    # True: the caller builds a RouteRequest per request (key, prefix); False: it may reuse one.
    uses_affinity: ClassVar[bool]

    def pick(self, candidates: Sequence[Backend], request: RouteRequest) -> Backend | None:
        """Choose one of `candidates` (all available and serving the model), or None if empty.

        Called on the hot path for every request: no awaits, no I/O, no logging."""
        ...


class LeastOutstanding:
    """Fewest requests in flight through this gateway; ties rotate.

    Rotation matters: at low load every replica ties at zero, and a fixed tie-break would send
    every sequential request to the same replica. The rotation runs over the tied set itself
    (the k-th tied candidate, k counting up), so ties stay fair even when loaded replicas sit
    between idle ones.
    """

    __slots__ = ("_turn",)
    uses_affinity: ClassVar[bool] = False

    def __init__(self) -> None:
        self._turn = 0

    def pick(self, candidates: Sequence[Backend], request: RouteRequest) -> Backend | None:
        n = len(candidates)
        if n == 0:
            return None
        if n == 1:
            return candidates[0]
        # Two plain passes, no allocation: the minimum and how many share it, then the k-th.
        least = candidates[0].outstanding
        ties = 0
        for b in candidates:
            o = b.outstanding
            if o < least:
                least, ties = o, 1
            elif o == least:
                ties += 1
        k = self._turn % ties
        self._turn += 1
        for b in candidates:
            if b.outstanding == least:
                if k == 0:
                    return b
                k -= 1
        raise AssertionError("unreachable: some candidate holds the minimum")


class RoundRobin:
    """Each candidate in turn, blind to load: a baseline for benchmarks, not for production."""

    __slots__ = ("_turn",)
    uses_affinity: ClassVar[bool] = False

    def __init__(self) -> None:
        self._turn = 0

    def pick(self, candidates: Sequence[Backend], request: RouteRequest) -> Backend | None:
        if not candidates:
            return None
        self._turn += 1
        return candidates[self._turn % len(candidates)]
