from __future__ import annotations

import logging
import time

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from gateway.errors import (
    RateLimitedLog,
    Unavailable,
    install_handlers,
    upstream_error_body,
)
from tests import loopback
from tests.gateway.conftest import UpstreamFactory, run_gateway, url_of
from tests.openai_error import openai_error


def shape(body: bytes) -> dict[str, object]:
    """The gateway's own error object: an OpenAI one whose code is null or a string."""
    err = openai_error(body)
    assert err["code"] is None or isinstance(err["code"], str)
    return err


@pytest.mark.parametrize("body", [
    b'{"error": {"message": "bad", "type": "BadRequestError", "param": null, "code": 400}}',
    b'{"object": "error", "message": "old", "type": "BadRequestError", "code": 400}',
    b'{"error":{"message":"m","code":400}}',
    b'{"detail":"Not Found"}',  # FastAPI's, for a path the engine does not serve
])
def test_engine_error_objects_are_relayed_as_they_are(body: bytes) -> None:
    assert upstream_error_body(400, body, RateLimitedLog(logging.getLogger("test"))) is None


@pytest.mark.parametrize("body", [
    b"<html><body>nginx at 10.0.0.7</body></html>", b"", b"[1]", b'{"x": "y"}'])
def test_other_upstream_bodies_become_the_gateways_error(body: bytes) -> None:
    own = upstream_error_body(500, body, RateLimitedLog(logging.getLogger("test")))
    assert own is not None and shape(own)["message"] == "upstream returned HTTP 500"


def test_an_engine_error_reaches_the_client_byte_for_byte(upstreams: UpstreamFactory) -> None:
    # vLLM's integer code and its spacing, unchanged (the gateway used to make code "400").
    body = '{"error":{"message":"bad","type":"BadRequestError","param":"n","code":400}}'
    up = upstreams(fail_status=400, fail_body=body)
    with run_gateway(backends=[url_of(up)]) as gw:
        for stream in (False, True):
            r = loopback.post(gw.url + "/v1/chat/completions", json={
                "model": "demo", "messages": [{"role": "user", "content": "x"}],
                "stream": stream})
            assert (r.status_code, r.text) == (400, body)
            assert r.headers["content-type"] == "application/json"


def test_retry_after_is_whole_seconds_and_never_zero() -> None:
    assert (b"retry-after", b"1") in Unavailable("x", retry_after=0.2).headers()
    assert (b"retry-after", b"3") in Unavailable("x", retry_after=2.6).headers()


@pytest.mark.parametrize(("method", "path", "body", "status", "allow"), [
    ("GET", "/nope", None, 404, None),
    ("GET", "/v1/chat/completions", None, 405, "POST"),
    ("DELETE", "/v1/completions", None, 405, "POST"),
    ("POST", "/health", b"{}", 405, "GET"),
    ("PUT", "/v1/models", b"{}", 405, "GET"),
    ("POST", "/v1/chat/completions", b"{not json", 400, None),
    ("POST", "/v1/completions", b'{"model": "nope", "prompt": "hi"}', 404, None),
    ("POST", "/v1/completions", b"x" * 5000, 413, None),
])
def test_every_error_the_gateway_writes_is_openai_json(
    upstreams: UpstreamFactory, method: str, path: str, body: bytes | None, status: int,
    allow: str | None,
) -> None:
    up = upstreams()
    with run_gateway(backends=[url_of(up)], max_body_bytes=4096) as gw:
        r = loopback.request(method, gw.url + path, content=body)
        assert r.status_code == status
        assert r.headers["content-type"] == "application/json"
        err = shape(r.content)
        assert err["message"]
        if allow is not None:
            assert allow in r.headers["allow"]
            assert err["code"] == "method_not_allowed" and method in str(err["message"])


def test_rate_limited_log_keeps_a_burst_then_counts_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    limited = RateLimitedLog(logging.getLogger("test.ratelimit"), interval_s=0.2, burst=3)
    with caplog.at_level(logging.WARNING, "test.ratelimit"):
        for i in range(100):
            limited.warning("bad request %d", i)
        assert len(caplog.records) == 3 and limited.suppressed == 97
        time.sleep(0.25)
        limited.warning("bad request %d", 100)
    assert caplog.records[-1].getMessage() == "bad request 100 (97 similar line(s) suppressed)"


def test_an_upstream_body_that_is_no_error_object_goes_to_the_log_not_the_client(
    caplog: pytest.LogCaptureFixture,
) -> None:
    warnings = RateLimitedLog(logging.getLogger("test.bodies"), burst=1)
    with caplog.at_level(logging.WARNING, "test.bodies"):
        for _ in range(3):
            own = upstream_error_body(502, b"<html>10.0.0.7</html>", warnings, "r-1")
            assert own is not None
            err = shape(own)
    assert err["message"] == "upstream returned HTTP 502"
    assert len(caplog.records) == 1 and warnings.suppressed == 2
    assert "r-1" in caplog.records[0].getMessage() and "10.0.0.7" in caplog.records[0].getMessage()


def test_a_typed_parameter_that_does_not_validate_is_openais_400_naming_it() -> None:
    """FastAPI answers such a request with its own 422 {"detail": ...}; every route of the
    gateway's app answers in OpenAI's shape instead, whatever parameters a route comes to take."""
    app = FastAPI()
    install_handlers(app)

    @app.get("/items/{n}")
    def item(n: int, limit: int = 10) -> dict[str, int]:
        return {"n": n, "limit": limit}

    client = TestClient(app)
    assert client.get("/items/3?limit=2").json() == {"n": 3, "limit": 2}
    for url, param in (("/items/x", "n"), ("/items/3?limit=many", "limit")):
        r = client.get(url)
        assert r.status_code == 400, r.text
        err = shape(r.content)
        assert err["type"] == "invalid_request_error" and err["param"] == param
        assert str(err["message"]).startswith(f"{param}: ")
