"""A restarted engine's KV index is emptied at once, on the real engines (issue 40): no request may
be routed to a cache that is gone.

The restarts are test_rolling_restart.py's (SIGTERM to each worker in turn, which drains it, stops
vLLM and starts it again): a restart of this test's own would cost minutes of engine start-up. The
session's KvWatch (tests/e2e/kv_watch.py), started by test_kv_events.py, followed the workers' KV
events through them with the gateway's own subscriber and noted each index reset and each time a
worker's /health answered again. Named `zy`: after the rolling restart, before
test_zz_replica_failure.py kills worker 1.
"""

from __future__ import annotations

import time
import uuid

import pytest

from devstack.stack import LocalStack
from tests import loopback
from tests.e2e.kv_watch import KvWatch

pytestmark = pytest.mark.engine


def test_a_restarted_engines_index_was_emptied_before_it_served_again(
        stack: LocalStack, kv_watch: KvWatch, model_name: str) -> None:
    restarted = {u: r for u, r in kv_watch.replicas.items() if r.backs or r.resets}
    if not restarted:
        pytest.skip("no worker was restarted while the KV events were followed: run it after "
                    "test_kv_events.py and test_rolling_restart.py, as the engine tier does")
    for url, r in restarted.items():
        assert r.backs, f"{url}: its index was reset but it was never seen down and back"
        since = 0.0
        for back in r.backs:
            # The index was reset after the replica last served and before it answered again
            # (when its engine stopped: during the drain, while the worker still answers 503,
            # or after its port closed): never routable with the old engine's blocks.
            assert any(since < x.at < back.at for x in r.resets), (url, r.resets, r.backs)
            since = back.at
        # Each reset emptied the index at once, and the blocks it held were real ones.
        assert r.resets and all(x.held_after == 0 for x in r.resets), (url, r.resets)
        first = r.resets[0]
        assert first.held_before, f"{url}: its index held no block before the restart"
        # When it could be routed to again, none of the old engine's blocks was claimed.
        assert not (r.backs[0].blocks & first.held_before), url
        assert r.resets[0].at < r.backs[0].at
    # The index follows the new engines: a prompt served by a restarted worker is indexed again.
    url = next(iter(restarted))
    index = kv_watch.events.indexes[url]
    before = len(index.blocks)
    resp = loopback.post(url + "/v1/completions", timeout=120, json={
        "model": model_name, "prompt": f"[{uuid.uuid4()}] " + "Good evening. " * 90,
        "max_tokens": 2})
    assert resp.status_code == 200, resp.text
    deadline = time.monotonic() + 20
    while len(index.blocks) <= before:
        assert time.monotonic() < deadline, f"{url}: the new engine's events are not indexed"
        time.sleep(0.05)
    assert not index.stale
