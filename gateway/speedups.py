"""The streamed relay's per-event path: compiled when `gateway._speedups` is built, Python otherwise.

At a real decode pace every upstream read is one chunk frame holding one SSE event, ~65 per
request, and the Python run per event was the gateway's remaining CPU gap to vllm-router
(docs/benchmarks.md, issue 16). Two small base classes hold that per-event path:

- `FrameEntry`, the upstream connection's `data_received` (gateway/transport/h1.py): while the
  response parser stands between two chunks and a sink is armed, the read is offered whole to the
  sink's `frame`; otherwise it goes to the subclass's `_parse`.
- `FrameSplice`, the relay's `frame` (gateway/api/splice.py): a read that is one chunk frame of
  whole events without usage or [DONE] is written to the client as it came, with its gap stamped.

`gateway/_speedups.c` implements both, so such an event runs no Python at all. The classes below
are its twins: the reference the C must match (tests/gateway/test_speedups.py runs both on the same
inputs) and the fallback where no compiler was at hand. `LLMSERVE_PURE_PYTHON=1` forces the twins,
e.g. to profile the per-event path in Python or to rule the extension out of a bug.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

# Byte strings of the SSE relay (gateway/api/sse.py holds the same; a test checks they agree).
# Defined here because this module sits below every layer and imports none of them.
_FRAME_END = b"\n\n\r\n"  # an event's end, then the chunk's CRLF
_DONE_FRAME = b"data: [DONE]\n\n\r\n"
_USAGE_KEY = b'"usage":'
_EVENT_END = b"\n\n"
_HEX_DIGITS = b"0123456789abcdefABCDEF"


class PyFrameEntry:
    """The upstream connection's `data_received`: a whole frame to the armed sink, else `_parse`.

    `_frame` is the armed sink (or None), `_between_chunks` the parser's position (set by the
    subclass's parser callbacks), `_time` the loop's clock. `_last_read` is the clock's reading
    at the last read taken whole (the request's Deadline follows it, transport/deadline.py).
    A sink that stops being fed (False) calls `_frame_stopped`. In the C type `_between_chunks`
    must be a bool, `_last_read` a float (0.0 until set), and unset object slots read as None."""

    __slots__ = ("_between_chunks", "_frame", "_last_read", "_time")

    _frame: Any
    _between_chunks: bool
    _time: Callable[[], float]
    _last_read: float

    def data_received(self, data: bytes) -> None:
        framed = self._frame
        if framed is not None and self._between_chunks:
            now = self._time()
            more = framed.frame(data, now)
            if more is not None:
                # Taken whole: the parser was not fed and still stands between two chunks.
                self._last_read = now
                if not more:
                    self._frame_stopped()
                return
        self._parse(data)

    def _parse(self, data: bytes) -> None:
        raise NotImplementedError

    def _frame_stopped(self) -> None:
        raise NotImplementedError


class PyFrameSplice:
    """The relay's whole-frame entry (transport.base.FrameSink.frame).

    `held` is True while the relay holds a partial event (frames are then refused; the subclass
    keeps it, as the relay's own state is one more object per event to read), `gaps` the
    inter-token gaps (one per event: the frame's, then 0 for each further event in it), `last` the
    previous event's time, `_write`/`_closing` the client transport's, `_flow` the server's write
    flow control; `blocked` is set when the client's buffer is full.

    The C type's slots are typed where these are not: `gaps` must be a list (the C appends to it
    directly, past any override of `append`), `last` a float, `blocked` and `held` bools. The C also calls
    its own `frame` unless the class overrides it (not the instance)."""

    __slots__ = ("_closing", "_flow", "_write", "blocked", "gaps", "held", "last")

    _flow: Any
    _write: Callable[[bytes], object]
    _closing: Callable[[], bool]
    gaps: list[float]
    last: float
    blocked: bool
    held: bool

    def frame(self, data: bytes, now: float) -> bool | None:
        """One whole chunk frame taken: True to go on, False to stop (the client's buffer is
        full). None for anything else (several frames, a partial one, a chunk extension, usage,
        [DONE], a held event): the transport parses it instead."""
        if type(data) is not bytes:
            return None  # the transport reads bytes; anything else is parsed
        end = data.find(b"\r\n", 0, 18)
        if (end <= 0 or not data.endswith(_FRAME_END) or self.held
                or _USAGE_KEY in data or data.endswith(_DONE_FRAME)):
            return None
        size = data[:end]
        # Hex digits only, as HTTP/1.1 and the transport's parser require (int() would also take
        # a sign, spaces, underscores or 0x), and the size must be the payload's, with at least
        # one event end of its own: the frame then goes to the client as it came.
        if size.translate(None, _HEX_DIGITS):
            return None
        length = int(size, 16)
        if length < 2 or length != len(data) - end - 4:
            return None
        self.gaps.append(now - self.last)
        self.last = now
        extra = data.count(_EVENT_END, end + 2) - 1
        if extra > 0:
            self.gaps += [0.0] * extra
        if self._closing():
            return True  # as uvicorn's send: dropped; the disconnect cancels the relay
        self._write(data)
        if self._flow.write_paused:
            self.blocked = True
            return False
        return True


# The classes the gateway builds on. mypy sees the twins' signatures; at run time the C types
# when the extension is built and not turned off.
# BUILT: whether the extension imports; COMPILED: whether the gateway runs it.
try:
    import gateway._speedups as _c

    BUILT = True
except ImportError:
    BUILT = False
if TYPE_CHECKING:
    FrameEntry = PyFrameEntry
    FrameSplice = PyFrameSplice
    COMPILED = False
elif BUILT and os.environ.get("LLMSERVE_PURE_PYTHON", "") in ("", "0"):
    FrameEntry, FrameSplice, COMPILED = _c.FrameEntry, _c.FrameSplice, True
else:
    FrameEntry, FrameSplice, COMPILED = PyFrameEntry, PyFrameSplice, False
