"""The in-cluster comparison Job (compare.enabled): off by default; when on, it runs
`python -m loadtest compare` with flags the tool accepts, reaches the gateway through its Service,
sums every gateway pod's /metrics through a headless Service that selects exactly the gateway's
pods, and is let through a restricted gateway ingress."""

from __future__ import annotations

from typing import Any

import helm_python
import pytest

from loadtest.settings import settings_from_args
from loadtest.workloads import WORKLOADS
from tests.deploy.manifests import TEST_REGISTRY, render, selector_matches

pytestmark = pytest.mark.helm


def _job_args(rel: Any) -> list[str]:
    (job,) = [j for j in rel.of_kind("Job")
              if j["metadata"]["labels"]["app.kubernetes.io/component"] == "compare"]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    return list(container["args"])


def test_off_by_default(render_case: Any) -> None:
    rel = render_case("defaults")
    components = {m["metadata"]["labels"].get("app.kubernetes.io/component")
                  for m in rel.manifests}
    assert "compare" not in components


def test_job_runs_the_tool_with_flags_it_accepts(render_case: Any) -> None:
    rel = render_case("compare-job")
    args = _job_args(rel)
    assert args[0] == "compare"
    # The rendered command line parses as the tool's own settings (same validators as a user's).
    s = settings_from_args([a for a in args[1:]  # the key file exists only in the pod
                            if a not in ("--api-key-file", "/var/run/secrets/llmserve/api-key")])
    assert s.host == "http://llm-llmserve-gateway:80"
    assert s.target_pairs() == [("tp", "m-tp"), ("pp", "m-pp")]
    assert s.levels() == [1, 4] and s.slos == ["ttft_ms=800"]
    assert s.wait_s == 30 * 60 and s.print_report and str(s.out) == "/report"
    (src,) = s.metrics_from
    assert src == "dns:llm-llmserve-gateway-pods.inference.svc.cluster.local:8000"


def test_headless_service_selects_every_gateway_pod_and_only_them(render_case: Any) -> None:
    rel = render_case("compare-job")
    svc = rel.one("Service", "llm-llmserve-gateway-pods")
    assert svc["spec"]["clusterIP"] == "None"
    selected = [p for p in rel.pods()
                if selector_matches(svc["spec"]["selector"], p.metadata["labels"])]
    assert [p.role for p in selected] == ["gateway"]
    (port,) = svc["spec"]["ports"]
    assert port["targetPort"] == "http" and port["port"] == 8000
    # Not picked up by the gateway's ServiceMonitor (its selector is the gateway component).
    assert svc["metadata"]["labels"]["app.kubernetes.io/component"] == "compare"


def test_api_key_from_a_secret_and_report_on_the_claim(render_case: Any) -> None:
    rel = render_case("compare-job")
    (pod,) = [p for p in rel.pods() if p.role == "compare"]
    (c,) = pod.containers()
    volumes = {v["name"]: v for v in pod.spec["volumes"]}
    assert volumes["api-key"]["secret"] == {"secretName": "keys",
                                            "items": [{"key": "compare", "path": "api-key"}]}
    assert volumes["report"]["persistentVolumeClaim"]["claimName"] == "reports"
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert mounts["report"] == "/report"
    args = c["args"]
    assert args[args.index("--api-key-file") + 1] == mounts["api-key"] + "/api-key"
    assert not any("KEY" in e["name"] for e in c["env"])
    assert c["image"].startswith(f"{TEST_REGISTRY}/llmserve/loadtest:")


def test_restricted_gateway_ingress_lets_the_job_in(render_case: Any) -> None:
    rel = render_case("compare-job")
    np = rel.one("NetworkPolicy", "llm-llmserve-gateway")
    (pod,) = [p for p in rel.pods() if p.role == "compare"]
    peers = np["spec"]["ingress"][0]["from"]
    assert any(selector_matches(peer.get("podSelector", {}).get("matchLabels", {"x": "y"}),
                                pod.metadata["labels"]) for peer in peers)


@pytest.mark.parametrize(("compare", "message"), [
    ({"targets": ["tp=a"]}, "minItems|exactly two"),
    ({"targets": ["tp=a", "pp=b"], "users": "", "rate": ""}, "exactly one of compare.users"),
    ({"targets": ["tp=a", "pp=b"], "users": "1", "rate": "2"}, "exactly one of compare.users"),
    ({"targets": ["tp=a", "pp=b"], "workload": "huge"}, "workload"),
])
def test_bad_settings_are_refused(compare: dict[str, Any], message: str) -> None:
    with pytest.raises(Exception, match=message):
        render({"compare": {"enabled": True, **compare}})


@pytest.mark.parametrize("slo", [
    "ttft_ms=800", "tpot_ms=50.5", "e2el_ms=.5", "ttft_ms=10.", "ttft_ms=007", "ttft_ms=0",
    "ttft_ms=0.0", "ttft_ms=-5", "ttft_ms=1e3", "ttft_ms=inf", "ttft_ms=nan", "ttft_ms= 5",
    "ttft_ms=", "ttft=800", "TTFT_MS=800", "ttft_ms=800ms",
])
@pytest.mark.parametrize("workload", [*WORKLOADS, "huge", "Chat"])
def test_an_slo_and_a_workload_render_iff_the_tool_takes_them(slo: str, workload: str) -> None:
    """The chart's schema takes its SLO pattern and workloads from loadtest/, so the Job never
    starts with flags its tool refuses (issue 37, item 3: one rule, one home)."""
    # The Job's own command line, as the chart renders it for good values, with these two.
    flags = _job_args(render({"compare": {"enabled": True, "targets": ["tp=a", "pp=b"],
                                          "slos": ["ttft_ms=1"], "workload": "chat"}}))
    flags[flags.index("--slo") + 1] = slo
    flags[flags.index("--workload") + 1] = workload
    try:
        settings_from_args(flags[1:])
        tool = True
    except SystemExit:
        tool = False
    try:
        rel = render({"compare": {"enabled": True, "targets": ["tp=a", "pp=b"], "slos": [slo],
                                  "workload": workload}})
    except helm_python.HelmError:
        rel = None
    assert (rel is not None) is tool, (slo, workload)
    if rel is not None:
        args = _job_args(rel)
        assert args[args.index("--slo") + 1] == slo
