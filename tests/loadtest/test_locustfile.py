"""The locust file runs headless against the gateway (fake upstream behind it), times the SSE
events itself and writes one record per request, closed loop and open loop."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

from loadtest.metrics import RequestRecord
from tests.gateway.conftest import UpstreamFactory, run_gateway, url_of

REPO = Path(__file__).resolve().parents[2]


def _locust(host: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-m", "locust", "-f", str(REPO / "loadtest" / "locustfile.py"),
         "--headless", "-t", "3s", "--stop-timeout", "10", "--host", host,
         "--model", "demo", "--max-tokens", "16", "--csv", str(tmp_path / "run"),
         "--records-out", str(tmp_path / "records.jsonl"), "--only-summary", *args],
        capture_output=True, text=True, timeout=60, check=False, cwd=REPO, env=env,
    )


def _records(tmp_path: Path) -> list[RequestRecord]:
    return [RequestRecord.from_json(line)
            for line in (tmp_path / "records.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_closed_loop_times_tokens_not_headers(upstreams: UpstreamFactory, tmp_path: Path) -> None:
    # 16 tokens 20 ms apart after 100 ms: TTFT ~100 ms, E2EL ~400 ms, while locust's own row
    # stops at the headers (which the gateway sends with the first upstream byte).
    up = upstreams(model="demo", first_token_delay_s=0.1, token_delay_s=0.02)
    with run_gateway(backends=[url_of(up)]) as gw:
        proc = _locust(gw.url, tmp_path, "-u", "4", "-r", "4")
    assert proc.returncode == 0, proc.stderr[-2000:]
    with open(tmp_path / "run_stats.csv", newline="") as fh:
        rows = {r["Name"]: r for r in csv.DictReader(fh)}
    n = int(rows["chat (stream)"]["Request Count"])
    assert n > 0 and int(rows["chat (stream)"]["Failure Count"]) == 0
    assert int(rows["TTFT"]["Request Count"]) == n
    assert float(rows["TTFT"]["Median Response Time"]) >= 100
    assert float(rows["E2EL"]["Median Response Time"]) >= 350
    assert float(rows["chat (stream)"]["Median Response Time"]) < 200
    records = _records(tmp_path)
    # Locust's CSV is written as the run time ends; requests that finish during --stop-timeout
    # are only in the records.
    assert len(records) >= n and all(r.ok and r.token_source == "usage" for r in records)
    assert {r.output_tokens for r in records} == {16}
    assert all(0.09 < (r.ttft or 0) < 0.3 and 0.35 < r.latency < 0.8 for r in records)
    assert "loadtest summary" in proc.stdout + proc.stderr


@pytest.mark.slow
def test_open_loop_sends_at_the_rate_whatever_the_server_pace(upstreams: UpstreamFactory,
                                                              tmp_path: Path) -> None:
    # 20 req/s for 3 s against answers that take ~0.4 s: a closed loop of 1 user would send
    # ~7; the open loop keeps ~8 in flight and sends ~60.
    up = upstreams(model="demo", first_token_delay_s=0.1, token_delay_s=0.02)
    with run_gateway(backends=[url_of(up)]) as gw:
        proc = _locust(gw.url, tmp_path, "-u", "1", "-r", "1", "--rate", "20")
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = _records(tmp_path)
    assert 30 <= len(records) <= 100, len(records)
    assert all(r.ok for r in records)
    starts = sorted(r.start for r in records)
    # Overlapping requests: many started before the first one ended.
    assert sum(1 for s in starts if s < starts[0] + records[0].latency) >= 3
