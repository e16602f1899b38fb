"""The gateway at a real decode pace, side by side with vllm-router and nginx.

A near-free upstream (bench/fake_upstream.py) streams `--tokens` tokens `--gap-ms` apart after a
`--ttft-ms` first token, as an engine does: each event arrives alone. An open-loop client sends
`--rate` requests/s for `--duration` s, hundreds of streams open at once. Each proxy is pinned to
CPU 0; the upstream and the client share CPU 1. Every round starts each proxy afresh (a cold
start, as after a deploy), and the proxies alternate (A B C A B C ...): the machine is noisy.

Per proxy and round: statuses, TTFT p50/p99 (from the request's scheduled send time, so a late
client does not hide queueing), CPU per request from the proxy's own CPU time (all its threads and
processes: bench/procs.py), and the share of its core that took.

    python -m bench.real_pace [--rate 250] [--duration 8] [--rounds 2]
        [--router /path/to/vllm-router] [--no-nginx] [--gateway-from before=DIR]

`--warmup S` loads each proxy for S unmeasured seconds first (the gateway's adaptive limit then
measures its steady state, not its ramp from a cold start). `--headroom` instead steps the offered rate (`--rates`) and reports, per proxy, the highest rate
its one core sustains with every request served and TTFT p99 within `--max-added-ms` of the
upstream's own first-token time. The proxies still alternate at each step; a proxy drops out at
its first failing step. The client and the upstream share CPU 1, whose busy share is printed per
step: near 1.0 the load generator, not the proxy, is the limit, and the figure is a lower bound.

`--overload USERS` measures flow control's promise under overload instead: the upstream serves
`--max-num-seqs` streams at once (an engine's batch; the rest wait for a slot, first token
included), and USERS closed-loop clients each send their next request `--think-s` (exponential,
that mean) after their last one was answered or refused, all starting at once against a cold
proxy. Sides, alternating per round: `engine` (the upstream alone) and the gateway(s), run with
`--gateway-arg` flags. Per side: admitted TTFT p50/p99 (from each request's send), goodput
(answers completed per second), refusals (status, Retry-After present, time to answer p99).

    python -m bench.real_pace --overload 180 --max-num-seqs 8 --tokens 32 --gap-ms 2 \
        --ttft-ms 50 --duration 30 --rounds 2 --only gateway \
        --gateway-arg=--flow.ttft-target-s=0.4 --gateway-arg=--flow.queue-timeout-s=0.1
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.load import build_request, pct
from bench.procs import busy_share, cpu_busy, cpu_seconds, start, stop_all, wait_ok
from devstack.cli import Parser
from devstack.procs import free_port


@dataclass
class Round:
    statuses: dict[int, int] = field(default_factory=dict)
    errors: int = 0
    ttft: list[float] = field(default_factory=list)
    late: int = 0
    cpu_s: float = 0.0
    wall_s: float = 0.0
    load_share: float = 0.0  # busy share of CPU 1 (the client and the upstream)
    # When each request answered other than 200 was due, in seconds from the round's start: a
    # cold start's refusals come in waves a turnover apart, an overload's all along.
    refused_at: list[float] = field(default_factory=list)

    @property
    def served(self) -> int:
        return self.statuses.get(200, 0)


async def _one(port: int, raw: bytes, due: float, idle: list[tuple[asyncio.StreamReader,
               asyncio.StreamWriter]], out: Round) -> None:
    conn = idle.pop() if idle else await asyncio.open_connection("127.0.0.1", port)
    r, w = conn
    try:
        w.write(raw)
        buf = b""
        while b"\r\n\r\n" not in buf:
            data = await r.read(65536)
            if not data:
                raise ConnectionError("closed before the head")
            buf += data
        head, _, buf = buf.partition(b"\r\n\r\n")
        status = int(head[9:12])
        out.statuses[status] = out.statuses.get(status, 0) + 1
        if status != 200:
            out.refused_at.append(due)
        lower = head.lower()
        if b"content-length:" in lower:
            n = int(lower.split(b"content-length:")[1].split(b"\r\n")[0])
            while len(buf) < n:
                data = await r.read(65536)
                if not data:
                    raise ConnectionError("closed mid-body")
                buf += data
            idle.append(conn)
            return
        out.ttft.append(await read_stream(r, buf) - due)
        idle.append(conn)
    except (ConnectionError, OSError, ValueError):
        out.errors += 1
        w.close()


async def read_stream(r: asyncio.StreamReader, buf: bytes) -> float:
    """Read a chunked SSE answer (`buf`: what came with its head) to its end; the time its first
    content token arrived."""
    first = 0.0
    while True:
        if not first and b"tok" in buf:  # the first content token
            first = time.perf_counter()
        if buf.endswith(b"0\r\n\r\n"):
            return first or time.perf_counter()
        data = await r.read(65536)
        if not data:
            raise ConnectionError("closed mid-stream")
        buf = buf[-16:] + data


async def open_loop(port: int, rate: float, duration: float, tokens: int,
                    offset: float = 0.0) -> Round:
    """`rate` requests/s at fixed intervals for `duration`; never waits for an answer to send.
    `offset`: the fraction of an interval to wait before the first request."""
    out = Round()
    raw = build_request(f"http://127.0.0.1:{port}", "demo", tokens)
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    tasks: list[asyncio.Task[None]] = []
    start_t = time.perf_counter() + offset / rate
    n = int(rate * duration)
    for i in range(n):
        due = start_t + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        elif delay < -0.005:
            out.late += 1
        tasks.append(asyncio.create_task(_one(port, raw, due, idle, out)))
    await asyncio.gather(*tasks)
    for _, w in idle:
        w.close()
    out.refused_at = sorted(t - start_t for t in out.refused_at)
    return out


NGINX_CONF = """
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 16384; }}
http {{
  access_log off;
  upstream up {{ server 127.0.0.1:{up}; keepalive 1024; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://up;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_read_timeout 300s;
    }}
  }}
}}
"""


def proxies(args: argparse.Namespace, upstream: int, tmp: Path) -> dict[str, str]:
    gw = (f"{sys.executable} -m gateway --host 127.0.0.1 --port {{port}} "
          f"--backend http://127.0.0.1:{upstream} --log-level warning")
    gw += "".join(f" {shlex.quote(a)}" for a in args.gateway_arg)
    out = {"gateway": gw, "gateway-no-flow": gw + " --no-flow.enabled"}
    for extra in args.gateway_from:
        # Another checkout's gateway, e.g. before a change. Run from its directory: `python -m`
        # puts the working directory ahead of PYTHONPATH, so PYTHONPATH alone ran this checkout.
        label, _, path = extra.partition("=")
        out[label] = f"env -C {path} PYTHONPATH={path} " + gw
    router = args.router or shutil.which("vllm-router")
    if router:
        out["vllm-router"] = (f"{router} --host 127.0.0.1 --port {{port}} --worker-urls "
                              f"http://127.0.0.1:{upstream} --policy round_robin "
                              "--log-level warning --prometheus-port {prom}")
    if not args.no_nginx and shutil.which("nginx"):
        out["nginx"] = f"nginx -p {tmp} -c {tmp}/nginx-{{port}}.conf -g 'daemon off;'"
    return out


def run_round(name: str, cmd: str, args: argparse.Namespace, upstream: int, tmp: Path,
              rate: float | None = None) -> Round:
    port = free_port()
    if name == "nginx":
        (tmp / f"nginx-{port}.conf").write_text(NGINX_CONF.format(dir=tmp, up=upstream,
                                                                  port=port))
    # vllm-router's metrics listener defaults to port 29000: a second router on the machine (another
    # benchmark's) would make it panic at start.
    proc = start(cmd.format(port=port, prom=free_port()), "0")
    try:
        # nginx answers /health by proxying it to the upstream: ready means the path works.
        wait_ok(f"http://127.0.0.1:{port}/health", 60)
        if name.startswith("gateway"):
            wait_ok(f"http://127.0.0.1:{port}/ready", 30)
        if args.warmup:
            # Unmeasured load first: what a steady state costs, not a cold start's ramp.
            asyncio.run(open_loop(port, rate or args.rate, args.warmup, args.tokens))
        cpu0, t0, load0 = cpu_seconds(proc.pid), time.perf_counter(), cpu_busy(1)
        result = asyncio.run(open_loop(port, rate or args.rate, args.duration, args.tokens))
        result.cpu_s = cpu_seconds(proc.pid) - cpu0
        result.wall_s = time.perf_counter() - t0
        result.load_share = busy_share(load0, cpu_busy(1))
        return result
    finally:
        stop_all([proc])


def line(name: str, res: Round, label: str) -> str:
    n = sum(res.statuses.values()) + res.errors
    return (f"{label} {name:16s} sent {n:5d} served {res.served:5d} "
            f"statuses {dict(sorted(res.statuses.items()))} errors {res.errors} "
            f"late {res.late}  TTFT p50 {pct(res.ttft, .5) * 1e3:6.1f} ms "
            f"p99 {pct(res.ttft, .99) * 1e3:7.1f} ms  CPU/req "
            f"{res.cpu_s / max(res.served, 1) * 1e6:6.0f} us  core "
            f"{res.cpu_s / res.wall_s:.2f}  load core {res.load_share:.2f}"
            + (f"  refused due at {_spans(res.refused_at)} s" if res.refused_at else ""))


def _spans(times: list[float], gap: float = 0.02) -> str:
    """Sorted times as runs, '0.093-0.100 (4), 0.195-0.200 (3)': waves read at a glance."""
    runs: list[list[float]] = []
    for t in times:
        if runs and t - runs[-1][-1] <= gap:
            runs[-1].append(t)
        else:
            runs.append([t])
    return ", ".join(f"{r[0]:.3f}-{r[-1]:.3f} ({len(r)})" if len(r) > 1 else f"{r[0]:.3f}"
                     for r in runs[:8]) + (" ..." if len(runs) > 8 else "")


def sustained(res: Round, ttft_ms: float, max_added_ms: float) -> tuple[bool, float]:
    """(every request served and TTFT p99 within `max_added_ms` of the upstream's, added ms)."""
    added = pct(res.ttft, .99) * 1e3 - ttft_ms if res.ttft else float("inf")
    sent = sum(res.statuses.values()) + res.errors
    return sent > 0 and res.served == sent and added <= max_added_ms, added


def headroom(args: argparse.Namespace, targets: dict[str, str], up: int, tmp: Path) -> None:
    """Step the rate; each proxy's last step with all served and added p99 within bounds."""
    best: dict[str, float | None] = dict.fromkeys(targets)
    going = dict(targets)
    for rate in args.rates:
        for name, cmd in list(going.items()):
            res = run_round(name, cmd, args, up, tmp, rate)
            ok, added = sustained(res, args.ttft_ms, args.max_added_ms)
            print(line(name, res, f"{rate:5.0f}/s") + f"  added p99 {added:6.1f} ms "
                  + ("ok" if ok else "FAIL"), flush=True)
            if ok:
                best[name] = rate
            else:
                del going[name]
        if not going:
            break
    print(f"\nheadroom: highest rate with all served and TTFT p99 <= {args.ttft_ms:.0f} + "
          f"{args.max_added_ms:.0f} ms; {args.tokens} tokens {args.gap_ms:.0f} ms apart, "
          f"{args.duration:.0f} s per step, rates {', '.join(f'{r:g}' for r in args.rates)}")
    print("| proxy | highest sustained rate (req/s) |")
    print("|---|---|")
    for name, rate in best.items():
        shown = "below the first step" if rate is None else f"{rate:.0f}"
        if name in going:
            shown = f">= {shown} (passed every step)"
        print(f"| {name} | {shown} |")


@dataclass
class Overload:
    """One side's closed-loop overload round."""

    ttft: list[float] = field(default_factory=list)  # admitted: send -> first token
    refusals: list[float] = field(default_factory=list)  # refused: send -> status line
    statuses: dict[int, int] = field(default_factory=dict)
    no_retry_after: int = 0  # refusals without a Retry-After header
    done: int = 0  # answers completed within the round
    errors: int = 0
    duration_s: float = 0.0
    # When each admitted request over `--late-ms` was sent, in seconds from the round's start:
    # a cold start's climb overshooting shows as one early run, a steady state's misses all along.
    late_at: list[float] = field(default_factory=list)


async def _user(port: int, raw: bytes, think_s: float, end: float, rng: random.Random,
                out: Overload, start: float, late_s: float) -> None:
    await asyncio.sleep(0)
    conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        try:
            if conn is None:
                conn = await asyncio.open_connection("127.0.0.1", port)
            r, w = conn
            w.write(raw)
            head = await r.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            out.statuses[status] = out.statuses.get(status, 0) + 1
            lower = head.lower()
            if status != 200:
                out.refusals.append(time.perf_counter() - t0)
                out.no_retry_after += b"\r\nretry-after:" not in lower
                n = int(lower.split(b"content-length:")[1].split(b"\r\n")[0])
                await r.readexactly(n)
            else:
                ttft = await read_stream(r, b"") - t0
                out.ttft.append(ttft)
                if ttft > late_s:
                    out.late_at.append(t0 - start)
                out.done += time.perf_counter() <= end
        except (ConnectionError, OSError, ValueError, IndexError, asyncio.IncompleteReadError):
            out.errors += 1
            if conn is not None:
                conn[1].close()
            conn = None
        await asyncio.sleep(rng.expovariate(1.0 / think_s))
    if conn is not None:
        conn[1].close()


async def closed_loop(port: int, users: int, think_s: float, duration: float, tokens: int,
                      seed: int, late_s: float = float("inf")) -> Overload:
    out = Overload(duration_s=duration)
    raw = build_request(f"http://127.0.0.1:{port}", "demo", tokens)
    start = time.perf_counter()
    end = start + duration
    rng = random.Random(seed)
    await asyncio.gather(*(_user(port, raw, think_s, end, random.Random(rng.random()), out,
                                 start, late_s) for _ in range(users)))
    out.late_at.sort()
    return out


def overload(args: argparse.Namespace, targets: dict[str, str], up: int, tmp: Path) -> None:
    """Closed-loop overload, the engine alone against each proxy, cold, alternating rounds."""
    sides = {"engine": "", **targets}
    rows: dict[str, list[Overload]] = {name: [] for name in sides}
    names = list(sides)
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            proc = None
            port = up
            if name != "engine":
                port = free_port()
                proc = start(sides[name].format(port=port, prom=free_port()), "0")
            try:
                if proc is not None:
                    wait_ok(f"http://127.0.0.1:{port}/health", 60)
                    wait_ok(f"http://127.0.0.1:{port}/ready", 30)
                res = asyncio.run(closed_loop(port, args.overload, args.think_s, args.duration,
                                              args.tokens, seed=r, late_s=args.late_ms / 1e3))
            finally:
                if proc is not None:
                    stop_all([proc])
            rows[name].append(res)
            print(f"round {r + 1} {name:10s} " + overload_line(res), flush=True)
            if res.late_at and name != "engine":
                print(f"    {len(res.late_at)} admitted over {args.late_ms:g} ms, sent at "
                      f"{_spans(res.late_at, gap=0.25)} s", flush=True)
            time.sleep(1.0)  # let the engine's backlog drain before the next side
    print(f"\n{args.overload} users thinking {args.think_s:g} s, {args.max_num_seqs} sequence "
          f"slots, {args.tokens} tokens {args.gap_ms:g} ms apart after {args.ttft_ms:g} ms, "
          f"{args.duration:g} s per side, {args.rounds} rounds")
    print("| side | admitted TTFT p50 (ms) | TTFT p99 (ms) | goodput (req/s) | refused | "
          "without Retry-After | refusal p99 (ms) | errors |")
    print("|---|---|---|---|---|---|---|---|")
    for name, rs in rows.items():
        for res in rs:
            print(f"| {name} | {pct(res.ttft, .5) * 1e3:.0f} | {pct(res.ttft, .99) * 1e3:.0f} | "
                  f"{res.done / res.duration_s:.1f} | {len(res.refusals)} | {res.no_retry_after} |"
                  f" {pct(res.refusals, .99) * 1e3:.0f} | {res.errors} |")
    for name in names[1:]:
        ratios = [(pct(a.ttft, .99) / pct(e.ttft, .99), a.done / max(e.done, 1))
                  for a, e in zip(rows[name], rows["engine"], strict=True)]
        print(f"{name}/engine by round: TTFT p99 "
              + " ".join(f"{t:.2f}" for t, _ in ratios) + ", goodput "
              + " ".join(f"{g:.2f}" for _, g in ratios))


def overload_line(res: Overload) -> str:
    return (f"TTFT p50 {pct(res.ttft, .5) * 1e3:6.0f} ms p99 {pct(res.ttft, .99) * 1e3:6.0f} ms"
            f"  goodput {res.done / res.duration_s:6.1f}/s  statuses "
            f"{dict(sorted(res.statuses.items()))}  refusal p99 "
            f"{pct(res.refusals, .99) * 1e3:5.0f} ms  no Retry-After {res.no_retry_after}  "
            f"errors {res.errors}")


def main() -> int:
    p = Parser(prog="python -m bench.real_pace", description=__doc__)
    p.add_argument("--rate", type=float, default=250.0, help="requests per second, open loop")
    p.add_argument("--duration", type=float, default=8.0, help="seconds of load per round")
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds per proxy")
    p.add_argument("--tokens", type=int, default=64, help="tokens per stream")
    p.add_argument("--gap-ms", type=float, default=20.0, help="time between tokens")
    p.add_argument("--ttft-ms", type=float, default=100.0, help="upstream time to first token")
    p.add_argument("--tail-ms", type=float, default=0.0,
                   help="upstream's time before each event after the last token (finish, usage, "
                        "[DONE]); 0: at once, as vLLM writes them; -1: --gap-ms, as for a token")
    p.add_argument("--router", help="vllm-router binary; unset: the one on PATH")
    p.add_argument("--no-nginx", action="store_true", help="leave nginx out")
    p.add_argument("--only", action="append", default=[], help="measure only these proxies")
    p.add_argument("--gateway-from", action="append", default=[], metavar="LABEL=DIR",
                   help="also the gateway of the checkout at DIR, e.g. before=/tmp/old")
    p.add_argument("--warmup", type=float, default=0.0,
                   help="seconds of unmeasured load before each round; 0: a cold start")
    p.add_argument("--headroom", action="store_true",
                   help="step the rate instead; report each proxy's highest sustained rate")
    p.add_argument("--rates", type=lambda v: [float(x) for x in v.split(",")],
                   default=[200.0, 250.0, 300.0, 350.0, 400.0, 450.0, 500.0, 550.0, 600.0],
                   help="--headroom: the rates to step through, comma-separated")
    p.add_argument("--max-added-ms", type=float, default=50.0,
                   help="--headroom: the TTFT p99 allowed above the upstream's --ttft-ms")
    p.add_argument("--overload", type=int, default=0, metavar="USERS",
                   help="closed-loop overload of USERS users instead of the open loop; 0: off")
    p.add_argument("--think-s", type=float, default=1.0,
                   help="--overload: each user's mean pause after an answer or a refusal")
    p.add_argument("--late-ms", type=float, default=500.0,
                   help="--overload: say when the admitted requests with a TTFT over this were "
                        "sent (for the gateways)")
    p.add_argument("--max-num-seqs", type=int, default=0,
                   help="streams the upstream serves at once; the rest wait for a slot; "
                        "0: no limit")
    p.add_argument("--gateway-arg", action="append", default=[],
                   help="extra flag for the gateways, e.g. --gateway-arg=--flow.ttft-target-s=0.4")
    args = p.parse_args()
    if (os.cpu_count() or 1) < 2:
        p.exit(2, "needs 2 CPUs: the proxy is pinned to CPU 0, upstream and client to CPU 1\n")
    import uvloop

    uvloop.install()
    os.sched_setaffinity(0, {1})
    tmp = Path(tempfile.mkdtemp(prefix="real-pace-"))
    up = free_port()
    upstream = start(f"{sys.executable} -m bench.fake_upstream --port {up} --tokens "
                     f"{args.tokens} --token-delay-s {args.gap_ms / 1e3} "
                     f"--first-token-delay-s {args.ttft_ms / 1e3} "
                     f"--tail-delay-s {args.tail_ms / 1e3} "
                     f"--max-num-seqs {args.max_num_seqs}", "1")
    try:
        wait_ok(f"http://127.0.0.1:{up}/health")
        targets = proxies(args, up, tmp)
        if args.only:
            targets = {k: v for k, v in targets.items() if k in args.only}
        if args.headroom:
            headroom(args, targets, up, tmp)
            return 0
        if args.overload:
            overload(args, targets, up, tmp)
            return 0
        rows: dict[str, list[Round]] = {name: [] for name in targets}
        names = list(targets)
        for r in range(args.rounds):
            # Each round starts at the next proxy: on a shared VM a fixed order gives one proxy
            # the same place (first after the idle gap, last before the next round) every time.
            for name in names[r % len(names):] + names[:r % len(names)]:
                res = run_round(name, targets[name], args, up, tmp)
                rows[name].append(res)
                print(line(name, res, f"round {r + 1}"), flush=True)
        print(f"\n{args.rate:.0f} req/s offered for {args.duration:.0f} s, {args.tokens} tokens "
              f"{args.gap_ms:.0f} ms apart after {args.ttft_ms:.0f} ms; medians of "
              f"{args.rounds} cold-start rounds")
        print("| proxy | refused (non-200) | errors | TTFT p50 (ms) | TTFT p99 (ms) | "
              "CPU per request (us) | share of its core |")
        print("|---|---|---|---|---|---|---|")
        for name, rs in rows.items():
            med = statistics.median
            print(f"| {name} | {med(sum(v for k, v in x.statuses.items() if k != 200) for x in rs):.0f}"
                  f" | {med(x.errors for x in rs):.0f}"
                  f" | {med(pct(x.ttft, .5) for x in rs) * 1e3:.1f}"
                  f" | {med(pct(x.ttft, .99) for x in rs) * 1e3:.1f}"
                  f" | {med(x.cpu_s / max(x.served, 1) for x in rs) * 1e6:.0f}"
                  f" | {med(x.cpu_s / x.wall_s for x in rs):.2f} |")
        first = names[0]
        for other in names[1:]:
            ratios = [a.cpu_s / max(a.served, 1) / (b.cpu_s / max(b.served, 1))
                      for a, b in zip(rows[first], rows[other], strict=True)]
            print(f"CPU per request {first}/{other} by round: "
                  + " ".join(f"{x:.2f}" for x in ratios)
                  + f" (median {statistics.median(ratios):.2f})")
    finally:
        stop_all([upstream])
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
