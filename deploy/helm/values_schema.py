"""Generates llmserve/values.schema.json and llmserve/templates/_rules.tpl:
`python deploy/helm/values_schema.py`.

The schema is written here, in Python, because pool keys and workerDefaults share one set of
definitions (`INFRA`) and JSON has no way to say so without $ref/allOf tricks that defeat
additionalProperties, and because every rule the chart checks that a component enforces too comes
from that component's Python: the layout rules from worker/rules.py (the planner and the worker
apply them), S3 URLs from model_store/s3url.py, API keys and priorities from gateway/flow/keys.py,
ports, the admin key's digest, the wake budget's limit and the longest stream from
gateway/settings.py, the master port from worker/settings.py. Numbers the templates need
(`_rules.tpl`) come from there too. tests/deploy/test_values_schema.py fails when either file is
stale; tests/deploy/test_rules_agree.py drives the same values through the chart and the Python.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel

# Run as a script from anywhere (the project's virtualenv: gateway/settings.py needs pydantic).
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from gateway.flow.keys import SHARED_BY_TENANT, KeyEntry
from gateway.settings import (
    WAKE_BUDGET_MAX_S,
    EdgeSettings,
    GatewaySettings,
    Timeouts,
)
from loadtest.metrics import SLO_PATTERN
from loadtest.workloads import WORKLOADS
from model_store import adapter, s3url
from worker import rules
from worker.settings import WorkerSettings

SCHEMA_PATH = Path(__file__).resolve().parent / "llmserve" / "values.schema.json"
RULES_PATH = Path(__file__).resolve().parent / "llmserve" / "templates" / "_rules.tpl"
# llmserve_ttft_seconds's bucket bounds, as gateway/metrics.py has them (this script runs without
# the gateway on its path; tests/deploy/test_prometheus_rules.py checks the two agree).
TTFT_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0,
    7.5, 10.0, 20.0, 30.0, 60.0,
)


def _plain(schema: Any) -> Any:
    """Pydantic's JSON schema without what only documents it (titles, defaults)."""
    if isinstance(schema, dict):
        return {k: _plain(v) for k, v in schema.items() if k not in ("title", "default")}
    if isinstance(schema, list):
        return [_plain(v) for v in schema]
    return schema


def field(model: Any, name: str, **kw: Any) -> dict[str, Any]:
    """Field `name` of pydantic `model` as its JSON schema; an optional field's non-null branch
    (the chart always renders a value)."""
    schema: dict[str, Any] = _plain(model.model_json_schema()["properties"][name])
    schema.pop("description", None)
    branches = [b for b in schema.pop("anyOf", []) if b != {"type": "null"}]
    if branches:
        (schema_branch,) = branches
        schema.update(schema_branch)
    return {**schema, **kw}


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
# The gateway's keys-file entry, rules and all; only the digest of a key ever enters the values
# (and the cluster).
api_key = _plain(KeyEntry.model_json_schema())
api_key.pop("description", None)
PORT = field(GatewaySettings, "port")
# A model's source, and an adapter's (a prefix under the bucket), as model_store parses them.
S3_URL = s(pattern=s3url.URL)
S3_URL_UNDER = s(pattern=s3url.URL_UNDER)
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
# A pod's metadata and scheduling, alike for the gateway's pods and every pool's workers.
POD_PLACEMENT: dict[str, Any] = {
    "podAnnotations": STRMAP,
    "podLabels": STRMAP,
    "nodeSelector": STRMAP,
    "tolerations": LIST,
    "affinity": MAP,
    "topologySpreadConstraints": LIST,
    "priorityClassName": s(),
}
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
            # The gateway's pools[].wake_budget_s (0 < budget <= its limit).
            "wakeBudgetSeconds": {"type": ["integer", "null"], "minimum": 1,
                                  "maximum": WAKE_BUDGET_MAX_S},
        },
        required=["enabled"],
        description="worker autoscaling on the gateway's demand signal: KEDA or an HPA",
    ),
    "env": worker_env,
    "podDisruptionBudget": pdb,
    **POD_PLACEMENT,
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
        "s3": S3_URL,
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
        "masterPort": field(WorkerSettings, "master_port"),
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
                    "s3": S3_URL_UNDER,
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
def override(schema: Any) -> Any:
    """A pool's copy of a workerDefaults key: merged over the default key by key
    (templates/_pools.tpl), so no key of its objects is required; the merge holds the required
    ones, which workerDefaults must give. Arrays replace the default whole: left as they are."""
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return schema
    out = {k: v for k, v in schema.items() if k != "required"}
    if "properties" in out:
        out["properties"] = {k: override(v) for k, v in out["properties"].items()}
    return out


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
    "runner": s(enum=list(rules.RUNNERS)),
    "convert": s(enum=list(rules.CONVERTS)),
    # Off with a pooling runner (runner_rules below): a pooling engine serves no /v1/responses.
    "responsesStore": B,
    "maxModelLen": {"type": ["integer", "null"], "minimum": 1},
    "gpuMemoryUtilization": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
    "cpuKvcacheSpaceGib": i(1),
    "extraArgs": {"type": "array", "items": {"type": "string"}},
    # vLLM's sleep mode (CUDA and ROCm only; the chart refuses it with device=cpu).
    "sleepMode": B,
    "lora": lora,
    **{key: override(value) for key, value in INFRA.items()},
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


def _is(key: str, value: str) -> dict[str, Any]:
    """`key` is `value`; for "auto", vLLM's and the chart's default, also when unset."""
    given = {"properties": {key: {"const": value}}, "required": [key]}
    return {"anyOf": [{"not": {"required": [key]}}, given]} if value == "auto" else given


def runner_rules() -> list[dict[str, Any]]:
    """worker/rules.py's runner rule for every (runner, convert) pair: a pair with a problem is
    refused, and a pooling pair takes no responsesStore."""
    out: list[dict[str, Any]] = []
    for runner in rules.RUNNERS:
        for convert in rules.CONVERTS:
            pair = {"allOf": [_is("runner", runner), _is("convert", convert)]}
            if rules.runner_problem(runner, convert) is not None:
                out.append({"not": pair})
            elif rules.is_pooling(runner, convert):
                out.append({"if": pair,
                            "then": {"properties": {"responsesStore": {"const": False}}}})
    return out


model["allOf"] = [
    # Half precision gives wrong answers on the CPU (see worker/settings.py).
    {
        "if": {"properties": {"device": {"const": "cpu"}}, "required": ["device"]},
        "then": {"properties": {"dtype": {"enum": list(rules.CPU_DTYPES)}}},
    },
    # PP runs inside one pod without multiNode; across a group of nodes, each node runs whole
    # pipeline stages.
    *(group_rule(n) for n in range(2, rules.MAX_GROUP_NODES + 1)),
    *runner_rules(),
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
        # The gateway's timeouts.total_s, which its first_byte_s may not exceed.
        "maxStreamSeconds": i(math.ceil(Timeouts().first_byte_s),
                              description="longest stream: the gateway ends a request at this, "
                              "and a drain waits this long"),
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
                "port": PORT,
                "probePort": field(EdgeSettings, "probe_port"),
                "discovery": s(enum=["kubernetes", "dns", "static"]),
                # gateway: llmserve's own OpenAI gateway; epp: the endpoint picker of a Gateway
                # API gateway (gatewayAPI below, docs/gateway-api.md).
                "mode": s(enum=["gateway", "epp"]),
                "eppPort": i(1, maximum=65535),
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
                        # Empty: none. A key itself (in the Secret) is at least
                        # ADMIN_KEY_MIN characters, which the gateway checks at start.
                        "sha256": s(pattern="^(" + field(GatewaySettings, "admin_key_sha256")[
                            "pattern"].strip("^$") + ")?$"),
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
                **POD_PLACEMENT,
            },
            allOf=[
                {
                    "if": {"properties": {"discovery": {"const": "static"}}},
                    "then": {"properties": {"backends": {"minItems": 1}}, "required": ["backends"]},
                },
            ],
        ),
        "models": {"type": "array", "items": model},
        # port null: the worker's default (worker/rules.py ENGINE_PORT, through _rules.tpl).
        "workerDefaults": obj({
            "port": {**field(WorkerSettings, "port"), "type": ["integer", "null"]},
            # vLLM's KV cache events on this port, their replay on the next (kv_aware routing).
            "kvEventsPort": {**field(WorkerSettings, "kv_events_port"),
                             "type": ["integer", "null"]},
            **INFRA,
        }),
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
        "networkPolicy": obj({"enabled": B, "metricsFrom": LIST, "gatewayFrom": LIST,
                              "workerFrom": LIST}),
        # Gateway API Inference Extension objects (templates/gatewayapi/, docs/gateway-api.md).
        "gatewayAPI": obj(
            {
                "inferencePools": obj({"enabled": B,
                                       "failureMode": s(enum=["FailOpen", "FailClose"])}),
                "httpRoute": obj({"enabled": B, "parentRefs": LIST,
                                  "hostnames": {"type": "array", "items": s(minLength=1)},
                                  "modelHeader": s(minLength=1)}),
            }
        ),
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
                # The tool's own workloads and SLO keys (loadtest/), a bound in positive ms.
                "workload": s(enum=list(WORKLOADS)),
                "slos": {"type": "array", "items": s(pattern=SLO_PATTERN)},
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


def env_names(model: Any, prefix: str) -> list[str]:
    """Every environment variable a settings class reads: each field, and each field of a nested
    group (the group's own name takes it whole, as JSON)."""
    out: list[str] = []
    for name, info in model.model_fields.items():
        out.append(f"{prefix}{name.upper()}")
        kind = info.annotation
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            out += env_names(kind, f"{prefix}{name.upper()}__")
    return out


# Numbers the templates use, from the Python that enforces them.
TEMPLATE_RULES = {
    "llmserve.wakeBudgetMax": WAKE_BUDGET_MAX_S,
    "llmserve.default.masterPort": WorkerSettings.model_fields["master_port"].default,
    "llmserve.default.workerPort": WorkerSettings.model_fields["port"].default,
    # What a tenant's keys must agree on, and the one default among them.
    "llmserve.keys.shared": " ".join(SHARED_BY_TENANT),
    "llmserve.keys.defaultWeight": KeyEntry.model_fields["weight"].default,
    # What gateway.env may name: the gateway ignores an unknown GATEWAY_* variable.
    "llmserve.gateway.settings": " ".join(env_names(GatewaySettings, "GATEWAY_")),
}


def render_rules() -> str:
    head = ("{{/* Generated by deploy/helm/values_schema.py from the Python that enforces these "
            "rules: do not edit. */}}")
    lines = [head]
    for name, value in TEMPLATE_RULES.items():
        lines.append(f'{{{{- define "{name}" -}}}}{value}{{{{- end -}}}}')
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    SCHEMA_PATH.write_text(render(), encoding="utf-8")
    RULES_PATH.write_text(render_rules(), encoding="utf-8")
    sys.exit(0)
