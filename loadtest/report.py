"""report.md, summary.json and the PNGs of one comparison."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from loadtest import plots
from loadtest.gateway_view import Layout
from loadtest.metrics import Run
from loadtest.settings import CompareSettings

DEFINITIONS = """\
Definitions (those of `vllm bench serve`, vllm/benchmarks/serve.py, timed by this client from the
SSE events; locust's own response time stops at the headers and is not used):
TTFT = send -> first event with `choices`; ITL = gaps between such events (one per event);
E2EL = send -> last such event; TPOT = (E2EL - TTFT) / (output tokens - 1), answers of > 1 token;
output tok/s and req/s = successful requests' totals / the runs' summed durations (first send to
last completion, per run); goodput = req/s of requests within every SLO. Errors: HTTP errors,
in-band error events and streams cut before `[DONE]`. Percentiles: linear interpolation (numpy's).
"""

ROWS = [
    ("TTFT p50 (ms)", lambda r: r["ttft_ms"]["p50"]),
    ("TTFT p90 (ms)", lambda r: r["ttft_ms"]["p90"]),
    ("TTFT p99 (ms)", lambda r: r["ttft_ms"]["p99"]),
    ("TPOT p50 (ms)", lambda r: r["tpot_ms"]["p50"]),
    ("TPOT p99 (ms)", lambda r: r["tpot_ms"]["p99"]),
    ("ITL p50 (ms)", lambda r: r["itl_ms"]["p50"]),
    ("ITL p99 (ms)", lambda r: r["itl_ms"]["p99"]),
    ("E2EL p50 (ms)", lambda r: r["e2el_ms"]["p50"]),
    ("output tok/s", lambda r: r["output_tok_s"]),
    ("requests/s", lambda r: r["req_s"]),
    ("goodput req/s", lambda r: r.get("goodput_req_s", 0.0)),
    ("requests", lambda r: r["requests"]),
    ("errors", lambda r: r["errors"]),
]


def _fmt(v: float) -> str:
    if isinstance(v, int) or float(v).is_integer():
        return f"{v:,.0f}"
    return f"{v:,.1f}" if abs(v) >= 10 else f"{v:.2f}"


def _ratio(a: float, b: float) -> str:
    return f"{b / a:.2f}" if a else "-"


def ttft_series(runs: list[Run]) -> dict[tuple[str, float], list[float]]:
    """The successful requests' TTFTs per target and level, every round of the level together."""
    series: dict[tuple[str, float], list[float]] = {}
    for r in runs:
        series.setdefault((r.label, r.level), []).extend(
            x.ttft for x in r.records if x.ok and x.ttft is not None)
    return series


def write(out: Path, s: CompareSettings, targets: list[dict[str, Any]], runs: list[Run],
          results: list[dict[str, Any]], command: str, started: datetime) -> list[str]:
    """Write everything; returns the runs whose cross-check failed."""
    labels = [t["label"] for t in targets]
    layouts: dict[str, Layout] = {t["label"]: t["layout"] for t in targets}
    mode, unit = s.mode, s.accelerator
    failed = [f"{r.label} {mode}={r.level:g} round {r.round + 1}" for r in runs
              if r.cross_check is not None and not r.cross_check["ok"]]
    sources: dict[str, int] = {}
    for r in results:
        for k, v in r["token_sources"].items():
            sources[k] = sources.get(k, 0) + v

    gpus = {label: (layouts[label].gpus or 1) for label in labels}
    plots.ttft_cdf(out / "ttft_cdf.png", ttft_series(runs), labels, mode)
    plots.throughput(out / "throughput.png", results, labels, mode)
    plots.latency_throughput(out / "latency_throughput.png", results, labels, mode)
    plots.pareto(out / "pareto_per_gpu.png", results, labels, gpus, mode, unit)

    summary = {
        "command": command, "date": started.isoformat(timespec="seconds"),
        "host": s.host, "workload": s.workload, "seed": s.seed, "duration_s": s.duration_s,
        "rounds": s.rounds, "slos": dict(_slo(x) for x in s.slos),
        "token_count_method": sources,
        "targets": [{"label": t["label"], "model": t["model"],
                     "layout": {k: v for k, v in layouts[t["label"]].to_dict().items()}}
                    for t in targets],
        "runs": [_run_json(r, mode) for r in results],
        "cross_check": {"tolerance": s.tolerance, "ok": not failed, "failed": failed,
                        "runs": [{"label": r.label, mode: r.level, "round": r.round + 1,
                                  **(r.cross_check or {})} for r in runs]},
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (out / "report.md").write_text(_markdown(s, targets, layouts, runs, results, command,
                                             started, failed, sources, unit))
    return failed


def _slo(text: str) -> tuple[str, float]:
    k, _, v = text.partition("=")
    return k, float(v)


def _run_json(r: dict[str, Any], mode: str) -> dict[str, Any]:
    keys = ("label", mode, "requests", "errors", "output_tokens", "duration_s", "output_tok_s",
            "req_s", "ttft_ms", "tpot_ms", "itl_ms", "e2el_ms", "goodput_req_s", "good_requests",
            "token_sources", "rounds_output_tok_s")
    return {k: r[k] for k in keys if k in r}


def _markdown(s: CompareSettings, targets: list[dict[str, Any]], layouts: dict[str, Layout],
              runs: list[Run], results: list[dict[str, Any]], command: str, started: datetime,
              failed: list[str], sources: dict[str, int], unit: str) -> str:
    a, b = (t["label"] for t in targets)
    mode = s.mode
    lines = [
        f"# {a} vs {b}: {s.workload} workload",
        "",
        f"- Command: `{command}`",
        f"- Date: {started:%Y-%m-%d %H:%M} UTC (finished {datetime.now(UTC):%H:%M} UTC)",
        (f"- Gateway: {s.host}; {len(runs)} runs of {s.duration_s:g} s, alternating "
         f"{' '.join([a, b] * min(s.rounds, 2))}{' ...' if s.rounds > 2 else ''} at each level; "
         f"{'closed loop (users)' if mode == 'users' else 'open loop (Poisson arrivals)'}; "
         f"seed {s.seed}"),
        f"- Goodput SLOs: {', '.join(s.slos) or 'none'}",
        "- Output tokens counted by: " + ", ".join(
            f"{k} ({v} requests)" for k, v in sorted(sources.items()))
        + (" (`chunks`: content events, the stream carried no usage)"
           if "chunks" in sources else ""),
        "",
        "| target | model | TP | PP | nodes | replicas | " + f"{unit}s | layout from |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for t in targets:
        lay = layouts[t["label"]]
        lines.append(f"| {t['label']} | {t['model']} | {lay.tp or '?'} | {lay.pp or '?'} | "
                     f"{lay.nodes or '?'} | {lay.replicas or '?'} | {lay.gpus or '? (1 assumed)'} "
                     f"| {lay.source} |")
    lines += ["", DEFINITIONS]
    for level in s.levels():
        ra = next((r for r in results if r["label"] == a and r[mode] == level), None)
        rb = next((r for r in results if r["label"] == b and r[mode] == level), None)
        if ra is None or rb is None:
            continue
        lines += [f"## {mode} = {level:g}", "", f"| metric | {a} | {b} | {b}/{a} |",
                  "|---|---:|---:|---:|"]
        for name, get in ROWS:
            lines.append(f"| {name} | {_fmt(get(ra))} | {_fmt(get(rb))} | "
                         f"{_ratio(get(ra), get(rb))} |")
        lines.append(f"| output tok/s per round | "
                     f"{' / '.join(_fmt(x) for x in ra['rounds_output_tok_s'])} | "
                     f"{' / '.join(_fmt(x) for x in rb['rounds_output_tok_s'])} | |")
        lines.append("")
    lines += ["## Cross-check against the gateway's /metrics", "",
              f"Requests and output tokens per run as this client counted them and as the "
              f"gateway's `llmserve_requests_total` / `llmserve_output_tokens_total` moved "
              f"(tolerance {s.tolerance:.0%}): "
              + ("**all runs agree**." if not failed else f"**FAILED** in {', '.join(failed)}."),
              "",
              "| run | client requests | gateway requests | client tokens | gateway tokens | ok |",
              "|---|---:|---:|---:|---:|---|"]
    for r in runs:
        c = r.cross_check
        if c is None:
            continue
        lines.append(f"| {r.label} {mode}={r.level:g} #{r.round + 1} | {c['client_requests']} | "
                     f"{c['gateway_requests']:.0f} | {c['client_output_tokens']} | "
                     f"{c['gateway_output_tokens']:.0f} | {'yes' if c['ok'] else '**NO**'} |")
    lines += ["", "## Plots", "",
              "![TTFT CDF](ttft_cdf.png)", "", "![output tok/s](throughput.png)", "",
              "![TPOT p50 against output tok/s](latency_throughput.png)", "",
              f"![per-{unit} Pareto](pareto_per_gpu.png)", ""]
    return "\n".join(lines)
