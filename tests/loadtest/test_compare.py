"""`python -m loadtest compare` against a real gateway with the near-free fake upstream behind it:
two pools (two served names), alternating runs, the report, the PNGs, summary.json and the
cross-check with the gateway's counters."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from loadtest.gateway_view import Counters, cross_check
from loadtest.settings import settings_from_args
from tests.gateway.conftest import UpstreamFactory, run_gateway, url_of

REPO = Path(__file__).resolve().parents[2]


def _compare(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "loadtest", "compare", *args],
                          capture_output=True, text=True, timeout=120, check=False, cwd=REPO,
                          env=env)


@pytest.mark.slow
def test_compare_two_pools_writes_report_pngs_and_summary(upstreams: UpstreamFactory,
                                                          tmp_path: Path) -> None:
    # Pool "m-pp" answers each token twice as slowly as "m-tp": B/A output tok/s well below 1.
    tp = upstreams(model="m-tp", token_delay_s=0.005)
    pp = upstreams(model="m-pp", token_delay_s=0.010)
    layouts = [{"name": "tp", "model": "m-tp", "tp": 2, "pp": 1, "nodes": 1},
               {"name": "pp", "model": "m-pp", "tp": 1, "pp": 2, "nodes": 2}]
    out = tmp_path / "cmp"
    with run_gateway(backends=[url_of(tp), url_of(pp)], pools=layouts) as gw:
        proc = _compare("--host", gw.url, "--target", "tp=m-tp", "--target", "pp=m-pp",
                        "--users", "1,2", "--duration", "1s", "--rounds", "1",
                        "--warmup-requests", "1", "--max-tokens", "16", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    # Progress lines, in the alternating order A B A B.
    started = re.findall(r"\] run \d+/4: (\w+) \(", proc.stdout)
    order = [s for i, s in enumerate(started) if i == 0 or s != started[i - 1]]
    assert order == ["tp", "pp", "tp", "pp"], proc.stdout

    summary = json.loads((out / "summary.json").read_text())
    assert [t["label"] for t in summary["targets"]] == ["tp", "pp"]
    assert summary["targets"][1]["layout"] | {} == {
        "tp": 1, "pp": 2, "nodes": 2, "replicas": 1, "gpus": 2,
        "source": "gateway /v1/models (GATEWAY_POOLS)"}
    runs = {(r["label"], r["users"]): r for r in summary["runs"]}
    assert set(runs) == {("tp", 1), ("tp", 2), ("pp", 1), ("pp", 2)}
    for r in runs.values():
        assert r["requests"] > 0 and r["errors"] == 0
        assert r["output_tokens"] == 16 * r["requests"]
        assert {"p50", "p90", "p99"} <= set(r["ttft_ms"]) and r["duration_s"] > 0
    for users in (1, 2):
        assert runs[("pp", users)]["tpot_ms"]["p50"] > 1.5 * runs[("tp", users)]["tpot_ms"]["p50"]
    assert summary["cross_check"]["ok"] and len(summary["cross_check"]["runs"]) == 4
    assert summary["token_count_method"] == {"usage": sum(r["requests"] for r in runs.values())}

    report = (out / "report.md").read_text()
    assert "## users = 1" in report and "## users = 2" in report and "| pp/tp |" in report
    assert "vllm bench serve" in report and "python -m loadtest compare --host" in report
    assert "**all runs agree**" in report
    for png in ("ttft_cdf", "throughput", "latency_throughput", "pareto_per_gpu"):
        assert (out / f"{png}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_unknown_model_is_one_line_and_nonzero(upstreams: UpstreamFactory,
                                               tmp_path: Path) -> None:
    up = upstreams(model="m")
    with run_gateway(backends=[url_of(up)]) as gw:
        proc = _compare("--host", gw.url, "--target", "a=m", "--target", "b=nope",
                        "--users", "1", "--out", str(tmp_path))
    assert proc.returncode == 1
    assert proc.stderr.strip().count("\n") == 0 and "'nope'" in proc.stderr


@pytest.mark.parametrize(("args", "match"), [
    (["--target", "a=m"], "exactly two targets"),
    (["--target", "a=m", "--target", "b=m"], "give one of --users or --rate"),
    (["--target", "a=m", "--target", "b=m", "--users", "1,x"], "not a comma-separated"),
    (["--target", "a=m", "--target", "b=m", "--users", "1", "--duration", "soon"],
     "not a duration"),
    (["--target", "a=m", "--target", "b=m", "--users", "1", "--duration", "1.5s"],
     "whole seconds"),
])
def test_flag_errors_exit_2_with_one_line(args: list[str], match: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        settings_from_args(["--host", "http://x:1", *args])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert match in err and err.strip().count("\n") == 0


def test_cross_check_fails_beyond_the_tolerance() -> None:
    before = Counters(100, 1000, {"200": 100})
    after = Counters(200, 2600, {"200": 200})
    ok = cross_check(before, after, client_requests=100, client_tokens=1590, tolerance=0.02)
    assert ok["ok"] and ok["gateway_output_tokens"] == 1600
    bad = cross_check(before, after, client_requests=100, client_tokens=1500, tolerance=0.02)
    assert not bad["ok"] and bad["output_tokens_diff"] == pytest.approx(100 / 1600)
    lost = cross_check(before, after, client_requests=97, client_tokens=1600, tolerance=0.02)
    assert not lost["ok"]
