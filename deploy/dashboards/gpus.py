"""GPU panels from NVIDIA's DCGM exporter (the GPU Operator runs it on every GPU node).

Metric names are DCGM field names, as dcgm-exporter's default counters export them:
DCGM_FI_DEV_GPU_UTIL (%), DCGM_FI_DEV_FB_USED and DCGM_FI_DEV_FB_FREE (framebuffer MiB),
DCGM_FI_DEV_POWER_USAGE (W). Each series is one GPU (`gpu` index on its node, `UUID`, `modelName`,
`Hostname`); with the exporter's Kubernetes pod mapping a GPU held by a pod also carries that pod's
`namespace`, `pod` and `container`. Prometheus keeps those three only if it scrapes the exporter
with honorLabels: true (otherwise they become exported_namespace, exported_pod, ...): see
docs/observability.md.

The exporter knows pods, not pools. A GPU joins its pool through the engine series of its pod
(`vllm:num_requests_running`, which the chart's PodMonitor labels with `pool`); a follower pod of a
multi-node replica serves no metrics, so it joins through its leader: LeaderWorkerSet names a
group's pods <leader>-<worker index>.
"""

from __future__ import annotations

from collections.abc import Callable

from deploy.dashboards.common import NS

GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
FB_USED = "DCGM_FI_DEV_FB_USED"
FB_FREE = "DCGM_FI_DEV_FB_FREE"
POWER = "DCGM_FI_DEV_POWER_USAGE"
METRICS = (GPU_UTIL, FB_USED, FB_FREE, POWER)

Expr = Callable[[str], str]  # selector -> expression over DCGM series


def metric(name: str) -> Expr:
    return lambda sel: f"{name}{{{sel}}}"


def memory_used_share(sel: str) -> str:
    """Framebuffer used / (used + free): the share of the memory the driver hands out."""
    return f"{FB_USED}{{{sel}}} / ({FB_USED}{{{sel}}} + {FB_FREE}{{{sel}}})"


def pooled(expr: Expr, engines: str) -> str:
    """`expr` over the release's GPUs held by the pods of the pools that `engines` (a selector of
    engine series) picks, each series labelled with its pod's `pool`."""
    serving = f"group by (namespace, pod, pool) (vllm:num_requests_running{{{engines}}})"
    own = f"{expr(NS)} * on (namespace, pod) group_left (pool) {serving}"
    follower = (f'label_replace({expr(NS)}, "leader", "$1", "pod", "(.+)-[0-9]+") '
                f"* on (namespace, leader) group_left (pool) "
                f'label_replace({serving}, "leader", "$1", "pod", "(.+)")')
    return f"({own}) or ({follower})"
