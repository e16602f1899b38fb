"""The Grafana dashboards: generated from deploy/dashboards (grafana-foundation-sdk), checked in as
JSON, shipped by the chart. The checked-in JSON must be what the code builds; every panel carries a
unit and a description; every query parses in Prometheus's own parser (promtool)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from deploy.dashboards.__main__ import DASHBOARDS, OUT, all_dashboards
from deploy.dashboards.common import Dashboard, substitute, to_json, variable_source
from deploy.dashboards.render import main as render_main
from tests.cli import usage_error
from tests.deploy.manifests import Release

BUILT = all_dashboards()


def example_values(d: Dashboard) -> dict[str, str]:
    """A value for every variable a query may name, as Grafana would substitute it."""
    return {"__rate_interval": "1m",
            **{v.name: v.query if v.constant else "x" for v in d.variables}}


def test_checked_in_json_is_what_the_code_builds() -> None:
    on_disk = sorted(p.name for p in OUT.glob("*.json"))
    assert on_disk == sorted(DASHBOARDS), "run: python -m deploy.dashboards"
    for name, d in BUILT.items():
        assert (OUT / name).read_text(encoding="utf-8") == to_json(d), (
            f"{name} is stale: run python -m deploy.dashboards"
        )


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_every_panel_has_unit_description_and_queries(name: str) -> None:
    model = json.loads((OUT / name).read_text(encoding="utf-8"))
    variables = {v["name"]: v for v in model["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert "namespace" in variables
    # The model/pool pair, or the two pools of the side-by-side dashboard.
    assert {"model", "pool"} <= set(variables) or {"pool_a", "pool_b"} <= set(variables)
    panels = [p for p in model["panels"] if p["type"] != "row"]
    assert len(panels) >= 9
    ids = [p["id"] for p in model["panels"]]
    assert len(ids) == len(set(ids))
    for p in panels:
        assert p["description"].strip(), p["title"]
        assert p["fieldConfig"]["defaults"].get("unit"), p["title"]
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert 'namespace=~"$namespace"' in t["expr"], (p["title"], t["expr"])
            substitute(t["expr"], example_values(BUILT[name]))  # names only known variables


def test_overview_covers_what_an_operator_looks_for_first() -> None:
    exprs = " ".join(q.expr for p in BUILT["llmserve-overview.json"].panels() for q in p.queries)
    for metric in ("llmserve_requests_total", "llmserve_output_tokens_total",
                   "llmserve_ttft_seconds_bucket", "llmserve_tpot_seconds_bucket",
                   "llmserve_itl_seconds_bucket", "llmserve_e2e_request_latency_seconds_bucket",
                   "llmserve_requests_in_flight", "llmserve_queue_depth",
                   "llmserve_queue_time_seconds_bucket", "llmserve_concurrency_limit",
                   "llmserve_rejections_total", "llmserve_upstream_retries_total",
                   "llmserve_backend_up", "llmserve_tenant_tokens_total", "llmserve_pool_info"):
        assert metric in exprs, metric


def test_engine_panels_use_vllm_v1_names() -> None:
    exprs = " ".join(q.expr for p in BUILT["llmserve-engines.json"].panels() for q in p.queries)
    for metric in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                   "vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries_total",
                   "vllm:prefix_cache_hits_total", "vllm:time_to_first_token_seconds_bucket",
                   "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                   "vllm:num_preemptions_total"):
        assert metric in exprs, metric
    assert "gpu_cache_usage_perc" not in exprs and "time_per_output_token" not in exprs


@pytest.mark.prometheus
def test_every_query_parses_in_promtool(tmp_path: Path) -> None:
    # Each query (and each variable's selector) as a recording rule: `promtool check rules` runs
    # them through Prometheus's PromQL parser.
    rules: list[dict[str, str]] = []
    for d in BUILT.values():
        values = example_values(d)
        exprs = [q.expr for p in d.panels() for q in p.queries]
        exprs += [variable_source(v)[0] for v in d.variables if not v.constant]
        for expr in exprs:
            rules.append({"record": f"r{len(rules)}", "expr": substitute(expr, values)})
    path = tmp_path / "queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "q", "rules": rules}]}), encoding="utf-8")
    promtool = shutil.which("promtool")
    assert promtool, "promtool not found: apt-get install prometheus"
    done = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules)} rules found" in done.stdout


@pytest.mark.helm
def test_every_preset_with_monitoring_ships_every_dashboard(preset: Release) -> None:
    monitoring = preset.values.get("metrics", {}).get("serviceMonitor", {}).get("enabled", False)
    maps = {
        key: value
        for m in preset.of_kind("ConfigMap")
        if m["metadata"].get("labels", {}).get("grafana_dashboard") == "1"
        for key, value in m["data"].items()
    }
    if not monitoring:
        assert maps == {}
        return
    assert sorted(maps) == sorted(DASHBOARDS)
    for name, text in maps.items():
        assert json.loads(text) == json.loads((OUT / name).read_text(encoding="utf-8"))




@pytest.mark.parametrize(("content", "fragment"), [
    (None, "cannot read"),  # a directory
    ("{", "cannot read"),
    ("[]", "is not a results file"),
    ('{"dashboards": {}}', "is not a results file"),
])
def test_render_refuses_what_is_not_a_results_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, fragment: str,
) -> None:
    results = tmp_path / "results.json"
    if content is None:
        results.mkdir()
    else:
        results.write_text(content)
    with pytest.raises(SystemExit) as exc:
        render_main([str(results), "--out", str(tmp_path / "out")])
    assert exc.value.code == 2
    usage_error(capsys.readouterr().err, "python -m deploy.dashboards.render", fragment)
    assert not (tmp_path / "out").exists()
