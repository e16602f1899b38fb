"""The cost of EPP mode, side by side in one run: the same streamed load through llmserve's own
gateway, through a real Envoy with llmserve as its endpoint picker (ext_proc, bodies
FULL_DUPLEX_STREAMED, ORIGINAL_DST), and through Envoy alone (round robin, no picker).

A near-free upstream (bench/fake_upstream.py, two of them as two replicas) serves `--tokens`-token
streamed chat answers on CPU 1 with the load client; the path under test gets CPU 0 (the gateway;
or Envoy and the EPP together; or Envoy). Per path and round: TTFT (send -> first `data:` event)
p50 and p99 at concurrency 1 over `--latency-requests` requests, and the CPU seconds the path's
processes spent per streamed request at `--concurrency` connections for `--duration` seconds.
Paths alternate within each round (`--repeats`); medians are reported, with ratios to the
gateway: only ratios within one run compare on a noisy machine.

    python -m bench.epp_cost [--duration 6] [--repeats 3] [--tokens 64]
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from bench.envoy import Envoy
from bench.load import latency, throughput
from bench.procs import cpu_seconds, start, stop_all, wait_ok
from devstack.cli import Parser
from devstack.procs import free_port

PATHS = ("gateway", "envoy+epp", "envoy")


class Path_:
    """One path under test: its URL and the pids whose CPU counts."""

    def __init__(self, url: str, pids: list[int], stop: Callable[[], None]) -> None:
        self.url = url
        self.pids = pids
        self.stop = stop

    def cpu(self) -> float:
        return sum(cpu_seconds(p) for p in self.pids)


def start_path(name: str, upstreams: list[str], logs: Path) -> Path_:
    py = sys.executable
    backends = " ".join(f"--backend {u}" for u in upstreams)
    if name == "gateway":
        port = free_port()
        proc = start(f"{py} -m gateway --host 127.0.0.1 --port {port} {backends} "
                     "--log-level warning", "0", stderr=logs / "gateway.log")
        url = f"http://127.0.0.1:{port}"
        wait_ok(url + "/ready")
        return Path_(url, [proc.pid], lambda: stop_all([proc]))
    endpoints = tuple(u.split("://", 1)[1] for u in upstreams)
    if name == "envoy":
        envoy = Envoy(variant="round_robin", endpoints=endpoints, cpus="0", log_dir=logs)
        envoy.start()
        assert envoy.proc is not None
        return Path_(envoy.url, [envoy.proc.pid], envoy.stop)
    epp_port = free_port()
    epp = start(f"{py} -m gateway epp --host 127.0.0.1 --epp.port {epp_port} "
                f"--epp.metrics-port {free_port()} {backends} --log-level warning", "0",
                stderr=logs / "epp.log")
    envoy = Envoy(epp_port=epp_port, cpus="0", log_dir=logs)
    envoy.start()
    assert envoy.proc is not None
    # Ready once the EPP picks: a request through Envoy answers 200.
    wait_ok(envoy.url + "/v1/models")

    def stop() -> None:
        envoy.stop()
        stop_all([epp])

    return Path_(envoy.url, [envoy.proc.pid, epp.pid], stop)


def main() -> int:
    p = Parser(prog="python -m bench.epp_cost", description=__doc__)
    p.add_argument("--tokens", type=int, default=64, help="tokens per answer (default 64)")
    p.add_argument("--concurrency", type=int, default=16,
                   help="connections for the CPU phase (default 16)")
    p.add_argument("--duration", type=float, default=6.0,
                   help="seconds of the CPU phase per path and round (default 6)")
    p.add_argument("--latency-requests", type=int, default=300,
                   help="TTFT samples per path and round, one at a time (default 300)")
    p.add_argument("--repeats", type=int, default=3, help="rounds of all paths (default 3)")
    args = p.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="epp-cost-"))
    ups = []
    for i in range(2):
        port = free_port()
        ups.append(start(f"{sys.executable} -m bench.fake_upstream --port {port} "
                         f"--tokens {args.tokens}", "1", stderr=logs / f"upstream{i}.log"))
        wait_ok(f"http://127.0.0.1:{port}/health")
    upstream_urls = [f"http://127.0.0.1:{port_of(u)}" for u in ups]
    results: dict[str, dict[str, list[float]]] = {n: {"p50": [], "p99": [], "cpu": [], "rps": []}
                                                  for n in PATHS}
    try:
        paths = {n: start_path(n, upstream_urls, logs) for n in PATHS}
        try:
            for rnd in range(args.repeats):
                for name in PATHS:
                    path = paths[name]
                    lat = asyncio.run(latency(path.url, "demo", args.tokens,
                                              args.latency_requests))
                    before = path.cpu()
                    load = asyncio.run(throughput(path.url, "demo", args.tokens,
                                                  args.concurrency, args.duration))
                    spent = path.cpu() - before
                    r = results[name]
                    r["p50"].append(lat.p50 * 1000)
                    r["p99"].append(lat.pct(0.99) * 1000)
                    r["cpu"].append(spent / max(load.ok, 1) * 1000)
                    r["rps"].append(load.rps)
                    print(f"round {rnd + 1} {name}: TTFT p50 {lat.p50 * 1000:.2f} ms, p99 "
                          f"{lat.pct(0.99) * 1000:.2f} ms; {load.rps:.0f} req/s, CPU "
                          f"{spent / max(load.ok, 1) * 1000:.3f} ms/request, errors "
                          f"{load.errors + lat.errors}", flush=True)
        finally:
            for path in paths.values():
                path.stop()
    finally:
        stop_all(ups)
    med = {n: {k: statistics.median(v) for k, v in r.items()} for n, r in results.items()}
    base = med["gateway"]
    print(f"\nmedians of {args.repeats} rounds, {args.tokens}-token streams "
          f"(CPU at {args.concurrency} connections):")
    print(f"{'path':<11} {'TTFT p50 ms':>12} {'TTFT p99 ms':>12} {'CPU ms/req':>11} "
          f"{'req/s':>7} {'CPU vs gateway':>15}")
    for n in PATHS:
        m = med[n]
        print(f"{n:<11} {m['p50']:>12.2f} {m['p99']:>12.2f} {m['cpu']:>11.3f} {m['rps']:>7.0f} "
              f"{m['cpu'] / base['cpu']:>14.2f}x")
    return 0


def port_of(proc: subprocess.Popen[bytes]) -> str:
    args = list(proc.args)  # type: ignore[arg-type]
    return str(args[args.index("--port") + 1])


if __name__ == "__main__":
    raise SystemExit(main())
