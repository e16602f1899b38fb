"""Invariants every rendered release must hold, checked on every preset and values case:
GPUs per pod, preStop versus grace period, no storage credentials in workers, least-privilege
RBAC, pod security and resources, and the wiring between Services, selectors and ports."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import helm_python
import pytest

from gateway.flow.keys import load_keys
from tests.deploy.conftest import DEMO_API_KEY, gateway_loads_keys
from tests.deploy.manifests import (
    NAMESPACE,
    TEST_REGISTRY,
    Manifest,
    Pod,
    Release,
    env_of,
    render,
    selector_matches,
)

pytestmark = pytest.mark.helm

GATEWAY_SA = "llm-llmserve-gateway"
WORKERS_SERVICE = "llm-llmserve-workers"


def pools_by_name(release: Release) -> dict[str, dict[str, Any]]:
    defaults = {"tensorParallelSize": 1, "pipelineParallelSize": 1, "replicas": 1, "device": "gpu"}
    return {p["name"]: {**defaults, **p} for p in release.values.get("models", [])}


def pool_of(pod: Pod, release: Release) -> dict[str, Any]:
    return pools_by_name(release)[pod.metadata["labels"]["llmserve.io/pool"]]


# --- parallel layout --------------------------------------------------------------------------


def test_gpus_per_pod_are_tp_times_pp_over_the_pods_of_a_group(release: Release) -> None:
    for pod in release.worker_pods():
        pool = pool_of(pod, release)
        tp, pp = pool["tensorParallelSize"], pool["pipelineParallelSize"]
        nodes = pool.get("multiNode", {}).get("nodes", 1)
        gpu_name = pool.get("gpuResourceName", "nvidia.com/gpu")
        resources = pod.container("worker")["resources"]
        if pool["device"] == "cpu":
            assert not any("gpu" in k for k in {**resources["requests"], **resources["limits"]})
            continue
        # Extended resources: request == limit, and the whole group holds TP x PP GPUs.
        assert resources["requests"][gpu_name] == resources["limits"][gpu_name], pod.name
        assert resources["requests"][gpu_name] * nodes == tp * pp, pod.name
        for c in pod.containers():
            if c["name"] != "worker":
                assert gpu_name not in c["resources"].get("limits", {}), f"{pod.name} {c['name']}"


def test_single_node_pools_are_deployments_multi_node_pools_are_lws_groups(
    release: Release,
) -> None:
    for name, pool in pools_by_name(release).items():
        owner = f"llm-llmserve-{name}"
        if "multiNode" in pool:
            lws = release.one("LeaderWorkerSet", owner)
            assert lws["spec"]["leaderWorkerTemplate"]["size"] == pool["multiNode"]["nodes"]
            # An autoscaled pool leaves the count to its HorizontalPodAutoscaler.
            assert lws["spec"].get("replicas") == _fixed_replicas(pool)
            assert not [d for d in release.of_kind("Deployment") if d["metadata"]["name"] == owner]
        else:
            deployment = release.one("Deployment", owner)
            assert deployment["spec"].get("replicas") == _fixed_replicas(pool)


def _fixed_replicas(pool: dict[str, Any]) -> int | None:
    return None if pool.get("autoscaling", {}).get("enabled") else pool["replicas"]


def test_presets_hold_the_layouts_they_promise(render_case: Any) -> None:
    tp = render_case("preset:values-tp.yaml")
    (pod,) = tp.worker_pods()
    assert pod.owner["kind"] == "Deployment" and pod.owner["spec"]["replicas"] == 2
    assert pod.container("worker")["resources"]["limits"]["nvidia.com/gpu"] == 8

    pp = render_case("preset:values-pp.yaml")
    lws = pp.one("LeaderWorkerSet")
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == 2
    for pod in pp.worker_pods():
        assert pod.container("worker")["resources"]["limits"]["nvidia.com/gpu"] == 8

    both = render_case("preset:values-tp-vs-pp.yaml")
    gpus = {
        p.role: p.container("worker")["resources"]["limits"]["nvidia.com/gpu"]
        for p in both.worker_pods()
    }
    assert gpus == {"single": 8, "leader": 4, "follower": 4}  # 8 GPUs per model copy either way

    cpu = render_case("preset:values-cpu.yaml")
    (pod,) = cpu.worker_pods()
    assert env_of(pod.container("worker"))["WORKER_DEVICE"] == "cpu"
    assert pod.container("worker")["image"].startswith(f"{TEST_REGISTRY}/llmserve/worker-cpu:")


# --- lifecycle --------------------------------------------------------------------------------


def _prestop_sleep(container: Manifest) -> int:
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep" and len(command) == 2, command
    return int(command[1])


def test_grace_period_covers_prestop_plus_drain(release: Release) -> None:
    for pod in release.pods():
        if pod.role not in ("gateway", "single", "leader", "follower"):
            continue
        main = pod.containers(init=False)[0]
        env = env_of(main)
        drain = float(env.get("GATEWAY_DRAIN_TIMEOUT_S") or env["WORKER_DRAIN_TIMEOUT_S"])
        grace = pod.spec["terminationGracePeriodSeconds"]
        assert grace >= _prestop_sleep(main) + drain, pod.name


def test_drain_settings_reach_the_processes(render_case: Any) -> None:
    rel = render_case("pinned-images-pull-secrets-overrides")
    tp8 = next(p for p in rel.worker_pods() if p.metadata["labels"]["llmserve.io/pool"] == "tp8")
    assert tp8.spec["terminationGracePeriodSeconds"] == 420  # explicit, above 10 + 400
    gateway = next(p for p in rel.pods() if p.role == "gateway")
    # Unset drains follow maxStreamSeconds (300 by default), so a drain never cuts a stream that
    # is allowed to run.
    assert env_of(gateway.container("gateway"))["GATEWAY_DRAIN_TIMEOUT_S"] == "300"
    assert gateway.spec["terminationGracePeriodSeconds"] == 5 + 300 + 10
    assert env_of(tp8.container("worker"))["WORKER_DRAIN_TIMEOUT_S"] == "400"


def test_probes(release: Release) -> None:
    for pod in release.pods():
        if pod.role == "gateway" and env_of(pod.container("gateway"))["GATEWAY_MODE"] == "epp":
            # The endpoint picker: its gRPC health services, on the port it serves ext_proc.
            c = pod.container("gateway")
            ports = {p["name"]: p["containerPort"] for p in c["ports"]}
            assert c["livenessProbe"]["grpc"] == {"port": ports["grpc"], "service": "liveness"}
            assert c["readinessProbe"]["grpc"] == {"port": ports["grpc"], "service": "readiness"}
            assert str(ports["grpc"]) == env_of(c)["GATEWAY_EPP__PORT"]
        elif pod.role == "gateway":
            c = pod.container("gateway")
            assert c["livenessProbe"]["httpGet"]["path"] == "/health"
            assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
            # Probes on the gateway's own probe listener, the port it is told to open.
            ports = {p["name"]: p["containerPort"] for p in c["ports"]}
            assert c["livenessProbe"]["httpGet"]["port"] == "probes"
            assert c["readinessProbe"]["httpGet"]["port"] == "probes"
            assert str(ports["probes"]) == env_of(c)["GATEWAY_EDGE__PROBE_PORT"]
            assert ports["probes"] != ports["http"]
        elif pod.role in ("single", "leader"):
            c = pod.container("worker")
            pool = pool_of(pod, release)
            startup = c["startupProbe"]
            budget = startup["periodSeconds"] * startup["failureThreshold"]
            wanted = pool.get("startupProbe", {"periodSeconds": 10, "failureThreshold": 180})
            assert budget == wanted["periodSeconds"] * wanted["failureThreshold"] >= 600
            assert c["readinessProbe"]["httpGet"]["path"] == "/health"
        elif pod.role == "follower":
            # Headless: no API to probe. A dead rank exits and LWS recreates the group.
            c = pod.container("worker")
            assert not {"startupProbe", "readinessProbe", "livenessProbe", "ports"} & set(c)


def test_workers_wait_for_the_model_and_get_shared_memory(release: Release) -> None:
    for pod in release.worker_pods():
        (init,) = pod.spec["initContainers"]
        assert init["name"] == "wait-for-model"
        # The model's directory, then each LoRA adapter's the worker loads.
        env = env_of(pod.container("worker"))
        adapters = json.loads(env.get("WORKER_LORA_ADAPTERS", "{}")).values()
        assert init["command"][3] == env["WORKER_MODEL_PATH"]
        assert sorted(init["command"][4:]) == sorted(adapters)
        shm = next(v for v in pod.spec["volumes"] if v["name"] == "dshm")
        assert shm["emptyDir"]["medium"] == "Memory"
        mounts = {m["mountPath"]: m["name"] for m in pod.container("worker")["volumeMounts"]}
        assert mounts["/dev/shm"] == "dshm"


# --- storage credentials ----------------------------------------------------------------------

CREDENTIAL_PREFIXES = ("AWS_", "MODEL_STORE_", "MINIO_")


def _secret_refs(pod: Pod) -> set[str]:
    refs: set[str] = set()
    for c in pod.containers():
        for e in c.get("env", []):
            ref = e.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                refs.add(ref["name"])
        for src in c.get("envFrom", []):
            if "secretRef" in src:
                refs.add(src["secretRef"]["name"])
    for v in pod.spec.get("volumes", []):
        if "secret" in v:
            refs.add(v["secret"]["secretName"])
        for source in v.get("projected", {}).get("sources", []):
            if "secret" in source:
                refs.add(source["secret"]["name"])
    return refs


def test_workers_hold_no_storage_credentials(release: Release) -> None:
    for pod in release.worker_pods():
        assert pod.spec["automountServiceAccountToken"] is False, pod.name
        assert _secret_refs(pod) == set(), pod.name
        for c in pod.containers():
            names = [e["name"] for e in c.get("env", [])]
            assert not [n for n in names if n.startswith(CREDENTIAL_PREFIXES)], (pod.name, names)
            assert "envFrom" not in c


@pytest.mark.parametrize(
    ("case", "secret"),
    [
        ("minio-with-its-credentials", "llm-llmserve-minio"),
        ("s3-credentials-from-values-existing-claim", "llm-llmserve-s3"),
        ("preset:values-tp.yaml", "llmserve-s3"),
    ],
)
def test_only_the_model_fetch_job_reads_storage_credentials(
    render_case: Any, case: str, secret: str
) -> None:
    rel = render_case(case)
    readers = {p.role for p in rel.pods() if secret in _secret_refs(p)}
    assert "fetch" in readers  # the control: the credentials do reach the puller
    # MinIO itself, and the hook that creates its buckets.
    assert readers <= {"fetch", "minio", "minio-buckets"}
    fetch = next(p for p in rel.pods() if p.role == "fetch")
    env = {e["name"] for e in fetch.container("fetch")["env"]}
    assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= env


# --- RBAC -------------------------------------------------------------------------------------


def test_rbac_is_least_privilege(release: Release) -> None:
    kinds = {m["kind"] for m in release.manifests}
    assert not kinds & {"ClusterRole", "ClusterRoleBinding"}
    discovery = release.values.get("gateway", {}).get("discovery", "kubernetes")
    epp = release.values.get("gateway", {}).get("mode") == "epp"
    roles = release.of_kind("Role")
    if discovery != "kubernetes" and not epp:
        assert roles == [] and release.of_kind("RoleBinding") == []
        return
    (role,) = roles
    assert role["metadata"]["namespace"] == NAMESPACE
    read = ["get", "list", "watch"]
    # An EPP reads its InferencePool and the pods it selects (test_gateway_api.py checks these
    # against the calls the discovery makes); the gateway, the worker Service's slices.
    assert role["rules"] == ([
        {"apiGroups": ["inference.networking.k8s.io"], "resources": ["inferencepools"],
         "verbs": read},
        {"apiGroups": [""], "resources": ["pods"], "verbs": read},
    ] if epp else [
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": read}])
    (binding,) = release.of_kind("RoleBinding")
    assert binding["metadata"]["namespace"] == NAMESPACE
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": GATEWAY_SA, "namespace": NAMESPACE}
    ]
    gateways = [p for p in release.pods() if p.role == "gateway"]
    assert {g.spec["serviceAccountName"] for g in gateways} == {GATEWAY_SA}
    if epp:  # each EPP reads its own namespace's pool
        assert {env_of(g.container("gateway"))["GATEWAY_EPP__POOL_NAMESPACE"]
                for g in gateways} == {NAMESPACE}
        return
    env = env_of(gateways[0].container("gateway"))
    # The gateway watches exactly what the Role allows: its own namespace, the worker Service.
    assert env["GATEWAY_K8S_NAMESPACE"] == NAMESPACE
    if release.values.get("models"):
        assert (
            env["GATEWAY_K8S_SERVICE"]
            == release.one("Service", WORKERS_SERVICE)["metadata"]["name"]
        )


def test_only_the_gateway_may_mount_an_api_token(release: Release) -> None:
    discovery = release.values.get("gateway", {}).get("discovery", "kubernetes")
    epp = release.values.get("gateway", {}).get("mode") == "epp"
    for pod in release.pods():
        expected = pod.role == "gateway" and (discovery == "kubernetes" or epp)
        assert pod.spec.get("automountServiceAccountToken") is expected, pod.name


# --- pod security and resources ---------------------------------------------------------------


def test_pods_run_as_non_root_with_read_only_root_filesystems(release: Release) -> None:
    for pod in release.pods():
        ctx = pod.spec["securityContext"]
        assert ctx["runAsNonRoot"] is True and ctx["runAsUser"] > 0, pod.name
        assert ctx["seccompProfile"]["type"] == "RuntimeDefault"
        assert not {"hostNetwork", "hostPID", "hostIPC"} & set(pod.spec)
        volumes = {v["name"] for v in pod.spec.get("volumes", [])}
        assert not [v for v in pod.spec.get("volumes", []) if "hostPath" in v]
        for c in pod.containers():
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, (pod.name, c["name"])
            assert sc["readOnlyRootFilesystem"] is True, (pod.name, c["name"])
            assert sc.get("privileged", False) is False
            assert sc["capabilities"]["drop"] == ["ALL"] and "add" not in sc["capabilities"]
            # A read-only root needs somewhere to write temporary files.
            mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
            if c["name"] != "wait-for-model":
                assert mounts.get("/tmp") in volumes, (pod.name, c["name"])


def test_every_container_requests_cpu_and_memory_with_a_memory_limit(release: Release) -> None:
    for pod in release.pods():
        for c in pod.containers():
            resources = c["resources"]
            assert {"cpu", "memory"} <= set(resources["requests"]), (pod.name, c["name"])
            assert "memory" in resources["limits"], (pod.name, c["name"])


# --- wiring -----------------------------------------------------------------------------------


def _port_names(pod: Pod) -> set[str]:
    return {p["name"] for c in pod.containers(init=False) for p in c.get("ports", [])}


def test_services_select_the_pods_that_serve_their_ports(release: Release) -> None:
    pods = list(release.pods())
    for svc in release.of_kind("Service"):
        selected = [
            p for p in pods if selector_matches(svc["spec"]["selector"], p.metadata["labels"])
        ]
        assert selected, f"Service {svc['metadata']['name']} selects no pod"
        for pod in selected:
            for port in svc["spec"]["ports"]:
                assert port["targetPort"] in _port_names(pod), (svc["metadata"]["name"], pod.name)
    if release.values.get("models"):
        workers = release.one("Service", WORKERS_SERVICE)
        assert workers["spec"]["clusterIP"] == "None"
        roles = {
            p.role
            for p in pods
            if selector_matches(workers["spec"]["selector"], p.metadata["labels"])
        }
        assert "follower" not in roles and roles <= {"single", "leader"}


def test_disruption_budgets_and_monitors_select_real_pods(release: Release) -> None:
    pods = list(release.pods())
    for m in release.of_kind("PodDisruptionBudget") + release.of_kind("PodMonitor"):
        selector = m["spec"]["selector"]["matchLabels"]
        selected = [p for p in pods if selector_matches(selector, p.metadata["labels"])]
        assert selected, f"{m['kind']} {m['metadata']['name']} selects nothing"
        if m["kind"] == "PodMonitor":
            assert {p.role for p in selected} <= {"single", "leader"}
            for endpoint in m["spec"]["podMetricsEndpoints"]:
                assert all(endpoint["port"] in _port_names(p) for p in selected)
    for sm in release.of_kind("ServiceMonitor"):
        services = [
            s
            for s in release.of_kind("Service")
            if selector_matches(sm["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])
        ]
        assert [s["metadata"]["name"] for s in services] == ["llm-llmserve-gateway"]
        assert {e["port"] for e in sm["spec"]["endpoints"]} <= {
            p["name"] for p in services[0]["spec"]["ports"]
        }
        assert_scraped_on_the_probe_listener(release, sm, services[0])


def assert_scraped_on_the_probe_listener(release: Release, sm: Manifest, svc: Manifest) -> None:
    """Every endpoint of the gateway's ServiceMonitor reaches the port the gateway opens its probe
    listener on (GATEWAY_EDGE__PROBE_PORT), the one its kubelet probes use: that listener stays
    open while the API port drains or refuses a connection flood at its cap."""
    gateway = next(p for p in release.pods() if p.role == "gateway").container("gateway")
    container_ports = {p["name"]: p["containerPort"] for p in gateway["ports"]}
    service_ports = {p["name"]: p for p in svc["spec"]["ports"]}
    for endpoint in sm["spec"]["endpoints"]:
        assert endpoint["path"] == "/metrics"
        target = service_ports[endpoint["port"]]["targetPort"]
        assert target == gateway["livenessProbe"]["httpGet"]["port"]
        assert str(container_ports[target]) == env_of(gateway)["GATEWAY_EDGE__PROBE_PORT"]
        assert container_ports[target] != container_ports["http"]


def test_a_moved_probe_port_moves_the_metrics_scrape(render_case: Any) -> None:
    values = render_case("pinned-images-pull-secrets-overrides").values
    rel = render({**values, "gateway": {**values.get("gateway", {}), "probePort": 9101}})
    svc = rel.one("Service", "llm-llmserve-gateway")
    sm = rel.one("ServiceMonitor")
    probes = next(p for p in svc["spec"]["ports"] if p["name"] == "probes")
    assert probes["port"] == 9101 and [e["port"] for e in sm["spec"]["endpoints"]] == ["probes"]
    assert_scraped_on_the_probe_listener(rel, sm, svc)


def test_api_keys_are_mounted_where_the_gateway_looks(render_case: Any) -> None:
    for case, secret, key in [
        ("dns-discovery-api-keys-ingress-hpa", "llm-llmserve-api-keys", "api-keys.json"),
        ("static-discovery-existing-key-secret", "my-keys", "keys.json"),
    ]:
        rel = render_case(case)
        gateway = next(p for p in rel.pods() if p.role == "gateway")
        c = gateway.container("gateway")
        volume = next(v for v in gateway.spec["volumes"] if v["name"] == "api-keys")
        assert volume["secret"]["secretName"] == secret
        mount = next(m for m in c["volumeMounts"] if m["name"] == "api-keys")
        assert mount["readOnly"] is True
        assert env_of(c)["GATEWAY_API_KEYS_FILE"] == f"{mount['mountPath']}/{key}"


def test_api_keys_secret_is_a_keys_file_the_gateway_loads(render_case: Any, tmp_path: Path) -> None:
    """The Secret's content goes through the gateway's own loader, as the pod would read it."""
    values = render_case("dns-discovery-api-keys-ingress-hpa").values["gateway"]["apiKeys"]
    created = render_case("dns-discovery-api-keys-ingress-hpa").one(
        "Secret", "llm-llmserve-api-keys"
    )
    path = tmp_path / "api-keys.json"
    path.write_text(created["stringData"]["api-keys.json"], encoding="utf-8")
    store = load_keys(path)
    by_tenant = {k.tenant: k for k in store.tenants()}
    assert sorted(by_tenant) == sorted(e["tenant"] for e in values["keys"])
    for entry in values["keys"]:
        key = by_tenant[entry["tenant"]]
        assert key.digest == bytes.fromhex(entry["sha256"])
        for field in ("rpm", "tpm", "priority", "max_priority", "weight"):
            if field in entry:
                assert getattr(key, field) == entry[field], (entry["tenant"], field)
    found = store.lookup(DEMO_API_KEY.encode())
    assert found is not None and found.tenant == "beta"
    assert store.lookup(b"sk-not-a-key") is None


def test_gateway_discovery_settings(render_case: Any) -> None:
    dns = render_case("dns-discovery-api-keys-ingress-hpa")
    env = env_of(next(p for p in dns.pods() if p.role == "gateway").container("gateway"))
    assert env["GATEWAY_DNS_NAME"] == f"{WORKERS_SERVICE}.{NAMESPACE}.svc.cluster.local"
    assert env["GATEWAY_RETRIES"] == "2" and env["GATEWAY_TIMEOUTS__FIRST_BYTE_S"] == "300"
    assert "replicas" not in dns.one("Deployment", "llm-llmserve-gateway")["spec"]  # the HPA's
    static = render_case("static-discovery-existing-key-secret")
    env = env_of(next(p for p in static.pods() if p.role == "gateway").container("gateway"))
    assert env["GATEWAY_BACKENDS"] == '["http://10.0.0.7:8000","http://10.0.0.8:8000"]'


# --- network policies -------------------------------------------------------------------------


def _policies_for(pod: Pod, release: Release) -> list[Manifest]:
    return [
        np
        for np in release.of_kind("NetworkPolicy")
        if selector_matches(
            np["spec"]["podSelector"].get("matchLabels", {}), pod.metadata["labels"]
        )
    ]


def test_every_pod_is_covered_by_a_network_policy(release: Release) -> None:
    for pod in release.pods():
        policies = _policies_for(pod, release)
        assert policies and all(p["spec"]["policyTypes"] == ["Ingress"] for p in policies), pod.name


def _scrapers(release: Release) -> list[dict[str, Any]]:
    return release.values.get("networkPolicy", {}).get("metricsFrom") or [
        {
            "namespaceSelector": {},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
        }
    ]


def test_scrapers_reach_the_gateways_probe_port_and_only_they(release: Release) -> None:
    """The ServiceMonitor scrapes the probe listener (port `probes`): the policy must let the
    scrapers in there, and nobody else."""
    gateway = next(p for p in release.pods() if p.role == "gateway")
    (policy,) = _policies_for(gateway, release)
    rules = [r for r in policy["spec"]["ingress"]
             if {"port": "probes", "protocol": "TCP"} in r["ports"]]
    assert [r["from"] for r in rules] == [_scrapers(release)]
    assert all(r["ports"] == [{"port": "probes", "protocol": "TCP"}] for r in rules)


def test_workers_accept_traffic_only_from_gateway_pool_and_scrapers(release: Release) -> None:
    gateway = {
        "app.kubernetes.io/name": "llmserve",
        "app.kubernetes.io/instance": "llm",
        "app.kubernetes.io/component": "gateway",
    }
    scrapers = _scrapers(release)
    for pod in release.worker_pods():
        (policy,) = _policies_for(pod, release)
        rules = policy["spec"]["ingress"]
        api, *pool_rules = rules
        assert api["ports"] == [{"port": "http", "protocol": "TCP"}]
        # With the gateway in EPP mode, also the Gateway API data plane (networkPolicy.workerFrom).
        data_plane = release.values.get("networkPolicy", {}).get("workerFrom", [])
        assert api["from"] == [{"podSelector": {"matchLabels": gateway}}, *scrapers, *data_plane]
        pool = pod.metadata["labels"]["llmserve.io/pool"]
        if pod.role == "single":
            assert pool_rules == []
        else:
            # All ports, but only between the pods of the same pool.
            (peers,) = pool_rules
            assert "ports" not in peers
            (peer,) = peers["from"]
            assert peer["podSelector"]["matchLabels"]["llmserve.io/pool"] == pool
            assert "namespaceSelector" not in peer
    for pod in release.pods():
        if pod.role == "fetch":
            (policy,) = _policies_for(pod, release)
            assert "ingress" not in policy["spec"]  # nothing may connect to the puller


_ACME_1, _ACME_2 = "1" * 64, "2" * 64


@pytest.mark.parametrize(("first", "second", "agree"), [
    ({"rpm": 600, "tpm": 200000}, {"rpm": 600, "tpm": 200000}, True),  # a key rotation
    ({"rpm": 600}, {"rpm": 600.0, "weight": 1}, True),  # the same values, spelled otherwise
    ({"rpm": 600}, {"rpm": 1000}, False),
    ({"rpm": 600}, {}, False),  # unset is unlimited, not "as the other key"
    ({}, {"weight": 2}, False),  # the weight defaults to 1
    ({"priority": "low"}, {"priority": "high"}, False),
    ({"max_priority": "high"}, {}, False),
])
def test_the_chart_refuses_the_tenant_limits_the_gateway_refuses(
        first: dict[str, Any], second: dict[str, Any], agree: bool, tmp_path: Path) -> None:
    """A tenant's keys share its limits (gateway/flow/keys.py): a keys list the gateway would
    refuse at start-up (a CrashLoop) fails the render instead, and one it loads renders."""
    keys = [{"tenant": "acme", "sha256": _ACME_1, **first},
            {"tenant": "acme", "sha256": _ACME_2, **second}]
    assert gateway_loads_keys(keys, tmp_path / "keys.json") is agree
    values = {"gateway": {"apiKeys": {"enabled": True, "keys": keys}}}
    if agree:
        render(values)
    else:
        with pytest.raises(helm_python.HelmError, match='keys of tenant "acme" differ'):
            render(values)
