"""The pick for one request that Envoy holds: the gateway's own checks, admission and routing,
called as the proxy calls them (gateway/flow/door.py, gateway/routing/router.py), only the
answer differs: an endpoint for Envoy to forward to instead of a forwarded request.

Completion requests (the two OpenAI paths the gateway proxies) are parsed and validated as the
gateway does, authenticated when a keys file is set, admitted into their model's pool (per-key
limits, slow start, the fair queue, overload refusal) and routed by the pool's policy (prefix
affinity, least outstanding...). Any other request (GET /v1/models, /v1/embeddings, ...) goes to
the least busy endpoint serving its model, or of all, without admission: as the gateway, which
does not admit what it does not proxy. A request about a stored Responses API answer
(`previous_response_id`, GET /v1/responses/{id}, its cancel) goes to the replica that holds it,
asked of the same pin hook as the proxy asks (api/responses.py); the answer's id is learnt by
answer.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.api.auth import AuthMiddleware, bearer_token
from gateway.api.deps import ProxyDeps
from gateway.api.endpoints import CHAT, COMPLETIONS, ENDPOINTS, Endpoint, Kind, match
from gateway.api.forward import ask_usage
from gateway.api.replicas import default_model, no_replica, pinned, route_request
from gateway.api.schemas import ParsedRequest, encoding_error, parse_request
from gateway.epp.protocol import header
from gateway.errors import GatewayError, PayloadTooLarge, Unavailable
from gateway.flow.admission import Pool
from gateway.flow.door import admit
from gateway.flow.keys import KeyStore
from gateway.flow.tenants import Tenant
from gateway.jsonobj import json_object
from gateway.routing.backend import Backend

# The endpoints admitted and routed as the gateway's proxy does; the rest are only routed.
ADMITTED: dict[bytes, Kind] = {b"/v1/chat/completions": "chat", b"/v1/completions": "completion"}
# The endpoints whose requests a pin hook may send to one replica (api/endpoints.py's table).
_PINNABLE = {e.path: e for e in ENDPOINTS if e.pinnable and "{" not in e.path}


def pinnable(path: str, method: str) -> Endpoint | None:
    """The `pinnable` endpoint `path` and `method` are a request of, or None."""
    endpoint = _PINNABLE.get(path) or match(path)
    return endpoint if endpoint is not None and endpoint.pinnable and method in endpoint.methods \
        else None


def host_port(b: Backend) -> str:
    """A backend's address as the protocol names endpoints: ip:port."""
    return b.url.split("://", 1)[-1]


class Refused(Exception):
    """Answer the client with this error at once (an ImmediateResponse), with extra headers."""

    def __init__(self, error: GatewayError, headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
        super().__init__(error.message)
        self.error = error
        self.headers = headers


@dataclass(slots=True)
class Pick:
    """Where one request goes, and what its answer must be watched for."""

    backend: Backend
    model: str
    body: bytes  # the body to forward (the request's own, or asking for usage)
    changed: bool  # `body` differs from the client's
    stream: bool
    strip_usage: bool  # the client did not ask for usage: the watcher strips it from the stream
    pool: Pool | None
    tenant: Tenant | None
    dispatched: float  # when the pick was made (admission's clock): TTFT samples count from it
    endpoint: str = ""  # its `endpoint` metric label: the path, for the completions
    # A `pinnable` endpoint's request (the Responses API's): its answer tells the pin hook where
    # the state it made lives (answer.py).
    pinnable: Endpoint | None = None
    request: ParsedRequest | None = None

    def release(self) -> None:
        """Give the slot back, and the backend's count of requests in flight."""
        self.backend.outstanding -= 1
        if self.pool is not None and self.tenant is not None:
            self.pool.release(self.tenant.name, self.stream)
            self.pool = None


class Picker:
    def __init__(self, deps: ProxyDeps, keys: KeyStore | None) -> None:
        self._d = deps
        self._keys = keys
        self._session_header = deps.settings.affinity.session_header.lower().encode("latin-1")

    async def pick(self, path: bytes, headers: list[tuple[bytes, bytes]], body: bytes,
                   subset: frozenset[str] | None) -> Pick:
        """Admit and route one request; raises Refused with the client's answer when it must not
        be forwarded. The caller owns the Pick: `release` it when the answer is over."""
        d = self._d
        if len(body) > d.settings.max_body_bytes:
            raise Refused(PayloadTooLarge(
                f"request body exceeds {d.settings.max_body_bytes} bytes"))
        key = None
        if self._keys is not None and path.startswith(b"/v1/"):
            token = bearer_token({"headers": headers})
            key = self._keys.lookup(token) if token else None
            if key is None:
                refusal = AuthMiddleware.invalid if token else AuthMiddleware.missing
                raise Refused(refusal, AuthMiddleware.www)
        exclude = self._outside(subset)
        bare = path.partition(b"?")[0]
        kind = ADMITTED.get(bare)
        if kind is None:
            method = (header(headers, b":method") or b"").decode("latin-1")
            endpoint = pinnable(bare.decode("latin-1"), method)
            if endpoint is not None:
                return await self._route_pinnable(endpoint, bare, body, exclude, subset)
            return self._route_other(body, exclude, subset)
        req = parse_request(body, kind)
        try:
            if not req.readable:
                unsupported = encoding_error(headers)
                if unsupported is not None:
                    raise unsupported
            if not req.model:  # the one model served answers it, as its engine would
                req.model = default_model(d.router, d.parent_of)
        except GatewayError as exc:
            raise Refused(exc) from None
        try:
            admitted = await admit(d.flow, d.router, d.wake, d.parent_of, req.model, key, headers,
                                   req.stream)
        except GatewayError as exc:
            d.metrics.requests.labels(req.model, _label(kind), "", str(exc.status)).inc()
            raise Refused(exc) from None
        pool, tenant = admitted if admitted is not None else (None, None)
        try:
            route = (route_request(req, {"headers": headers}, self._session_header,
                                   (CHAT if kind == "chat" else COMPLETIONS).prompt)
                     if d.router.wants_affinity(req.model) else None)
            backend = d.router.pick(req.model, exclude, route)
            if backend is None:
                raise Refused(self._none_left(req.model, subset))
        except BaseException:
            if pool is not None and tenant is not None:
                pool.release(tenant.name, req.stream)
            raise
        return self._picked(backend, req, body, pool, tenant)

    def _picked(self, backend: Backend, req: ParsedRequest, body: bytes, pool: Pool | None,
                tenant: Tenant | None) -> Pick:
        d = self._d
        backend.outstanding += 1
        strip = req.stream and not req.client_wants_usage
        forwarded = ask_usage(req) if strip else body
        clock = d.flow.clock() if d.flow is not None else 0.0
        return Pick(backend, req.model, forwarded, strip, req.stream, strip, pool, tenant, clock,
                    _label(req.kind))

    def _outside(self, subset: frozenset[str] | None) -> list[Backend]:
        """The backends the subset hint rules out (none without a hint)."""
        if subset is None:
            return []
        return [b for b in self._d.router.backends() if host_port(b) not in subset]

    def _none_left(self, model: str, subset: frozenset[str] | None) -> GatewayError:
        if subset is not None:
            return Unavailable(
                f"no healthy replica for model '{model}' among the endpoints the gateway allowed",
                retry_after=self._d.settings.health_interval_s)
        return no_replica(self._d, model)

    async def _route_pinnable(self, endpoint: Endpoint, path: bytes, body: bytes,
                              exclude: list[Backend], subset: frozenset[str] | None) -> Pick:
        """To the replica the pin hook names (the proxy's `_forward_other`: a 404 when it is
        gone, a 503 while it is unavailable), else as any other request."""
        d = self._d
        req = parse_request(body, "other")
        try:
            url = await d.pin(endpoint, req, {"path": path.decode("latin-1")})
            backend = pinned(d, url) if url is not None else None
        except GatewayError as exc:
            raise Refused(exc) from None
        if backend is None:
            pick = self._route_other(body, exclude, subset)
        elif backend in exclude:
            raise Refused(Unavailable(
                "the replica that holds this request's state is not among the endpoints the "
                "gateway allowed", retry_after=d.settings.health_interval_s))
        else:
            backend.outstanding += 1
            model = req.model or (min(backend.models) if backend.models else "")
            pick = Pick(backend, model, body, False, False, False, None, None, 0.0)
        pick.pinnable, pick.request = endpoint, req
        return pick

    def _route_other(self, body: bytes, exclude: list[Backend],
                     subset: frozenset[str] | None) -> Pick:
        """A request the gateway does not admit: the least busy endpoint serving its model (the
        body's `model`, when it is a JSON object naming one the router knows), else of all."""
        d = self._d
        model = _model_of(body)
        if model is not None and d.router.knows_model(model):
            backend = d.router.pick(model, exclude)
            if backend is None:
                raise Refused(self._none_left(model, subset))
        else:
            candidates = [b for b in d.router.available() if b not in exclude]
            if not candidates:
                raise Refused(Unavailable("no healthy replica",
                                          retry_after=d.settings.health_interval_s))
            backend = min(candidates, key=lambda b: b.outstanding)
            model = model or ""
        backend.outstanding += 1
        return Pick(backend, model, body, False, False, False, None, None, 0.0)


def _label(kind: Kind) -> str:
    return (CHAT if kind == "chat" else COMPLETIONS).label


def _model_of(body: bytes) -> str | None:
    obj = json_object(body)
    model = obj.get("model") if obj is not None else None
    return model if isinstance(model, str) and model else None
