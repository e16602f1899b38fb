"""The per-event step of a stream that may be resumed (api/resume.py): the plain `Splice`, plus the
token ids the engine reports with each event, kept and (unless the client asked for them) blanked.

vLLM 0.32 sends `"token_ids":[...]` in each choice of a stream asked with `return_token_ids`, and
`"prompt_token_ids":[...]` once, in the first event; without the flag both fields are there as
`null`. So the client sees the engine's own bytes with each list turned back into `null`. The ids
are kept as the raw bytes between the brackets, one entry per event: parsed only if the stream
breaks. Raw `"token_ids":[` cannot come from inside a JSON string (a quote there is escaped), so
one scan per chunk finds them.

Past the first event an engine's in-band error event (`data: {"error"...`) is held back, with
whatever followed it, in `tail`: the stream then counts as broken, to be resumed elsewhere, and the
held bytes are what the client gets if it cannot be (today's error, unchanged).
"""

from __future__ import annotations

from gateway.api.splice import Splice, whole_events
from gateway.api.sse import EVENT_END

TOKEN_IDS = b',"token_ids":['
PROMPT_IDS = b'"prompt_token_ids":['
ERROR_EVENT = b'data: {"error"'
# How vLLM ends an event whose one choice ends with its ids.
ONE_CHOICE_END = b"]}]}\n\n"


class ResumeSplice(Splice):
    """A `Splice` that records the token ids sent and holds back an engine's error event."""

    __slots__ = ("broken", "first", "ids", "last_chunk", "prompt_ids", "rest", "strip_ids",
                 "tail")

    def __init__(self, started: float, strip_usage: bool, strip_ids: bool) -> None:
        super().__init__(started, strip_usage)
        self.strip_ids = strip_ids  # the client did not ask for the ids: blank them
        self.ids: list[bytes] = []  # raw b"1,2" per event relayed
        self.prompt_ids: bytes | None = None  # raw, from the first event
        self.first = b""  # the first whole events relayed: the stream's id, created, model
        self.last_chunk = b""  # the last whole events relayed (did they finish the answer?)
        self.tail = b""  # an engine's error event and what followed, held back
        self.broken = False  # the engine sent an error event: feed no more
        self.rest = b""  # a trailing partial event (the base class keeps its own empty)

    def feed(self, chunk: bytes, now: float) -> bool:
        if (self.first and not self.rest and not self.broken
                and (i := chunk.find(TOKEN_IDS)) >= 0
                and (end := chunk.find(b"]", i)) == len(chunk) - 6
                and chunk.endswith(ONE_CHOICE_END)):
            # One whole event, ending with its ids (so the chunk's only ids: any event before
            # them would carry its own), past the first: the common case at a real pace.
            start = i + len(TOKEN_IDS)
            self.ids.append(chunk[start:end])
            if self.strip_ids:
                chunk = b"%bnull%b" % (chunk[: start - 1], chunk[end + 1 :])
            self.last_chunk = chunk
            return Splice.feed(self, chunk, now)
        return self._feed(chunk, now)

    def _feed(self, chunk: bytes, now: float) -> bool:
        """`feed` for everything but one whole event with its ids."""
        if self.broken:
            return False
        if self.rest or chunk[-2:] != EVENT_END:
            chunk, self.rest = whole_events(self.rest, chunk)
            if not chunk:
                return True
        if chunk.find(b'token_ids":[') >= 0:
            chunk = self._take_ids(chunk)
        if not self.first:
            self.first = chunk
        elif (cut := chunk.find(ERROR_EVENT)) >= 0:
            self.broken = True
            self.tail = chunk[cut:]
            if cut:
                self.last_chunk = chunk[:cut]
                Splice.feed(self, chunk[:cut], now)
            return False
        self.last_chunk = chunk
        return Splice.feed(self, chunk, now)

    def flush(self) -> bytes:
        rest, self.rest = self.rest, b""
        return rest

    def _take_ids(self, chunk: bytes) -> bytes:
        """Record the ids of a chunk of whole events; blank them unless the client asked."""
        strip = self.strip_ids
        if self.prompt_ids is None and (i := chunk.find(PROMPT_IDS)) >= 0:
            start = i + len(PROMPT_IDS)
            end = chunk.find(b"]", start)
            self.prompt_ids = chunk[start:end]
            if strip:
                chunk = b"%bnull%b" % (chunk[: start - 1], chunk[end + 1 :])
        out: list[bytes] = []
        pos = 0
        ids = self.ids
        while (i := chunk.find(TOKEN_IDS, pos)) >= 0:
            start = i + len(TOKEN_IDS)
            end = chunk.find(b"]", start)
            ids.append(chunk[start:end])
            if strip:
                out.append(chunk[pos : start - 1])
                out.append(b"null")
            else:
                out.append(chunk[pos : end + 1])
            pos = end + 1
        if not out:
            return chunk
        out.append(chunk[pos:])
        return b"".join(out)

    def token_ids(self) -> tuple[list[int], list[int]]:
        """(prompt ids, ids generated and relayed so far), parsed."""
        prompt = [int(t) for t in (self.prompt_ids or b"").split(b",") if t]
        gen = [int(t) for raw in self.ids for t in raw.split(b",") if t]
        return prompt, gen
