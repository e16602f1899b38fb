"""One vLLM replica as the router sees it."""

from __future__ import annotations


class CacheLife:
    """One life of a replica's KV cache: affinity policies remember this token, not the Backend.
    The router replaces it when the replica's probe fails (a restarted engine lost its cache)."""

    __slots__ = ("backend", "footprint")

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        # Prompt bytes sent here that this cache did not hold yet (kept on the cache, not in a
        # policy: two pools' policies may share engines).
        self.footprint = 0


class Backend:
    """Mutable routing state of one replica. Identity-hashed: two objects are two replicas."""

    __slots__ = ("cache_life", "ejected_until", "failure_rate", "failures", "models", "outstanding",
                 "probe_ok", "url")

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.outstanding = 0  # requests in flight through this gateway
        self.models: frozenset[str] = frozenset()
        # Not routable until the first successful probe: a replica still loading its model
        # would otherwise take (and fail) the first requests.
        self.probe_ok = False
        self.ejected_until = 0.0
        self.failures = 0
        self.failure_rate = 0.0  # moving average of its requests' failures (1) and successes (0)
        self.cache_life = CacheLife(self)

    def available(self, now: float) -> bool:
        return self.probe_ok and now >= self.ejected_until

    def __repr__(self) -> str:
        return f"Backend({self.url!r}, outstanding={self.outstanding}, ok={self.probe_ok})"
