"""Fixtures for the chart tests: the loaded chart, and renders of every preset and of a values
matrix that turns on every optional part at least once. Renders are cached per session: the
invariant tests read the same releases many times.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import helm_python
import pytest

from gateway.flow.keys import KeyFileError, load_keys
from tests.deploy.manifests import CHART, PRESETS, Release, load_values, render

S3 = {"s3": "s3://models/demo-model/main"}
# A key whose digest one matrix case puts in the chart's API-keys Secret.
DEMO_API_KEY = "sk-llmserve-chart-test"


def gateway_loads_keys(keys: list[dict[str, Any]], path: Path) -> bool:
    """Whether the gateway loads `keys` as its API keys file (written to `path`) or refuses it."""
    path.write_text(json.dumps({"keys": keys}), encoding="utf-8")
    try:
        load_keys(path)
    except KeyFileError:
        return False
    return True


def pool_values(name: str = "p", **extra: Any) -> dict[str, Any]:
    """One entry of the chart's `models`: the demo model from S3, with `extra` keys."""
    return {"name": name, "model": "demo-model", "revision": "main", "source": S3, **extra}


# Each case: values on top of the chart defaults. Together they switch on every template branch.
MATRIX: dict[str, dict[str, Any]] = {
    "defaults": {},
    "gpu-tp2-dp3": {"models": [pool_values("tp2", tensorParallelSize=2, replicas=3)]},
    "gpu-pp4-over-2-nodes": {
        "models": [
            pool_values("pp4", tensorParallelSize=2, pipelineParallelSize=4, multiNode={"nodes": 2})
        ]
    },
    # Pipeline parallel inside one pod (one node): no multiNode, TP x PP GPUs in the pod.
    "gpu-pp2-in-one-pod-dp2": {
        "models": [pool_values("pp2", tensorParallelSize=2, pipelineParallelSize=2, replicas=2)]
    },
    "gpu-pp3-over-3-nodes-dp2": {
        "models": [
            pool_values(
                "pp3",
                tensorParallelSize=4,
                pipelineParallelSize=3,
                multiNode={"nodes": 3, "masterPort": 30000, "distinctNodes": False},
                replicas=2,
            )
        ]
    },
    "cpu-single-and-pp2": {
        "models": [
            pool_values("cpu1", device="cpu", source={"bootstrapDemo": True}, model="SmolLM2"),
            pool_values(
                "cpu-pp",
                device="cpu",
                source={"bootstrapDemo": True},
                model="SmolLM2",
                pipelineParallelSize=2,
                multiNode={"nodes": 2},
                servedModelName="smol-pp",
                cpuKvcacheSpaceGib=2,
            ),
        ]
    },
    "three-pools-shared-and-preloaded": {
        "models": [
            pool_values("a", tensorParallelSize=4, extraArgs=["--enforce-eager", "--seed", "7"]),
            pool_values("b", tensorParallelSize=2, servedModelName="demo-b", maxModelLen=4096),
            pool_values("c", model="other", revision="v2", source={"preloaded": True}),
        ]
    },
    "dns-discovery-api-keys-ingress-hpa": {
        "gateway": {
            "discovery": "dns",
            "apiKeys": {
                "enabled": True,
                "keys": [
                    {"tenant": "acme", "sha256": "a" * 64, "rpm": 600, "max_priority": "high"},
                    {
                        "tenant": "beta",
                        # Upper case on purpose: the chart must hand the gateway lower case.
                        "sha256": hashlib.sha256(DEMO_API_KEY.encode()).hexdigest().upper(),
                        "tpm": 200000,
                        "weight": 0.5,
                    },
                ],
            },
            "ingress": {
                "enabled": True,
                "className": "nginx",
                "tls": [{"hosts": ["llm.example"], "secretName": "tls"}],
            },
            "autoscaling": {"enabled": True, "minReplicas": 2, "maxReplicas": 6},
            "env": {"GATEWAY_RETRIES": "2", "GATEWAY_TIMEOUTS__FIRST_BYTE_S": 300},
        },
        "models": [pool_values("tp1")],
    },
    "static-discovery-existing-key-secret": {
        "gateway": {
            "discovery": "static",
            "backends": ["http://10.0.0.7:8000", "http://10.0.0.8:8000"],
            "apiKeys": {"enabled": True, "existingSecret": "my-keys", "secretKey": "keys.json"},
            "serviceAccount": {"create": False},
            "podDisruptionBudget": {"enabled": False},
        },
    },
    # Day-two options: every newer pool field on, so schema validation and checkov see them.
    "day-two-options": {
        "maxStreamSeconds": 900,
        "models": [
            pool_values(
                "pp2",
                pipelineParallelSize=2,
                multiNode={"nodes": 2},
                autoscaling={"enabled": True, "engine": "hpa", "minReplicas": 1,
                             "maxReplicas": 3},
                runtimeClassName="nvidia",
                extraVolumes=[{"name": "ca", "configMap": {"name": "ca-bundle"}}],
                extraVolumeMounts=[{"name": "ca", "mountPath": "/etc/ca", "readOnly": True}],
            ),
            pool_values(
                "tp1",
                servedModelName="demo-tp",  # one autoscaled pool per served model
                rollout={"maxSurge": 0, "maxUnavailable": 1},
                autoscaling={"enabled": True, "engine": "hpa", "maxReplicas": 4,
                             "targetDemandPerReplica": 2},
                podSecurityContext={"runAsUser": 20001},
            ),
        ],
        "gateway": {"runtimeClassName": "gvisor", "ingress": {"enabled": True}},
    },
    # KEDA on the gateway's demand signal: a Deployment pool and a LeaderWorkerSet pool, both
    # parked at zero when idle; the GPU one may sleep instead (sleepMode).
    "keda-scale-to-zero": {
        "workerDefaults": {"autoscaling": {
            "prometheusAddress": "http://prometheus-operated.monitoring.svc:9090"}},
        "models": [
            pool_values("tp1", servedModelName="m-tp", sleepMode=True,
                  autoscaling={"enabled": True, "minReplicas": 0, "maxReplicas": 3,
                               "wakeBudgetSeconds": 900}),
            pool_values("pp2", servedModelName="m-pp", pipelineParallelSize=2, multiNode={"nodes": 2},
                  startupProbe={"periodSeconds": 10, "failureThreshold": 60},
                  autoscaling={"enabled": True, "minReplicas": 0, "maxReplicas": 2,
                               "cooldownSeconds": 900, "targetDemandPerReplica": 8}),
        ],
        "metrics": {"serviceMonitor": {"enabled": True}},
    },
    # The in-cluster comparison Job, with a restricted gateway ingress it must be let through.
    "compare-job": {
        "models": [pool_values("tp1", servedModelName="m-tp"),
                   pool_values("pp2", servedModelName="m-pp", pipelineParallelSize=2,
                         multiNode={"nodes": 2})],
        "compare": {"enabled": True, "targets": ["tp=m-tp", "pp=m-pp"], "users": "1,4",
                    "slos": ["ttft_ms=800"], "apiKeySecret": {"name": "keys", "key": "compare"},
                    "output": {"existingClaim": "reports"}},
        "networkPolicy": {"gatewayFrom": [{"namespaceSelector": {
            "matchLabels": {"kubernetes.io/metadata.name": "apps"}}}]},
    },
    # LoRA adapters (templates/_adapters.tpl): declared and fetched for one pool, runtime-only
    # on another pool of the same model, and the admin API by the key's digest.
    "lora-adapters": {
        "gateway": {"adminKey": {"sha256": "B" * 64}},
        "models": [
            pool_values("smol", device="cpu", model="SmolLM2", source={"bootstrapDemo": True},
                  lora={"adapters": [{"name": "sql", "s3": "s3://models/adapters/sql/v1"},
                                     {"name": "chat", "s3": "s3://models/adapters/chat/v3",
                                      "revision": "r3"}]}),
            pool_values("smol-rt", device="cpu", model="SmolLM2", source={"bootstrapDemo": True},
                  lora={"enabled": True, "maxLoraRank": 32, "runtimeUpdates": True}),
            pool_values("tp2", tensorParallelSize=2,
                  lora={"adapters": [{"name": "sql-70b", "s3": "s3://models/adapters/sql/v1"}],
                        "maxLoras": 4}),
        ],
    },
    # The Gateway API Inference Extension: the gateway as the endpoint picker of two pools'
    # InferencePools, an HTTPRoute to them, and the data plane let through to the workers.
    "gateway-api-epp": {
        "gateway": {"mode": "epp"},
        "gatewayAPI": {
            "inferencePools": {"enabled": True, "failureMode": "FailOpen"},
            "httpRoute": {"enabled": True, "hostnames": ["llm.example"], "parentRefs": [
                {"name": "inference-gateway", "namespace": "gateways"}]},
        },
        "networkPolicy": {"workerFrom": [{"namespaceSelector": {
            "matchLabels": {"kubernetes.io/metadata.name": "gateways"}}}]},
        "models": [pool_values("tp1", servedModelName="m-tp"),
                   pool_values("pp2", servedModelName="m-pp", pipelineParallelSize=2,
                         multiNode={"nodes": 2})],
    },
    # A pooling pool beside a generating pool of the same model (worker/rules.py: runner rule),
    # the generating one keeping Responses API results.
    "pooling-and-responses-store": {
        "models": [
            pool_values("smol", device="cpu", model="SmolLM2", source={"bootstrapDemo": True},
                  responsesStore=True),
            pool_values("smol-embed", device="cpu", model="SmolLM2", source={"bootstrapDemo": True},
                  servedModelName="SmolLM2-embed", runner="pooling", convert="embed"),
            pool_values("classify", convert="classify", servedModelName="demo-classify"),
        ],
    },
    "minio-with-its-credentials": {
        "minio": {"enabled": True},
        "models": [pool_values("tp1", tensorParallelSize=1)],
    },
    "s3-credentials-from-values-existing-claim": {
        "modelStorage": {
            "existingClaim": "shared-models",
            "s3": {
                "endpointUrl": "https://s3.internal:9000",
                "accessKeyId": "AKIAEXAMPLE",
                "secretAccessKey": "not-a-real-secret",
            },
            "modelFetch": {
                "serviceAccount": {
                    "annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/r"}
                }
            },
        },
        "models": [pool_values("tp1")],
    },
    "pinned-images-pull-secrets-overrides": {
        "image": {
            "registry": "registry.internal:5000",
            "pullPolicy": "Always",
            "workerGpu": {"repository": "llmserve/worker-gpu", "digest": "sha256:" + "0" * 64},
        },
        "imagePullSecrets": [{"name": "regcred"}],
        "workerDefaults": {
            "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
            "affinity": {
                "podAntiAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "weight": 1,
                            "podAffinityTerm": {
                                "topologyKey": "kubernetes.io/hostname",
                                "labelSelector": {
                                    "matchLabels": {"app.kubernetes.io/component": "worker"}
                                },
                            },
                        }
                    ]
                }
            },
            "env": [{"name": "NCCL_DEBUG", "value": "WARN"}],
            "priorityClassName": "inference",
        },
        "models": [
            pool_values(
                "tp8",
                tensorParallelSize=8,
                podDisruptionBudget={"enabled": False},
                terminationGracePeriodSeconds=420,
                drainTimeoutSeconds=400,
                gpuResourceName="amd.com/gpu",
            ),
            pool_values("custom", image={"repository": "me/custom-worker", "tag": "dev"}),
        ],
        "metrics": {
            "labels": {"release": "kube-prometheus-stack"},
            "serviceMonitor": {"enabled": True},
            "podMonitor": {"enabled": True},
            "prometheusRule": {"enabled": True},
            "grafanaDashboard": {"enabled": True, "namespace": "monitoring"},
        },
    },
}

PRESET_CASES = {p.name: load_values(p) for p in PRESETS}
ALL_CASES = {**{f"preset:{k}": v for k, v in PRESET_CASES.items()}, **MATRIX}


@pytest.fixture(scope="session")
def loaded_chart() -> Iterator[helm_python.Chart]:
    with helm_python.Chart.load(CHART) as c:
        yield c


RenderCase = Callable[[str], Release]


@pytest.fixture(scope="session")
def render_case(loaded_chart: helm_python.Chart) -> RenderCase:
    cache: dict[str, Release] = {}

    def get(case: str) -> Release:
        if case not in cache:
            cache[case] = render(ALL_CASES[case], loaded=loaded_chart)
        return cache[case]

    return get


@pytest.fixture(params=sorted(ALL_CASES))
def release(request: pytest.FixtureRequest, render_case: RenderCase) -> Release:
    """Every preset and every matrix case, rendered."""
    return render_case(request.param)


@pytest.fixture(params=sorted(PRESET_CASES))
def preset(request: pytest.FixtureRequest, render_case: RenderCase) -> Release:
    return render_case(f"preset:{request.param}")
