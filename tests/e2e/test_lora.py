"""LoRA adapters on real engines (issue 27's acceptance): real PEFT adapters for the demo model,
through the loopback S3 server, loaded at start and at run time on two vLLM-CPU replicas behind
the gateway, and back on a replica that was killed and restarted without anyone re-adding them.

Its own stack (workers with --lora-adapters): LoRA turns vLLM's compilation off, so these engines
are not the session's `stack`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from openai import OpenAI

from devstack.stack import LocalStack
from model_store.marker import read_marker
from tests import loopback
from tests.conftest import REPO, S3Env
from tests.e2e.conftest import running, served_by
from tests.ports import free_port, free_port_pair
from tests.waiting import scrape

pytestmark = pytest.mark.engine

ADMIN_KEY = "e2e-admin-key-0123456789"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
# Seeds of the two adapters: "sql" is declared by the pool, "chat" added at run time.
SEEDS = {"sql": 1, "chat": 2}


def make_adapter(model_dir: Path, dest: Path, seed: int) -> None:
    """A real adapter (PEFT, seeded, lora_B scaled: devstack/adapter.py), in a process of its
    own (transformers' and PEFT's warnings are not this test's)."""
    proc = subprocess.run(
        [sys.executable, "-m", "devstack", "demo-adapter", "--model-dir", str(model_dir),
         "--dest", str(dest), "--seed", str(seed)],
        capture_output=True, text=True, timeout=300, cwd=REPO, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.fixture(scope="module")
def adapter_dirs(s3: S3Env, s3_model_dir: Path,
                 tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each adapter made, pushed to S3 and pulled back for the base model, as a pool's fetch does:
    the directories the workers load."""
    made = tmp_path_factory.mktemp("made")
    volume = tmp_path_factory.mktemp("volume")
    bucket = s3.bucket()
    out = {}
    for name, seed in SEEDS.items():
        make_adapter(s3_model_dir, made / name, seed)
        url = f"s3://{bucket}/adapters/{name}/v1"
        pushed = s3.cli("push", made / name, url)
        assert pushed.returncode == 0, pushed.stderr
        dest = volume / "adapters" / name / "v1"
        pulled = s3.cli("pull", url, dest, "--base-model", s3_model_dir.name)
        assert pulled.returncode == 0, pulled.stderr
        marker = read_marker(dest)
        assert marker is not None and marker.adapter is not None
        assert marker.adapter.base_model.endswith(s3_model_dir.name)
        out[name] = dest
    return out


@pytest.fixture(scope="module")
def lora_stack(s3_model_dir: Path, adapter_dirs: dict[str, Path],
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    base = s3_model_dir.name
    s = LocalStack(
        s3_model_dir, workers=2, gateway_port=free_port(), worker_base_port=free_port_pair(),
        log_dir=tmp_path_factory.mktemp("lora-logs"),
        # "sql" declared by the pool; room for the one added at run time.
        worker_args=["--lora-adapters", f"sql={adapter_dirs['sql']}", "--max-loras", "2"],
        gateway_args=["--health-interval-s", "0.5", "--admin-key", ADMIN_KEY,
                      "--lora.max-loras", json.dumps({base: 2}),
                      "--timeouts.first-byte-s", "120"],
    )
    yield from running(s)


def ask(url: str, model: str) -> str:
    client = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
    r = client.chat.completions.create(model=model, messages=QUESTION, temperature=0,  # type: ignore[arg-type]
                                       max_tokens=16)
    return r.choices[0].message.content or ""


def test_a_declared_adapter_answers_differently_from_both_replicas(
    lora_stack: LocalStack
) -> None:
    base = lora_stack.model_dir.name
    # Each replica itself: both loaded the adapter and answer alike, the base model "Paris".
    adapter_answers = {ask(u, "sql") for u in lora_stack.worker_urls}
    base_answers = {ask(u, base) for u in lora_stack.worker_urls}
    assert len(adapter_answers) == 1 and len(base_answers) == 1, (adapter_answers, base_answers)
    adapter, plain = adapter_answers.pop(), base_answers.pop()
    assert "Paris" in plain and adapter != plain, (adapter, plain)

    # Through the gateway, with the OpenAI SDK unchanged: model=<adapter> and model=<base>.
    gw = lora_stack.gateway_url
    assert {ask(gw, "sql") for _ in range(6)} == {adapter}
    assert ask(gw, base) == plain
    assert set(served_by(gw, "sql")) == set(lora_stack.worker_urls)  # from both replicas

    client = OpenAI(base_url=gw + "/v1", api_key="unused", max_retries=0)
    listed = {m.id: m for m in client.models.list().data}
    assert getattr(listed["sql"], "parent", None) == base
    with pytest.raises(openai.NotFoundError) as missing:
        ask(gw, "no-such-adapter")
    assert missing.value.code == "model_not_found"
    stream = client.chat.completions.create(model="sql", messages=QUESTION,  # type: ignore[arg-type]
                                            temperature=0, max_tokens=16, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == adapter
    metrics = scrape(gw)
    assert metrics[f'llmserve_adapter_info{{adapter="sql",base="{base}"}}'] == 1
    assert metrics['llmserve_ttft_seconds_count{model="sql"}'] >= 1
    assert not [k for k in metrics if "no-such-adapter" in k]


def test_a_runtime_adapter_is_back_on_a_killed_and_restarted_replica(
    lora_stack: LocalStack, adapter_dirs: dict[str, Path]
) -> None:
    base = lora_stack.model_dir.name
    gw = lora_stack.gateway_url
    auth = {"authorization": f"Bearer {ADMIN_KEY}"}
    added = loopback.post(gw + "/admin/adapters", headers=auth, timeout=120, json={
        "name": "chat", "base": base, "path": str(adapter_dirs["chat"])})
    assert added.status_code == 200, added.text
    assert added.json()["replicas"] == {u: "loaded" for u in lora_stack.worker_urls}
    answers = {ask(u, "chat") for u in lora_stack.worker_urls}
    assert len(answers) == 1
    chat = answers.pop()
    assert chat not in (ask(gw, "sql"), ask(gw, base))
    assert {ask(gw, "chat") for _ in range(6)} == {chat}
    assert set(served_by(gw, "chat")) == set(lora_stack.worker_urls)

    # Worker 1 crashes (SIGKILL, engine and all) and starts again with its declared adapters.
    t0 = time.monotonic()
    lora_stack.restart_worker(1, timeout_s=900, kill=True)
    print(f"\nworker 1 killed and serving again in {time.monotonic() - t0:.0f} s", flush=True)
    w1 = lora_stack.worker_urls[1]
    deadline = time.monotonic() + 60
    while "chat" not in [m["id"] for m in loopback.get(w1 + "/v1/models").json()["data"]]:
        assert time.monotonic() < deadline, "the gateway did not load the adapter back"
        time.sleep(0.5)
    print(f"adapter back on worker 1 {time.monotonic() - t0:.0f} s after the kill", flush=True)
    assert ask(w1, "chat") == chat
    before = served_by(gw, "chat").get(w1, 0.0)
    deadline = time.monotonic() + 30
    while served_by(gw, "chat").get(w1, 0.0) == before:  # the gateway routes it there again
        assert time.monotonic() < deadline, "the gateway never sent chat to worker 1 again"
        assert ask(gw, "chat") == chat
    loads = scrape(gw)
    assert loads['llmserve_adapter_loads_total{outcome="ok"}'] == 3  # 2 added, 1 re-applied
