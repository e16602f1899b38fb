"""The chart renders through Helm's Go SDK for every preset and values case, lints clean, and
refuses bad values (values.schema.json first, then the templates' cross-field checks)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import helm_python
import pytest

from model_store.__main__ import build_parser
from tests.deploy.conftest import PRESET_CASES
from tests.deploy.manifests import (
    CHART,
    NAMESPACE,
    REPO,
    TEST_REGISTRY,
    Release,
    env_of,
    load_values,
    render,
    with_registry,
)
from worker.rules import MAX_GROUP_NODES, POOL_NAME_MAX

pytestmark = pytest.mark.helm

# Kinds that live in a namespace (everything this chart renders).
CLUSTER_SCOPED: frozenset[str] = frozenset()
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
KUBE_VERSIONS = ("v1.29.0", "v1.37.0")


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize("case", ["defaults", *sorted(PRESET_CASES)])
def test_lint_is_clean(case: str, kube_version: str) -> None:
    values = with_registry({} if case == "defaults" else PRESET_CASES[case])
    report = helm_python.lint(
        CHART, values, strict=True, namespace=NAMESPACE, kube_version=kube_version
    )
    assert report["errors"] == []
    assert report["messages"] == [], report["messages"]


def test_every_manifest_is_well_formed(release: Release) -> None:
    seen: set[tuple[str, str, str]] = set()
    for m in release.manifests:
        meta = m["metadata"]
        name = meta["name"]
        assert m.get("apiVersion") and m.get("kind"), m
        assert DNS_LABEL.match(name) and len(name) <= 63, f"{m['kind']} name {name!r}"
        if m["kind"] not in CLUSTER_SCOPED:
            expected = NAMESPACE
            if m["kind"] == "ConfigMap" and "grafana_dashboard" in meta["labels"]:
                expected = (
                    release.values.get("metrics", {}).get("grafanaDashboard", {}).get("namespace")
                    or NAMESPACE
                )
            assert meta.get("namespace") == expected, f"{m['kind']}/{name} namespace"
        key = (m["kind"], meta.get("namespace", ""), name)
        assert key not in seen, f"duplicate {key}"
        seen.add(key)
        assert meta["labels"]["app.kubernetes.io/instance"] == "llm"


def test_every_controller_selects_its_own_pods(release: Release) -> None:
    for m in release.manifests:
        if m["kind"] in ("Deployment", "StatefulSet"):
            selector = m["spec"]["selector"]["matchLabels"]
            labels = m["spec"]["template"]["metadata"]["labels"]
            assert all(labels.get(k) == v for k, v in selector.items()), m["metadata"]["name"]


def test_notes_say_how_to_call_the_gateway(preset: Release) -> None:
    notes = preset.notes
    assert "port-forward svc/llm-llmserve-gateway" in notes
    assert "/v1/chat/completions" in notes
    for pool in preset.values["models"]:
        assert f'"{pool.get("servedModelName", pool["model"])}"' in notes


def test_notes_show_ingress_host_and_api_key_header(render_case: Any) -> None:
    notes = render_case("dns-discovery-api-keys-ingress-hpa").notes
    assert "export LLMSERVE_URL=https://llmserve.local" in notes
    assert "Authorization: Bearer $LLMSERVE_API_KEY" in notes


def test_pools_of_one_model_share_one_download(render_case: Any) -> None:
    rel = render_case("preset:values-tp-vs-pp.yaml")
    job = rel.one("Job")
    dest = job["spec"]["template"]["spec"]["containers"][0]["command"][-1]
    paths = {env_of(p.container("worker"))["WORKER_MODEL_PATH"] for p in rel.worker_pods()}
    assert paths == {dest} == {"/models/Llama-3.1-70B-Instruct/main"}
    served = {env_of(p.container("worker"))["WORKER_SERVED_MODEL_NAME"] for p in rel.worker_pods()}
    assert served == {"llama-70b-tp", "llama-70b-pp"}


def test_preloaded_models_get_no_job_and_shared_ones_one(render_case: Any) -> None:
    rel = render_case("three-pools-shared-and-preloaded")
    jobs = rel.of_kind("Job")
    assert [j["spec"]["template"]["spec"]["containers"][0]["command"] for j in jobs] == [
        [
            "python3",
            "-m",
            "model_store",
            "pull",
            "s3://models/demo-model/main",
            "/models/demo-model/main",
        ]
    ]


def _job_name(values: dict[str, Any]) -> str:
    return str(render(values).one("Job")["metadata"]["name"])


def test_fetch_job_name_follows_its_spec() -> None:
    """A Job's pod template is immutable: a changed spec must come as a new Job, an unchanged
    one must keep its name (or every upgrade would re-run the download)."""
    base = load_values(CHART / "values-tp.yaml")
    name = _job_name(base)
    assert _job_name(base) == name
    new_revision = {**base, "models": [{**base["models"][0], "revision": "v2"}]}
    new_image = {**base, "image": {"platform": {"repository": "llmserve/platform", "tag": "0.2"}}}
    assert len({name, _job_name(new_revision), _job_name(new_image)}) == 3


def _registry_of(image: str) -> str | None:
    """The registry an image reference names, as Docker reads it; None: Docker Hub."""
    first, _, rest = image.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return first
    return None


def test_default_values_fail_in_one_line_naming_the_image_registry() -> None:
    # `helm template` with the chart's own values: no image name that falls back to Docker Hub.
    with pytest.raises(helm_python.HelmError) as err:
        render({}, registry=None)
    message = str(err.value)
    assert "\n" not in message.strip()
    assert "image.registry is required" in message and "--set image.registry=" in message
    # deploy/README.md quotes the message as users will see it.
    readme = (REPO / "deploy" / "README.md").read_text(encoding="utf-8")
    quoted = " ".join(readme.split()).split("stops with one line, `", 1)[1].split(" ...`", 1)[0]
    assert quoted in message


def test_every_image_names_its_registry(release: Release) -> None:
    for pod in release.pods():
        for c in pod.containers():
            assert _registry_of(c["image"]) is not None, (pod.name, c["image"])


def test_project_images_live_under_image_registry(render_case: Any) -> None:
    rel = render_case("compare-job")
    images = {c["image"] for pod in rel.pods() for c in pod.containers()}
    assert {i.rpartition(":")[0] for i in images} == {
        f"{TEST_REGISTRY}/llmserve/{name}" for name in ("platform", "worker-gpu", "loadtest")}
    # A trailing slash on the value does not double the separator.
    again = render(rel.values, registry=TEST_REGISTRY + "/")
    assert images == {c["image"] for pod in again.pods() for c in pod.containers()}


def test_a_repository_that_names_its_registry_is_used_as_it_is() -> None:
    # No image.registry needed when every image names its own registry.
    values = {
        "image": {
            "platform": {"repository": "ghcr.io/me/platform", "tag": "1"},
            "workerGpu": {"repository": "localhost:5000/worker-gpu", "tag": "1"},
            "workerCpu": {"repository": "localhost/worker-cpu", "tag": "1"},
        },
        "models": [{"name": "cpu", "model": "m", "device": "cpu",
                    "source": {"bootstrapDemo": True}}],
    }
    rel = render(values, registry=None)
    images = {c["image"] for pod in rel.pods() for c in pod.containers()}
    assert images == {"ghcr.io/me/platform:1", "localhost/worker-cpu:1"}


def test_worker_pools_never_mount_their_volume_writable(release: Release) -> None:
    for pod in release.worker_pods():
        for c in pod.containers():
            for mount in c.get("volumeMounts", []):
                if mount["name"] == "models":
                    assert mount.get("readOnly") is True, pod.name
        claims = [v for v in pod.spec["volumes"] if "persistentVolumeClaim" in v]
        assert claims and all(v["persistentVolumeClaim"]["readOnly"] for v in claims), pod.name


def _pool(**extra: Any) -> dict[str, Any]:
    return {"name": "p", "model": "m", "source": {"s3": "s3://models/m"}, **extra}


def _models(*pools: dict[str, Any]) -> dict[str, Any]:
    return {"models": list(pools)}


# (values, a fragment of the error: the offending key or the rule).
SCHEMA_REJECTS: dict[str, tuple[dict[str, Any], str]] = {
    "tp zero": (_models(_pool(tensorParallelSize=0)), "/models/0/tensorParallelSize"),
    "tp fractional": (_models(_pool(tensorParallelSize=1.5)), "/models/0/tensorParallelSize"),
    "tp as string": (_models(_pool(tensorParallelSize="8")), "/models/0/tensorParallelSize"),
    "one-node group": (
        _models(_pool(pipelineParallelSize=2, multiNode={"nodes": 1})),
        "/models/0/multiNode/nodes",
    ),
    "replicas negative": (_models(_pool(replicas=-1)), "/models/0/replicas"),
    "cpu half precision": (_models(_pool(device="cpu", dtype="bfloat16")), "/models/0/dtype"),
    "unknown device": (_models(_pool(device="tpu")), "/models/0/device"),
    "typo in a pool key": (_models(_pool(tensorParalelSize=8)), "tensorParalelSize"),
    "pool name not a DNS label": (_models(_pool(name="Llama_70B")), "/models/0/name"),
    "pool name too long": (_models(_pool(name="a" * (POOL_NAME_MAX + 1))), "/models/0/name"),
    # The group rule (worker/rules.py): each node runs whole pipeline stages.
    "pp not a multiple of nodes": (
        _models(_pool(pipelineParallelSize=3, multiNode={"nodes": 2})),
        "'/models/0/pipelineParallelSize': multipleOf: got 3, want 2",
    ),
    "fewer stages than nodes": (
        _models(_pool(pipelineParallelSize=2, multiNode={"nodes": 4})),
        "'/models/0/pipelineParallelSize': multipleOf: got 2, want 4",
    ),
    "a group with one stage": (
        _models(_pool(multiNode={"nodes": 2})),
        "missing property 'pipelineParallelSize'",
    ),
    "a group larger than the chart's": (
        _models(_pool(pipelineParallelSize=34, multiNode={"nodes": MAX_GROUP_NODES + 1})),
        "/models/0/multiNode/nodes",
    ),
    "model escapes the volume": (_models(_pool(model="../etc")), "/models/0/model"),
    "revision with a slash": (_models(_pool(revision="a/b")), "/models/0/revision"),
    "no source": (_models({"name": "p", "model": "m"}), "source"),
    "two sources": (
        _models(_pool(source={"s3": "s3://models/m", "preloaded": True})),
        "/models/0/source",
    ),
    "source not s3": (_models(_pool(source={"s3": "https://bucket/m"})), "/models/0/source/s3"),
    "worker env sets a worker setting": (
        _models(_pool(env=[{"name": "WORKER_TENSOR_PARALLEL_SIZE", "value": "2"}])),
        "/models/0/env/0/name",
    ),
    "worker env carries S3 credentials": (
        {"workerDefaults": {"env": [{"name": "AWS_SECRET_ACCESS_KEY", "value": "x"}]}},
        "/workerDefaults/env/0/name",
    ),
    "gpu memory above 1": (_models(_pool(gpuMemoryUtilization=1.5)), "gpuMemoryUtilization"),
    "unknown discovery": ({"gateway": {"discovery": "consul"}}, "/gateway/discovery"),
    "static without backends": ({"gateway": {"discovery": "static"}}, "backends"),
    "gateway env not GATEWAY_": (
        {"gateway": {"env": {"retries": "2"}}},
        "invalid propertyName 'retries'",
    ),
    "api key not a digest": (
        {"gateway": {"apiKeys": {"enabled": True, "keys": [{"tenant": "t", "sha256": "sk-1"}]}}},
        "/gateway/apiKeys/keys/0/sha256",
    ),
    "api key entry without a tenant": (
        {"gateway": {"apiKeys": {"enabled": True, "keys": [{"sha256": "a" * 64}]}}},
        "/gateway/apiKeys/keys/0",
    ),
    "api key entry with an unknown field": (
        {"gateway": {"apiKeys": {"keys": [{"tenant": "t", "sha256": "a" * 64, "key": "x"}]}}},
        "/gateway/apiKeys/keys/0",
    ),
    "single-pod access mode": (
        {"modelStorage": {"accessMode": "ReadWriteOncePod"}},
        "/modelStorage/accessMode",
    ),
    "error rate above 1": (
        {"metrics": {"prometheusRule": {"errorRate": 5}}},
        "/metrics/prometheusRule/errorRate",
    ),
    "unknown top-level key": ({"model": []}, "model"),
    "image registry with a scheme": (
        {"image": {"registry": "https://registry.example.com"}},
        "/image/registry",
    ),
}


@pytest.mark.parametrize("case", sorted(SCHEMA_REJECTS))
def test_schema_rejects_bad_values(case: str) -> None:
    values, fragment = SCHEMA_REJECTS[case]
    with pytest.raises(helm_python.HelmValuesError) as err:
        render(values)
    assert fragment in str(err.value)


# Rules JSON schema cannot say; the templates `fail` with a message naming the values.
TEMPLATE_REJECTS: dict[str, tuple[dict[str, Any], str]] = {
    "master port on the API port": (
        _models(_pool(pipelineParallelSize=2, multiNode={"nodes": 2, "masterPort": 8000})),
        "multiNode.masterPort=8000 collides",
    ),
    "duplicate pool names": (_models(_pool(), _pool()), 'pool name "p" is used twice'),
    "one model, two sources": (
        _models(_pool(), _pool(name="q", source={"s3": "s3://other/m"})),
        "different source",
    ),
    "gateway env overrides a managed setting": (
        {"gateway": {"env": {"GATEWAY_PORT": "9000"}}},
        "gateway.env.GATEWAY_PORT is managed by the chart",
    ),
    "gateway probe port on the API port": (
        {"gateway": {"probePort": 8000}},
        "gateway.probePort must differ from gateway.port",
    ),
    "gateway grace below preStop + drain": (
        {"gateway": {"terminationGracePeriodSeconds": 20}},
        "gateway.terminationGracePeriodSeconds=20 is shorter than",
    ),
    "worker grace below preStop + drain": (
        _models(_pool(terminationGracePeriodSeconds=30)),
        "terminationGracePeriodSeconds=30 is shorter than",
    ),
    # Values the chart would otherwise accept and ignore (issue 37, item 7).
    "wake budget with autoscaling off": (
        _models(_pool(autoscaling={"enabled": False, "minReplicas": 0,
                                   "wakeBudgetSeconds": 600})),
        "models[p].autoscaling.wakeBudgetSeconds is set but autoscaling.enabled is false",
    ),
    "adapters with lora.enabled false": (
        _models(_pool(lora={"enabled": False,
                            "adapters": [{"name": "a", "s3": "s3://models/ad/a"}]})),
        "models[p].lora.enabled is false but lora.adapters lists 1",
    ),
    "maxLoras with LoRA off": (
        _models(_pool(lora={"maxLoras": 4})),
        "models[p].lora.maxLoras is set but LoRA is off",
    ),
    "maxLoraRank with LoRA off": (
        _models(_pool(lora={"enabled": False, "maxLoraRank": 16})),
        "models[p].lora.maxLoraRank is set but LoRA is off",
    ),
    "runtimeUpdates with LoRA off": (
        _models(_pool(lora={"runtimeUpdates": False})),
        "models[p].lora.runtimeUpdates is set but LoRA is off",
    ),
    "gateway.env naming no setting": (
        {"gateway": {"env": {"GATEWAY_RETRYS": "2"}}},
        "gateway.env.GATEWAY_RETRYS is not a gateway setting",
    ),
    "api keys with no keys": (
        {"gateway": {"apiKeys": {"enabled": True}}},
        "gateway.apiKeys.enabled needs",
    ),
    "one api key digest twice": (
        {
            "gateway": {
                "apiKeys": {
                    "enabled": True,
                    "keys": [
                        {"tenant": "a", "sha256": "c" * 64},
                        {"tenant": "b", "sha256": "C" * 64},
                    ],
                }
            }
        },
        'tenants "a" and "b" list the same sha256',
    ),
    "half an S3 key pair": (
        {"modelStorage": {"s3": {"accessKeyId": "AKIA"}}},
        "without modelStorage.s3.secretAccessKey",
    ),
}


@pytest.mark.parametrize("case", sorted(TEMPLATE_REJECTS))
def test_templates_reject_inconsistent_values(case: str) -> None:
    values, fragment = TEMPLATE_REJECTS[case]
    with pytest.raises(helm_python.HelmError) as err:
        render(values)
    assert fragment in str(err.value)


def test_fetch_jobs_run_commands_the_model_store_cli_accepts(release: Release) -> None:
    """Each fetch Job's command goes through model_store's real argument parser."""
    fetches = [
        job
        for job in release.of_kind("Job")
        if job["metadata"]["labels"]["app.kubernetes.io/component"] == "model-fetch"
    ]
    for job in fetches:
        (container,) = job["spec"]["template"]["spec"]["containers"]
        command = container["command"]
        assert command[:3] == ["python3", "-m", "model_store"], command
        assert command[3] in {"pull", "bootstrap-demo"}, command  # S3, or the offline demo model
        args = build_parser().parse_args(command[3:])  # exits (fails the test) on a bad command
        assert args.verb == command[3]
    for job in fetches:
        # Both verbs take the directory last: ROOT/<model>/<revision>, or a LoRA adapter's
        # ROOT/adapters/<name>/<revision>.
        dest = Path(job["spec"]["template"]["spec"]["containers"][0]["command"][-1])
        labels = job["metadata"]["labels"]
        mount = release.values.get("modelStorage", {}).get("mountPath", "/models")
        where = (("adapters", labels["llmserve.io/adapter"]) if "llmserve.io/adapter" in labels
                 else (labels["llmserve.io/model"],))
        assert dest == Path(mount, *where, labels["llmserve.io/revision"])
