"""kv_aware: send a prompt where the engines' KV cache events say its prefix is cached.

Where prefix_affinity (affinity.py) guesses from where the gateway sent prompts before, this policy
reads what each engine actually holds (kv_events.py, kv_index.py), so it sees evictions, restarts
and what other gateway replicas sent where. Per request:

- The prompt's tokens (kv_prompt.py: the model's tokenizer and chat template), cut into the
  engines' blocks and hashed as vLLM hashes them (kv_hash.py); the block size is the one the
  engines' events report.
- Each candidate's score is the number of the prompt's blocks, from the first, in its index.
- Load bound as prefix_affinity's: a replica may take the request while it would hold at most
  ceil((1 + balance) x mean) + slack requests in flight, plus one request per
  `miss_cost_tokens` of the prompt it holds. The best score within its bound wins; among
  replicas tied on it (a shared system prompt cached everywhere) prefix_affinity chooses.
- No replica holds any of it within its bound (a new prefix, or only overloaded holders): the
  prefix_affinity policy decides (it places new prefixes evenly and within the mean load).

Fallbacks to prefix_affinity, counted by reason in `stats`: no tokenizer for the model, a
session key instead of a prompt, a prompt the gateway does not tokenize, shorter than one block,
or a candidate whose events are missing (its publisher never reached: an engine without events).
A replica whose publisher went away (a crash, a restart) keeps being scored, on an empty index,
and gets a new cache life at once, so prefix_affinity's history of it is forgotten too. Every pick is also recorded in the prefix_affinity policy, so its history is current
when it has to decide alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

from gateway.routing.affinity import PrefixAffinity
from gateway.routing.backend import Backend, CacheLife
from gateway.routing.kv_events import KvEvents
from gateway.routing.kv_hash import BlockHasher
from gateway.routing.kv_index import ReplicaIndex
from gateway.routing.kv_prompt import PromptTokens
from gateway.routing.policy import RouteRequest, RoutingPolicy
from gateway.settings import AffinitySettings, KvSettings

# hit: one replica holds the most; shared: several hold as much (prefix_affinity chose among
# them); the others went to prefix_affinity (module docstring).
OUTCOMES = ("hit", "shared", "miss", "overloaded", "no_tokens", "short", "no_events")


class KvAware:
    """See the module docstring."""

    uses_affinity: ClassVar[bool] = True

    def __init__(self, affinity: AffinitySettings, kv: KvSettings, events: KvEvents,
                 tokens: PromptTokens | None) -> None:
        # The policy this one defers to (router.routing_stats reports its counters too).
        self.inner = PrefixAffinity(affinity)
        self._events = events
        self._tokens = tokens
        self._hasher = BlockHasher(kv.hash_algo, kv.hash_seed)
        self._max_blocks = kv.max_prompt_blocks
        self._miss_cost = kv.miss_cost_tokens
        self._balance = 1.0 + affinity.balance
        self._slack = affinity.slack
        self.stats = dict.fromkeys(OUTCOMES, 0)
        self.matched_blocks = 0  # prompt blocks found cached where the requests went

    def pick(self, candidates: Sequence[Backend], request: RouteRequest) -> Backend | None:
        n = len(candidates)
        if n <= 1:
            return self.inner.pick(candidates, request)
        why, chosen = self._choose(candidates, request)
        self.stats[why] += 1
        if chosen is None:
            return self.inner.pick(candidates, request)
        if why == "hit":  # else prefix_affinity chose, and recorded it
            self.inner.learn(request, chosen)
        return chosen

    def _choose(self, candidates: Sequence[Backend],
                request: RouteRequest) -> tuple[str, Backend | None]:
        if self._tokens is None or request.prefix is None:
            return "no_tokens", None
        indexes = self._events.indexes
        idxs: list[ReplicaIndex] = []
        size: int | None = None
        for c in candidates:
            idx = indexes.get(c.url)
            if idx is None or not idx.connected:
                return "no_events", None
            if idx.generation != idx.seen_generation:
                # Its engine restarted or dropped its cache (the index is empty already): what
                # prefix_affinity learnt about it is about that cache too. A new cache life
                # makes all of it a miss at once, as the router does when a probe fails.
                idx.seen_generation = idx.generation
                c.cache_life = CacheLife(c)
                idx.life = c.cache_life
            elif idx.life is not c.cache_life:
                # The router gave the replica a new cache life (its probe failed: a restart
                # empties the cache): what the index held belongs to the old one.
                if idx.life is not None:
                    idx.clear()
                idx.life = c.cache_life
            # A replica whose publisher is gone (stale) has an empty index: it scores 0.
            size = size or idx.block_size
            idxs.append(idx)
        if size is None:  # no engine has stored a block yet
            return "no_events", None
        tokens = self._tokens.tokens(request.prefix)
        if tokens is None:
            return "no_tokens", None
        hashes = self._hasher.hashes(tokens, size, self._max_blocks)
        if not hashes:
            return "short", None
        total = 0
        for c in candidates:
            total += c.outstanding
        bound = math.ceil(self._balance * (total + 1) / len(candidates)) + self._slack
        tied: list[Backend] = []
        best_m = 0
        over = False
        for c, idx in zip(candidates, idxs, strict=True):
            m = idx.matched(hashes)
            if m == 0 or m < best_m:
                continue
            room = bound + (m * size // self._miss_cost if self._miss_cost else 0)
            if c.outstanding + 1 > room:
                over = True
                continue
            if m > best_m:
                tied.clear()
                best_m = m
            tied.append(c)
        if not tied:
            return ("overloaded" if over else "miss"), None
        self.matched_blocks += best_m
        if len(tied) == 1:
            return "hit", tied[0]
        # Several hold as much (a shared system prompt): prefix_affinity chooses among them (its
        # history, else its even placement), as it would for a new prefix.
        return "shared", self.inner.pick(tied, request)


def kv_outcomes(policies: dict[str, RoutingPolicy]) -> list[tuple[str, dict[str, int]]]:
    """(pool, outcome counts) of each pool routed by kv_aware (under LoRA residency or not)."""
    out = []
    for pool, p in sorted(policies.items()):
        inner: object = getattr(p, "inner", None)
        if isinstance(inner, KvAware):
            p = inner
        if isinstance(p, KvAware):
            out.append((pool, dict(p.stats)))
    return out
