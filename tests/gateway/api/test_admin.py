"""LoRA adapters through a real gateway in front of fake replicas (tests/gateway/lora_upstream.py):
the admin API, adapters kept on every replica across restarts, /v1/models with parents, routing
by model, errors in OpenAI's shape and bounded metric labels."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.flow.keys import hash_key
from tests import loopback
from tests.gateway.conftest import RunningGateway, run_gateway, write_keys
from tests.gateway.lora_upstream import LoraReplica, serve
from tests.waiting import wait_for

KEY = "admin-key-0123456789"
BASE = "base-model"
AUTH = {"authorization": f"Bearer {KEY}"}


@pytest.fixture
def replicas() -> Iterator[tuple[LoraReplica, ...]]:
    with serve(LoraReplica("r0", declared={"sql": "/models/adapters/sql/v1"}),
               LoraReplica("r1", declared={"sql": "/models/adapters/sql/v1"})) as rs:
        yield rs


@pytest.fixture
def gateway(replicas: tuple[LoraReplica, ...]) -> Iterator[RunningGateway]:
    # Slots for every adapter of these tests: requests spread by load (residency is below).
    with run_gateway(backends=[r.url for r in replicas], admin_key=KEY, health_interval_s=0.1,
                     lora={"max_loras": {BASE: 4}}) as gw:
        yield gw


def chat(gw: RunningGateway, model: str, stream: bool = False,
         headers: dict[str, str] | None = None) -> httpx.Response:
    return loopback.post(gw.url + "/v1/chat/completions", headers=headers, timeout=10, json={
        "model": model, "messages": [{"role": "user", "content": "hi"}], "stream": stream})


def answer(resp: httpx.Response) -> str:
    assert resp.status_code == 200, resp.text
    return str(resp.json()["choices"][0]["message"]["content"])


def models(gw: RunningGateway) -> dict[str, dict[str, object]]:
    return {m["id"]: m for m in loopback.get(gw.url + "/v1/models").json()["data"]}


def add(gw: RunningGateway, **body: str) -> httpx.Response:
    return loopback.post(gw.url + "/admin/adapters", headers=AUTH, json=body, timeout=10)


# --- the admin key ----------------------------------------------------------------------------


def test_the_admin_api_needs_its_key(gateway: RunningGateway) -> None:
    for headers, message in [({}, "needs the admin key"),
                             ({"authorization": "Bearer wrong-key-0123456789"}, "Incorrect"),
                             ({"authorization": f"Basic {KEY}"}, "needs the admin key")]:
        r = loopback.get(gateway.url + "/admin/adapters", headers=headers)
        assert r.status_code == 401
        err = r.json()["error"]
        assert err["code"] == "invalid_api_key" and message in err["message"]
        assert KEY not in r.text
    assert loopback.get(gateway.url + "/admin/adapters", headers=AUTH).status_code == 200


def test_no_admin_key_no_admin_api(replicas: tuple[LoraReplica, ...]) -> None:
    with run_gateway(backends=[r.url for r in replicas]) as gw:
        r = loopback.get(gw.url + "/admin/adapters", headers=AUTH)
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


def test_the_key_by_its_digest(replicas: tuple[LoraReplica, ...]) -> None:
    with run_gateway(backends=[r.url for r in replicas],
                     admin_key_sha256=hash_key(KEY).upper()) as gw:
        assert loopback.get(gw.url + "/admin/adapters", headers=AUTH).status_code == 200
        wrong = {"authorization": "Bearer " + hash_key(KEY)}  # the digest is not the key
        assert loopback.get(gw.url + "/admin/adapters", headers=wrong).status_code == 401


# --- adapters declared by the pool --------------------------------------------------------------


def test_declared_adapters_are_listed_with_their_base_and_routed(
    gateway: RunningGateway, replicas: tuple[LoraReplica, ...]
) -> None:
    listed = models(gateway)
    assert listed["sql"]["parent"] == BASE and listed[BASE].get("parent") is None
    served = {answer(chat(gateway, "sql")) for _ in range(6)}
    assert served == {"sql@r0", "sql@r1"}
    assert answer(chat(gateway, BASE)).startswith(f"{BASE}@")
    streamed = chat(gateway, "sql", stream=True)
    assert streamed.status_code == 200 and '"content":"sql@r' in streamed.text
    missing = chat(gateway, "no-such-adapter")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "model_not_found"
    metrics = loopback.get(gateway.url + "/metrics").text
    assert f'llmserve_adapter_info{{adapter="sql",base="{BASE}"}} 1.0' in metrics
    assert 'model="sql"' in metrics  # per-adapter requests, tokens and TTFT
    assert "no-such-adapter" not in metrics  # a made-up name never becomes a label value


# --- adapters added at run time ---------------------------------------------------------------


def test_an_added_adapter_loads_everywhere_and_survives_a_restart(
    gateway: RunningGateway, replicas: tuple[LoraReplica, ...]
) -> None:
    r = add(gateway, name="chat", base=BASE, path="/models/adapters/chat/v3")
    assert r.status_code == 200, r.text
    assert set(r.json()["replicas"].values()) == {"loaded"}
    assert all("chat" in x.loaded for x in replicas)
    assert models(gateway)["chat"]["parent"] == BASE  # routed at once, no probe period to wait
    assert {answer(chat(gateway, "chat")) for _ in range(6)} == {"chat@r0", "chat@r1"}
    listing = loopback.get(gateway.url + "/admin/adapters", headers=AUTH).json()["data"]
    by_name = {a["name"]: a for a in listing}
    assert by_name["chat"]["source"] == "admin" and len(by_name["chat"]["replicas"]) == 2
    assert by_name["sql"]["source"] == "replicas"

    # r1 restarts: it comes back with its declared adapters only; the gateway loads "chat" again.
    r1 = replicas[1]
    r1.restart(down_s=0.5)
    wait_for(lambda: r1.down)
    wait_for(lambda: not r1.down)
    wait_for(lambda: "chat" in r1.loaded)
    assert r1.loads == ["chat", "chat"] and replicas[0].loads == ["chat"]
    wait_for(lambda: "chat@r1" in {answer(chat(gateway, "chat")) for _ in range(4)})
    assert gateway.metric("llmserve_adapter_loads_total") == 3


def test_a_removed_adapter_is_gone_everywhere_and_stays_gone(
    gateway: RunningGateway, replicas: tuple[LoraReplica, ...]
) -> None:
    assert add(gateway, name="chat", base=BASE, path="/models/adapters/chat/v3").status_code == 200
    r = loopback.delete(gateway.url + "/admin/adapters/chat", headers=AUTH)
    assert r.status_code == 200 and set(r.json()["replicas"].values()) == {"unloaded"}
    assert not any("chat" in x.loaded for x in replicas)
    assert chat(gateway, "chat").json()["error"]["code"] == "model_not_found"
    replicas[0].restart(down_s=0.3)
    wait_for(lambda: replicas[0].down)
    wait_for(lambda: models(gateway).get(BASE, {}).get("llmserve", {}).get("replicas") == 2)
    # Three probe rounds of the replica since it came back: reconcile rounds that had it to
    # re-apply "chat" to, had the removal not been kept.
    seen = replicas[0].listed
    wait_for(lambda: replicas[0].listed >= seen + 3)
    assert "chat" not in replicas[0].loaded and replicas[0].loads == ["chat"]
    again = loopback.delete(gateway.url + "/admin/adapters/chat", headers=AUTH)
    assert again.status_code == 404 and again.json()["error"]["code"] == "model_not_found"


@pytest.mark.parametrize(("body", "status", "code", "param"), [
    ({"name": "x", "base": BASE}, 400, None, "path"),
    ({"name": "x y", "base": BASE, "path": "/models/a"}, 400, None, "name"),
    ({"name": "x", "base": "nope", "path": "/models/a"}, 404, "model_not_found", "base"),
    ({"name": "x", "base": "sql", "path": "/models/a"}, 404, "model_not_found", "base"),
    ({"name": BASE, "base": BASE, "path": "/models/a"}, 400, None, "name"),
    ({"name": "x", "base": BASE, "path": "models/a"}, 400, None, "path"),
    ({"name": "sql", "base": BASE, "path": "/models/other"}, 400, None, "name"),
    ({"name": "x", "base": BASE, "path": "/models/missing"}, 400, None, "path"),
])
def test_bad_adds_are_refused_in_openai_shape(
    gateway: RunningGateway, body: dict[str, str], status: int, code: str | None, param: str
) -> None:
    r = add(gateway, **body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error"
    if code:
        assert err["code"] == code
    assert "x" not in models(gateway)


def test_not_json_is_a_400(gateway: RunningGateway) -> None:
    r = loopback.post(gateway.url + "/admin/adapters", headers=AUTH, content=b"{not json")
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


# --- residency -------------------------------------------------------------------------------


def test_with_more_adapters_than_slots_each_stays_where_it_is_resident(
    replicas: tuple[LoraReplica, ...]
) -> None:
    with run_gateway(backends=[r.url for r in replicas], admin_key=KEY) as gw:
        assert add(gw, name="chat", base=BASE, path="/models/adapters/chat/v3").status_code == 200
        # Two adapters, one slot per replica (--max-loras 1): each adapter keeps to one replica.
        sql = {answer(chat(gw, "sql")) for _ in range(5)}
        other = {answer(chat(gw, "chat")) for _ in range(5)}
        assert len(sql) == 1 and len(other) == 1
        assert sql.pop().split("@")[1] != other.pop().split("@")[1]
        assert gw.metric(f'llmserve_adapter_residency_total{{base="{BASE}",outcome="hit"}}') == 8


# --- tenants ------------------------------------------------------------------------------------


def test_key_limits_and_tenant_accounting_apply_to_adapters(
    replicas: tuple[LoraReplica, ...], tmp_path: Path
) -> None:
    keys = write_keys(tmp_path, {"k-acme": {"tenant": "acme", "rpm": 3}})
    with run_gateway(backends=[r.url for r in replicas], api_keys_file=keys) as gw:
        auth = {"authorization": "Bearer k-acme"}
        statuses = [chat(gw, m, headers=auth).status_code for m in ("sql", BASE, "sql", "sql")]
        # One key's limit, whatever model or adapter each request named.
        assert statuses == [200, 200, 200, 429]
        assert gw.metric('llmserve_tenant_adapter_tokens_total{adapter="sql",kind="output",'
                         'tenant="acme"}') == 6
        assert gw.metric('llmserve_tenant_tokens_total{kind="output",tenant="acme"}') == 9
        # Admitted with the base model's pool: one pool per engine set, not one per adapter.
        assert 'llmserve_queue_time_seconds_count{pool="sql"}' not in loopback.get(
            gw.url + "/metrics").text
        assert gw.metric(f'llmserve_queue_time_seconds_count{{pool="{BASE}"}}') == 3
