"""The GPU, per-pod and per-GPU panels on a real Prometheus (Debian's), over synthetic series of
known values: DCGM exporter's GPUs (no GPU here), vLLM engines and the gateway's pool layouts,
labelled as the chart's monitors label them. Each panel must show exactly the series expected,
with the figures that follow from the inputs.

The cluster: pool `tp` (TP=2) runs two replicas of one pod and two GPUs each; pool `pp` (PP=2 over
2 nodes) one replica, a LeaderWorkerSet group of a serving leader and a follower that serves no
metrics, one GPU each. Around them: an idle GPU (no pod), and a namespace that is not the
release's, with a pod of the same name.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.dashboards import engines, gpus, tp_vs_pp
from deploy.dashboards.common import Dashboard, Panel, substitute
from deploy.dashboards.render import legend
from tests.dashboardquery import ALL, instant, resolve
from tests.prometheusserver import PrometheusServer, Target, prometheus_server
from tests.syntheticexporter import Series, synthetic_exporter

# A real Prometheus scraping for several seconds before the first query: full tier only.
pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

NS = "inference"
RATE = "3s"  # $__rate_interval; the data must cover it (see `scraped`)
TP_PODS = ("llmserve-tp-5d8f7-x2k4p", "llmserve-tp-5d8f7-q9z7w")
PP_LEADER, PP_FOLLOWER = "llmserve-pp-0", "llmserve-pp-0-1"
MODELS = {"tp": "m-tp", "pp": "m-pp"}
# Generation tok/s of each serving pod.
TOKENS = {TP_PODS[0]: 300.0, TP_PODS[1]: 500.0, PP_LEADER: 200.0}
# The pod of every GPU: (pod, gpu index) -> (utilisation %, FB used MiB, FB free MiB, watts).
GPUS = {
    (TP_PODS[0], "0"): (90.0, 70000.0, 10000.0, 400.0),
    (TP_PODS[0], "1"): (80.0, 72000.0, 8000.0, 380.0),
    (TP_PODS[1], "2"): (60.0, 60000.0, 20000.0, 300.0),
    (TP_PODS[1], "3"): (70.0, 64000.0, 16000.0, 320.0),
    (PP_LEADER, "0"): (50.0, 40000.0, 40000.0, 250.0),
    (PP_FOLLOWER, "0"): (30.0, 36000.0, 44000.0, 200.0),
}
POOL_OF = {**dict.fromkeys(TP_PODS, "tp"), PP_LEADER: "pp", PP_FOLLOWER: "pp"}
# p95 of a histogram whose observations all fall in (lo, hi]: Prometheus interpolates linearly.
TTFT_BUCKET = {TP_PODS[0]: (0.05, 0.1), TP_PODS[1]: (0.1, 0.5), PP_LEADER: (0.5, 1.0)}


def _histogram(name: str, labels: dict[str, str], lo: float, hi: float) -> list[Series]:
    per_s = 4.0
    return [Series(f"{name}_bucket", {**labels, "le": str(le)}, per_s if le >= hi else 0.0,
                   counter=True) for le in (lo, hi, float("inf"))] + [
        Series(f"{name}_count", labels, per_s, counter=True)]


def _engine(pod: str) -> list[Series]:
    labels = {"model_name": MODELS[POOL_OF[pod]], "engine": "0"}
    lo, hi = TTFT_BUCKET[pod]
    return [Series("vllm:num_requests_running", labels, 3.0),
            Series("vllm:generation_tokens_total", labels, TOKENS[pod], counter=True),
            *_histogram("vllm:time_to_first_token_seconds", labels, lo, hi),
            *_histogram("vllm:inter_token_latency_seconds", labels, lo / 10, hi / 10)]


def _dcgm() -> list[Series]:
    out = []

    def gpu(labels: dict[str, str], util: float, used: float, free: float, watts: float) -> None:
        out.extend([Series(gpus.GPU_UTIL, labels, util), Series(gpus.FB_USED, labels, used),
                    Series(gpus.FB_FREE, labels, free), Series(gpus.POWER, labels, watts)])

    for (pod, index), figures in GPUS.items():
        host = "node-a" if pod in TP_PODS else ("node-b" if pod == PP_LEADER else "node-c")
        gpu({"gpu": index, "UUID": f"GPU-{pod}-{index}", "modelName": "NVIDIA H100 80GB HBM3",
             "Hostname": host, "namespace": NS, "pod": pod, "container": "vllm"}, *figures)
    # An idle GPU: no pod holds it, so it has no pod labels (Prometheus adds the exporter's).
    gpu({"gpu": "1", "UUID": "GPU-idle", "modelName": "NVIDIA H100 80GB HBM3",
         "Hostname": "node-c"}, 0.0, 0.0, 80000.0, 60.0)
    # Someone else's namespace, a pod of the same name: never in the release's panels.
    gpu({"gpu": "5", "UUID": "GPU-other", "modelName": "NVIDIA H100 80GB HBM3",
         "Hostname": "node-d", "namespace": "other", "pod": TP_PODS[0], "container": "vllm"},
        5.0, 1.0, 2.0, 99.0)
    return out


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PrometheusServer, float]]:
    """Prometheus scraping the synthetic cluster for long enough that every rate window is
    covered; yields it and the time to evaluate at."""
    tmp = Path(tmp_path_factory.mktemp("prometheus"))
    pool_info = [Series("llmserve_pool_info", {"pool": p, "model": MODELS[p], "tp": tp, "pp": pp,
                                               "nodes": nodes}, 1.0)
                 for p, tp, pp, nodes in (("tp", "2", "1", "1"), ("pp", "1", "2", "2"))]
    pods = [*TP_PODS, PP_LEADER]
    with (synthetic_exporter(pool_info) as gateway,
          synthetic_exporter(_dcgm()) as dcgm,
          synthetic_exporter(_engine(pods[0])) as e0,
          synthetic_exporter(_engine(pods[1])) as e1,
          synthetic_exporter(_engine(pods[2])) as e2,
          synthetic_exporter(_engine(pods[0])) as elsewhere):
        targets = [
            Target("llm-llmserve-gateway", gateway, {"namespace": NS, "pod": "gw-0"}),
            *(Target(f"{NS}/llm-llmserve-workers", url,
                     {"namespace": NS, "pool": POOL_OF[pod], "pod": pod})
              for url, pod in zip((e0, e1, e2), pods, strict=True)),
            Target("other/workers", elsewhere, {"namespace": "other", "pool": "tp",
                                                "pod": TP_PODS[0]}),
            Target("dcgm-exporter", dcgm, {"namespace": "gpu-operator",
                                           "pod": "nvidia-dcgm-exporter-7xk2q"},
                   honor_labels=True),
        ]
        with prometheus_server(tmp, targets) as prom:
            started = time.time()
            prom.wait_scraped(started, len(targets))
            time.sleep(int(RATE.removesuffix("s")) + 1.2)
            yield prom, time.time()


def _panel(d: Dashboard, title: str) -> Panel:
    (p,) = [p for p in d.panels() if p.title == title]
    return p


def _shown(prom: PrometheusServer, at: float, d: Dashboard, title: str,
           preferred: dict[str, str]) -> dict[str, float]:
    """What the panel draws at `at`: legend -> value, every query's series together."""
    values = resolve(prom, d, at - 60, at, preferred, RATE)
    p = _panel(d, title)
    shown: dict[str, float] = {}
    for query, result in zip(p.queries, instant(prom, p, values, at), strict=True):
        for s in result:
            name = legend(substitute(query.legend, values), s["metric"])
            assert name not in shown, (title, name)
            shown[name] = float(s["value"][1])
    return shown


def _close(got: dict[str, float], want: dict[str, float], rel: float = 1e-6) -> None:
    assert set(got) == set(want), (sorted(got), sorted(want))
    for k, v in want.items():
        assert got[k] == pytest.approx(v, rel=rel, abs=1e-9), (k, got[k], v)


ENGINES = engines.dashboard()
ALL_POOLS = {"namespace": NS, "model": ALL, "pool": ALL}


def _per_gpu(i: int) -> dict[str, float]:
    return {f"{pod} GPU {index}": f[i] for (pod, index), f in GPUS.items()}


def test_gpu_row_shows_every_gpu_of_the_pools_followers_included(
        scraped: tuple[PrometheusServer, float]) -> None:
    prom, at = scraped
    _close(_shown(prom, at, ENGINES, "GPU utilisation per GPU", ALL_POOLS), _per_gpu(0))
    _close(_shown(prom, at, ENGINES, "GPU power per GPU", ALL_POOLS), _per_gpu(3))
    _close(_shown(prom, at, ENGINES, "GPU memory used per GPU", ALL_POOLS),
           {f"{pod} GPU {index}": used / (used + free)
            for (pod, index), (_, used, free, _) in GPUS.items()})


def test_gpu_rows_follow_the_pool_variable(scraped: tuple[PrometheusServer, float]) -> None:
    prom, at = scraped
    pp_only = {**ALL_POOLS, "pool": "pp"}
    _close(_shown(prom, at, ENGINES, "GPU power per pod", pp_only),
           {f"pp {PP_LEADER}": 250.0, f"pp {PP_FOLLOWER}": 200.0})


def test_gpu_per_pod_panels_aggregate_each_pods_gpus(
        scraped: tuple[PrometheusServer, float]) -> None:
    prom, at = scraped
    by_pod: dict[str, list[tuple[float, float, float, float]]] = {}
    for (pod, _), figures in GPUS.items():
        by_pod.setdefault(f"{POOL_OF[pod]} {pod}", []).append(figures)
    _close(_shown(prom, at, ENGINES, "GPU utilisation per pod", ALL_POOLS),
           {k: sum(f[0] for f in fs) / len(fs) for k, fs in by_pod.items()})
    _close(_shown(prom, at, ENGINES, "GPU memory used per pod", ALL_POOLS),
           {k: sum(f[1] for f in fs) for k, fs in by_pod.items()})
    _close(_shown(prom, at, ENGINES, "GPU power per pod", ALL_POOLS),
           {k: sum(f[3] for f in fs) for k, fs in by_pod.items()})


def test_engine_views_per_pod(scraped: tuple[PrometheusServer, float]) -> None:
    prom, at = scraped
    _close(_shown(prom, at, ENGINES, "Generation tokens/s per pod", ALL_POOLS),
           {f"{POOL_OF[pod]} {pod}": rate for pod, rate in TOKENS.items()}, rel=0.02)
    # Every observation in (lo, hi]: p95 = lo + 0.95 (hi - lo).
    _close(_shown(prom, at, ENGINES, "Engine TTFT per pod (p95)", ALL_POOLS),
           {f"{POOL_OF[pod]} {pod}": lo + 0.95 * (hi - lo)
            for pod, (lo, hi) in TTFT_BUCKET.items()}, rel=1e-3)
    _close(_shown(prom, at, ENGINES, "Engine ITL per pod (p95)", {**ALL_POOLS, "pool": "tp"}),
           {f"tp {pod}": (lo + 0.95 * (hi - lo)) / 10 for pod, (lo, hi) in TTFT_BUCKET.items()
            if pod in TP_PODS}, rel=1e-3)


TP_VS_PP = tp_vs_pp.dashboard()
SIDES = {"namespace": NS, "pool_a": "tp", "pool_b": "pp"}


def test_tp_vs_pp_divides_throughput_by_each_layouts_gpus(
        scraped: tuple[PrometheusServer, float]) -> None:
    prom, at = scraped
    # tp: 800 tok/s over 2 replicas x TP 2; pp: 200 tok/s over 1 replica x PP 2.
    _close(_shown(prom, at, TP_VS_PP, "Output tokens/s per GPU", SIDES),
           {"tp": 800 / 4, "pp": 200 / 2}, rel=0.02)
    tp_gpus = [f for (pod, _), f in GPUS.items() if POOL_OF[pod] == "tp"]
    pp_gpus = [f for (pod, _), f in GPUS.items() if POOL_OF[pod] == "pp"]
    _close(_shown(prom, at, TP_VS_PP, "GPU utilisation (mean)", SIDES),
           {"tp": sum(f[0] for f in tp_gpus) / 4, "pp": sum(f[0] for f in pp_gpus) / 2})
    _close(_shown(prom, at, TP_VS_PP, "GPU power (mean per GPU)", SIDES),
           {"tp": sum(f[3] for f in tp_gpus) / 4, "pp": sum(f[3] for f in pp_gpus) / 2})
