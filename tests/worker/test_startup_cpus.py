"""worker.startup_cpus: which CPUs vLLM starts on, read from its thread binding."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from worker.startup_cpus import bind_cpus, release, startup_cpus


@pytest.mark.parametrize(("bind", "cpus"), [
    ("0", {0}),
    ("1", {1}),
    ("0|1", {0, 1}),
    ("0-2,5|6", {0, 1, 2, 5, 6}),
    (" 3 ", {3}),
])
def test_the_cpus_of_a_bind(bind: str, cpus: set[int]) -> None:
    assert bind_cpus(bind) == cpus


@pytest.mark.parametrize("bind", [None, "", "auto", "nobind", "x", "0-", "|"])
def test_keywords_and_what_does_not_parse_name_no_cpus(bind: str | None) -> None:
    assert bind_cpus(bind) is None


def test_start_on_the_bind_only_when_it_narrows_what_is_allowed() -> None:
    assert startup_cpus("0", [0, 1]) == {0}
    assert startup_cpus("1|2", [0, 1, 2, 3]) == {1, 2}
    # Nothing to narrow: the bind is every allowed CPU, or none of them, or not a CPU list.
    assert startup_cpus("0|1", [0, 1]) is None
    assert startup_cpus("5", [0, 1]) is None
    assert startup_cpus("auto", [0, 1]) is None
    # A bind reaching beyond what this process may use is cut to what it may.
    assert startup_cpus("1-3", [0, 1]) == {1}


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to narrow to one")
@pytest.mark.parametrize(("env", "title", "widened"), [
    ({}, "VLLM::EngineCore", True),
    ({"VLLM_PROCESS_NAME_PREFIX": "ACME"}, "ACME::EngineCore_DP0", True),
    ({}, "VLLM::Worker_TP0", False),  # a model rank keeps vLLM's binding
    ({}, "python", False),  # nothing recognised: left as it was, which is safe
    # The model runs inside the API server: its threads are vLLM's to bind.
    ({"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}, "VLLM::EngineCore", False),
])
def test_release_widens_the_engine_core_and_nothing_it_does_not_recognise(
    env: dict[str, str], title: str, widened: bool
) -> None:
    mine = frozenset(os.sched_getaffinity(0))
    one = min(mine)
    child = subprocess.Popen([title, "-c", "import time; time.sleep(30)"],
                             executable=sys.executable,
                             preexec_fn=lambda: os.sched_setaffinity(0, {one}))  # noqa: PLW1509
    try:
        # The leader here is this test process: only the child is judged by its title.
        leader = os.getpid()
        release(leader, [child.pid], mine, env)
        assert os.sched_getaffinity(child.pid) == (mine if widened else {one})
    finally:
        child.kill()
        child.wait()
