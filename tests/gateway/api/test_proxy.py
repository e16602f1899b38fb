"""The proxy against near-free fake upstreams: streaming, usage, retries, in-band errors,
timeouts, disconnects. Real HTTP on loopback at every hop."""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import socket
import time

import pytest

import worker.drain as worker_drain
from bench.fake_upstream import start_in_thread
from gateway.api.replicas import DRAINING_CODE
from tests import loopback
from tests.gateway.conftest import UpstreamFactory, run_gateway, url_of
from tests.openai_error import openai_error
from tests.waiting import wait_for

CHAT = {"model": "demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}


def events(text: str) -> list[str]:
    return [e for e in text.split("\n\n") if e.strip()]


def test_stream_passes_events_through_and_strips_usage(upstreams: UpstreamFactory) -> None:
    up = upstreams()
    with run_gateway(backends=[url_of(up)]) as gw:
        r = loopback.post(gw.url + "/v1/chat/completions", json={**CHAT, "stream": True})
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        evs = events(r.text)
        # role chunk + 5 tokens + finish + [DONE]; no usage chunk since the client did not ask
        assert len(evs) == 8 and evs[-1] == "data: [DONE]"
        assert not any('"usage"' in e for e in evs)
        assert gw.metric("llmserve_output_tokens_total") == 5  # counted from the stripped chunk
        r = loopback.post(gw.url + "/v1/chat/completions",
                       json={**CHAT, "stream": True, "stream_options": {"include_usage": True}})
        evs = events(r.text)
        usage = json.loads(evs[-2].removeprefix("data: "))
        assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 5


def test_running_usage_reaches_only_a_client_that_asked_for_usage(
    upstreams: UpstreamFactory,
) -> None:
    # vLLM sends running usage (continuous_usage_stats) only with include_usage. The gateway asks
    # for usage on its own account: it must not turn a request without include_usage into one
    # whose every chunk carries usage.
    up = upstreams()
    with run_gateway(backends=[url_of(up)]) as gw:
        for path, body in (("/v1/chat/completions", CHAT),
                           ("/v1/completions", {"model": "demo", "prompt": "hi", "max_tokens": 5})):
            for so in ({"continuous_usage_stats": True},
                       {"include_usage": False, "continuous_usage_stats": True}):
                r = loopback.post(gw.url + path,
                                  json={**body, "stream": True, "stream_options": so})
                evs = events(r.text)
                assert evs[-1] == "data: [DONE]" and not any('"usage"' in e for e in evs[:-1])
            r = loopback.post(gw.url + path, json={**body, "stream": True, "stream_options": {
                "include_usage": True, "continuous_usage_stats": True}})
            evs = [json.loads(e.removeprefix("data: ")) for e in events(r.text)[:-1]]
            assert [e["usage"]["completion_tokens"] for e in evs][-2:] == [5, 5]
            assert all("usage" in e for e in evs)
        assert gw.metric("llmserve_output_tokens_total") == 6 * 5


def test_a_compressed_body_is_415_naming_the_encoding(upstreams: UpstreamFactory) -> None:
    # Bodies are not decompressed: a gzip body must not read as "invalid UTF-8".
    up = upstreams()
    body = json.dumps(CHAT).encode()
    with run_gateway(backends=[url_of(up)]) as gw:
        for path in ("/v1/chat/completions", "/v1/completions"):
            r = loopback.post(gw.url + path, content=gzip.compress(body),
                              headers={"content-type": "application/json",
                                       "content-encoding": "gzip"})
            assert r.status_code == 415 and r.headers["content-type"] == "application/json"
            err = r.json()["error"]
            assert err["code"] == "unsupported_media_type" and "'gzip'" in err["message"]
            assert err["type"] == "invalid_request_error"
        # An uncompressed body is read whatever the header says (identity, or mislabelled), and
        # a bad one labelled identity goes to the engine, which answers its 400.
        for enc in ("identity", "gzip"):
            r = loopback.post(gw.url + "/v1/chat/completions", content=body,
                              headers={"content-encoding": enc})
            assert r.status_code == 200
        r = loopback.post(gw.url + "/v1/chat/completions", content=b"{",
                          headers={"content-encoding": "identity"})
        assert r.status_code == 400
    assert up.completions == 3


def test_non_stream_and_completions(upstreams: UpstreamFactory) -> None:
    up = upstreams()
    with run_gateway(backends=[url_of(up)]) as gw:
        r = loopback.post(gw.url + "/v1/chat/completions", json=CHAT)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 5
        r = loopback.post(gw.url + "/v1/completions", json={"model": "demo", "prompt": "x",
                                                          "max_tokens": 3})
        assert r.json()["choices"][0]["text"] == " tok" * 3
        assert r.headers["x-request-id"]


@pytest.mark.parametrize("usage", [
    '"abc"', '{"prompt_tokens": "abc", "completion_tokens": 5}',
    '{"prompt_tokens": -5, "completion_tokens": 5}', '{"prompt_tokens": 5}', "null",
])
def test_malformed_upstream_usage_is_unknown_not_an_error(
    upstreams: UpstreamFactory, usage: str
) -> None:
    """The answer completes untouched; its tokens are not counted; a warning counter says so."""
    up = upstreams(usage_json=usage)
    with run_gateway(backends=[url_of(up)]) as gw:
        for extra in ({"stream": True, "stream_options": {"include_usage": True}},
                      {"stream": True}, {}):
            r = loopback.post(gw.url + "/v1/chat/completions", json={**CHAT, **extra})
            assert r.status_code == 200, r.text
            if extra:
                evs = events(r.text)
                assert evs[-1] == "data: [DONE]" and not any('"error"' in e for e in evs)
                assert sum(" tok" in e for e in evs) == 5
            else:
                assert r.json()["choices"][0]["message"]["content"] == " tok" * 5
        assert gw.metric("llmserve_upstream_usage_invalid_total") == 3
        assert gw.metric("llmserve_input_tokens_total") == 0
        assert gw.metric("llmserve_output_tokens_total") == 0
        assert gw.metric("llmserve_requests_total") == 3  # every one a 200, counted once


def test_models_is_the_union_of_replicas(upstreams: UpstreamFactory) -> None:
    a, b = upstreams(model="llama"), upstreams(model="qwen")
    with run_gateway(backends=[url_of(a), url_of(b)]) as gw:
        assert {m["id"] for m in loopback.get(gw.url + "/v1/models").json()["data"]} == {
            "llama", "qwen"}


def test_failed_replica_is_retried_elsewhere_before_first_byte(
    upstreams: UpstreamFactory,
) -> None:
    bad, good = upstreams(fail_status=500), upstreams()
    with run_gateway(backends=[url_of(bad), url_of(good)], retries=1) as gw:
        for _ in range(4):
            r = loopback.post(gw.url + "/v1/chat/completions", json={**CHAT, "stream": True})
            assert r.status_code == 200 and events(r.text)[-1] == "data: [DONE]"
        assert good.completions == 4
        # One count per request, by its final status: a retry that succeeds is one 200.
        assert gw.metric("llmserve_requests_total") == 4
        assert gw.metric(f'llmserve_requests_total{{backend="{url_of(good)}",'
                         'endpoint="/v1/chat/completions",model="demo",status="200"}') == 4


@pytest.mark.parametrize("batch", [False, True], ids=["proxy", "batcher"])
def test_a_request_failed_on_every_replica_is_counted_once(
    upstreams: UpstreamFactory, batch: bool,
) -> None:
    a, b = upstreams(fail_status=500), upstreams(fail_status=500)
    with run_gateway(backends=[url_of(a), url_of(b)], retries=1,
                     batch={"enabled": batch}) as gw:
        r = loopback.post(gw.url + "/v1/completions", json={"model": "demo", "prompt": "hi"})
        assert r.status_code == 502
        assert a.completions + b.completions == 2  # tried on both
        assert gw.metric("llmserve_requests_total") == 1


# What a worker draining for a restart (worker/drain.py) answers every new request.
DRAINING_BODY = json.dumps({"error": {"message": "draining", "type": "service_unavailable",
                                      "param": None, "code": DRAINING_CODE}})


def test_a_draining_replica_is_taken_out_at_its_first_refusal(upstreams: UpstreamFactory) -> None:
    """A worker draining for a restart (worker/drain.py) refuses with a 503 coded `draining`: the
    request is retried elsewhere and the replica gets no more, long before the next probe."""
    draining, good = upstreams(fail_status=503, fail_body=DRAINING_BODY), upstreams()
    with run_gateway(backends=[url_of(draining), url_of(good)], retries=1,
                     health_interval_s=60) as gw:
        deadline = time.monotonic() + 10
        while draining.completions == 0:  # until the policy has picked it once
            assert time.monotonic() < deadline
            r = loopback.post(gw.url + "/v1/chat/completions", json={**CHAT, "stream": True})
            assert r.status_code == 200 and events(r.text)[-1] == "data: [DONE]"
        for _ in range(6):
            r = loopback.post(gw.url + "/v1/chat/completions", json={**CHAT, "stream": True})
            assert r.status_code == 200
        assert draining.completions == 1
        assert gw.metric("llmserve_upstream_retries_total") == 1
        up = loopback.get(gw.url + "/metrics").text
        assert f'llmserve_backend_up{{backend="{url_of(draining)}"}} 0.0' in up


@pytest.mark.parametrize("batch", [False, True], ids=["proxy", "batcher"])
def test_a_drain_refusal_no_replica_can_take_is_503_with_retry_after(
    upstreams: UpstreamFactory, batch: bool,
) -> None:
    # The only replica drains: its refusal is the client's 503 with Retry-After, as for the
    # requests after it (no healthy replica), not the 502 of a failed model server.
    up = upstreams(fail_status=503, fail_body=DRAINING_BODY)
    with run_gateway(backends=[url_of(up)], health_interval_s=60,
                     batch={"enabled": batch}) as gw:
        for path, body in (("/v1/completions", {"model": "demo", "prompt": "hi"}),
                           ("/v1/chat/completions", {**CHAT, "stream": True}),
                           ("/v1/chat/completions", CHAT)):
            r = loopback.post(gw.url + path, json=body)
            assert (r.status_code, r.headers.get("retry-after")) == (503, "60")
            assert r.json()["error"]["code"] == "service_unavailable"
    assert up.completions == 1  # the first refusal took the replica out


def test_drain_code_is_the_workers() -> None:
    assert DRAINING_CODE == worker_drain.DRAINING_CODE


def test_stream_broken_after_first_byte_ends_with_one_error_event(
    upstreams: UpstreamFactory,
) -> None:
    up = upstreams(drop_after=3)
    with run_gateway(backends=[url_of(up)], retries=1) as gw:
        r = loopback.post(gw.url + "/v1/chat/completions", json={**CHAT, "stream": True})
        evs = events(r.text)
        assert r.status_code == 200
        assert "data: [DONE]" not in evs
        errors = [e for e in evs if e.startswith('data: {"error"')]
        assert errors == [evs[-1]]
        assert openai_error(evs[-1].removeprefix("data: "))["code"] == "upstream_error"
        assert up.completions == 1  # never retried after the first byte


def test_upstream_5xx_everywhere_is_502_in_openai_shape(upstreams: UpstreamFactory) -> None:
    a, b = upstreams(fail_status=503), upstreams(fail_status=500)
    with run_gateway(backends=[url_of(a), url_of(b)], retries=1) as gw:
        r = loopback.post(gw.url + "/v1/chat/completions", json=CHAT)
        assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_error"


HTML = "<html><body><h1>502 Bad Gateway</h1>nginx at 10.1.2.3:8000</body></html>"


@pytest.mark.parametrize("case", ["unreachable", "html_5xx", "html_4xx", "cut"])
def test_failures_show_no_internal_address_or_upstream_body_but_log_them(
    upstreams: UpstreamFactory, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    """What a client reads names no replica and relays no upstream page; the log has both,
    under the response's x-request-id."""
    stack = contextlib.ExitStack()
    if case == "unreachable":  # probed up, then gone: connection refused
        up = stack.enter_context(start_in_thread())
    else:
        up = upstreams(fail_status={"html_5xx": 503, "html_4xx": 400}.get(case, 0),
                       fail_body=HTML, drop_after=3 if case == "cut" else -1)
    backend = url_of(up)
    # No probe after the first: one between the upstream's stop and the request would mark it
    # down, and the answer would be a 503 for no replica instead of the failure under test.
    with caplog.at_level(logging.WARNING), run_gateway(backends=[backend], retries=0,
                                                       health_interval_s=60) as gw:
        stack.close()
        r = loopback.post(gw.url + "/v1/chat/completions", json={**CHAT, "stream": case == "cut"})
    rid = r.headers["x-request-id"]
    body = r.text
    port = backend.rsplit(":", 1)[1]
    assert "127.0.0.1" not in body and port not in body and "nginx" not in body and "<" not in body
    if case == "cut":
        assert r.status_code == 200 and '"upstream_error"' in events(body)[-1]
    else:
        assert r.status_code == {"html_4xx": 400}.get(case, 502)
        openai_error(r.content)
    logged = [rec.getMessage() for rec in caplog.records if rid in rec.getMessage()]
    assert logged and ("nginx" in logged[0] or port in logged[0] or "replica" in logged[0])


def test_upstream_4xx_passes_through_in_openai_shape(upstreams: UpstreamFactory) -> None:
    up = upstreams(fail_status=400)
    with run_gateway(backends=[url_of(up)]) as gw:
        r = loopback.post(gw.url + "/v1/chat/completions", json=CHAT)
        assert r.status_code == 400
        assert r.json()["error"]["message"] == "scripted failure"


def test_first_byte_timeout_is_504(upstreams: UpstreamFactory) -> None:
    up = upstreams(token_delay_s=10.0)
    with run_gateway(backends=[url_of(up)], retries=0,
                     timeouts={"connect_s": 1, "first_byte_s": 0.3, "idle_s": 20,
                               "total_s": 30}) as gw:
        t0 = time.monotonic()
        r = loopback.post(gw.url + "/v1/chat/completions", json={**CHAT, "stream": True}, timeout=30)
        assert time.monotonic() - t0 < 5  # the 0.3 s deadline, not the 10 s first token
        assert r.status_code == 504 and r.json()["error"]["code"] == "upstream_timeout"


def test_no_healthy_backend_is_503_with_retry_after() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    with run_gateway(backends=[dead], expect_ready=False) as gw:
        assert loopback.get(gw.url + "/ready").status_code == 503
        r = loopback.post(gw.url + "/v1/chat/completions", json=CHAT)
        assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1
        text = loopback.get(gw.url + "/metrics").text
        assert f'llmserve_backend_up{{backend="{dead}"}} 0.0' in text
        assert f'llmserve_backend_outstanding_requests{{backend="{dead}"}} 0.0' in text


def test_unknown_model_is_404(upstreams: UpstreamFactory) -> None:
    up = upstreams()
    with run_gateway(backends=[url_of(up)]) as gw:
        for name in ("nope", "nope-2", "nope-3"):
            r = loopback.post(gw.url + "/v1/chat/completions", json={**CHAT, "model": name})
            assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
        # Made-up names share one `unknown` series instead of minting one each.
        text = loopback.get(gw.url + "/metrics").text
        assert "nope" not in text
        assert gw.metric('llmserve_requests_total{backend="",endpoint="/v1/chat/completions",'
                         'model="unknown",status="404"}') == 3


def test_ttft_is_recorded_for_streams_only(upstreams: UpstreamFactory) -> None:
    up = upstreams()
    with run_gateway(backends=[url_of(up)]) as gw:
        assert loopback.post(gw.url + "/v1/chat/completions", json=CHAT).status_code == 200
        stream = loopback.post(gw.url + "/v1/chat/completions", json={**CHAT, "stream": True})
        assert stream.status_code == 200
        # The whole answer feeds E2E only; the stream feeds both.
        assert gw.metric("llmserve_ttft_seconds_count") == 1
        assert gw.metric("llmserve_e2e_request_latency_seconds_count") == 2


@pytest.mark.parametrize("declared", [True, False])
def test_oversized_body_is_413_counted_not_trusted(upstreams: UpstreamFactory,
                                                  declared: bool) -> None:
    up = upstreams()
    with run_gateway(backends=[url_of(up)], max_body_bytes=4096) as gw:
        body = json.dumps({**CHAT, "messages": [{"role": "user", "content": "x" * 10_000}]})
        if declared:
            r = loopback.post(gw.url + "/v1/chat/completions", content=body)
        else:  # chunked: no Content-Length to trust, the limit is counted on the stream
            r = loopback.post(gw.url + "/v1/chat/completions",
                           content=iter([body[:3000].encode(), body[3000:].encode()]))
        assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"
        assert loopback.get(gw.url + "/health").status_code == 200


@pytest.mark.parametrize("edge", [True, False], ids=["edge", "plain"])
@pytest.mark.parametrize("shape", ["cl-and-te", "two-cl", "cl-short"])
def test_a_declared_length_cannot_smuggle_a_bigger_body_past_the_limit(
    upstreams: UpstreamFactory, shape: str, edge: bool
) -> None:
    # The body limit trusts a declared Content-Length within the limit (the parser then delivers
    # exactly that many bytes). These heads try to make the parser deliver more than declared:
    # each must end in a 4xx, never reach the engine with an oversized body.
    up = upstreams()
    big = json.dumps({**CHAT, "messages": [{"role": "user", "content": "x" * 10_000}]}).encode()
    if shape == "cl-and-te":
        head = b"Content-Length: 10\r\nTransfer-Encoding: chunked\r\n"
        body = b"%x\r\n%b\r\n0\r\n\r\n" % (len(big), big)
    elif shape == "two-cl":
        head = b"Content-Length: 10\r\nContent-Length: %d\r\n" % len(big)
        body = big
    else:  # the declared length ends inside the JSON: the rest is taken as the next request
        head = b"Content-Length: 10\r\n"
        body = big
    with run_gateway(backends=[url_of(up)], max_body_bytes=4096, edge=edge) as gw:
        port = int(gw.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                         b"Content-Type: application/json\r\n" + head + b"\r\n" + body)
            answer = b""
            with contextlib.suppress(OSError):
                while chunk := sock.recv(65536):
                    answer += chunk
        status = int(answer.split(b" ", 2)[1])
        assert 400 <= status < 500, answer[:300]
        # At most the declared 10 bytes reach the engine (which refuses them: the gateway leaves
        # a body it cannot read to the engine); the rest never does.
        # (Or none: the connection may close on the rest before the first is forwarded.)
        assert up.completions <= (1 if shape == "cl-short" else 0)
        if up.completions:
            assert up.last_headers["content-length"] == "10"
        assert loopback.get(gw.url + "/health").status_code == 200


@pytest.mark.parametrize("edge", [True, False], ids=["edge-callback", "plain-watcher"])
def test_client_disconnect_mid_stream_closes_the_upstream(
    upstreams: UpstreamFactory, edge: bool
) -> None:
    # The edge protocol reports the hang-up from connection_lost; under uvicorn's plain protocol
    # the proxy's watcher task hears it from receive(). Either way the upstream is dropped.
    up = upstreams(token_delay_s=0.05)
    with run_gateway(backends=[url_of(up)], edge=edge) as gw, loopback.client() as c:
        with c.stream("POST", gw.url + "/v1/chat/completions",
                      json={**CHAT, "max_tokens": 200, "stream": True}) as r:
            it = r.iter_bytes()
            next(it)
        # The fake upstream notices the closed connection at its next token write.
        deadline = time.monotonic() + 2
        while up.aborted == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert up.aborted == 1


@pytest.mark.parametrize("edge", [True, False], ids=["edge-callback", "plain-watcher"])
def test_client_disconnect_before_the_first_token_closes_the_upstream(
    upstreams: UpstreamFactory, edge: bool
) -> None:
    up = upstreams(first_token_delay_s=1.0)
    with run_gateway(backends=[url_of(up)], edge=edge) as gw:
        port = int(gw.url.rsplit(":", 1)[1])
        body = json.dumps({**CHAT, "stream": True}).encode()
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: "
                         b"application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
            # The request is at the upstream, waiting for its first token (1 s): waited for, as
            # on a loaded machine it may not be there yet after a fixed time.
            wait_for(lambda: up.completions == 1, 10, "the request never reached the upstream")
        # The gateway drops the upstream connection; the fake notices at its first token's write
        # (an engine notices at once). Had the request gone on, the stream would end unaborted.
        deadline = time.monotonic() + 3
        while up.aborted == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert up.aborted == 1
        assert loopback.post(gw.url + "/v1/chat/completions", json=CHAT).status_code == 200


def test_client_disconnect_with_a_pipelined_request_behind_closes_the_upstream(
    upstreams: UpstreamFactory,
) -> None:
    # Two requests in one write: the second waits in uvicorn's pipeline while the first streams.
    # The hang-up must reach the first (running) one, not only the newest request on the line.
    up = upstreams(token_delay_s=0.05)
    with run_gateway(backends=[url_of(up)]) as gw:
        port = int(gw.url.rsplit(":", 1)[1])
        body = json.dumps({**CHAT, "max_tokens": 200, "stream": True}).encode()
        req = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: "
               b"application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(req + req)
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        deadline = time.monotonic() + 3
        while up.aborted == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert up.aborted == 1 and up.completions == 1  # the second never reached the upstream


def test_terminator_after_done_in_a_later_read_keeps_the_upstream_connection(
    upstreams: UpstreamFactory,
) -> None:
    """uvicorn answers receive() with http.disconnect once a response is complete; the
    disconnect watcher must not take that for a hang-up and abort the upstream connection while
    the proxy still reads the chunked terminator that came after [DONE]."""
    up = upstreams(end_delay_s=0.05)
    with run_gateway(backends=[url_of(up)]) as gw, loopback.client() as c:
        body = {**CHAT, "stream": True}

        def back_in_the_pool() -> None:
            # The client has [DONE] before the terminator; the request leaves the gateway (its
            # admission slot is freed) only once the terminator is read and the connection put
            # back. A fixed sleep here lost that race on a loaded machine: the next request then
            # found no idle connection and opened one.
            wait_for(lambda: gw.metric("llmserve_admitted_in_flight") == 0,
                     what="the stream's terminator was never read")

        assert c.post(gw.url + "/v1/chat/completions", json=body).status_code == 200
        back_in_the_pool()
        opened = up.opened
        for _ in range(10):
            r = c.post(gw.url + "/v1/chat/completions", json=body)
            assert events(r.text)[-1] == "data: [DONE]"
            back_in_the_pool()
        assert up.opened - opened <= 1, "a connection per stream: keep-alive was aborted"
        assert up.aborted == 0
        # The gateway's own count agrees (probes and the first request opened the rest); a
        # probe may be connecting at the scrape, counted by the upstream and not yet by the
        # gateway: the two agree once it has.
        wait_for(lambda: gw.metric("llmserve_upstream_connections_opened_total") == up.opened,
                 what="the gateway's count of opened connections differs from the upstream's")


def test_a_stream_is_counted_when_the_client_has_done_not_at_the_upstream_terminator(
    upstreams: UpstreamFactory,
) -> None:
    """The engine's chunked terminator may come a read after [DONE] (vLLM writes it when its
    generator ends). Metrics are observed when the client has its last byte: a client that
    scrapes right after [DONE] sees its request, and E2E does not include the wait."""
    # The terminator 2 s after [DONE]: the bounds below leave a loaded machine 1.8 s for what
    # takes milliseconds, and still tell a wait for the terminator apart.
    up = upstreams(end_delay_s=2.0)
    with run_gateway(backends=[url_of(up)]) as gw:
        t0 = time.monotonic()
        r = loopback.post(gw.url + "/v1/chat/completions", json={**CHAT, "stream": True})
        assert events(r.text)[-1] == "data: [DONE]"
        assert time.monotonic() - t0 < 1.8  # the client did not wait for the terminator
        assert gw.metric("llmserve_ttft_seconds_count") == 1
        assert gw.metric("llmserve_requests_total") == 1
        assert gw.metric("llmserve_output_tokens_total") == 5
        assert gw.metric("llmserve_e2e_request_latency_seconds_sum") < 1.8


@pytest.mark.parametrize(("events_per_write", "usage"), [(1, False), (1, True), (16, False)])
def test_itl_and_tpot_follow_vllm_bench_serve(
    upstreams: UpstreamFactory, events_per_write: int, usage: bool
) -> None:
    # vllm bench serve: ITL is one gap per event with choices after the first (the role event
    # counts), none for the usage-only event or [DONE]; TPOT = (E2E - TTFT) / (tokens - 1).
    # Several events per write come with no delay between them: all but the first gap are 0.
    up = upstreams(token_delay_s=0.02 if events_per_write == 1 else 0.0,
                   events_per_write=events_per_write)
    body = {**CHAT, "stream": True, **({"stream_options": {"include_usage": True}} if usage else {})}
    with run_gateway(backends=[url_of(up)]) as gw:
        for _ in range(3):
            r = loopback.post(gw.url + "/v1/chat/completions", json=body)
            with_choices = [e for e in events(r.text) if '"choices":[{' in e.replace(" ", "")]
            assert len(with_choices) == 7  # role + 5 tokens + finish
        assert gw.metric("llmserve_itl_seconds_count") == 3 * 6
        assert gw.metric('llmserve_itl_seconds_bucket{le="+Inf",model="demo"}') == 3 * 6
        assert gw.metric("llmserve_tpot_seconds_count") == 3
        e2e = gw.metric("llmserve_e2e_request_latency_seconds_sum")
        ttft = gw.metric("llmserve_ttft_seconds_sum")
        assert gw.metric("llmserve_tpot_seconds_sum") == pytest.approx((e2e - ttft) / 4, rel=1e-6)
        itl = gw.metric("llmserve_itl_seconds_sum")
        if events_per_write == 1:
            # Six 20 ms sleeps between the first and the last event with choices, per stream.
            assert 3 * 6 * 0.02 <= itl < 3 * 6 * 0.02 + 0.5
        else:
            # Events that arrive together: every gap is (about) zero.
            assert itl < 0.05


def test_prefix_affinity_keeps_a_conversation_and_a_session_key_on_one_replica(
    upstreams: UpstreamFactory,
) -> None:
    ups = [upstreams(), upstreams()]
    with run_gateway(backends=[url_of(u) for u in ups],
                     routing_policy="prefix_affinity") as gw:
        for conv in range(6):
            messages = [{"role": "system", "content": f"conversation {conv} " * 100}]
            before = [u.completions for u in ups]
            for turn in range(3):
                messages.append({"role": "user", "content": f"turn {turn}"})
                r = loopback.post(gw.url + "/v1/chat/completions",
                               json={**CHAT, "messages": messages})
                assert r.status_code == 200
                messages.append({"role": "assistant", "content": "fine " * 30})
            served = [u.completions - b for u, b in zip(ups, before, strict=True)]
            assert sorted(served) == [0, 3], served  # all three turns on one replica
        for key in ("alice", "bob", "carol"):  # explicit keys: the header, then `user`
            before = [u.completions for u in ups]
            for i in range(3):
                r = loopback.post(gw.url + "/v1/chat/completions", headers={"x-session-id": key},
                               json={**CHAT, "messages": [{"role": "user", "content": str(i)}]})
                r2 = loopback.post(gw.url + "/v1/completions",
                                json={"model": "demo", "prompt": "x" * i, "user": key + "!"})
                assert r.status_code == r2.status_code == 200
            served = [u.completions - b for u, b in zip(ups, before, strict=True)]
            assert sorted(served) in ([0, 6], [3, 3]), served
        assert gw.metric("llmserve_affinity_hits_total") >= 6 * 2 + 3 * 2 * 2


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_the_fingerprint_stays_where_the_engine_puts_it_without_usage(
    upstreams: UpstreamFactory, path: str,
) -> None:
    # vLLM stamps system_fingerprint on the terminal chunks, or, when usage is asked for, on the
    # usage chunk instead. The gateway asks for usage on its own account: a client that did not
    # must still find the fingerprint on the terminal chunks, as the engine would send them.
    body = CHAT if "chat" in path else {"model": "demo", "prompt": "hi", "max_tokens": 5}
    up = upstreams(events_per_write=3)  # terminal, usage and [DONE] arrive in different reads
    with run_gateway(backends=[url_of(up)]) as gw:
        for ask in (False, True):
            so = {"stream_options": {"include_usage": True}} if ask else {}
            evs = events(loopback.post(gw.url + path, json={**body, "stream": True, **so}).text)
            assert evs[-1] == "data: [DONE]"
            objs = [json.loads(e.removeprefix("data: ")) for e in evs[:-1]]
            stamped = [o for o in objs if "system_fingerprint" in o]
            assert len(stamped) == 1 and stamped[0]["system_fingerprint"] == "fp-fake"
            if ask:
                assert stamped[0]["choices"] == [] and "usage" in stamped[0]
            else:
                assert stamped[0]["choices"][0]["finish_reason"] == "length"
                assert stamped[0] is objs[-1] and not any("usage" in o for o in objs)
            # Byte for byte what the upstream sends a client that asked for what this one did.
            framed = up.answers.events("chat" if "chat" in path else "completion", ask, 5, 1)
            assert evs == [f.split(b"\r\n", 1)[1][:-4].decode() for f in framed]


def test_requests_vllm_serves_are_not_refused(upstreams: UpstreamFactory) -> None:
    # vLLM serves these (model omitted or "" while it serves one model; numeric strings and
    # booleans its lax request models coerce): the gateway forwards them as they are.
    up = upstreams()
    with run_gateway(backends=[url_of(up)]) as gw:
        for body in ({"messages": CHAT["messages"], "max_tokens": "5"},
                     {**CHAT, "model": ""},
                     {**CHAT, "max_tokens": "5", "stream": "false", "logprobs": "true"},
                     {**CHAT, "temperature": 3}):
            r = loopback.post(gw.url + "/v1/chat/completions", json=body)
            assert r.status_code == 200, (body, r.text)
            assert up.last_request == body  # unchanged on the way
            assert r.json()["usage"]["completion_tokens"] == 5
        r = loopback.post(gw.url + "/v1/completions",
                          json={"prompt": "x", "max_tokens": "5", "stream": "true"})
        assert r.status_code == 200 and events(r.text)[-1] == "data: [DONE]"
        # Usage asked on the client's behalf and stripped again, as for stream: true.
        assert not any('"usage"' in e for e in events(r.text))


def test_without_a_model_several_served_is_a_400(upstreams: UpstreamFactory) -> None:
    a, b = upstreams(model="a"), upstreams(model="b")
    with run_gateway(backends=[url_of(a), url_of(b)]) as gw:
        r = loopback.post(gw.url + "/v1/chat/completions", json={"messages": CHAT["messages"]})
        assert r.status_code == 400
        err = r.json()["error"]
        assert err["param"] == "model" and "2 models (a, b)" in err["message"]
