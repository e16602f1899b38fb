"""Routing on the engines' KV cache events (kv_aware) against today's policies, under eviction.

    python -m bench.kv_routing --model-dir models/SmolLM2-135M-Instruct [--replicas 4]
        [--kv-blocks 24] [--sessions 16] [--turns 3] [--oneoffs 16] [--concurrency 8]
        [--repeats 1] [--gateways 1]

`--replicas` vLLM-CPU engines (sharing the machine's cores, prefix caching on) with KV caches of
`--kv-blocks` blocks each (vLLM --num-gpu-blocks-override; 128 tokens a block on the CPU), small
enough that one round's prompts do not fit in all of them together: the engines evict. Each
publishes its KV cache events (WORKER_KV_EVENTS_PORT). vLLM holds one block back (its null
block) and refuses to start unless the rest hold one whole `--max-model-len` sequence, so
`--max-model-len` is (kv-blocks - 1) x 128 unless given, and a larger one is refused here.

Workload per round (fresh text: a per-round nonce starts every prompt): `--shared-prompts`
system prompts of about `--system-words` words, each shared by several sessions; `--sessions`
chat sessions, each one of those system prompts plus its own context (`--context-words` words)
and `--turns` turns (a turn's prompt is the whole conversation so far); `--oneoffs` single
prompts of about as many words, nothing shared, spread through the order. Turns are interleaved
(every session's turn 1, then every turn 2, ...), `--concurrency` clients take requests in that
order; every answer is `--max-tokens` tokens (ignore_eos).

Policies, each a round of its own in mirrored order (A B C D D C B A, `--repeats` times), after
a warm-up round:
- kv_aware: the gateway routing on the engines' KV events (`--gateways` replicas of it, requests
  alternating between them: they share nothing but the engines' events);
- prefix_affinity: today's history-based policy (as many gateway replicas);
- least_outstanding: cache-blind;
- oracle: the client pins session i to engine i mod replicas itself (straight to the engines,
  no gateway), one-offs to its least busy engine: perfect session affinity, as a client that
  knows its sessions can do.

Per round: TTFT p50/p90 (client-side, send -> first content event), output tokens per second
(answers' tokens over the round's wall time), the engines' prefix-cache hit rate (their
vllm:prefix_cache_hits / queries, tokens, delta over the round), and kv_aware's outcomes. The
summary: means over rounds, ratios against prefix_affinity and against the oracle.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import httpx
import orjson

from bench.flow_engine import wait_idle
from bench.prefix_routing import (
    RoundResult,
    affinity_counters,
    cache_counters,
    chat_turn,
    pct,
    print_delta,
    start_proxies,
    words,
)
from bench.procs import free_port_run
from devstack.cli import Parser
from devstack.procs import Proc
from devstack.stack import LocalStack
from gateway.routing.kv_events import KvEvents
from gateway.routing.kv_hash import BlockHasher
from gateway.routing.kv_prompt import PromptTokens
from gateway.settings import KvSettings

Messages = list[dict[str, str]]

# vLLM-CPU's KV block, in tokens (its platform default; the engines' events say it too).
CPU_BLOCK_TOKENS = 128


def fitting_model_len(kv_blocks: int, max_model_len: int | None) -> int:
    """The engines' --max-model-len for caches of `kv_blocks` blocks: vLLM keeps one block back
    (the null block) and will not start unless the others hold one max-length sequence
    (kv_cache_utils.get_kv_cache_configs), so at most (kv_blocks - 1) x 128 tokens."""
    most = (kv_blocks - 1) * CPU_BLOCK_TOKENS
    if most <= 0:
        raise ValueError(f"--kv-blocks {kv_blocks}: vLLM needs at least 2 (one is its null block)")
    if max_model_len is None:
        return most
    if max_model_len > most:
        raise ValueError(
            f"--max-model-len {max_model_len} needs --kv-blocks >= "
            f"{-(-max_model_len // CPU_BLOCK_TOKENS) + 1} (vLLM holds one block back and must fit "
            f"one whole sequence in the rest); --kv-blocks {kv_blocks} fits at most {most}")
    return max_model_len


def kv_counters(url: str) -> dict[str, float]:
    """The gateway's llmserve_kv_routing_total by outcome (empty for other policies)."""
    out: dict[str, float] = {}
    try:
        text = httpx.get(url + "/metrics", timeout=10).text
    except httpx.HTTPError:
        return out
    for line in text.splitlines():
        if line.startswith("llmserve_kv_routing_total{"):
            name, value = line.rsplit(" ", 1)
            outcome = name.split('outcome="', 1)[1].split('"', 1)[0]
            out[outcome] = out.get(outcome, 0.0) + float(value)
    return out


async def check_events(stack: LocalStack, model_dir: Path) -> str:
    """Before the rounds: worker 0's KV events against the gateway's view of a fresh prompt (its
    tokens equal the engine's /tokenize; the engine reports exactly the blocks the gateway
    hashes), as tests/e2e/test_kv_events.py checks on the test stack. One line of evidence."""
    url = stack.worker_urls[0]
    events = KvEvents(KvSettings(endpoints=stack.kv_endpoints()))
    events.follow([url])
    idx = events.indexes[url]
    try:
        for _ in range(100):
            if idx.connected:
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)
        messages = [{"role": "system", "content": f"[check-{time.time()}] "
                     + words(random.Random(0), 500)}, {"role": "user", "content": "Hi?"}]
        async with aiohttp.ClientSession() as s:
            async with s.post(url + "/v1/chat/completions", json={
                    "model": model_dir.name, "messages": messages, "max_tokens": 2}) as r:
                assert r.status == 200, await r.text()
            async with s.post(url + "/tokenize", json={
                    "model": model_dir.name, "messages": messages,
                    "add_generation_prompt": True}) as r:
                engine_tokens = (await r.json())["tokens"]
        tokens = PromptTokens(model_dir).tokens(orjson.dumps(messages))
        for _ in range(100):
            if idx.block_size:
                break
            await asyncio.sleep(0.1)
        assert tokens is not None and idx.block_size is not None
        hashes = BlockHasher().hashes(tokens, idx.block_size, 512)
        await asyncio.sleep(0.5)
        return (f"events check on {url}: tokens equal the engine's: {tokens == engine_tokens} "
                f"({len(tokens)}); block size {idx.block_size}; the engine holds "
                f"{idx.matched(hashes)} of the prompt's {len(hashes)} blocks as hashed here")
    finally:
        await events.close()


def kv_sum(urls: list[str]) -> dict[str, float]:
    """kv_counters summed over the gateway replicas."""
    out: dict[str, float] = {}
    for u in urls:
        for k, v in kv_counters(u).items():
            out[k] = out.get(k, 0.0) + v
    return out


def affinity_sum(urls: list[str]) -> dict[str, float]:
    """prefix_affinity's counters (kv_aware's inner one's too) summed over the gateways."""
    out: dict[str, float] = {}
    for u in urls:
        for k, v in affinity_counters(u).items():
            out[k] = out.get(k, 0.0) + v
    return out


def workload(args: argparse.Namespace, nonce: str) -> tuple[list[Messages], list[Messages]]:
    """(each session's first messages, the one-off prompts) of one round."""
    rng = random.Random(nonce)
    systems = [f"[{nonce}-sys{k}] You are assistant {k}. " + words(rng, args.system_words)
               for k in range(args.shared_prompts)]
    sessions = [[{"role": "system", "content": systems[i % len(systems)]},
                 {"role": "user", "content": f"[{nonce}-{i}] Context: "
                  + words(rng, args.context_words)}]
                for i in range(args.sessions)]
    oneoffs = [[{"role": "user", "content": f"[{nonce}-once{j}] "
                 + words(rng, args.system_words + args.context_words) + "?"}]
               for j in range(args.oneoffs)]
    return sessions, oneoffs


async def run_round(targets: list[str], args: argparse.Namespace, nonce: str, res: RoundResult,
                    pin: bool) -> None:
    """One round through `targets` (gateways in turn; with `pin`, the engines themselves,
    each session on its own and one-offs on the client's least busy one)."""
    model = args.model_dir.name
    sessions, oneoffs = workload(args, nonce)
    rng = random.Random(nonce + "q")
    order: list[tuple[str, int, int]] = [("s", t, i) for t in range(args.turns)
                                         for i in range(args.sessions)]
    step = max(1, len(order) // max(1, len(oneoffs)))
    for j in range(len(oneoffs)):
        order.insert(min(len(order), j * (step + 1)), ("o", 0, j))
    done = {k: asyncio.Event() for k in order}
    queue: asyncio.Queue[tuple[str, int, int]] = asyncio.Queue()
    for k in order:
        queue.put_nowait(k)
    busy = dict.fromkeys(targets, 0)
    turn = itertools.count()

    def target(kind: str, i: int) -> str:
        if not pin:
            return targets[next(turn) % len(targets)]
        if kind == "s":
            return targets[i % len(targets)]
        return min(targets, key=lambda u: busy[u])

    async def client(s: aiohttp.ClientSession) -> None:
        while not queue.empty():
            kind, t, i = queue.get_nowait()
            if kind == "o":
                url = target(kind, i)
                busy[url] += 1
                await chat_turn(s, url, model, oneoffs[i], args.max_tokens, res)
                busy[url] -= 1
                continue
            if t > 0:
                await done[("s", t - 1, i)].wait()
            h = sessions[i]
            if t > 0:
                h.append({"role": "user", "content": f"Question {t + 1}: " + words(rng, 12)
                          + "?"})
            url = target(kind, i)
            busy[url] += 1
            answer = await chat_turn(s, url, model, list(h), args.max_tokens, res)
            busy[url] -= 1
            h.append({"role": "assistant", "content": answer or "..."})
            done[("s", t, i)].set()

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as s:
        await asyncio.gather(*(client(s) for _ in range(args.concurrency)))


def one_round(policy: str, targets: list[str], stack: LocalStack, args: argparse.Namespace,
              nonce: str) -> RoundResult:
    res = RoundResult(policy)
    k0 = kv_sum(targets) if policy == "kv_aware" else {}
    a0 = affinity_sum(targets) if policy in ("kv_aware", "prefix_affinity") else {}
    h0, q0 = cache_counters(stack)
    t0 = time.perf_counter()
    asyncio.run(run_round(targets, args, nonce, res, pin=policy == "oracle"))
    res.wall = time.perf_counter() - t0
    h1, q1 = cache_counters(stack)
    res.hit_rate = (h1 - h0) / (q1 - q0) if q1 > q0 else 0.0
    wait_idle(stack)
    ts = sorted(res.ttft)
    tps = len(res.ttft) * args.max_tokens / res.wall
    print(f"  {policy:18s} TTFT p50 {pct(ts, 0.5) * 1e3:6.0f} ms  p90 "
          f"{pct(ts, 0.9) * 1e3:6.0f} ms  {tps:6.1f} tok/s  wall {res.wall:6.1f} s  cache hits "
          f"{res.hit_rate:5.1%}  errors {res.errors}", flush=True)
    if policy == "kv_aware":
        print_delta("kv_aware", k0, kv_sum(targets))
    if policy in ("kv_aware", "prefix_affinity"):
        print_delta("affinity", a0, affinity_sum(targets))
    return res


def summarize(rounds: list[RoundResult], max_tokens: int) -> None:
    by: dict[str, list[RoundResult]] = {}
    for r in rounds:
        by.setdefault(r.policy, []).append(r)

    def means(rs: list[RoundResult]) -> tuple[float, float, float, float]:
        return (statistics.mean(pct(sorted(r.ttft), 0.5) for r in rs),
                statistics.mean(pct(sorted(r.ttft), 0.9) for r in rs),
                statistics.mean(len(r.ttft) * max_tokens / r.wall for r in rs),
                statistics.mean(r.hit_rate for r in rs))

    m = {p: means(rs) for p, rs in by.items()}
    print("\nmeans over rounds; x: ratio against prefix_affinity (tok/s: higher is better, "
          "TTFT: lower), p90/oracle: ratio of p90 TTFT to the oracle's")
    print(f"  {'policy':18s} {'rounds':>6s} {'TTFT p50':>9s} {'p90':>7s} {'tok/s':>7s} "
          f"{'cache hits':>10s} {'p50 x':>6s} {'p90 x':>6s} {'tok/s x':>7s} {'p90/oracle':>10s}")
    b50, b90, btps, _ = m["prefix_affinity"]
    o90 = m["oracle"][1] if "oracle" in m else float("nan")
    for policy, (p50, p90, tps, hit) in m.items():
        print(f"  {policy:18s} {len(by[policy]):6d} {p50 * 1e3:7.0f}ms {p90 * 1e3:5.0f}ms "
              f"{tps:7.1f} {hit:10.1%} {p50 / b50:6.2f} {p90 / b90:6.2f} {tps / btps:7.2f} "
              f"{p90 / o90:10.2f}")


def main() -> int:
    p = Parser(prog="python -m bench.kv_routing", description=__doc__)
    p.add_argument("--model-dir", type=Path, default=Path("models/SmolLM2-135M-Instruct"),
                   help="the demo model directory")
    p.add_argument("--replicas", type=int, default=4, help="engines")
    p.add_argument("--kv-blocks", type=int, default=24,
                   help="KV cache blocks per engine (128 tokens each on the CPU)")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="the engines' context cap; it must fit in kv-blocks - 1 blocks (vLLM "
                   "holds one back), and it is (kv-blocks - 1) x 128 when not given")
    p.add_argument("--sessions", type=int, default=16, help="chat sessions per round")
    p.add_argument("--turns", type=int, default=3, help="turns per session")
    p.add_argument("--shared-prompts", type=int, default=4,
                   help="system prompts, each shared by sessions/this many sessions")
    p.add_argument("--system-words", type=int, default=280, help="words of a system prompt")
    p.add_argument("--context-words", type=int, default=220,
                   help="words of a session's own context (its first user message)")
    p.add_argument("--oneoffs", type=int, default=16, help="single prompts per round")
    p.add_argument("--max-tokens", type=int, default=16, help="tokens per answer")
    p.add_argument("--concurrency", type=int, default=8, help="requests in flight")
    p.add_argument("--repeats", type=int, default=1,
                   help="the mirrored order (A B C D D C B A) this many times")
    p.add_argument("--engine-nice", type=int, default=10,
                   help="the engines' nice value (the gateways run at 0)")
    p.add_argument("--gateways", type=int, default=1,
                   help="gateway replicas per policy (kv_aware, prefix_affinity); the client "
                   "alternates between them")
    args = p.parse_args()
    try:
        args.max_model_len = fitting_model_len(args.kv_blocks, args.max_model_len)
    except ValueError as e:
        p.error(str(e))
    logs = Path(tempfile.mkdtemp(prefix="kv-bench-"))
    stack = LocalStack(args.model_dir, workers=args.replicas,
                       worker_base_port=free_port_run(args.replicas), log_dir=logs,
                       kv_events_base_port=free_port_run(2 * args.replicas),
                       engine_nice=args.engine_nice,
                       worker_args=["--max-model-len", str(args.max_model_len),
                                    f"--extra-args=--num-gpu-blocks-override {args.kv_blocks}"])
    model = args.model_dir.name
    kv_flags = ["--kv.endpoints", json.dumps(stack.kv_endpoints()),
                "--kv.tokenizers", json.dumps({model: str(args.model_dir.resolve())})]
    procs: list[Proc] = []
    try:
        t_start = time.perf_counter()
        stack.start_workers()
        stack.wait_workers(timeout_s=900)
        variants: dict[str, list[str]] = {"least_outstanding": ["least_outstanding"]}
        for g in range(args.gateways):
            variants[f"kv_aware#{g}"] = ["kv_aware", *kv_flags]
            variants[f"prefix_affinity#{g}"] = ["prefix_affinity"]
        urls, procs = start_proxies(stack, logs, variants)
        targets = {
            "kv_aware": [urls[f"kv_aware#{g}"] for g in range(args.gateways)],
            "prefix_affinity": [urls[f"prefix_affinity#{g}"] for g in range(args.gateways)],
            "least_outstanding": [urls["least_outstanding"]],
            "oracle": stack.worker_urls,
        }
        print(f"{args.replicas} engines ({args.kv_blocks} KV blocks each, {args.kv_blocks - 1} "
              f"usable; max model len {args.max_model_len}) and gateways up in "
              f"{time.perf_counter() - t_start:.0f} s; logs {logs}", flush=True)
        print(asyncio.run(check_events(stack, args.model_dir)), flush=True)
        print("warm-up (least_outstanding):", flush=True)
        warm = argparse.Namespace(**{**vars(args), "sessions": 8, "oneoffs": 4, "turns": 2})
        one_round("warm-up", targets["least_outstanding"], stack, warm, "warm")
        policies = ["kv_aware", "prefix_affinity", "least_outstanding", "oracle"]
        order = (policies + policies[::-1]) * args.repeats
        print(f"{args.sessions} sessions x {args.turns} turns + {args.oneoffs} one-offs per "
              f"round, concurrency {args.concurrency}; order {' '.join(order)}", flush=True)
        rounds = [one_round(policy, targets[policy], stack, args, f"r{n}")
                  for n, policy in enumerate(order)]
        summarize(rounds, args.max_tokens)
        print(f"total {time.perf_counter() - t_start:.0f} s")
    finally:
        for proc in procs:
            proc.stop()
        stack.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
