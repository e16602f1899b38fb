"""Hostile and slow clients against real gateway processes, the same attacks on each, side by side.

Header bombs (4M headers, one 128 MB header value, 10k small headers, and in a chunked body one
128 MB trailer value or chunk extension), a chunked body far over the body limit, 20k idle connections (two client processes of 10k: the fd limit here is 20,000), and
slowloris heads and bodies. Measured per gateway: time to the answer (or the close), its status,
RSS growth, the longest /health answer while the attack runs (polled on a fresh connection every
50 ms, as a kubelet does; on the probe port where the gateway has one), failed health polls,
well-behaved clients' p99 during the bombs against their own baseline, backends still up, the
gateway's fds before, at the peak and after, and how long the idle connections were kept.

    python -m bench.edge_attacks [--gateway-from main=DIR] [--no-current] [--flood 20000]

`--gateway-from LABEL=DIR` adds another checkout's gateway (run with DIR as its working
directory), e.g. the main branch before the edge existed; it gets no edge flags unless LABEL ends
in `+edge` (a checkout that has the edge: the same flags as this one). `--attacks flood` runs
only the 20k flood, `--rounds N` runs the gateways N times in turn. The current checkout runs with
`--edge.probe-port` and the head/body timeouts set by `--head-timeout-s`/`--body-timeout-s`
(short, so the run stays short; the defaults are 10 s and 30 s). The attack functions are also
what tests/gateway/edge/test_attacks.py runs, scaled down.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import selectors
import shlex
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from bench.load import pct
from bench.procs import fd_count, rss_mib, wait_ok
from devstack.cli import Parser
from devstack.procs import free_port

REQUEST_LINE = b"GET /v1/models HTTP/1.1\r\nhost: gw\r\n"
MiB = 1024 * 1024


# -- header bombs ------------------------------------------------------------------------------------

def many_headers(count: int, per_piece: int = 65536) -> Iterator[bytes]:
    yield REQUEST_LINE
    line = b"a: b\r\n"
    for start in range(0, count, per_piece):
        yield line * min(per_piece, count - start)
    yield b"\r\n"


def huge_value(total: int) -> Iterator[bytes]:
    yield REQUEST_LINE + b"x-big: "
    piece = b"a" * MiB
    for _ in range(total // MiB):
        yield piece
    yield b"\r\n\r\n"


def numbered_headers(count: int) -> Iterator[bytes]:
    yield REQUEST_LINE + b"".join(b"x-h%d: v\r\n" % i for i in range(count)) + b"\r\n"


def _chunked_head(path: bytes = b"/v1/chat/completions") -> bytes:
    return (b"POST " + path + b" HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
            b"transfer-encoding: chunked\r\n\r\n")


def _chunked_padded(before: bytes, after: bytes, total: int) -> Iterator[bytes]:
    """A chunked request whose body framing holds `total` bytes between `before` and `after`."""
    yield _chunked_head() + before
    piece = b"a" * MiB
    for _ in range(total // MiB):
        yield piece
    yield after


def huge_trailer(total: int) -> Iterator[bytes]:
    """A chunked body of `{}` whose trailer section holds one `total`-byte value."""
    return _chunked_padded(b"2\r\n{}\r\n0\r\nx-big: ", b"\r\n\r\n", total)


def huge_chunk_extension(total: int) -> Iterator[bytes]:
    """A chunked body of `{}` whose one chunk has a `total`-byte extension."""
    return _chunked_padded(b"2;x=", b"\r\n{}\r\n0\r\n\r\n", total)


BOMBS = {
    "4M headers": lambda: many_headers(4_000_000),
    "128 MB header value": lambda: huge_value(128 * MiB),
    "10k small headers": lambda: numbered_headers(10_000),
    "128 MB trailer value": lambda: huge_trailer(128 * MiB),
    "128 MB chunk extension": lambda: huge_chunk_extension(128 * MiB),
}


def chunked_body(total: int, path: bytes = b"/v1/chat/completions") -> Iterator[bytes]:
    yield _chunked_head(path)
    chunk = b"%x\r\n" % MiB + b"a" * MiB + b"\r\n"
    for _ in range(total // MiB):
        yield chunk
    yield b"0\r\n\r\n"


@dataclass
class Outcome:
    seconds: float  # first byte sent -> response head, EOF or reset
    status: int | None  # None: closed without an answer (or no answer before the timeout)
    how: str  # "answer", "closed", "reset", "timeout"
    body: bytes = b""
    sent: int = 0  # bytes the client got to send by then
    closed_s: float | None = None  # until_close: first byte -> the server's close (None: never)
    sent_at_close: int = 0  # until_close: bytes the client got to send by the close (or timeout)


def attack(host: str, port: int, pieces: Iterable[bytes], timeout_s: float = 5.0,
           until_close: bool = False) -> Outcome:
    """Send `pieces` from a thread while reading the answer; stop sending once one arrives (with
    `until_close`, once the server closes the connection, or at the timeout)."""
    sock = socket.create_connection((host, port), timeout=timeout_s)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sent = [0]

    def pump() -> None:
        try:
            for piece in pieces:
                sock.sendall(piece)
                sent[0] += len(piece)
        except OSError:
            pass

    t0 = time.perf_counter()
    sender = threading.Thread(target=pump, daemon=True)
    sender.start()
    data, how = b"", "timeout"
    try:
        while True:
            got = sock.recv(65536)
            if not got:
                how = "closed"
                break
            data += got
            if b"\r\n\r\n" in data:
                head, _, rest = data.partition(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                if len(rest) >= length:
                    how = "answer"
                    break
    except TimeoutError:
        pass
    except OSError:
        how = "reset"
    elapsed = time.perf_counter() - t0
    at = sent[0]
    closed_s = None
    if until_close and how == "answer":
        try:
            while sock.recv(65536):
                pass
            closed_s = time.perf_counter() - t0
        except TimeoutError:
            pass
        except OSError:
            closed_s = time.perf_counter() - t0
    at_close = sent[0]
    # shutdown wakes the sender blocked in sendall; close alone would not.
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
    sender.join(5)
    status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else None
    return Outcome(elapsed, status, how if status is None else "answer",
                   data.partition(b"\r\n\r\n")[2], at, closed_s, at_close)


# -- health polling and well-behaved clients ---------------------------------------------------------

class Poller(threading.Thread):
    """GET `path` every `interval_s`, each on a fresh connection; records latencies and failures."""

    def __init__(self, host: str, port: int, path: str = "/health", interval_s: float = 0.05,
                 timeout_s: float = 2.0, keep_alive: bool = False) -> None:
        super().__init__(daemon=True)
        self.addr = (host, port)
        self.raw = f"GET {path} HTTP/1.1\r\nhost: gw\r\n".encode() + (
            b"\r\n" if keep_alive else b"connection: close\r\n\r\n")
        self.interval_s, self.timeout_s, self.keep_alive = interval_s, timeout_s, keep_alive
        self.latencies: list[float] = []
        self.failures = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        sock: socket.socket | None = None
        while not self._stop_event.is_set():
            t0 = time.perf_counter()
            try:
                if sock is None:
                    sock = socket.create_connection(self.addr, timeout=self.timeout_s)
                sock.sendall(self.raw)
                data = b""
                while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
                    got = sock.recv(65536)
                    if not got:
                        break
                    data += got
                if not data.startswith(b"HTTP/1.1 200"):
                    raise OSError(data[:40])
                self.latencies.append(time.perf_counter() - t0)
            except OSError:
                self.failures += 1
                if sock is not None:
                    sock.close()
                sock = None
            if not self.keep_alive and sock is not None:
                sock.close()
                sock = None
            self._stop_event.wait(self.interval_s)
        if sock is not None:
            sock.close()

    def stop(self) -> Poller:
        self._stop_event.set()
        self.join(10)
        return self

    @property
    def worst_ms(self) -> float:
        return max(self.latencies, default=float("nan")) * 1e3

    def p99_ms(self) -> float:
        return pct(self.latencies, 0.99) * 1e3


# -- connection floods -------------------------------------------------------------------------------

@dataclass
class Flood:
    opened: int = 0
    failed: int = 0  # connect failed or timed out
    lifetimes: list[float] = field(default_factory=list)  # open -> closed by the server, seconds
    still_open: int = 0
    answers: dict[int, int] = field(default_factory=dict)  # status -> count, for what was answered

    def merge(self, other: Flood) -> None:
        self.opened += other.opened
        self.failed += other.failed
        self.lifetimes += other.lifetimes
        self.still_open += other.still_open
        for k, v in other.answers.items():
            self.answers[k] = self.answers.get(k, 0) + v

    def closed_between(self, lo: float, hi: float) -> int:
        return sum(lo <= t < hi for t in self.lifetimes)


def hold_connections(host: str, port: int, count: int, hold_s: float, first: bytes = b"",
                     drip: bytes = b"", drip_every_s: float = 1.0) -> Flood:
    """Open `count` connections, send `first` on each, then `drip` every `drip_every_s` (nothing
    if empty), and watch for `hold_s` after the last one opened which ones the server closes."""
    out = Flood()
    sel = selectors.DefaultSelector()
    opened_at: dict[socket.socket, float] = {}
    failures_in_a_row = 0
    for _ in range(count):
        sock = socket.socket()
        sock.settimeout(1.0)
        try:
            sock.connect((host, port))
            if first:
                sock.sendall(first)
        except OSError:
            sock.close()
            out.failed += 1
            failures_in_a_row += 1
            if failures_in_a_row >= 20:  # the server accepts no more: stop knocking
                out.failed += count - out.opened - out.failed
                break
            continue
        failures_in_a_row = 0
        sock.setblocking(False)
        opened_at[sock] = time.monotonic()
        sel.register(sock, selectors.EVENT_READ)
        out.opened += 1
    end = time.monotonic() + hold_s
    next_drip = time.monotonic() + drip_every_s
    while opened_at and time.monotonic() < end:
        for key, _ in sel.select(timeout=0.05):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            try:
                data = sock.recv(65536)
            except OSError:
                data = b""
            if data.startswith(b"HTTP/1.1 "):
                status = int(data.split(b" ", 2)[1])
                out.answers[status] = out.answers.get(status, 0) + 1
            out.lifetimes.append(time.monotonic() - opened_at.pop(sock))
            sel.unregister(sock)
            sock.close()
        if drip and time.monotonic() >= next_drip:
            next_drip += drip_every_s
            for sock in list(opened_at):
                try:
                    sock.send(drip)
                except OSError:
                    pass
    out.still_open = len(opened_at)
    for sock in opened_at:
        sock.close()
    return out


def _flood_worker(host: str, port: int, count: int, hold_s: float,
                  q: mp.Queue[Flood]) -> None:  # pragma: no cover - runs in a child process
    q.put(hold_connections(host, port, count, hold_s))


def idle_flood(host: str, port: int, count: int, hold_s: float, procs: int = 2) -> Flood:
    """`count` idle connections from `procs` processes (each within this machine's fd limit)."""
    ctx = mp.get_context("spawn")  # no fork of a process with threads (pytest, pollers)
    q: mp.Queue[Flood] = ctx.Queue()
    workers = [ctx.Process(target=_flood_worker, args=(host, port, count // procs, hold_s, q))
               for _ in range(procs)]
    for w in workers:
        w.start()
    total = Flood()
    for _ in workers:
        total.merge(q.get(timeout=hold_s + 300))
    for w in workers:
        w.join(10)
    return total


# -- the benchmark ------------------------------------------------------------------------------------

def _backends_up(url: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        return sum(float(line.rsplit(" ", 1)[1]) for line in r.read().decode().splitlines()
                   if line.startswith("llmserve_backend_up{"))


def _fmt(o: Outcome) -> str:
    return f"{o.status or o.how} in {o.seconds * 1e3:.1f} ms (client sent {o.sent / MiB:.1f} MiB)"


def run_one(label: str, cmd: str, cwd: str, port: int, probe: int,
            args: argparse.Namespace) -> list[str]:
    lines = [f"## {label} ({cwd}): {cmd}"]
    # The checkout is the working directory: `python -m` puts it first on sys.path, ahead of
    # PYTHONPATH, so that is the only way to run another checkout's gateway.
    proc = subprocess.Popen(shlex.split(cmd), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, cwd=cwd)
    host, url = "127.0.0.1", f"http://127.0.0.1:{port}"
    try:
        wait_ok(url + "/ready")
        time.sleep(0.5)
        pid = proc.pid
        baseline = Poller(host, port, "/v1/models", 0.01, keep_alive=True)
        baseline.start()
        time.sleep(2)
        base = baseline.stop()
        lines.append(f"well-behaved GET /v1/models baseline: p99 {base.p99_ms():.2f} ms")
        for name, pieces in BOMBS.items() if "bombs" in args.attacks else []:
            health = Poller(host, probe)
            good = Poller(host, port, "/v1/models", 0.01, keep_alive=True)
            health.start()
            good.start()
            time.sleep(0.3)
            rss0 = rss_mib(pid)
            o = attack(host, port, pieces(), timeout_s=args.bomb_timeout_s)
            time.sleep(0.5)
            rss1 = rss_mib(pid)
            health.stop()
            good.stop()
            lines.append(
                f"{name}: {_fmt(o)}; RSS +{rss1 - rss0:.1f} MiB; /health worst "
                f"{health.worst_ms:.1f} ms, {health.failures} failed; well-behaved p99 "
                f"{good.p99_ms():.2f} ms ({good.failures} failed); backends up "
                f"{_backends_up(url):.0f}")
        if "bombs" in args.attacks:
            o = attack(host, port, chunked_body(100 * MiB), timeout_s=args.bomb_timeout_s,
                       until_close=True)
            closed = (f"closed at {o.closed_s * 1e3:.0f} ms" if o.closed_s is not None
                      else f"still open after {args.bomb_timeout_s:g} s")
            lines.append(f"chunked 100 MiB body (limit 8 MiB): {_fmt(o)}; connection {closed}, "
                         f"client sent {o.sent_at_close / MiB:.1f} MiB by then")
        fd0 = fd_count(pid)
        if "flood" in args.attacks:
            lines.append(_flood(host, port, probe, pid, fd0, args))
        if "slow" in args.attacks:
            lines += _slow(host, port, probe, args)
        time.sleep(2)
        lines.append(f"gateway fds at the end: {fd_count(pid)} (before the floods {fd0}); "
                     f"RSS {rss_mib(pid):.0f} MiB")
    finally:
        os.killpg(proc.pid, 9)
        proc.wait(10)
    return lines


def _flood(host: str, port: int, probe: int, pid: int, fd0: int,
           args: argparse.Namespace) -> str:
    health = Poller(host, probe)
    health.start()
    peak = [fd0]

    def watch_fds(stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                peak[0] = max(peak[0], fd_count(pid))
            except OSError:
                pass
            stop.wait(0.2)

    stop = threading.Event()
    watcher = threading.Thread(target=watch_fds, args=(stop,), daemon=True)
    watcher.start()
    t0 = time.monotonic()
    flood = idle_flood(host, port, args.flood, args.hold_s)
    spent = time.monotonic() - t0
    time.sleep(1)
    stop.set()
    watcher.join()
    health.stop()
    fd1 = fd_count(pid)
    time.sleep(1)
    return (
        f"{args.flood} idle connections ({spent:.0f} s): opened {flood.opened}, failed "
        f"{flood.failed}; closed within 0.5 s {flood.closed_between(0, 0.5)}, at the head "
        f"timeout ({args.head_timeout_s:g} s +- 1) "
        f"{flood.closed_between(args.head_timeout_s - 1, args.head_timeout_s + 1)}, still open "
        f"after {args.hold_s:g} s {flood.still_open}; gateway fds {fd0} -> peak {peak[0]} -> "
        f"{fd1}; /health worst {health.worst_ms:.1f} ms, p99 {health.p99_ms():.1f} ms, "
        f"{health.failures} of {health.failures + len(health.latencies)} failed")


def _slow(host: str, port: int, probe: int, args: argparse.Namespace) -> list[str]:
    lines: list[str] = []
    for kind, first, drip in (
        ("slowloris head", REQUEST_LINE, b"x"),
        ("stalled body", (b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\n"
                          b"content-type: application/json\r\ncontent-length: 1000\r\n\r\n{"),
         b""),
    ):
        health = Poller(host, probe)
        health.start()
        timeout = args.head_timeout_s if kind == "slowloris head" else args.body_timeout_s
        slow = hold_connections(host, port, args.slow, args.hold_s, first, drip, 1.0)
        health.stop()
        lines.append(
            f"{args.slow} x {kind} (a byte a second)" if drip else f"{args.slow} x {kind}")
        lines[-1] += (f": closed at the timeout ({timeout:g} s +- 1) "
                      f"{slow.closed_between(timeout - 1, timeout + 1)}, answered "
                      f"{slow.answers or '-'}, still open after {args.hold_s:g} s "
                      f"{slow.still_open}; /health worst {health.worst_ms:.1f} ms, "
                      f"{health.failures} failed")
    return lines


def main() -> int:
    p = Parser(prog="python -m bench.edge_attacks", description=__doc__)
    p.add_argument("--gateway-from", action="append", default=[], metavar="LABEL=DIR",
                   help="also attack the gateway of the checkout at DIR (repeatable)")
    p.add_argument("--no-current", action="store_true", help="only the --gateway-from ones")
    p.add_argument("--flood", type=int, default=20_000, help="idle connections")
    p.add_argument("--slow", type=int, default=1000, help="slowloris connections per kind")
    p.add_argument("--hold-s", type=float, default=12.0, help="how long floods are watched")
    p.add_argument("--head-timeout-s", type=float, default=5.0,
                   help="the gateways' --edge.head-timeout-s")
    p.add_argument("--body-timeout-s", type=float, default=5.0,
                   help="the gateways' --edge.body-timeout-s")
    p.add_argument("--bomb-timeout-s", type=float, default=30.0,
                   help="how long a bomb's connection is watched before it counts as still open")
    p.add_argument("--attacks", default="bombs,flood,slow",
                   help="comma-separated subset of bombs (with the chunked body), flood, slow")
    p.add_argument("--rounds", type=int, default=1,
                   help="the gateways one after the other, this many times (A B A B ...)")
    args = p.parse_args()
    args.attacks = set(args.attacks.split(","))
    up_port = free_port()
    upstream = subprocess.Popen([sys.executable, "-m", "bench.fake_upstream", "--port",
                                 str(up_port)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
    base = (f"{sys.executable} -m gateway --host 127.0.0.1 --port {{port}} --backend "
            f"http://127.0.0.1:{up_port} --log-level warning")
    edge_flags = (f" --edge.probe-port {{probe}} --edge.head-timeout-s {args.head_timeout_s:g} "
                  f"--edge.body-timeout-s {args.body_timeout_s:g}")
    try:
        wait_ok(f"http://127.0.0.1:{up_port}/health")
        report: list[str] = []
        for r in range(args.rounds):
            for extra in args.gateway_from:
                label, _, path = extra.partition("=")
                port, probe = free_port(), free_port()
                cmd = base.format(port=port)
                if label.endswith("+edge"):  # a checkout that has the edge: the same flags
                    cmd += edge_flags.format(probe=probe)
                else:
                    probe = port
                report += run_one(f"{label} (round {r + 1})", cmd, path, port, probe, args)
            if not args.no_current:
                port, probe = free_port(), free_port()
                cmd = base.format(port=port) + edge_flags.format(probe=probe)
                report += run_one(f"this checkout (round {r + 1})", cmd, os.getcwd(), port,
                                  probe, args)
        print("\n".join(report))
    finally:
        os.killpg(upstream.pid, 9)
        upstream.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
