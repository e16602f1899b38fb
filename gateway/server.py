"""Gateway lifecycle, in the order it happens (modelled on uvicorn's server.py).

1. Start-up: settings are validated before anything binds; the app's lifespan starts discovery and
   health probing.
2. Readiness: /ready answers 200 once at least one replica passed its probe.
3. Drain on SIGTERM: /ready turns 503 at once, so Kubernetes stops sending new traffic, and
   in-flight requests (streams included) get up to `drain_timeout_s` (unset: `timeouts.total_s`)
   to finish.
4. Drain expiry: whatever is still running after `drain_timeout_s` is ended by the gateway itself
   (gateway/api/inflight.py): a queued or unanswered request gets a 503, an open stream one in-band
   error event, then each closes. uvicorn's own cancel, which would cut streams silently and log a
   traceback per task, only backs this up a moment later.
5. Shutdown: the lifespan stops probing and closes upstream connections.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import math
import socket
from types import FrameType
from typing import cast

import uvicorn
from starlette.types import ASGIApp
from uvicorn.server import ServerState

from gateway.api.deps import ProxyDeps
from gateway.app import build_app
from gateway.edge import Edge, EdgeProtocol, QuietRequests, check_fd_limit, open_probe_listener
from gateway.settings import GatewaySettings

log = logging.getLogger("gateway")

# Allocations between young collections (CPython's default is 700).
_GC_GEN0 = 20_000

# uvicorn's own cancel backs up the gateway's drain expiry (a loop turn or two) this much later.
_BACKSTOP_S = 1


def run(settings: GatewaySettings) -> None:
    """Start-up: the app and its edge are built from validated settings, then uvicorn serves them
    until a signal (_DrainingServer below has the rest of the lifecycle)."""
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    app = build_app(settings)
    state = app.state
    edge = Edge(settings.edge, state.metrics)
    check_fd_limit(settings.edge)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        # Said, not guessed: GatewayApp's __call__ is not a coroutine function (gateway/app.py).
        interface="asgi3",
        # httptools, with the edge's caps and deadlines (gateway/edge/).
        http=EdgeProtocol.bound(edge),
        # No WebSocket endpoints: a request with an Upgrade header is served as plain HTTP, under
        # the edge's caps and deadlines (EdgeProtocol has how), and QuietRequests keeps
        # uvicorn's warnings for it from becoming a line per request.
        ws="none",
        lifespan="on",
        access_log=False,  # a log line per request would cost more than the proxying
        log_level=settings.log_level,
        timeout_graceful_shutdown=math.ceil(settings.drain_s) + _BACKSTOP_S,
        timeout_keep_alive=75,
        backlog=4096,
        proxy_headers=False,  # nothing here uses the client address
    )
    # After Config set logging up: uvicorn's per-request warnings, once per 10 s at most.
    logging.getLogger("uvicorn.error").addFilter(QuietRequests())
    # Requests make no reference cycles (tests/gateway/test_server.py), so the start-up objects
    # are frozen out of the older collections and young ones run rarely; a cycle per request
    # would make the process grow between full collections.
    gc.freeze()
    gc.set_threshold(_GC_GEN0, 20, 20)
    # Both ports bound before uvicorn starts, so that a port in use is one line naming the
    # setting (ListenError), before any start-up work or log line.
    api = listen_socket(settings.host, settings.port, "GATEWAY_PORT")
    probe_port = settings.edge.probe_port
    probe = (listen_socket(settings.host, probe_port, "GATEWAY_EDGE__PROBE_PORT")
             if probe_port is not None else None)
    server = _DrainingServer(config, state, edge, probe)
    state.metrics.connections_open.set_function(lambda: len(server.server_state.connections))
    # uvicorn's set of running request tasks: a request counts from its head to its response's end.
    state.metrics.in_flight.set_function(lambda: len(server.server_state.tasks))
    server.run(sockets=[api])


class ListenError(OSError):
    """A port the gateway cannot listen on; the message names the setting."""


def listen_socket(host: str, port: int, setting: str) -> socket.socket:
    """A TCP socket bound to (host, port) as uvicorn binds one (SO_REUSEADDR), not listening
    yet; ListenError when the address is in use or not this machine's."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ListenError(
            f"{setting}={port}: cannot listen on {host}:{port} ({exc.strerror or exc})") from None
    return sock


class _DrainingServer(uvicorn.Server):
    """uvicorn's server with the probe listener and the drain. Its own state has class-private
    names, so that no attribute a later uvicorn adds can collide with it."""

    def __init__(self, config: uvicorn.Config, state: ProxyDeps, edge: Edge | None = None,
                 probe_socket: socket.socket | None = None) -> None:
        super().__init__(config)
        self.__state = state
        self.__edge = edge
        self.__probe_socket = probe_socket
        self.__probe: tuple[asyncio.Server, ServerState] | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        # The probes' own listener (gateway/edge/probe.py), on the socket run() bound; it
        # serves once uvicorn's does.
        if self.__edge is not None and self.__probe_socket is not None:
            self.__probe = await open_probe_listener(
                self.config, self.__edge, cast(ASGIApp, self.config.loaded_app),
                self.__probe_socket)
        await super().startup(sockets)
        if self.__probe is not None and self.started:
            await self.__probe[0].start_serving()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Step 3: flip readiness before uvicorn stops accepting and waits for in-flight requests.
        if not self.__state.draining:
            log.info("signal %s: draining for up to %ss", sig, self.__state.settings.drain_s)
        self.__state.draining = True
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # Step 4: at the drain timeout, end what is still open before uvicorn cuts it.
        expiry = asyncio.get_running_loop().call_later(
            self.__state.settings.drain_s, self.__expire)
        try:
            await super().shutdown(sockets)
        finally:
            expiry.cancel()
        # Step 5: the probe listener outlived the drain (/ready 503, /health 200); now it closes.
        if self.__probe is not None:
            server, state = self.__probe
            server.close()
            for connection in list(state.connections):
                connection.shutdown()

    def __expire(self) -> None:
        n = self.__state.inflight.expire()
        if n:
            log.warning("drain timeout (%ss) expired: ending %d open request(s) with an error",
                        self.__state.settings.drain_s, n)
