"""TP vs PP: two pools side by side on the same panels, picked with `$pool_a` and `$pool_b`
(values-tp-vs-pp.yaml deploys one of each). The hidden `$model_a`/`$model_b` follow from
llmserve_pool_info, so the gateway's per-model series line up with the engines' per-pool ones, and
so do `$tp_a`, `$pp_a`, ...: a replica's GPUs are tp x pp, which the per-GPU throughput divides by.
"""

from __future__ import annotations

from deploy.dashboards import gpus
from deploy.dashboards.common import (
    NS,
    RATE,
    TOKENS_PER_S,
    Dashboard,
    Panel,
    Query,
    Row,
    Variable,
    namespace_variable,
    q,
    quantiles,
)

SIDES = ("a", "b")


def _engine(side: str) -> str:
    return f'{NS}, pool="$pool_{side}"'


def _gateway(side: str) -> str:
    return f'{NS}, model="$model_{side}"'


def tokens_per_gpu(side: str) -> str:
    """Output tok/s of a pool / its GPUs (serving pods, one per replica, x tp x pp)."""
    engines = _engine(side)
    replicas = f"count(group by (pod) (vllm:num_requests_running{{{engines}}}))"
    return (f"sum(rate(vllm:generation_tokens_total{{{engines}}}[{RATE}])) "
            f"/ ({replicas} * $tp_{side} * $pp_{side})")


def _both_quantiles(metric: str, qs: tuple[float, ...]) -> list[Query]:
    return [x for s in SIDES for x in quantiles(metric, _gateway(s), qs, legend=f"$pool_{s} ")]


def dashboard() -> Dashboard:
    pools = f"label_values(llmserve_pool_info{{{NS}}}, pool)"
    return Dashboard(
        uid="llmserve-tp-vs-pp",
        title="llmserve / TP vs PP",
        description="Two pools on the same panels: throughput (per GPU too), TTFT, TPOT, "
        "KV-cache usage, GPU utilisation. Pick the pools with the A and B variables.",
        variables=[
            namespace_variable("llmserve_pool_info"),
            Variable("pool_a", "Pool A", pools, "First pool (e.g. the tensor-parallel one)",
                     multi=False),
            Variable("pool_b", "Pool B", pools, "Second pool (e.g. the pipeline-parallel one)",
                     multi=False),
            *(Variable(f"model_{s}", f"Model {s.upper()}",
                       f'label_values(llmserve_pool_info{{{NS}, pool="$pool_{s}"}}, model)',
                       f"Served model of pool {s.upper()}", multi=False, hidden=True)
              for s in SIDES),
            *(Variable(f"{key}_{s}", f"{key.upper()} {s.upper()}",
                       f'label_values(llmserve_pool_info{{{NS}, pool="$pool_{s}"}}, {key})',
                       f"{what} of pool {s.upper()}", multi=False, hidden=True)
              for s in SIDES
              for key, what in (("tp", "Tensor-parallel size"), ("pp", "Pipeline-parallel size"))),
        ],
        rows=[
            Row("Layouts and throughput", [
                Panel("Layouts",
                      "The two pools' served models and parallel layouts (tensor parallel, "
                      "pipeline parallel, nodes per replica).", "none",
                      [q(f'max by (pool, model, tp, pp, nodes) (llmserve_pool_info{{{NS}, '
                         'pool=~"$pool_a|$pool_b"})')], kind="table"),
                Panel("Generation tokens/s",
                      "Tokens decoded per second by each pool's engines.", TOKENS_PER_S,
                      [q(f"sum(rate(vllm:generation_tokens_total{{{_engine(s)}}}[{RATE}]))",
                         f"$pool_{s}") for s in SIDES]),
                Panel("Requests/s",
                      "Requests answered per second through the gateway, per pool's model.",
                      "reqps",
                      [q(f"sum(rate(llmserve_requests_total{{{_gateway(s)}}}[{RATE}]))",
                         f"$pool_{s}") for s in SIDES]),
            ]),
            Row("Per GPU", [
                Panel("Output tokens/s per GPU",
                      "Generation tok/s of each pool / its GPUs (serving pods x tp x pp, from "
                      "the layout): the comparison's headline, fair across layouts of different "
                      "sizes.", TOKENS_PER_S,
                      [q(tokens_per_gpu(s), f"$pool_{s}") for s in SIDES], extra={"min": 0}),
                Panel("GPU utilisation (mean)",
                      "DCGM_FI_DEV_GPU_UTIL averaged over each pool's GPUs (followers of a "
                      "multi-node replica included): PP's pipeline bubble shows as idle time.",
                      "percent",
                      [q(f"avg({gpus.pooled(gpus.metric(gpus.GPU_UTIL), _engine(s))})",
                         f"$pool_{s}") for s in SIDES], extra={"min": 0}),
                Panel("GPU power (mean per GPU)",
                      "DCGM_FI_DEV_POWER_USAGE averaged over each pool's GPUs, in watts.", "watt",
                      [q(f"avg({gpus.pooled(gpus.metric(gpus.POWER), _engine(s))})",
                         f"$pool_{s}") for s in SIDES], extra={"min": 0}),
            ]),
            Row("Latency", [
                Panel("Time to first token (p50, p95)",
                      "Gateway TTFT of streamed requests for each pool's model.", "s",
                      _both_quantiles("llmserve_ttft_seconds", (0.5, 0.95))),
                Panel("Time per output token (p50, p95)",
                      "Gateway TPOT ((E2E - TTFT) / (tokens - 1)) for each pool's model.", "s",
                      _both_quantiles("llmserve_tpot_seconds", (0.5, 0.95))),
                Panel("End-to-end latency (p50, p95)",
                      "Gateway E2E latency for each pool's model.", "s",
                      _both_quantiles("llmserve_e2e_request_latency_seconds", (0.5, 0.95))),
            ]),
            Row("Engines", [
                Panel("KV-cache usage",
                      "Highest KV-cache usage among each pool's engines.", "percentunit",
                      [q(f"max(vllm:kv_cache_usage_perc{{{_engine(s)}}})", f"$pool_{s}")
                       for s in SIDES], extra={"min": 0}),
                Panel("Running and waiting requests",
                      "Requests in the engines' running batches and scheduler queues, per pool.",
                      "short",
                      [x for s in SIDES for x in (
                          q(f"sum(vllm:num_requests_running{{{_engine(s)}}})", f"running $pool_{s}"),
                          q(f"sum(vllm:num_requests_waiting{{{_engine(s)}}})", f"waiting $pool_{s}"),
                      )]),
                Panel("Engine ITL (p50, p95)",
                      "Inter-token latency inside each pool's engines: PP adds a pipeline "
                      "bubble per token, TP an all-reduce per layer.", "s",
                      [x for s in SIDES for x in quantiles(
                          "vllm:inter_token_latency_seconds", _engine(s), (0.5, 0.95),
                          legend=f"$pool_{s} ")]),
            ]),
        ],
    )
