"""The overview's SLO burn-rate panel and the chart's burn-rate alerts read one SLO: the chart's
metrics.prometheusRule.ttftSloSeconds and ttftSloObjective. Rendered with the defaults and with
other values, the shipped dashboard's panel and the PrometheusRule's expressions give the same
burn rate on the same series of a real Prometheus (Debian's), and the panel's dashed lines sit at
the alerts' thresholds."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python
import pytest

from deploy.dashboards.common import substitute
from tests.deploy.manifests import CHART, NAMESPACE, Release, load_values, render
from tests.prometheusserver import PrometheusServer, Target, prometheus_server
from tests.syntheticexporter import Series, synthetic_exporter

pytestmark = [pytest.mark.helm, pytest.mark.prometheus]

GATEWAY_JOB = "llm-llmserve-gateway"  # the ServiceMonitor's job for release "llm"
# Share of streams whose first token came within each bucket bound (le as prometheus_client
# writes it); 100 streams a second.
WITHIN = {"0.5": 0.6, "1.0": 0.9, "2.0": 0.97, "5.0": 1.0, "+Inf": 1.0}
STREAMS = 100.0
# metrics.prometheusRule values -> the burn rate they give on WITHIN: (1 - within) / (1 - objective).
CASES = {
    "chart defaults": ({}, (1 - 0.97) / (1 - 0.95)),
    "stricter SLO": ({"ttftSloSeconds": 1.0, "ttftSloObjective": 0.99}, (1 - 0.9) / (1 - 0.99)),
}


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    labels = {"model": "m"}
    series = [Series("llmserve_ttft_seconds_bucket", {**labels, "le": le}, STREAMS * share,
                     counter=True) for le, share in WITHIN.items()]
    series.append(Series("llmserve_ttft_seconds_count", labels, STREAMS, counter=True))
    with synthetic_exporter(series) as url, prometheus_server(
            Path(tmp_path_factory.mktemp("prometheus")),
            [Target(GATEWAY_JOB, url, {"namespace": NAMESPACE, "pod": "gw-0"})]) as server:
        server.wait_scraped(time.time(), 1)
        server.wait_scraped(time.time() + 1, 1)  # two samples: rate() has a slope
        yield server


def _release(loaded: helm_python.Chart, rule: dict[str, Any]) -> Release:
    values = load_values(CHART / "values-tp.yaml")
    metrics = values.setdefault("metrics", {})
    metrics["prometheusRule"] = {**metrics.get("prometheusRule", {}), "enabled": True, **rule}
    metrics["grafanaDashboard"] = {**metrics.get("grafanaDashboard", {}), "enabled": True}
    return render(values, loaded=loaded)


def _panel(release: Release) -> tuple[dict[str, str], list[float]]:
    """The shipped overview's burn-rate queries, variables substituted (legend -> expr), and its
    threshold lines."""
    (overview,) = [json.loads(text) for m in release.of_kind("ConfigMap")
                   for name, text in m.get("data", {}).items()
                   if name == "llmserve-overview.json"]
    values = {v["name"]: v["query"] for v in overview["templating"]["list"]
              if v["type"] == "constant"}
    values |= {"namespace": NAMESPACE, "model": ".*"}
    (panel,) = [p for p in overview["panels"] if p["title"].startswith("TTFT SLO burn rate")]
    steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
    return ({t["legendFormat"]: substitute(t["expr"], values) for t in panel["targets"]},
            [s["value"] for s in steps if s["value"] is not None])


def _alerts(release: Release) -> tuple[dict[str, str], list[float]]:
    """Each burn-rate window's expression in the alerts (window -> expr), and their thresholds."""
    rules = [r for g in release.one("PrometheusRule")["spec"]["groups"] for r in g["rules"]
             if r["alert"].startswith("LLMServeTTFTBudgetBurn")]
    windows, factors = {}, []
    for r in rules:
        for clause in r["expr"].split("\nand "):
            m = re.fullmatch(r"\s*(.*\[(\w+)\].*?)\s*>\s*([\d.]+)\s*", clause, re.DOTALL)
            assert m, clause
            windows[m.group(2)] = m.group(1)
            factors.append(float(m.group(3)))
    return windows, sorted(set(factors))


def _value(prom: PrometheusServer, expr: str) -> float:
    result = prom.query(expr)
    assert len(result) == 1, (expr, result)
    return float(result[0]["value"][1])


@pytest.mark.parametrize("case", sorted(CASES))
def test_panel_and_alerts_burn_the_same_budget(case: str, prom: PrometheusServer,
                                              loaded_chart: helm_python.Chart) -> None:
    rule, burn = CASES[case]
    release = _release(loaded_chart, rule)
    panel, lines = _panel(release)
    alerts, factors = _alerts(release)
    assert lines == factors  # the dashed lines are the alerts' thresholds
    assert set(panel) <= set(alerts), (sorted(panel), sorted(alerts))
    for window, expr in panel.items():
        assert _value(prom, expr) == pytest.approx(burn, rel=1e-6), (case, window)
        assert _value(prom, alerts[window]) == pytest.approx(burn, rel=1e-6), (case, window)
