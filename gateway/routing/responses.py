"""Where each stored Responses API answer lives: response id -> the URL of the replica that made
it.

vLLM keeps a stored response (VLLM_ENABLE_RESPONSES_API_STORE=1) in the memory of the engine that
answered, so a later turn (`previous_response_id`), GET /v1/responses/{id} and its cancel must
reach that replica. The gateway learns the id from the answer (`response_id_of`) and remembers
the replica here: in this process's memory (least recently used first out, each entry for
`ttl_s`), and, when the gateway replicas share a Redis (GATEWAY_FLOW__LIMITS_REDIS_URL), in
Redis too, so that any gateway replica finds it. A lookup asks memory first, then Redis. While
Redis fails, memory alone answers (a turn that reaches the gateway replica that saw the answer
still works) and Redis is not asked again for `limits_redis_retry_s`.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from time import monotonic
from typing import Any

from gateway.jsonobj import json_object
from gateway.settings import FlowSettings, ResponsesSettings
from gateway.shared_redis import REDIS_ERRORS, Outage, connect

log = logging.getLogger("llmserve.gateway.responses")

KEY_PREFIX = "llmserve:responses:"
# The SSE event that opens a streamed answer carries the response, and with it its id.
_DATA = b"data:"


def response_id_of(first: bytes) -> str | None:
    """The id of a Responses API answer, from its whole JSON body or a stream's first events
    (`response.created` carries the response); None when there is none."""
    text = first.lstrip()
    if text.startswith(b"{"):
        return _id(text)
    for line in text.splitlines():
        if line.startswith(_DATA):
            found = _id(line[len(_DATA):].strip())
            if found is not None:
                return found
    return None


def _id(doc: bytes) -> str | None:
    obj = json_object(doc)
    if obj is None:
        return None
    # A whole answer is the response; a stream's event holds it under "response".
    inner = obj.get("response")
    target = inner if isinstance(inner, dict) else obj
    rid = target.get("id")
    return rid if isinstance(rid, str) and rid and target.get("object") == "response" else None


class _Memory:
    """Bounded LRU with a deadline per entry."""

    def __init__(self, max_entries: int, ttl_s: float, clock: Callable[[], float]) -> None:
        self._max = max_entries
        self._ttl = ttl_s
        self._clock = clock
        self._entries: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def put(self, key: str, url: str) -> None:
        self._entries[key] = (url, self._clock() + self._ttl)
        self._entries.move_to_end(key)
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)

    def get(self, key: str) -> str | None:
        found = self._entries.get(key)
        if found is None:
            return None
        url, deadline = found
        if self._clock() >= deadline:
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return url

    def __len__(self) -> int:
        return len(self._entries)


class ResponseHomes:
    """The id -> replica map of one gateway replica (module docstring)."""

    def __init__(self, settings: ResponsesSettings, flow: FlowSettings, *,
                 clock: Callable[[], float] = monotonic) -> None:
        self._memory = _Memory(settings.max_entries, settings.ttl_s, clock)
        self._ttl_ms = max(1, int(settings.ttl_s * 1000))
        self._redis: Any = None
        self._outage: Outage | None = None
        if flow.limits_redis_url is not None:
            self._redis = connect(flow.limits_redis_url, flow.limits_redis_timeout_s)
            self._outage = Outage(log, "stored responses", flow.limits_redis_retry_s)

    @property
    def shared(self) -> bool:
        return self._redis is not None

    def __len__(self) -> int:
        """Entries in this replica's memory."""
        return len(self._memory)

    async def remember(self, response_id: str, url: str) -> None:
        """`url`'s replica holds `response_id` from now on."""
        self._memory.put(response_id, url)
        if self._redis is None or self._outage is None or self._outage.down:
            return
        try:
            await self._redis.set(KEY_PREFIX + response_id, url, px=self._ttl_ms)
        except REDIS_ERRORS as exc:
            self._outage.failed(exc, "remembering responses in this replica only")

    async def home(self, response_id: str) -> str | None:
        """The URL of the replica holding `response_id`, or None when no gateway replica saw
        it (or it was forgotten)."""
        url = self._memory.get(response_id)
        if url is not None or self._redis is None or self._outage is None or self._outage.down:
            return url
        try:
            raw = await self._redis.get(KEY_PREFIX + response_id)
        except REDIS_ERRORS as exc:
            self._outage.failed(exc, "finding responses in this replica's memory only")
            return None
        if raw is None:
            return None
        url = raw.decode() if isinstance(raw, bytes) else str(raw)
        self._memory.put(response_id, url)
        return url

    async def close(self) -> None:
        if self._redis is not None:
            await self._redis.aclose()
