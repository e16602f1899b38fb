"""The locust file runs headless against the gateway (fake upstream behind it) and reports TTFT
and token counts."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

from tests.gateway.conftest import UpstreamFactory, run_gateway, url_of

REPO = Path(__file__).resolve().parents[2]


def test_locust_headless_reports_ttft_and_tokens(upstreams: UpstreamFactory,
                                                 tmp_path: Path) -> None:
    up = upstreams(model="demo")
    with run_gateway(backends=[url_of(up)]) as gw:
        proc = subprocess.run(
            [sys.executable, "-m", "locust", "-f", str(REPO / "loadtest" / "locustfile.py"),
             "--headless", "-u", "4", "-r", "4", "-t", "3s", "--host", gw.url,
             "--model", "demo", "--max-tokens", "16", "--csv", str(tmp_path / "run"),
             "--only-summary"],
            capture_output=True, text=True, timeout=60, check=False,
        )
    assert proc.returncode == 0, proc.stderr[-2000:]
    with open(tmp_path / "run_stats.csv", newline="") as fh:
        rows = {r["Name"]: r for r in csv.DictReader(fh)}
    assert int(rows["chat (stream)"]["Request Count"]) > 0
    assert int(rows["chat (stream)"]["Failure Count"]) == 0
    assert int(rows["TTFT"]["Request Count"]) == int(rows["chat (stream)"]["Request Count"])
    # 16 tokens per answer: the average "content size" of the tokens row is the token count.
    assert float(rows["tokens"]["Average Content Size"]) == 16
