"""gateway/metrics.py on its own: ITL's exposition through the registry, the pool info metric."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import build_app
from gateway.metrics import GatewayMetrics
from gateway.settings import GatewaySettings, PoolLayout


def samples(metrics: GatewayMetrics, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    text = generate_latest(metrics.registry).decode()
    return {
        (("__name__", s.name), *sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith(name)
    }


def test_itl_is_exported_through_the_registry() -> None:
    m = GatewayMetrics()
    m.itl.labels("demo").observe_many([0.02, 0.03])
    got = samples(m, "llmserve_itl_seconds")
    assert got[(("__name__", "llmserve_itl_seconds_count"), ("model", "demo"))] == 2
    assert got[(("__name__", "llmserve_itl_seconds_bucket"), ("le", "0.02"), ("model", "demo"))] == 1


def test_pool_info_carries_each_configured_layout() -> None:
    settings = GatewaySettings(
        backends=["http://127.0.0.1:9"],
        pools=[PoolLayout(name="llama-tp", model="llama", tp=8),
               PoolLayout(name="llama-pp", model="llama-pp", tp=4, pp=2, nodes=2)],
    )
    app = build_app(settings)
    metrics = app.state.metrics
    got = samples(metrics, "llmserve_pool_info")
    assert got == {
        (("__name__", "llmserve_pool_info"), ("model", "llama"), ("nodes", "1"), ("pool", "llama-tp"),
         ("pp", "1"), ("tp", "8")): 1.0,
        (("__name__", "llmserve_pool_info"), ("model", "llama-pp"), ("nodes", "2"),
         ("pool", "llama-pp"), ("pp", "2"), ("tp", "4")): 1.0,
    }


def test_a_models_series_are_the_labelled_children_and_count_by_backend_and_status() -> None:
    m = GatewayMetrics()
    s = m.series("demo")
    assert m.series("demo") is s  # looked up once per model
    assert s.ttft is m.ttft.labels("demo") and s.output_tokens is m.output_tokens.labels("demo")
    s.request("/v1/completions", "http://a", "200")
    s.request("/v1/completions", "http://a", "200")
    s.request("/v1/chat/completions", "http://b", "502")
    s.output_tokens.inc(7)
    got = samples(m, "llmserve_requests_total")
    assert got[(("__name__", "llmserve_requests_total"), ("backend", "http://a"),
                ("endpoint", "/v1/completions"), ("model", "demo"), ("status", "200"))] == 2
    assert got[(("__name__", "llmserve_requests_total"), ("backend", "http://b"),
                ("endpoint", "/v1/chat/completions"), ("model", "demo"), ("status", "502"))] == 1
    assert samples(m, "llmserve_output_tokens_total") == {
        (("__name__", "llmserve_output_tokens_total"), ("model", "demo")): 7}
