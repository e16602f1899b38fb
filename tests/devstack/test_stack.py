"""devstack's wait for a process's HTTP endpoint: a hung start is told from a slow one."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from devstack.procs import Proc
from devstack.stack import LocalStack, Stalled, wait_http_ok
from tests.ports import free_port

# Real processes watched over windows of seconds (the stall rule's 2 s): full tier only.
pytestmark = pytest.mark.slow

SILENT = "import time; print('started', flush=True); time.sleep(30)"
CHATTY = "import time\nwhile True:\n    print('compiling', flush=True); time.sleep(0.2)"
# Compiles in silence: no log line, but CPU used all along (a start starved of CPU looks alike).
BUSY = "print('started', flush=True)\nwhile True:\n    pass"
# Silent, and a little CPU now and then (~10 ms every 0.5 s): the worker's launcher polling
# while the vLLM below it is stuck in the kernel. It accrues CPU ticks in every window, which the
# old rule ("any CPU at all") took for progress.
POLLING = ("import time\nprint('started', flush=True)\nwhile True:\n    time.sleep(0.5)\n"
           "    end = time.process_time() + 0.01\n    while time.process_time() < end:\n"
           "        pass")


def _proc(tmp_path: Path, code: str) -> Proc:
    return Proc("engine", [sys.executable, "-c", code], {}, tmp_path / "engine.log")


@pytest.mark.parametrize("code", [SILENT, POLLING], ids=["sleeping", "polling"])
def test_a_start_whose_log_goes_silent_is_a_stall(tmp_path: Path, code: str) -> None:
    p = _proc(tmp_path, code)
    try:
        with pytest.raises(Stalled, match="engine silent and idle for 2s"):
            # 5% of a core over the 2 s window is 100 ms: POLLING's ~40 ms is not progress.
            wait_http_ok(f"http://127.0.0.1:{free_port()}/health", 20, [p], stall_s=2.0,
                         cpu_share=0.05)
    finally:
        p.stop(grace_s=2)


@pytest.mark.parametrize("code", [CHATTY, BUSY], ids=["logging", "silent-but-busy"])
def test_a_start_that_logs_or_uses_cpu_is_only_slow(tmp_path: Path, code: str) -> None:
    p = _proc(tmp_path, code)
    try:
        with pytest.raises(TimeoutError) as info:
            wait_http_ok(f"http://127.0.0.1:{free_port()}/health", 3.5, [p], stall_s=2.0)
        assert not isinstance(info.value, Stalled)
    finally:
        p.stop(grace_s=2)


def test_a_pooling_pool_starts_beside_the_workers_under_a_name_of_its_own(
    tmp_path: Path,
) -> None:
    """The argv each worker would run, and the backends the gateway gets (nothing started)."""
    model = tmp_path / "SmolLM2-135M-Instruct"
    s = LocalStack(model, workers=2, worker_base_port=9100, pooling_workers=1,
                   responses_store=True)
    assert s.pooling_urls == ["http://127.0.0.1:9102"]
    assert s.pooling_model == "SmolLM2-135M-Instruct-embed"
    backends = [s.gateway_flags()[i + 1] for i, f in enumerate(s.gateway_flags())
                if f == "--backend"]
    assert backends == [*s.worker_urls, *s.pooling_urls]
    hidden = LocalStack(model, pooling_workers=1, pooling_behind_gateway=False)
    assert hidden.pooling_urls[0] not in hidden.gateway_flags()
    argv = s._pooling_proc_argv(0)
    assert argv[argv.index("--served-model-name") + 1] == "SmolLM2-135M-Instruct-embed"
    assert argv[argv.index("--runner") + 1] == "pooling"
    assert argv[argv.index("--port") + 1] == "9102" and "--responses-store" not in argv
    assert "--responses-store" in s._generating_argv(0)
