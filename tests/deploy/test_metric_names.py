"""The llmserve_* names the dashboards, the chart's alerts and docs/observability.md use are names
the gateway exports: a renamed metric fails here, in the fast tier, instead of leaving a panel or
an alert silently empty. (vLLM's names are checked against real engines by
tests/e2e/test_observability.py, where every panel query must return data.)"""

from __future__ import annotations

import re

from deploy.dashboards.__main__ import all_dashboards
from gateway.app import build_app
from gateway.settings import GatewaySettings
from tests.deploy.manifests import CHART, REPO

NAME = re.compile(r"\bllmserve_[a-z0-9_]*[a-z0-9]")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"),
            "summary": ("_count", "_sum"), "gauge": ("",), "info": ("_info",)}


def exported() -> tuple[set[str], set[str]]:
    """(family names, sample names) of everything the gateway's registry exports."""
    app = build_app(GatewaySettings(backends=["http://127.0.0.1:9"]))
    families = {f.name: f.type for f in app.state.metrics.registry.collect()}
    samples = {f + s for f, kind in families.items() for s in SUFFIXES[kind]}
    return set(families), samples


def used_by_dashboards() -> set[str]:
    text = " ".join([q.expr for d in all_dashboards().values() for p in d.panels()
                     for q in p.queries]
                    + [v.query for d in all_dashboards().values() for v in d.variables])
    return set(NAME.findall(text))


def test_the_gateway_exports_what_dashboards_and_alerts_query() -> None:
    alerts = (CHART / "templates" / "monitoring" / "prometheusrule.yaml").read_text("utf-8")
    alerts = re.sub(r"/\*.*?\*/", "", alerts, flags=re.DOTALL)  # template comments
    alerts = re.sub(r"^\s*#.*$", "", alerts, flags=re.MULTILINE)  # YAML comments
    assert "llmserve_backend_up" in alerts
    used = used_by_dashboards() | set(NAME.findall(alerts))
    assert len(used) >= 15  # the regex found the queries' names
    _, samples = exported()
    assert used <= samples, sorted(used - samples)


def test_the_documented_metrics_are_exported() -> None:
    doc = (REPO / "docs" / "observability.md").read_text("utf-8")
    documented = set(NAME.findall(doc))
    families, samples = exported()
    assert documented, "docs/observability.md names no llmserve_* metric"
    assert documented <= families | samples, sorted(documented - families - samples)
