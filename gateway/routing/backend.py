"""One vLLM replica as the router sees it."""

from __future__ import annotations

from collections import OrderedDict


class CacheLife:
    """One life of a replica's KV cache: affinity policies remember this token, not the Backend.
    The router replaces it when the replica's probe fails (a restarted engine lost its cache).
    What is known of the engine's state is kept here, not in a policy (two pools' policies may
    share engines), and ends with the life."""

    __slots__ = ("adapters", "backend", "ensured", "footprint", "retry")

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        # Prompt bytes sent here that this cache did not hold yet.
        self.footprint = 0
        # LoRA (routing/residency.py, adapters.py): the adapters sent here, least recently used
        # first (name -> tick of its last use); those the reconciler has brought up to date; and
        # the loads it tries again (name -> (failures so far, monotonic time of the next try)).
        self.adapters: OrderedDict[str, int] = OrderedDict()
        self.ensured: set[str] = set()
        self.retry: dict[str, tuple[int, float]] = {}


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
