"""EPP mode's process: the gateway's scheduler (gateway/app.py's Core) served over gRPC as
Envoy's ext_proc service, with the gRPC health service, and /metrics over HTTP.

Health, as the endpoint picker protocol asks: `liveness` (and the server's overall "") answer
SERVING while the process runs; `readiness` and `envoy.service.ext_proc.v3.ExternalProcessor`
answer SERVING while a replica is available to route to (the gateway's own /ready), NOT_SERVING
before and from SIGTERM on. On SIGTERM open streams get `drain_timeout_s` (unset:
`timeouts.total_s`) to end.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
from envoy.service.ext_proc.v3 import (  # type: ignore[import-untyped]
    external_processor_pb2_grpc as pb_grpc,
)
from grpc_health.v1 import _async as health_aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import start_http_server

from gateway.app import Core
from gateway.epp.exchange import Exchange
from gateway.epp.picker import Picker
from gateway.settings import GatewaySettings

log = logging.getLogger("gateway.epp")

EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
LIVENESS = ("", "liveness")
READINESS = ("readiness", EXT_PROC_SERVICE)
_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class ExtProc(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    """The ext_proc service: each stream is one Exchange."""

    def __init__(self, core: Core, picker: Picker) -> None:
        self._core = core
        self._picker = picker
        settings = core.state.settings
        self._epp = settings.epp
        flow = core.state.flow
        self._clock = flow.clock if flow is not None else time.monotonic

    async def Process(self, requests: AsyncIterator[Any],  # the gRPC method's name
                      context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
        exchange = Exchange(self._core.state, self._picker, self._epp, self._clock)
        async for answer in exchange.run(requests):
            yield answer


class EppServer:
    """The gRPC server and the scheduler behind it, started and stopped together."""

    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings
        self.core = Core(settings)
        self.health = health_aio.HealthServicer()
        self.server = grpc.aio.server(options=[
            # Envoy keeps its ext_proc connection open; answer its keepalive pings.
            ("grpc.http2.min_ping_interval_without_data_ms", 5000),
            ("grpc.keepalive_permit_without_calls", 1),
        ])
        pb_grpc.add_ExternalProcessorServicer_to_server(
            ExtProc(self.core, Picker(self.core.state, self.core.keys)), self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.port = self.server.add_insecure_port(f"{settings.host}:{settings.epp.port}")
        self._ready: bool | None = None
        self._readiness: asyncio.Task[None] | None = None

    async def start(self) -> None:
        for name in LIVENESS:
            await self.health.set(name, _SERVING)
        await self._set_ready(False)
        await self.core.start()
        await self.server.start()
        self._readiness = asyncio.create_task(self._follow_readiness())
        log.info("endpoint picker serving ext_proc on %s:%d", self.settings.host, self.port)

    async def _set_ready(self, ready: bool) -> None:
        if ready == self._ready:
            return
        self._ready = ready
        for name in READINESS:
            await self.health.set(name, _SERVING if ready else _NOT_SERVING)

    async def _follow_readiness(self) -> None:
        router = self.core.state.router
        while True:
            await self._set_ready(router.ready() and not self.core.state.draining)
            await asyncio.sleep(min(self.settings.health_interval_s, 0.5))

    async def stop(self) -> None:
        """Not ready at once, open streams get `drain_timeout_s`, then the scheduler stops."""
        self.core.state.draining = True
        if self._readiness is not None:
            self._readiness.cancel()
        await self._set_ready(False)
        await self.server.stop(self.settings.drain_s)
        await self.core.stop()


async def serve(settings: GatewaySettings) -> None:
    """Run until SIGTERM or SIGINT."""
    server = EppServer(settings)
    metrics_port = settings.epp.metrics_port
    if metrics_port is not None:
        start_http_server(metrics_port, settings.host, registry=server.core.state.metrics.registry)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("signal: draining for up to %ss", settings.drain_s)
    await server.stop()


def run(settings: GatewaySettings) -> None:
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    asyncio.run(serve(settings))
