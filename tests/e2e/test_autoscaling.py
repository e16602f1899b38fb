"""Issue 26's acceptance on the real engine: scale from zero without a lost request, the wake
budget, and a scaling signal that sees the load the engines' own queue does not show.

One vLLM-CPU worker, started once: by tests/autoscaler.py playing KEDA's part in the first test
(it reads the gateway's llmserve_pool_demand and starts the worker when it rises above zero), then
reused by the step-load test. The wake-budget test needs no engine: its worker never starts.
The figures (cold-start TTFT, the signal under a step of load) are printed for docs/autoscaling.md;
run with -s to see them.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from devstack.stack import LocalStack
from tests import loopback
from tests.autoscaler import Autoscaler, pool_gauge
from tests.ports import free_port
from tests.waiting import metric_sum, scrape

QUESTION = {"messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 16, "temperature": 0, "stream": True}
# The demand per replica the harness (as KEDA's threshold) aims at.
TARGET = 8


def pools_arg(model: str, budget_s: float) -> list[str]:
    return ["--pools", json.dumps([{"name": "cpu", "model": model, "scale_to_zero": True,
                                    "wake_budget_s": budget_s}])]


@pytest.fixture(scope="module")
def cold(real_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    """A gateway in front of a pool declared scalable to zero whose one worker is not started."""
    s = LocalStack(real_model_dir, workers=1, gateway_port=free_port(),
                   worker_base_port=free_port(), log_dir=tmp_path_factory.mktemp("cold-logs"),
                   gateway_args=["--health-interval-s", "0.5",
                                 *pools_arg(real_model_dir.name, 1800)])
    try:
        s.start_gateway()
        s.wait_gateway(timeout_s=60)  # ready with no replica: it must take the waking requests
        yield s
    finally:
        s.stop()
        for p in s.all_procs():
            print(f"--- {p.name} ---\n{p.tail(20)}")


def start_timeout() -> float:
    return float(os.environ.get("LLMSERVE_ENGINE_START_TIMEOUT_S", "1200"))


@dataclass
class Streamed:
    status: int = 0
    first_token_s: float | None = None
    total_s: float = 0.0
    text: str = ""
    events: list[str] = field(default_factory=list)
    retry_after: str | None = None
    body: str = ""


async def ask(client: httpx.AsyncClient, model: str) -> Streamed:
    out = Streamed()
    t0 = time.monotonic()
    async with client.stream("POST", "/v1/chat/completions",
                             json={"model": model, **QUESTION}) as resp:
        out.status = resp.status_code
        out.retry_after = resp.headers.get("retry-after")
        if resp.status_code != 200:
            out.body = (await resp.aread()).decode()
        else:
            async for line in resp.aiter_lines():
                if not line.startswith("data: "):
                    continue
                out.events.append(line)
                if line == "data: [DONE]":
                    continue
                for choice in json.loads(line[6:]).get("choices", []):
                    content = choice.get("delta", {}).get("content")
                    if content:
                        if out.first_token_s is None:
                            out.first_token_s = time.monotonic() - t0
                        out.text += content
    out.total_s = time.monotonic() - t0
    return out


def demand(s: LocalStack, model: str) -> float | None:
    return pool_gauge(s.gateway_url, "llmserve_pool_demand", model)


@pytest.mark.engine
async def test_a_pool_at_zero_wakes_and_serves_every_waiting_stream(
    cold: LocalStack, model_name: str
) -> None:
    assert demand(cold, model_name) == 0
    async with loopback.async_client(base_url=cold.gateway_url,
                                 timeout=start_timeout() + 120) as client:
        # The models list has the pool at zero replicas: clients see the model, not a 404.
        listed = (await client.get("/v1/models")).json()["data"]
        assert [(m["id"], m["llmserve"]["replicas"]) for m in listed] == [(model_name, 0)]

        def scale(n: int) -> None:
            cold.start_workers()  # Proc objects: returns at once, the engine starts meanwhile

        with Autoscaler(cold.gateway_url, model_name, scale, target=TARGET, poll_s=0.2) as auto:
            sent = auto.now()
            results = await asyncio.gather(*(ask(client, model_name) for _ in range(8)))
        seen = auto.first_seen(8)

    assert [r.status for r in results] == [200] * 8, [r.body for r in results]
    for r in results:
        assert r.events[-1] == "data: [DONE]" and not any('"error"' in e for e in r.events)
        assert "Paris" in r.text, r.text
    # The signal showed all eight within a second of their arrival, and it started the worker.
    assert seen is not None and seen - sent <= 1.0, auto.samples[:20]
    assert [n for _, n in auto.decisions] == [1]
    # Served, the signal is back to zero.
    deadline = time.monotonic() + 5
    while demand(cold, model_name) != 0:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)
    ttft = sorted(r.first_token_s or 0.0 for r in results)
    print(f"\ncold start: signal saw 8 after {seen - sent:.2f} s; worker started at "
          f"{auto.decisions[0][0] - sent:.2f} s; TTFT min {ttft[0]:.1f} s, median "
          f"{statistics.median(ttft):.1f} s, max {ttft[-1]:.1f} s")


@pytest.mark.slow
async def test_past_the_wake_budget_every_stream_gets_503_and_none_hangs(
    real_model_dir: Path, tmp_path: Path
) -> None:
    """The worker never starts (no engine): every stream ends at the budget in 503 with
    Retry-After and OpenAI's error shape."""
    budget = 3.0
    s = LocalStack(real_model_dir, workers=1, gateway_port=free_port(),
                   worker_base_port=free_port(), log_dir=tmp_path,
                   gateway_args=pools_arg(real_model_dir.name, budget))
    try:
        s.start_gateway()
        s.wait_gateway(timeout_s=60)
        async with loopback.async_client(base_url=s.gateway_url, timeout=60) as client:
            results = await asyncio.gather(*(ask(client, real_model_dir.name) for _ in range(8)))
        assert demand(s, real_model_dir.name) == 0
    finally:
        s.stop()
    for r in results:
        assert r.status == 503 and r.retry_after == "3", r
        err = json.loads(r.body)["error"]
        assert set(err) == {"message", "type", "param", "code"}
        assert err["code"] == "model_waking"
        assert budget <= r.total_s < budget + 1.5  # none hangs past the budget
    ends = sorted(r.total_s for r in results)
    print(f"\nwake budget {budget:.0f} s, no worker: 8 x 503 model_waking after "
          f"{ends[0]:.2f}-{ends[-1]:.2f} s")


@dataclass
class Samples:
    t: list[float] = field(default_factory=list)
    demand: list[float] = field(default_factory=list)
    queued: list[float] = field(default_factory=list)
    admitted: list[float] = field(default_factory=list)
    limit: list[float] = field(default_factory=list)
    waiting: list[float] = field(default_factory=list)
    running: list[float] = field(default_factory=list)


def sample(s: LocalStack, model: str, out: Samples, stop: threading.Event, t0: float) -> None:
    """What KEDA would read from the gateway beside what the engine reports, every 0.25 s."""
    pool = f'{{pool="{model}"}}'
    while not stop.is_set():
        gateway, engine = scrape(s.gateway_url), scrape(s.worker_urls[0])
        out.t.append(time.monotonic() - t0)
        out.demand.append(gateway.get("llmserve_pool_demand" + pool, 0.0))
        out.queued.append(gateway.get("llmserve_queue_depth" + pool, 0.0))
        out.admitted.append(gateway.get("llmserve_admitted_in_flight" + pool, 0.0))
        out.limit.append(gateway.get("llmserve_concurrency_limit" + pool, 0.0))
        out.waiting.append(metric_sum(engine, "vllm:num_requests_waiting"))
        out.running.append(metric_sum(engine, "vllm:num_requests_running"))
        stop.wait(0.25)


def med(values: list[float], idx: list[int]) -> float:
    return statistics.median(values[i] for i in idx)


@pytest.mark.engine
async def test_the_signal_rises_under_a_step_while_the_engine_queue_stays_low(
    cold: LocalStack, model_name: str
) -> None:
    if not cold.worker_procs:  # the cold-start test did not run: start the worker here
        cold.start_workers()
    cold.wait_workers(timeout_s=start_timeout())
    deadline = time.monotonic() + 60
    while pool_gauge(cold.gateway_url, "llmserve_pool_ready_replicas", model_name) != 1:
        assert time.monotonic() < deadline, "the gateway never routed to the worker"
        await asyncio.sleep(0.2)

    clients, step_s = 32, 15.0
    body = {"model": model_name, "prompt": "Count slowly:", "max_tokens": 64,
            "ignore_eos": True, "stream": True}
    statuses: list[int] = []
    refusals: Counter[str] = Counter()

    async def client_loop(c: httpx.AsyncClient, until: float) -> None:
        while time.monotonic() < until:
            async with c.stream("POST", "/v1/completions", json=body) as resp:
                raw = await resp.aread()
                statuses.append(resp.status_code)
                if resp.status_code != 200:
                    refusals[json.loads(raw)["error"]["code"]] += 1

    out, stop = Samples(), threading.Event()
    t0 = time.monotonic()
    sampler = threading.Thread(target=sample, args=(cold, model_name, out, stop, t0))
    sampler.start()
    try:
        await asyncio.sleep(1.0)  # the idle baseline
        step = time.monotonic() - t0
        async with loopback.async_client(base_url=cold.gateway_url, timeout=120,
                                     limits=httpx.Limits(max_connections=clients)) as c:
            until = time.monotonic() + step_s
            await asyncio.gather(*(client_loop(c, until) for _ in range(clients)))
    finally:
        stop.set()
        sampler.join(10)

    during = [i for i, t in enumerate(out.t) if step + 2.0 <= t <= step + step_s]
    above = next((t for t, d in zip(out.t, out.demand, strict=True) if t >= step and d > TARGET),
                 None)
    assert above is not None and above - step <= 3.0, list(zip(out.t, out.demand, strict=True))
    demand_during = [out.demand[i] for i in during]
    waiting_during = [out.waiting[i] for i in during]
    assert min(demand_during) > TARGET
    # The engine's own queue stays low: it would have told an autoscaler nothing.
    assert max(waiting_during) <= 2, waiting_during
    # What did not get in was refused at the door (overloaded), as from any running pool.
    assert statuses.count(200) > 0 and set(refusals) <= {"overloaded"}, refusals
    print(f"\nstep of {clients} streams on 1 replica (target {TARGET} per replica): signal above "
          f"target {above - step:.2f} s after the step; medians from 2 s after it: demand "
          f"{med(out.demand, during):.0f} (min {min(demand_during):.0f}, max "
          f"{max(demand_during):.0f}) = {med(out.admitted, during):.0f} admitted + "
          f"{med(out.queued, during):.0f} queued, limit {med(out.limit, during):.0f}; "
          f"vllm:num_requests_running {med(out.running, during):.0f}, "
          f"vllm:num_requests_waiting max {max(waiting_during):.0f}; "
          f"{statuses.count(200)} streams 200, refused: {dict(refusals)}")
