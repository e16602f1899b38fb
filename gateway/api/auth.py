"""API-key authentication as pure ASGI middleware (only installed when a keys file is configured).

Every `/v1/*` request, and every request to an engine endpoint outside /v1 (`/tokenize`,
`/pooling`, `/invocations`... api/endpoints.py) but `/version` and `/ping`, must carry
`Authorization: Bearer <key>`; the matching `ApiKey` (never the key) goes into
`scope["state"]["api_key"]` for admission control. Probes, /metrics, /version and /ping stay open.
Nothing here logs: a rejected key must not end up in a log line.
"""

from __future__ import annotations

from typing import ClassVar

from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.api.endpoints import ENDPOINTS
from gateway.errors import AuthenticationFailed, send_error
from gateway.flow.keys import KeyStore


def bearer_token(scope: Scope) -> bytes | None:
    """The token of the request's `Authorization: Bearer <token>` header, or None."""
    for k, v in scope["headers"]:
        if k == b"authorization":
            scheme, _, rest = v.partition(b" ")
            if scheme.lower() != b"bearer":
                return None
            return rest.strip() or None
    return None


# Engine endpoints outside /v1 that spend the engines' time: they need a key as /v1 does.
# /version and /ping (the engine's liveness) stay open, as vLLM leaves them.
KEYED_PATHS = frozenset(e.path for e in ENDPOINTS
                        if not e.path.startswith("/v1/") and e.path not in ("/version", "/ping"))


class AuthMiddleware:
    prefix: ClassVar[str] = "/v1/"
    paths: ClassVar[frozenset[str]] = KEYED_PATHS
    missing: ClassVar[AuthenticationFailed] = AuthenticationFailed(
        "You didn't provide an API key. Provide it in the Authorization header as 'Bearer <key>'.")
    invalid: ClassVar[AuthenticationFailed] = AuthenticationFailed("Incorrect API key provided.")
    www: ClassVar[tuple[tuple[bytes, bytes], ...]] = (
        (b"www-authenticate", b'Bearer realm="llmserve"'),)

    def __init__(self, app: ASGIApp, keys: KeyStore) -> None:
        self.app = app
        self._keys = keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not (scope["path"].startswith(self.prefix)
                                           or scope["path"] in self.paths):
            await self.app(scope, receive, send)
            return
        token = bearer_token(scope)
        if not token:
            await send_error(send, self.missing, self.www)
            return
        key = self._keys.lookup(token)
        if key is None:
            await send_error(send, self.invalid, self.www)
            return
        scope.setdefault("state", {})["api_key"] = key
        await self.app(scope, receive, send)
