"""The probes' own listener: /health, /ready and /metrics on a port of their own, so that they get
through a flood of the API port, and answer through the drain (/ready 503, /health 200).
"""

from __future__ import annotations

import asyncio
import socket

from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.config import Config
from uvicorn.server import ServerState

from gateway.edge.limits import Edge
from gateway.edge.protocol import EdgeProtocol
from gateway.errors import NotFound, send_error

PROBE_PATHS = frozenset({"/health", "/ready", "/metrics"})


async def open_probe_listener(config: Config, edge: Edge, app: ASGIApp, sock: socket.socket,
                              ) -> tuple[asyncio.Server, ServerState]:
    """Listen on `sock` (bound to `edge.settings.probe_port` on the API listener's host) with
    the edge's limits; it serves once `start_serving()` is called. Returns the server and its
    connection set, for the shutdown to close after the drain."""

    async def probes_only(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in PROBE_PATHS:
            await send_error(send, NotFound("the probe port serves /health, /ready and /metrics"))
            return
        await app(scope, receive, send)

    # The API listener's settings, serving the probes: protocols read their app from their config
    # (and an Upgrade header is served as plain HTTP on both: no WebSocket protocol).
    probe = Config(probes_only, interface="asgi3", lifespan="off", log_config=None,
                   proxy_headers=False, timeout_keep_alive=config.timeout_keep_alive, ws=config.ws)
    state = ServerState()
    protocol = EdgeProtocol.bound(edge)

    def factory() -> asyncio.Protocol:
        # No lifespan state: the gateway keeps its own in the app.
        return protocol(config=probe, server_state=state, app_state={})

    server = await asyncio.get_running_loop().create_server(
        factory, sock=sock, backlog=config.backlog, start_serving=False)
    return server, state
