"""Gateway overhead benchmark: the same load, direct to a near-free upstream and through the gateway.

Pinning (2 cores): the gateway gets CPU 0 alone; the fake upstream and this load client share
CPU 1. Direct and gateway runs alternate (`--repeats`) and medians are reported, because the
machine is noisy; the ratio is only meaningful side by side in one run.

    python -m bench.gateway_overhead [--duration 8] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from bench.load import latency, throughput

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
    import tempfile

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ok(url: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise TimeoutError(url)


def start(cmd: str, cpu: str, cwd: str | None = None,
          stderr: Path | None = None) -> subprocess.Popen[bytes]:
    """`cmd` pinned to `cpu`, in a session of its own; its stderr to the file `stderr` if given
    (read it when the process does not come up), else dropped."""
    err = stderr.open("wb") if stderr is not None else subprocess.DEVNULL
    try:
        return subprocess.Popen(["taskset", "-c", cpu, *shlex.split(cmd)],
                                stdout=subprocess.DEVNULL, stderr=err,
                                start_new_session=True, cwd=cwd)
    finally:
        if stderr is not None:
            err.close()  # type: ignore[union-attr]  # the child holds its own copy


def stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM each process group started by `start`, then reap it."""
    for proc in procs:
        try:
            os.killpg(proc.pid, 15)
        except ProcessLookupError:
            pass
        proc.wait(10)


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gateway_overhead", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gateway-cmd", default=(
        f"{sys.executable} -m gateway --host 127.0.0.1 --port {{port}} --backend {{upstream}} "
        "--log-level warning"),
        help="command that starts the proxy under test ({port}, {upstream} are filled in)")
    p.add_argument("--duration", type=float, default=8.0, help="seconds per throughput phase")
    p.add_argument("--repeats", type=int, default=3, help="alternating direct/gateway rounds")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--latency-requests", type=int, default=400)
    p.add_argument("--also", action="append", default=[], metavar="NAME=EXTRA_ARGS",
                   help="another gateway to measure, e.g. aiohttp='--transport aiohttp'")
    args = p.parse_args()
    if (os.cpu_count() or 1) < 2:
        p.exit(2, "needs 2 CPUs: the gateway is pinned to CPU 0, upstream and client to CPU 1\n")

    import uvloop
    uvloop.install()
    os.sched_setaffinity(0, {1})
    up_port, gw_port = free_port(), free_port()
    upstream = f"http://127.0.0.1:{up_port}"
    gateway = f"http://127.0.0.1:{gw_port}"
    procs = [start(f"{sys.executable} -m bench.fake_upstream --port {up_port} "
                   f"--tokens {args.tokens}", "1")]
    try:
        wait_ok(upstream + "/health")
        targets = [("direct", upstream, ""), ("gateway", gateway, "")]
        for extra in args.also:
            name, _, more = extra.partition("=")
            targets.append((name, f"http://127.0.0.1:{free_port()}", more))
        for name, url, more in targets[1:]:
            port = url.rsplit(":", 1)[1]
            procs.append(start(args.gateway_cmd.format(port=port, upstream=upstream) + " " + more,
                               "0"))
            wait_ok(url + "/ready")
        use_wrk = shutil.which("wrk") is not None
        rows = {name: {"rps": [], "p50": [], "p99": []} for name, _, _ in targets}
        for r in range(args.repeats):
            for name, url, _ in targets:
                if use_wrk:
                    rps = wrk_rps(url, args.tokens, args.concurrency, args.duration)
                else:
                    t = asyncio.run(throughput(url, "demo", args.tokens, args.concurrency,
                                               args.duration))
                    rps = t.rps
                lat = asyncio.run(latency(url, "demo", args.tokens, args.latency_requests))
                if lat.errors:
                    print(f"{name}: {lat.errors} errors", file=sys.stderr)
                rows[name]["rps"].append(rps)
                rows[name]["p50"].append(lat.p50 * 1e3)
                rows[name]["p99"].append(lat.pct(0.99) * 1e3)
                print(f"round {r + 1} {name:8s} {rps:8.0f} req/s  "
                      f"TTFT p50 {lat.p50 * 1e3:6.3f} ms  p99 {lat.pct(0.99) * 1e3:6.3f} ms",
                      flush=True)
        med = {n: {k: statistics.median(v) for k, v in cols.items()} for n, cols in rows.items()}
        d = med["direct"]
        print(f"\nmedian of {args.repeats} rounds, {args.tokens}-token streams, "
              f"{args.concurrency} concurrent for throughput, 1 for TTFT")
        print(f"| path | streamed req/s @{args.concurrency} | TTFT p50 (ms) | TTFT p99 (ms) |")
        print("|---|---|---|---|")
        for n, _, _ in targets:
            print(f"| {n} | {med[n]['rps']:.0f} | {med[n]['p50']:.3f} | {med[n]['p99']:.3f} |")
        print(f"(throughput measured with {'wrk' if use_wrk else 'bench/load.py'})")
        for n, _, _ in targets[1:]:
            g = med[n]
            print(f"{n}: {g['rps']:.0f} streamed req/s ({g['rps'] / d['rps']:.2f}x direct); "
                  f"added TTFT p50 {g['p50'] - d['p50']:+.3f} ms, p99 {g['p99'] - d['p99']:+.3f} ms")
    finally:
        stop_all(procs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
