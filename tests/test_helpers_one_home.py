"""The suite's shared helpers each have one home (issue 37, item 15): a second definition of the
same helper in another test module drifts from the first (two `metric_sum`s once read the same
series from different parses)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# Helper -> its home, relative to tests/.
HOMES = {
    "wait_for": "waiting.py",
    "settle": "waiting.py",
    "metric_sum": "waiting.py",
    "scrape": "waiting.py",
    "write_keys": "gateway/conftest.py",
    "collect": "kubeapi.py",
    "conversation": "e2e/conftest.py",
    "assert_stored": "e2e/conftest.py",
    "cancel_answer": "e2e/conftest.py",
    "gateway_loads_keys": "deploy/conftest.py",
    "probed_backends": "gateway/routing/conftest.py",
    "create_response": "gateway/conftest.py",
    "pool_values": "deploy/conftest.py",
    "openai_error": "openai_error.py",
    "assert_openai_error": "openai_error.py",
}


def test_each_shared_helper_is_defined_in_its_home_only() -> None:
    found: dict[str, list[str]] = {name: [] for name in HOMES}
    for path in sorted(TESTS.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:  # module level: a nested helper is its test's own business
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in found:
                found[node.name].append(str(path.relative_to(TESTS)))
    assert {name: where for name, where in found.items() if where != [HOMES[name]]} == {}
