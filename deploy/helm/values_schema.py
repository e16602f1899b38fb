"""Generates llmserve/values.schema.json: `python deploy/helm/values_schema.py`.

The schema is written here, in Python, because pool keys and workerDefaults share one set of
definitions (`INFRA`) and JSON has no way to say so without $ref/allOf tricks that defeat
additionalProperties, and because the layout rules come from worker/rules.py, the module the
planner and the worker apply too. tests/deploy/test_values_schema.py fails when the JSON file is
stale.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

# worker/rules.py and model_store/adapter.py are standard-library only: importable without the
# packages' dependencies.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from model_store import adapter
from worker import rules

SCHEMA_PATH = Path(__file__).resolve().parent / "llmserve" / "values.schema.json"
# llmserve_ttft_seconds's bucket bounds, as gateway/metrics.py has them (this script runs without
# the gateway on its path; tests/deploy/test_prometheus_rules.py checks the two agree).
TTFT_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0,
    7.5, 10.0, 20.0, 30.0, 60.0,
)


def obj(
    props: dict[str, Any],
    required: tuple[str, ...] | list[str] = (),
    extra: bool = False,
    **kw: Any,
) -> dict[str, Any]:
    d: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": extra}
    if required:
        d["required"] = list(required)
    d.update(kw)
    return d


def s(**kw: Any) -> dict[str, Any]:
    return {"type": "string", **kw}


def i(minimum: int | None = None, **kw: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"type": "integer", **kw}
    if minimum is not None:
        d["minimum"] = minimum
    return d


B = {"type": "boolean"}
MAP = {"type": "object"}
STRMAP = {"type": "object", "additionalProperties": {"type": "string"}}
LIST = {"type": "array"}
QTY = {
    "anyOf": [
        {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?(m|k|Ki|Mi|Gi|Ti|Pi|M|G|T|P)?$"},
        {"type": "number", "minimum": 0},
    ]
}
DURATION = s(pattern=r"^([0-9]+(ms|s|m|h|d|w|y))+$")
PRIORITY = s(enum=["high", "normal", "low"])
api_key = obj(
    {
        "tenant": s(minLength=1, maxLength=64, pattern=r"^[A-Za-z0-9_.:-]+$"),
        # Only the digest of a key ever enters the values (and the cluster).
        "sha256": s(pattern="^[A-Fa-f0-9]{64}$"),
        "rpm": {"type": "number", "exclusiveMinimum": 0},
        "tpm": {"type": "number", "exclusiveMinimum": 0},
        "priority": PRIORITY,
        "max_priority": PRIORITY,
        "weight": {"type": "number", "exclusiveMinimum": 0, "maximum": 1000},
    },
    required=["tenant", "sha256"],
)
image = obj(
    {"repository": s(minLength=1), "tag": s(), "digest": s(pattern=r"^(sha256:[a-f0-9]{64})?$")},
    required=["repository"],
)
image_opt = obj({"repository": s(), "tag": s(), "digest": s(pattern=r"^(sha256:[a-f0-9]{64})?$")})
resources = obj(
    {
        "requests": {"type": "object", "additionalProperties": QTY},
        "limits": {"type": "object", "additionalProperties": QTY},
        "claims": LIST,
    }
)
pdb = obj(
    {"enabled": B, "maxUnavailable": {"anyOf": [i(0), s(pattern=r"^[0-9]+%$")]}},
    required=["enabled"],
)
env_list = {
    "type": "array",
    "items": {"type": "object", "required": ["name"], "properties": {"name": s(minLength=1)}},
}
# Workers get settings from the pool, and never storage credentials.
worker_env = {
    "type": "array",
    "items": {
        "type": "object",
        "required": ["name"],
        "properties": {
            "name": {
                "type": "string",
                "minLength": 1,
                "not": {"pattern": "^(WORKER_|AWS_|MODEL_STORE_)"},
            }
        },
    },
}
seconds = i(0)
# Keys a pool shares with workerDefaults (placement, resources, lifecycle).
INFRA: dict[str, Any] = {
    "image": image_opt,
    "gpuResourceName": s(minLength=1),
    "resources": resources,
    "shmSize": QTY,
    "cacheSize": QTY,
    "startupProbe": obj(
        {"periodSeconds": i(1), "failureThreshold": i(1)},
        required=["periodSeconds", "failureThreshold"],
    ),
    # null: follow the release's maxStreamSeconds, so a drain never cuts a stream that may run.
    "drainTimeoutSeconds": {"type": ["integer", "null"], "minimum": 0},
    "preStopSleepSeconds": seconds,
    "terminationGracePeriodSeconds": {"type": ["integer", "null"], "minimum": 0},
    "terminationMarginSeconds": seconds,
    # Surge needs spare GPUs (tp x pp per replica); maxSurge 0 rolls in place.
    "rollout": obj(
        {"maxSurge": i(0), "maxUnavailable": i(0)},
        required=["maxSurge", "maxUnavailable"],
        description="rolling update of the pool's Deployment or LeaderWorkerSet",
    ),
    "runtimeClassName": s(),
    "extraVolumes": {"type": "array", "items": obj({"name": s(minLength=1)}, ["name"], True)},
    "extraVolumeMounts": {
        "type": "array",
        "items": obj({"name": s(minLength=1), "mountPath": s(pattern="^/")},
                     ["name", "mountPath"], True),
    },
    # Per-pool overrides of the chart-wide podSecurityContext / containerSecurityContext.
    "podSecurityContext": MAP,
    "containerSecurityContext": MAP,
    # On the gateway's llmserve_pool_demand (templates/workers/autoscaling.yaml); the chart
    # checks what the schema cannot say (cooldown against the start-up probe, min <= max).
    "autoscaling": obj(
        {
            "enabled": B,
            "engine": s(enum=["keda", "hpa"]),
            # 0: parked at zero when idle (keda only); requests wait in the gateway.
            "minReplicas": i(0),
            "maxReplicas": i(1),
            "targetDemandPerReplica": {"type": "number", "exclusiveMinimum": 0},
            "prometheusAddress": s(pattern=r"^(https?://.+)?$"),
            "query": s(),
            "pollingIntervalSeconds": i(1),
            "cooldownSeconds": {"type": ["integer", "null"], "minimum": 0},
            "scaleDownStabilizationSeconds": i(0, maximum=3600),
            # The gateway's pools[].wake_budget_s (0 < budget <= 3600).
            "wakeBudgetSeconds": {"type": ["integer", "null"], "minimum": 1, "maximum": 3600},
        },
        required=["enabled"],
        description="worker autoscaling on the gateway's demand signal: KEDA or an HPA",
    ),
    "env": worker_env,
    "podDisruptionBudget": pdb,
    "podAnnotations": STRMAP,
    "podLabels": STRMAP,
    "nodeSelector": STRMAP,
    "tolerations": LIST,
    "affinity": MAP,
    "topologySpreadConstraints": LIST,
    "priorityClassName": s(),
}
NAME = s(
    pattern=rules.POOL_NAME_PATTERN,
    description=f"pool name: a DNS label of at most {rules.POOL_NAME_MAX} characters",
)
PATHPART = s(pattern=rules.PATH_PART_PATTERN, description="one path component (no '/', no '..')")
source = {
    "type": "object",
    "additionalProperties": False,
    "minProperties": 1,
    "maxProperties": 1,
    "description": "exactly one of s3, bootstrapDemo, preloaded",
    "properties": {
        "s3": s(pattern=r"^s3://[a-z0-9][a-z0-9.-]{1,62}(/.*)?$"),
        "bootstrapDemo": {"const": True},
        "preloaded": {"const": True},
    },
}
multinode = obj(
    {
        "nodes": i(
            2,
            maximum=rules.MAX_GROUP_NODES,
            description="pods per group, one per node; pipelineParallelSize must be a multiple "
            "of it",
        ),
        "masterPort": i(1, maximum=65535),
        "restartPolicy": s(
            enum=["RecreateGroupOnPodRestart", "None", "Default", "RecreateGroupAfterStart"]
        ),
        # LeaderReady is refused: the leader turns ready only once its followers have joined the
        # pipeline, and LeaderReady creates the followers only after the leader is ready, so the
        # group never starts.
        "startupPolicy": s(
            enum=["LeaderCreated"],
            description="LeaderCreated only: LeaderReady deadlocks a vLLM pipeline group",
        ),
        # Required anti-affinity between the pods of one group, per node: PP across nodes.
        "distinctNodes": B,
    },
    required=["nodes"],
)
# A pool's LoRA adapters (templates/_adapters.tpl); names as the worker and the admin API take
# them, ranks as vLLM does.
lora = obj(
    {
        "enabled": B,
        "adapters": {
            "type": "array",
            "items": obj(
                {
                    "name": s(pattern=adapter.ADAPTER_NAME,
                              description="what clients send as `model`"),
                    "s3": s(pattern=r"^s3://[a-z0-9][a-z0-9.-]{1,62}/.+$"),
                    "revision": PATHPART,
                },
                required=["name", "s3"],
            ),
        },
        "maxLoras": {"type": ["integer", "null"], "minimum": 1},
        "maxLoraRank": {"anyOf": [{"type": "null"}, {"enum": list(rules.LORA_RANKS)}]},
        "runtimeUpdates": B,
    },
    description="LoRA adapters loaded by every replica of the pool (docs/lora.md)",
)
model_props = {
    "name": NAME,
    "model": PATHPART,
    "revision": PATHPART,
    "servedModelName": s(minLength=1),
    "source": source,
    "device": s(enum=["gpu", "cpu"]),
    "tensorParallelSize": i(1),
    "pipelineParallelSize": i(1),
    "multiNode": multinode,
    "replicas": i(0),
    "dtype": s(enum=list(rules.DTYPES)),
    "maxModelLen": {"type": ["integer", "null"], "minimum": 1},
    "gpuMemoryUtilization": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
    "cpuKvcacheSpaceGib": i(1),
    "extraArgs": {"type": "array", "items": {"type": "string"}},
    # vLLM's sleep mode (CUDA and ROCm only; the chart refuses it with device=cpu).
    "sleepMode": B,
    "lora": lora,
    **INFRA,
}
model = obj(model_props, required=["name", "model", "source"])


def group_rule(nodes: int) -> dict[str, Any]:
    """A group of `nodes` pods takes a pipelineParallelSize that is a multiple of
    rules.pp_multiple(nodes); JSON schema cannot divide one value by another, so one clause per
    group size."""
    return {
        "if": {
            "properties": {"multiNode": {"properties": {"nodes": {"const": nodes}},
                                         "required": ["nodes"]}},
            "required": ["multiNode"],
        },
        "then": {
            "properties": {"pipelineParallelSize": {"multipleOf": rules.pp_multiple(nodes)}},
            "required": ["pipelineParallelSize"],
        },
    }


model["allOf"] = [
    # Half precision gives wrong answers on the CPU (see worker/settings.py).
    {
        "if": {"properties": {"device": {"const": "cpu"}}, "required": ["device"]},
        "then": {"properties": {"dtype": {"enum": list(rules.CPU_DTYPES)}}},
    },
    # PP runs inside one pod without multiNode; across a group of nodes, each node runs whole
    # pipeline stages.
    *(group_rule(n) for n in range(2, rules.MAX_GROUP_NODES + 1)),
]
secctx = MAP
SCHEMA: dict[str, Any] = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "llmserve chart values",
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "global": MAP,
        "nameOverride": s(),
        "fullnameOverride": s(maxLength=32),
        "clusterDomain": s(minLength=1),
        "maxStreamSeconds": i(1, description="longest stream a drain waits for"),
        "image": obj(
            {
                # Empty: the templates fail with a message naming the value (no default exists).
                "registry": s(
                    pattern=r"^([A-Za-z0-9.-]+(:[0-9]+)?(/[a-z0-9._-]+)*/?)?$",
                    description="host[:port][/path] holding the llmserve images, no scheme",
                ),
                "pullPolicy": s(enum=["Always", "IfNotPresent", "Never"]),
                "platform": image,
                "workerGpu": image,
                "workerCpu": image,
                "loadtest": image,
            },
            required=["platform", "workerGpu", "workerCpu"],
        ),
        "imagePullSecrets": {
            "type": "array",
            "items": obj({"name": s(minLength=1)}, required=["name"]),
        },
        "podSecurityContext": secctx,
        "containerSecurityContext": secctx,
        "gateway": obj(
            {
                "replicas": i(1),
                "port": i(1, maximum=65535),
                "probePort": i(1, maximum=65535),
                "discovery": s(enum=["kubernetes", "dns", "static"]),
                "backends": {"type": "array", "items": s(pattern="^https?://.+")},
                "drainTimeoutSeconds": {"type": ["integer", "null"], "minimum": 0},
                "preStopSleepSeconds": seconds,
                "terminationGracePeriodSeconds": {"type": ["integer", "null"], "minimum": 0},
                "terminationMarginSeconds": seconds,
                "runtimeClassName": s(),
                "env": {
                    "type": "object",
                    "propertyNames": {"pattern": "^GATEWAY_[A-Z0-9_]+$"},
                    "additionalProperties": {"type": ["string", "number", "boolean"]},
                },
                "adminKey": obj(
                    {
                        "existingSecret": s(),
                        "secretKey": s(pattern=r"^[-._a-zA-Z0-9]+$"),
                        "sha256": s(pattern="^([A-Fa-f0-9]{64})?$"),
                    }
                ),
                "apiKeys": obj(
                    {
                        "enabled": B,
                        # The gateway's keys-file entries (gateway/flow/keys.py), verbatim.
                        "keys": {"type": "array", "items": api_key},
                        "existingSecret": s(),
                        "secretKey": s(pattern=r"^[-._a-zA-Z0-9]+$"),
                        "sharedLimits": obj(
                            {
                                "redisUrl": s(pattern=r"^((redis|rediss|unix)://.+)?$"),
                                "existingSecret": s(),
                                "secretKey": s(pattern=r"^[-._a-zA-Z0-9]+$"),
                                "fail": s(enum=["open", "closed"]),
                            }
                        ),
                    }
                ),
                "resources": resources,
                "service": obj(
                    {
                        "type": s(enum=["ClusterIP", "NodePort", "LoadBalancer"]),
                        "port": i(1, maximum=65535),
                        "annotations": STRMAP,
                    }
                ),
                "ingress": obj(
                    {
                        "enabled": B,
                        "className": s(),
                        "annotations": STRMAP,
                        "hosts": {
                            "type": "array",
                            "items": obj(
                                {
                                    "host": s(),
                                    "paths": {
                                        "type": "array",
                                        "items": obj(
                                            {
                                                "path": s(pattern="^/"),
                                                "pathType": s(
                                                    enum=[
                                                        "Prefix",
                                                        "Exact",
                                                        "ImplementationSpecific",
                                                    ]
                                                ),
                                            },
                                            required=["path", "pathType"],
                                        ),
                                    },
                                },
                                required=["host", "paths"],
                            ),
                        },
                        "tls": LIST,
                        # /metrics and the probes answer on the gateway's port; a path rule that
                        # would route them from outside is refused unless this is true.
                        "exposeMetrics": B,
                    }
                ),
                "autoscaling": obj(
                    {
                        "enabled": B,
                        "minReplicas": i(1),
                        "maxReplicas": i(1),
                        "targetCPUUtilizationPercentage": i(1, maximum=100),
                    }
                ),
                "podDisruptionBudget": pdb,
                "serviceAccount": obj({"create": B, "name": s(), "annotations": STRMAP}),
                "podAnnotations": STRMAP,
                "podLabels": STRMAP,
                "nodeSelector": STRMAP,
                "tolerations": LIST,
                "affinity": MAP,
                "topologySpreadConstraints": LIST,
                "priorityClassName": s(),
            },
            allOf=[
                {
                    "if": {"properties": {"discovery": {"const": "static"}}},
                    "then": {"properties": {"backends": {"minItems": 1}}, "required": ["backends"]},
                },
            ],
        ),
        "models": {"type": "array", "items": model},
        "workerDefaults": obj({"port": i(1, maximum=65535), **INFRA}, required=["port"]),
        "modelStorage": obj(
            {
                "existingClaim": s(),
                "storageClass": s(),
                "accessMode": s(enum=["ReadWriteMany", "ReadWriteOnce"]),
                "size": QTY,
                "keepOnUninstall": B,
                "mountPath": s(pattern="^/[^:]*$"),
                "s3": obj(
                    {
                        "endpointUrl": s(pattern="^(https?://.+)?$"),
                        "region": s(),
                        "existingSecret": s(),
                        "accessKeyIdKey": s(minLength=1),
                        "secretAccessKeyKey": s(minLength=1),
                        "accessKeyId": s(),
                        "secretAccessKey": s(),
                    }
                ),
                "modelFetch": obj(
                    {
                        "backoffLimit": i(0),
                        "activeDeadlineSeconds": i(1),
                        # On `helm upgrade`, fetch as a pre-upgrade hook: a new revision is on the
                        # volume before any worker restarts (give `helm upgrade` a --timeout that
                        # covers the download).
                        "beforeUpgrade": B,
                        "env": env_list,
                        "resources": resources,
                        "serviceAccount": obj({"annotations": STRMAP}),
                        "nodeSelector": STRMAP,
                        "tolerations": LIST,
                        "affinity": MAP,
                    }
                ),
            }
        ),
        "minio": obj(
            {
                "enabled": B,
                "image": image,
                "existingSecret": s(),
                "rootUser": s(),
                "rootPassword": {"type": "string", "anyOf": [{"maxLength": 0}, {"minLength": 8}]},
                "storageClass": s(),
                "size": QTY,
                "resources": resources,
                "nodeSelector": STRMAP,
                "tolerations": LIST,
                "affinity": MAP,
            }
        ),
        "networkPolicy": obj({"enabled": B, "metricsFrom": LIST, "gatewayFrom": LIST}),
        # The in-cluster comparison Job (templates/loadtest/compare-job.yaml); the flags it
        # renders are parsed again by the tool itself (tests/deploy/test_compare_job.py).
        "compare": obj(
            {
                "enabled": B,
                "targets": {"type": "array", "items": s(pattern=r"^[^=]+=.+$"),
                            "uniqueItems": True},
                "users": s(pattern=r"^([0-9]+(,[0-9]+)*)?$"),
                "rate": s(pattern=r"^([0-9.]+(,[0-9.]+)*)?$"),
                "duration": s(pattern=r"^[0-9]+(s|m|h)?$"),
                "rounds": i(1, maximum=20),
                "workload": s(enum=["chat", "long-prompt", "long-output", "shared-prefix"]),
                "slos": {"type": "array", "items": s(pattern=r"^(ttft_ms|tpot_ms|e2el_ms)=")},
                "wait": s(pattern=r"^[0-9]+(s|m|h)?$"),
                "extraArgs": {"type": "array", "items": s()},
                "apiKeySecret": obj({"name": s(), "key": s()}),
                "output": obj({"existingClaim": s()}),
                "backoffLimit": i(0),
                "activeDeadlineSeconds": i(60),
                "resources": resources,
                "nodeSelector": STRMAP,
                "tolerations": LIST,
            },
            **{"if": {"properties": {"enabled": {"const": True}}},
               "then": {"properties": {"targets": {"minItems": 2, "maxItems": 2}}}},
        ),
        "metrics": obj(
            {
                "labels": STRMAP,
                "interval": DURATION,
                "serviceMonitor": obj({"enabled": B}),
                "podMonitor": obj({"enabled": B}),
                "prometheusRule": obj(
                    {
                        "enabled": B,
                        "window": DURATION,
                        "for": DURATION,
                        # The bucket bounds of llmserve_ttft_seconds (gateway/metrics.py): the
                        # burn rate reads the bucket at the SLO's threshold.
                        "ttftSloSeconds": {"enum": list(TTFT_BUCKETS)},
                        "ttftSloObjective": {"type": "number", "exclusiveMinimum": 0,
                                             "exclusiveMaximum": 1},
                        "kvCacheUsage": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
                        "errorRate": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
                        "engineQueueDepth": i(1),
                        "gatewayQueueDepth": i(1),
                        "severity": s(enum=["info", "warning", "critical"]),
                    }
                ),
                "grafanaDashboard": obj(
                    {
                        "enabled": B,
                        "label": s(minLength=1),
                        "labelValue": s(),
                        "namespace": s(),
                        "annotations": STRMAP,
                    }
                ),
            }
        ),
    },
}


def render() -> str:
    return json.dumps(SCHEMA, indent=2) + "\n"


if __name__ == "__main__":
    SCHEMA_PATH.write_text(render(), encoding="utf-8")
    sys.exit(0)
