"""One rule, one answer: the same values through the chart's render (Helm's SDK, schema and
templates) and through the Python that loads what the chart renders (the gateway's settings and
keys file, the worker's settings, model_store's URL parser). Each table row is a value a user may
give; the chart accepts it exactly when the component it configures starts with what was
rendered, and refuses it otherwise (issue 37, items 1-3).

The chart's schema is generated from that Python (deploy/helm/values_schema.py); these tests are
what shows the generation says the same thing."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml
from pydantic import ValidationError

from gateway.flow.keys import KeyStore, load_keys
from gateway.settings import ADMIN_KEY_MIN, GatewaySettings, declared_adapters, wake_budgets
from model_store.errors import UsageError
from model_store.s3url import S3Url
from tests.deploy.conftest import gateway_loads_keys
from tests.deploy.manifests import REPO, Release, env_of, render
from worker import rules
from worker.settings import WorkerSettings

pytestmark = pytest.mark.helm

DIGEST = "ab" * 32
S3 = {"s3": "s3://models/demo-model/main"}
KEDA = {"workerDefaults": {"autoscaling": {"prometheusAddress": "http://prom:9090"}},
        "metrics": {"serviceMonitor": {"enabled": True}}}


def _pool(name: str = "p", **extra: Any) -> dict[str, Any]:
    return {"name": name, "model": "demo-model", "source": S3, **extra}


@contextlib.contextmanager
def _environ(env: Mapping[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v


def chart_renders(values: dict[str, Any], chart: helm_python.Chart) -> Release | None:
    """The release, or None when the chart refuses the values (schema or template)."""
    try:
        return render(values, loaded=chart)
    except helm_python.HelmError:
        return None


def gateway_env(rel: Release) -> dict[str, str]:
    (gw,) = [p for p in rel.pods() if p.role == "gateway"]
    return env_of(gw.container("gateway"))


def gateway_loads(env: Mapping[str, str]) -> GatewaySettings | None:
    """The gateway's settings from `env`, as `python -m gateway` builds them; None if refused."""
    with _environ(env):
        try:
            return GatewaySettings()
        except ValidationError:
            return None


def gateway_of(rel: Release) -> GatewaySettings:
    settings = gateway_loads(gateway_env(rel))
    assert settings is not None, "the chart rendered settings the gateway refuses"
    return settings


def both(values: dict[str, Any], chart: helm_python.Chart,
         python_accepts: bool) -> Release | None:
    """Render, and assert the chart agrees with the Python's verdict on the same values."""
    rel = chart_renders(values, chart)
    assert (rel is not None) is python_accepts, (
        f"chart {'accepts' if rel else 'refuses'} what the Python "
        f"{'accepts' if python_accepts else 'refuses'}: {json.dumps(values)}")
    return rel


# --- S3 URLs (model_store/s3url.py) -------------------------------------------------------------

URLS = [
    "s3://models/demo-model/main", "s3://models", "s3://models/", "s3://a.b-c/x/y/",
    "s3://ab-/m",  # the issue's: a bucket may not end in '-'
    "s3://ab/m", "s3://" + "b" * 63 + "/m", "s3://" + "b" * 64 + "/m", "s3://Models/m",
    "s3://models//m", "s3://models/a//b", "s3://models///", "s3:/models/m", "http://models/m",
    "s3://-ab/m", "s3://models/a b",
]


def _parses(url: str) -> S3Url | None:
    try:
        return S3Url.parse(url)
    except UsageError:
        return None


@pytest.mark.parametrize("url", URLS)
def test_a_model_source_url_renders_iff_model_store_parses_it(
    url: str, loaded_chart: helm_python.Chart,
) -> None:
    rel = both({"models": [_pool(source={"s3": url})]}, loaded_chart, _parses(url) is not None)
    if rel is not None:
        (job,) = [j for j in rel.of_kind("Job") if "fetch" in j["metadata"]["name"]]
        args = job["spec"]["template"]["spec"]["containers"][0]["command"]
        assert any(str(_parses(a)) == str(_parses(url)) for a in args if a.startswith("s3://"))


@pytest.mark.parametrize("url", URLS)
def test_an_adapter_url_renders_iff_it_parses_to_a_prefix_under_its_bucket(
    url: str, loaded_chart: helm_python.Chart,
) -> None:
    parsed = _parses(url)
    adapter = {"name": "chat", "s3": url, "revision": "v1"}
    both({"models": [_pool(lora={"adapters": [adapter]})]}, loaded_chart,
         parsed is not None and parsed.prefix != "")


# --- the longest stream (gateway timeouts.total_s, drains, grace periods) ----------------------

@pytest.mark.parametrize("seconds", [60, 119, 120, 300, 900, 3600])
def test_max_stream_seconds_is_the_gateways_total_and_bounds_every_drain(
    seconds: int, loaded_chart: helm_python.Chart,
) -> None:
    # What the gateway takes as its longest request, with its other timeouts at their defaults.
    python = gateway_loads({"GATEWAY_TIMEOUTS__TOTAL_S": str(seconds)})
    rel = both({"maxStreamSeconds": seconds, "models": [_pool()]}, loaded_chart,
               python is not None)
    if rel is None:
        return
    settings = gateway_of(rel)
    assert settings.timeouts.total_s == seconds
    assert settings.drain_timeout_s == seconds
    for pod in rel.pods():
        if pod.role not in ("gateway", "single"):
            continue
        main = pod.container("gateway" if pod.role == "gateway" else "worker")
        sleep = int(main["lifecycle"]["preStop"]["exec"]["command"][1])
        # The grace period lets the longest stream the gateway allows end after the preStop.
        assert pod.spec["terminationGracePeriodSeconds"] >= sleep + seconds, pod.name
        if pod.role == "single":
            assert float(env_of(main)["WORKER_DRAIN_TIMEOUT_S"]) == seconds


DRAINS = [(300, None), (300, 300), (300, 299), (300, 900), (900, 90), (120, 0), (3600, 3600)]


@pytest.mark.parametrize(("seconds", "drain"), DRAINS)
def test_a_gateway_drain_renders_iff_the_gateway_takes_it_beside_the_longest_stream(
    seconds: int, drain: int | None, loaded_chart: helm_python.Chart,
) -> None:
    """One value bounds both: a drain shorter than maxStreamSeconds would cut streams the
    gateway lets run, so the chart and the gateway refuse it alike; unset, it is the total."""
    env = {"GATEWAY_TIMEOUTS__TOTAL_S": str(seconds),
           **({"GATEWAY_DRAIN_TIMEOUT_S": str(drain)} if drain is not None else {})}
    python = gateway_loads(env)
    rel = both({"maxStreamSeconds": seconds, "gateway": {"drainTimeoutSeconds": drain}},
               loaded_chart, python is not None)
    if rel is not None:
        assert python is not None
        assert gateway_of(rel).drain_s == python.drain_s == (seconds if drain is None else drain)


@pytest.mark.parametrize(("seconds", "drain"), DRAINS)
@pytest.mark.parametrize("where", ["workerDefaults", "pool"])
def test_a_worker_drain_below_the_longest_stream_is_refused_naming_both(
    seconds: int, drain: int | None, where: str, loaded_chart: helm_python.Chart,
) -> None:
    """The workers' drain, as the gateway's: the gateway's rule (it refuses the same pair) is the
    verdict; the worker itself does not know the gateway's total."""
    python = gateway_loads({"GATEWAY_TIMEOUTS__TOTAL_S": str(seconds),
                            **({"GATEWAY_DRAIN_TIMEOUT_S": str(drain)} if drain is not None
                               else {})})
    pool = _pool(**({"drainTimeoutSeconds": drain} if where == "pool" else {}))
    values: dict[str, Any] = {"maxStreamSeconds": seconds, "models": [pool]}
    if where == "workerDefaults":
        values["workerDefaults"] = {"drainTimeoutSeconds": drain}
    rel = both(values, loaded_chart, python is not None)
    if rel is None:
        with pytest.raises(helm_python.HelmError) as refused:
            render(values, loaded=loaded_chart)
        assert (f"drainTimeoutSeconds={drain} is shorter than maxStreamSeconds={seconds}"
                in str(refused.value))
        return
    (pod,) = rel.worker_pods()
    env = env_of(pod.container("worker"))
    assert float(env["WORKER_DRAIN_TIMEOUT_S"]) == (seconds if drain is None else drain)


def _gateway_env_names() -> list[str]:
    rules_tpl = (REPO / "deploy/helm/llmserve/templates/_rules.tpl").read_text()
    (line,) = [x for x in rules_tpl.splitlines() if '"llmserve.gateway.settings"' in x]
    return line.split("-}}")[1].split("{{-")[0].split()


def test_gateway_env_takes_exactly_the_gateways_settings(loaded_chart: helm_python.Chart) -> None:
    """gateway.env names what the gateway reads (every setting, a nested group whole or field by
    field), and nothing else: pydantic-settings ignores an unknown GATEWAY_* variable, so a typo
    would be dropped in silence (issue 37, item 7)."""
    names = _gateway_env_names()
    managed = (REPO / "deploy/helm/llmserve/templates/gateway/_env.tpl").read_text().split(
        '"llmserve.gateway.managedEnv" -}}\n')[1].split("\n")[0].split()
    assert set(managed) <= set(names), set(managed) - set(names)
    free = [n for n in names if n not in managed]
    settings = GatewaySettings()
    for name in free:
        # The setting's current value, as a string the gateway reads back.
        path = name.removeprefix("GATEWAY_").lower().split("__")
        value: Any = settings
        for part in path:
            value = getattr(value, part)
        if value is None:
            continue
        if hasattr(value, "model_dump_json"):
            text = value.model_dump_json()
        elif isinstance(value, (list, dict)):
            text = json.dumps(value)
        else:
            text = str(value)
        rel = both({"gateway": {"env": {name: text}}}, loaded_chart,
                   gateway_loads({name: text}) is not None)
        assert rel is not None, name
    for typo in ("GATEWAY_RETRYS", "GATEWAY_TIMEOUT__TOTAL_S"):
        assert gateway_loads({typo: "1"}) is not None  # the gateway would not notice
        assert chart_renders({"gateway": {"env": {typo: "1"}}}, loaded_chart) is None, typo
    # A nested group forbids unknown fields: both refuse.
    both({"gateway": {"env": {"GATEWAY_FLOW__MAX_LIMITS": "1"}}}, loaded_chart,
         gateway_loads({"GATEWAY_FLOW__MAX_LIMITS": "1"}) is not None)


def test_the_gateways_total_is_the_charts_to_set(loaded_chart: helm_python.Chart) -> None:
    for name in ("GATEWAY_TIMEOUTS__TOTAL_S", "GATEWAY_TIMEOUTS"):
        assert chart_renders({"gateway": {"env": {name: "60"}}}, loaded_chart) is None


# --- API keys and priorities (gateway/flow/keys.py) ---------------------------------------------

KEYS = [
    {},
    {"rpm": 600, "tpm": 200000, "priority": "high", "max_priority": "high", "weight": 2.5},
    {"rpm": None, "tpm": None, "priority": None},
    {"priority": "urgent"}, {"max_priority": "LOW"}, {"rpm": 0}, {"tpm": -1}, {"weight": 0},
    {"weight": 1000}, {"weight": 1001}, {"tenant": ""}, {"tenant": "a" * 64},
    {"tenant": "a" * 65}, {"tenant": "team a"}, {"tenant": "team:a.b_c-d"},
    {"sha256": "ab" * 31}, {"sha256": "zz" * 32}, {"sha256": "AB" * 32}, {"colour": "red"},
]


def keys_agree(keys: list[dict[str, Any]], tmp_path: Path,
               chart: helm_python.Chart) -> KeyStore | None:
    """Assert the chart renders `keys` exactly when the gateway loads them as its keys file; the
    keys the gateway loads from the chart's Secret, if rendered."""
    path = tmp_path / "keys.json"
    python = gateway_loads_keys(keys, path)
    rel = both({"gateway": {"apiKeys": {"enabled": True, "keys": keys}}}, chart, python)
    if rel is None:
        return None
    (secret,) = [s for s in rel.of_kind("Secret") if "api-keys" in s["metadata"]["name"]]
    path.write_text(secret["stringData"]["api-keys.json"], encoding="utf-8")
    return load_keys(path)


@pytest.mark.parametrize("entry", KEYS, ids=[json.dumps(k) for k in KEYS])
def test_a_key_entry_renders_iff_the_gateway_loads_the_keys_file(
    entry: dict[str, Any], tmp_path: Path, loaded_chart: helm_python.Chart,
) -> None:
    keys = [{"tenant": "acme", "sha256": DIGEST, **entry}]
    loaded = keys_agree(keys, tmp_path, loaded_chart)
    if loaded is not None:
        (key,) = loaded.tenants()
        assert key.tenant == keys[0]["tenant"]


# --- ports: the gateway's, its probe listener, the workers', the master port --------------------

PORTS = [(8000, 8081), (1, 65535), (8000, 8000), (0, 8081), (8000, 65536), (65535, 1)]


@pytest.mark.parametrize(("port", "probe"), PORTS)
def test_gateway_ports_render_iff_the_gateway_takes_them(
    port: int, probe: int, loaded_chart: helm_python.Chart,
) -> None:
    python = gateway_loads({"GATEWAY_PORT": str(port), "GATEWAY_EDGE__PROBE_PORT": str(probe)})
    rel = both({"gateway": {"port": port, "probePort": probe}}, loaded_chart, python is not None)
    if rel is not None:
        settings = gateway_of(rel)
        assert (settings.port, settings.edge.probe_port) == (port, probe)


@pytest.mark.parametrize(("port", "probe", "epp"), [
    (8000, 8081, 9002), (8000, 8081, 8081), (8000, 8081, 8000), (9002, 8081, 9003),
])
def test_epp_ports_render_iff_the_gateway_takes_them(
    port: int, probe: int, epp: int, loaded_chart: helm_python.Chart,
) -> None:
    """mode=epp (one endpoint picker per pool): the chart serves the EPP's /metrics on the probe
    port."""
    python = gateway_loads({"GATEWAY_MODE": "epp", "GATEWAY_PORT": str(port),
                            "GATEWAY_EDGE__PROBE_PORT": str(probe),
                            "GATEWAY_EPP__PORT": str(epp), "GATEWAY_EPP__METRICS_PORT": str(probe)})
    rel = both({"gateway": {"mode": "epp", "port": port, "probePort": probe, "eppPort": epp},
                "gatewayAPI": {"inferencePools": {"enabled": True}}, "models": [_pool()]},
               loaded_chart, python is not None)
    if rel is not None:
        settings = gateway_of(rel)
        assert (settings.epp.port, settings.epp.metrics_port) == (epp, probe)


def _worker_loads(env: Mapping[str, str]) -> WorkerSettings | None:
    with _environ(env):
        try:
            return WorkerSettings()
        except (ValidationError, ValueError):
            return None


@pytest.mark.parametrize(("port", "master"), [
    (8000, None), (8000, 29501), (29500, None), (8000, 8000), (0, None), (8000, 65536),
])
def test_worker_and_master_ports_render_iff_the_worker_takes_them(
    port: int, master: int | None, loaded_chart: helm_python.Chart,
) -> None:
    """A multi-node group's leader: the worker's port and the master port it opens (the default
    when unset), as WORKER_* the worker loads."""
    multi: dict[str, Any] = {"nodes": 2, **({"masterPort": master} if master else {})}
    # The leader of a 2-node group, as LeaderWorkerSet starts it.
    group = {"WORKER_NNODES": "2", "WORKER_NODE_RANK": "0", "WORKER_MASTER_ADDR": "leader",
             "WORKER_PIPELINE_PARALLEL_SIZE": "2", "WORKER_MODEL_PATH": "/models/m/main"}
    ports = {"WORKER_PORT": str(port), **({"WORKER_MASTER_PORT": str(master)} if master else {})}
    python = _worker_loads({**group, **ports})
    values = {"workerDefaults": {"port": port},
              "models": [_pool(pipelineParallelSize=2, multiNode=multi)]}
    rel = both(values, loaded_chart, python is not None)
    if rel is not None:
        (leader,) = [p for p in rel.worker_pods() if p.role == "leader"]
        loaded = _worker_loads({**env_of(leader.container("worker")), **group})
        assert loaded is not None and python is not None
        assert (loaded.port, loaded.master_port) == (python.port, python.master_port)


# --- GPUs per pod (worker/rules.py) -------------------------------------------------------------

@pytest.mark.parametrize(("tp", "pp", "nodes"), [
    (8, 1, 1), (1, 2, 1), (4, 2, 2), (2, 4, 2), (2, 3, 2), (1, 4, 4), (1, 6, 4), (2, 8, 16),
    (1, 17, 17),
])
def test_gpus_per_pod_are_the_layout_rules(
    tp: int, pp: int, nodes: int, loaded_chart: helm_python.Chart,
) -> None:
    multi = {"multiNode": {"nodes": nodes}} if nodes > 1 else {}
    python = nodes <= rules.MAX_GROUP_NODES and rules.group_problem(tp, pp, nodes) is None
    rel = both({"models": [_pool(tensorParallelSize=tp, pipelineParallelSize=pp, **multi)]},
               loaded_chart, python)
    if rel is not None:
        for pod in rel.worker_pods():
            gpus = pod.container("worker")["resources"]["limits"]["nvidia.com/gpu"]
            assert gpus == rules.pod_gpus(tp, pp, nodes), pod.name


# --- pools at zero: the wake budget and its limit, adapters (gateway/settings.py) --------------

@pytest.mark.parametrize("budget", [1, 600, 3600, 3601, 0])
def test_a_wake_budget_renders_iff_the_gateway_takes_it(
    budget: int, loaded_chart: helm_python.Chart,
) -> None:
    layout = [{"name": "p", "model": "demo-model", "scale_to_zero": True,
               "wake_budget_s": budget}]
    python = gateway_loads({"GATEWAY_POOLS": json.dumps(layout)})
    rel = both({**KEDA, "models": [_pool(autoscaling={
        "enabled": True, "minReplicas": 0, "wakeBudgetSeconds": budget})]},
        loaded_chart, python is not None)
    if rel is not None:
        assert wake_budgets(gateway_of(rel).pools) == {"demo-model": budget}


@pytest.mark.parametrize("autoscaling", [
    {"enabled": True, "minReplicas": 1, "wakeBudgetSeconds": 600},
    {"enabled": True, "minReplicas": 0, "wakeBudgetSeconds": 600},
    {"enabled": True, "minReplicas": 0},
    {"enabled": True, "minReplicas": 1},
])
def test_a_wake_budget_without_a_pool_at_zero_is_refused_by_both(
    autoscaling: dict[str, Any], loaded_chart: helm_python.Chart,
) -> None:
    at_zero = autoscaling["minReplicas"] == 0
    layout: dict[str, Any] = {"name": "p", "model": "demo-model", "scale_to_zero": at_zero}
    if "wakeBudgetSeconds" in autoscaling:
        layout["wake_budget_s"] = autoscaling["wakeBudgetSeconds"]
    python = gateway_loads({"GATEWAY_POOLS": json.dumps([layout])})
    both({**KEDA, "models": [_pool(autoscaling=autoscaling)]}, loaded_chart, python is not None)


@pytest.mark.parametrize(("adapter", "other_model"), [
    ("chat", "other-model"), ("other-model", "other-model"), ("demo-model", "other-model"),
])
def test_adapter_names_render_iff_the_gateway_takes_the_pools(
    adapter: str, other_model: str, loaded_chart: helm_python.Chart,
) -> None:
    layout = [{"name": "p", "model": "demo-model", "adapters": [adapter]},
              {"name": "q", "model": other_model}]
    python = gateway_loads({"GATEWAY_POOLS": json.dumps(layout)})
    lora = {"adapters": [{"name": adapter, "s3": "s3://models/adapters/a/v1"}]}
    rel = both({"models": [_pool(lora=lora),
                           _pool("q", model=other_model,
                                 source={"s3": f"s3://models/{other_model}/main"})]},
               loaded_chart, python is not None)
    if rel is not None:
        assert declared_adapters(gateway_of(rel).pools) == {adapter: "demo-model"}


# --- the admin key (gateway/settings.py) --------------------------------------------------------

@pytest.mark.parametrize("digest", [DIGEST, DIGEST.upper(), "ab" * 31, "zz" * 32, DIGEST + "0"])
def test_an_admin_key_digest_renders_iff_the_gateway_takes_it(
    digest: str, loaded_chart: helm_python.Chart,
) -> None:
    python = gateway_loads({"GATEWAY_ADMIN_KEY_SHA256": digest})
    rel = both({"gateway": {"adminKey": {"sha256": digest}}}, loaded_chart, python is not None)
    if rel is not None:
        assert gateway_of(rel).admin_digest == bytes.fromhex(digest)


def test_the_engine_port_is_stated_once(loaded_chart: helm_python.Chart) -> None:
    """8000 lives in worker/rules.py: the worker's default, the gateway's default for its
    backends, and (through the generated _rules.tpl) the chart's when workerDefaults.port is
    unset, as it is in values.yaml."""
    chart_values = yaml.safe_load((REPO / "deploy/helm/llmserve/values.yaml").read_text())
    assert chart_values["workerDefaults"]["port"] is None
    assert WorkerSettings.model_fields["port"].default == rules.ENGINE_PORT
    for name in ("dns_port", "k8s_port"):
        assert GatewaySettings.model_fields[name].default == rules.ENGINE_PORT
    rel = render({"models": [_pool()]}, loaded=loaded_chart)
    (pod,) = rel.worker_pods()
    assert env_of(pod.container("worker"))["WORKER_PORT"] == str(rules.ENGINE_PORT)
    assert gateway_of(rel).k8s_port == rules.ENGINE_PORT
    (service,) = [s for s in rel.of_kind("Service") if s["metadata"]["name"].endswith("workers")]
    assert [p["port"] for p in service["spec"]["ports"]] == [rules.ENGINE_PORT]


def test_no_preset_restates_a_default_the_chart_takes_from_the_python() -> None:
    """The worker's port and the master port come from worker/settings.py through _rules.tpl; a
    preset that writes the same number is a second home that would not follow a change."""
    defaults = {"port": WorkerSettings.model_fields["port"].default,
                "masterPort": WorkerSettings.model_fields["master_port"].default}
    for path in sorted((REPO / "deploy/helm/llmserve").glob("values*.yaml")):
        values = yaml.safe_load(path.read_text()) or {}
        restated = [k for k, v in (values.get("workerDefaults") or {}).items()
                    if k in defaults and defaults[k] == v]
        for pool in values.get("models") or []:
            restated += [k for k, v in (pool.get("multiNode") or {}).items()
                         if k in defaults and defaults[k] == v]
        assert not restated, (path.name, restated)


@pytest.mark.parametrize(("secret", "digest"), [("admin", ""), ("", DIGEST), ("admin", DIGEST)])
def test_an_admin_key_from_a_secret_or_a_digest_not_both(
    secret: str, digest: str, loaded_chart: helm_python.Chart,
) -> None:
    # The Secret's key as the gateway reads it (GATEWAY_ADMIN_KEY), at its shortest length.
    env = {**({"GATEWAY_ADMIN_KEY": "k" * ADMIN_KEY_MIN} if secret else {}),
           **({"GATEWAY_ADMIN_KEY_SHA256": digest} if digest else {})}
    python = gateway_loads(env)
    rel = both({"gateway": {"adminKey": {"existingSecret": secret, "sha256": digest}}},
               loaded_chart, python is not None)
    if rel is not None:
        (pod,) = [p for p in rel.pods() if p.role == "gateway"]
        names = {e["name"] for e in pod.container("gateway")["env"]}
        assert ("GATEWAY_ADMIN_KEY" in names) is bool(secret)
        assert ("GATEWAY_ADMIN_KEY_SHA256" in names) is bool(digest)


# --- a keys file's entries together: one key per tenant line, a tenant's keys share its limits ----

OTHER = "cd" * 32
PAIRS = [
    ({}, {}),
    ({"rpm": 60}, {"rpm": 60}),
    ({"rpm": 60}, {}),
    ({"rpm": None}, {}),
    ({"tpm": None, "priority": None}, {"max_priority": None}),
    ({"weight": 1}, {}),
    ({"weight": 1.0}, {"weight": 1}),
    ({"weight": 2}, {"weight": 2.0}),
    ({"priority": "high"}, {"priority": "low"}),
    ({"max_priority": "high"}, {}),
    ({"tenant": "beta"}, {"rpm": 5}),
    ({"sha256": DIGEST}, {}),
    ({"sha256": DIGEST, "tenant": "beta"}, {}),
    ({"sha256": DIGEST.upper()}, {}),
]


@pytest.mark.parametrize(("first", "second"), PAIRS, ids=[json.dumps(p) for p in PAIRS])
def test_two_keys_render_iff_the_gateway_loads_them_together(
    first: dict[str, Any], second: dict[str, Any], tmp_path: Path,
    loaded_chart: helm_python.Chart,
) -> None:
    keys = [{"tenant": "acme", "sha256": OTHER, **first}, {"tenant": "acme", "sha256": DIGEST,
                                                           **second}]
    loaded = keys_agree(keys, tmp_path, loaded_chart)
    if loaded is not None:
        assert len(loaded.tenants()) == 2
