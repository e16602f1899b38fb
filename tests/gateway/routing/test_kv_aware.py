"""kv_aware: scores on the engines' index, bounded load, and the fallbacks to prefix_affinity."""

from __future__ import annotations

import random
from pathlib import Path

import orjson
import pytest

from gateway.routing.backend import Backend, CacheLife
from gateway.routing.kv_aware import KvAware
from gateway.routing.kv_events import KvEvents
from gateway.routing.kv_hash import BlockHasher
from gateway.routing.kv_index import ReplicaIndex
from gateway.routing.kv_prompt import PromptTokens
from gateway.routing.policy import RouteRequest
from gateway.settings import AffinitySettings, KvSettings
from tests.gateway.routing.kv_publisher import stored

BS = 16  # block size the engines report


@pytest.fixture(scope="module")
def tokens(real_model_dir: Path) -> PromptTokens:
    return PromptTokens(real_model_dir)


class Pool:
    """Backends with live indexes (as the subscriber keeps them), and the policy over them."""

    def __init__(self, tokens: PromptTokens, n: int = 3) -> None:
        self.backends = [Backend(f"http://b{i}:8000") for i in range(n)]
        self.events = KvEvents(KvSettings(miss_cost_tokens=0))
        for b in self.backends:
            idx = self.events.indexes[b.url] = ReplicaIndex(1000)
            idx.stale = False
            idx.connected = True
            idx.block_size = BS
        self.policy = KvAware(AffinitySettings(), self.events.settings, self.events, tokens)

    def cache(self, i: int, prompt: list[int]) -> None:
        """Replica i's engine stored the prompt's blocks (its events say so)."""
        idx = self.events.indexes[self.backends[i].url]
        idx.apply([stored(*BlockHasher().hashes(prompt, BS, 100), size=BS)])

    def pick(self, prompt: list[int]) -> Backend | None:
        return self.policy.pick(self.backends, RouteRequest("m", None, orjson.dumps(prompt)))


def prompt(seed: int, n: int = 100) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1000) for _ in range(n)]


def test_goes_where_the_longest_prefix_is_cached(tokens: PromptTokens) -> None:
    pool = Pool(tokens)
    p = prompt(1)
    pool.cache(0, p[:32])  # 2 blocks
    pool.cache(2, p[:80])  # 5 blocks
    assert pool.pick(p + [1, 2, 3]) is pool.backends[2]
    assert pool.policy.stats["hit"] == 1 and pool.policy.matched_blocks == 5


def test_an_evicted_prefix_is_no_longer_followed(tokens: PromptTokens) -> None:
    pool = Pool(tokens)
    p = prompt(2)
    pool.cache(1, p)
    assert pool.pick(p) is pool.backends[1]
    # The engine evicted the blocks (its events say so); history would still send it to b1.
    idx = pool.events.indexes[pool.backends[1].url]
    idx.apply([{"type": "BlockRemoved", "block_hashes": list(idx.blocks), "medium": "GPU"}])
    pool.cache(2, p)  # ... and another gateway's request put it on b2
    assert pool.pick(p) is pool.backends[2]


def test_a_holder_over_the_load_bound_is_passed_over(tokens: PromptTokens) -> None:
    pool = Pool(tokens)
    p = prompt(3)
    pool.cache(0, p)
    pool.backends[0].outstanding = 4  # mean 4/3: bound ceil(1.25 x 5 / 3) = 3
    chosen = pool.pick(p)
    assert chosen is not pool.backends[0] and pool.policy.stats["overloaded"] == 1


def test_a_prefix_every_replica_holds_is_left_to_prefix_affinity(tokens: PromptTokens) -> None:
    pool = Pool(tokens)
    system = prompt(4, 48)
    for i in range(3):
        pool.cache(i, system)
    seen = {pool.pick(system + prompt(100 + k, 40)) for k in range(30)}
    # Tied on the shared blocks: placed as new prefixes (spread), not all to the first replica.
    assert len(seen) == 3 and pool.policy.stats["shared"] == 30


def test_missing_events_fall_back_to_prefix_affinity(tokens: PromptTokens) -> None:
    pool = Pool(tokens)
    p = prompt(5)
    pool.cache(0, p)
    pool.events.indexes[pool.backends[2].url].connected = False  # no publisher reached, ever
    pool.pick(p)
    assert pool.policy.stats["no_events"] == 1 and pool.policy.stats["hit"] == 0
    del pool.events.indexes[pool.backends[2].url]  # not subscribed (yet)
    pool.pick(p)
    assert pool.policy.stats["no_events"] == 2


def test_a_restarted_engine_loses_its_index_and_its_history_at_once(
        tokens: PromptTokens) -> None:
    pool = Pool(tokens)
    p = prompt(8)
    pool.cache(1, p)
    pool.cache(2, p[:48])  # b2 holds the first 3 of its 6 blocks
    assert pool.pick(p) is pool.backends[1]  # prefix_affinity's history now says b1 as well
    b1 = pool.backends[1]
    life = b1.cache_life
    idx = pool.events.indexes[b1.url]
    # Its publisher went away (the subscriber's view of a crash or restart): kv_events.py.
    idx.engine_reset()
    idx.stale = True
    for _ in range(5):
        assert pool.pick(p) is pool.backends[2]  # what is still cached, not what was
    assert b1.cache_life is not life  # so prefix_affinity's entries for it miss too
    assert pool.policy.stats["no_events"] == 0


def test_a_new_cache_life_forgets_the_index_at_once(tokens: PromptTokens) -> None:
    pool = Pool(tokens)
    p = prompt(6)
    pool.cache(1, p)
    assert pool.pick(p) is pool.backends[1]
    b1 = pool.backends[1]
    b1.cache_life = CacheLife(b1)  # what the router does when its probe fails
    assert pool.pick(p) is not None
    assert not pool.events.indexes[b1.url].blocks and pool.policy.stats["hit"] == 1


def test_short_prompts_keyed_requests_and_unknown_models_fall_back(
        tokens: PromptTokens) -> None:
    pool = Pool(tokens)
    pool.pick(prompt(7, BS - 1))
    assert pool.policy.stats["short"] == 1
    assert pool.policy.pick(pool.backends, RouteRequest("m", "session-1")) is not None
    no_tokenizer = KvAware(AffinitySettings(), KvSettings(), pool.events, None)
    no_tokenizer.pick(pool.backends, RouteRequest("m", None, b"hello"))
    assert pool.policy.stats["no_tokens"] == 1 and no_tokenizer.stats["no_tokens"] == 1


def test_chat_tokens_equal_a_whole_encode(tokens: PromptTokens) -> None:
    # The piece cache (module docstring of kv_prompt) against encoding the rendered text whole,
    # on text with special tokens, odd whitespace and non-ASCII, over turns of one session.
    rng = random.Random(9)
    words = ["river", "  x", "\n\n", "ça", "日本", "<|im_end|>", "<|im_start|>user", "ok."]
    messages = [{"role": "system", "content": " ".join(rng.choice(words) for _ in range(200))}]
    for turn in range(4):
        messages.append({"role": "user", "content": " ".join(rng.choice(words) for _ in range(9))})
        text = tokens._tok.apply_chat_template(messages, tokenize=False,
                                               add_generation_prompt=True)
        whole = tokens._fast.encode(text, add_special_tokens=False).ids
        assert tokens.tokens(orjson.dumps(messages)) == whole, turn
        messages.append({"role": "assistant", "content": rng.choice(words)})
    assert tokens.tokens(b"[1, 2, 3]") == [1, 2, 3]
    assert tokens.tokens(b'[{"role": "user", "content": [{"type": "text"}]}]') is None
    assert tokens.tokens(b"Once upon") == tokens._fast.encode("Once upon").ids
