"""Resuming a broken stream on another replica (api/resume.py), against fake upstreams that drop
the connection mid-stream; the token-exact proof on real engines is tests/e2e/
test_zz_replica_failure.py."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.api.resume_splice import ResumeSplice
from tests import loopback
from tests.gateway.conftest import UpstreamFactory, run_gateway, url_of
from tests.waiting import wait_for

# vLLM 0.32's own bytes (captured from a real engine): the same stream asked without and with
# `return_token_ids`.
PLAIN = (
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices"'
    b':[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}'
    b'],"prompt_token_ids":null,"prompt_text":null}\n\n'
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices"'
    b':[{"index":0,"delta":{"content":"The"},"logprobs":null,"finish_reason":null,"token_ids":null'
    b'}]}\n\n'
    b'data: {"id":"cmpl-2","object":"text_completion","created":1,"model":"m","choices":[{"index"'
    b':0,"text":" ","logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":'
    b'null,"token_ids":null}]}\n\n')
WITH_IDS = (PLAIN.replace(b'"prompt_token_ids":null,"prompt_text"',
                          b'"prompt_token_ids":[1,9690,198],"prompt_text"')
            .replace(b'"content":"The"},"logprobs":null,"finish_reason":null,"token_ids":null',
                     b'"content":"The"},"logprobs":null,"finish_reason":null,"token_ids":[504]')
            .replace(b'"prompt_token_ids":null,"token_ids":null',
                     b'"prompt_token_ids":null,"token_ids":[216,17]'))
CHAT = {"model": "demo", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def test_the_splice_keeps_the_ids_and_gives_the_client_the_engines_plain_bytes() -> None:
    for cut in (len(WITH_IDS), 100, 7):  # whole, and split into reads at awkward places
        s = ResumeSplice(0.0, strip_usage=False, strip_ids=True)
        for i in range(0, len(WITH_IDS), cut):
            s.feed(WITH_IDS[i:i + cut], 1.0)
            if s.held:
                s.first = s.first or s.held
        out = s.first if cut == len(WITH_IDS) else None
        assert s.token_ids() == ([1, 9690, 198], [504, 216, 17])
        if out is not None:
            assert out == PLAIN
    kept = ResumeSplice(0.0, strip_usage=False, strip_ids=False)
    kept.feed(WITH_IDS, 1.0)
    assert kept.held == WITH_IDS  # the client asked for the ids: untouched
    assert kept.token_ids() == ([1, 9690, 198], [504, 216, 17])


def events(text: str) -> list[dict[str, Any]]:
    return [orjson.loads(e[6:]) for e in text.split("\n\n") if e.startswith("data: {")]


def content(evs: list[dict[str, Any]]) -> str:
    return "".join(c.get("text", c.get("delta", {}).get("content") or "")
                   for e in evs for c in e["choices"])


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_a_stream_cut_on_one_replica_goes_on_from_the_other(
    upstreams: UpstreamFactory, kind: str
) -> None:
    n = 12
    broken = upstreams(drop_after=6)
    whole = upstreams()
    path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
    body: dict[str, Any] = ({**CHAT} if kind == "chat" else
                            {"model": "demo", "prompt": "hi", "stream": True})
    body |= {"max_tokens": n, "stream_options": {"include_usage": True}}
    # Round robin: of two streams in a row, one starts on the replica that breaks.
    with run_gateway(backends=[url_of(broken), url_of(whole)], routing_policy="round_robin",
                     stream_resumes=2) as gw:
        for _ in range(2):
            text = loopback.post(gw.url + path, json=body, timeout=30).text
            evs = events(text)
            assert text.endswith("data: [DONE]\n\n") and '"error"' not in text, text
            assert content(evs) == " tok" * n
            assert len({e["id"] for e in evs}) == 1
            assert {e["object"] for e in evs} == {
                "chat.completion.chunk" if kind == "chat" else "text_completion"}
            usage = [e["usage"] for e in evs if e.get("usage")]
            assert usage == [{"prompt_tokens": 5, "total_tokens": 5 + n, "completion_tokens": n}]
            assert '"token_ids":[' not in text  # asked on the gateway's account, hidden again
        assert gw.metric('llmserve_stream_resumes_total{outcome="resumed"}') >= 1
    # The other replica was asked to continue from the prompt's ids and the tokens relayed.
    req = whole.last_request
    assert req is not None
    relayed = 5 if kind == "chat" else 6  # chat's first event is the role, with no token
    assert req["prompt"] == [1, 2, 3, 4, 5] + [100 + i for i in range(relayed)]
    assert req["max_tokens"] == n - relayed and req["return_token_ids"] is True


def test_without_another_replica_the_client_gets_todays_in_band_error(
    upstreams: UpstreamFactory
) -> None:
    up = upstreams(drop_after=4)
    with run_gateway(backends=[url_of(up)], stream_resumes=2) as gw:
        text = loopback.post(gw.url + "/v1/chat/completions", timeout=30,
                             json={**CHAT, "max_tokens": 12}).text
        evs = text.split("\n\n")
        assert evs[-2].startswith('data: {"error"') and "[DONE]" not in text, text
        assert '"token_ids":[' not in text
        assert gw.metric('llmserve_stream_resumes_total{outcome="no_replica"}') == 1


def test_a_request_that_cannot_be_resumed_is_not_asked_for_ids_and_ends_in_band(
    upstreams: UpstreamFactory
) -> None:
    up, other = upstreams(drop_after=4), upstreams(drop_after=4)
    with run_gateway(backends=[url_of(up), url_of(other)], stream_resumes=2) as gw:
        text = loopback.post(gw.url + "/v1/chat/completions", timeout=30,
                             json={**CHAT, "max_tokens": 12, "stop": ["\n"]}).text
        assert text.split("\n\n")[-2].startswith('data: {"error"'), text
        assert gw.metric('llmserve_stream_resumes_total{outcome="unsupported"}') == 1
    asked = [u.last_request for u in (up, other) if u.last_request]
    assert len(asked) == 1 and "return_token_ids" not in asked[0]


def test_resuming_off_by_default_asks_for_nothing_and_counts_nothing(
    upstreams: UpstreamFactory
) -> None:
    up, other = upstreams(drop_after=4), upstreams(drop_after=4)
    with run_gateway(backends=[url_of(up), url_of(other)]) as gw:
        text = loopback.post(gw.url + "/v1/chat/completions", timeout=30,
                             json={**CHAT, "max_tokens": 12}).text
        assert text.split("\n\n")[-2].startswith('data: {"error"'), text
        assert gw.metric("llmserve_stream_resumes_total") == 0
    asked = [u.last_request for u in (up, other) if u.last_request]
    assert len(asked) == 1 and "return_token_ids" not in asked[0]


def test_every_resume_outcome_is_exported_at_zero_before_any_break(
    upstreams: UpstreamFactory
) -> None:
    # A dashboard's rate or an alert on an outcome needs its series before the first broken
    # stream: all six, at 0, on a gateway that has served nothing.
    with run_gateway(backends=[url_of(upstreams())], stream_resumes=2) as gw:
        text = loopback.get(gw.url + "/metrics").text
    lines = {line for line in text.splitlines()
             if line.startswith("llmserve_stream_resumes_total{")}
    assert lines == {f'llmserve_stream_resumes_total{{outcome="{o}"}} 0.0' for o in (
        "resumed", "failed", "no_replica", "limit", "deadline", "unsupported")}


def test_a_client_that_asked_for_the_ids_gets_them_across_the_resume(
    upstreams: UpstreamFactory
) -> None:
    n = 10
    broken, whole = upstreams(drop_after=5), upstreams()
    with run_gateway(backends=[url_of(broken), url_of(whole)], routing_policy="round_robin",
                     stream_resumes=2) as gw:
        for _ in range(2):
            text = loopback.post(gw.url + "/v1/completions", timeout=30, json={
                "model": "demo", "prompt": "hi", "stream": True, "max_tokens": n,
                "return_token_ids": True}).text
            evs = events(text)
            ids = [t for e in evs for c in e["choices"] for t in (c.get("token_ids") or [])]
            assert ids == [100 + i for i in range(5)] + [100 + i for i in range(n - 5)] or \
                ids == [100 + i for i in range(n)], ids
            assert content(evs) == " tok" * n
        assert gw.metric('llmserve_stream_resumes_total{outcome="resumed"}') >= 1


def test_a_client_that_hangs_up_during_the_resumed_stream_aborts_it(
    upstreams: UpstreamFactory
) -> None:
    broken, slow = upstreams(drop_after=3), upstreams(token_delay_s=0.05)
    with run_gateway(backends=[url_of(broken), url_of(slow)], routing_policy="round_robin",
                     stream_resumes=2) as gw:
        # Round robin's first pick is the second backend in URL order: make it the broken one.
        if sorted([url_of(broken), url_of(slow)])[1] != url_of(broken):
            loopback.post(gw.url + "/v1/completions", timeout=30,
                          json={"model": "demo", "prompt": "hi", "max_tokens": 1})
        with loopback.client(timeout=30) as c, c.stream(
                "POST", gw.url + "/v1/chat/completions",
                json={**CHAT, "max_tokens": 200}) as resp:
            seen = b""
            for chunk in resp.iter_bytes():
                seen += chunk
                if seen.count(b"\n\n") >= 6:  # 3 before the break, 3 resumed
                    break
        wait_for(lambda: slow.aborted == 1)
        cut = (f'llmserve_requests_total{{backend="{url_of(broken)}",'
               'endpoint="/v1/chat/completions",model="demo",status="499"}')
        wait_for(lambda: gw.metric(cut) == 1)
        assert gw.metric('llmserve_stream_resumes_total{outcome="resumed"}') == 0


def test_an_engine_error_event_mid_stream_is_resumed_from_the_other_replica(
    upstreams: UpstreamFactory
) -> None:
    n = 10
    failing, whole = upstreams(error_after=4, token_delay_s=0.01), upstreams()
    with run_gateway(backends=[url_of(failing), url_of(whole)], routing_policy="round_robin",
                     stream_resumes=2) as gw:
        for _ in range(2):  # one of the two starts on the failing replica
            text = loopback.post(gw.url + "/v1/chat/completions", timeout=30,
                                 json={**CHAT, "max_tokens": n}).text
            assert text.endswith("data: [DONE]\n\n") and '"error"' not in text, text
            assert content(events(text)) == " tok" * n
        assert gw.metric('llmserve_stream_resumes_total{outcome="resumed"}') >= 1


def test_an_engine_error_event_that_cannot_be_resumed_reaches_the_client_unchanged(
    upstreams: UpstreamFactory
) -> None:
    up = upstreams(error_after=4, token_delay_s=0.01)  # one event a read, as at a real pace
    with run_gateway(backends=[url_of(up)], stream_resumes=2) as gw:
        text = loopback.post(gw.url + "/v1/chat/completions", timeout=30,
                             json={**CHAT, "max_tokens": 10}).text
        assert text.endswith(
            'data: {"error": {"message": "Internal server error", "type": '
            '"InternalServerError", "param": null, "code": 500}}\n\ndata: [DONE]\n\n'), text
        assert text.count("data: ") == 6  # the 4 events before it, the error, [DONE]
        assert gw.metric('llmserve_stream_resumes_total{outcome="no_replica"}') == 1
