"""worker.drain: the middleware on its own, then the launcher draining a server that runs it."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from tests import loopback
from tests.openai_error import openai_error
from tests.ports import free_port
from tests.waiting import wait_for
from tests.worker.fake_http_engine import EVENTS, GAP_S
from worker.drain import DRAINING_CODE, DrainMiddleware

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.worker.conftest import Spawner

HERE = Path(__file__).resolve().parent


class App:
    """An engine whose requests wait until released."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.release = asyncio.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.calls.append(scope["path"])
        if scope["path"] != "/health":
            await self.release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"engine"})


async def call(app: Any, method: str, path: str) -> tuple[int, bytes]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app({"type": "http", "method": method, "path": path}, receive, send)
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


def test_drain_turns_health_to_503_refuses_new_requests_and_lets_running_ones_end(
    tmp_path: Path,
) -> None:
    flag = tmp_path / "draining"
    engine = App()
    mw = DrainMiddleware(engine, drain_file=str(flag))

    async def scenario() -> None:
        assert await call(mw, "GET", "/health") == (200, b"engine")
        running = asyncio.ensure_future(call(mw, "POST", "/v1/completions"))
        await asyncio.sleep(0.01)
        assert mw.in_flight == 1
        flag.touch()
        status, body = await call(mw, "GET", "/health")
        assert status == 503 and json.loads(body) == {"status": "draining", "in_flight": 1}
        status, body = await call(mw, "POST", "/v1/chat/completions")
        assert status == 503 and openai_error(body)["code"] == DRAINING_CODE
        # Not an inference request: still the engine's (metrics stay scrapeable while draining).
        engine.release.set()
        assert await call(mw, "GET", "/metrics") == (200, b"engine")
        assert await running == (200, b"engine")
        assert json.loads((await call(mw, "GET", "/health"))[1])["in_flight"] == 0

    asyncio.run(scenario())
    assert engine.calls.count("/v1/completions") == 1
    assert "/v1/chat/completions" not in engine.calls


def test_without_a_drain_file_the_middleware_only_passes_through() -> None:
    engine = App()
    engine.release.set()
    mw = DrainMiddleware(engine, drain_file=None)
    assert asyncio.run(call(mw, "GET", "/health")) == (200, b"engine")
    assert asyncio.run(call(mw, "POST", "/v1/completions")) == (200, b"engine")


def health(url: str) -> int:
    try:
        return loopback.get(url + "/health", timeout=2).status_code
    except httpx.TransportError:
        return 0


@pytest.mark.slow  # launcher and engine processes, a stream of seconds: ~3 s
def test_launcher_drains_streams_in_flight_before_it_stops_the_engine(
    tmp_path: Path, spawner: Spawner, make_model_dir: Callable[..., Path]
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    drain = 20.0
    launcher = spawner.start(
        [sys.executable, str(HERE / "run_launcher.py"), str(make_model_dir()), str(drain), "--",
         sys.executable, str(HERE / "fake_http_engine.py"), str(port)],
        stderr=subprocess.PIPE, env={"WORKER_HOST": "127.0.0.1", "WORKER_PORT": str(port)},
    )
    wait_for(lambda: health(url) == 200, 30, "the fake engine never answered /health")
    chunks: list[bytes] = []
    first = threading.Event()

    def stream() -> None:
        with loopback.stream("POST", url + "/v1/completions", json={}, timeout=30) as r:
            for chunk in r.iter_bytes():
                chunks.append(chunk)
                first.set()

    reader = threading.Thread(target=stream)
    reader.start()
    assert first.wait(10)
    started = time.monotonic()
    launcher.send_signal(signal.SIGTERM)
    wait_for(lambda: health(url) == 503, 5, "/health never turned 503")
    r = loopback.post(url + "/v1/completions", json={}, timeout=5)
    assert r.status_code == 503 and r.json()["error"]["code"] == DRAINING_CODE
    _, stderr = launcher.communicate(timeout=drain + 15)
    elapsed = time.monotonic() - started
    reader.join(10)

    text = b"".join(chunks).decode()
    assert text.endswith("data: [DONE]\n\n") and text.count("data: ") == EVENTS + 1, text
    # It waited for the stream (about EVENTS x GAP_S from its start), not for the timeout.
    assert elapsed < drain / 2
    assert "draining: not ready, new requests refused, 1 in flight" in stderr
    assert "drained: no request in flight" in stderr and "SIGKILL" not in stderr
    # The engine's own exit status (uvicorn re-raises SIGTERM after its shutdown), not SIGKILL's.
    assert launcher.returncode in (0, 128 + signal.SIGTERM)
    assert health(url) == 0  # and the engine is gone
    assert EVENTS * GAP_S > 1  # the stream outlived the signal by a measurable margin


@pytest.mark.slow  # launcher and engine processes, a stream of seconds: ~3 s
def test_a_follower_keeps_its_stages_up_until_its_leader_has_drained(
    tmp_path: Path, spawner: Spawner, make_model_dir: Callable[..., Path]
) -> None:
    """A multi-node group removed by a scale-down or a rollout: every pod gets SIGTERM. The
    follower's pipeline stages carry the leader's streams, so it stops only once the leader has
    drained them, even when its own signal comes first."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    drain = 20.0
    model = make_model_dir()
    logs = {role: tmp_path / f"{role}.log" for role in ("leader", "follower")}
    with open(logs["leader"], "w") as err:
        leader = spawner.start(
            [sys.executable, str(HERE / "run_launcher.py"), str(model), str(drain), "--",
             sys.executable, str(HERE / "fake_http_engine.py"), str(port)],
            stderr=err, env={"WORKER_HOST": "127.0.0.1", "WORKER_PORT": str(port)},
        )
    with open(logs["follower"], "w") as err:
        follower = spawner.start(
            [sys.executable, str(HERE / "run_launcher.py"), str(model), str(drain), "--",
             sys.executable, "-c", "import time; time.sleep(120)"],  # its engine ranks
            stderr=err,
            env={"WORKER_NNODES": "2", "WORKER_NODE_RANK": "1", "WORKER_MASTER_ADDR": "127.0.0.1",
                 "WORKER_PIPELINE_PARALLEL_SIZE": "2", "WORKER_PORT": str(port)},
        )
    wait_for(lambda: health(url) == 200, 30, "the fake engine never answered /health")
    # The engines run in groups of their own: end them at teardown even if the test fails.
    for log in logs.values():
        wait_for(lambda log=log: "started vLLM: pid=" in log.read_text(), 10, "no engine pid")
        spawner.track(int(re.search(r"started vLLM: pid=(\d+)", log.read_text())[1]))
    chunks: list[bytes] = []
    first = threading.Event()
    ended: list[float] = []

    def stream() -> None:
        with loopback.stream("POST", url + "/v1/completions", json={}, timeout=30) as r:
            for chunk in r.iter_bytes():
                chunks.append(chunk)
                first.set()
        ended.append(time.monotonic())

    reader = threading.Thread(target=stream)
    reader.start()
    assert first.wait(10)
    follower.send_signal(signal.SIGTERM)  # the follower hears it first
    time.sleep(0.3)
    assert follower.poll() is None  # still up: its leader serves a stream
    leader.send_signal(signal.SIGTERM)
    follower.wait(drain + 15)
    stopped = time.monotonic()
    reader.join(10)
    leader.wait(drain + 15)
    stderr = logs["follower"].read_text()

    assert b"".join(chunks).decode().endswith("data: [DONE]\n\n")
    assert ended and stopped >= ended[0]  # the stream ended before the follower's stages
    assert "follower: waiting for the leader's drain" in stderr
    assert ("the leader has drained" in stderr or "the leader is gone" in stderr), stderr
    assert "SIGKILL" not in stderr
