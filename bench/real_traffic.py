"""Flow control on the traffic users send, on real vLLM-CPU replicas: the engines alone against the
gateway, side by side in one run (issue 35).

    python -m bench.real_traffic --model-dir models/SmolLM2-135M-Instruct [--workers 2]

Starts `--workers` vLLM-CPU replicas once (one core each, as `make up` does), then per scenario
and side a fresh process for each gateway side (a deploy, as a new user meets it):

* `engine`: no gateway, the client spreads its requests over the replicas itself;
* `defaults`: the gateway with its default flow settings (4 s TTFT target, 1 s queue timeout);
* `make-up`: the gateway as `make up` runs it (20 s target, 5 s queue timeout).

Scenarios, through the OpenAI Python SDK with its default 2 retries (which honour Retry-After):

* `idle-burst`: `--sequential` chat streams one at a time, `--idle-s` of silence, then `--burst`
  streams at once;
* `suite`: `--suite` varied requests one at a time (streams and whole answers, one token to a
  long answer, prompts of a few to ~600 tokens, a bad parameter, streams the client closes after
  its first chunk or after 0.5 s, a whole answer it gives up on), then `--burst` streams at once.

Per gateway side it also prints the gateway's refusals by reason, its concurrency limit and its
queue overflows at the end of the scenario. Per side: 503 answers the client saw over the whole scenario (counted from the HTTP responses,
retries included) and their Retry-After values, unexpected failures, the burst's wall time (first send to last end) and its
TTFT p50 / max, and the burst's time over the engine alone's. Every stream asks for `--tokens`
tokens with ignore_eos, so all cost the same.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2  # the OpenAI SDK's own HTTP client
import openai

from bench.flow_engine import wait_idle
from devstack.cli import Parser
from devstack.procs import Proc
from devstack.stack import CPU_FLOW_ARGS, LocalStack, wait_http_ok

SIDES = {"engine": None, "defaults": [], "make-up": list(CPU_FLOW_ARGS)}
SHORT = "Write a story about a lighthouse."
LONG = " ".join(["The keeper climbed the stairs and looked at the sea."] * 50)  # ~600 tokens


@dataclass
class Tally:
    statuses: dict[int, int] = field(default_factory=dict)
    retry_after: list[str] = field(default_factory=list)
    failures: dict[str, int] = field(default_factory=dict)
    burst_s: float = 0.0
    ttft: list[float] = field(default_factory=list)

    async def on_response(self, r: httpx2.Response) -> None:
        self.statuses[r.status_code] = self.statuses.get(r.status_code, 0) + 1
        if r.status_code == 503:
            self.retry_after.append(r.headers.get("retry-after", "-"))

    def fail(self, what: str) -> None:
        self.failures[what] = self.failures.get(what, 0) + 1


class Clients:
    """One SDK client per target URL (the replicas themselves, or one gateway), used in turn."""

    def __init__(self, urls: list[str], tally: Tally) -> None:
        self._http = openai.DefaultAsyncHttpxClient(
            timeout=httpx2.Timeout(300.0), limits=httpx2.Limits(max_connections=None),
            event_hooks={"response": [tally.on_response]})
        self._sdk = [openai.AsyncOpenAI(base_url=u + "/v1", api_key="unused", max_retries=2,
                                        http_client=self._http) for u in urls]
        self._next = 0

    def next(self) -> openai.AsyncOpenAI:
        c = self._sdk[self._next % len(self._sdk)]
        self._next += 1
        return c

    async def close(self) -> None:
        await self._http.aclose()


async def stream(c: openai.AsyncOpenAI, model: str, tokens: int, tally: Tally,
                 prompt: str = SHORT, close_after: float | None = None,
                 first_only: bool = False) -> float | None:
    """One chat stream to its end (or closed early); its TTFT, None if it failed."""
    t0 = time.perf_counter()
    ttft = None
    try:
        s = await c.chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompt}], max_tokens=tokens,
            stream=True, extra_body={"ignore_eos": True})
        async for _ in s:
            if ttft is None:
                ttft = time.perf_counter() - t0
                if first_only:
                    break
            if close_after is not None and time.perf_counter() - t0 >= close_after:
                break
        await s.close()
    except openai.APIError as exc:
        tally.fail(type(exc).__name__)
    return ttft


async def whole(c: openai.AsyncOpenAI, model: str, tokens: int, tally: Tally,
                prompt: str = SHORT, timeout: float | None = None, **extra: Any) -> None:
    try:
        cc = c if timeout is None else c.with_options(timeout=timeout, max_retries=0)
        await cc.chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompt}], max_tokens=tokens,
            extra_body={"ignore_eos": True}, **extra)
    except openai.APITimeoutError:
        pass  # the client gave up, as meant
    except openai.BadRequestError:
        if "temperature" not in extra:
            tally.fail("BadRequestError")
    except openai.APIError as exc:
        tally.fail(type(exc).__name__)


def suite(model: str, tokens: int, n: int, tally: Tally) -> list[
        Callable[[openai.AsyncOpenAI], Awaitable[Any]]]:
    """`n` varied requests, as a test suite sends them one at a time."""
    kinds: list[Callable[[openai.AsyncOpenAI], Awaitable[Any]]] = [
        lambda c: stream(c, model, tokens, tally),
        lambda c: whole(c, model, 1, tally),
        lambda c: whole(c, model, 2, tally, prompt=LONG),
        lambda c: stream(c, model, 16, tally, prompt=LONG),
        lambda c: whole(c, model, 128, tally),
        lambda c: whole(c, model, 8, tally, temperature=-1.0),  # 400: a bad parameter
        lambda c: stream(c, model, 128, tally, first_only=True),  # closed after its first chunk
        lambda c: stream(c, model, 128, tally, close_after=0.5),
        lambda c: whole(c, model, 64, tally, prompt=LONG, timeout=0.3),  # the client gives up
        lambda c: stream(c, model, 1, tally, prompt="Hi"),
    ]
    return [kinds[i % len(kinds)] for i in range(n)]


async def burst(clients: Clients, model: str, tokens: int, n: int, tally: Tally) -> None:
    t0 = time.perf_counter()
    ttfts = await asyncio.gather(*(stream(clients.next(), model, tokens, tally)
                                   for _ in range(n)))
    tally.burst_s = time.perf_counter() - t0
    tally.ttft = [t for t in ttfts if t is not None]


async def scenario(name: str, urls: list[str], model: str, args: argparse.Namespace) -> Tally:
    tally = Tally()
    clients = Clients(urls, tally)
    try:
        if name == "idle-burst":
            for _ in range(args.sequential):
                await stream(clients.next(), model, args.tokens, tally)
            await asyncio.sleep(args.idle_s)
        else:
            for call in suite(model, args.tokens, args.suite, tally):
                await call(clients.next())
            await asyncio.sleep(1.0)
        await burst(clients, model, args.tokens, args.burst, tally)
    finally:
        await clients.close()
    return tally


def start_gateway(stack: LocalStack, port: int, extra: list[str], logs: Path, tag: str) -> Proc:
    import os
    import sys

    argv = [sys.executable, "-m", "gateway", "--host", "127.0.0.1", "--port", str(port),
            "--log-level", "warning"]
    for u in stack.worker_urls:
        argv += ["--backend", u]
    p = Proc(f"gateway-{tag}", argv + extra, dict(os.environ), logs / f"gateway-{tag}.log")
    wait_http_ok(f"http://127.0.0.1:{port}/ready", 60, [p])
    return p


def main() -> int:
    p = Parser(prog="python -m bench.real_traffic", description=__doc__)
    p.add_argument("--model-dir", type=Path, required=True, help="the demo model directory")
    p.add_argument("--workers", type=int, default=2, help="vLLM-CPU replicas (one core each)")
    p.add_argument("--scenarios", default="idle-burst,suite",
                   help="comma-separated subset of idle-burst,suite")
    p.add_argument("--sides", default="engine,defaults,make-up",
                   help="comma-separated subset of engine,defaults,make-up (in this order, per "
                        "scenario and round)")
    p.add_argument("--sequential", type=int, default=20,
                   help="idle-burst: streams one at a time before the silence")
    p.add_argument("--idle-s", type=float, default=15.0, help="idle-burst: the silence")
    p.add_argument("--suite", type=int, default=100, help="suite: varied requests one at a time")
    p.add_argument("--burst", type=int, default=32, help="streams sent at once at the end")
    p.add_argument("--tokens", type=int, default=64, help="tokens per stream of the burst")
    p.add_argument("--rounds", type=int, default=1, help="rounds of every scenario and side")
    args = p.parse_args()
    sides = args.sides.split(",")
    scenarios = args.scenarios.split(",")
    if not set(sides) <= set(SIDES) or not set(scenarios) <= {"idle-burst", "suite"}:
        p.fail("unknown side or scenario")
    logs = Path(tempfile.mkdtemp(prefix="real-traffic-"))
    stack = LocalStack(args.model_dir, workers=args.workers, worker_base_port=18201,
                       gateway_port=18299, log_dir=logs)
    model = args.model_dir.name
    ok = True
    try:
        stack.start_workers()
        stack.wait_workers(timeout_s=900)
        warm = Tally()
        asyncio.run(scenario_warmup(stack.worker_urls, model, warm))
        wait_idle(stack)
        for r in range(args.rounds):
            for sc in scenarios:
                alone_s = 0.0
                for side in sides:
                    gw = None
                    urls = stack.worker_urls
                    extra = SIDES[side]
                    if extra is not None:
                        gw = start_gateway(stack, 18300, extra, logs, f"{side}-{sc}-{r}")
                        urls = ["http://127.0.0.1:18300"]
                    try:
                        t = asyncio.run(scenario(sc, urls, model, args))
                        if gw is not None:
                            print(f"    {side} gateway: {flow_metrics(urls[0])}")
                    finally:
                        if gw is not None:
                            gw.stop()
                    wait_idle(stack)
                    if side == "engine":
                        alone_s = t.burst_s
                    refused = t.statuses.get(503, 0)
                    ratio = f"{t.burst_s / alone_s:.2f}x the engine alone" if alone_s else "-"
                    ttft = (f"TTFT p50 {statistics.median(t.ttft):.2f} s, max {max(t.ttft):.2f} s"
                            if t.ttft else "no first token")
                    print(f"round {r + 1} {sc:10s} {side:8s}: {len(t.ttft)}/{args.burst} streams, "
                          f"503 seen {refused} (Retry-After {t.retry_after or '-'}), failures "
                          f"{t.failures or 0}; burst {t.burst_s:.2f} s ({ratio}), {ttft}",
                          flush=True)
                    ok &= refused == 0 and not t.failures and len(t.ttft) == args.burst
                    if alone_s and side != "engine":
                        ok &= t.burst_s <= 1.2 * alone_s
    finally:
        stack.stop()
    print("all bursts served whole, none refused, within 1.2x the engine alone" if ok else
          "NOT MET: a refusal, a failure, or a burst over 1.2x the engine alone")
    return 0 if ok else 1


def flow_metrics(url: str) -> str:
    """The gateway's refusals by reason and its concurrency limit now: why a 503 was sent."""
    import urllib.request

    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        lines = r.read().decode().splitlines()
    keep = ("llmserve_rejections_total{", "llmserve_concurrency_limit{",
            "llmserve_queue_overflows_total{")
    return "; ".join(line for line in lines if line.startswith(keep)) or "no flow metrics"


async def scenario_warmup(urls: list[str], model: str, tally: Tally) -> None:
    """A few streams on each replica: the first requests after start-up pay for warm-up."""
    clients = Clients(urls, tally)
    try:
        await asyncio.gather(*(stream(clients.next(), model, 16, tally)
                               for _ in range(4 * len(urls))))
    finally:
        await clients.close()


if __name__ == "__main__":
    raise SystemExit(main())
