"""Scale from zero through a real gateway: requests for a pool with no replica wait, counted in the
scaling signal, and are served when a replica comes up; past the wake budget they get a 503 with
Retry-After. The replica is the fake upstream, started later by tests/autoscaler.py, which reads
the gateway's signal as KEDA would."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from bench.fake_upstream import start_fake_upstream
from gateway.settings import PoolLayout
from tests import loopback
from tests.autoscaler import Autoscaler, pool_gauge, sample_value
from tests.gateway.conftest import RunningGateway, run_gateway, write_keys
from tests.gateway.lora_upstream import LoraReplica, answered_by_a_new_replica, serve
from tests.openai_error import openai_error
from tests.ports import free_port
from tests.waiting import wait_for

MODEL = "demo"
STREAM = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
          "stream": True}


def asleep_pool(budget_s: float) -> list[PoolLayout]:
    return [PoolLayout(name="p", model=MODEL, scale_to_zero=True, wake_budget_s=budget_s)]


@contextlib.contextmanager
def gateway_at_zero(budget_s: float, **settings: Any) -> Iterator[tuple[RunningGateway, int]]:
    """A gateway whose one backend (a free port: nothing listens yet) serves a pool declared
    scalable to zero."""
    port = free_port()
    with run_gateway(backends=[f"http://127.0.0.1:{port}"], pools=asleep_pool(budget_s),
                     expect_ready=False, **settings) as gw:
        yield gw, port


def demand(gw: RunningGateway) -> float | None:
    return pool_gauge(gw.url, "llmserve_pool_demand", MODEL)


async def stream(client: httpx.AsyncClient, headers: dict[str, str] | None = None
                 ) -> tuple[int, str, httpx.Headers]:
    async with client.stream("POST", "/v1/chat/completions", json=STREAM,
                             headers=headers) as resp:
        return resp.status_code, (await resp.aread()).decode(), resp.headers


async def test_requests_wait_counted_in_the_signal_and_are_served_when_a_replica_comes() -> None:
    with contextlib.ExitStack() as replicas, gateway_at_zero(30) as (gw, port):
        def scale(n: int) -> None:
            replicas.enter_context(start_fake_upstream(port=port, model=MODEL, tokens=4))

        async with loopback.async_client(base_url=gw.url, timeout=30) as client:
            # Listed and ready with no replica: the model is known, the gateway takes its
            # requests.
            models = (await client.get("/v1/models")).json()["data"]
            assert [(m["id"], m["llmserve"]["replicas"]) for m in models] == [(MODEL, 0)]
            assert (await client.get("/ready")).status_code == 200
            assert demand(gw) == 0
            assert pool_gauge(gw.url, "llmserve_pool_ready_replicas", MODEL) == 0
            with Autoscaler(gw.url, MODEL, scale, target=4, poll_s=0.05) as scaler:
                # The autoscaler starts the replica on the first poll that sees demand, which may
                # come before all eight are in; they wait either way.
                results = await asyncio.gather(*(stream(client) for _ in range(8)))
        assert [status for status, _, _ in results] == [200] * 8, results
        assert all(body.rstrip().endswith("data: [DONE]") for _, body, _ in results)
        assert scaler.decisions and scaler.decisions[0][1] == 1
        seen = scaler.first_seen(1)
        assert seen is not None and seen <= scaler.decisions[0][0]
        assert demand(gw) == 0
        assert pool_gauge(gw.url, "llmserve_pool_ready_replicas", MODEL) == 1


async def test_every_waiter_shows_in_the_signal() -> None:
    # How soon, on the real engine: tests/e2e/test_autoscaling.py (within a second).
    with contextlib.ExitStack() as replicas, gateway_at_zero(30) as (gw, port):
        async with loopback.async_client(base_url=gw.url, timeout=30) as client:
            tasks = [asyncio.create_task(stream(client)) for _ in range(8)]
            await asyncio.to_thread(wait_for, lambda: demand(gw) == 8)
            replicas.enter_context(start_fake_upstream(port=port, model=MODEL, tokens=4))
            results = await asyncio.gather(*tasks)
        assert [status for status, _, _ in results] == [200] * 8
        assert demand(gw) == 0


async def test_past_the_wake_budget_every_request_gets_503_with_retry_after() -> None:
    budget = 0.6
    with gateway_at_zero(budget) as (gw, _):
        async with loopback.async_client(base_url=gw.url, timeout=30) as client:
            t0 = time.monotonic()
            results = await asyncio.gather(*(stream(client) for _ in range(8)))
            elapsed = time.monotonic() - t0
        assert budget <= elapsed < budget + 1.0  # waited the budget, and not much longer
        for status, body, headers in results:
            assert status == 503
            assert headers["retry-after"] == "1"  # min(budget, 30 s), whole seconds, at least 1
            err = openai_error(body)
            assert err["code"] == "model_waking" and err["type"] == "server_error"
        assert sample_value(gw.url, "llmserve_rejections_total", pool=MODEL,
                            reason="wake_timeout") == 8
        assert demand(gw) == 0


async def test_a_client_that_leaves_while_waiting_leaves_the_signal() -> None:
    with gateway_at_zero(30) as (gw, _):
        async with loopback.async_client(base_url=gw.url, timeout=30) as client:
            task = asyncio.create_task(stream(client))
            wait_until = time.monotonic() + 2
            while demand(gw) != 1:
                assert time.monotonic() < wait_until
                await asyncio.sleep(0.02)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await asyncio.to_thread(wait_for, lambda: demand(gw) == 0)


def test_a_pool_not_declared_scalable_to_zero_keeps_the_fast_503() -> None:
    port = free_port()
    layout = [PoolLayout(name="p", model=MODEL)]  # a layout, not a scale-to-zero declaration
    with run_gateway(backends=[f"http://127.0.0.1:{port}"], pools=layout,
                     expect_ready=False) as gw:
        assert loopback.get(gw.url + "/ready").status_code == 503
        t0 = time.monotonic()
        r = loopback.post(gw.url + "/v1/chat/completions", json=STREAM, timeout=10)
        # At once: a pool taken for one at zero would wait its wake budget (300 s by default).
        # The bound leaves a loaded machine seconds for the round trip.
        assert r.status_code == 503 and time.monotonic() - t0 < 10
        assert r.json()["error"]["code"] == "service_unavailable"
        assert loopback.get(gw.url + "/v1/models").json()["data"] == []


def test_without_flow_control_the_wait_works_the_same() -> None:
    with contextlib.ExitStack() as replicas, gateway_at_zero(30, flow={"enabled": False}) as (
        gw, port
    ):
        with Autoscaler(gw.url, MODEL, lambda n: replicas.enter_context(
                start_fake_upstream(port=port, model=MODEL, tokens=4)), poll_s=0.05) as scaler:
            r = loopback.post(gw.url + "/v1/chat/completions", json={**STREAM, "stream": False},
                           timeout=30)
        assert r.status_code == 200, r.text
        assert scaler.replicas == 1


async def test_per_key_limits_refuse_before_the_wait(tmp_path: Path) -> None:
    """A key over its request rate hears 429 at once, as from a running pool; it does not wait
    for the wake, nor count in the signal."""
    key = "sk-wake-test"
    keys = write_keys(tmp_path, {key: {"tenant": "t", "rpm": 1}})
    auth = {"Authorization": f"Bearer {key}"}
    with gateway_at_zero(30, api_keys_file=keys) as (gw, port), contextlib.ExitStack() as up:
        async with loopback.async_client(base_url=gw.url, timeout=30) as client:
            first = asyncio.create_task(stream(client, auth))
            await asyncio.to_thread(wait_for, lambda: demand(gw) == 1)
            t0 = time.monotonic()
            status, body, headers = await stream(client, auth)
            # At once, not after the wake budget (30 s); seconds left for a loaded machine.
            assert status == 429 and time.monotonic() - t0 < 10, body
            assert "retry-after" in headers
            assert demand(gw) == 1
            up.enter_context(start_fake_upstream(port=port, model=MODEL, tokens=4))
            assert (await first)[0] == 200


async def test_an_adapters_requests_wait_for_the_adapter_not_only_for_its_base() -> None:
    """An adapter added at run time is loaded on a replica that joins after the replica's first
    probe: the requests that woke the pool wait for that load (before: a 404 the moment the base
    came up), and are admitted in the base's pool like any request (before: not at all)."""
    key = "admin-key-0123456789"
    auth = {"authorization": f"Bearer {key}"}
    chat = {**STREAM, "model": "chat"}
    with gateway_at_zero(30, admin_key=key, lora={"max_loras": {MODEL: 2}}) as (gw, port):
        async with loopback.async_client(base_url=gw.url, timeout=30) as client:
            with serve(LoraReplica("r0", base=MODEL, port=port)):
                await asyncio.to_thread(wait_for, lambda: pool_gauge(
                    gw.url, "llmserve_pool_ready_replicas", MODEL) == 1)
                added = await client.post("/admin/adapters", headers=auth, json={
                    "name": "chat", "base": MODEL, "path": "/models/adapters/chat/v1"})
                assert added.status_code == 200, added.text
            await asyncio.to_thread(wait_for, lambda: pool_gauge(
                gw.url, "llmserve_pool_ready_replicas", MODEL) == 0)

            async def ask(stream: bool) -> tuple[int, str]:
                resp = await client.post("/v1/chat/completions", json={**chat, "stream": stream})
                return resp.status_code, resp.text

            tasks = [asyncio.create_task(ask(stream)) for stream in (True, False)]
            await asyncio.to_thread(wait_for, lambda: demand(gw) == 2)
            # A new replica without the adapter: the gateway loads it there, then routes.
            with serve(LoraReplica("r1", base=MODEL, port=port)) as (r1,):
                results = await asyncio.gather(*tasks)
        assert [status for status, _ in results] == [200, 200], results
        assert all("chat@r1" in text for _, text in results)
        assert r1.loads == ["chat"]
        assert gw.metric(f'llmserve_queue_time_seconds_count{{pool="{MODEL}"}}') == 2
        assert demand(gw) == 0


async def test_a_fresh_gateway_knows_a_declared_adapter_and_its_request_wakes_the_pool() -> None:
    """A gateway that has never seen a replica (it restarted while the pool was parked): the
    adapter's request waits, counted in the base pool's demand, and is served by the replica that
    comes up with the adapter loaded at start (before: 404 model_not_found, demand 0, the pool
    never woke)."""
    port = free_port()
    pools = [PoolLayout(name="p", model=MODEL, scale_to_zero=True, wake_budget_s=30,
                        adapters=["chat"])]
    with run_gateway(backends=[f"http://127.0.0.1:{port}"], pools=pools,
                     expect_ready=False) as gw:
        async with loopback.async_client(base_url=gw.url, timeout=30) as client:
            task = asyncio.create_task(
                client.post("/v1/chat/completions", json={**STREAM, "model": "chat",
                                                          "stream": False}))
            await asyncio.to_thread(wait_for, lambda: demand(gw) == 1)
            await answered_by_a_new_replica(task, MODEL, port)
        assert demand(gw) == 0


async def test_a_declared_pool_without_a_replica_beside_one_at_zero_answers_503() -> None:
    """A pool not scalable to zero, declared beside one that is (as the chart renders
    GATEWAY_POOLS), before its first replica: 503 with Retry-After (not 404 "not served here"),
    and its demand series is exported at 0, so an autoscaler on it finds a metric."""
    port = free_port()
    pools = [*asleep_pool(30), PoolLayout(name="big", model="big-model")]
    with run_gateway(backends=[f"http://127.0.0.1:{port}"], pools=pools,
                     expect_ready=False) as gw:
        r = loopback.post(gw.url + "/v1/chat/completions", json={**STREAM, "model": "big-model"},
                          timeout=10)
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "service_unavailable"
        assert int(r.headers["retry-after"]) >= 1
        assert pool_gauge(gw.url, "llmserve_pool_demand", "big-model") == 0
        assert pool_gauge(gw.url, "llmserve_pool_ready_replicas", "big-model") == 0
        # A name no pool declares is still unknown.
        r = loopback.post(gw.url + "/v1/chat/completions", json={**STREAM, "model": "nope"},
                          timeout=10)
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
