"""Per-request accounting shared by the proxy's answers: token counts and failure log lines."""

from __future__ import annotations

import logging

from gateway.api.inflight import Exchange
from gateway.errors import GatewayError, RateLimitedLog
from gateway.flow.tenants import Tenant
from gateway.metrics import GatewayMetrics

log = logging.getLogger("gateway.proxy")

# Why a client saw a 502/504: which replica, what it said (rate-limited, not a line per request).
_failures = RateLimitedLog(log)


def log_failure(ex: Exchange, exc: GatewayError) -> None:
    if exc.status >= 500:
        _failures.warning("request %s: %s", ex.rid, exc.message)


def count_usage(
    m: GatewayMetrics, model: str, tenant: Tenant | None, counts: tuple[int, int] | None
) -> None:
    """Count an answer's tokens, or, when its usage was missing or malformed, only that."""
    s = m.series(model)
    if counts is None:
        s.usage_invalid.inc()
        return
    s.input_tokens.inc(counts[0])
    s.output_tokens.inc(counts[1])
    if tenant is not None:
        tenant.used(*counts)
        s.tenant_used(tenant.name, *counts)
