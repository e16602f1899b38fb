"""Prefix affinity: send a prompt where its prefix already sits in a KV cache, within a load bound.

vLLM reuses the KV cache of a prefix it has seen, so a chat session's next turn is cheap on the
replica that served its last one. docs/routing.md has the design and its measurements; in short:

- The prompt is hashed in chunks, each hash covering everything before it (a running CRC-32), so
  turn N+1 contains turn N's hashes; an explicit key (session header, `user`) replaces it.
- An LRU table (`max_entries`) maps checkpoint hashes (chunks 1, 2, 4, 8, ... and the last) to the
  `CacheLife` of the replica that served them; a replica whose cache is lost gets a new one.
- A hit goes to its replica unless that would exceed `(1 + balance)` x the mean load (consistent
  hashing with bounded loads), plus `slack`, plus one request per `miss_cost_bytes` of the prefix
  it holds (what leaving would cost in prefill).
- A miss never takes a replica above the mean load: it goes to its consistent-hash home among
  those at or under it, unless the home's cache took in more than this prompt beyond the least
  filled one (`footprint`); then to that one.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections import OrderedDict
from collections.abc import Sequence
from typing import ClassVar
from zlib import crc32

from gateway.routing.backend import Backend, CacheLife
from gateway.routing.policy import LeastOutstanding, RouteRequest
from gateway.settings import AffinitySettings

# Ring points per replica: the spread of key shares across replicas falls as 1/sqrt(vnodes).
_VNODES = 160
# How far a replica's footprint may lag the largest: one that rejoins, or restarts empty, takes
# new prefixes first until it has caught up this much (about one engine's cache), not for ever.
_FOOTPRINT_WINDOW = 1 << 20
_RING_CACHE = 16  # rings kept for candidate sets seen (the full pool, minus one ejected, ...)

FALLBACK_REASONS = ("overloaded", "unavailable", "miss_overloaded", "miss_rebalanced")


def prefix_hashes(data: bytes, chunk: int, max_chunks: int) -> list[int]:
    """Running CRC-32 at the end of each whole `chunk` of `data` (at most `max_chunks`).

    A tail shorter than a chunk is left out: the next turn extends it, so its hash would never
    match again. CRC-32: one C call per chunk, and a rare collision only costs one cache miss."""
    n = min(len(data) // chunk, max_chunks)
    out: list[int] = []
    mv = memoryview(data)
    h = 0
    for i in range(0, n * chunk, chunk):
        h = crc32(mv[i:i + chunk], h)
        out.append(h)
    return out


class _Ring:
    """Consistent-hash ring over a set of replica URLs."""

    __slots__ = ("owners", "points")

    def __init__(self, urls: Sequence[str]) -> None:
        pts: list[tuple[int, str]] = []
        for u in urls:
            for v in range(_VNODES):
                d = hashlib.blake2b(f"{u}#{v}".encode(), digest_size=4).digest()
                pts.append((int.from_bytes(d, "big"), u))
        pts.sort()
        self.points = [p for p, _ in pts]
        self.owners = [u for _, u in pts]

    def owner(self, key: int) -> str:
        # CRC-32 is linear: scramble it (odd multiplier, 32 bits) so that keys spread evenly.
        k = (key * 0x9E3779B1) & 0xFFFFFFFF
        i = bisect.bisect(self.points, k)
        return self.owners[i if i < len(self.points) else 0]


class AffinityStats:
    """Plain counters, read by the metrics collector at scrape time (nothing on the hot path)."""

    __slots__ = ("fallbacks", "hits", "keys_moved", "misses")

    def __init__(self) -> None:
        self.hits = 0  # sent to the replica that served the longest known prefix
        self.misses = 0  # no usable learned prefix (new, or no key at all)
        self.fallbacks = dict.fromkeys(FALLBACK_REASONS, 0)
        # Learned prefixes re-homed: their replica left, restarted (lost its cache), was ejected
        # or was over the load bound when the prefix came back.
        self.keys_moved = 0


class PrefixAffinity:
    """See the module docstring."""

    uses_affinity: ClassVar[bool] = True

    def __init__(self, settings: AffinitySettings | None = None) -> None:
        s = settings or AffinitySettings()
        self._balance = 1.0 + s.balance
        self._slack = s.slack
        self._miss_cost = s.miss_cost_bytes
        self._chunk = s.chunk_bytes
        self._max_chunks = s.max_chunks
        self._cap = s.max_entries
        self._table: OrderedDict[int, CacheLife] = OrderedDict()
        self._least = LeastOutstanding()
        self._rings: dict[tuple[str, ...], _Ring] = {}
        self.stats = AffinityStats()

    @property
    def entries(self) -> int:
        return len(self._table)

    def keys(self, request: RouteRequest) -> list[int]:
        """The hashes `request` is known by, shallowest first."""
        if request.affinity_key is not None:
            return [crc32(request.affinity_key.encode())]
        if request.prefix is None:
            return []
        return prefix_hashes(request.prefix, self._chunk, self._max_chunks)

    def pick(self, candidates: Sequence[Backend], request: RouteRequest) -> Backend | None:
        n = len(candidates)
        if n == 0:
            return None
        keys = self.keys(request)
        if not keys:
            self.stats.misses += 1
            return self._least.pick(candidates, request)
        if n == 1:
            chosen = candidates[0]
        else:
            # An explicit key says nothing about the prompt's size: no cost or footprint.
            size = len(request.prefix) if request.prefix is not None else 0
            chosen, cached = self._choose(candidates, keys, size)
            chosen.cache_life.footprint += size - cached
        self._record(keys, chosen)
        return chosen

    def learn(self, request: RouteRequest, b: Backend) -> None:
        """Record that `request` went to `b`, chosen by another policy (kv_aware.py), so that
        this one knows where it went if it has to decide alone later."""
        keys = self.keys(request)
        if keys:
            self._record(keys, b)

    def _choose(self, candidates: Sequence[Backend], keys: list[int],
                size: int) -> tuple[Backend, int]:
        """The replica, and how many of the prompt's bytes it holds in cache (as far as known)."""
        table = self._table
        life: CacheLife | None = None
        depth = len(keys)
        for h in reversed(keys):
            life = table.get(h)
            if life is not None:
                break
            depth -= 1
        st = self.stats
        total = 0
        for c in candidates:
            total += c.outstanding
        n = len(candidates)
        if life is not None:
            b = life.backend
            if b.cache_life is life:  # else restarted or replaced: its cache is gone, a miss
                if b not in candidates:
                    st.fallbacks["unavailable"] += 1
                    return self._least_pick(candidates), 0
                cached = depth * self._chunk if size else 0
                bound = math.ceil(self._balance * (total + 1) / n) + self._slack
                if self._miss_cost:
                    # The miss that leaving would cost, in queued requests (see the docstring).
                    bound += cached // self._miss_cost
                if b.outstanding + 1 <= bound:
                    st.hits += 1
                    return b, cached
                st.fallbacks["overloaded"] += 1
                return self._least_pick(candidates), 0
        st.misses += 1
        return self._place(candidates, keys[0], total, size), 0

    def _place(self, candidates: Sequence[Backend], key: int, total: int, size: int) -> Backend:
        """A new prefix: no cache to win, so no load above the mean; among the replicas at or
        under it, the ring home unless it took in more than one such prompt beyond the least."""
        cap = math.ceil((total + 1) / len(candidates))
        home_url = self._ring_for(candidates).owner(key)
        floor = -_FOOTPRINT_WINDOW
        for c in candidates:
            floor = max(floor, c.cache_life.footprint - _FOOTPRINT_WINDOW)
        home: Backend | None = None
        best: Backend | None = None
        best_fp = 0
        for c in candidates:
            life = c.cache_life
            # Long gone, or new and empty: it catches up, but only within the window.
            life.footprint = max(life.footprint, floor)
            if c.outstanding + 1 > cap:
                continue
            fp = life.footprint
            if c.url == home_url:
                home = c
            if best is None or fp < best_fp or (fp == best_fp and c.outstanding < best.outstanding):
                best, best_fp = c, fp
        assert best is not None  # the least loaded replica is always at or under the mean
        if home is not None:
            if home.cache_life.footprint <= best_fp + size:
                return home
            self.stats.fallbacks["miss_rebalanced"] += 1
        else:
            self.stats.fallbacks["miss_overloaded"] += 1
        return best

    def _least_pick(self, candidates: Sequence[Backend]) -> Backend:
        b = self._least.pick(candidates, _NO_REQUEST)
        assert b is not None  # candidates is not empty
        return b

    def _record(self, keys: list[int], b: Backend) -> None:
        table = self._table
        life = b.cache_life
        last = len(keys) - 1
        i = 0
        # Checkpoints 0, 1, 3, 7, ... (chunks 1, 2, 4, 8, ...) and the deepest one.
        while True:
            h = keys[i]
            old = table.pop(h, None)
            if old is not None and old is not life:
                self.stats.keys_moved += 1
            table[h] = life
            if i == last:
                break
            i = min(2 * i + 1, last)
        while len(table) > self._cap:
            table.popitem(last=False)

    def _ring_for(self, candidates: Sequence[Backend]) -> _Ring:
        urls = tuple(sorted(b.url for b in candidates))
        ring = self._rings.get(urls)
        if ring is None:
            if len(self._rings) >= _RING_CACHE:
                self._rings.clear()
            ring = self._rings[urls] = _Ring(urls)
        return ring


_NO_REQUEST = RouteRequest("")
