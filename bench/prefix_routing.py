"""Prefix-cache-aware routing on real engines: prefix_affinity against the other policies.

    python -m bench.prefix_routing \\
        --model-dir models/SmolLM2-135M-Instruct [--sessions 48] [--turns 3] [--concurrency 4]
        [--router path/to/vllm-router]  (pip install vllm-router, in a venv of its own)
    python -m bench.prefix_routing --workload adapters --model-dir ... [--adapters 6]
        [--max-loras 1] [--adapter-requests 120]  (needs peft: the dev extra)

Two vLLM-CPU replicas (one core each, 1 GiB KV cache, prefix caching on: vLLM's default) serve
the demo model. In front of them, on the same replicas: three gateways (prefix_affinity,
least_outstanding, round_robin; flow control and batching off, so that only routing differs) and,
with --router, vllm-router's cache_aware policy.

Workload `sessions`: `--sessions` chat sessions, each with its own system prompt of about
`--system-words` words (about 650 tokens), `--turns` turns each; a turn's prompt is the whole
conversation so far. Turns are interleaved (every session's turn 1, then every turn 2, ...) and
`--concurrency` clients take them in that order, so a session's next turn comes after every other
session's: together the prefixes need more KV cache than one replica holds and less than two.
Every answer is `--max-tokens` tokens (ignore_eos).

Procedure: a warm-up round at full shape (vLLM-CPU compiles prefill shapes on first use), then
rounds in mirrored order (A B C D D C B A), each on fresh prefixes (a per-round nonce starts every
system prompt), waiting for idle engines between rounds. Then workload `random`: single-turn
prompts of the same size with nothing shared, prefix_affinity against least_outstanding (A B B A,
`--random-repeats` times).

Workload `adapters` (`--workload adapters`, issue 27): LoRA residency. `--adapters` real adapters
for the demo model (devstack/adapter.py: PEFT, seeded) are declared on both replicas with
`--max-loras` slots each (1 by default: fewer slots than adapters, so a replica swaps adapters
and batches only requests of the adapters in its slots). Two gateways: residency-aware routing
(over least_outstanding) and plain least_outstanding. `--adapter-requests` streamed chat requests
per round, each for an adapter drawn from a Zipf mix (weight 1/rank^`--adapter-skew`), a short
prompt of fresh random words, `--adapter-tokens` tokens each, `--concurrency` at a time; a warm-up
round, then A B B A (`--adapter-repeats` times). TTFT p50 and p99 per round, means over rounds and
ratios against least_outstanding, and the residency gateway's counters (hit, miss, overloaded).

Per round: TTFT p50/p90 (client-side, send -> first content event), wall time, and the engines'
prefix-cache hit rate (vllm:prefix_cache_hits / vllm:prefix_cache_queries, tokens, summed over
both replicas, delta over the round). The summary gives means over rounds and ratios against
least_outstanding. For the gateways with an affinity policy, each round also prints the policy's
counters (hits, misses, fallbacks by reason, keys moved): where the turns went.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import httpx

from bench.flow_engine import wait_idle
from bench.procs import free_port_pair
from devstack.cli import Parser
from devstack.procs import Proc, free_port
from devstack.stack import LocalStack, wait_http_ok

_WORDS = ["time", "person", "year", "way", "day", "thing", "man", "world", "life", "hand", "part", "child", "eye", "woman", "place", "work", "week", "case", "point", "government", "company", "number", "group", "problem", "fact", "be", "have", "do", "say", "get", "make", "go", "know", "take", "see", "come", "think", "look", "want", "give", "use", "find", "tell", "ask", "seem", "feel", "try", "leave", "call", "good", "new", "first", "last", "long", "great", "little", "own", "other", "old", "right", "big", "high", "different", "small", "large", "next", "early", "young", "important", "few", "public", "bad", "same", "able", "river", "mountain", "garden", "kitchen", "engine", "signal", "harbor", "lantern", "meadow", "pencil", "window", "thunder", "silver", "copper", "orange", "violet", "marble", "canyon", "forest", "desert", "island", "valley", "bridge", "castle", "tower", "market", "museum", "library", "station", "airport"]


@dataclass
class RoundResult:
    policy: str
    ttft: list[float] = field(default_factory=list)
    wall: float = 0.0
    hit_rate: float = 0.0
    errors: int = 0
    prompt_tokens: list[int] = field(default_factory=list)


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n))


async def chat_turn(s: aiohttp.ClientSession, url: str, model: str, messages: list[dict[str, str]],
                    max_tokens: int, res: RoundResult) -> str:
    """One streamed turn; returns the answer text (appended to the session's history)."""
    body = {"model": model, "messages": messages, "stream": True, "max_tokens": max_tokens,
            "ignore_eos": True, "temperature": 0.0,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first: float | None = None
    parts: list[str] = []
    try:
        async with s.post(url + "/v1/chat/completions", json=body) as r:
            if r.status != 200:
                res.errors += 1
                return ""
            buf = b""
            async for chunk in r.content.iter_any():
                buf += chunk
                while b"\n\n" in buf:
                    event, buf = buf.split(b"\n\n", 1)
                    data = event.removeprefix(b"data: ").strip()
                    if not data or data == b"[DONE]":
                        continue
                    obj = json.loads(data)
                    if obj.get("usage"):
                        res.prompt_tokens.append(int(obj["usage"]["prompt_tokens"]))
                    for c in obj.get("choices") or ():
                        text = (c.get("delta") or {}).get("content")
                        if text:
                            if first is None:
                                first = time.perf_counter()
                            parts.append(text)
    except (TimeoutError, aiohttp.ClientError):
        res.errors += 1
        return ""
    if first is None:
        res.errors += 1
        return ""
    res.ttft.append(first - t0)
    return "".join(parts)


async def run_sessions(url: str, model: str, args: argparse.Namespace, nonce: str,
                       res: RoundResult) -> None:
    rng = random.Random(nonce)
    histories = [[{"role": "system",
                   "content": f"[{nonce}-{i}] You are assistant {i}. " + words(rng, args.system_words)}]
                 for i in range(args.sessions)]
    # Interleaved: every session's turn t before any turn t+1; a session's turn t+1 needs its
    # answer to turn t, which the strict order guarantees once concurrency < sessions.
    order = [(t, i) for t in range(args.turns) for i in range(args.sessions)]
    done: dict[tuple[int, int], asyncio.Event] = {k: asyncio.Event() for k in order}
    queue: asyncio.Queue[tuple[int, int]] = asyncio.Queue()
    for k in order:
        queue.put_nowait(k)

    async def client(s: aiohttp.ClientSession) -> None:
        while not queue.empty():
            t, i = queue.get_nowait()
            if t > 0:
                await done[(t - 1, i)].wait()
            h = histories[i]
            h.append({"role": "user", "content": f"Question {t + 1}: " + words(rng, 12) + "?"})
            answer = await chat_turn(s, url, model, list(h), args.max_tokens, res)
            h.append({"role": "assistant", "content": answer or "..."})
            done[(t, i)].set()

    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as s:
        await asyncio.gather(*(client(s) for _ in range(args.concurrency)))


async def run_random(url: str, model: str, args: argparse.Namespace, nonce: str,
                     res: RoundResult) -> None:
    rng = random.Random(nonce)
    prompts = [[{"role": "system", "content": f"[{nonce}-{i}] " + words(rng, args.system_words)},
                {"role": "user", "content": words(rng, 12) + "?"}]
               for i in range(args.random_requests)]
    queue: asyncio.Queue[list[dict[str, str]]] = asyncio.Queue()
    for p in prompts:
        queue.put_nowait(p)

    async def client(s: aiohttp.ClientSession) -> None:
        while not queue.empty():
            await chat_turn(s, url, model, queue.get_nowait(), args.max_tokens, res)

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as s:
        await asyncio.gather(*(client(s) for _ in range(args.concurrency)))


def zipf_weights(n: int, skew: float) -> list[float]:
    raw = [1.0 / (rank ** skew) for rank in range(1, n + 1)]
    return [w / sum(raw) for w in raw]


async def run_adapters(url: str, names: list[str], args: argparse.Namespace, nonce: str,
                       res: RoundResult) -> None:
    """The skewed adapter mix: each request one short prompt for one adapter."""
    rng = random.Random(nonce)
    weights = zipf_weights(len(names), args.adapter_skew)
    queue: asyncio.Queue[tuple[str, list[dict[str, str]]]] = asyncio.Queue()
    for i, name in enumerate(rng.choices(names, weights, k=args.adapter_requests)):
        queue.put_nowait((name, [{"role": "user", "content": f"[{nonce}-{i}] "
                                  + words(rng, args.adapter_words) + "?"}]))

    async def client(s: aiohttp.ClientSession) -> None:
        while not queue.empty():
            name, messages = queue.get_nowait()
            await chat_turn(s, url, name, messages, args.adapter_tokens, res)

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as s:
        await asyncio.gather(*(client(s) for _ in range(args.concurrency)))


def residency_counters(url: str) -> dict[str, float]:
    """The gateway's llmserve_adapter_residency_total by outcome (empty without residency)."""
    out: dict[str, float] = {}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("llmserve_adapter_residency_total{"):
            name, value = line.rsplit(" ", 1)
            outcome = name.split('outcome="', 1)[1].split('"', 1)[0]
            out[outcome] = out.get(outcome, 0.0) + float(value)
    return out


def adapter_round(policy: str, url: str, stack: LocalStack, names: list[str],
                  args: argparse.Namespace, nonce: str) -> RoundResult:
    res = RoundResult(policy)
    c0 = residency_counters(url)
    t0 = time.perf_counter()
    asyncio.run(run_adapters(url, names, args, nonce, res))
    res.wall = time.perf_counter() - t0
    wait_idle(stack)
    ts = sorted(res.ttft)
    print(f"  adapters {policy:18s} TTFT p50 {pct(ts, 0.5) * 1e3:6.0f} ms  p99 "
          f"{pct(ts, 0.99) * 1e3:6.0f} ms  wall {res.wall:6.1f} s  errors {res.errors}",
          flush=True)
    print_delta("residency", c0, residency_counters(url))
    return res


def adapters_main(args: argparse.Namespace, logs: Path) -> int:
    """Workload `adapters` (module docstring): its own engines, with the adapters declared."""
    from devstack.adapter import make_demo_adapter

    names = [f"lora-{i}" for i in range(args.adapters)]
    dirs = {n: make_demo_adapter(args.model_dir, logs / "adapters" / n, seed=i + 1)
            for i, n in enumerate(names)}
    base = args.model_dir.name
    stack = LocalStack(args.model_dir, workers=2, worker_base_port=free_port_pair(),
                       log_dir=logs, kv_cache_gib=args.kv_cache_gib,
                       worker_args=["--lora-adapters", ",".join(f"{n}={d}" for n, d in
                                                                dirs.items()),
                                    "--max-loras", str(args.max_loras)])
    slots = ["--lora.max-loras", json.dumps({base: args.max_loras})]
    variants = {"residency": ["least_outstanding", *slots],
                "least_outstanding": ["least_outstanding", *slots, "--no-lora.residency"]}
    procs: list[Proc] = []
    try:
        t_start = time.perf_counter()
        stack.start_workers()
        stack.wait_workers(timeout_s=900)
        print(f"engines up in {time.perf_counter() - t_start:.0f} s (LoRA: {args.adapters} "
              f"adapters, --max-loras {args.max_loras}); logs {logs}", flush=True)
        urls, procs = start_proxies(stack, logs, variants)
        print("warm-up (least_outstanding):", flush=True)
        adapter_round("warm-up", urls["least_outstanding"], stack, names, args, "warm")
        pair = ["residency", "least_outstanding"]
        rounds = [adapter_round(policy, urls[policy], stack, names, args, f"a{n}")
                  for n, policy in enumerate((pair + pair[::-1]) * args.adapter_repeats)]
        summarize("adapters", rounds, "least_outstanding", tail=0.99)
        print(f"total {time.perf_counter() - t_start:.0f} s")
    finally:
        for proc in procs:
            proc.stop()
        stack.stop()
    return 0


def cache_counters(stack: LocalStack) -> tuple[float, float]:
    """(prefix-cache hit tokens, query tokens) summed over the replicas."""
    hits = queries = 0.0
    for u in stack.worker_urls:
        for line in httpx.get(u + "/metrics", timeout=10).text.splitlines():
            if line.startswith("vllm:prefix_cache_hits_total"):
                hits += float(line.rsplit(" ", 1)[1])
            elif line.startswith("vllm:prefix_cache_queries_total"):
                queries += float(line.rsplit(" ", 1)[1])
    return hits, queries


def affinity_counters(url: str) -> dict[str, float]:
    """The gateway's llmserve_affinity_* counters (hits, misses, fallbacks by reason, keys
    moved), summed over pools; empty for a policy or router that has none."""
    out: dict[str, float] = {}
    try:
        text = httpx.get(url + "/metrics", timeout=10).text
    except httpx.HTTPError:
        return out
    for line in text.splitlines():
        if not line.startswith("llmserve_affinity_") or "_created" in line:
            continue
        name, value = line.rsplit(" ", 1)
        metric = name.split("{", 1)[0].removeprefix("llmserve_affinity_").removesuffix("_total")
        if 'reason="' in name:
            metric += ":" + name.split('reason="', 1)[1].split('"', 1)[0]
        if metric != "entries":
            out[metric] = out.get(metric, 0.0) + float(value)
    return out


def one_round(kind: str, policy: str, url: str, stack: LocalStack, model: str,
              args: argparse.Namespace, nonce: str) -> RoundResult:
    res = RoundResult(policy)
    a0 = affinity_counters(url)
    h0, q0 = cache_counters(stack)
    t0 = time.perf_counter()
    run = run_sessions if kind == "sessions" else run_random
    asyncio.run(run(url, model, args, nonce, res))
    res.wall = time.perf_counter() - t0
    h1, q1 = cache_counters(stack)
    res.hit_rate = (h1 - h0) / (q1 - q0) if q1 > q0 else 0.0
    wait_idle(stack)
    ts = sorted(res.ttft)
    print(f"  {kind:8s} {policy:18s} TTFT p50 {pct(ts, 0.5) * 1e3:6.0f} ms  p90 "
          f"{pct(ts, 0.9) * 1e3:6.0f} ms  wall {res.wall:6.1f} s  cache hits "
          f"{res.hit_rate:5.1%}  errors {res.errors}", flush=True)
    print_delta("affinity", a0, affinity_counters(url))
    return res


def print_delta(what: str, before: dict[str, float], after: dict[str, float]) -> None:
    """A gateway's counters over one round, those that moved."""
    delta = {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0)}
    if delta:
        print(f"    {what}: " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(delta.items())),
              flush=True)


def pct(xs: list[float], q: float) -> float:
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def summarize(kind: str, rounds: list[RoundResult], base: str, tail: float = 0.9) -> None:
    by: dict[str, list[RoundResult]] = {}
    for r in rounds:
        by.setdefault(r.policy, []).append(r)

    def means(rs: list[RoundResult]) -> tuple[float, float, float, float]:
        return (statistics.mean(pct(sorted(r.ttft), 0.5) for r in rs),
                statistics.mean(pct(sorted(r.ttft), tail) for r in rs),
                statistics.mean(r.wall for r in rs), statistics.mean(r.hit_rate for r in rs))

    b50, btail, bwall, _ = means(by[base])
    q = f"p{tail * 100:g}"
    print(f"\n{kind}: means over rounds (ratios against {base})")
    print(f"  {'policy':18s} {'rounds':>6s} {'TTFT p50':>9s} {q:>7s} {'wall':>7s} "
          f"{'cache hits':>10s} {'p50 x':>6s} {q + ' x':>6s} {'wall x':>6s}")
    for policy, rs in by.items():
        p50, ptail, wall, hit = means(rs)
        print(f"  {policy:18s} {len(rs):6d} {p50 * 1e3:7.0f}ms {ptail * 1e3:5.0f}ms "
              f"{wall:6.1f}s {hit:10.1%} {p50 / b50:6.2f} {ptail / btail:6.2f} "
              f"{wall / bwall:6.2f}")


def start_proxies(stack: LocalStack, logs: Path, variants: dict[str, list[str]],
                  router: str | None = None) -> tuple[dict[str, str], list[Proc]]:
    """One gateway per variant (name -> [policy, more flags...]), and vllm-router if given."""
    urls: dict[str, str] = {}
    procs: list[Proc] = []
    for name, (policy, *extra) in variants.items():
        port = free_port()
        argv = [sys.executable, "-m", "gateway", "--host", "127.0.0.1", "--port", str(port),
                "--log-level", "warning", "--routing-policy", policy,
                "--no-flow.enabled", "--no-batch.enabled", *extra]
        for u in stack.worker_urls:
            argv += ["--backend", u]
        procs.append(Proc(f"gateway-{name}", argv, dict(os.environ),
                          logs / f"gateway-{name}.log"))
        urls[name] = f"http://127.0.0.1:{port}"
    if router:
        port = free_port()
        argv = [router, "--host", "127.0.0.1", "--port", str(port), "--policy", "cache_aware",
                "--worker-urls", *stack.worker_urls]
        procs.append(Proc("vllm-router", argv, dict(os.environ),
                          logs / "vllm-router.log"))
        urls["vllm-router cache_aware"] = f"http://127.0.0.1:{port}"
    for name, url in urls.items():
        probe = "/health" if name.startswith("vllm-router") else "/ready"
        wait_http_ok(url + probe, 120, procs)
    return urls, procs


def main() -> int:
    p = Parser(prog="python -m bench.prefix_routing", description=__doc__)
    p.add_argument("--model-dir", type=Path, default=Path("models/SmolLM2-135M-Instruct"),
                   help="the demo model directory")
    p.add_argument("--sessions", type=int, default=48, help="chat sessions")
    p.add_argument("--turns", type=int, default=3, help="turns per session")
    p.add_argument("--system-words", type=int, default=560, help="about 650 tokens")
    p.add_argument("--max-tokens", type=int, default=8, help="tokens per answer")
    p.add_argument("--warmup-sessions", type=int, default=8,
                   help="sessions of the warm-up round (same shape, fewer of them)")
    p.add_argument("--concurrency", type=int, default=4, help="requests in flight")
    p.add_argument("--random-requests", type=int, default=24,
                   help="requests per round of the random workload (0: skip it)")
    p.add_argument("--random-repeats", type=int, default=1,
                   help="random workload: A B B A this many times")
    p.add_argument("--session-repeats", type=int, default=1,
                   help="sessions workload: the mirrored order (A B C D D C B A) this many times")
    p.add_argument("--router", default="", help="vllm-router binary (cache_aware joins the run)")
    p.add_argument("--kv-cache-gib", type=int, default=1, help="KV cache per engine, GiB")
    p.add_argument("--affinity-slack", type=int, default=0,
                   help="also run prefix_affinity with --affinity.slack N (a fifth policy)")
    p.add_argument("--workload", choices=("sessions", "adapters"), default="sessions",
                   help="sessions (and random): prefix affinity; adapters: LoRA residency")
    p.add_argument("--adapters", type=int, default=6, help="adapters workload: adapters")
    p.add_argument("--max-loras", type=int, default=1, help="adapters workload: slots per "
                   "replica (vLLM --max-loras)")
    p.add_argument("--adapter-skew", type=float, default=1.0, help="Zipf exponent of the mix")
    p.add_argument("--adapter-requests", type=int, default=120, help="requests per round")
    p.add_argument("--adapter-words", type=int, default=60, help="words per prompt")
    p.add_argument("--adapter-tokens", type=int, default=32, help="tokens per answer")
    p.add_argument("--adapter-repeats", type=int, default=1, help="A B B A this many times")
    args = p.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="prefix-bench-"))
    if args.workload == "adapters":
        return adapters_main(args, logs)
    stack = LocalStack(args.model_dir, workers=2, worker_base_port=free_port_pair(),
                       log_dir=logs, kv_cache_gib=args.kv_cache_gib)
    model = args.model_dir.name
    procs: list[Proc] = []
    try:
        t_start = time.perf_counter()
        stack.start_workers()
        stack.wait_workers(timeout_s=900)
        variants = {p: [p] for p in ("prefix_affinity", "least_outstanding", "round_robin")}
        if args.affinity_slack:
            variants[f"prefix_affinity+slack{args.affinity_slack}"] = [
                "prefix_affinity", "--affinity.slack", str(args.affinity_slack)]
        urls, procs = start_proxies(stack, logs, variants, args.router or None)
        print(f"engines and proxies up in {time.perf_counter() - t_start:.0f} s; logs {logs}",
              flush=True)
        policies = list(urls)
        print("warm-up (full shape, least_outstanding):", flush=True)
        warm_args = argparse.Namespace(**{**vars(args), "sessions": args.warmup_sessions})
        warm = one_round("sessions", "warm-up", urls["least_outstanding"], stack, model,
                         warm_args, "warm")
        if warm.prompt_tokens:
            print(f"  prompt tokens per turn: min {min(warm.prompt_tokens)}, "
                  f"max {max(warm.prompt_tokens)}", flush=True)
        rounds: list[RoundResult] = []
        order = (policies + policies[::-1]) * args.session_repeats
        print(f"sessions: {args.sessions} x {args.turns} turns, concurrency {args.concurrency}, "
              f"order {' '.join(order)}", flush=True)
        for n, policy in enumerate(order):
            rounds.append(one_round("sessions", policy, urls[policy], stack, model, args,
                                    f"s{n}"))
        summarize("sessions", rounds, "least_outstanding")
        if args.random_requests:
            rand: list[RoundResult] = []
            pair = ["prefix_affinity", "least_outstanding"]
            # A B B A, repeated: the mirrored order cancels a steady drift, the repeats show
            # the spread between rounds of one policy.
            for n, policy in enumerate((pair + pair[::-1]) * args.random_repeats):
                rand.append(one_round("random", policy, urls[policy], stack, model, args,
                                      f"r{n}"))
            summarize("random", rand, "least_outstanding")
        print(f"total {time.perf_counter() - t_start:.0f} s")
    finally:
        for proc in procs:
            proc.stop()
        stack.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
