"""CPU per request of two or more proxies, all on one core AT THE SAME TIME, at a real pace.

Why: bench/real_pace.py runs proxies one after another, and on a shared machine the noise between
rounds is larger than the per-request differences to measure. Here the contenders run side by
side on CPU 0 under the same open-loop load (the paced fake upstream and the client on CPU 1), so
whatever else the machine does hits them alike. CPU time is each process's exact on-CPU time
(bench/procs.py). Each contender's requests come i/k of an interval after the first's, and each
repeat rotates the order in which they start and are loaded: in step, the proxy the client and
upstream happen to wake first would run on an idle core every time. Keep the total load under
one core: a saturated core gives each process its fair share, whatever its work. Each repeat
prints the load core's busy share and the late sends; near 1.0, or with many late sends, the
load generator fell behind and the repeat does not count.

    python -m bench.paired_cpu new=/path/a old=/path/b [--rate 60] [--duration 6] [--repeats 4]

A contender is a checkout's gateway (LABEL=DIR, run with DIR as its working directory; gateway
flags may follow DIR in the same argument: 'off=/path/a --stream-resumes 0'), or
another proxy run the same way: `LABEL=@vllm-router:/path/to/vllm-router` or `LABEL=@nginx`
(bench/real_pace.py's setups; nginx's CPU includes its worker process).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
from pathlib import Path

from bench.load import pct
from bench.procs import busy_share, cpu_busy, cpu_seconds, start, stop_all, wait_ok
from bench.real_pace import NGINX_CONF, Round, open_loop
from devstack.cli import Parser
from devstack.procs import free_port


def command(spec: str, port: int, upstream: int, tmp: Path) -> str:
    """The command line serving on `port` for a contender: a checkout's gateway, or @proxy."""
    if spec.startswith("@nginx"):
        (tmp / f"nginx-{port}.conf").write_text(NGINX_CONF.format(dir=tmp, up=upstream, port=port))
        return f"nginx -p {tmp} -c {tmp}/nginx-{port}.conf -g 'daemon off;'"
    if spec.startswith("@vllm-router"):
        router = spec.partition(":")[2] or "vllm-router"
        return (f"{router} --host 127.0.0.1 --port {port} --worker-urls http://127.0.0.1:{upstream}"
                f" --policy round_robin --log-level warning --prometheus-port {free_port()}")
    # From its own directory: `python -m` puts the working directory before PYTHONPATH.
    path, _, flags = spec.partition(" ")
    return (f"env -C {path} PYTHONPATH={path} {sys.executable} -m gateway --host 127.0.0.1 "
            f"--port {port} --backend http://127.0.0.1:{upstream} --log-level warning {flags}")


async def _load(ports: list[int], rate: float, duration: float, tokens: int) -> list[Round]:
    # Staggered: contender i's requests (and so its streams' events) come i/k of an interval
    # after the first's. In step, the proxy the client and upstream happen to wake first runs on
    # an idle core every time and reads more CPU than an identical copy beside it.
    k = len(ports)
    return list(await asyncio.gather(
        *(open_loop(p, rate, duration, tokens, i / k) for i, p in enumerate(ports))))


def main() -> int:
    p = Parser(prog="python -m bench.paired_cpu", description=__doc__)
    p.add_argument("checkouts", nargs="+", metavar="LABEL=DIR",
                   help="gateway checkouts, each maybe with flags ('LABEL=DIR --flag value'), "
                        "or @vllm-router[:PATH], @nginx; ratios are of the first to each other")
    p.add_argument("--rate", type=float, default=60.0, help="requests/s to EACH gateway")
    p.add_argument("--duration", type=float, default=6.0, help="measured seconds per repeat")
    p.add_argument("--repeats", type=int, default=4,
                   help="repeats; each rotates the contenders' order (a multiple of their count "
                        "gives each position to each alike)")
    p.add_argument("--gap-ms", type=float, default=20.0,
                   help="upstream's time between tokens (0: each answer in one burst)")
    p.add_argument("--ttft-ms", type=float, default=100.0, help="upstream's time to first token")
    p.add_argument("--tail-ms", type=float, default=0.0,
                   help="upstream's time before each event after the last token (finish, usage, "
                        "[DONE]); 0: at once, as vLLM writes them; -1: --gap-ms, as for a token")
    p.add_argument("--tokens", type=int, default=64,
                   help="tokens per answer (1: the per-request cost, nearly no per-event cost)")
    args = p.parse_args()
    specs = [c.partition("=")[::2] for c in args.checkouts]
    import uvloop

    uvloop.install()
    os.sched_setaffinity(0, {1})
    up = free_port()
    upstream = start(f"{sys.executable} -m bench.fake_upstream --port {up} --tokens {args.tokens} "
                     f"--token-delay-s {args.gap_ms / 1e3} --first-token-delay-s "
                     f"{args.ttft_ms / 1e3} --tail-delay-s {args.tail_ms / 1e3}", "1")
    cpu: dict[str, list[float]] = {label: [] for label, _ in specs}
    tmpdir = tempfile.TemporaryDirectory(prefix="paired-cpu-")
    tmp = Path(tmpdir.name)
    try:
        wait_ok(f"http://127.0.0.1:{up}/health")
        for r in range(args.repeats):
            # Each repeat rotates the order contenders start and are loaded in, so no position
            # (started first, loaded first) stays with one contender.
            order = specs[r % len(specs):] + specs[:r % len(specs)]
            procs = []
            for label, path in order:
                port = free_port()
                procs.append((start(command(path, port, up, tmp), "0",
                                    stderr=tmp / f"{label}-{r + 1}.err"), port))
            try:
                for (label, path), (proc, port) in zip(order, procs, strict=True):
                    # nginx and the router answer /health by proxying it: the path works.
                    try:
                        wait_ok(f"http://127.0.0.1:{port}/"
                                + ("health" if path[0] == "@" else "ready"), 30)
                    except TimeoutError:
                        err = (tmp / f"{label}-{r + 1}.err").read_text(errors="replace")
                        print(f"repeat {r + 1} {label}: not up in 30 s (exit code {proc.poll()});"
                              f" its stderr ends:\n{err[-3000:]}", file=sys.stderr)
                        raise
                ports = [port for _, port in procs]
                # Warm: pools, adaptive limits.
                asyncio.run(_load(ports, args.rate, 1.5, args.tokens))
                before = [cpu_seconds(proc.pid) for proc, _ in procs]
                load0 = cpu_busy(1)
                outs = asyncio.run(_load(ports, args.rate, args.duration, args.tokens))
                # The client and the upstream share CPU 1: near 1.0 they, not the proxies, set
                # the pace, and late sends say the offered rate was not the rate sent.
                load = busy_share(load0, cpu_busy(1))
                for (label, _), (proc, _), c0, out in zip(order, procs, before, outs, strict=True):
                    served = out.served
                    us = (cpu_seconds(proc.pid) - c0) / max(served, 1) * 1e6
                    cpu[label].append(us)
                    print(f"repeat {r + 1} {label:10s} served {served} errors "
                          f"{out.errors} late {out.late} CPU/req {us:6.0f} us TTFT p99 "
                          f"{pct(out.ttft, .99) * 1e3:.0f} ms load core {load:.2f}", flush=True)
            finally:
                stop_all([proc for proc, _ in procs])
    finally:
        stop_all([upstream])
        tmpdir.cleanup()
    a = specs[0][0]
    print(f"\n{args.rate:.0f} req/s to each, {args.tokens} tokens {args.gap_ms:g} ms apart, "
          f"{args.duration:.0f} s x {args.repeats}: CPU/req "
          + ", ".join(f"{label} {statistics.median(cpu[label]):.0f} us" for label, _ in specs))
    for b, _ in specs[1:]:
        pairs = [x / y for x, y in zip(cpu[a], cpu[b], strict=True)]
        print(f"paired ratios {a}/{b} " + " ".join(f"{x:.3f}" for x in pairs)
              + f" (median {statistics.median(pairs):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
