"""`python -m loadtest compare`: two targets behind one gateway, locust runs alternating A B A B per
level, a cross-check against the gateway's counters after every run, then the report.

Each run is its own headless locust process (loadtest/locustfile.py) writing one JSON line per
request; this process only schedules, watches and sums up, so it costs the client nothing.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from loadtest import gateway_view
from loadtest.errors import PROG, UsageError, error_line
from loadtest.metrics import RequestRecord, Run, StreamTimer, parse_slos, summarize
from loadtest.settings import CompareSettings, settings_from_args
from loadtest.workloads import Workload

REPO = Path(__file__).resolve().parents[1]
LOCUSTFILE = REPO / "loadtest" / "locustfile.py"
# In-flight requests finish after the run time (so client and gateway count the same requests).
STOP_TIMEOUT_S = 300


def _say(msg: str) -> None:
    print(f"[compare {datetime.now(UTC):%H:%M:%S}] {msg}", flush=True)


def wait_for(s: CompareSettings, model: str) -> None:
    """Until `model` answers a one-token request, for at most --wait: a Job installed with the
    release starts before the engines have loaded their weights."""
    headers = gateway_view.auth_headers(s.api_key)
    body = {"model": model, "max_tokens": 1,
            "messages": [{"role": "user", "content": "ping"}]}
    deadline = time.monotonic() + s.wait_s
    last = "no answer yet"
    next_line = 0.0
    while True:
        try:
            r = httpx.post(s.host + "/v1/chat/completions", json=body, headers=headers,
                           timeout=30)
            if r.status_code == 200:
                return
            if r.status_code in (400, 401, 403, 404):  # will not change by waiting
                raise UsageError(f"{model}: HTTP {r.status_code} {r.text[:200]}")
            last = f"HTTP {r.status_code}"
        except httpx.HTTPError as exc:
            last = f"{type(exc).__name__}: {exc}"
        now = time.monotonic()
        if now > deadline:
            raise RuntimeError(f"{model} did not answer within --wait {s.wait} ({last})")
        if now >= next_line:
            _say(f"waiting for {model}: {last}; {deadline - now:.0f}s left")
            next_line = now + 30
        time.sleep(min(5.0, max(0.0, deadline - now)))


def warm_up(s: CompareSettings, model: str) -> None:
    """A few sequential requests of the workload: engines compile and cache per prompt shape,
    and the first requests after start-up are slower than the rest."""
    w = Workload(s.workload, s.seed + 10_000, s.max_tokens or None)
    headers = gateway_view.auth_headers(s.api_key)
    for i in range(s.warmup_requests):
        timer = StreamTimer(time.time(), time.perf_counter())
        with httpx.stream("POST", s.host + "/v1/chat/completions", json=w.body(model, i),
                          headers=headers, timeout=600) as r:
            for line in r.iter_lines():
                if line.startswith("data:"):
                    timer.feed(line[5:], time.perf_counter())
        rec = timer.finish(time.perf_counter())
        if not rec.ok:
            raise RuntimeError(f"warm-up request to {model} failed: {rec.error}")


def locust_argv(s: CompareSettings, model: str, level: float, round_: int,
                records: Path) -> list[str]:
    argv = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless",
            "--host", s.host, "-t", f"{int(s.duration_s)}s", "--stop-timeout", str(STOP_TIMEOUT_S),
            "--model", model, "--workload", s.workload, "--seed", str(s.seed + round_),
            "--records-out", str(records), "--only-summary", "--loglevel", "WARNING"]
    if s.max_tokens:
        argv += ["--max-tokens", str(s.max_tokens)]
    if s.api_key:
        argv += ["--api-key", s.api_key]
    for slo in s.slos:
        argv += ["--slo", slo]
    if s.mode == "users":
        argv += ["-u", str(int(level)), "-r", str(int(level))]
    else:
        argv += ["-u", "1", "-r", "1", "--rate", f"{level:g}"]
    return argv


def _count_lines(path: Path) -> int:
    try:
        with open(path, "rb") as fh:
            return sum(1 for _ in fh)
    except FileNotFoundError:
        return 0


def run_one(s: CompareSettings, run: Run, index: int, total: int, out: Path) -> None:
    """One locust process for one target at one level, with progress lines and the cross-check."""
    tag = f"{run.label}-{s.mode}{run.level:g}-r{run.round}"
    records = out / "records" / f"{tag}.jsonl"
    records.parent.mkdir(parents=True, exist_ok=True)
    records.unlink(missing_ok=True)
    log = out / "logs" / f"{tag}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    before = gateway_view.counters(s.host, run.model, s.metrics_from) if s.cross_check else None
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p))
    t0 = time.monotonic()
    with open(log, "w") as fh:
        proc = subprocess.Popen(locust_argv(s, run.model, run.level, run.round, records),
                                stdout=fh, stderr=subprocess.STDOUT, cwd=REPO, env=env)
        next_line = t0
        while proc.poll() is None:
            now = time.monotonic()
            if now >= next_line:
                left = s.duration_s - (now - t0)
                state = f"{left:.0f}s left" if left > 0 else "finishing in-flight requests"
                _say(f"run {index}/{total}: {run.label} ({run.model}) {s.mode}={run.level:g} "
                     f"round {run.round + 1}/{s.rounds}: {state}, "
                     f"{_count_lines(records)} requests done")
                next_line = now + 10
            time.sleep(0.5)
    run.wall_s = time.monotonic() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"locust exited with {proc.returncode} for {tag}; see {log}")
    run.records = [RequestRecord.from_json(line)
                   for line in records.read_text().splitlines() if line.strip()]
    if before is not None:
        client_tokens = sum(r.output_tokens for r in run.records)
        # The gateway counts a request when its last byte has gone out, a moment after the
        # client read it: wait briefly for its counters to catch up.
        deadline = time.monotonic() + 5
        while True:
            after = gateway_view.counters(s.host, run.model, s.metrics_from)
            check = gateway_view.cross_check(before, after, len(run.records), client_tokens,
                                             s.tolerance)
            if check["ok"] or time.monotonic() > deadline:
                break
            time.sleep(0.25)
        run.cross_check = check
    summ = summarize(run.records)
    _say(f"run {index}/{total} done: {run.label} {s.mode}={run.level:g}: "
         f"{summ['requests']} requests, {summ['errors']} errors, "
         f"{summ['output_tok_s']:.1f} output tok/s, TTFT p50 {summ['ttft_ms']['p50']:.0f} ms"
         + ("" if run.cross_check is None else
            f", gateway counted {run.cross_check['gateway_requests']:.0f} requests / "
            f"{run.cross_check['gateway_output_tokens']:.0f} tokens"))


def aggregate(s: CompareSettings, runs: list[Run]) -> list[dict[str, Any]]:
    """One summary per (target, level): all its rounds' requests over the rounds' summed time."""
    slos = parse_slos(s.slos)
    out = []
    for label, _model in s.target_pairs():
        for level in s.levels():
            mine = [r for r in runs if r.label == label and r.level == level]
            if not mine:
                continue
            records = [rec for r in mine for rec in r.records]
            duration = sum(summarize(r.records)["duration_s"] for r in mine)
            summ = summarize(records, slos, duration_s=duration)
            summ.update({"label": label, s.mode: level,
                         "rounds_output_tok_s": [summarize(r.records)["output_tok_s"]
                                                 for r in mine]})
            out.append(summ)
    return out


def main(argv: list[str]) -> int:
    s = settings_from_args(argv)
    from loadtest import report  # matplotlib only when there is something to draw

    out = s.out
    started = datetime.now(UTC)
    targets = []
    for label, model in s.target_pairs():
        if s.wait_s:
            wait_for(s, model)
        try:
            layout = gateway_view.layout_of(s.host, model, s.api_key)
        except httpx.TransportError as exc:
            raise UsageError(f"cannot reach the gateway at --host {s.host} "
                             f"({type(exc).__name__}: {exc}); is it running there?") from None
        targets.append({"label": label, "model": model, "layout": layout})
        _say(f"target {label}: {model}, layout {layout.to_dict()}")
    out.mkdir(parents=True, exist_ok=True)  # once the targets are known to be there
    for t in targets:
        if s.warmup_requests:
            _say(f"warming up {t['label']} ({s.warmup_requests} requests)")
            model = str(t["model"])
            seen = gateway_view.counters(s.host, model, s.metrics_from) if s.cross_check else None
            warm_up(s, model)
            if seen is not None:
                # The first run's snapshot must not catch the last warm-up request uncounted (an
                # A/A run read 13 gateway requests against the client's 12).
                gateway_view.settled(s.host, model, s.metrics_from,
                                     seen.requests + s.warmup_requests)
    plan = [Run(label, model, level, rnd)
            for level in s.levels() for rnd in range(s.rounds)
            for label, model in s.target_pairs()]
    _say(f"{len(plan)} runs of {s.duration_s:g}s: levels {s.mode}={s.levels()}, "
         f"{s.rounds} rounds of A B each; at least {len(plan) * s.duration_s / 60:.1f} min")
    for i, run in enumerate(plan, 1):
        run_one(s, run, i, len(plan), out)
    results = aggregate(s, plan)
    command = "python -m loadtest compare " + shlex.join(_redact(argv))
    failed = report.write(out, s, targets, plan, results, command, started)
    _say(f"report: {out / 'report.md'}")
    if s.print_report:
        print((out / "report.md").read_text(), flush=True)
    if failed:
        error_line(f"{PROG} compare",
                   f"cross-check FAILED: client and gateway counts differ by more than "
                   f"{s.tolerance:.0%} in {len(failed)} run(s): {', '.join(failed)} "
                   f"(see {out / 'report.md'})")
        return 1
    return 0


def _redact(argv: list[str]) -> list[str]:
    out, hide = [], False
    for a in argv:
        if hide:
            out.append("***")
            hide = False
            continue
        if a == "--api-key":
            hide = True
        elif a.startswith("--api-key="):
            a = "--api-key=***"
        out.append(a)
    return out
