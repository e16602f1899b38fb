"""gateway/_speedups.c against its Python twins (gateway/speedups.py): same inputs, same outcome.

The C types must behave exactly as the twins: what they return, the gaps they stamp, what they
write, which Python hook they call. Each test runs both on the same inputs and compares. The
relay's own tests (test_h1, test_splice) run on whichever is loaded, and once more here on the
twins alone, in a process with LLMSERVE_PURE_PYTHON=1.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway import speedups
from gateway.api import sse
from tests.gateway.conftest import RELAY_TESTS, run_tests_with

try:
    from gateway import _speedups
except ImportError as exc:  # pragma: no cover - the failure message is the point
    raise RuntimeError(
        "gateway/_speedups.c is not built: run `make install` (it needs a C compiler)"
    ) from exc

ROOT = Path(__file__).resolve().parents[2]

# ---- the relay's whole-frame entry -----------------------------------------------------------


@dataclass
class Flow:
    write_paused: bool = False


@dataclass
class Client:
    """The client transport: what was written; `paused_after` pauses writes after that many."""

    closing: bool = False
    paused_after: int = 1_000
    flow: Flow = field(default_factory=Flow)
    written: list[bytes] = field(default_factory=list)

    def write(self, data: bytes) -> None:
        self.written.append(data)
        if len(self.written) >= self.paused_after:
            self.flow.write_paused = True

    def is_closing(self) -> bool:
        return self.closing


def splice(kind: type[Any], client: Client, pending: bytes, last: float) -> Any:
    """A splice whose relay holds `pending` (the subclass keeps `held` in step with it)."""
    s = kind()
    s.held = bool(pending)
    s._write = client.write
    s._closing = client.is_closing
    s._flow = client.flow
    s.gaps = []
    s.last = last
    s.blocked = False
    return s


def outcome(kind: type[Any], data: bytes, now: float, *, pending: bytes = b"",
            closing: bool = False, paused_after: int = 1_000) -> tuple[Any, ...]:
    client = Client(closing=closing, paused_after=paused_after)
    s = splice(kind, client, pending, 1.0)
    result = s.frame(data, now)
    return result, s.gaps, s.last, s.blocked, client.written


EVENT = st.builds(lambda body: b"data: " + body + b"\n\n",
                  st.binary(max_size=40).filter(lambda b: b"\n\n" not in b))
PAYLOAD = st.one_of(
    st.lists(EVENT, min_size=1, max_size=4).map(b"".join),
    st.just(b'data: {"choices":[],"usage":{"completion_tokens":1}}\n\n'),
    st.just(b"data: [DONE]\n\n"),
    st.lists(EVENT, min_size=1, max_size=2).map(lambda es: b"".join(es) + b"data: [DONE]\n\n"),
    st.binary(max_size=60),
)


@st.composite
def reads(draw: st.DrawFn) -> bytes:
    payload = draw(PAYLOAD)
    size = draw(st.sampled_from([b"%x", b"%X", b"%04x", b"+%x", b"0x%x", b" %x", b"%x;e=1",
                                 b"%x ", b"1%x"])) % len(payload)
    shape = draw(st.sampled_from(["frame", "two", "half", "no-crlf", "raw"]))
    frame = size + b"\r\n" + payload + b"\r\n"
    if shape == "two":
        return frame + frame
    if shape == "half":
        return frame[: draw(st.integers(0, len(frame)))]
    if shape == "no-crlf":
        return size + b"\r\n" + payload
    if shape == "raw":
        return draw(st.binary(max_size=80))
    return frame


@given(data=reads(), now=st.floats(0, 1e6), pending=st.sampled_from([b"", b"data: x"]),
       closing=st.booleans(), paused_after=st.sampled_from([1, 1_000]))
def test_frame_matches_the_twin(data: bytes, now: float, pending: bytes, closing: bool,
                                paused_after: int) -> None:
    c = outcome(_speedups.FrameSplice, data, now, pending=pending, closing=closing,
                paused_after=paused_after)
    py = outcome(speedups.PyFrameSplice, data, now, pending=pending, closing=closing,
                 paused_after=paused_after)
    assert c == py


@pytest.mark.parametrize("kind", [_speedups.FrameSplice, speedups.PyFrameSplice])
def test_frame_takes_whole_events_and_counts_a_gap_each(kind: type[Any]) -> None:
    # The comparison above could pass with both refusing everything: the common case, by hand.
    payload = b"data: a\n\ndata: b\n\n"
    data = b"%x\r\n%b\r\n" % (len(payload), payload)
    assert outcome(kind, data, 3.5) == (True, [2.5, 0.0], 3.5, False, [data])
    assert outcome(kind, data, 3.5, paused_after=1) == (False, [2.5, 0.0], 3.5, True, [data])
    assert outcome(kind, data, 3.5, closing=True) == (True, [2.5, 0.0], 3.5, False, [])
    assert outcome(kind, data, 3.5, pending=b"data: x")[0] is None


def test_the_twins_share_the_relays_bytes() -> None:
    assert speedups._EVENT_END == sse.EVENT_END
    assert speedups._FRAME_END == sse.EVENT_END + b"\r\n"
    assert speedups._DONE_FRAME == sse.DONE_EVENT + b"\r\n"
    assert speedups._USAGE_KEY == sse.USAGE_KEY


def test_frame_holds_no_reference_it_should_not() -> None:
    client = Client(paused_after=10**9)
    s = splice(_speedups.FrameSplice, client, b"", 0.0)
    data = b"9\r\ndata: a\n\n\r\n"
    before = sys.getrefcount(data), sys.getrefcount(client.flow)
    for i in range(1_000):
        assert s.frame(data, float(i)) is True
    client.written.clear()
    assert (sys.getrefcount(data), sys.getrefcount(client.flow)) == before


def test_an_error_in_the_write_propagates() -> None:
    s = splice(_speedups.FrameSplice, Client(), b"", 0.0)

    def broken(_: bytes) -> None:
        raise OSError("gone")

    s._write = broken
    with pytest.raises(OSError, match="gone"):
        s.frame(b"9\r\ndata: a\n\n\r\n", 1.0)


# ---- the connection's data_received ----------------------------------------------------------


@dataclass
class Sink:
    """A sink in Python: answers `frame` with `answer`; records its calls."""

    answer: bool | None
    calls: list[tuple[bytes, float]] = field(default_factory=list)

    def frame(self, data: bytes, now: float) -> bool | None:
        self.calls.append((data, now))
        return self.answer


def entry(base: type[Any]) -> Any:
    class Conn(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            self.log: list[Any] = []
            self._time = lambda: 7.0
            self._last_read = -1.0

        def _parse(self, data: bytes) -> None:
            self.log.append(("parse", data))

        def _frame_stopped(self) -> None:
            self.log.append("stopped")

    return Conn()


@pytest.mark.parametrize("answer", [None, True, False])
@pytest.mark.parametrize("between", [False, True])
@pytest.mark.parametrize("armed", [False, True])
def test_data_received_matches_the_twin(answer: bool | None, between: bool, armed: bool) -> None:
    seen = []
    for base in (_speedups.FrameEntry, speedups.PyFrameEntry):
        conn = entry(base)
        sink = Sink(answer)
        conn._frame = sink if armed else None
        conn._between_chunks = between
        assert conn.data_received(b"read") is None
        seen.append((conn.log, sink.calls, conn._last_read))
    assert seen[0] == seen[1]
    log, calls, last = seen[0]
    offered = armed and between
    assert calls == ([(b"read", 7.0)] if offered else [])
    if offered and answer is not None:
        assert log == ([] if answer else ["stopped"])
        assert last == 7.0  # the read's time, for the request's Deadline
    else:
        assert log == [("parse", b"read")]
        assert last == -1.0  # parsed reads keep their time in Python (transport/h1.py)


def test_data_received_calls_a_subclass_override_of_frame() -> None:
    # The C entry calls FrameSplice's C `frame` directly, but only when the sink's class has not
    # overridden it (the tests' counting splices do).
    taken = []

    class Counting(_speedups.FrameSplice):  # type: ignore[misc]
        def frame(self, data: bytes, now: float) -> bool | None:
            more = super().frame(data, now)
            taken.append(more)
            return more

    client = Client()
    conn = entry(_speedups.FrameEntry)
    s = splice(Counting, client, b"", 0.0)
    conn._frame, conn._between_chunks = s, True
    conn.data_received(b"9\r\ndata: a\n\n\r\n")
    assert taken == [True] and client.written == [b"9\r\ndata: a\n\n\r\n"] and conn.log == []


def test_data_received_propagates_an_error_from_the_sink() -> None:
    conn = entry(_speedups.FrameEntry)

    class Broken:
        def frame(self, data: bytes, now: float) -> bool | None:
            raise ValueError("broken sink")

    conn._frame, conn._between_chunks = Broken(), True
    with pytest.raises(ValueError, match="broken sink"):
        conn.data_received(b"x")


# ---- the build -------------------------------------------------------------------------------


def test_the_gateway_runs_the_compiled_relay() -> None:
    if os.environ.get("LLMSERVE_PURE_PYTHON"):
        pytest.skip("the twins were asked for")
    assert speedups.COMPILED and speedups.FrameEntry is _speedups.FrameEntry
    assert speedups.FrameSplice is _speedups.FrameSplice


def test_the_built_extension_is_not_older_than_its_source() -> None:
    # An editable install builds the .so once; an edited .c with a stale .so beside it would test
    # the old code. `make install` rebuilds it when the source is newer.
    source = ROOT / "gateway" / "_speedups.c"
    built = Path(_speedups.__file__)
    assert built.stat().st_mtime >= source.stat().st_mtime, (
        f"{built.name} is older than {source.name}: run `make install`")


@pytest.mark.slow
def test_the_relay_tests_pass_on_the_python_twins() -> None:
    run_tests_with({"LLMSERVE_PURE_PYTHON": "1"},
              "not __import__('gateway.speedups', fromlist=['_']).COMPILED", RELAY_TESTS)


@pytest.mark.parametrize("kind", [_speedups.FrameSplice, speedups.PyFrameSplice])
def test_a_callee_that_rebinds_what_is_being_called(kind: type[Any]) -> None:
    # The C holds its own reference across each call: a callee that rebinds or drops the
    # attribute it was read from must not free it mid-call (run under both, same outcome).
    client = Client()
    s = splice(kind, client, b"", 0.0)
    other: list[bytes] = []

    def closing() -> bool:
        s._closing = lambda: False
        s._write = other.append
        return False

    def write(data: bytes) -> None:
        del s._write
        client.written.append(data)

    s._closing = closing
    data = b"9\r\ndata: a\n\n\r\n"
    assert s.frame(data, 1.0) is True and other == [data]
    s._write = write
    assert s.frame(data, 2.0) is True and client.written == [data]
    with pytest.raises(AttributeError):
        s.frame(data, 3.0)


def both(call: Any) -> list[Any]:
    """`call(kind)` for the C type and its twin: what it returned, or the exception's type."""
    out = []
    for kind in (_speedups.FrameSplice, speedups.PyFrameSplice):
        try:
            out.append(call(kind))
        except Exception as exc:  # noqa: BLE001 - the comparison is the point
            out.append(type(exc))
    return out


@pytest.mark.parametrize(("data", "now"), [
    (b"1\r\n\n\r\n", 1.0),  # a payload of one LF: the event end would span the size line
    (b"zz\r\ndata: a\n\n\r\n", 1.0),  # a bad size line
    (bytearray(b"9\r\ndata: a\n\n\r\n"), 1.0),  # not bytes
    (b"8\r\ndata: a\n\n\r\n", "soon"),  # a wrong size, and a `now` that is not a number
    (b"9\r\ndata: a\n\n\r\n", "soon"),  # taken, with a `now` that is not a number
])
def test_edge_inputs_end_alike(data: bytes, now: Any) -> None:
    def call(kind: type[Any]) -> Any:
        s = splice(kind, Client(), b"", 0.0)
        return s.frame(data, now)

    c, py = both(call)
    assert c == py


def test_a_clock_that_disarms_the_sink_does_not_free_it_under_the_entry() -> None:
    # The sink is held only by `_frame`; reading the clock drops it. The C holds its own
    # reference across the call (it crashed before), and the outcome is the twin's.
    seen = []
    for base in (_speedups.FrameEntry, speedups.PyFrameEntry):
        conn = entry(base)
        client = Client()

        def clock(conn: Any = conn) -> float:
            conn._frame = None
            return 5.0

        conn._frame = splice(_speedups.FrameSplice, client, b"", 0.0)
        conn._time, conn._between_chunks = clock, True
        assert conn.data_received(b"9\r\ndata: a\n\n\r\n") is None
        seen.append((client.written, conn.log))
    assert seen == [([b"9\r\ndata: a\n\n\r\n"], [])] * 2


def test_a_sink_answer_whose_truth_raises_propagates_after_the_read_time_moved() -> None:
    class Weird:
        def __bool__(self) -> bool:
            raise ValueError("no truth")

    class Sink:
        def frame(self, data: bytes, now: float) -> Any:
            return Weird()

    for base in (_speedups.FrameEntry, speedups.PyFrameEntry):
        conn = entry(base)
        conn._frame, conn._between_chunks = Sink(), True
        with pytest.raises(ValueError, match="no truth"):
            conn.data_received(b"x")
        assert conn._last_read == 7.0 and conn.log == []
