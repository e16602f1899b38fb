"""Assemble the gateway: transport, router, metrics, endpoints, middleware, lifespan."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from starlette.datastructures import URL
from starlette.responses import RedirectResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.api.admin import AdminAuthMiddleware, build_admin_routes
from gateway.api.auth import AuthMiddleware
from gateway.api.batched import build_batcher
from gateway.api.deps import ProxyDeps
from gateway.api.endpoints import ENDPOINTS, Endpoint, match
from gateway.api.middleware import BodyLimitMiddleware, RequestIdMiddleware
from gateway.api.openapi import openapi_schema
from gateway.api.proxy import ProxyEndpoint
from gateway.api.responses import ResponsePins
from gateway.api.routes import build_routes
from gateway.errors import MethodNotAllowed, install_handlers, send_error
from gateway.flow.admission import Admission
from gateway.flow.demand import Demand
from gateway.flow.keys import load_keys
from gateway.flow.pressure import PressureWatch
from gateway.metrics import AdapterView, GatewayMetrics, KvView
from gateway.routing.adapters import Adapters
from gateway.routing.factory import build_router, uses_kv_events
from gateway.routing.residency import Residency
from gateway.routing.responses import ResponseHomes
from gateway.routing.wake import WakeGate
from gateway.settings import (
    GatewaySettings,
    declared_adapters,
    layouts_by_model,
    wake_budgets,
)
from gateway.transport.h1 import H1Transport
from gateway.transport.prober import HttpProber, ModelCard

log = logging.getLogger("gateway")


async def every(period_s: float, step: Callable[[], Awaitable[object]], what: str) -> None:
    """Run `step` every `period_s` until cancelled; a failure (a bug) is logged, not fatal."""
    while True:
        try:
            await step()
        except Exception:
            log.exception("%s failed", what)
        await asyncio.sleep(period_s)


class FastLane:
    """The engine endpoints (api/endpoints.py) go straight to the proxy; the rest to FastAPI,
    whose three wrappers of `send` would run once per SSE event and add nothing on this path (the
    proxy owns its error handling)."""

    def __init__(self, app: ASGIApp, deps: ProxyDeps) -> None:
        self.app = app
        # path -> (methods, their endpoint)
        self.endpoints: dict[str, tuple[tuple[str, ...], ProxyEndpoint]] = {}
        self._patterns: dict[Endpoint, tuple[tuple[str, ...], ProxyEndpoint]] = {}
        for e in ENDPOINTS:
            entry = (e.methods, ProxyEndpoint(deps, e))
            if "{" in e.path:
                self._patterns[e] = entry
            else:
                self.endpoints[e.path] = entry

    def _serves(self, path: str) -> bool:
        return path in self.endpoints or match(path) is not None

    # Hands back the chosen app's awaitable: no frame of its own for every resume to pass through.
    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        if scope["type"] == "http":
            path = scope["path"]
            entry = self.endpoints.get(path)
            if entry is None:
                pattern = match(path)
                if pattern is not None:
                    entry = self._patterns[pattern]
                elif path.endswith("/") and self._serves(path[:-1]):
                    # As the engine (Starlette's redirect_slashes): 307 to the path without it.
                    url = URL(scope=scope).replace(path=path[:-1])
                    return RedirectResponse(str(url), status_code=307)(scope, receive, send)
            if entry is not None:
                methods, endpoint = entry
                if scope["method"] in methods:
                    return endpoint(scope, receive, send)
                # Not a 404 from the framework, which has no route here: the path exists.
                allow = ", ".join(methods)
                return send_error(send, MethodNotAllowed(
                    f"Method {scope['method']} is not allowed on {path}; use {allow}"
                ), [(b"allow", allow.encode())])
        return self.app(scope, receive, send)


class Core:
    """The scheduler both front doors share (the proxy here, the endpoint picker in
    gateway/epp/): router and discovery, admission, the wake gate, metrics, API keys, LoRA
    adapters, and the watches that keep them current off the request path."""

    def __init__(self, settings: GatewaySettings) -> None:
        transport = H1Transport(settings.timeouts)
        # LoRA adapters: what replicas list reaches the registry (through the prober) before the
        # router builds a pool for an adapter, which then routes by residency (docs/lora.md).
        adapters = Adapters(transport, settings.lora,
                            declared=declared_adapters(settings.pools))
        residency = Residency(adapters, settings.lora) if settings.lora.residency else None
        # The engines' own model cards, the latest seen per model: /v1/models relays them.
        self.engine_cards: dict[str, dict[str, Any]] = {}

        def on_cards(url: str, cards: list[ModelCard]) -> None:
            self.engine_cards.update((c.id, c.fields) for c in cards)
            adapters.observe(url, cards)

        # Probes share the connect deadline: a replica that slow to accept is not one to route to.
        prober = HttpProber(transport, max(settings.timeouts.connect_s, 1.0), on_cards=on_cards)
        # Routing on the engines' KV cache events: one subscriber per replica, following the
        # router's backends (gateway/routing/kv_events.py).
        kv_events = None
        if uses_kv_events(settings):
            from gateway.routing.kv_events import KvEvents  # the kv extra: only when used

            kv_events = KvEvents(settings.kv)
        self.kv_events = kv_events
        router = build_router(settings, prober, residency, kv_events)
        adapters.attach(router)
        metrics = GatewayMetrics()
        metrics.backends.view = router.backend_states
        metrics.upstream_connections.view = transport.connections_opened
        for layout in settings.pools:
            metrics.pool_info.labels(layout.name, layout.model, str(layout.tp), str(layout.pp),
                                     str(layout.nodes)).set(1)
        metrics.routing.view = router.routing_stats
        if kv_events is not None:
            from gateway.routing.kv_aware import kv_outcomes

            metrics.kv.view = KvView(lambda: kv_outcomes(router.policies()), kv_events.replicas,
                                     kv_events.totals)
        metrics.parent_of = adapters.parent_of
        metrics.adapters.view = AdapterView(
            adapters.served, (lambda: residency.counts) if residency else dict,
            lambda: adapters.loads)
        # Read once at start-up; a bad file raises KeyFileError naming GATEWAY_API_KEYS_FILE.
        self.keys = (load_keys(settings.api_keys_file)
                     if settings.api_keys_file is not None else None)
        admission = Admission(settings.flow, metrics) if settings.flow.enabled else None
        # Pools that may scale to zero: their requests wait for a replica (routing/wake.py), and
        # every pool's demand is the autoscalers' signal (flow/demand.py).
        budgets = wake_budgets(settings.pools)
        wake = WakeGate(budgets, router, metrics) if budgets else None
        metrics.demand.view = Demand(router, admission, wake).view
        self.adapters = adapters
        self.state = ProxyDeps(settings, router, transport, metrics, admission, wake=wake,
                               parent_of=adapters.parent_of)
        # Stored Responses API answers: later requests about them reach their replica, through
        # either front door (api/responses.py's hooks).
        self.homes = ResponseHomes(settings.responses, settings.flow)
        pins = ResponsePins(self.homes, router)
        self.state.pin, self.state.answered = pins.pin, pins.answered

        # Off the request path: run-time adapters follow replicas that restart or join;
        # admission follows the replicas' count (each pool's ceiling) and the engines' queues.
        self.watches: list[tuple[float, Callable[[], Awaitable[object]], str]] = [
            (settings.health_interval_s, adapters.reconcile, "adapter reconcile")]
        if kv_events is not None:
            events = kv_events

            async def follow_kv_events() -> None:
                events.follow(b.url for b in router.backends())

            self.watches.append((settings.health_interval_s, follow_kv_events,
                                 "following KV events"))
            # And at once when a replica comes up (the watch above also drops those that left).
            router.listen(lambda: events.follow(b.url for b in router.backends()))
        if admission is not None:
            async def follow_replicas() -> None:
                admission.set_replicas(router.replicas())

            self.watches.append((settings.health_interval_s, follow_replicas,
                                 "following replicas"))
            if settings.flow.scrape_engines:
                pressure = PressureWatch(settings.flow, admission, router.backends, transport)
                self.watches.append((settings.flow.scrape_interval_s, pressure.scrape_once,
                                     "engine pressure scrape"))
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """Discovery and health probing begin; the watches run."""
        await self.state.router.start()
        self._tasks = [asyncio.create_task(every(*w)) for w in self.watches]

    async def stop(self) -> None:
        """Stop the watches and probing, close shared limits, the batcher, the responses' map and
        upstream sockets."""
        state = self.state
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if state.flow is not None:
            await state.flow.close()
        if state.batcher is not None:
            await state.batcher.close()
        await state.router.stop()
        if self.kv_events is not None:
            await self.kv_events.close()
        await self.homes.close()
        await state.transport.close()


def build_app(settings: GatewaySettings) -> GatewayApp:
    core = Core(settings)
    state, adapters, keys = core.state, core.adapters, core.keys
    router, metrics, admission = state.router, state.metrics, state.flow

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # Start-up: discovery and health probing begin; /ready turns 200 once a replica answers.
        await core.start()
        try:
            yield
        finally:
            # Shutdown: uvicorn drained in-flight requests; stop probing, close upstream sockets.
            await core.stop()

    app = FastAPI(title="llmserve gateway", lifespan=lifespan, docs_url=None, redoc_url=None)
    # The written document (api/openapi.py): FastAPI cannot see the fast lane's endpoints.
    document = openapi_schema(app.title, app.version)
    app.openapi = lambda: document  # type: ignore[method-assign]
    install_handlers(app)

    state.batcher = build_batcher(
        settings.batch, state, admission.queued if admission is not None else lambda _: 0)
    app.include_router(
        build_routes(router, metrics, lambda: state.draining, settings.health_interval_s,
                     layouts_by_model(settings.pools), adapters.parent_of, core.engine_cards.get))
    lane = FastLane(app, state)
    # Outermost first: request id, body limit, admin auth and API-key auth (each only when
    # configured), then the lanes.
    inner: ASGIApp = lane if keys is None else AuthMiddleware(lane, keys)
    admin_digest = settings.admin_digest
    if admin_digest is not None:
        app.include_router(build_admin_routes(adapters, router))
        inner = AdminAuthMiddleware(inner, admin_digest)
    outer = RequestIdMiddleware(BodyLimitMiddleware(inner, max_bytes=settings.max_body_bytes,
                                                     discard_bytes=settings.discard_body_bytes))
    return GatewayApp(outer, app, state)


class GatewayApp:
    """The ASGI app uvicorn serves: middleware around the fast lane and the FastAPI app. Its
    `__call__` is not a coroutine function (as FastLane's), so uvicorn must be told
    `interface="asgi3"` (gateway/server.py does)."""

    def __init__(self, asgi: ASGIApp, api: FastAPI, state: ProxyDeps) -> None:
        self._asgi = asgi
        self.api = api
        self.state = state

    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        return self._asgi(scope, receive, send)
