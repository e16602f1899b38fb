"""The way into a model's pool, for every front door (the proxy, gateway/api/proxy.py, and the
endpoint picker, gateway/epp/): per-key limits, the wake of a pool at zero, then a slot.

One sequence, so that a request through Envoy's ext_proc and one through the gateway's own HTTP
port are admitted by the same rules, in the same order, against the same pools and buckets.
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.errors import GatewayError
from gateway.flow.admission import Admission, Pool
from gateway.flow.keys import ApiKey
from gateway.flow.tenants import Tenant
from gateway.routing.router import Router
from gateway.routing.wake import WakeGate


async def admit(
    flow: Admission | None, router: Router, wake: WakeGate | None,
    parent_of: Callable[[str], str | None], model: str, key: ApiKey | None,
    headers: list[tuple[bytes, bytes]], stream: bool = True,
) -> tuple[Pool, Tenant] | None:
    """Admit one request for `model`: its pool and tenant, holding a slot (the caller releases it
    with `pool.release(tenant.name)`), or None when admission does not apply (off, or a model no
    replica serves: made-up names must not create pools; the caller answers 404 or 503).
    `stream`: the request asks for a streamed answer (flow control watches its first token).

    Raises GatewayError (429 per-key limit, 503 overload with Retry-After, 503 wake timeout), with
    the key's charge refunded."""
    # A LoRA adapter's requests are admitted with its base model's, and wake its pool: the same
    # engines serve both (routing/adapters.py).
    name = parent_of(model) or model
    charged = False  # by the per-key limits: refunded if refused further on
    try:
        # An adapter is known by its base, even while its pool is at zero and no replica lists it.
        if flow is not None and router.knows_model(name):
            pool = flow.pool(name)
            tenant = flow.tenants.for_key(key)
            await flow.check_limits(tenant, name)
            charged = True
        # A pool at zero replicas: wait for one (routing/wake.py) after the per-key limits,
        # before taking a slot, then go through the door like any request.
        if wake is not None and wake.asleep(name):
            await wake.wait(name, model)
        if charged and not pool.try_acquire(tenant.name, tenant.weight, stream):
            await pool.acquire(tenant, tenant.priority_class(headers), stream)
    except GatewayError:
        if charged:
            tenant.refund()
        raise
    if not charged:
        return None
    tenant.admitted()
    return pool, tenant
