"""The admin API: LoRA adapters added and removed at run time, on every replica of their base.

    GET    /admin/adapters          the adapter set, and which replicas list each adapter
    POST   /admin/adapters          {"name": ..., "base": ..., "path": ...}: load on every
                                    available replica of `base` (and on those that join later)
    DELETE /admin/adapters/{name}   unload everywhere

Installed only with GATEWAY_ADMIN_KEY (or GATEWAY_ADMIN_KEY_SHA256), and every /admin/ request
carries it as `Authorization: Bearer <key>`. Outside /v1/ on purpose: tenants' API keys never open
it, and the chart's Ingress, which routes /v1 only, does not expose it.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.types import ASGIApp

from gateway.api.auth import AuthMiddleware
from gateway.errors import (
    AuthenticationFailed,
    InvalidRequest,
    ModelNotFound,
    Unavailable,
)
from gateway.flow.keys import ApiKey, KeyStore
from gateway.routing.adapters import Adapters, LoadResult
from gateway.routing.router import Router
from model_store.adapter import ADAPTER_NAME

_NAME = re.compile(ADAPTER_NAME)


class AdminAuthMiddleware(AuthMiddleware):
    """Every /admin/ request carries the admin key (its SHA-256 is `digest`), or gets a 401."""

    prefix = "/admin/"
    paths = frozenset()
    missing = AuthenticationFailed(
        "The admin API needs the admin key in the Authorization header as 'Bearer <key>'.")
    invalid = AuthenticationFailed("Incorrect admin key provided.")
    www = ((b"www-authenticate", b'Bearer realm="llmserve-admin"'),)

    def __init__(self, app: ASGIApp, digest: bytes) -> None:
        super().__init__(app, KeyStore([ApiKey("admin", digest)]))


class AddAdapter(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=ADAPTER_NAME, description="what clients send as `model`")
    base: str = Field(min_length=1, description="the served base model it was trained on")
    path: str = Field(min_length=1, description="its directory on the replicas' model volume")


def _results(results: list[LoadResult]) -> dict[str, str]:
    return {r.url: r.detail for r in results}


def build_admin_routes(adapters: Adapters, router: Router) -> APIRouter:
    api = APIRouter()

    @api.get("/admin/adapters")
    async def list_adapters() -> JSONResponse:
        return JSONResponse({"object": "list", "data": [
            {"name": a.name, "base": a.base, "path": a.path,
             "source": "admin" if a.ours else "replicas", "replicas": urls}
            for a, urls in adapters.catalog()
        ]})

    @api.post("/admin/adapters")
    async def add_adapter(request: Request) -> JSONResponse:
        body = await request.body()
        try:
            spec = AddAdapter.model_validate_json(body)
        except ValidationError as exc:
            first = exc.errors()[0]
            param = ".".join(str(p) for p in first["loc"]) or None
            raise InvalidRequest(f"{param or 'body'}: {first['msg']}", param=param) from None
        if not PurePosixPath(spec.path).is_absolute():
            raise InvalidRequest("path must be absolute (a directory on the model volume)",
                                 param="path")
        if adapters.parent_of(spec.base) is not None or not router.knows_model(spec.base):
            raise ModelNotFound(f"The base model '{spec.base}' is not served here",
                                param="base")
        if router.knows_model(spec.name) and adapters.parent_of(spec.name) is None:
            raise InvalidRequest(f"'{spec.name}' is a served base model", param="name")
        known = adapters.get(spec.name)
        if known is not None and (known.base, known.path) != (spec.base, spec.path):
            raise InvalidRequest(
                f"adapter '{spec.name}' exists with base '{known.base}' and path "
                f"'{known.path}'; remove it first", param="name")
        results = await adapters.add(spec.name, spec.base, spec.path)
        if not results:
            raise Unavailable(f"no available replica of '{spec.base}'", retry_after=5)
        if not any(r.ok for r in results):
            # Every replica refused it (a wrong path, a rank above --max-lora-rank ...).
            raise InvalidRequest(
                f"no replica loaded adapter '{spec.name}': {results[0].detail}", param="path")
        return JSONResponse({"name": spec.name, "base": spec.base, "path": spec.path,
                             "replicas": _results(results)})

    @api.delete("/admin/adapters/{name}")
    async def remove_adapter(name: str) -> JSONResponse:
        if not _NAME.fullmatch(name) or adapters.get(name) is None:
            raise ModelNotFound(f"The adapter '{name}' does not exist", param="name")
        results = await adapters.remove(name)
        return JSONResponse({"name": name, "deleted": True, "replicas": _results(results)})

    return api
