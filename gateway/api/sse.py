"""The usage an upstream SSE stream reports: found, counted, and stripped when the client did not
ask for it (the gateway asks on its own account, for token metrics and per-key limits).

The streamed relay (api/splice.py) hands a chunk of whole events here only when it holds a usage
marker; the common chunk costs the relay one C-level scan and nothing here.
"""

from __future__ import annotations

import orjson

from gateway.jsonobj import json_object
from gateway.usage import usage_counts

EVENT_END = b"\n\n"
DONE_EVENT = b"data: [DONE]\n\n"
# Found in vLLM's compact JSON and in the spaced form of other OpenAI-compatible upstreams (and in
# `"usage":null`, which `take` then passes through): one scan per chunk.
USAGE_KEY = b'"usage":'
# A terminal event's mark in vLLM's compact JSON (null is not a string: other events lack it).
FINISH_KEY = b'"finish_reason":"'


def stamp_fingerprint(chunk: bytes, fingerprint: bytes) -> bytes:
    """`chunk`'s terminal events, each with `,"system_fingerprint":...` as its object's last
    member, where vLLM writes it when usage is not asked for; other events untouched."""
    out = []
    for event in chunk.split(EVENT_END):
        if event.find(FINISH_KEY) >= 0 and event.endswith(b"}") and \
                event.find(b'"system_fingerprint":') < 0:
            event = event[:-1] + b',"system_fingerprint":' + fingerprint + b"}"
        out.append(event)
    return EVENT_END.join(out)


class Usage:
    """The latest token counts a stream reported, and whether to strip the usage-only event."""

    __slots__ = ("_lenient", "_strip", "counts", "fingerprint")

    def __init__(self, strip: bool, lenient: bool = False) -> None:
        self._strip = strip
        # Another endpoint's stream (gateway/usage.py's `lenient`), whose usage may be nested in
        # the event's object (the Responses API's `response`, the Messages API's `message`).
        self._lenient = lenient
        # (prompt, completion tokens); None until a well-formed usage arrives, and again if a
        # later one is malformed: then no count is to be trusted (gateway/usage.py).
        self.counts: tuple[int, int] | None = None
        # The usage event's system_fingerprint, JSON-encoded, when it carried one.
        self.fingerprint: bytes | None = None

    def take(self, chunk: bytes) -> bytes:
        """Record (and maybe drop) the event(s) carrying usage in a chunk of whole events; return
        the chunk to forward, nothing else in it touched.

        Under load one chunk holds a whole answer, so only the events around each usage marker are
        located and parsed, never the whole chunk."""
        out: list[bytes] = []
        pos = 0
        while (hit := chunk.find(USAGE_KEY, pos)) >= 0:
            start = chunk.rfind(EVENT_END, pos, hit)
            start = pos if start < 0 else start + 2
            end = chunk.find(EVENT_END, hit) + 2  # the chunk ends with EVENT_END, so this is found
            if self._record(chunk[start : end - 2]) and self._strip:
                out.append(chunk[pos:start])  # the usage-only event, dropped
            else:
                out.append(chunk[pos:end])
            pos = end
        if not out:
            return chunk
        out.append(chunk[pos:])
        return b"".join(out)

    def _record(self, event: bytes) -> bool:
        """Record the usage an event carries; True if it is the usage-only final chunk."""
        data = event[6:] if event.startswith(b"data: ") else event.partition(b"data:")[2]
        obj = json_object(data)
        if obj is None:
            return False
        usage = obj.get("usage")
        if usage is None and self._lenient:
            for outer in ("response", "message"):
                inner = obj.get(outer)
                if isinstance(inner, dict) and inner.get("usage") is not None:
                    usage = inner["usage"]
                    break
        if usage is None:
            return False
        # With continuous usage stats every chunk carries running totals: keep the latest.
        self.counts = usage_counts(usage, self._lenient)
        final = obj.get("choices") == [] and isinstance(usage, dict)
        fingerprint = obj.get("system_fingerprint")
        if final and isinstance(fingerprint, str):
            self.fingerprint = orjson.dumps(fingerprint)
        return final
