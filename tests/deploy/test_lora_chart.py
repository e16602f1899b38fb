"""A pool's LoRA adapters through the chart (templates/_adapters.tpl): each adapter fetched once
for its pool's model, waited for by the init container, loaded by the worker at start with the
flags the values ask for, and the gateway told each model's --max-loras and the admin key."""

from __future__ import annotations

import json
from typing import Any

import helm_python
import pytest

from tests.deploy.conftest import RenderCase
from tests.deploy.manifests import Release, env_of, render
from tests.deploy.test_worker_argv import HOST, flags, gateway_settings, settings_from
from worker.argv import RUNTIME_LORA_ENV, build_command

pytestmark = pytest.mark.helm

CASE = "lora-adapters"


@pytest.fixture(scope="module")
def rel(render_case: RenderCase) -> Release:
    return render_case(CASE)


def adapter_jobs(rel: Release) -> dict[str, dict[str, Any]]:
    return {j["metadata"]["labels"]["llmserve.io/adapter"]: j for j in rel.of_kind("Job")
            if "llmserve.io/adapter" in j["metadata"]["labels"]}


def test_each_adapter_is_fetched_once_for_its_base(rel: Release) -> None:
    jobs = adapter_jobs(rel)
    assert sorted(jobs) == ["chat", "sql", "sql-70b"]
    commands = {n: j["spec"]["template"]["spec"]["containers"][0]["command"]
                for n, j in jobs.items()}
    assert commands["sql"] == ["python3", "-m", "model_store", "pull", "--base-model", "SmolLM2",
                               "s3://models/adapters/sql/v1", "/models/adapters/sql/v1"]
    assert commands["chat"][-1] == "/models/adapters/chat/r3"  # an explicit revision
    assert commands["sql-70b"][5] == "demo-model"
    # The puller's S3 settings, exactly as the model's S3 fetch gets them.
    (model_job,) = [j for j in rel.of_kind("Job")
                    if j["metadata"]["labels"].get("llmserve.io/model") == "demo-model"]

    def env(job: dict[str, Any]) -> list[dict[str, Any]]:
        return list(job["spec"]["template"]["spec"]["containers"][0]["env"])

    assert env(jobs["sql"]) == env(model_job) and any(e["name"] == "AWS_REGION"
                                                      for e in env(model_job))


def test_workers_wait_for_and_load_their_adapters(
    rel: Release, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs = adapter_jobs(rel)
    dests = {n: j["spec"]["template"]["spec"]["containers"][0]["command"][-1]
             for n, j in jobs.items()}
    by_pool = {p.metadata["labels"]["llmserve.io/pool"]: p for p in rel.worker_pods()}
    smol = by_pool["smol"]
    (init,) = smol.spec["initContainers"]
    assert init["command"][-3:] == ["/models/SmolLM2/main", dests["sql"], dests["chat"]]
    settings = settings_from(env_of(smol.container("worker")), monkeypatch)
    command = build_command(settings, HOST)
    got = flags(command.argv)
    assert got["--enable-lora"] is True and got["--max-loras"] == "2"
    assert "--max-lora-rank" not in got  # derived at start from the adapters' ranks
    modules = command.argv[command.argv.index("--lora-modules") + 1:][:2]
    assert {m["name"]: m["path"] for m in map(json.loads, modules)} == {
        "chat": dests["chat"], "sql": dests["sql"]}
    assert command.env[RUNTIME_LORA_ENV] == "True"

    runtime_only = settings_from(env_of(by_pool["smol-rt"].container("worker")), monkeypatch)
    got = flags(build_command(runtime_only, HOST).argv)
    assert got["--enable-lora"] is True and got["--max-loras"] == "1"
    assert got["--max-lora-rank"] == "32" and "--lora-modules" not in got
    assert by_pool["smol-rt"].spec["initContainers"][0]["command"][-1] == "/models/SmolLM2/main"

    plain = settings_from(env_of(by_pool["tp2"].container("worker")), monkeypatch)
    assert flags(build_command(plain, HOST).argv)["--max-loras"] == "4"


def test_the_gateway_knows_each_models_slots_and_the_admin_key(
    rel: Release, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = gateway_settings(rel, monkeypatch)
    # SmolLM2 is served by a pool with 2 adapters and a runtime-only pool (1): the smaller.
    assert settings.lora.max_loras == {"SmolLM2": 1, "demo-model": 4}
    assert settings.admin_digest == bytes.fromhex("b" * 64) and settings.admin_key is None


def test_no_lora_no_lora_env(render_case: RenderCase) -> None:
    rel = render_case("gpu-tp2-dp3")
    for pod in rel.worker_pods():
        assert not [n for n in env_of(pod.container("worker")) if "LORA" in n]
    gateway = next(p for p in rel.pods() if p.role == "gateway")
    assert not [n for n in env_of(gateway.container("gateway"))
                if "LORA" in n or "ADMIN" in n]


@pytest.mark.parametrize(("lora", "fragment"), [
    ({"adapters": [{"name": "a", "s3": "s3://models/a/v1"}, {"name": "a", "s3": "s3://models/a/v2"}]},
     '"a" is listed twice'),
    ({"adapters": [{"name": "demo-model", "s3": "s3://models/a/v1"}]}, "the pool's own model name"),
    ({"adapters": [{"name": "bad name", "s3": "s3://models/a/v1"}]},
     "/models/0/lora/adapters/0/name"),
    ({"maxLoraRank": 12}, "/models/0/lora/maxLoraRank"),
])
def test_bad_lora_values_are_refused(lora: dict[str, Any], fragment: str) -> None:
    with pytest.raises(helm_python.HelmError) as err:
        render({"models": [{"name": "p", "model": "demo-model", "source": {"s3": "s3://models/d/main"},
                            "lora": lora}]})
    assert fragment in str(err.value)


def test_one_adapter_two_bases_is_refused() -> None:
    pool = {"source": {"s3": "s3://models/d/main"},
            "lora": {"adapters": [{"name": "a", "s3": "s3://models/a/v1"}]}}
    with pytest.raises(helm_python.HelmError) as err:
        render({"models": [{"name": "p", "model": "m1", **pool},
                           {"name": "q", "model": "m2", **pool}]})
    assert "another source or base model" in str(err.value)


def test_admin_key_from_a_secret(render_case: RenderCase) -> None:
    rel = render({"gateway": {"adminKey": {"existingSecret": "admin", "secretKey": "k"}}})
    gateway = next(p for p in rel.pods() if p.role == "gateway")
    (entry,) = [e for e in gateway.container("gateway")["env"]
                if e["name"] == "GATEWAY_ADMIN_KEY"]
    assert entry["valueFrom"]["secretKeyRef"] == {"name": "admin", "key": "k"}
