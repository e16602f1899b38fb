"""`python -m loadtest compare` against a real gateway with the near-free fake upstream behind it:
two pools (two served names), alternating runs, the report, the PNGs, summary.json and the
cross-check with the gateway's counters."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from loadtest.__main__ import main
from loadtest.compare import wait_for
from loadtest.errors import EXIT_USAGE, PROG, UsageError
from loadtest.gateway_view import Counters, counters, cross_check, metrics_urls, settled
from loadtest.settings import settings_from_args
from tests import loopback
from tests.cli import usage_error
from tests.gateway.conftest import UpstreamFactory, run_gateway, url_of
from tests.ports import free_port

REPO = Path(__file__).resolve().parents[2]


def _compare(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "loadtest", "compare", *args],
                          capture_output=True, text=True, timeout=120, check=False, cwd=REPO,
                          env=env)


@pytest.mark.slow
def test_compare_two_pools_writes_report_pngs_and_summary(upstreams: UpstreamFactory,
                                                          tmp_path: Path) -> None:
    # Pool "m-pp" answers each token 3x as slowly as "m-tp": B/A output tok/s well below 1.
    # (Gaps of tens of ms: at 5 ms a loaded machine's scheduling noise ate the difference.)
    tp = upstreams(model="m-tp", token_delay_s=0.010)
    pp = upstreams(model="m-pp", token_delay_s=0.030)
    layouts = [{"name": "tp", "model": "m-tp", "tp": 2, "pp": 1, "nodes": 1},
               {"name": "pp", "model": "m-pp", "tp": 1, "pp": 2, "nodes": 2}]
    out = tmp_path / "cmp"
    with run_gateway(backends=[url_of(tp), url_of(pp)], pools=layouts) as gw:
        proc = _compare("--host", gw.url, "--target", "tp=m-tp", "--target", "pp=m-pp",
                        "--users", "1,2", "--duration", "1s", "--rounds", "1",
                        "--warmup-requests", "1", "--max-tokens", "16", "--out", str(out),
                        "--wait", "30s", "--metrics-from", gw.url + "/metrics",
                        "--print-report")
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
    assert report.strip() in proc.stdout  # --print-report: the report in a Job's log
    assert "## users = 1" in report and "## users = 2" in report and "| pp/tp |" in report
    assert "vllm bench serve" in report and "python -m loadtest compare --host" in report
    assert "**all runs agree**" in report
    for png in ("ttft_cdf", "throughput", "latency_throughput", "pareto_per_gpu"):
        assert (out / f"{png}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_unknown_model_is_one_line_and_exit_2(upstreams: UpstreamFactory,
                                             tmp_path: Path) -> None:
    up = upstreams(model="m")
    with run_gateway(backends=[url_of(up)]) as gw:
        proc = _compare("--host", gw.url, "--target", "a=m", "--target", "b=nope",
                        "--users", "1", "--out", str(tmp_path))
    assert proc.returncode == EXIT_USAGE
    usage_error(proc.stderr, PROG + " compare", "does not serve 'nope' (it lists: m)")


def test_a_dead_host_is_one_line_and_exit_2(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    host = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    code = main(["compare", "--host", host, "--target", "a=m", "--target", "b=m", "--users", "1",
                 "--out", str(tmp_path / "out")])
    assert code == EXIT_USAGE
    usage_error(capsys.readouterr().err, PROG + " compare",
                f"cannot reach the gateway at --host {host} (ConnectError: ")
    assert not (tmp_path / "out").exists()  # nothing written for a run that never started


def test_help_exits_0_and_names_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: {PROG} ") and "compare" in out


# Runs the CLI in a fresh interpreter where the loadtest extra's modules cannot be found, as on an
# install without `llmserve[loadtest]`.
WITHOUT_EXTRA = """
import importlib.abc, sys
class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {missing}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, NotInstalled())
from loadtest.__main__ import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("missing", [("httpx", "locust", "matplotlib"), ("matplotlib",)])
def test_compare_without_the_loadtest_extra_names_it_in_one_line(
        missing: tuple[str, ...], tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_EXTRA.format(missing=set(missing)), "compare",
         "--host", "http://127.0.0.1:1", "--target", "a=m", "--target", "b=m", "--users", "1",
         "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert done.returncode == EXIT_USAGE, done.stderr
    usage_error(done.stderr, PROG + " compare",
                f"needs the loadtest extra ({', '.join(missing)} not installed): "
                "pip install 'llmserve[loadtest]'")


@pytest.mark.parametrize(("argv", "fragment"), [
    ([], "the following arguments are required: command"),
    (["comprae"], "invalid choice: 'comprae' (choose from 'compare')"),
])
def test_no_or_unknown_command_is_one_line_and_exit_2(
        argv: list[str], fragment: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == EXIT_USAGE
    usage_error(capsys.readouterr().err, PROG, fragment)


@pytest.mark.parametrize(("args", "match"), [
    (["--target", "a=m"], "exactly two targets"),
    (["--target", "a=m", "--target", "b=m"], "give one of --users or --rate"),
    (["--target", "a=m", "--target", "b=m", "--users", "1,x"], "--users: '1,x' is not a comma-"),
    (["--target", "a=m", "--target", "b=m", "--rate", "0"], "--rate: '0': give positive"),
    (["--target", "a=m", "--target", "b=m", "--users", "1", "--duration", "soon"],
     "not a duration"),
    (["--target", "a=m", "--target", "b=m", "--users", "1", "--duration", "1.5s"],
     "whole seconds"),
])
def test_flag_errors_exit_2_with_one_line(args: list[str], match: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        settings_from_args(["--host", "http://x:1", *args])
    assert exc.value.code == EXIT_USAGE
    usage_error(capsys.readouterr().err, PROG + " compare", match)


def test_cross_check_fails_beyond_the_tolerance() -> None:
    before = Counters(100, 1000, {"200": 100})
    after = Counters(200, 2600, {"200": 200})
    ok = cross_check(before, after, client_requests=100, client_tokens=1590, tolerance=0.02)
    assert ok["ok"] and ok["gateway_output_tokens"] == 1600
    bad = cross_check(before, after, client_requests=100, client_tokens=1500, tolerance=0.02)
    assert not bad["ok"] and bad["output_tokens_diff"] == pytest.approx(100 / 1600)
    lost = cross_check(before, after, client_requests=97, client_tokens=1600, tolerance=0.02)
    assert not lost["ok"]


def _chat(url: str, model: str) -> None:
    body = {"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    assert loopback.post(url + "/v1/chat/completions", json=body, timeout=10).status_code == 200


def test_counters_sum_every_gateway_replica(upstreams: UpstreamFactory) -> None:
    # Two gateway replicas behind one Service: a scrape through the Service sees one of them,
    # so the cross-check must sum each replica's page.
    up = upstreams(model="m")
    with run_gateway(backends=[url_of(up)]) as a, run_gateway(backends=[url_of(up)]) as b:
        for _ in range(3):
            _chat(a.url, "m")
        _chat(b.url, "m")
        both = counters(a.url, "m", [a.url + "/metrics", b.url + "/metrics"])
        port = b.url.rsplit(":", 1)[1]
        via_dns = counters(a.url, "m", [a.url + "/metrics", f"dns:127.0.0.1:{port}"])
        alone = counters(a.url, "m")
    assert (both.requests, alone.requests) == (4, 3)
    assert both.output_tokens == 4 * 4 and both.by_status == {"200": 4}
    assert via_dns == both


def test_settled_waits_for_the_requests_sent_and_no_longer(upstreams: UpstreamFactory) -> None:
    # After a warm-up the first run's snapshot must include every warm-up request: settled()
    # returns once the gateway has counted them, and gives up (returning what it has) after its
    # timeout when it never will.
    up = upstreams(model="m")
    with run_gateway(backends=[url_of(up)]) as gw:
        for _ in range(2):
            _chat(gw.url, "m")
        assert settled(gw.url, "m", [], at_least=2).requests == 2
        t0 = time.monotonic()
        assert settled(gw.url, "m", [], at_least=3, timeout_s=0.5).requests == 2
        assert 0.5 <= time.monotonic() - t0 < 3


def test_metrics_urls_resolve_a_name_and_reject_an_unknown_one() -> None:
    assert metrics_urls("http://gw:80", []) == ["http://gw:80/metrics"]
    assert metrics_urls("http://gw:80", ["dns:127.0.0.1:8001", "http://x/metrics"]) == [
        "http://127.0.0.1:8001/metrics", "http://x/metrics"]
    with pytest.raises(RuntimeError, match="does not resolve"):
        metrics_urls("http://gw:80", ["dns:no-such-host.invalid:8001"])


def test_wait_gives_up_naming_the_last_answer(upstreams: UpstreamFactory) -> None:
    # An engine that keeps answering 503 (still loading): --wait ends with a one-line error
    # naming what it last saw; a model the gateway does not serve fails at once.
    up = upstreams(model="m", fail_status=503)
    with run_gateway(backends=[url_of(up)]) as gw:
        s = settings_from_args(["--host", gw.url, "--target", "a=m", "--target", "b=m",
                                "--users", "1", "--wait", "1s"])
        with pytest.raises(RuntimeError, match=r"did not answer within --wait 1s \(HTTP 5"):
            wait_for(s, "m")
        with pytest.raises(UsageError, match="HTTP 404"):
            wait_for(s, "other")


def test_api_key_from_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--host", "http://x:1", "--target", "a=m", "--target", "b=m", "--users", "1"]
    (tmp_path / "key").write_text("sk-123\n")
    assert settings_from_args([*base, "--api-key-file", str(tmp_path / "key")]).api_key == "sk-123"
    with pytest.raises(SystemExit):
        settings_from_args([*base, "--api-key-file", str(tmp_path / "none")])
    assert "--api-key-file: cannot read" in capsys.readouterr().err
    (tmp_path / "binary").write_bytes(b"\xff\xfe")
    with pytest.raises(SystemExit) as exc:
        settings_from_args([*base, "--api-key-file", str(tmp_path / "binary")])
    assert exc.value.code == EXIT_USAGE
    usage_error(capsys.readouterr().err, PROG + " compare",
                f"--api-key-file: {tmp_path / 'binary'} is not UTF-8 text")


@pytest.mark.parametrize(("args", "match"), [
    (["--metrics-from", "gw:8001"], "neither a URL nor dns:NAME:PORT"),
    (["--metrics-from", "dns:gw"], "write dns:NAME:PORT"),
    (["--wait", "later"], "not a duration"),
])
def test_job_flag_errors(args: list[str], match: str,
                         capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        settings_from_args(["--host", "http://x:1", "--target", "a=m", "--target", "b=m",
                            "--users", "1", *args])
    assert match in capsys.readouterr().err
