"""The gateway's state, shared by the proxy endpoints and the server: settings, router,
transport, metrics, flow control, batcher, the wake gate of pools that may scale to zero,
the open requests and whether it drains."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from starlette.types import Scope

from gateway.api.endpoints import Endpoint
from gateway.api.inflight import InFlight
from gateway.api.schemas import ParsedRequest
from gateway.errors import RateLimitedLog
from gateway.flow.admission import Admission
from gateway.flow.batcher import Batcher
from gateway.metrics import GatewayMetrics
from gateway.routing.router import Router
from gateway.routing.wake import WakeGate
from gateway.settings import GatewaySettings
from gateway.transport import Transport

# Asked before routing a request to an endpoint marked `pinnable` (api/endpoints.py): the URL of
# the backend that must answer it (the replica holding its state), or None to route it as usual.
# It may raise a GatewayError to answer the request itself (a 404 for an unknown id, say).
PinHook = Callable[[Endpoint, ParsedRequest, Scope], Awaitable[str | None]]
# Told, for a `pinnable` endpoint's 200 answers, which backend URL answered and the answer's
# first bytes (the whole body, or a stream's first events): where its state now lives. Awaited
# before the client sees the answer, so the client's next request finds the state.
AnswerHook = Callable[[Endpoint, ParsedRequest, str, bytes], Awaitable[None]]


async def no_pin(_endpoint: Endpoint, _req: ParsedRequest, _scope: Scope) -> str | None:
    return None


async def no_answer(_endpoint: Endpoint, _req: ParsedRequest, _url: str, _first: bytes) -> None:
    return None


@dataclass(slots=True)
class ProxyDeps:
    settings: GatewaySettings
    router: Router
    transport: Transport
    metrics: GatewayMetrics
    flow: Admission | None = None
    batcher: Batcher | None = None
    wake: WakeGate | None = None
    # The proxy's open requests: the drain ends them in-band when its timeout expires.
    inflight: InFlight = field(default_factory=InFlight)
    draining: bool = False  # SIGTERM came: /ready answers 503
    # A LoRA adapter's base model (None for a base model): its requests share the base's
    # admission pool, since they run on the base's engines (routing/adapters.py).
    parent_of: Callable[[str], str | None] = field(default=lambda _: None)
    pin: PinHook = no_pin
    answered: AnswerHook = no_answer
    # Why a client saw a 502/504 (which replica, what it said), and engines' error bodies that
    # were not error objects: rate-limited, not a line per request.
    failures: RateLimitedLog = field(
        default_factory=lambda: RateLimitedLog(logging.getLogger("gateway.proxy")))
    upstream_bodies: RateLimitedLog = field(
        default_factory=lambda: RateLimitedLog(logging.getLogger("gateway.errors")))
