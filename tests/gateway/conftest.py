"""Fixtures for gateway tests: a real gateway (uvicorn, in a thread) in front of fake upstreams."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest
import uvicorn

from bench.fake_upstream import Behaviour, FakeUpstream, start_in_thread
from gateway.app import build_app
from gateway.edge import Edge, EdgeProtocol
from gateway.flow.keys import hash_key
from gateway.settings import GatewaySettings
from tests import loopback
from tests.ports import free_port
from tests.redisserver import RedisServer, redis_server
from tests.threadserver import serve_in_thread
from tests.waiting import metric_sum, scrape

REPO = Path(__file__).resolve().parents[2]


class ClientWriter:
    """A ClientWriter (gateway/api/splice.py) over a recording transport; its buffer is full
    after `room` writes."""

    def __init__(self, room: int = 1_000) -> None:
        self.room = room
        self.frames: list[bytes] = []
        self.transport = self
        self.write_paused = False
        self.closed = False

    @property
    def written(self) -> list[bytes]:
        """The bodies written, unframed (each frame checked)."""
        out = []
        for frame in self.frames:
            size, _, rest = frame.partition(b"\r\n")
            assert rest.endswith(b"\r\n") and int(size, 16) == len(rest) - 2
            out.append(rest[:-2])
        return out

    def write(self, frame: bytes) -> None:
        self.frames.append(frame)
        self.write_paused = len(self.frames) >= self.room

    async def drain(self) -> None:
        return None


class RunningGateway:
    def __init__(self, url: str, app: Any) -> None:
        self.url = url
        self.app = app

    def metric(self, name: str) -> float:
        """Sum of all samples of `name` in the gateway's /metrics."""
        return metric_sum(scrape(self.url), name)


@contextlib.contextmanager
def run_gateway(*, expect_ready: bool = True, edge: bool = True, keep_alive_s: float = 5,
                loop: Literal["asyncio", "uvloop"] = "asyncio",
                **settings: Any) -> Iterator[RunningGateway]:
    """A gateway on a free port in a thread; waits until it is up and has probed every backend up
    (unless told not to: a gateway whose backends are dead never gets there). `edge=False` serves
    it with uvicorn's plain httptools protocol, which offers the proxy no direct body writer;
    `loop="uvloop"` on the event loop `python -m gateway` runs."""
    port = free_port()
    s = GatewaySettings(**{"host": "127.0.0.1", "port": port, "health_interval_s": 0.2,
                           **settings})
    app = build_app(s)
    # The production protocol (gateway/edge/), so every gateway test also drives the edge.
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error", lifespan="on",
                            loop=loop, interface="asgi3", ws="none",  # as gateway/server.py
                            timeout_keep_alive=keep_alive_s,  # type: ignore[arg-type]
                            http=EdgeProtocol.bound(Edge(s.edge, app.state.metrics))
                            if edge else "httptools")
    url = f"http://127.0.0.1:{port}"
    with serve_in_thread(config):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.TransportError):
                if not (expect_ready and s.backends):
                    if loopback.get(url + "/health").status_code == 200:
                        break
                # Every backend probed up, not only the first: retry and balance tests need all.
                elif RunningGateway(url, app).metric("llmserve_backend_up") == len(set(s.backends)):
                    break
            time.sleep(0.01)
        yield RunningGateway(url, app)


UpstreamFactory = Callable[..., FakeUpstream]


@pytest.fixture
def upstreams() -> Iterator[UpstreamFactory]:
    """Start fake upstreams on demand; all are stopped at teardown."""
    stack = contextlib.ExitStack()

    def make(**behaviour: Any) -> FakeUpstream:
        return stack.enter_context(start_in_thread(Behaviour(**behaviour)))

    with stack:
        yield make


def url_of(up: FakeUpstream) -> str:
    return f"http://127.0.0.1:{up.port}"


@contextlib.contextmanager
def spawned_gateway(
    args: Sequence[str] = (), env: Mapping[str, str] | None = None, ready_path: str = "/ready",
    main: Sequence[str] = ("-m", "gateway"),
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """`python -m gateway` as a process of its own on a free loopback port, with `args` and, if
    given, `env`'s GATEWAY_* settings in place of the test process's own; yielded once
    `ready_path` answers 200 (a start that fails raises with the gateway's stderr), killed at
    exit. stderr is a pipe: read it after the process ended. `main`: what python runs."""
    port = free_port()
    child_env = None
    if env is not None:
        child_env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
        child_env.update(env)
    gw = subprocess.Popen([sys.executable, *main, "--host", "127.0.0.1", "--port",
                           str(port), *args], cwd=REPO, env=child_env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(httpx.TransportError):
                if loopback.get(url + ready_path, timeout=1).status_code == 200:
                    break
            if gw.poll() is not None or time.monotonic() > deadline:
                gw.kill()
                err = gw.stderr.read() if gw.stderr else ""
                raise RuntimeError(f"gateway did not get ready: {err[-2000:]}")
            time.sleep(0.05)
        yield gw, url
    finally:
        if gw.poll() is None:
            gw.kill()
            gw.wait()
        assert gw.stderr is not None
        gw.stderr.close()


@contextlib.contextmanager
def gateway_process(
    up: FakeUpstream, *flags: str, main: Sequence[str] = ("-m", "gateway"),
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """`python -m gateway` (or `main`) in front of `up`, ready (its backend probed up); killed
    at exit."""
    with spawned_gateway(["--backend", url_of(up), "--health-interval-s", "0.2", *flags],
                         main=main) as gw:
        yield gw


class BackgroundStream:
    """A streamed chat completion read on a thread of its own (while a test signals the
    gateway, say): `flowing()` returns once its first bytes came, `join()` gives its text."""

    def __init__(self, url: str, max_tokens: int = 50) -> None:
        self._text = ""
        self._first = threading.Event()
        self._thread = threading.Thread(target=self._read, args=(url, max_tokens))
        self._thread.start()

    def _read(self, url: str, max_tokens: int) -> None:
        chunks: list[str] = []
        with loopback.stream("POST", url + "/v1/chat/completions", timeout=30, json={
                "model": "demo", "stream": True, "max_tokens": max_tokens,
                "messages": [{"role": "user", "content": "hi"}]}) as r:
            for chunk in r.iter_text():
                chunks.append(chunk)
                self._first.set()
        self._text = "".join(chunks)

    def flowing(self, timeout_s: float = 30) -> None:
        """Return once the stream's first bytes arrived: the request is in, and mid-stream (a
        fixed sleep is not enough on a loaded machine, where connecting may take seconds)."""
        assert self._first.wait(timeout_s), f"the stream sent nothing in {timeout_s:g} s"

    def join(self, timeout_s: float = 30) -> str:
        self._thread.join(timeout_s)
        return self._text


def write_keys(directory: Path, keys: dict[str, dict[str, Any]]) -> Path:
    """An API keys file (gateway/flow/keys.py's format) in `directory`: each key, stored as the
    gateway expects it (its SHA-256), with its tenant and limits."""
    path = directory / "keys.json"
    path.write_text(json.dumps({"keys": [{"sha256": hash_key(key), **entry}
                                         for key, entry in keys.items()]}))
    return path


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A real redis-server of the test's own (tests/redisserver.py), stopped after it."""
    with redis_server(tmp_path) as server:
        yield server


def create_response(url: str, stream: bool = False) -> str:
    """A Responses API answer created at `url` (whole or streamed): its id."""
    r = loopback.post(url + "/v1/responses", timeout=10,
                      json={"model": "demo", "input": "x", "stream": stream})
    assert r.status_code == 200, r.text
    if stream:
        first = r.text.split("\n\n")[0].split("data: ", 1)[1]
        return str(json.loads(first)["id"])
    return str(r.json()["id"])
