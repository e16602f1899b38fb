"""The prefix_routing workload against simulated engines, routed by the real policy objects.

    python -m bench.affinity_sim [--sessions 48] [--turns 3] [--concurrency 4] [--seeds 5]
        [--trace POLICY] [--variant NAME='{"slack": 1}']
    python -m bench.affinity_sim --pick-cost [--baseline path/to/old/affinity.py]

A model, not a measurement: it answers "where did each session's turns go, and why" in seconds,
which the real benchmark (bench/prefix_routing.py, 25 minutes) cannot show. The policies are the
gateway's own (gateway/routing), fed the same chat JSON the gateway hashes. The engines are a
rough vLLM-CPU: per replica, steps that batch every running request; a step costs
`--step-ms` plus `--prefill-ms-per-token` per prefill token (chunked at `--chunk` tokens per
step); a request's first token comes at the end of the step that finishes its prefill, and it
holds `--answer-tokens` decode steps. Each replica's prefix cache is an LRU of session prefixes
holding `--cache-tokens` tokens (1 GiB of KV for the demo model on vLLM-CPU: about 20k); a turn
prefills only what its replica does not hold. Tokens are prompt bytes / `--bytes-per-token`.

`--pick-cost` times instead what the policy adds per request on a 2.7 KB chat prompt: the JSON
of the messages, the RouteRequest and `pick` (a second turn, which hits, and a new session's
first, which misses), in turn with `--baseline`'s PrefixAffinity (e.g. the previous version,
`git show HEAD~1:gateway/routing/affinity.py > /tmp/old_affinity.py`) when given.
"""

from __future__ import annotations

import argparse
import heapq
import importlib.util
import random
import statistics
import sys
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import orjson

from gateway.routing.affinity import PrefixAffinity
from gateway.routing.backend import Backend
from gateway.routing.policy import LeastOutstanding, RoundRobin, RouteRequest, RoutingPolicy
from gateway.settings import AffinitySettings

_WORDS = [
    "time", "person", "year", "way", "day", "thing", "man", "world", "life", "hand", "part",
    "child", "eye", "woman", "place", "work", "week", "case", "point", "government", "company",
    "number", "group", "problem", "fact", "river", "mountain", "garden", "kitchen", "engine",
    "signal", "harbor", "lantern", "meadow", "pencil", "window", "thunder", "silver", "copper",
    "orange", "violet", "marble", "canyon", "forest", "desert", "island", "valley", "bridge",
    "castle", "tower", "market"]


@dataclass
class Req:
    session: int
    turn: int
    prompt_tokens: int
    todo: int = 0  # prefill tokens left
    decoded: int = 0
    t_sent: float = 0.0
    ttft: float = -1.0
    replica: int = -1


@dataclass
class Replica:
    cache: OrderedDict[int, int] = field(default_factory=OrderedDict)  # session -> cached tokens
    running: list[Req] = field(default_factory=list)
    busy: bool = False
    cached_tokens: int = 0
    prompt_tokens: int = 0


def simulate(make: Callable[[], RoutingPolicy], args: argparse.Namespace, seed: int,
             trace: bool = False) -> dict[str, float]:
    rng = random.Random(seed)
    pool = tuple(Backend(f"http://10.0.0.{i}:8000") for i in range(args.replicas))
    for b in pool:
        b.probe_ok = True
    index = {b: i for i, b in enumerate(pool)}
    reps = [Replica() for _ in pool]
    policy = make()
    hist = [[{"role": "system", "content": f"[{seed}-{i}] You are assistant {i}. "
              + " ".join(rng.choice(_WORDS) for _ in range(args.system_words))}]
            for i in range(args.sessions)]
    order = [(t, i) for t in range(args.turns) for i in range(args.sessions)]
    done: set[tuple[int, int]] = set()
    waiting: dict[tuple[int, int], int] = {}  # (turn, session) blocked on its previous turn
    events: list[tuple[float, int, str, int]] = []  # (time, seq, kind, replica or client)
    seq = 0
    now = 0.0
    ttfts: list[float] = []
    homes: list[list[int]] = [[] for _ in range(args.sessions)]
    next_item = 0

    def push(t: float, kind: str, who: int) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t, seq, kind, who))

    def send(t: int, i: int) -> None:
        h = hist[i]
        h.append({"role": "user", "content": f"Question {t + 1}: "
                  + " ".join(rng.choice(_WORDS) for _ in range(12)) + "?"})
        body = orjson.dumps(h)
        b = policy.pick(pool, RouteRequest("m", None, body) if policy.uses_affinity
                        else RouteRequest("m"))
        assert b is not None
        b.acquire()
        r = index[b]
        tokens = int(len(body) / args.bytes_per_token)
        rep = reps[r]
        cached = min(rep.cache.get(i, 0), tokens)
        if i in rep.cache:
            rep.cache.move_to_end(i)
        rep.cached_tokens += cached
        rep.prompt_tokens += tokens
        req = Req(i, t, tokens, todo=tokens - cached, t_sent=now, replica=r)
        homes[i].append(r)
        rep.running.append(req)
        if not rep.busy:
            start_step(r)

    def start_step(r: int) -> None:
        rep = reps[r]
        rep.busy = True
        budget = args.chunk
        cost = args.step_ms / 1e3
        for q in rep.running:
            if q.todo > 0:
                take = min(q.todo, budget)
                budget -= take
                cost += take * args.prefill_ms_per_token / 1e3
        push(now + cost * rng.uniform(1 - args.jitter, 1 + args.jitter), "step", r)

    def insert(r: int, q: Req) -> None:
        rep = reps[r]
        total = q.prompt_tokens + args.answer_tokens
        rep.cache[q.session] = total
        rep.cache.move_to_end(q.session)
        while sum(rep.cache.values()) > args.cache_tokens and len(rep.cache) > 1:
            rep.cache.popitem(last=False)

    def client_next(c: int) -> None:
        nonlocal next_item
        if next_item >= len(order):
            return
        t, i = order[next_item]
        next_item += 1
        if t > 0 and (t - 1, i) not in done:
            waiting[(t - 1, i)] = c
            waiting_items[c] = (t, i)
            return
        send(t, i)
        client_of[(t, i)] = c

    waiting_items: dict[int, tuple[int, int]] = {}
    client_of: dict[tuple[int, int], int] = {}
    for c in range(args.concurrency):
        client_next(c)
    while events:
        now, _, _kind, r = heapq.heappop(events)
        rep = reps[r]
        budget = args.chunk
        finished: list[Req] = []
        for q in rep.running:
            if q.todo > 0:
                take = min(q.todo, budget)
                budget -= take
                q.todo -= take
                if q.todo == 0:
                    q.ttft = now - q.t_sent
                    q.decoded = 1
            else:
                q.decoded += 1
            if q.decoded >= args.answer_tokens:
                finished.append(q)
        rep.busy = False
        for q in finished:
            rep.running.remove(q)
            pool[r].release()
            insert(r, q)
            ttfts.append(q.ttft)
            hist[q.session].append({"role": "assistant", "content": "ok " * args.answer_tokens})
            done.add((q.turn, q.session))
            c = client_of.pop((q.turn, q.session))
            blocked = waiting.pop((q.turn, q.session), None)
            if blocked is not None:
                t, i = waiting_items.pop(blocked)
                send(t, i)
                client_of[(t, i)] = blocked
            client_next(c)
        if rep.running and not rep.busy:
            start_step(r)
    ttfts.sort()
    moved = sum(1 for h in homes if len(set(h)) > 1)
    split = [sum(1 for h in homes if h[0] == r) for r in range(len(pool))]
    hit = sum(x.cached_tokens for x in reps) / sum(x.prompt_tokens for x in reps)
    if trace:
        print("  session homes by turn:", " ".join("".join(str(x) for x in h) for h in homes))
        stats = getattr(policy, "stats", None)
        if stats is not None:
            print(f"  hits {stats.hits} misses {stats.misses} fallbacks {stats.fallbacks}")
    return {"p50": ttfts[len(ttfts) // 2], "p90": ttfts[int(0.9 * len(ttfts))], "wall": now,
            "hits": hit, "moved": moved, "split": max(split) - min(split)}


def policies(args: argparse.Namespace) -> dict[str, Callable[[], RoutingPolicy]]:
    out: dict[str, Callable[[], RoutingPolicy]] = {
        "least_outstanding": LeastOutstanding,
        "round_robin": RoundRobin,
        "prefix_affinity": PrefixAffinity,
    }
    for extra in args.variant:
        name, _, spec = extra.partition("=")
        settings = AffinitySettings(**orjson.loads(spec or "{}"))
        out[name] = lambda s=settings: PrefixAffinity(s)
    return out


def pick_cost(baseline: str, rounds: int = 15, n: int = 2000) -> None:
    """Microseconds per request, best and median of `rounds`, the variants in turn within each
    round (on a shared machine the best is the steadier estimate of the code's own cost)."""
    variants: dict[str, Callable[[], RoutingPolicy]] = {"this": PrefixAffinity}
    if baseline:
        spec = importlib.util.spec_from_file_location("baseline_affinity", baseline)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        variants["baseline"] = mod.PrefixAffinity
    rng = random.Random(1)

    def convo(i: int, turns: int) -> list[dict[str, str]]:
        system = f"[{i}] You are assistant {i}. " + " ".join(rng.choice(_WORDS)
                                                                 for _ in range(440))
        out = [{"role": "system", "content": system}]
        for t in range(turns):
            out += [{"role": "user", "content": f"Question {t}: " + "what is it? " * 4},
                    {"role": "assistant", "content": "ok " * 8}]
        return out[:-1]

    firsts = [convo(i, 1) for i in range(n)]
    seconds = [f + [{"role": "assistant", "content": "ok " * 8},
                    {"role": "user", "content": "and then?"}] for f in firsts]
    size = statistics.mean(len(orjson.dumps(m)) for m in seconds)
    results: dict[str, dict[str, list[float]]] = {k: {"miss": [], "hit": []} for k in variants}
    for r_i in range(rounds):
        # Alternate which goes first: the first of a round ran measurably slower here.
        for name, make in list(variants.items())[::1 if r_i % 2 else -1]:
            pool = tuple(Backend(f"http://10.0.0.{i}:8000") for i in range(2))
            for b in pool:
                b.probe_ok = True
            policy = make()
            for kind, msgs in (("miss", firsts), ("hit", seconds)):
                t0 = time.perf_counter()
                for m in msgs:
                    policy.pick(pool, RouteRequest("m", None, orjson.dumps(m)))
                results[name][kind].append((time.perf_counter() - t0) / len(msgs) * 1e6)
    print(f"pick cost per request, {size:.0f}-byte chat prompt, 2 replicas, best / median of "
          f"{rounds} rounds:")
    for name, r in results.items():
        print(f"  {name:9s} miss (first turn) {min(r['miss']):5.1f} / "
              f"{statistics.median(r['miss']):5.1f} us   hit (second turn) {min(r['hit']):5.1f} / "
              f"{statistics.median(r['hit']):5.1f} us")


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.affinity_sim", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--sessions", type=int, default=48)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--system-words", type=int, default=560)
    p.add_argument("--answer-tokens", type=int, default=8)
    p.add_argument("--bytes-per-token", type=float, default=5.2)
    p.add_argument("--cache-tokens", type=int, default=20_000)
    p.add_argument("--chunk", type=int, default=2048, help="prefill tokens per step")
    p.add_argument("--step-ms", type=float, default=30.0)
    p.add_argument("--prefill-ms-per-token", type=float, default=2.5)
    p.add_argument("--jitter", type=float, default=0.3, help="step times vary by +-this share")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--trace", default="", help="print each session's replicas for this policy")
    p.add_argument("--variant", action="append", default=[],
                   help='NAME={"slack": 1} : prefix_affinity with these AffinitySettings')
    p.add_argument("--pick-cost", action="store_true",
                   help="time the policy per request instead of simulating")
    p.add_argument("--baseline", default="", help="with --pick-cost: an affinity.py to compare")
    args = p.parse_args()
    if args.pick_cost:
        pick_cost(args.baseline)
        return 0
    print(f"{'policy':24s} {'p50 ms':>7s} {'p90 ms':>7s} {'wall s':>7s} {'hits':>6s} "
          f"{'moved':>5s} {'split':>5s}   (means over {args.seeds} seeds)")
    for name, make in policies(args).items():
        rs = [simulate(make, args, s, trace=(name == args.trace and s == 0))
              for s in range(args.seeds)]

        def m(k: str, rs: list[dict[str, float]] = rs) -> float:
            return statistics.mean(r[k] for r in rs)

        print(f"{name:24s} {m('p50') * 1e3:7.0f} {m('p90') * 1e3:7.0f} {m('wall'):7.1f} "
              f"{m('hits'):6.1%} {m('moved'):5.1f} {m('split'):5.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
