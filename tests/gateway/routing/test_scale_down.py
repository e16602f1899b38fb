"""Scale-down loses nothing, on the gateway's side: a replica that leaves discovery (its endpoint
turned not-ready when its pod began terminating) takes no new request from that update on, while
the streams it is serving run to their end. When the last replica of a pool that may scale to zero
leaves, new requests wait for the next one instead of failing.

Discovery is pushed by the test through the gateway's own discovery seam (what Kubernetes
EndpointSlices or DNS would say); the replicas are fake upstreams, the gateway is real."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncGenerator, Iterator
from pathlib import Path

import httpx
import pytest

from gateway.routing import factory
from gateway.settings import GatewaySettings, PoolLayout
from tests import loopback
from tests.autoscaler import pool_gauge
from tests.gateway.conftest import UpstreamFactory, run_gateway, url_of, write_keys
from tests.gateway.lora_upstream import LoraReplica, serve
from tests.waiting import wait_for

STREAM = {"model": "demo", "prompt": "hi", "max_tokens": 20, "stream": True}


class PushedDiscovery:
    """Backend sets put by the test thread, read by the gateway's loop."""

    def __init__(self, *urls: str) -> None:
        self._first = frozenset(urls)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[frozenset[str]] | None = None
        self._ready = threading.Event()

    async def updates(self) -> AsyncGenerator[frozenset[str], None]:
        self._loop = asyncio.get_running_loop()
        self._queue = asyncio.Queue()
        self._ready.set()
        yield self._first
        while True:
            yield await self._queue.get()

    def put(self, *urls: str) -> None:
        assert self._ready.wait(5)
        assert self._loop is not None and self._queue is not None
        self._loop.call_soon_threadsafe(self._queue.put_nowait, frozenset(urls))


@pytest.fixture
def discovery(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[PushedDiscovery]]:
    """The next gateway built gets the discovery the test appends here."""
    made: list[PushedDiscovery] = []

    def build(_: GatewaySettings) -> PushedDiscovery:
        return made[-1]

    monkeypatch.setattr(factory, "build_discovery", build)
    yield made


def up(gw_url: str, backend: str) -> bool:
    text = loopback.get(gw_url + "/metrics").text
    return f'llmserve_backend_up{{backend="{backend}"}} 1.0' in text


def stream_in_background(gw_url: str) -> tuple[threading.Thread, list[str], threading.Event]:
    out: list[str] = []
    first = threading.Event()

    def run() -> None:
        with loopback.stream("POST", gw_url + "/v1/completions", json=STREAM, timeout=30) as r:
            out.append(str(r.status_code))
            for chunk in r.iter_text():
                out.append(chunk)
                first.set()

    t = threading.Thread(target=run)
    t.start()
    return t, out, first


def test_a_replica_leaving_finishes_its_streams_and_takes_no_new_request(
    upstreams: UpstreamFactory, discovery: list[PushedDiscovery]
) -> None:
    a = upstreams(token_delay_s=0.05)  # a 20-token stream takes about a second
    b = upstreams()
    discovery.append(PushedDiscovery(url_of(a)))
    with run_gateway(backends=[], expect_ready=False, routing_policy="least_outstanding") as gw:
        wait_for(lambda: up(gw.url, url_of(a)))
        reader, out, first = stream_in_background(gw.url)
        assert first.wait(5)
        discovery[0].put(url_of(a), url_of(b))
        wait_for(lambda: up(gw.url, url_of(b)))
        discovery[0].put(url_of(b))  # a's pod terminates: its endpoint is no longer ready
        wait_for(lambda: f'backend="{url_of(a)}"' not in loopback.get(gw.url + "/metrics").text)
        for _ in range(5):
            r = loopback.post(gw.url + "/v1/completions", json={**STREAM, "stream": False})
            assert r.status_code == 200
        reader.join(10)
        assert out[0] == "200" and "".join(out[1:]).endswith("data: [DONE]\n\n")
        assert (a.completions, a.aborted, b.completions) == (1, 0, 5)


def test_the_last_replica_of_a_pool_at_zero_leaving_makes_new_requests_wait(
    upstreams: UpstreamFactory, discovery: list[PushedDiscovery]
) -> None:
    a = upstreams(token_delay_s=0.05)
    discovery.append(PushedDiscovery(url_of(a)))
    pools = [PoolLayout(name="p", model="demo", scale_to_zero=True, wake_budget_s=30)]
    with run_gateway(backends=[], pools=pools, expect_ready=False) as gw:
        wait_for(lambda: up(gw.url, url_of(a)))
        reader, out, first = stream_in_background(gw.url)
        assert first.wait(5)
        discovery[0].put()  # scaled to zero under a stream
        late, late_out, _ = stream_in_background(gw.url)
        wait_for(lambda: pool_gauge(gw.url, "llmserve_pool_demand", "demo") == 2)
        reader.join(10)
        assert out[0] == "200" and "".join(out[1:]).endswith("data: [DONE]\n\n")
        # The late one waits. The first request's slot is released once the proxy has read the
        # upstream's chunked terminator, which may come after the client has [DONE].
        wait_for(lambda: pool_gauge(gw.url, "llmserve_pool_demand", "demo") == 1)
        assert not late_out  # still waiting: nothing sent
        discovery[0].put(url_of(a))  # a replica again
        late.join(10)
        assert late_out[0] == "200" and "".join(late_out[1:]).endswith("data: [DONE]\n\n")
        assert a.aborted == 0


def test_an_adapters_requests_at_zero_keep_the_per_key_limits(
    discovery: list[PushedDiscovery], tmp_path: Path
) -> None:
    """Once the last replica has left discovery no replica lists the adapter, but it is still
    known by its base: a key over its rate hears 429 at once, as for the base model (before: the
    adapter's requests skipped the per-key limits and admission), and the one within its rate is
    served by the next replica, which the gateway gives the adapter first."""
    key, admin = "sk-at-zero", "admin-key-0123456789"
    keys = write_keys(tmp_path, {key: {"tenant": "t", "rpm": 2}})
    auth = {"authorization": f"Bearer {key}"}
    chat = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
    pools = [PoolLayout(name="p", model="demo", scale_to_zero=True, wake_budget_s=30)]
    with serve(LoraReplica("r0", base="demo"), LoraReplica("r1", base="demo")) as (r0, r1):
        discovery.append(PushedDiscovery(r0.url))
        with run_gateway(backends=[], pools=pools, expect_ready=False, api_keys_file=keys,
                         admin_key=admin, lora={"max_loras": {"demo": 2}}) as gw:
            wait_for(lambda: up(gw.url, r0.url))
            added = loopback.post(gw.url + "/admin/adapters", json={
                "name": "chat", "base": "demo", "path": "/models/adapters/chat/v1"},
                headers={"authorization": f"Bearer {admin}"})
            assert added.status_code == 200, added.text
            assert loopback.post(gw.url + "/v1/chat/completions", json=chat,
                                 headers=auth).status_code == 200
            discovery[0].put()  # scaled to zero
            wait_for(lambda: pool_gauge(gw.url, "llmserve_pool_ready_replicas", "demo") == 0)
            waiting: list[httpx.Response] = []
            waiter = threading.Thread(target=lambda: waiting.append(loopback.post(
                gw.url + "/v1/chat/completions", json=chat, headers=auth, timeout=30)))
            waiter.start()
            wait_for(lambda: pool_gauge(gw.url, "llmserve_pool_demand", "demo") == 1)
            t0 = time.monotonic()
            over = loopback.post(gw.url + "/v1/chat/completions", json=chat, headers=auth,
                                 timeout=30)
            # At once, not after the wake (budget 30 s); seconds left for a loaded machine.
            assert over.status_code == 429 and time.monotonic() - t0 < 10, over.text
            discovery[0].put(r1.url)  # a new replica, without the adapter
            waiter.join(10)
        assert waiting[0].status_code == 200, waiting[0].text
        assert waiting[0].json()["choices"][0]["message"]["content"] == "chat@r1"
