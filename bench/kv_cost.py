"""What kv_aware costs the gateway: the index's memory per block and the CPU per routed request.

    python -m bench.kv_cost --model-dir models/SmolLM2-135M-Instruct [--blocks 1000000]
        [--replicas 4] [--requests 2000]

Memory: `--blocks` block hashes (64-bit ints, as the engines publish them) stored in one
replica's index through its event path, measured with tracemalloc (bytes per block).

CPU per request, on this process alone (no network), for chat prompts shaped like the
kv_routing benchmark's (a shared system prompt, a session context, turns; about 600-750 tokens):
- tokens: the chat template and the encoding, first turn (nothing cached) and next turn (the
  conversation's earlier pieces cached, kv_prompt.py);
- hashes: the prompt's block hashes (kv_hash.py);
- pick: kv_aware's whole pick over `--replicas` replicas with indexes of `--index-blocks` blocks
  each, next-turn prompts, against prefix_affinity's pick of the same requests (its prompt bytes
  hashing included, as the gateway builds them).
Each figure is the median of 5 runs over `--requests` requests, cycling through `--sessions`
conversations (first turns: once each).
"""

from __future__ import annotations

import random
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import orjson

from bench.prefix_routing import words
from devstack.cli import Parser
from gateway.routing.affinity import PrefixAffinity
from gateway.routing.backend import Backend
from gateway.routing.kv_aware import KvAware
from gateway.routing.kv_events import KvEvents
from gateway.routing.kv_hash import BlockHasher
from gateway.routing.kv_index import ReplicaIndex
from gateway.routing.kv_prompt import PromptTokens
from gateway.routing.policy import RouteRequest
from gateway.settings import AffinitySettings, KvSettings


def index_bytes_per_block(n: int) -> float:
    idx = ReplicaIndex(n)
    rng = random.Random(1)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    batch = 64
    for _ in range(n // batch):
        idx.apply([{"type": "BlockStored", "block_size": 128,
                    "block_hashes": [rng.getrandbits(64) for _ in range(batch)]}])
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert len(idx.blocks) == n // batch * batch
    return (after - before) / len(idx.blocks)


def conversations(n: int, seed: int) -> list[tuple[list[dict[str, str]], list[dict[str, str]]]]:
    """(first turn, next turn) message lists of `n` sessions sharing 4 system prompts."""
    rng = random.Random(seed)
    systems = [f"You are assistant {k}. " + words(rng, 280) for k in range(4)]
    out = []
    for i in range(n):
        first = [{"role": "system", "content": systems[i % 4]},
                 {"role": "user", "content": f"[{seed}-{i}] Context: " + words(rng, 220)}]
        nxt = [*first, {"role": "assistant", "content": words(rng, 12)},
               {"role": "user", "content": "Question 2: " + words(rng, 12) + "?"}]
        out.append((first, nxt))
    return out


def per_call_us(fn: Callable[[], object], n: int) -> float:
    runs = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        runs.append((time.perf_counter() - t) / n * 1e6)
    return statistics.median(runs)


def main() -> int:
    p = Parser(prog="python -m bench.kv_cost", description=__doc__)
    p.add_argument("--model-dir", type=Path, default=Path("models/SmolLM2-135M-Instruct"),
                   help="the demo model directory (its tokenizer and chat template)")
    p.add_argument("--blocks", type=int, default=1_000_000, help="blocks for the memory figure")
    p.add_argument("--replicas", type=int, default=4, help="replicas a pick scores")
    p.add_argument("--index-blocks", type=int, default=20_000,
                   help="blocks in each replica's index during the picks")
    p.add_argument("--requests", type=int, default=2000, help="requests per timed run")
    p.add_argument("--sessions", type=int, default=200,
                   help="distinct conversations the requests cycle through")
    args = p.parse_args()

    per_block = index_bytes_per_block(args.blocks)
    print(f"index memory: {per_block:.0f} bytes per block "
          f"({per_block * args.blocks / 2**20:.0f} MiB for {args.blocks:,} blocks)")

    tokens = PromptTokens(args.model_dir)
    hasher = BlockHasher()
    convs = conversations(args.sessions, seed=7)
    firsts = [orjson.dumps(f) for f, _ in convs]
    nexts = [orjson.dumps(n) for _, n in convs]
    # First turns: each a new context (its system prompt cached after the first few); once each.
    t0 = time.perf_counter()
    for b in firsts:
        tokens.tokens(b)
    cold = (time.perf_counter() - t0) / len(firsts) * 1e6
    k = 0

    def next_turn() -> object:
        nonlocal k
        k += 1
        return tokens.tokens(nexts[k % len(nexts)])

    warm = per_call_us(next_turn, args.requests)
    toks = tokens.tokens(nexts[0])
    assert toks is not None
    hashing = per_call_us(lambda: hasher.hashes(toks, 128, 512), args.requests)
    print(f"tokens: first turn {cold:.0f} us, next turn {warm:.0f} us ({len(toks)} tokens); "
          f"block hashes {hashing:.0f} us ({len(toks) // 128} blocks)")

    backends = [Backend(f"http://r{i}:8000") for i in range(args.replicas)]
    events = KvEvents(KvSettings())
    rng = random.Random(3)
    for i, b in enumerate(backends):
        idx = events.indexes[b.url] = ReplicaIndex(args.index_blocks * 2)
        idx.connected = True
        idx.stale = False
        idx.apply([{"type": "BlockStored", "block_size": 128,
                    "block_hashes": [rng.getrandbits(64) for _ in range(args.index_blocks)]}])
    for j, b in enumerate(nexts):  # each session's first turn cached on one replica
        t = tokens.tokens(firsts[j])
        assert t is not None
        events.indexes[backends[j % args.replicas].url].apply(
            [{"type": "BlockStored", "block_size": 128, "block_hashes": hasher.hashes(t, 128, 512)}])
    kv = KvAware(AffinitySettings(), KvSettings(), events, tokens)
    aff = PrefixAffinity(AffinitySettings())
    msgs = [n for _, n in convs]
    reqs = [RouteRequest("m", None, b) for b in nexts]
    k = 0

    def kv_pick() -> object:
        nonlocal k
        k += 1
        return kv.pick(backends, reqs[k % len(reqs)])

    def aff_pick() -> object:
        nonlocal k
        k += 1
        # As the gateway builds it: the messages' JSON, then the policy.
        return aff.pick(backends, RouteRequest("m", None, orjson.dumps(msgs[k % len(msgs)])))

    t_kv = per_call_us(kv_pick, args.requests)
    t_aff = per_call_us(aff_pick, args.requests)
    print(f"pick over {args.replicas} replicas ({args.index_blocks:,} blocks each), next turns: "
          f"kv_aware {t_kv:.0f} us, prefix_affinity {t_aff:.0f} us; kv_aware outcomes "
          f"{ {o: n for o, n in kv.stats.items() if n} }")
    return 0


if __name__ == "__main__":
    sys.exit(main())
