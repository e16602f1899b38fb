"""Day two on the cluster: what `helm upgrade` changes, names under long release names,
placement of pipeline ranks, exposure of /metrics, disruption, and the schema's newer fields.

Upgrades are judged on rendered manifests: the chart at version X and X+1, and at model revision
A and B, rendered as Helm renders an upgrade (`is_upgrade`)."""

from __future__ import annotations

import copy
import shlex
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

from model_store.__main__ import build_parser
from tests.deploy.conftest import pool_values
from tests.deploy.manifests import CHART, Manifest, Release, env_of, render, with_registry
from worker.rules import POOL_NAME_MAX

pytestmark = pytest.mark.helm

PP = pool_values("pp", tensorParallelSize=2, pipelineParallelSize=2, multiNode={"nodes": 2})
TP = pool_values("tp", tensorParallelSize=2, replicas=2)
UPGRADE_VALUES: dict[str, Any] = {
    "models": [TP, PP],
    "minio": {"enabled": True},
    "gateway": {"ingress": {"enabled": True}, "autoscaling": {"enabled": True}},
    "metrics": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}},
}

# Fields the API server refuses to change on an existing object (by kind).
IMMUTABLE: dict[str, list[tuple[str, ...]]] = {
    "Deployment": [("spec", "selector")],
    "StatefulSet": [
        ("spec", "selector"),
        ("spec", "serviceName"),
        ("spec", "volumeClaimTemplates"),
        ("spec", "podManagementPolicy"),
    ],
    "Job": [("spec", "template"), ("spec", "selector"), ("spec", "completions")],
    "Service": [("spec", "clusterIP"), ("spec", "type")],
    "PersistentVolumeClaim": [
        ("spec", "accessModes"),
        ("spec", "storageClassName"),
        ("spec", "volumeName"),
    ],
    "LeaderWorkerSet": [("spec", "leaderWorkerTemplate", "size")],
}


def _get(m: Manifest, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(m, dict) or key not in m:
            return None
        m = m[key]
    return m


def _by_key(rel: Release) -> dict[tuple[str, str], Manifest]:
    return {(m["kind"], m["metadata"]["name"]): m for m in rel.manifests}


def _pod_templates(rel: Release) -> dict[str, Manifest]:
    return {p.name: {"metadata": p.metadata, "spec": p.spec} for p in rel.pods()}


@pytest.fixture(scope="module")
def bumped_chart(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The same chart with only its version bumped (a chart-only release)."""
    dest = tmp_path_factory.mktemp("chart") / "llmserve"
    shutil.copytree(CHART, dest)
    meta = yaml.safe_load((dest / "Chart.yaml").read_text())
    major, minor, patch = (int(x) for x in meta["version"].split("."))
    meta["version"] = f"{major}.{minor + 1}.{patch}"
    (dest / "Chart.yaml").write_text(yaml.safe_dump(meta))
    yield dest


def _render_chart(path: Path, values: dict[str, Any], **kw: Any) -> Release:
    with helm_python.Chart.load(path) as c:
        out = c.render(with_registry(values), name="llm", namespace="inference", **kw)
    manifests: list[Manifest] = []
    notes = ""
    for name, text in sorted(out.items()):
        if name.endswith("NOTES.txt"):
            notes = text
        else:
            manifests += [d for d in yaml.safe_load_all(text) if d]
    return Release(values=values, manifests=manifests, notes=notes)


def _assert_no_immutable_change(before: Release, after: Release) -> int:
    old, new = _by_key(before), _by_key(after)
    kept = sorted(set(old) & set(new))
    checked = 0
    for key in kept:
        for path in IMMUTABLE.get(key[0], []):
            assert _get(old[key], path) == _get(new[key], path), f"{key} {'.'.join(path)}"
            checked += 1
    return checked


def test_chart_only_bump_changes_no_pod_template_and_no_immutable_field(
    bumped_chart: Path,
) -> None:
    before = _render_chart(CHART, UPGRADE_VALUES)
    after = _render_chart(bumped_chart, UPGRADE_VALUES, is_upgrade=True)
    # The control: the bump is visible on the objects themselves.
    charts = {m["metadata"]["labels"]["helm.sh/chart"] for m in after.manifests}
    assert charts == {"llmserve-0.2.0"}
    assert _pod_templates(before) == _pod_templates(after)  # nothing rolls
    assert _assert_no_immutable_change(before, after) > 10
    # Every pod keeps its name: a Job that kept its name with a new template would not upgrade.
    assert set(_by_key(before)) == set(_by_key(after))


def test_new_revision_is_fetched_before_any_worker_rolls() -> None:
    base = _render_chart(CHART, UPGRADE_VALUES)
    values = copy.deepcopy(UPGRADE_VALUES)
    for pool in values["models"]:
        pool["revision"] = "v2"
        pool["source"] = {"s3": "s3://models/demo-model/v2"}
    upgraded = _render_chart(CHART, values, is_upgrade=True)
    assert _assert_no_immutable_change(base, upgraded) > 10

    (old_job,) = [j for j in base.of_kind("Job") if "fetch" in j["metadata"]["name"]]
    (new_job,) = [j for j in upgraded.of_kind("Job") if "fetch" in j["metadata"]["name"]]
    # A new Job (the old one's template cannot change), run by Helm before it touches the workers.
    assert new_job["metadata"]["name"] != old_job["metadata"]["name"]
    hook = new_job["metadata"]["annotations"]
    assert hook["helm.sh/hook"] == "pre-upgrade"
    assert "hook-succeeded" in hook["helm.sh/hook-delete-policy"]
    assert new_job["spec"]["template"]["spec"]["containers"][0]["command"][-1].endswith(
        "/demo-model/v2"
    )
    # On install the same Job is a plain resource: a hook would block `helm install` for the
    # whole download.
    assert "annotations" not in old_job["metadata"]
    # Revisions sit side by side: the workers move to the new directory, the old one stays.
    for pod in upgraded.worker_pods():
        assert env_of(pod.container("worker"))["WORKER_MODEL_PATH"] == "/models/demo-model/v2"
    # ... and roll with a surge pod, so the pool never drops to zero.
    deployment = upgraded.one("Deployment", "llm-llmserve-tp")
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    lws = upgraded.one("LeaderWorkerSet")
    assert lws["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"] == {
        "maxSurge": 1,
        "maxUnavailable": 0,
    }


def test_hook_can_be_turned_off() -> None:
    values = copy.deepcopy(UPGRADE_VALUES)
    values["modelStorage"] = {"modelFetch": {"beforeUpgrade": False}}
    upgraded = _render_chart(CHART, values, is_upgrade=True)
    (job,) = [j for j in upgraded.of_kind("Job") if "fetch" in j["metadata"]["name"]]
    assert "annotations" not in job["metadata"]


def test_in_place_single_replica_pool_is_warned_about() -> None:
    rolling = pool_values("solo", rollout={"maxSurge": 0, "maxUnavailable": 1})
    notes = render({"models": [rolling, pool_values("other", replicas=1)]}).notes
    assert "WARNING: pool solo has 1 replica and rollout.maxSurge=0" in notes
    assert "pool other" not in notes.split("WARNING")[-1]


# --- names --------------------------------------------------------------------------------------

LONG_RELEASE = "r" * 20 + "-" + "x" * 32  # 53 characters: Helm's own limit for a release name


def test_every_name_fits_with_a_53_character_release_name() -> None:
    assert len(LONG_RELEASE) == 53
    pools = [
        pool_values("a" * POOL_NAME_MAX, pipelineParallelSize=2, multiNode={"nodes": 2}, replicas=12),
        pool_values("b" * POOL_NAME_MAX, pipelineParallelSize=2, multiNode={"nodes": 2}),
        pool_values("c" * POOL_NAME_MAX, replicas=3),
    ]
    rel = render({"models": pools, "minio": {"enabled": True}}, name=LONG_RELEASE)
    keys = [(m["kind"], m["metadata"]["name"]) for m in rel.manifests]
    assert len(keys) == len(set(keys))
    for m in rel.manifests:
        assert len(m["metadata"]["name"]) <= 63, m["metadata"]["name"]
    for lws in rel.of_kind("LeaderWorkerSet"):
        name = lws["metadata"]["name"]
        # LWS names the group's worker StatefulSet <lws>-<group>; a StatefulSet name over 52
        # characters cannot create pods.
        last_group = lws["spec"]["replicas"] - 1
        assert len(f"{name}-{last_group}") <= 52, name
        # Its pods are <lws>-<group>-<index>: a hostname (63).
        assert len(f"{name}-{last_group}-{lws['spec']['leaderWorkerTemplate']['size'] - 1}") <= 63
    # Cut names stay distinct and recognisable (36 characters kept, then a hash).
    lws_names = sorted(m["metadata"]["name"] for m in rel.of_kind("LeaderWorkerSet"))
    assert len(set(lws_names)) == 2 and all(len(n) == 45 for n in lws_names)


# --- placement ----------------------------------------------------------------------------------


def test_pipeline_ranks_land_on_distinct_nodes_and_user_affinity_is_kept() -> None:
    user = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100"]}]}
                ]
            }
        }
    }
    rel = render({"models": [{**PP, "affinity": user}, TP]})
    lws = rel.one("LeaderWorkerSet")
    pods = [p for p in rel.worker_pods() if p.role in ("leader", "follower")]
    assert {p.role for p in pods} == {"leader", "follower"}
    for pod in pods:
        (term,) = pod.anti_affinity()
        assert term["topologyKey"] == "kubernetes.io/hostname"
        assert term["labelSelector"]["matchLabels"] == {
            "leaderworkerset.sigs.k8s.io/name": lws["metadata"]["name"]
        }
        assert term["matchLabelKeys"] == ["leaderworkerset.sigs.k8s.io/group-key"]
        assert pod.spec["affinity"]["nodeAffinity"] == user["nodeAffinity"]
    # TP stays in one pod, hence one node; DP replicas spread across nodes.
    (single,) = [p for p in rel.worker_pods() if p.role == "single"]
    assert not single.anti_affinity()
    (spread,) = single.spec["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    assert spread["labelSelector"]["matchLabels"]["llmserve.io/pool"] == "tp"


def test_distinct_nodes_can_be_turned_off_for_single_node_test_clusters() -> None:
    pool = {**PP, "multiNode": {"nodes": 2, "distinctNodes": False}}
    rel = render({"models": [pool]})
    assert all(not p.anti_affinity() for p in rel.worker_pods())


def test_multi_node_pods_advertise_their_pod_ip_to_vllm() -> None:
    rel = render({"models": [PP, TP]})
    for pod in rel.worker_pods():
        env = {e["name"]: e for e in pod.container("worker")["env"]}
        if pod.role == "single":
            assert "VLLM_HOST_IP" not in env
        else:
            assert env["VLLM_HOST_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}


# --- exposure and disruption ----------------------------------------------------------------------


def test_default_ingress_routes_the_api_only() -> None:
    rel = render({"gateway": {"ingress": {"enabled": True}}})
    paths = [
        p["path"]
        for rule in rel.one("Ingress")["spec"]["rules"]
        for p in rule["http"]["paths"]
    ]
    assert paths == ["/v1"]


@pytest.mark.parametrize(
    ("path", "path_type"), [("/", "Prefix"), ("/metrics", "Exact"), ("/", "ImplementationSpecific")]
)
def test_ingress_that_would_expose_metrics_is_refused(path: str, path_type: str) -> None:
    hosts = [{"host": "llm.example", "paths": [{"path": path, "pathType": path_type}]}]
    with pytest.raises(helm_python.HelmError) as err:
        render({"gateway": {"ingress": {"enabled": True, "hosts": hosts}}})
    assert "would expose /metrics" in str(err.value)
    assert "gateway.ingress.exposeMetrics" in str(err.value)
    opted_in = render(
        {"gateway": {"ingress": {"enabled": True, "hosts": hosts, "exposeMetrics": True}}}
    )
    assert opted_in.one("Ingress")["spec"]["rules"][0]["http"]["paths"][0]["path"] == path


def test_exact_root_path_does_not_expose_metrics() -> None:
    """An Exact "/" matches "/" alone, not /metrics: accepted as written, routed to the API."""
    hosts = [{"host": "llm.example", "paths": [{"path": "/", "pathType": "Exact"}]}]
    rel = render({"gateway": {"ingress": {"enabled": True, "hosts": hosts}}})
    (rule,) = rel.one("Ingress")["spec"]["rules"]
    (path,) = rule["http"]["paths"]
    assert rule["host"] == "llm.example"
    assert (path["path"], path["pathType"]) == ("/", "Exact")
    service = path["backend"]["service"]
    assert service["port"] == {"name": "http"}  # the API port, not the probe port
    (gateway_service,) = [m for m in rel.of_kind("Service")
                          if m["metadata"]["name"] == service["name"]]
    assert "http" in {p["name"] for p in gateway_service["spec"]["ports"]}


def test_disruption_budgets_let_unhealthy_pods_go() -> None:
    rel = render({"models": [PP, TP]})
    pdbs = rel.of_kind("PodDisruptionBudget")
    assert len(pdbs) == 3  # gateway + two pools
    assert all(p["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow" for p in pdbs)


def test_drains_follow_max_stream_seconds() -> None:
    rel = render({"maxStreamSeconds": 1800, "models": [TP]})
    for pod in rel.pods():
        if pod.role == "gateway":
            env = env_of(pod.container("gateway"))
            assert env["GATEWAY_DRAIN_TIMEOUT_S"] == "1800"
            assert pod.spec["terminationGracePeriodSeconds"] >= 1800
        elif pod.role == "single":
            assert env_of(pod.container("worker"))["WORKER_DRAIN_TIMEOUT_S"] == "1800"
            assert pod.spec["terminationGracePeriodSeconds"] >= 1800


# --- MinIO in the release ------------------------------------------------------------------------


def test_minio_buckets_are_created_and_notes_give_a_push_command_the_cli_accepts() -> None:
    pools = [pool_values("a"), pool_values("b", model="other", source={"s3": "s3://weights/other/main"})]
    rel = render({"minio": {"enabled": True}, "models": pools})
    (job,) = [j for j in rel.of_kind("Job") if j["metadata"]["name"].endswith("-buckets")]
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[-2:] == ["models", "weights"]
    pushes = [
        shlex.split(line.strip())
        for line in rel.notes.splitlines()
        if line.strip().startswith("python -m model_store push")
    ]
    assert [p[-1] for p in pushes] == ["s3://models/demo-model/main", "s3://weights/other/main"]
    for p in pushes:
        args = build_parser().parse_args(p[3:])  # exits (fails the test) on a bad command
        assert args.verb == "push"
    # Not when the release uses an outside S3 endpoint.
    outside = render(
        {
            "minio": {"enabled": True},
            "modelStorage": {"s3": {"endpointUrl": "https://s3.example"}},
            "models": pools,
        }
    )
    assert not [j for j in outside.of_kind("Job") if j["metadata"]["name"].endswith("-buckets")]
    assert "model_store push" not in outside.notes


# --- schema: a positive and a negative case for each newer field ----------------------------------

GOOD: dict[str, dict[str, Any]] = {
    "rollout": {"models": [pool_values(rollout={"maxSurge": 0, "maxUnavailable": 1})]},
    "runtimeClassName": {"models": [pool_values(runtimeClassName="nvidia")]},
    "extraVolumes": {
        "models": [
            pool_values(
                extraVolumes=[{"name": "certs", "secret": {"secretName": "ca"}}],
                extraVolumeMounts=[{"name": "certs", "mountPath": "/etc/ca", "readOnly": True}],
            )
        ]
    },
    "securityContext": {
        "models": [
            pool_values(
                podSecurityContext={"runAsUser": 2000},
                containerSecurityContext={"capabilities": {"add": ["IPC_LOCK"]}},
            )
        ]
    },
    "autoscaling": {"models": [pool_values(autoscaling={"enabled": True, "engine": "hpa",
                                                  "maxReplicas": 6})]},
    "distinctNodes": {"models": [{**PP, "multiNode": {"nodes": 2, "distinctNodes": True}}]},
    "maxStreamSeconds": {"maxStreamSeconds": 600},
    "gatewayRuntimeClass": {"gateway": {"runtimeClassName": "gvisor"}},
}
BAD: dict[str, tuple[dict[str, Any], str]] = {
    "rollout": ({"models": [pool_values(rollout={"maxSurge": -1, "maxUnavailable": 0})]}, "rollout"),
    "runtimeClassName": ({"models": [pool_values(runtimeClassName=3)]}, "runtimeClassName"),
    "extraVolumes": ({"models": [pool_values(extraVolumes=[{"secret": {}}])]}, "extraVolumes"),
    "extraVolumeMounts": (
        {"models": [pool_values(extraVolumeMounts=[{"name": "x", "mountPath": "rel"}])]},
        "mountPath",
    ),
    "securityContext": ({"models": [pool_values(podSecurityContext="root")]}, "podSecurityContext"),
    "autoscaling": (
        {"models": [pool_values(autoscaling={"enabled": True, "engine": "knative"})]},
        "engine",
    ),
    "LeaderReady": (
        {"models": [{**PP, "multiNode": {"nodes": 2, "startupPolicy": "LeaderReady"}}]},
        "startupPolicy",
    ),
    "maxStreamSeconds": ({"maxStreamSeconds": 0}, "maxStreamSeconds"),
    "exposeMetrics": ({"gateway": {"ingress": {"exposeMetrics": "yes"}}}, "exposeMetrics"),
    "beforeUpgrade": ({"modelStorage": {"modelFetch": {"beforeUpgrade": 1}}}, "beforeUpgrade"),
}


@pytest.mark.parametrize("case", sorted(GOOD))
def test_newer_fields_accepted_and_rendered(case: str) -> None:
    rel = render(GOOD[case])
    assert rel.manifests
    pods = rel.worker_pods()
    if case == "runtimeClassName":
        assert pods[0].spec["runtimeClassName"] == "nvidia"
    elif case == "extraVolumes":
        spec = pods[0].spec
        assert {"name": "certs", "secret": {"secretName": "ca"}} in spec["volumes"]
        mounts = pods[0].container("worker")["volumeMounts"]
        assert {"name": "certs", "mountPath": "/etc/ca", "readOnly": True} in mounts
    elif case == "securityContext":
        ctx = pods[0].spec["securityContext"]
        assert ctx["runAsUser"] == 2000 and ctx["runAsNonRoot"] is True  # merged over the global
        worker = pods[0].container("worker")["securityContext"]
        assert worker["capabilities"]["add"] == ["IPC_LOCK"]
        assert worker["readOnlyRootFilesystem"] is True
    elif case == "autoscaling":
        hpa = rel.one("HorizontalPodAutoscaler")
        assert hpa["spec"]["scaleTargetRef"]["kind"] == "Deployment"
        assert hpa["spec"]["maxReplicas"] == 6
        # The gateway's demand for the pool's model, per replica: not the engines' own queue.
        (metric,) = hpa["spec"]["metrics"]
        assert metric["external"]["metric"] == {"name": "llmserve_pool_demand",
                                                "selector": {"matchLabels": {"pool": "demo-model"}}}
        assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "16"}
        assert "replicas" not in rel.one("Deployment", "llm-llmserve-p")["spec"]
    elif case == "rollout":
        strategy = rel.one("Deployment", "llm-llmserve-p")["spec"]["strategy"]
        assert strategy["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    elif case == "gatewayRuntimeClass":
        (gw,) = [p for p in rel.pods() if p.role == "gateway"]
        assert gw.spec["runtimeClassName"] == "gvisor"


@pytest.mark.parametrize("case", sorted(BAD))
def test_newer_fields_refused(case: str) -> None:
    values, fragment = BAD[case]
    with pytest.raises(helm_python.HelmValuesError) as err:
        render(values)
    assert fragment in str(err.value)


def test_autoscaling_range_is_checked() -> None:
    with pytest.raises(helm_python.HelmError) as err:
        render({"models": [pool_values(autoscaling={"enabled": True, "engine": "hpa", "minReplicas": 5,
                                              "maxReplicas": 2})]})
    assert "maxReplicas=2 is below minReplicas=5" in str(err.value)


# --- per-key limits across gateway replicas -------------------------------------------------------

KEYS = {"enabled": True, "keys": [{"tenant": "acme", "sha256": "a" * 64, "rpm": 600}]}


def _gateway_env(values: dict[str, Any]) -> dict[str, Manifest]:
    rel = render(values)
    (gw,) = [p for p in rel.pods() if p.role == "gateway"]
    return {e["name"]: e for e in gw.container("gateway")["env"]}


def test_without_redis_each_gateway_replica_enforces_its_share() -> None:
    env = _gateway_env({"gateway": {"replicas": 3, "apiKeys": KEYS}})
    assert env["GATEWAY_FLOW__LIMIT_REPLICAS"]["value"] == "3"
    assert "GATEWAY_FLOW__LIMITS_REDIS_URL" not in env
    scaled = {"replicas": 3, "apiKeys": KEYS, "autoscaling": {"enabled": True, "minReplicas": 2}}
    assert _gateway_env({"gateway": scaled})["GATEWAY_FLOW__LIMIT_REPLICAS"]["value"] == "2"
    notes = render({"gateway": scaled}).notes
    assert "enforces 1/2 of every key's RPM/TPM" in notes and "up to 10/2 x its limit" in notes


def test_redis_shares_limits_between_gateway_replicas() -> None:
    shared = {**KEYS, "sharedLimits": {"redisUrl": "redis://redis:6379/0", "fail": "closed"}}
    env = _gateway_env({"gateway": {"apiKeys": shared}})
    assert env["GATEWAY_FLOW__LIMITS_REDIS_URL"]["value"] == "redis://redis:6379/0"
    assert env["GATEWAY_FLOW__LIMITS_REDIS_FAIL"]["value"] == "closed"
    assert "GATEWAY_FLOW__LIMIT_REPLICAS" not in env
    secret = {**KEYS, "sharedLimits": {"existingSecret": "redis-auth"}}
    env = _gateway_env({"gateway": {"apiKeys": secret}})
    ref = env["GATEWAY_FLOW__LIMITS_REDIS_URL"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "redis-auth", "key": "redis-url"}
    assert env["GATEWAY_FLOW__LIMITS_REDIS_FAIL"]["value"] == "open"
    with pytest.raises(helm_python.HelmValuesError) as err:
        render({"gateway": {"apiKeys": {**KEYS, "sharedLimits": {"redisUrl": "http://r"}}}})
    assert "redisUrl" in str(err.value)
