"""Pooling pools in the chart (worker/rules.py's runner rule): the template's reading of "this
pool pools" is the rule's, for every runner and conversion, and a model name served by a pooling
pool and a generating one is refused (the gateway routes by name)."""

from __future__ import annotations

from typing import Any

import helm_python
import pytest

from tests.deploy.conftest import pool_values
from tests.deploy.manifests import env_of, render
from worker.rules import CONVERTS, RUNNERS, is_pooling, runner_problem

pytestmark = pytest.mark.helm

PAIRS = [(r, c) for r in RUNNERS for c in CONVERTS if runner_problem(r, c) is None]


@pytest.mark.parametrize(("runner", "convert"), PAIRS)
def test_the_chart_reads_a_pooling_pool_as_the_rule_does(
    loaded_chart: helm_python.Chart, runner: str, convert: str
) -> None:
    """Beside a generating pool of the same served name, exactly the pooling pairs are refused."""
    values: dict[str, Any] = {"models": [
        pool_values("gen", runner="generate"),
        pool_values("other", runner=runner, convert=convert),
    ]}
    if is_pooling(runner, convert):
        with pytest.raises(helm_python.HelmError) as err:
            render(values, loaded=loaded_chart)
        assert "servedModelName \"demo-model\" is served by a generate pool and a pooling pool" in (
            str(err.value))
    else:
        rel = render(values, loaded=loaded_chart)
        assert len(rel.worker_pods()) == 2


def test_a_pooling_pool_of_its_own_renders_its_settings(loaded_chart: helm_python.Chart) -> None:
    rel = render({"models": [
        pool_values("gen", responsesStore=True),
        pool_values("embed", runner="pooling", convert="embed", servedModelName="demo-embed"),
    ]}, loaded=loaded_chart)
    env = {p.metadata["labels"]["llmserve.io/pool"]: env_of(p.container("worker"))
           for p in rel.worker_pods()}
    assert env["embed"]["WORKER_RUNNER"] == "pooling"
    assert env["embed"]["WORKER_CONVERT"] == "embed"
    assert "WORKER_RESPONSES_STORE" not in env["embed"]
    assert env["gen"]["WORKER_RESPONSES_STORE"] == "true"
    # vLLM's defaults stay vLLM's: no setting rendered for them.
    assert not {"WORKER_RUNNER", "WORKER_CONVERT"} & set(env["gen"])
