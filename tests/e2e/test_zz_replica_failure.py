"""A replica dies under traffic. Named `zz` so it runs after every test that needs both replicas:
it kills worker 1 for the rest of the session (restarting vLLM would cost minutes).

Issue 38's acceptance: through a gateway that resumes (the `resuming_gateway` fixture), every
stream the dead replica held goes on from the other one, token-exact; through the stack's gateway
(resuming off, the default) the stream it held ends with one in-band error event, as before."""

from __future__ import annotations

import threading
import time
from typing import Any

import orjson
import pytest
from openai import OpenAI

from devstack.stack import LocalStack
from tests import loopback
from tests.waiting import metric_sum, scrape

pytestmark = pytest.mark.engine

STREAMS = 8
TOKENS = 200


def bodies(model: str) -> list[tuple[str, dict[str, Any]]]:
    """Half chat, half completions, each its own prompt, some asking for usage, some for the
    token ids (so the test can compare them): (path, body)."""
    out: list[tuple[str, dict[str, Any]]] = []
    for i in range(STREAMS):
        common = {"model": model, "max_tokens": TOKENS, "temperature": 0, "stream": True,
                  "ignore_eos": True, **({"return_token_ids": True} if i % 4 in (0, 3) else {})}
        if i % 2:
            out.append(("/v1/chat/completions", {**common, "messages": [
                {"role": "user", "content": f"Tell me story number {i} about a lighthouse."}],
                "stream_options": {"include_usage": True}}))
        else:
            out.append(("/v1/completions", {**common, "prompt": f"Chapter {i}. The ship",
                        **({"stream_options": {"include_usage": True}} if i % 4 else {})}))
    return out


def parse(raw: bytes) -> tuple[str, list[int], list[dict[str, Any]], list[bytes]]:
    """(the text, the token ids if sent, the usage events, every event) of one SSE body."""
    events = [e for e in raw.split(b"\n\n") if e.strip()]
    pieces: list[str] = []
    ids: list[int] = []
    usages: list[dict[str, Any]] = []
    for e in events:
        if e == b"data: [DONE]":
            continue
        obj = orjson.loads(e.removeprefix(b"data: "))
        if obj.get("usage"):
            usages.append(obj)
        for c in obj.get("choices", []):
            pieces.append(c.get("text", c.get("delta", {}).get("content", "")))
            ids += c.get("token_ids") or []
    return "".join(pieces), ids, usages, events


def run_streams(url: str, requests: list[tuple[str, dict[str, Any]]],
                mid: threading.Barrier | None = None) -> list[bytes]:
    """Every request streamed at once; with `mid`, each waits at it after 30 events."""
    out: list[bytes] = [b""] * len(requests)

    def one(i: int) -> None:
        path, body = requests[i]
        got: list[bytes] = []
        waited = mid is None
        with loopback.client(timeout=300) as c, c.stream("POST", url + path, json=body) as resp:
            assert resp.status_code == 200
            for chunk in resp.iter_bytes():
                got.append(chunk)
                if not waited and b"".join(got).count(b"\n\n") >= 30:
                    waited = True
                    assert mid is not None
                    mid.wait(timeout=120)
        out[i] = b"".join(got)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
        assert not t.is_alive()
    return out


def consume_off(url: str, body: dict[str, Any], out: list[bytes], mid: threading.Barrier) -> None:
    """One stream through a gateway that does not resume; waits at `mid` after its first bytes."""
    with loopback.client(timeout=300) as c, c.stream("POST", url, json=body) as resp:
        assert resp.status_code == 200
        it = resp.iter_bytes()
        out.append(next(it))
        mid.wait(timeout=120)
        out.extend(it)


def test_killed_replica_streams_resume_token_exact_and_new_requests_fail_over(
    stack: LocalStack, resuming_gateway: str, model_name: str
) -> None:
    requests = bodies(model_name)
    # The reference: the same streams, uninterrupted, at temperature 0.
    reference = run_streams(resuming_gateway, requests)
    before = scrape(resuming_gateway)

    # Beside them, two streams through the stack's gateway, which does not resume (the default):
    # least-outstanding puts one on each replica, and the one on the killed replica must end
    # as it always did, with one in-band error event.
    mid = threading.Barrier(STREAMS + 2 + 1)
    off_body = {"model": model_name, "prompt": "Count slowly:", "max_tokens": 300,
                "stream": True, "ignore_eos": True}
    off: list[list[bytes]] = [[], []]
    off_threads = [threading.Thread(target=consume_off, daemon=True, args=(
        stack.gateway_url + "/v1/completions", off_body, off[i], mid)) for i in range(2)]
    killer_done = threading.Event()

    def kill_mid_stream() -> None:
        mid.wait(timeout=120)  # every stream has 30 events: mid-stream on both replicas
        # SIGKILL the replica's launcher and its engine (their process groups): a node lost.
        stack.worker_procs[1].kill_hard()
        killer_done.set()

    killer = threading.Thread(target=kill_mid_stream)
    killer.start()
    for t in off_threads:
        t.start()
    got = run_streams(resuming_gateway, requests, mid)
    killer.join(timeout=130)
    assert killer_done.is_set()
    for t in off_threads:
        t.join(timeout=300)
        assert not t.is_alive()

    after = scrape(resuming_gateway)
    resumed = (after.get('llmserve_stream_resumes_total{outcome="resumed"}', 0)
               - before.get('llmserve_stream_resumes_total{outcome="resumed"}', 0))
    for i, ((path, body), ref, raw) in enumerate(zip(requests, reference, got, strict=True)):
        ref_text, ref_ids, ref_usage, _ = parse(ref)
        text, ids, usage, events = parse(raw)
        assert events[-1] == b"data: [DONE]", (i, events[-3:])
        assert not [e for e in events if e.startswith(b'data: {"error"')], (i, events[-3:])
        # Token for token as the uninterrupted run: the same text, and where the client asked
        # for them, the same token ids (vLLM may pack several tokens in one event when its
        # reader lags, so events are not compared one by one).
        assert text == ref_text, (i, path)
        assert ids == ref_ids, (i, path)
        assert len(ids) == (TOKENS if body.get("return_token_ids") else 0), i
        # One final usage, the true totals (the prompt counted once), only if asked for.
        assert len(usage) == len(ref_usage) == (1 if "stream_options" in body else 0)
        if usage:
            u, r = usage[0]["usage"], ref_usage[0]["usage"]
            assert (u["prompt_tokens"], u["completion_tokens"], u["total_tokens"]) == (
                r["prompt_tokens"], TOKENS, r["prompt_tokens"] + TOKENS), i
        # Nothing the client did not ask for (no token ids), and one stream id.
        assert (b'"token_ids":[' in raw) is bool(body.get("return_token_ids")), i
        stream_ids = {orjson.loads(e[6:])["id"] for e in events if e.startswith(b"data: {")}
        assert len(stream_ids) == 1, (i, stream_ids)
    # The replica held about half of the streams: those were resumed on the other one.
    assert 1 <= resumed <= STREAMS, resumed
    assert metric_sum(after, "llmserve_stream_resumes_total") - metric_sum(
        before, "llmserve_stream_resumes_total") == resumed

    # Without resuming, the stream on the killed replica ends in band, the other one whole.
    texts = [b"".join(s).decode() for s in off]
    broken = [t for t in texts if "[DONE]" not in t]
    assert len(broken) == 1 and len(texts) - len(broken) == 1, [t[-300:] for t in texts]
    events_off = [e for e in broken[0].split("\n\n") if e.strip()]
    error_events = [e for e in events_off if e.startswith('data: {"error"')]
    assert len(error_events) == 1 and events_off[-1] == error_events[0], events_off[-3:]

    # New requests fail over to the survivor: every one succeeds (retry before first byte,
    # then passive ejection and the failed probe keep the dead replica out).
    client = OpenAI(base_url=stack.gateway_url + "/v1", api_key="unused", max_retries=0)
    t0 = time.monotonic()
    for _ in range(6):
        r = client.chat.completions.create(
            model=model_name, temperature=0, max_tokens=8,
            messages=[{"role": "user", "content": "What is the capital of France?"}])
        assert r.choices[0].message.content
        for _ in client.chat.completions.create(
            model=model_name, temperature=0, max_tokens=4, stream=True,
            messages=[{"role": "user", "content": "Hi"}]):
            pass
    assert time.monotonic() - t0 < 60
    ready = loopback.get(stack.gateway_url + "/ready").json()
    assert ready["status"] == "ready"
