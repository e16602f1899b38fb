"""worker.startup_cpus: which CPUs vLLM starts on, read from its thread binding."""

from __future__ import annotations

import pytest

from worker.startup_cpus import bind_cpus, startup_cpus


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
