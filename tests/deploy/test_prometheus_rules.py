"""The rendered PrometheusRule, evaluated by Prometheus's own rule engine (`promtool test rules`,
from Debian's prometheus package): each SLO alert fires on synthetic series that break the SLO,
stays silent on healthy ones, and ignores series outside the release's jobs."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = [pytest.mark.helm, pytest.mark.prometheus]

NS = "inference"
GW = f'namespace="{NS}", job="llm-llmserve-gateway"'
ENGINES = f'namespace="{NS}", job="{NS}/llm-llmserve-workers"'
ELSEWHERE = f'namespace="{NS}", job="someone-else"'


def promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool not found: apt-get install prometheus (it ships promtool)"
    return path


def _buckets(selector: str, model: str, per_minute: dict[str, int]) -> list[dict[str, str]]:
    return [
        {
            "series": f'llmserve_ttft_seconds_bucket{{{selector}, model="{model}", le="{le}"}}',
            "values": f"0+{n}x30",
        }
        for le, n in per_minute.items()
    ]


INPUT_SERIES = [
    # TTFT: "slow" has every first token between 2 and 5 s (p95 = 4.85 s), "fast" under 0.5 s.
    *_buckets(GW, "slow", {"0.5": 0, "2": 0, "5": 60, "+Inf": 60}),
    *_buckets(GW, "fast", {"0.5": 60, "2": 60, "5": 60, "+Inf": 60}),
    *_buckets(ELSEWHERE, "slow-elsewhere", {"0.5": 0, "2": 0, "5": 60, "+Inf": 60}),
    # Errors: "slow" answers 10 % 5xx, "fast" 1 in 61.
    {
        "series": f'llmserve_requests_total{{{GW}, model="slow", backend="b", status="200"}}',
        "values": "0+54x30",
    },
    {
        "series": f'llmserve_requests_total{{{GW}, model="slow", backend="b", status="502"}}',
        "values": "0+6x30",
    },
    {
        "series": f'llmserve_requests_total{{{GW}, model="fast", backend="b", status="200"}}',
        "values": "0+60x30",
    },
    {
        "series": f'llmserve_requests_total{{{GW}, model="fast", backend="b", status="503"}}',
        "values": "0+1x30",
    },
    {
        "series": f'llmserve_requests_total{{{ELSEWHERE}, model="x", backend="b", status="500"}}',
        "values": "0+60x30",
    },
    # Queues: one engine and one gateway saturated, one of each fine.
    {
        "series": f'vllm:num_requests_waiting{{{ENGINES}, pool="tp", pod="w-0"}}',
        "values": "40+0x30",
    },
    {"series": f'vllm:num_requests_waiting{{{ENGINES}, pool="tp", pod="w-1"}}', "values": "3+0x30"},
    {
        "series": f'vllm:num_requests_waiting{{{ELSEWHERE}, pool="tp", pod="w-9"}}',
        "values": "99+0x30",
    },
    {"series": f'llmserve_queue_depth{{{GW}, pod="gw-0"}}', "values": "200+0x30"},
    {"series": f'llmserve_queue_depth{{{GW}, pod="gw-1"}}', "values": "5+0x30"},
    # Backends: gw-0 has none up, gw-1 has one, gw-2 is up but knows none (a full outage: no
    # llmserve_backend_up series at all).
    {"series": f'llmserve_backend_up{{{GW}, pod="gw-0", backend="a"}}', "values": "0+0x30"},
    {"series": f'llmserve_backend_up{{{GW}, pod="gw-1", backend="a"}}', "values": "1+0x30"},
    *({"series": f'up{{{GW}, pod="{pod}"}}', "values": "1+0x30"} for pod in ("gw-0", "gw-1", "gw-2")),
]


def _alert(name: str, labels: dict[str, str], summary: str, description: str) -> dict[str, Any]:
    return {
        "alertname": name,
        "exp_alerts": [
            {
                "exp_labels": labels,
                "exp_annotations": {"summary": summary, "description": description},
            }
        ],
    }


EXPECTED = [
    _alert(
        "LLMServeTTFTP95High",
        {"model": "slow", "severity": "warning"},
        "TTFT p95 of slow is 4.85s (SLO 2s)",
        "Time to first token seen by the gateway, p95 over 5m. Look at engine queueing "
        "(vllm:num_requests_waiting) and KV-cache usage; add replicas to the pool.",
    ),
    _alert(
        "LLMServeErrorRateHigh",
        {"model": "slow", "severity": "warning"},
        "slow: 10% of requests fail with 5xx (SLO 5%)",
        "Share of proxied requests answered 5xx over 5m: 502/504 point at the engines, "
        "503 at no healthy replica.",
    ),
    _alert(
        "LLMServeEngineQueueSaturated",
        {"pool": "tp", "pod": "w-0", "severity": "warning"},
        "w-0 (tp) has 40 requests waiting",
        "The engine's scheduler queue stays above 32: the pool is saturated. "
        "Scale the pool's replicas.",
    ),
    _alert(
        "LLMServeGatewayQueueSaturated",
        {"pod": "gw-0", "severity": "warning"},
        "Gateway gw-0 holds 200 queued requests",
        "Requests wait in the gateway's admission queue above 128: every replica is busy.",
    ),
    {
        "alertname": "LLMServeNoHealthyBackend",
        "exp_alerts": [
            {
                "exp_labels": {"pod": pod, "severity": "critical"},
                "exp_annotations": {
                    "summary": f"Gateway {pod} has no routable worker",
                    "description": "Every backend the gateway knows fails its probes or is "
                    "ejected, or it knows none: requests get 503.",
                },
            }
            for pod in ("gw-0", "gw-2")
        ],
    },
]


def _write_rules(render_case: Any, tmp_path: Path) -> Path:
    rule = render_case("preset:values-tp.yaml").one("PrometheusRule")
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}), encoding="utf-8")
    return path


def test_rules_pass_promtool_check(render_case: Any, tmp_path: Path) -> None:
    rules = _write_rules(render_case, tmp_path)
    done = subprocess.run(
        [promtool(), "check", "rules", str(rules)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 5 rules found" in done.stdout


def test_slo_alerts_fire_on_breaches_only(render_case: Any, tmp_path: Path) -> None:
    rules = _write_rules(render_case, tmp_path)
    silent_early = [
        {"eval_time": "3m", "alertname": a["alertname"], "exp_alerts": []} for a in EXPECTED
    ]  # `for:` not yet elapsed
    tests = {
        "rule_files": [rules.name],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": INPUT_SERIES,
                "alert_rule_test": [*silent_early, *({"eval_time": "20m", **a} for a in EXPECTED)],
            }
        ],
    }
    spec = tmp_path / "tests.yaml"
    spec.write_text(yaml.safe_dump(tests, sort_keys=False), encoding="utf-8")
    done = subprocess.run(
        [promtool(), "test", "rules", str(spec)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
