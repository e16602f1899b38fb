"""Per-request timing from SSE events, and the run's summary, with `vllm bench serve`'s definitions.

Definitions (vllm/benchmarks/serve.py `calculate_metrics` and
vllm/benchmarks/lib/endpoint_request_func.py `async_request_openai_chat_completions`, vLLM 0.32):

- TTFT: request sent -> the first event that carries `choices` (vLLM sends its role chunk with the
  first token, so this is the first token). Locust's own response time stops at the response
  headers, so it is not used for anything here.
- ITL: the gaps between consecutive events that carry `choices`, one gap per event: an event with
  several tokens is one gap, as in vLLM.
- E2EL: request sent -> the last event that carries `choices` (the usage event and `[DONE]` carry no
  token and do not extend it).
- TPOT: (E2EL - TTFT) / (output tokens - 1), only for answers of more than one token (vLLM's goodput
  counts TPOT as 0 for shorter ones).
- Output tok/s and requests/s: totals of the successful requests over the run's duration (first send
  to last completion). Goodput: requests/s of those that meet every SLO (`ttft_ms`, `tpot_ms`,
  `e2el_ms`; a request meets one when its value is <= the bound, as in vLLM).

Two deliberate differences from vLLM: an in-band error event (`{"error": ...}`, how the gateway ends
a broken stream) fails the request, and a stream without `usage` is counted by its content events
(the `chunks` method, one token per event as vLLM-CPU sends them; a lower bound when an event holds
several tokens) rather than by re-tokenizing the text. Each record says which method counted it.

For the open loop, `start` is the request's *scheduled* send time, so time spent waiting for a free
client slot counts in TTFT and E2EL (no coordinated omission).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

PERCENTILES = (50, 90, 99)
SLO_KEYS = ("ttft_ms", "tpot_ms", "e2el_ms")
# A bound: a positive decimal number of milliseconds. The chart's schema takes the whole `--slo`
# pattern from here (deploy/helm/values_schema.py).
SLO_MS = r"0*[1-9][0-9]*(\.[0-9]*)?|0*\.0*[1-9][0-9]*"
SLO_PATTERN = "^(" + "|".join(SLO_KEYS) + ")=(" + SLO_MS + ")$"


@dataclass
class RequestRecord:
    """One request as the client saw it; times in seconds, `start` on the wall clock."""

    start: float
    ttft: float | None = None
    latency: float = 0.0  # E2EL: start -> last token event (or -> failure)
    itl: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int | None = None
    token_source: str = "none"  # "usage" | "chunks" | "none"
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def tpot(self) -> float:
        """vLLM's per-request TPOT; 0 for answers of at most one token (as its goodput counts it)."""
        if self.ttft is None or self.output_tokens <= 1:
            return 0.0
        return (self.latency - self.ttft) / (self.output_tokens - 1)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, line: str) -> RequestRecord:
        return cls(**json.loads(line))


@dataclass
class Run:
    """One locust run of one target at one load level and round: its requests as the client
    recorded them, and how they compare with the gateway's own counters."""

    label: str
    model: str
    level: float
    round: int
    records: list[RequestRecord] = field(default_factory=list)
    wall_s: float = 0.0
    cross_check: dict[str, Any] | None = None


class StreamTimer:
    """Feed it each SSE `data:` payload with the time it arrived; `finish` gives the record.

    Times are offsets from the same clock as `t0` (time.perf_counter in the client)."""

    def __init__(self, start_wall: float, t0: float) -> None:
        self.record = RequestRecord(start=start_wall)
        self._t0 = t0
        self._last: float | None = None
        self._chunks = 0  # events with non-empty content: the second counting method
        self._usage_tokens: int | None = None
        self._done = False

    def feed(self, payload: bytes | str, t: float) -> None:
        """One `data:` payload (without the prefix)."""
        if isinstance(payload, bytes):
            payload = payload.decode("utf-8", "replace")
        payload = payload.strip()
        if not payload or self.record.error is not None:
            return
        if payload == "[DONE]":
            self._done = True
            return
        try:
            data = json.loads(payload)
        except ValueError:
            self.fail(f"unparsable SSE event: {payload[:80]}", t)
            return
        if not isinstance(data, dict):
            self.fail(f"unexpected SSE event: {payload[:80]}", t)
            return
        if "error" in data:
            err = data["error"]
            msg = err.get("message") if isinstance(err, dict) else err
            self.fail(f"in-band error: {msg}", t)
            return
        choices = data.get("choices")
        if choices:
            if self._last is None:
                self.record.ttft = t - self._t0
            else:
                self.record.itl.append(t - self._last)
            self._last = t
            if any(_content(c) for c in choices):
                self._chunks += 1
        usage = data.get("usage")
        if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
            self._usage_tokens = int(usage["completion_tokens"])
            if usage.get("prompt_tokens") is not None:
                self.record.prompt_tokens = int(usage["prompt_tokens"])

    def fail(self, message: str, t: float) -> None:
        if self.record.error is None:
            self.record.error = message
            self.record.latency = t - self._t0

    def finish(self, t: float) -> RequestRecord:
        """The stream ended (connection closed or [DONE] read) at `t`."""
        r = self.record
        if r.error is None:
            if r.ttft is None:
                # vLLM: "Never received a valid chunk to calculate TTFT" fails the request.
                self.fail("no token event before the stream ended", t)
            elif not self._done:
                self.fail("stream ended without [DONE]", t)
            else:
                assert self._last is not None
                r.latency = self._last - self._t0
        if self._usage_tokens is not None:
            r.output_tokens, r.token_source = self._usage_tokens, "usage"
        elif r.ttft is not None:
            r.output_tokens, r.token_source = self._chunks, "chunks"
        return r


def _content(choice: Any) -> bool:
    if not isinstance(choice, dict):
        return False
    delta = choice.get("delta")
    if isinstance(delta, dict):
        return bool(delta.get("content") or delta.get("reasoning_content"))
    return bool(choice.get("text"))  # /v1/completions streams


def percentile(values: Sequence[float], p: float) -> float:
    """numpy's default (linear) percentile, as vLLM reports them; 0 for no values (as vLLM)."""
    if not values:
        return 0.0
    s = sorted(values)
    k = (len(s) - 1) * p / 100
    lo = math.floor(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def _dist_ms(values: Sequence[float]) -> dict[str, float]:
    out = {f"p{p}": round(percentile(values, p) * 1e3, 3) for p in PERCENTILES}
    out["mean"] = round(sum(values) / len(values) * 1e3, 3) if values else 0.0
    return out


def parse_slos(items: Iterable[str]) -> dict[str, float]:
    """['ttft_ms=500', 'tpot_ms=50'] -> {'ttft_ms': 500.0, 'tpot_ms': 50.0}; one-line errors."""
    slos: dict[str, float] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or key not in SLO_KEYS:
            raise ValueError(f"--slo {item!r}: expected one of {', '.join(SLO_KEYS)} as KEY=MS")
        if not re.fullmatch(SLO_MS, value):
            raise ValueError(f"--slo {item!r}: {value!r} is not a positive number of "
                             "milliseconds (digits, one optional '.')")
        slos[key] = float(value)
    return slos


def meets(r: RequestRecord, slos: dict[str, float]) -> bool:
    if not r.ok or r.ttft is None:
        return False
    values = {"ttft_ms": r.ttft, "tpot_ms": r.tpot, "e2el_ms": r.latency}
    return all(values[k] * 1e3 <= bound for k, bound in slos.items())


def summarize(records: Sequence[RequestRecord], slos: dict[str, float] | None = None,
              duration_s: float | None = None) -> dict[str, Any]:
    """The run's figures. `duration_s` defaults to first send -> last completion."""
    ok = [r for r in records if r.ok]
    if duration_s is None:
        duration_s = (max(r.start + r.latency for r in records) - min(r.start for r in records)
                      if records else 0.0)
    out_tokens = sum(r.output_tokens for r in ok)
    per_s = (lambda n: n / duration_s) if duration_s > 0 else (lambda n: 0.0)
    sources: dict[str, int] = {}
    for r in records:
        sources[r.token_source] = sources.get(r.token_source, 0) + 1
    summary: dict[str, Any] = {
        "requests": len(records),
        "completed": len(ok),
        "errors": len(records) - len(ok),
        "output_tokens": out_tokens,
        "output_tokens_all": sum(r.output_tokens for r in records),
        "duration_s": round(duration_s, 3),
        "output_tok_s": round(per_s(out_tokens), 3),
        "req_s": round(per_s(len(ok)), 3),
        "ttft_ms": _dist_ms([r.ttft for r in ok if r.ttft is not None]),
        "tpot_ms": _dist_ms([r.tpot for r in ok if r.output_tokens > 1]),
        "itl_ms": _dist_ms([g for r in ok for g in r.itl]),
        "e2el_ms": _dist_ms([r.latency for r in ok]),
        "token_sources": sources,
    }
    if slos:
        good = sum(1 for r in ok if meets(r, slos))
        summary["slos"] = dict(slos)
        summary["good_requests"] = good
        summary["goodput_req_s"] = round(per_s(good), 3)
    return summary
