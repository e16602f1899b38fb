"""Overview: the gateway as the clients see it. The dashboard an operator opens first."""

from __future__ import annotations

from pathlib import Path

import yaml

from deploy.dashboards.common import (
    NS,
    RATE,
    TOKENS_PER_S,
    Dashboard,
    Panel,
    Row,
    Variable,
    namespace_variable,
    q,
    quantiles,
)

VALUES = Path(__file__).resolve().parents[1] / "helm" / "llmserve" / "values.yaml"
GW = f'{NS}, model=~"$model"'
# The gateway's admission pools are per model: their `pool` label holds the model name.
FLOW = f'{NS}, pool=~"$model"'
# The TTFT SLO is the chart's (metrics.prometheusRule.ttftSloSeconds and ttftSloObjective, which
# the burn-rate alert reads): two constant variables of the same names hold it. Their values here
# are values.yaml's defaults; the chart sets them from the release's values when it ships the
# dashboard (templates/monitoring/dashboards.yaml), so panel and alert never disagree.
SLO_KEYS = ("ttftSloSeconds", "ttftSloObjective")
# The alert's burn-rate thresholds (the Google SRE workbook's for a 30-day budget: 1 h and 5 m at
# 14.4, 6 h and 30 m at 6), drawn on the panel; tests/deploy/test_dashboard_slo.py checks them
# against the rendered PrometheusRule.
BURN_THRESHOLDS = (6.0, 14.4)


def go_format(value: float) -> str:
    """A number as the chart's `printf "%v"` writes it (values are float64 in Go: 2 -> "2")."""
    text = repr(float(value))
    return text.removesuffix(".0")


def slo_variables() -> list[Variable]:
    rule = yaml.safe_load(VALUES.read_text(encoding="utf-8"))["metrics"]["prometheusRule"]
    return [Variable(key, key, go_format(rule[key]),
                     f"metrics.prometheusRule.{key} of the chart, as the SLO alert uses it",
                     constant=True)
            for key in SLO_KEYS]


def ttft_burn(window: str) -> str:
    """Share of streams slower than the SLO over `window`, divided by the budget (1 = on budget).
    The same expression as the chart's alert, summed over the selected models."""
    le = "$ttftSloSeconds|${ttftSloSeconds}.0"  # prometheus_client writes le="2.0"
    return (f'(1 - sum(rate(llmserve_ttft_seconds_bucket{{{GW}, le=~"{le}"}}[{window}])) '
            f"/ sum(rate(llmserve_ttft_seconds_count{{{GW}}}[{window}]))) "
            "/ (1 - $ttftSloObjective)")


def dashboard() -> Dashboard:
    return Dashboard(
        uid="llmserve-overview",
        title="llmserve / Overview",
        description="The gateway as clients see it: traffic, latency (TTFT, TPOT, ITL, E2E), "
        "flow control, errors, tenants, SLO burn. Engine internals: llmserve / Engines.",
        variables=[
            namespace_variable("llmserve_requests_in_flight"),
            Variable("model", "Model",
                     'label_values({__name__=~"llmserve_pool_info|llmserve_requests_total", '
                     f'{NS}}}, model)',
                     "Served model name (the gateway's `model` label; unknown names count as "
                     "`unknown`)"),
            Variable("pool", "Pool", f"label_values(llmserve_pool_info{{{NS}}}, pool)",
                     "Worker pool of the chart (layout table)"),
            *slo_variables(),
        ],
        rows=[
            Row("Traffic", [
                Panel("Requests/s by status",
                      "Proxied requests per second by final HTTP status (499: the client went "
                      "away). Admission refusals count here too (429, 503).", "reqps",
                      [q(f"sum by (status) (rate(llmserve_requests_total{{{GW}}}[{RATE}]))",
                         "{{status}}")]),
                Panel("Tokens/s",
                      "Generated (output) and prompt (input) tokens per second, from the "
                      "engines' usage reports.", TOKENS_PER_S,
                      [q(f"sum by (model) (rate(llmserve_output_tokens_total{{{GW}}}[{RATE}]))",
                         "output {{model}}"),
                       q(f"sum by (model) (rate(llmserve_input_tokens_total{{{GW}}}[{RATE}]))",
                         "input {{model}}")]),
                Panel("Pool layouts",
                      "Each worker pool's served model and parallel layout (tensor parallel, "
                      "pipeline parallel, nodes per replica), from llmserve_pool_info.", "none",
                      [q(f'max by (pool, model, tp, pp, nodes) (llmserve_pool_info{{{NS}, '
                         f'pool=~"$pool"}})')], kind="table"),
            ]),
            Row("Latency (gateway view, streamed requests)", [
                Panel("Time to first token",
                      "Request received -> first content event sent, streams only: includes "
                      "the gateway queue and the engine's prefill.", "s",
                      quantiles("llmserve_ttft_seconds", GW, (0.5, 0.95, 0.99))),
                Panel("TPOT and ITL",
                      "vllm bench serve's definitions: TPOT = (E2E - TTFT) / (output tokens - "
                      "1) per stream; ITL = gap between two content events.", "s",
                      [*quantiles("llmserve_tpot_seconds", GW, (0.5, 0.99), legend="TPOT "),
                       *quantiles("llmserve_itl_seconds", GW, (0.5, 0.99), legend="ITL ")]),
                Panel("End-to-end latency",
                      "Request received -> last byte sent, streamed and whole answers.", "s",
                      quantiles("llmserve_e2e_request_latency_seconds", GW, (0.5, 0.95, 0.99))),
            ]),
            Row("Load and flow control", [
                Panel("In flight and queued",
                      "HTTP requests being served per gateway pod, admitted requests in flight "
                      "and requests waiting in the admission queue per pool.", "short",
                      [q(f"sum by (pod) (llmserve_requests_in_flight{{{NS}}})",
                         "in flight {{pod}}"),
                       q(f"sum by (pool) (llmserve_admitted_in_flight{{{FLOW}}})",
                         "admitted {{pool}}"),
                       q(f"sum by (pool) (llmserve_queue_depth{{{FLOW}}})", "queued {{pool}}")]),
                Panel("Queue time",
                      "Time an admitted request waited in the gateway's queue (0 when admitted "
                      "at once).", "s",
                      quantiles("llmserve_queue_time_seconds", FLOW, (0.5, 0.99), by="pool")),
                Panel("Adaptive concurrency limit",
                      "Each gateway pod's current concurrency limit per pool: it shrinks when "
                      "the engines' TTFT passes the target, and grows back, up to its ceiling "
                      "(max_limit per available replica, llmserve_concurrency_limit_ceiling; "
                      "not drawn: it is usually far above and would flatten this line). A "
                      "limit pinned flat while requests queue is at that ceiling.", "short",
                      [q(f"max by (pool, pod) (llmserve_concurrency_limit{{{FLOW}}})",
                         "{{pool}} {{pod}}")]),
            ]),
            Row("Errors", [
                Panel("Rejections by reason",
                      "Requests refused by admission control: rpm/tpm (429), queue_full, "
                      "queue_wait, unavailable (503). 0 when none.", "reqps",
                      [q(f"sum by (reason) (rate(llmserve_rejections_total{{{FLOW}}}[{RATE}])) "
                         "or vector(0)", "{{reason}}")]),
                Panel("Retries and upstream errors",
                      "Attempts moved to another replica before the first byte, and requests "
                      "answered 5xx (502/504: engines, 503: no healthy replica). 0 when none.",
                      "reqps",
                      [q(f"sum(rate(llmserve_upstream_retries_total{{{GW}}}[{RATE}])) "
                         "or vector(0)", "retries"),
                       q(f'sum by (status) (rate(llmserve_requests_total{{{GW}, status=~"5.."}}'
                         f"[{RATE}])) or vector(0)", "{{status}}")]),
                Panel("Stream resumes by outcome",
                      "Streams broken after their first byte (a replica lost, drained or "
                      "failing mid-answer), with GATEWAY_STREAM_RESUMES > 0: resumed on another "
                      "replica, token-exact, or why not (failed, no_replica, limit, deadline, "
                      "unsupported), those ending with an in-band error event. 0 when none.",
                      "reqps",
                      [q(f"sum by (outcome) (rate(llmserve_stream_resumes_total{{{NS}}}"
                         f"[{RATE}])) or vector(0)", "{{outcome}}")]),
                Panel("Backends",
                      "Backends routable per gateway pod, and backends out of rotation (failed "
                      "probes or ejected after request failures).", "short",
                      [q(f"sum by (pod) (llmserve_backend_up{{{NS}}})", "up {{pod}}"),
                       q(f"count by (pod) (llmserve_backend_up{{{NS}}} == 0) or vector(0)",
                         "ejected {{pod}}")]),
            ]),
            Row("Tenants and SLO", [
                Panel("Tokens/s per tenant",
                      "Tokens used per tenant (API key) and kind, from usage reports.",
                      TOKENS_PER_S,
                      [q(f"sum by (tenant, kind) (rate(llmserve_tenant_tokens_total{{{NS}}}"
                         f"[{RATE}]))", "{{tenant}} {{kind}}")]),
                Panel("Requests/s per tenant", "Admitted requests per tenant (API key).", "reqps",
                      [q(f"sum by (tenant) (rate(llmserve_tenant_requests_total{{{NS}}}"
                         f"[{RATE}]))", "{{tenant}}")]),
                Panel("TTFT SLO burn rate ($ttftSloObjective within ${ttftSloSeconds}s)",
                      "Share of streams slower than the SLO (the chart's ttftSloSeconds and "
                      "ttftSloObjective, which the alerts use too) / the error budget (1 - "
                      "objective): 1 spends the budget exactly over the SLO period. Dashed: the "
                      f"alerts' thresholds, {BURN_THRESHOLDS[1]:g} (critical, over 1 h and 5 m) "
                      f"and {BURN_THRESHOLDS[0]:g} (warning, over 6 h and 30 m).", "none",
                      [q(ttft_burn("5m"), "5m"), q(ttft_burn("1h"), "1h")],
                      extra={"min": 0, "thresholds": BURN_THRESHOLDS}),
            ]),
        ],
    )
