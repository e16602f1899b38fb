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


# Every scenario: a breach from 0 to 40 min, healthy from 41 min on. Each alert is silent at 1 min
# (`for:` not elapsed), firing at 30 min, resolved at 110 min (its short window clean again).
BAD_UNTIL = 40
END = 120
SILENT, FIRING, RESOLVED = "1m", "30m", "110m"


def counter(bad: float, good: float) -> str:
    """A counter growing `bad` per minute until BAD_UNTIL, then `good` per minute."""
    top = BAD_UNTIL * bad
    return f"0+{bad}x{BAD_UNTIL} {top + good}+{good}x{END - BAD_UNTIL - 1}"


def gauge(bad: float, good: float) -> str:
    return f"{bad}+0x{BAD_UNTIL} {good}+0x{END - BAD_UNTIL - 1}"


def _buckets(selector: str, model: str, bad: dict[str, int], good: dict[str, int]
             ) -> list[dict[str, str]]:
    # prometheus_client writes le="2.0"; Prometheus 3 keeps that form. The rule matches both.
    return [
        {
            "series": f'llmserve_ttft_seconds_bucket{{{selector}, model="{model}", le="{le}"}}',
            "values": counter(bad[le], good[le]),
        }
        for le in bad
    ] + [
        {
            "series": f'llmserve_ttft_seconds_count{{{selector}, model="{model}"}}',
            "values": counter(bad["+Inf"], good["+Inf"]),
        }
    ]


def _requests(selector: str, model: str, status: str, bad: int, good: int) -> dict[str, str]:
    return {
        "series": f'llmserve_requests_total{{{selector}, model="{model}", backend="b", '
        f'status="{status}"}}',
        "values": counter(bad, good),
    }


SLOW_TTFT = {"0.5": 0, "2.0": 0, "5.0": 60, "+Inf": 60}  # every first token between 2 and 5 s
FAST_TTFT = {"0.5": 60, "2.0": 60, "5.0": 60, "+Inf": 60}
MIXED_TTFT = {"0.5": 50, "2.0": 59, "5.0": 60, "+Inf": 60}  # 1 in 60 late: within the budget

INPUT_SERIES = [
    # TTFT: "slow" blows its budget (burn 20x) until 40 min, "fast" never does, "mixed" burns 1/3.
    *_buckets(GW, "slow", SLOW_TTFT, FAST_TTFT),
    *_buckets(GW, "fast", FAST_TTFT, FAST_TTFT),
    *_buckets(GW, "mixed", MIXED_TTFT, MIXED_TTFT),
    *_buckets(ELSEWHERE, "slow-elsewhere", SLOW_TTFT, SLOW_TTFT),
    # Errors: "slow" answers 10 % 5xx, then none; "fast" 1 in 61 throughout.
    _requests(GW, "slow", "200", 54, 60),
    _requests(GW, "slow", "502", 6, 0),
    _requests(GW, "fast", "200", 60, 60),
    _requests(GW, "fast", "503", 1, 1),
    _requests(ELSEWHERE, "x", "500", 60, 60),
    # Queues: one engine and one gateway saturated, then drained; one of each fine throughout.
    {"series": f'vllm:num_requests_waiting{{{ENGINES}, pool="tp", pod="w-0"}}',
     "values": gauge(40, 0)},
    {"series": f'vllm:num_requests_waiting{{{ENGINES}, pool="tp", pod="w-1"}}',
     "values": gauge(3, 3)},
    {"series": f'vllm:num_requests_waiting{{{ELSEWHERE}, pool="tp", pod="w-9"}}',
     "values": gauge(99, 99)},
    {"series": f'llmserve_queue_depth{{{GW}, pod="gw-0"}}', "values": gauge(200, 0)},
    {"series": f'llmserve_queue_depth{{{GW}, pod="gw-1"}}', "values": gauge(5, 5)},
    # KV cache: w-0 near full, then relieved; w-1 comfortable; someone else's engine full.
    {"series": f'vllm:kv_cache_usage_perc{{{ENGINES}, pool="tp", pod="w-0"}}',
     "values": gauge(0.97, 0.5)},
    {"series": f'vllm:kv_cache_usage_perc{{{ENGINES}, pool="tp", pod="w-1"}}',
     "values": gauge(0.6, 0.6)},
    {"series": f'vllm:kv_cache_usage_perc{{{ELSEWHERE}, pool="tp", pod="w-9"}}',
     "values": gauge(1.0, 1.0)},
    # Backends: gw-0 has none up, then one; gw-1 always one; gw-2 is up but knows none (a full
    # outage: no llmserve_backend_up series at all) until its backend appears at 41 min.
    {"series": f'llmserve_backend_up{{{GW}, pod="gw-0", backend="a"}}', "values": gauge(0, 1)},
    {"series": f'llmserve_backend_up{{{GW}, pod="gw-1", backend="a"}}', "values": gauge(1, 1)},
    {"series": f'llmserve_backend_up{{{GW}, pod="gw-2", backend="a"}}',
     "values": f"_x{BAD_UNTIL + 1} 1+0x{END - BAD_UNTIL - 1}"},
    *({"series": f'up{{{GW}, pod="{pod}"}}', "values": f"1+0x{END}"}
      for pod in ("gw-0", "gw-1", "gw-2")),
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


TTFT_DESCRIPTION = (
    "Too many streams wait longer than 2s for their first token. Look at engine queueing "
    "(vllm:num_requests_waiting) and KV-cache usage; add replicas to the pool."
)

EXPECTED = [
    _alert(
        "LLMServeTTFTBudgetBurnFast",
        {"model": "slow", "severity": "critical"},
        "slow burns its TTFT error budget 20.0x over 1h, still over 14.4x in the last 5m "
        "(SLO: 95% of streams within 2s)",
        TTFT_DESCRIPTION,
    ),
    _alert(
        "LLMServeTTFTBudgetBurnSlow",
        {"model": "slow", "severity": "warning"},
        "slow burns its TTFT error budget 20.0x over 6h, still over 6x in the last 30m "
        "(SLO: 95% of streams within 2s)",
        TTFT_DESCRIPTION,
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
    _alert(
        "LLMServeKVCacheNearFull",
        {"pool": "tp", "pod": "w-0", "severity": "warning"},
        "w-0 (tp) has 97% of its KV cache in use",
        "Above 95% the scheduler preempts running requests (vllm:num_preemptions_total) and TTFT "
        "grows. Scale the pool, or lower max-num-seqs / max-model-len.",
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
    assert f"SUCCESS: {len(EXPECTED)} rules found" in done.stdout


def test_slo_alerts_fire_on_breaches_only_and_resolve(render_case: Any, tmp_path: Path) -> None:
    rules = _write_rules(render_case, tmp_path)
    silent = [
        {"eval_time": at, "alertname": a["alertname"], "exp_alerts": []}
        for at in (SILENT, RESOLVED)  # `for:` not yet elapsed; the breach is over
        for a in EXPECTED
    ]
    tests = {
        "rule_files": [rules.name],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": INPUT_SERIES,
                "alert_rule_test": [*silent, *({"eval_time": FIRING, **a} for a in EXPECTED)],
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


def test_slo_threshold_choices_are_the_gateways_bucket_bounds() -> None:
    # The burn rate reads the bucket at the SLO threshold: the schema may only offer real bounds.
    from deploy.helm.values_schema import TTFT_BUCKETS
    from gateway.metrics import _TTFT_BUCKETS

    assert TTFT_BUCKETS == _TTFT_BUCKETS
