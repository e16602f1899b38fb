"""Per-chunk work on an upstream SSE stream: framing, usage accounting, usage stripping.

Chunks are forwarded as they arrive (several events may share one chunk under load; that is a free
win, not buffering). Only two things are ever held back:
- a trailing partial event, until its end arrives, so the client never sees half an event and the
  usage scan below always sees whole events;
- the usage event, when the gateway asked for usage on its own account and the client did not.

The common chunk costs one C-level byte scan (`in`) and an `endswith`, and nothing else.
"""

from __future__ import annotations

import orjson

from gateway.usage import usage_counts

EVENT_END = b"\n\n"
DONE_EVENT = b"data: [DONE]\n\n"
# vLLM emits compact JSON; the spaced form covers other OpenAI-compatible upstreams.
_USAGE_MARKERS = (b'"usage":{', b'"usage": {')
# One scan per chunk finds both forms (and `"usage":null`, which _take_usage then passes through):
# each scan of a chunk costs about 1% of the gateway's CPU at a real pace (py-spy --native).
USAGE_KEY = b'"usage":'


class SseRelay:
    __slots__ = (
        "_strip_usage",
        "completion_tokens",
        "pending",
        "prompt_tokens",
        "saw_done",
        "usage_known",
    )

    def __init__(self, strip_usage: bool) -> None:
        self._strip_usage = strip_usage
        self.pending = b""
        self.prompt_tokens = 0
        self.completion_tokens = 0
        # False until a well-formed usage arrives, and again if a later one is malformed: then
        # the counts above are not to be trusted (gateway/usage.py).
        self.usage_known = False
        self.saw_done = False

    def feed(self, chunk: bytes) -> bytes:
        """Return the bytes to forward now (possibly b"")."""
        if self.pending:
            chunk = self.pending + chunk
            self.pending = b""
        if not chunk.endswith(EVENT_END):
            cut = chunk.rfind(EVENT_END)
            if cut < 0:
                self.pending = chunk
                return b""
            self.pending = chunk[cut + 2 :]
            chunk = chunk[: cut + 2]
        if USAGE_KEY in chunk:
            chunk = self._take_usage(chunk)
        if chunk.endswith(DONE_EVENT):
            self.saw_done = True
        return chunk

    def flush(self) -> bytes:
        """At upstream EOF: whatever partial event is left (a well-formed stream leaves none)."""
        rest, self.pending = self.pending, b""
        return rest

    def _take_usage(self, chunk: bytes) -> bytes:
        """Record (and maybe drop) the event(s) carrying usage; touch nothing else in the chunk.

        Under load one chunk holds a whole answer, so only the events around each usage marker are
        located and parsed, never the whole chunk."""
        out: list[bytes] = []
        pos = 0
        while True:
            hit = -1
            for marker in _USAGE_MARKERS:
                i = chunk.find(marker, pos)
                if i >= 0 and (hit < 0 or i < hit):
                    hit = i
            if hit < 0:
                out.append(chunk[pos:])
                return b"".join(out) if len(out) > 1 else out[0]
            start = chunk.rfind(EVENT_END, pos, hit)
            start = pos if start < 0 else start + 2
            end = chunk.find(EVENT_END, hit) + 2  # the chunk ends with EVENT_END, so this is found
            usage_only = self._record_usage(chunk[start : end - 2])
            out.append(chunk[pos:start])
            if not (usage_only and self._strip_usage):
                out.append(chunk[start:end])
            pos = end

    def _record_usage(self, event: bytes) -> bool:
        """Record the usage an event carries; True if it is the usage-only final chunk."""
        data = event[6:] if event.startswith(b"data: ") else event.partition(b"data:")[2]
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            return False
        if not isinstance(obj, dict):
            return False
        usage = obj.get("usage")
        if usage is None:
            return False
        counts = usage_counts(usage)
        if counts is None:
            self.usage_known = False
            self.prompt_tokens = self.completion_tokens = 0
        else:
            # With continuous usage stats every chunk carries running totals: keep the latest.
            self.usage_known = True
            self.prompt_tokens, self.completion_tokens = counts
        return obj.get("choices") == [] and isinstance(usage, dict)
