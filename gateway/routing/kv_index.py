"""What one engine holds in its prefix cache, as its KV events tell it (gateway/routing/kv_events.py).

A replica's index is the set of block hashes (vLLM's external 64-bit form) its engine has stored
and not removed since the index's start. Events arrive in order per engine (a sequence number per
batch); the subscriber feeds each batch here, and clears the index when the engine starts over
(AllBlocksCleared, a sequence reset, a gap it cannot replay) or the router gives the replica a new
cache life (its probe failed: the engine may have restarted).

Memory is bounded: `max_blocks` hashes per replica, the oldest stored dropped first (an engine's
own cache is bounded, so this only bites if removals were lost). A hash costs about 100 bytes
(a dict slot and a 64-bit int object); llmserve_kv_index_blocks shows the count.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from gateway.routing.backend import CacheLife

# Block hashes may be bytes when the engine runs with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0.
Hash = int | bytes


class ReplicaIndex:
    """One replica's cached blocks. Mutated only on the event loop (no locks)."""

    __slots__ = ("block_size", "blocks", "cleared", "connected", "generation", "last_event",
                 "life", "max_blocks", "removed", "seen_generation", "seq", "stale", "stored")

    def __init__(self, max_blocks: int) -> None:
        self.max_blocks = max_blocks
        # Insertion-ordered: the first key is the oldest stored (dropped first at the cap).
        self.blocks: dict[Hash, None] = {}
        self.block_size: int | None = None  # learned from the first BlockStored
        self.seq = -1  # last batch applied
        self.life: CacheLife | None = None  # the cache life these blocks belong to
        # One more each time the engine's cache is known gone (restart, AllBlocksCleared); the
        # policy gives the replica a new cache life when it sees one (kv_aware.py).
        self.generation = 0
        self.seen_generation = 0
        self.connected = False  # ever reached the publisher: the engine publishes events
        # True until the subscriber is connected to the engine's publisher, and again once it
        # is gone: what the index holds (nothing then) says nothing of the engine's cache.
        self.stale = True
        self.last_event = 0.0  # monotonic time of the last batch
        self.stored = 0
        self.removed = 0
        self.cleared = 0

    def clear(self) -> None:
        self.blocks.clear()
        self.cleared += 1

    def engine_reset(self) -> None:
        """The engine's cache is gone (it restarted, or cleared it): forget it now, and tell the
        policy (its history of the replica is about the old cache too)."""
        self.clear()
        self.generation += 1

    def apply(self, events: Iterable[Any]) -> None:
        """One batch's events, decoded from msgpack: dicts tagged by "type" (vLLM's
        KVCacheEvent structs). Unknown types and fields are ignored (newer engines add some)."""
        blocks = self.blocks
        for ev in events:
            if not isinstance(ev, dict):
                continue
            kind = ev.get("type")
            if kind == "BlockStored":
                size = ev.get("block_size")
                if self.block_size is None and isinstance(size, int):
                    self.block_size = size
                for h in ev.get("block_hashes") or ():
                    blocks.pop(h, None)  # re-stored: now the newest
                    blocks[h] = None
                    self.stored += 1
                excess = len(blocks) - self.max_blocks
                if excess > 0:
                    for h in list(_first(blocks, excess)):
                        del blocks[h]
            elif kind == "BlockRemoved":
                for h in ev.get("block_hashes") or ():
                    if blocks.pop(h, 0) is None:
                        self.removed += 1
            elif kind == "AllBlocksCleared":
                self.engine_reset()

    def matched(self, hashes: Sequence[Hash]) -> int:
        """How many of `hashes` (a prompt's blocks, in order) are cached, from the first on."""
        blocks = self.blocks
        n = 0
        for h in hashes:
            if h not in blocks:
                break
            n += 1
        return n


def _first(d: dict[Hash, None], n: int) -> Iterable[Hash]:
    it = iter(d)
    for _ in range(n):
        yield next(it)
