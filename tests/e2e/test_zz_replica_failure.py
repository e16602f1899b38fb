"""A replica dies under traffic. Named `zz` so it runs after every test that needs both replicas:
it kills worker 1 for the rest of the session (restarting vLLM would cost minutes)."""

from __future__ import annotations

import threading
import time

import pytest
from openai import OpenAI

from devstack.stack import LocalStack
from tests import loopback

pytestmark = pytest.mark.engine


def test_killed_replica_breaks_its_stream_in_band_and_new_requests_fail_over(
    stack: LocalStack, model_name: str
) -> None:
    url = stack.gateway_url + "/v1/completions"
    body = {"model": model_name, "prompt": "Count slowly:", "max_tokens": 300, "stream": True,
            "ignore_eos": True}
    streams: list[list[bytes]] = [[], []]
    started = threading.Barrier(3)

    def consume(i: int) -> None:
        with loopback.client(timeout=120) as c, c.stream("POST", url, json=body) as resp:
            assert resp.status_code == 200
            it = resp.iter_bytes()
            streams[i].append(next(it))
            started.wait(timeout=60)
            for chunk in it:
                streams[i].append(chunk)

    # Two concurrent streams: least-outstanding puts one on each replica.
    threads = [threading.Thread(target=consume, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    started.wait(timeout=60)
    # SIGKILL the replica's launcher and its engine (its own process group) as a node crash would.
    stack.worker_procs[1].kill_hard()
    for t in threads:
        t.join(timeout=120)
        assert not t.is_alive()

    texts = [b"".join(s).decode() for s in streams]
    broken = [t for t in texts if "[DONE]" not in t]
    whole = [t for t in texts if "[DONE]" in t]
    assert len(broken) == 1 and len(whole) == 1, [t[-300:] for t in texts]
    events = [e for e in broken[0].split("\n\n") if e.strip()]
    error_events = [e for e in events if e.startswith('data: {"error"')]
    assert len(error_events) == 1 and events[-1] == error_events[0], events[-3:]

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
