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
    @property
    def uses_affinity(self) -> bool: ...

    def pick(self, candidates: Sequence[Backend], request: RouteRequest) -> Backend | None:
        """Choose one of `candidates` (all available and serving the model), or None if empty.

        Called on the hot path for every request: no awaits, no I/O, no logging."""
        ...


class LeastOutstanding:
    """Fewest requests in flight through this gateway; ties rotate (at low load every replica
    ties at zero), over the tied set itself, so ties stay fair between loaded replicas too."""

    __slots__ = ("_turn",)
    uses_affinity: ClassVar[bool] = False

    def __init__(self) -> None:
        self._turn = 0

    def pick(self, candidates: Sequence[Backend], request: RouteRequest) -> Backend | None:
        if len(candidates) <= 1:
            return candidates[0] if candidates else None
        least = min(b.outstanding for b in candidates)
        tied = [b for b in candidates if b.outstanding == least]
        self._turn += 1
        return tied[(self._turn - 1) % len(tied)]


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
