"""API-key auth through a real gateway: OpenAI-shaped 401s, probes open, keys never logged."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tests import loopback
from tests.gateway.conftest import UpstreamFactory, run_gateway, url_of, write_keys
from tests.openai_error import openai_error

KEY = "sk-test-7f3a9c"
BODY = {"model": "demo", "prompt": "hi", "max_tokens": 2}


@pytest.fixture
def keys_file(tmp_path: Path) -> Path:
    return write_keys(tmp_path, {KEY: {"tenant": "acme"}})


def test_auth(upstreams: UpstreamFactory, keys_file: Path, caplog: pytest.LogCaptureFixture) -> None:
    up = upstreams()
    caplog.set_level(logging.DEBUG)
    with run_gateway(backends=[url_of(up)], api_keys_file=keys_file) as gw:
        ok = loopback.post(gw.url + "/v1/completions", json=BODY,
                        headers={"Authorization": f"Bearer {KEY}"})
        assert ok.status_code == 200, ok.text
        assert ok.json()["choices"][0]["text"]

        for headers in ({}, {"Authorization": "Bearer sk-wrong-key"},
                        {"Authorization": f"Basic {KEY}"}):
            r = loopback.post(gw.url + "/v1/completions", json=BODY, headers=headers)
            assert r.status_code == 401
            err = openai_error(r.content)
            assert err["code"] == "invalid_api_key" and err["type"] == "invalid_request_error"
            assert "sk-" not in r.text
        assert loopback.get(gw.url + "/v1/models").status_code == 401
        assert loopback.get(gw.url + "/v1/models",
                         headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
        # Probes and Prometheus carry no key.
        for path in ("/health", "/ready", "/metrics"):
            assert loopback.get(gw.url + path).status_code == 200
        assert 'llmserve_tenant_requests_total{tenant="acme"} 1.0' in loopback.get(
            gw.url + "/metrics").text
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert KEY not in logged and "sk-wrong-key" not in logged


def test_no_keys_file_means_auth_off(upstreams: UpstreamFactory) -> None:
    up = upstreams()
    with run_gateway(backends=[url_of(up)]) as gw:
        assert loopback.post(gw.url + "/v1/completions", json=BODY).status_code == 200


def test_engine_endpoints_outside_v1_need_a_key_too(upstreams: UpstreamFactory,
                                                     keys_file: Path) -> None:
    # /tokenize, /pooling, /invocations... spend the engines' time as /v1 does; /version and
    # /ping are the engine's liveness, open as vLLM leaves them.
    up = upstreams(echo_other=True)
    key = {"Authorization": f"Bearer {KEY}"}
    with run_gateway(backends=[url_of(up)], api_keys_file=keys_file) as gw:
        for path in ("/tokenize", "/pooling", "/classify", "/score", "/rerank", "/v2/rerank",
                     "/invocations", "/detokenize"):
            assert loopback.post(gw.url + path, json={"model": "demo"}).status_code == 401, path
            assert loopback.post(gw.url + path, json={"model": "demo"},
                                 headers=key).status_code == 200, path
        for path in ("/version", "/ping"):
            assert loopback.get(gw.url + path).status_code == 200
        # Counted against the key like a completion.
        assert gw.metric('llmserve_tenant_requests_total{tenant="acme"}') == 8
