"""Per-request accounting shared by the proxy's answers: token counts and failure log lines."""

from __future__ import annotations

from gateway.api.inflight import Exchange
from gateway.errors import GatewayError, RateLimitedLog
from gateway.flow.tenants import Tenant
from gateway.metrics import GatewayMetrics


def log_failure(failures: RateLimitedLog, ex: Exchange, exc: GatewayError) -> None:
    """Log why a client saw a 5xx: which replica, what it said."""
    if exc.status >= 500:
        failures.warning("request %s: %s", ex.rid, exc.message)


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
