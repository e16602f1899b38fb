"""The non-hot endpoints: model list, liveness, readiness, metrics."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway.errors import Unavailable
from gateway.metrics import GatewayMetrics
from gateway.routing.router import Router
from gateway.settings import PoolLayout


def build_routes(
    router: Router, metrics: GatewayMetrics, draining: Callable[[], bool], retry_after_s: float,
    layouts: dict[str, PoolLayout], parent_of: Callable[[str], str | None],
    engine_cards: Callable[[str], dict[str, Any] | None] = lambda _: None,
) -> APIRouter:
    api = APIRouter()
    created = int(time.time())

    @api.get("/v1/models")
    async def list_models() -> JSONResponse:
        # Models with an available replica, each card as its engine wrote it (max_model_len, root,
        # permission: clients size prompts from max_model_len), plus `llmserve` (an extension
        # OpenAI clients ignore): live replicas and the configured layout, so a benchmark report
        # can say what it measured. A model no replica has listed yet (a pool at zero) gets a
        # card of the gateway's; a LoRA adapter names its base model as `parent`, as vLLM does.
        replicas = router.replicas()
        data = []
        for m in router.models():
            info: dict[str, int] = {"replicas": replicas.get(m, 0)}
            if m in layouts:
                info.update(layouts[m].model_dump(include={"tp", "pp", "nodes"}))
            engine = engine_cards(m)
            card: dict[str, object]
            if engine is not None:
                card = dict(engine)
            else:
                card = {"id": m, "object": "model", "created": created, "owned_by": "llmserve"}
                parent = parent_of(m)
                if parent is not None:
                    card["parent"] = parent
            card["llmserve"] = info
            data.append(card)
        return JSONResponse({"object": "list", "data": data})

    @api.get("/health")
    async def health() -> JSONResponse:
        # Liveness only: the process answers. Backend trouble must not get the gateway restarted.
        return JSONResponse({"status": "ok"})

    @api.get("/ready")
    async def ready() -> JSONResponse:
        if draining():
            raise Unavailable("gateway is draining", retry_after=retry_after_s)
        if not router.ready():
            raise Unavailable("no healthy backend yet", retry_after=retry_after_s)
        return JSONResponse({"status": "ready", "backends": len(router.backends())})

    @api.get("/metrics")
    async def prometheus_metrics() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return api
