"""The real-engine stack: 2 data-parallel vLLM-CPU workers behind the gateway, once per session."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from openai import OpenAI

from devstack.procs import Proc
from devstack.stack import LocalStack, wait_http_ok
from tests import loopback
from tests.ports import free_port, free_port_pair, free_port_run
from tests.waiting import scrape

if TYPE_CHECKING:
    from tests.e2e.kv_watch import KvWatch


@pytest.fixture(scope="session")
def stack(s3_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    # The workers serve the demo model as pulled from the loopback S3 server (model_store push, then
    # pull), so every engine test also runs on a model that came through S3.
    base = free_port_pair()
    logs = tmp_path_factory.mktemp("stack-logs")
    s = LocalStack(
        s3_model_dir,
        workers=2,
        gateway_port=free_port(),
        worker_base_port=base,
        log_dir=logs,
        # KV cache events on (test_kv_events.py): two ports per worker, no cost to the others.
        kv_events_base_port=free_port_run(4),
        # Fast probes so the failover test sees ejection and recovery within seconds.
        gateway_args=["--health-interval-s", "0.5", "--eject-for-s", "3",
                      "--timeouts.first-byte-s", "120"],
        # Stored responses for tests/e2e/test_responses_and_pooling.py's conversation.
        responses_store=True,
        # The demo model as an embedding model, started with the two workers (in parallel, not
        # a session of its own after them); test_responses_and_pooling.py's gateways front it,
        # the stack's gateway does not (its tests count on two replicas of one model).
        pooling_workers=1,
        pooling_base_port=free_port(),
        pooling_behind_gateway=False,
    )
    yield from running(s)


@pytest.fixture
def resuming_gateway(stack: LocalStack, tmp_path: Path) -> Iterator[str]:
    """A gateway process of its own (its URL) in front of the session's workers, with the stack
    gateway's flags plus streams that survive their replica (`--stream-resumes 2`). Resuming asks
    the engines for token ids on every stream, a cost the other engine tests need not carry nor
    depend on, and the stack's gateway keeps the default (off) for them."""
    port = free_port()
    argv = [sys.executable, "-m", "gateway", *stack.gateway_flags(), "--port", str(port),
            "--stream-resumes", "2"]
    proc = Proc("gateway-resuming", argv, dict(os.environ), tmp_path / "gateway-resuming.log")
    url = f"http://{stack.host}:{port}"
    try:
        wait_http_ok(url + "/ready", 60, [proc])
        yield url
    finally:
        proc.stop()
        print(f"--- {proc.name} ---\n{proc.tail(20)}")


def running(s: LocalStack) -> Iterator[LocalStack]:
    """A stack fixture's body: workers, then the gateway, up; their logs' tails if one fails;
    everything stopped at the end."""
    try:
        t0 = time.monotonic()
        s.start_workers()
        s.wait_workers(timeout_s=float(os.environ.get("LLMSERVE_ENGINE_START_TIMEOUT_S", "900")))
        print(f"\nworkers up in {time.monotonic() - t0:.0f} s", flush=True)
        s.start_gateway()
        s.wait_gateway(timeout_s=60)
    except BaseException:
        s.stop()
        for p in s.all_procs():
            print(f"--- {p.name} ---\n{p.tail(60)}")
        raise
    yield s
    s.stop()


@pytest.fixture(scope="session")
def kv_watch(stack: LocalStack) -> Iterator[KvWatch]:
    """The stack's KV events and index resets, from the first test that asks on (kv_watch.py)."""
    from tests.e2e.kv_watch import KvWatch  # pyzmq and msgspec only for the tests that use it

    w = KvWatch(stack.worker_urls, stack.kv_endpoints())
    w.start()
    yield w
    w.stop()


@pytest.fixture(scope="session")
def model_name(real_model_dir: Path) -> str:
    return real_model_dir.name


# A Responses API conversation on the stack's engines (responses_store): each turn names the
# previous one's id (test_responses_and_pooling.py, test_epp.py).
TURNS = ["What is the capital of France?", "And of Italy?", "Which of the two is larger?"]


def conversation(bases: list[str], model: str) -> list[tuple[str, str]]:
    """The three turns, turn i sent to bases[i % len(bases)]: (response id, its text)."""
    out: list[tuple[str, str]] = []
    previous: str | None = None
    for i, text in enumerate(TURNS):
        client = OpenAI(base_url=bases[i % len(bases)] + "/v1", api_key="unused", max_retries=0)
        kwargs: dict[str, Any] = {"previous_response_id": previous} if previous else {}
        r = client.responses.create(model=model, input=text, temperature=0, max_output_tokens=24,
                                    **kwargs)
        assert r.status == "completed", r
        out.append((r.id, r.output_text))
        previous = r.id
    return out


def served_by(gateway_url: str, model: str | None = None) -> dict[str, float]:
    """Requests the gateway's replicas answered 200 (of `model` alone, when given), per backend,
    from its llmserve_requests_total."""
    out: dict[str, float] = {}
    for k, v in scrape(gateway_url).items():
        if (k.startswith("llmserve_requests_total{") and 'status="200"' in k
                and (model is None or f'model="{model}"' in k)):
            backend = k.split('backend="', 1)[1].split('"', 1)[0]
            out[backend] = out.get(backend, 0.0) + v
    return out


def assert_stored(base: str, turns: list[tuple[str, str]]) -> None:
    """Every turn of a conversation() is found by its id at `base`, with its text."""
    for rid, text in turns:
        r = loopback.get(f"{base}/v1/responses/{rid}", timeout=30)
        assert r.status_code == 200, r.text
        got = r.json()
        assert got["id"] == rid
        assert "".join(c["text"] for o in got["output"] if o["type"] == "message"
                       for c in o["content"] if c["type"] == "output_text") == text


def cancel_answer(base: str, turns: list[tuple[str, str]]) -> tuple[int, str]:
    """The status and error message of cancelling a conversation()'s last, finished response."""
    r = loopback.post(f"{base}/v1/responses/{turns[-1][0]}/cancel", timeout=30)
    return r.status_code, r.json()["error"]["message"]
