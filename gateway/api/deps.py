"""The gateway's state, shared by the proxy endpoints and the server: settings, router,
transport, metrics, flow control, batcher, the wake gate of pools that may scale to zero,
the open requests and whether it drains."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.api.inflight import InFlight
from gateway.errors import RateLimitedLog
from gateway.flow.admission import Admission
from gateway.flow.batcher import Batcher
from gateway.metrics import GatewayMetrics
from gateway.routing.router import Router
from gateway.routing.wake import WakeGate
from gateway.settings import GatewaySettings
from gateway.transport.base import Transport


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
    # Why a client saw a 502/504 (which replica, what it said), and engines' error bodies that
    # were not error objects: rate-limited, not a line per request.
    failures: RateLimitedLog = field(
        default_factory=lambda: RateLimitedLog(logging.getLogger("gateway.proxy")))
    upstream_bodies: RateLimitedLog = field(
        default_factory=lambda: RateLimitedLog(logging.getLogger("gateway.errors")))
