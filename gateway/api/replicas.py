"""Which replica answers a request, and what its answer says about it, for the proxy and the
batcher: replicas in turn within the retry budget, the affinity key, passive health (a 5xx fails
the replica, a `draining` 503 takes it out at once, a 4xx is the caller's), and the error for a
model no replica serves.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import orjson
from starlette.types import Scope

from gateway.api.deps import ProxyDeps
from gateway.api.schemas import ParsedRequest
from gateway.errors import (
    GatewayError,
    InvalidRequest,
    ModelNotFound,
    NotFound,
    Unavailable,
    UpstreamFailed,
)
from gateway.routing.backend import Backend
from gateway.routing.policy import RouteRequest
from gateway.routing.router import Router

# The error code of a worker that drains for a restart (worker/drain.py says the same).
DRAINING_CODE = "draining"

T = TypeVar("T")


def route_request(req: ParsedRequest, scope: Scope, session_header: bytes,
                  fields: tuple[str, ...]) -> RouteRequest:
    """What an affinity policy routes by: an explicit session key (header, else the OpenAI `user`
    field) and the prompt's bytes from its start (the endpoint's prompt `fields` the body has, in
    the order the engine's prompt holds them), in a form where turn N+1 extends turn N."""
    for name, value in scope["headers"]:
        if name == session_header:
            return RouteRequest(req.model, value.decode("latin-1"))
    body = req.body
    user = body.get("user")
    if isinstance(user, str) and user:
        return RouteRequest(req.model, user)
    prefix: bytes | None = None
    for field in fields:
        prompt = body.get(field)
        if prompt is not None:
            part = prompt.encode() if isinstance(prompt, str) else orjson.dumps(prompt)
            prefix = part if prefix is None else prefix + part
    return RouteRequest(req.model, None, prefix)


def default_model(router: Router, parent_of: Callable[[str], str | None]) -> str:
    """The model a request without one goes to: the one base model served, as an engine serving
    it would use its own (the body is forwarded without one); with several, the request must say
    which (a 400)."""
    bases = [m for m in router.models() if parent_of(m) is None]
    if len(bases) == 1:
        return bases[0]
    raise InvalidRequest(
        "model is required: this gateway serves " + (
            f"{len(bases)} models ({', '.join(bases)})" if bases else "no model yet"),
        param="model")


def any_model(d: ProxyDeps) -> str:
    """For a request that names no model and may go to any replica: the model with the most
    available replicas (the first by name among equals)."""
    replicas = d.router.replicas()
    best = max(sorted(replicas), key=lambda m: replicas[m], default=None)
    if best is None or not replicas[best]:
        raise Unavailable("no healthy replica", retry_after=d.settings.health_interval_s)
    return best


def pinned(d: ProxyDeps, url: str) -> Backend:
    """The backend at `url`, which a pin hook (ProxyDeps.pin) chose; a 404 when it is no longer
    one the gateway knows (its state went with it), a 503 while it is unavailable."""
    found = d.router.available_at(url)
    if found is None:
        raise NotFound("the replica that held this request's state is gone")
    if found is False:
        raise Unavailable("the replica that holds this request's state is unavailable",
                          retry_after=d.settings.health_interval_s)
    assert isinstance(found, Backend)
    return found


def check_answer(d: ProxyDeps, backend: Backend, status: int, body: bytes) -> None:
    """Judge a replica by an answer that is not a 200: a 5xx is its failure (raised: retry
    elsewhere, count towards ejection); a 503 saying it drains takes it out of rotation now, not
    at the next probe, and, if no other replica takes the request, is the client's 503 with
    Retry-After, as for the requests after it (none healthy), not a failed model server's 502;
    a 4xx is the caller's problem (no retry, no ejection)."""
    if status == 503:
        try:
            code = orjson.loads(body)["error"]["code"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            code = None
        if code == DRAINING_CODE:
            d.router.report_draining(backend)
            raise Unavailable("the model server is restarting; retry shortly",
                              retry_after=d.settings.health_interval_s)
    if status >= 500:
        raise UpstreamFailed(
            f"replica answered HTTP {status}: {body[:200].decode('utf-8', 'replace')}")


async def try_replicas(
    d: ProxyDeps, model: str, endpoint: str, tried: list[Backend],
    attempt: Callable[[Backend], Awaitable[T]], route: RouteRequest | None = None,
) -> T:
    """Run `attempt` on `model`'s replicas in turn (each added to `tried`, acquired while it runs)
    until one returns. A GatewayError from it (the client has seen nothing) is booked against that
    replica and the next one is tried, within `retries` and the retry budget. Raises the last
    attempt's error; when none could be tried (`tried` is empty), a 404 for a model served
    nowhere, or a 503 when none of its replicas is healthy now."""
    router = d.router
    router.retry_budget.request()
    last_error: GatewayError | None = None
    for _ in range(d.settings.retries + 1):
        backend = router.pick(model, tried, route)
        if backend is None:
            break
        if tried:  # a retry
            if not router.retry_budget.try_retry():
                d.metrics.retries_refused.labels(model).inc()
                break
            d.metrics.retries.labels(model).inc()
        tried.append(backend)
        backend.outstanding += 1
        try:
            return await attempt(backend)
        except GatewayError as exc:
            # Not counted in llmserve_requests_total here: the request is counted once, by its
            # final status, where it ends (a retry that succeeds is one 200).
            router.report_failure(backend)
            last_error = exc
        finally:
            backend.outstanding -= 1
    if last_error is not None:
        raise last_error
    raise no_replica(d, model)


def no_replica(d: ProxyDeps, model: str) -> GatewayError:
    """Why no replica could be tried for `model`: a 404 for a model served nowhere, or a 503 when
    none of its replicas is healthy now."""
    router = d.router
    if router.knows_any_model() and not router.knows_model(model):
        return ModelNotFound(
            f"The model '{model}' does not exist or is not served here", param="model")
    return Unavailable(
        f"no healthy replica for model '{model}'", retry_after=d.settings.health_interval_s)


