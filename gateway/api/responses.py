"""The Responses API's stored state reaches the replica that holds it (issue 36).

vLLM stores a response (VLLM_ENABLE_RESPONSES_API_STORE=1) in the memory of the engine that made
it. These are ProxyDeps' pin and answer hooks for the `pinnable` endpoints (api/endpoints.py):

- an answer of POST /v1/responses: its id (read from the body, or a stream's first event) and the
  replica that answered go into routing/responses.py's map, before the client sees the answer;
- POST /v1/responses with `previous_response_id`, GET /v1/responses/{id} and
  POST /v1/responses/{id}/cancel go to the replica the map names. An id the map does not know
  (made before this gateway ran, or forgotten) is routed as usual, and the engine answers for
  it; an id whose replica is gone (removed, or restarted at another address) is OpenAI's 404,
  said plainly, as the engine says an unknown id.
"""

from __future__ import annotations

from starlette.types import Scope

from gateway.api.endpoints import Endpoint
from gateway.api.schemas import ParsedRequest
from gateway.errors import NotFound
from gateway.routing.responses import ResponseHomes, response_id_of
from gateway.routing.router import Router

CREATE = "/v1/responses"
# Where the id sits in the path of GET /v1/responses/{id} and its cancel: /v1/responses/ID[/...]
_ID_SEGMENT = 3


class ResponsePins:
    def __init__(self, homes: ResponseHomes, router: Router) -> None:
        self._homes = homes
        self._router = router

    async def pin(self, endpoint: Endpoint, req: ParsedRequest, scope: Scope) -> str | None:
        if endpoint.path == CREATE:
            rid = req.body.get("previous_response_id")
            param = "previous_response_id"
        else:
            rid = scope["path"].split("/")[_ID_SEGMENT]
            param = "response_id"
        if not isinstance(rid, str) or not rid:
            return None
        url = await self._homes.home(rid)
        if url is not None and self._router.available_at(url) is None:
            raise NotFound(
                f"Response with id '{rid}' not found: the replica that stored it is gone "
                "(restarted or removed), and vLLM keeps stored responses in the memory of the "
                "engine that made them.", param=param)
        return url

    async def answered(self, endpoint: Endpoint, req: ParsedRequest, url: str,
                       first: bytes) -> None:
        # Answers to GET and cancel are responses the map knows already.
        if endpoint.path != CREATE:
            return
        rid = response_id_of(first)
        if rid is not None:
            await self._homes.remember(rid, url)
