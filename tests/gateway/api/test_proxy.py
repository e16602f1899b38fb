"""The proxy against near-free fake upstreams: streaming, usage, retries, in-band errors,
timeouts, disconnects. Real HTTP on loopback at every hop."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from tests.gateway.conftest import UpstreamFactory, run_gateway, url_of

CHAT = {"model": "demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}


def events(text: str) -> list[str]:
    return [e for e in text.split("\n\n") if e.strip()]


def test_stream_passes_events_through_and_strips_usage(upstreams: UpstreamFactory) -> None:
    up = upstreams()
    with run_gateway(backends=[url_of(up)]) as gw:
        r = httpx.post(gw.url + "/v1/chat/completions", json={**CHAT, "stream": True})
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        evs = events(r.text)
        # role chunk + 5 tokens + finish + [DONE]; no usage chunk since the client did not ask
        assert len(evs) == 8 and evs[-1] == "data: [DONE]"
        assert not any('"usage"' in e for e in evs)
        assert gw.metric("llmserve_output_tokens_total") == 5  # counted from the stripped chunk
        r = httpx.post(gw.url + "/v1/chat/completions",
                       json={**CHAT, "stream": True, "stream_options": {"include_usage": True}})
        evs = events(r.text)
        usage = json.loads(evs[-2].removeprefix("data: "))
        assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 5


def test_non_stream_and_completions(upstreams: UpstreamFactory) -> None:
    up = upstreams()
    with run_gateway(backends=[url_of(up)]) as gw:
        r = httpx.post(gw.url + "/v1/chat/completions", json=CHAT)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 5
        r = httpx.post(gw.url + "/v1/completions", json={"model": "demo", "prompt": "x",
                                                          "max_tokens": 3})
        assert r.json()["choices"][0]["text"] == " tok" * 3
        assert r.headers["x-request-id"]


def test_models_is_the_union_of_replicas(upstreams: UpstreamFactory) -> None:
    a, b = upstreams(model="llama"), upstreams(model="qwen")
    with run_gateway(backends=[url_of(a), url_of(b)]) as gw:
        assert {m["id"] for m in httpx.get(gw.url + "/v1/models").json()["data"]} == {
            "llama", "qwen"}


def test_failed_replica_is_retried_elsewhere_before_first_byte(
    upstreams: UpstreamFactory,
) -> None:
    bad, good = upstreams(fail_status=500), upstreams()
    with run_gateway(backends=[url_of(bad), url_of(good)], retries=1) as gw:
        for _ in range(4):
            r = httpx.post(gw.url + "/v1/chat/completions", json={**CHAT, "stream": True})
            assert r.status_code == 200 and events(r.text)[-1] == "data: [DONE]"
        assert good.completions == 4


def test_stream_broken_after_first_byte_ends_with_one_error_event(
    upstreams: UpstreamFactory,
) -> None:
    up = upstreams(drop_after=3)
    with run_gateway(backends=[url_of(up)], retries=1) as gw:
        r = httpx.post(gw.url + "/v1/chat/completions", json={**CHAT, "stream": True})
        evs = events(r.text)
        assert r.status_code == 200
        assert "data: [DONE]" not in evs
        errors = [e for e in evs if e.startswith('data: {"error"')]
        assert errors == [evs[-1]]
        err = json.loads(evs[-1].removeprefix("data: "))["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["code"] == "upstream_error"
        assert up.completions == 1  # never retried after the first byte


def test_upstream_5xx_everywhere_is_502_in_openai_shape(upstreams: UpstreamFactory) -> None:
    a, b = upstreams(fail_status=503), upstreams(fail_status=500)
    with run_gateway(backends=[url_of(a), url_of(b)], retries=1) as gw:
        r = httpx.post(gw.url + "/v1/chat/completions", json=CHAT)
        assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_error"


def test_upstream_4xx_passes_through_in_openai_shape(upstreams: UpstreamFactory) -> None:
    up = upstreams(fail_status=400)
    with run_gateway(backends=[url_of(up)]) as gw:
        r = httpx.post(gw.url + "/v1/chat/completions", json=CHAT)
        assert r.status_code == 400
        assert r.json()["error"]["message"] == "scripted failure"


def test_first_byte_timeout_is_504(upstreams: UpstreamFactory) -> None:
    up = upstreams(token_delay_s=10.0)
    with run_gateway(backends=[url_of(up)], retries=0,
                     timeouts={"connect_s": 1, "first_byte_s": 0.3, "idle_s": 20,
                               "total_s": 30}) as gw:
        t0 = time.monotonic()
        r = httpx.post(gw.url + "/v1/chat/completions", json={**CHAT, "stream": True}, timeout=30)
        assert time.monotonic() - t0 < 5  # the 0.3 s deadline, not the 10 s first token
        assert r.status_code == 504 and r.json()["error"]["code"] == "upstream_timeout"


def test_no_healthy_backend_is_503_with_retry_after() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    with run_gateway(backends=[dead], expect_ready=False) as gw:
        assert httpx.get(gw.url + "/ready").status_code == 503
        r = httpx.post(gw.url + "/v1/chat/completions", json=CHAT)
        assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1
        text = httpx.get(gw.url + "/metrics").text
        assert f'llmserve_backend_up{{backend="{dead}"}} 0.0' in text
        assert f'llmserve_backend_outstanding_requests{{backend="{dead}"}} 0.0' in text


def test_unknown_model_is_404(upstreams: UpstreamFactory) -> None:
    up = upstreams()
    with run_gateway(backends=[url_of(up)]) as gw:
        for name in ("nope", "nope-2", "nope-3"):
            r = httpx.post(gw.url + "/v1/chat/completions", json={**CHAT, "model": name})
            assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
        # Made-up names share one `unknown` series instead of minting one each.
        text = httpx.get(gw.url + "/metrics").text
        assert "nope" not in text
        assert gw.metric('llmserve_requests_total{backend="",model="unknown",status="404"}') == 3


def test_ttft_is_recorded_for_streams_only(upstreams: UpstreamFactory) -> None:
    up = upstreams()
    with run_gateway(backends=[url_of(up)]) as gw:
        assert httpx.post(gw.url + "/v1/chat/completions", json=CHAT).status_code == 200
        stream = httpx.post(gw.url + "/v1/chat/completions", json={**CHAT, "stream": True})
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
            r = httpx.post(gw.url + "/v1/chat/completions", content=body)
        else:  # chunked: no Content-Length to trust, the limit is counted on the stream
            r = httpx.post(gw.url + "/v1/chat/completions",
                           content=iter([body[:3000].encode(), body[3000:].encode()]))
        assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"
        assert httpx.get(gw.url + "/health").status_code == 200


def test_client_disconnect_mid_stream_closes_the_upstream(upstreams: UpstreamFactory) -> None:
    up = upstreams(token_delay_s=0.05)
    with run_gateway(backends=[url_of(up)]) as gw, httpx.Client() as c:
        with c.stream("POST", gw.url + "/v1/chat/completions",
                      json={**CHAT, "max_tokens": 200, "stream": True}) as r:
            it = r.iter_bytes()
            next(it)
        # The fake upstream notices the closed connection at its next token write.
        deadline = time.monotonic() + 2
        while up.aborted == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert up.aborted == 1


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
                r = httpx.post(gw.url + "/v1/chat/completions",
                               json={**CHAT, "messages": messages})
                assert r.status_code == 200
                messages.append({"role": "assistant", "content": "fine " * 30})
            served = [u.completions - b for u, b in zip(ups, before, strict=True)]
            assert sorted(served) == [0, 3], served  # all three turns on one replica
        for key in ("alice", "bob", "carol"):  # explicit keys: the header, then `user`
            before = [u.completions for u in ups]
            for i in range(3):
                r = httpx.post(gw.url + "/v1/chat/completions", headers={"x-session-id": key},
                               json={**CHAT, "messages": [{"role": "user", "content": str(i)}]})
                r2 = httpx.post(gw.url + "/v1/completions",
                                json={"model": "demo", "prompt": "x" * i, "user": key + "!"})
                assert r.status_code == r2.status_code == 200
            served = [u.completions - b for u, b in zip(ups, before, strict=True)]
            assert sorted(served) in ([0, 6], [3, 3]), served
        assert gw.metric("llmserve_affinity_hits_total") >= 6 * 2 + 3 * 2 * 2
