"""A real Prometheus (Debian's `prometheus` package) on loopback for tests: its own port and TSDB
directory, a 1 s scrape interval, static targets with the labels the chart's monitors add."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests import loopback
from tests.ports import free_port

INSTALL_HINT = "prometheus not found: apt-get install prometheus (or `make test`, which does)"


@dataclass(frozen=True)
class Target:
    job: str
    url: str  # http://host:port
    labels: dict[str, str]
    # The scraped series' own labels win over the target's (how DCGM exporter's pod labels survive).
    honor_labels: bool = False


@dataclass
class PrometheusServer:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def api(self, path: str, **params: Any) -> Any:
        r = loopback.get(f"{self.url}/api/v1/{path}", params=params, timeout=30)
        body = r.json()
        assert body.get("status") == "success", (path, params, body)
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"query": expr}
        if at is not None:
            params["time"] = at
        result: list[dict[str, Any]] = self.api("query", **params)["result"]
        return result

    def query_range(self, expr: str, start: float, end: float, step: float
                    ) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.api("query_range", query=expr, start=start, end=end,
                                                step=step)["result"]
        return result

    def wait_scraped(self, after: float, count: int, timeout_s: float = 30) -> None:
        """Until all `count` targets are up and scraped since `after` (unix time). Prometheus
        hands new targets to the scrapers up to 5 s after it starts."""
        deadline = time.monotonic() + timeout_s
        while True:
            targets = self.api("targets")["activeTargets"]
            if len(targets) == count and all(
                x["health"] == "up" and _unix(x["lastScrape"]) > after for x in targets
            ):
                return
            assert time.monotonic() < deadline, f"targets not scraped: {targets}"
            time.sleep(0.2)


def _unix(rfc3339: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(rfc3339).timestamp()


@contextlib.contextmanager
def prometheus_server(workdir: Path, targets: list[Target]) -> Iterator[PrometheusServer]:
    binary = shutil.which("prometheus")
    if binary is None:
        raise RuntimeError(INSTALL_HINT)
    jobs: dict[str, list[Target]] = {}
    for t in targets:
        jobs.setdefault(t.job, []).append(t)
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {"job_name": job, "honor_labels": any(t.honor_labels for t in ts), "static_configs": [
                {"targets": [t.url.split("://", 1)[1]], "labels": t.labels} for t in ts]}
            for job, ts in jobs.items()
        ],
    }
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    port = free_port()
    log = workdir / "prometheus.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [binary, f"--config.file={workdir / 'prometheus.yml'}",
             f"--storage.tsdb.path={workdir / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
            stdout=out, stderr=subprocess.STDOUT,
        )
    server = PrometheusServer(f"http://127.0.0.1:{port}", proc, log)
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if loopback.get(server.url + "/-/ready", timeout=1).status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"prometheus did not start:\n{log.read_text()[-2000:]}")
            time.sleep(0.1)
        yield server
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
