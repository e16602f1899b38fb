"""Gateway overhead with flow control off and fully on (API-key auth, per-key buckets, adaptive
limit + fair queue, batcher), against the same near-free upstream, in one run.

Same method as bench/gateway_overhead.py (gateway pinned to CPU 0; upstream, wrk and the latency
client on CPU 1; rounds alternate; medians), plus an `Authorization` header on every request so
the auth path is really taken. Limits are set high enough that nothing is refused.

    python -m bench.flow_overhead [--duration 6] [--repeats 3] [--redis-url redis://...]
        [--gateway-from main=DIR]

`--gateway-from LABEL=DIR` also measures another checkout's gateway (flow off and flow on, in the
same alternating rounds), run with DIR as its working directory: `python -m` puts the working
directory first on sys.path, ahead of PYTHONPATH.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlparse

from bench.gateway_overhead import free_port, prompt_text, start, stop_all, wait_ok, wrk_rps
from bench.load import Conn, Result

KEY = "sk-bench-overhead"
def request_bytes(url: str, tokens: int, prompt: str = "hi") -> bytes:
    u = urlparse(url)
    body = json.dumps({"model": "demo", "stream": True, "max_tokens": tokens,
                       "messages": [{"role": "user", "content": prompt}]}).encode()
    return (f"POST /v1/chat/completions HTTP/1.1\r\nhost: {u.hostname}:{u.port}\r\n"
            f"authorization: Bearer {KEY}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode() + body


async def completion_latency(url: str, count: int) -> list[float]:
    """Whole non-streaming /v1/completions answers at concurrency 1 (the batcher's case)."""
    u = urlparse(url)
    body = json.dumps({"model": "demo", "prompt": "hi", "max_tokens": 16}).encode()
    raw = (f"POST /v1/completions HTTP/1.1\r\nhost: {u.hostname}:{u.port}\r\n"
           f"authorization: Bearer {KEY}\r\ncontent-type: application/json\r\n"
           f"content-length: {len(body)}\r\n\r\n").encode() + body
    r, w = await asyncio.open_connection(u.hostname, u.port)
    out: list[float] = []
    for i in range(count + 20):
        t0 = time.perf_counter()
        w.write(raw)
        head = await r.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"{url}: {head[:40]!r}")
        n = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        await r.readexactly(n)
        if i >= 20:  # the first ones warm the connection pools up
            out.append(time.perf_counter() - t0)
    w.close()
    return out


async def rejection_latency(url: str, count: int) -> list[float]:
    """Time to a 503 while the pool is full: one stream holds the only slot (limit 1, no queue)."""
    u = urlparse(url)
    host, port = u.hostname or "127.0.0.1", u.port or 80
    body = json.dumps({"model": "demo", "prompt": "hi", "max_tokens": 16, "stream": True}).encode()
    raw = (f"POST /v1/completions HTTP/1.1\r\nhost: {host}:{port}\r\n"
           f"authorization: Bearer {KEY}\r\ncontent-type: application/json\r\n"
           f"content-length: {len(body)}\r\n\r\n").encode() + body
    hr, hw = await asyncio.open_connection(host, port)
    hw.write(raw)  # the holder: a slow stream (the upstream sleeps before each event)
    await hr.readuntil(b"\r\n\r\n")
    r, w = await asyncio.open_connection(host, port)
    out: list[float] = []
    for i in range(count + 20):
        t0 = time.perf_counter()
        w.write(raw)
        head = await r.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 503") or b"retry-after" not in head.lower():
            raise RuntimeError(f"expected a 503 with Retry-After, got {head[:60]!r}")
        n = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        await r.readexactly(n)
        if i >= 20:
            out.append(time.perf_counter() - t0)
    w.close()
    hw.close()
    return out


async def latency(url: str, tokens: int, count: int, prompt: str = "hi") -> Result:
    u = urlparse(url)
    raw = request_bytes(url, tokens, prompt)
    c = Conn(u.hostname or "127.0.0.1", u.port or 80)
    res = Result()
    for _ in range(20):
        await c.request(raw)
    for _ in range(count):
        if await c.request(raw, res.ttft):
            res.ok += 1
        else:
            res.errors += 1
    c.close()
    return res


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.flow_overhead", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=6.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--latency-requests", type=int, default=400)
    p.add_argument("--end-delay-s", type=float, default=0.0,
                   help="the fake upstream sends each stream's chunked terminator this long after "
                        "[DONE], as its own write (keep-alive under test: see the connections "
                        "per 1,000 requests printed at the end)")
    p.add_argument("--redis-url", default=None,
                   help="also measure flow-on with the per-key limits shared in this Redis "
                        "(redis://127.0.0.1:6379/0): one round trip per request")
    p.add_argument("--gateway-from", action="append", default=[], metavar="LABEL=DIR",
                   help="also measure this checkout's gateway (flow-off, flow-on)")
    p.add_argument("--least-outstanding", action="store_true",
                   help="also measure flow-on with the least_outstanding routing policy (the "
                        "default before prefix_affinity); use with --prompt-bytes 3000, since "
                        "prefix_affinity hashes nothing under one 512-byte chunk")
    p.add_argument("--prompt-bytes", type=int, default=0,
                   help="user message length in bytes (default: 'hi')")
    args = p.parse_args()
    prompt = prompt_text(args.prompt_bytes)
    import uvloop

    uvloop.install()
    os.sched_setaffinity(0, {1})
    tmp = Path(tempfile.mkdtemp())
    keys = tmp / "keys.json"
    import hashlib

    keys.write_text(json.dumps({"keys": [{
        "tenant": "bench", "sha256": hashlib.sha256(KEY.encode()).hexdigest(),
        "rpm": 1e9, "tpm": 1e12}]}))
    up_port = free_port()
    upstream = f"http://127.0.0.1:{up_port}"
    base = (f"{sys.executable} -m gateway --host 127.0.0.1 --port {{port}} --backend {upstream} "
            "--log-level warning ")
    variants = {
        "flow-off": "--no-flow.enabled --no-batch.enabled",
        "batch-only": "--no-flow.enabled --batch.enabled",
        "flow-on": f"--api-keys-file {keys} --flow.enabled --batch.enabled "
                   "--flow.max-limit 4096 --flow.initial-limit 1024",
    }
    if args.least_outstanding:
        variants["flow-on+least-out"] = (variants["flow-on"]
                                         + " --routing-policy least_outstanding")
    if args.redis_url:
        variants["flow-on+redis"] = variants["flow-on"] + f" --flow.limits-redis-url {args.redis_url}"
    where: dict[str, str | None] = dict.fromkeys(variants)
    for extra in args.gateway_from:
        label, _, path = extra.partition("=")
        for name in ("flow-off", "flow-on"):
            variants[f"{label}:{name}"] = variants[name]
            where[f"{label}:{name}"] = path
    procs = [start(f"{sys.executable} -m bench.fake_upstream --port {up_port} "
                   f"--tokens {args.tokens} --end-delay-s {args.end_delay_s}", "1")]
    try:
        wait_ok(upstream + "/health")
        targets = [("direct", upstream)]
        for name, extra in variants.items():
            port = free_port()
            procs.append(start(base.format(port=port) + extra, "0", where[name]))
            targets.append((name, f"http://127.0.0.1:{port}"))
            wait_ok(targets[-1][1] + "/ready")
        time.sleep(0.5)
        rows: dict[str, dict[str, list[float]]] = {
            n: {"rps": [], "p50": [], "p99": [], "c50": []} for n, _ in targets}
        for r in range(args.repeats):
            for name, url in targets:
                rps = wrk_rps(url, args.tokens, args.concurrency, args.duration,
                              {"Authorization": f"Bearer {KEY}"}, prompt)
                lat = asyncio.run(latency(url, args.tokens, args.latency_requests, prompt))
                if lat.errors:
                    print(f"{name}: {lat.errors} errors", file=sys.stderr)
                rows[name]["rps"].append(rps)
                rows[name]["p50"].append(lat.p50 * 1e3)
                rows[name]["p99"].append(lat.pct(0.99) * 1e3)
                whole = asyncio.run(completion_latency(url, args.latency_requests))
                rows[name]["c50"].append(statistics.median(whole) * 1e3)
                print(f"round {r + 1} {name:9s} {rps:8.0f} req/s  TTFT p50 "
                      f"{lat.p50 * 1e3:6.3f} ms  p99 {lat.pct(0.99) * 1e3:6.3f} ms  "
                      f"completion p50 {statistics.median(whole) * 1e3:6.3f} ms", flush=True)
        # Refusals: a second upstream streams slowly, behind a gateway with one slot and no queue.
        slow_port, tight_port = free_port(), free_port()
        procs.append(start(f"{sys.executable} -m bench.fake_upstream --port {slow_port} "
                           "--tokens 16 --token-delay-s 5", "1"))
        wait_ok(f"http://127.0.0.1:{slow_port}/health")
        procs.append(start(
            base.replace(upstream, f"http://127.0.0.1:{slow_port}").format(port=tight_port)
            + f"--api-keys-file {keys} --flow.initial-limit 1 --flow.min-limit 1 "
            "--flow.max-limit 1 --flow.max-queue 0 --no-flow.scrape-engines", "0"))
        tight = f"http://127.0.0.1:{tight_port}"
        wait_ok(tight + "/ready")
        refusals = asyncio.run(rejection_latency(tight, args.latency_requests))
        refusals.sort()
        print(f"503 while full (concurrency 1, {len(refusals)} requests): p50 "
              f"{statistics.median(refusals) * 1e3:.3f} ms, p99 "
              f"{refusals[int(0.99 * len(refusals))] * 1e3:.3f} ms, max {refusals[-1] * 1e3:.3f} ms")
        med = {n: {k: statistics.median(v) for k, v in c.items()} for n, c in rows.items()}
        d = med["direct"]
        print(f"\nmedian of {args.repeats} rounds, {args.tokens}-token streams, "
              f"{args.concurrency} concurrent (wrk) for throughput, 1 for TTFT")
        print("| path | streamed req/s | TTFT p50 (ms) | added TTFT p50 (ms) | TTFT p99 (ms) | "
              "non-streamed completion p50 (ms) |")
        print("|---|---|---|---|---|---|")
        for n, _ in targets:
            g = med[n]
            print(f"| {n} | {g['rps']:.0f} | {g['p50']:.3f} | {g['p50'] - d['p50']:+.3f} | "
                  f"{g['p99']:.3f} | {g['c50']:.3f} |")
        # Keep-alive at work: connections opened to the upstream per 1,000 proxied requests
        # (probes included; near zero when connections are reused, ~1,000 when each is aborted).
        for n, url in targets[1:]:
            opened, served = gateway_counts(url)
            print(f"{n}: {opened:.0f} upstream connections opened for {served:.0f} requests = "
                  f"{1000 * opened / max(served, 1):.2f} per 1,000")
    finally:
        stop_all(procs)
    return 0


def gateway_counts(url: str) -> tuple[float, float]:
    """(upstream connections opened, proxied requests) from a gateway's /metrics."""
    import urllib.request

    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    opened = served = 0.0
    for line in text.splitlines():
        if line.startswith("llmserve_upstream_connections_opened_total "):
            opened = float(line.rsplit(" ", 1)[1])
        elif line.startswith("llmserve_requests_total{"):
            served += float(line.rsplit(" ", 1)[1])
    return opened, served


if __name__ == "__main__":
    sys.exit(main())
