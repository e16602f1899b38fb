"""Assemble the gateway: transport, router, metrics, endpoints, middleware, lifespan."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI
from starlette.routing import Route

from gateway.api.middleware import BodyLimitMiddleware, InFlightMiddleware, RequestIdMiddleware
from gateway.api.proxy import ProxyDeps, ProxyEndpoint
from gateway.api.routes import build_routes
from gateway.errors import install_handlers
from gateway.metrics import GatewayMetrics
from gateway.routing.factory import build_router
from gateway.routing.router import Router
from gateway.settings import GatewaySettings
from gateway.transport.aiohttp_transport import AiohttpTransport
from gateway.transport.base import Transport
from gateway.transport.prober import HttpProber


@dataclass
class GatewayState:
    settings: GatewaySettings
    transport: Transport
    router: Router
    metrics: GatewayMetrics
    draining: bool = field(default=False)


def build_app(
    settings: GatewaySettings,
    *,
    transport: Transport | None = None,
    router: Router | None = None,
) -> FastAPI:
    transport = transport or AiohttpTransport(settings.timeouts)
    # Probes share the connect deadline: a replica that cannot accept a connection that fast is
    # not one we want to route to.
    prober = HttpProber(transport, timeout_s=max(settings.timeouts.connect_s, 1.0))
    router = router or build_router(settings, prober)
    state = GatewayState(settings, transport, router, GatewayMetrics())

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # Start-up: discovery and health probing begin; /ready turns 200 once a replica answers.
        await router.start()
        try:
            yield
        finally:
            # Shutdown: uvicorn has already drained in-flight requests (bounded by the drain
            # timeout); stop probing and close pooled upstream connections.
            await router.stop()
            await transport.close()

    app = FastAPI(title="llmserve gateway", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.gateway = state
    install_handlers(app)

    deps = ProxyDeps(settings, router, transport, state.metrics)
    app.router.routes.append(
        Route("/v1/chat/completions", ProxyEndpoint(deps, "/v1/chat/completions", "chat"),
              methods=["POST"])
    )
    app.router.routes.append(
        Route("/v1/completions", ProxyEndpoint(deps, "/v1/completions", "completion"),
              methods=["POST"])
    )
    app.include_router(
        build_routes(router, state.metrics, lambda: state.draining, settings.health_interval_s)
    )

    # Outermost first at request time: in-flight gauge, request id, then the body limit.
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    app.add_middleware(RequestIdMiddleware)
    app.add_middleware(InFlightMiddleware, metrics=state.metrics)
    return app
