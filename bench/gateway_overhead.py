"""Gateway overhead: the same load direct to a near-free upstream and through the gateway.

A near-free upstream (bench/fake_upstream.py) serves `--tokens`-token streamed chat answers. The
gateway gets CPU 0 alone; the upstream and the load clients share CPU 1. Per path and round:
streamed requests/s at `--concurrency` connections (wrk, or bench/load.py where wrk is missing),
TTFT at concurrency 1 (send -> first `data:` event, `--latency-requests` requests) and the p50 of
whole non-streamed completions at concurrency 1. Direct and gateway rounds alternate
(`--repeats`) and medians are reported: the machine is noisy, so only ratios within one run
compare. At the end, the upstream connections each gateway opened per 1,000 requests (near 0
when keep-alive works, ~1,000 when every stream's connection is dropped).

    python -m bench.gateway_overhead [--duration 8] [--repeats 3]

`--flow` measures the gateway with flow control and batching off, with the batcher only, and with
everything on (API-key auth, per-key buckets, adaptive limit and fair queue, batcher, with limits
high enough that nothing is refused), with an API key on every request; then the time to a 503
while a pool is full (a gateway with one slot and no queue, the slot held by a slow stream).
`--redis-url` adds flow-on with the per-key limits shared in that Redis, `--least-outstanding`
flow-on with that routing policy (use `--prompt-bytes 3000`: prefix_affinity hashes nothing
under 512 bytes).

`--also NAME=FLAGS` adds a gateway with extra flags. `--gateway-from LABEL=DIR` adds the same
gateway(s) from another checkout, run with DIR as the working directory: `python -m` puts it
first on sys.path, ahead of PYTHONPATH.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

from bench.load import latency, pct, throughput
from bench.procs import start, stop_all, wait_ok
from devstack.cli import Parser
from devstack.procs import free_port

KEY = "sk-bench-overhead"

_WRK_LUA = """
wrk.method = "POST"
wrk.body   = '{"model":"demo","stream":true,"max_tokens":%d,"messages":[{"role":"user","content":"%s"}]}'
wrk.headers["Content-Type"] = "application/json"
"""


def prompt_text(n_bytes: int) -> str:
    """A user message of about n_bytes (plain ASCII words; "hi" when 0): routing by prefix
    hashes nothing under one 512-byte chunk, so its cost shows only with a real prompt's length."""
    if n_bytes <= 0:
        return "hi"
    sentence = "the gateway routes each turn of a chat to the replica holding its prefix. "
    return (sentence * (n_bytes // len(sentence) + 1))[:n_bytes]


def wrk_rps(url: str, tokens: int, concurrency: int, duration_s: float,
            headers: dict[str, str] | None = None, prompt: str = "hi") -> float:
    """Streamed requests/s measured by wrk (C): it leaves the shared core to the upstream."""
    lua = _WRK_LUA % (tokens, prompt) + "".join(
        f'wrk.headers["{k}"] = "{v}"\n' for k, v in (headers or {}).items())
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as fh:
        fh.write(lua)
    out = subprocess.run(
        ["taskset", "-c", "1", "wrk", "-t1", f"-c{concurrency}", f"-d{duration_s:g}s", "-s",
         fh.name, url + "/v1/chat/completions"], capture_output=True, text=True, check=True,
    ).stdout
    os.unlink(fh.name)
    if "Non-2xx" in out or "Socket errors" in out:
        print(out, file=sys.stderr)
    return float(out.split("Requests/sec:")[1].split()[0])


def _post(url: str, path: str, body: dict[str, object], headers: dict[str, str]) -> bytes:
    u = urlparse(url)
    data = json.dumps(body).encode()
    extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return (f"POST {path} HTTP/1.1\r\nhost: {u.hostname}:{u.port}\r\n{extra}"
            f"content-type: application/json\r\ncontent-length: {len(data)}\r\n\r\n"
            ).encode() + data


async def _timed(url: str, raw: bytes, count: int, expect: bytes,
                 header: bytes = b"") -> list[float]:
    """Send `raw` `count` (+20 unmeasured) times on one connection; each answer must start with
    `expect`, carry the (lower-case) `header` if given, and have a Content-Length."""
    u = urlparse(url)
    r, w = await asyncio.open_connection(u.hostname, u.port)
    out: list[float] = []
    try:
        for i in range(count + 20):
            t0 = time.perf_counter()
            w.write(raw)
            head = await r.readuntil(b"\r\n\r\n")
            if not head.startswith(expect) or header not in head.lower():
                raise RuntimeError(f"{url}: expected {expect!r} with {header!r}, "
                                   f"got {head[:60]!r}")
            n = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            await r.readexactly(n)
            if i >= 20:  # the first ones warm the connection pools up
                out.append(time.perf_counter() - t0)
    finally:
        w.close()
    return out


async def completion_latency(url: str, count: int, headers: dict[str, str]) -> list[float]:
    """Whole non-streaming /v1/completions answers at concurrency 1 (the batcher's case)."""
    raw = _post(url, "/v1/completions", {"model": "demo", "prompt": "hi", "max_tokens": 16},
                headers)
    return await _timed(url, raw, count, b"HTTP/1.1 200")


async def refusal_latency(url: str, count: int, headers: dict[str, str]) -> list[float]:
    """Time to a 503 while the pool is full: one stream holds the only slot (limit 1, no queue)."""
    u = urlparse(url)
    raw = _post(url, "/v1/completions",
                {"model": "demo", "prompt": "hi", "max_tokens": 16, "stream": True}, headers)
    hr, hw = await asyncio.open_connection(u.hostname, u.port)
    hw.write(raw)  # the holder: a slow stream (the upstream sleeps before each event)
    await hr.readuntil(b"\r\n\r\n")
    try:
        out = await _timed(url, raw, count, b"HTTP/1.1 503", b"retry-after:")
    finally:
        hw.close()
    return out


def gateway_counts(url: str) -> tuple[float, float]:
    """(upstream connections opened, proxied requests) from a gateway's /metrics."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    opened = served = 0.0
    for line in text.splitlines():
        if line.startswith("llmserve_upstream_connections_opened_total "):
            opened = float(line.rsplit(" ", 1)[1])
        elif line.startswith("llmserve_requests_total{"):
            served += float(line.rsplit(" ", 1)[1])
    return opened, served


def variants(args: argparse.Namespace, keys: Path) -> dict[str, str]:
    """The gateways to measure: name -> extra flags."""
    flow_on = (f"--api-keys-file {keys} --flow.enabled --batch.enabled "
               "--flow.max-limit 4096 --flow.initial-limit 1024")
    out = {"gateway": ""}
    if args.flow:
        out = {"flow-off": "--no-flow.enabled --no-batch.enabled",
               "batch-only": "--no-flow.enabled --batch.enabled",
               "flow-on": flow_on}
    if args.least_outstanding:
        out["flow-on+least-out"] = flow_on + " --routing-policy least_outstanding"
    if args.redis_url:
        out["flow-on+redis"] = flow_on + f" --flow.limits-redis-url {args.redis_url}"
    for extra in args.also:
        name, _, flags = extra.partition("=")
        out[name] = flags
    return out


def main() -> int:
    p = Parser(prog="python -m bench.gateway_overhead", description=__doc__)
    p.add_argument("--gateway-cmd", default=(
        f"{sys.executable} -m gateway --host 127.0.0.1 --port {{port}} --backend {{upstream}} "
        "--log-level warning"),
        help="command that starts the proxy under test ({port}, {upstream} are filled in)")
    p.add_argument("--duration", type=float, default=8.0, help="seconds per throughput phase")
    p.add_argument("--repeats", type=int, default=3, help="alternating direct/gateway rounds")
    p.add_argument("--concurrency", type=int, default=32, help="streams in flight, throughput")
    p.add_argument("--tokens", type=int, default=64, help="tokens per stream")
    p.add_argument("--latency-requests", type=int, default=400,
                   help="requests, one at a time, per latency phase")
    p.add_argument("--also", action="append", default=[], metavar="NAME=EXTRA_ARGS",
                   help="another gateway to measure, e.g. rr='--routing-policy round_robin'")
    p.add_argument("--flow", action="store_true",
                   help="measure flow control off, batcher only and fully on (see above)")
    p.add_argument("--redis-url", default=None,
                   help="also flow-on with the per-key limits shared in this Redis "
                        "(redis://127.0.0.1:6379/0): one round trip per request")
    p.add_argument("--least-outstanding", action="store_true",
                   help="also flow-on with the least_outstanding routing policy")
    p.add_argument("--prompt-bytes", type=int, default=0,
                   help="user message length in bytes; 0: 'hi'")
    p.add_argument("--end-delay-s", type=float, default=0.0,
                   help="the fake upstream sends each stream's chunked terminator this long after "
                        "[DONE], as its own write (keep-alive under test: see the connections "
                        "per 1,000 requests printed at the end)")
    p.add_argument("--gateway-from", action="append", default=[], metavar="LABEL=DIR",
                   help="also measure this checkout's gateway(s)")
    args = p.parse_args()
    if (os.cpu_count() or 1) < 2:
        p.exit(2, "needs 2 CPUs: the gateway is pinned to CPU 0, upstream and client to CPU 1\n")
    args.flow = args.flow or bool(args.redis_url) or args.least_outstanding
    prompt = prompt_text(args.prompt_bytes)
    headers = {"Authorization": f"Bearer {KEY}"} if args.flow else {}

    import uvloop

    uvloop.install()
    os.sched_setaffinity(0, {1})
    tmp = Path(tempfile.mkdtemp(prefix="gateway-overhead-"))
    keys = tmp / "keys.json"
    keys.write_text(json.dumps({"keys": [{
        "tenant": "bench", "sha256": hashlib.sha256(KEY.encode()).hexdigest(),
        "rpm": 1e9, "tpm": 1e12}]}))
    up_port = free_port()
    upstream = f"http://127.0.0.1:{up_port}"
    gateways = variants(args, keys)
    where: dict[str, str | None] = dict.fromkeys(gateways)
    for extra in args.gateway_from:
        label, _, path = extra.partition("=")
        for name in [n for n in ("gateway", "flow-off", "flow-on") if n in gateways]:
            gateways[f"{label}:{name}"] = gateways[name]
            where[f"{label}:{name}"] = path
    procs = [start(f"{sys.executable} -m bench.fake_upstream --port {up_port} "
                   f"--tokens {args.tokens} --end-delay-s {args.end_delay_s}", "1")]
    try:
        wait_ok(upstream + "/health")
        targets = [("direct", upstream)]
        for name, flags in gateways.items():
            port = free_port()
            procs.append(start(args.gateway_cmd.format(port=port, upstream=upstream) + " "
                               + flags, "0", where[name]))
            targets.append((name, f"http://127.0.0.1:{port}"))
            wait_ok(targets[-1][1] + "/ready")
        time.sleep(0.5)
        use_wrk = shutil.which("wrk") is not None
        rows: dict[str, dict[str, list[float]]] = {
            n: {"rps": [], "p50": [], "p99": [], "c50": []} for n, _ in targets}
        for r in range(args.repeats):
            for name, url in targets:
                if use_wrk:
                    rps = wrk_rps(url, args.tokens, args.concurrency, args.duration, headers,
                                  prompt)
                else:
                    rps = asyncio.run(throughput(url, "demo", args.tokens, args.concurrency,
                                                 args.duration, headers, prompt)).rps
                lat = asyncio.run(latency(url, "demo", args.tokens, args.latency_requests,
                                          headers, prompt))
                if lat.errors:
                    print(f"{name}: {lat.errors} errors", file=sys.stderr)
                whole = asyncio.run(completion_latency(url, args.latency_requests, headers))
                rows[name]["rps"].append(rps)
                rows[name]["p50"].append(lat.p50 * 1e3)
                rows[name]["p99"].append(lat.pct(0.99) * 1e3)
                rows[name]["c50"].append(statistics.median(whole) * 1e3)
                print(f"round {r + 1} {name:9s} {rps:8.0f} req/s  TTFT p50 "
                      f"{lat.p50 * 1e3:6.3f} ms  p99 {lat.pct(0.99) * 1e3:6.3f} ms  "
                      f"completion p50 {statistics.median(whole) * 1e3:6.3f} ms", flush=True)
        if args.flow:
            refusals(args, keys, headers, procs)
        med = {n: {k: statistics.median(v) for k, v in c.items()} for n, c in rows.items()}
        d = med["direct"]
        print(f"\nmedian of {args.repeats} rounds, {args.tokens}-token streams, "
              f"{args.concurrency} concurrent for throughput "
              f"({'wrk' if use_wrk else 'bench/load.py'}), 1 for TTFT")
        print(f"| path | streamed req/s @{args.concurrency} | TTFT p50 (ms) | added TTFT p50 (ms) "
              "| TTFT p99 (ms) | non-streamed completion p50 (ms) |")
        print("|---|---|---|---|---|---|")
        for n, _ in targets:
            g = med[n]
            print(f"| {n} | {g['rps']:.0f} | {g['p50']:.3f} | {g['p50'] - d['p50']:+.3f} | "
                  f"{g['p99']:.3f} | {g['c50']:.3f} |")
        for n, url in targets[1:]:
            g = med[n]
            opened, served = gateway_counts(url)
            print(f"{n}: {g['rps'] / d['rps']:.2f}x direct's streamed req/s; added TTFT p50 "
                  f"{g['p50'] - d['p50']:+.3f} ms, p99 {g['p99'] - d['p99']:+.3f} ms; "
                  f"{1000 * opened / max(served, 1):.2f} upstream connections opened per 1,000 "
                  f"requests ({opened:.0f} for {served:.0f})")
    finally:
        stop_all(procs)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def refusals(args: argparse.Namespace, keys: Path, headers: dict[str, str],
             procs: list[subprocess.Popen[bytes]]) -> None:
    """A slow upstream behind a gateway with one slot and no queue: time each 503. The processes
    it starts go into `procs`, for the caller to stop."""
    slow_port, tight_port = free_port(), free_port()
    procs.append(start(f"{sys.executable} -m bench.fake_upstream --port {slow_port} "
                       "--tokens 16 --token-delay-s 5", "1"))
    wait_ok(f"http://127.0.0.1:{slow_port}/health")
    procs.append(start(
        args.gateway_cmd.format(port=tight_port, upstream=f"http://127.0.0.1:{slow_port}")
        + f" --api-keys-file {keys} --flow.initial-limit 1 --flow.min-limit 1 "
        "--flow.max-limit 1 --flow.max-queue 0 --no-flow.scrape-engines", "0"))
    tight = f"http://127.0.0.1:{tight_port}"
    wait_ok(tight + "/ready")
    times = asyncio.run(refusal_latency(tight, args.latency_requests, headers))
    print(f"503 while full (concurrency 1, {len(times)} requests): p50 "
          f"{statistics.median(times) * 1e3:.3f} ms, p99 {pct(times, 0.99) * 1e3:.3f} ms, "
          f"max {max(times) * 1e3:.3f} ms", flush=True)


if __name__ == "__main__":
    sys.exit(main())
