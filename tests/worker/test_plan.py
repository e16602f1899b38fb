"""The parallelism planner on checked-in config.json files (no weights): memory, rooflines,
divisibility, ranking, output forms and bad input."""

from __future__ import annotations

import doctest
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
import yaml

import worker.layout
from worker.layout import read_spec
from worker.plan import GPUS, Layout, plan

CONFIGS = Path(__file__).parent / "configs"
REPO = Path(__file__).resolve().parents[2]
QWEN = CONFIGS / "Qwen2.5-72B-Instruct.json"
DEMO = CONFIGS / "SmolLM2-135M-Instruct.json"


def layouts(config: Path, gpu: str = "A100-80GB", per_node: int = 2, nodes: int = 1,
            **kw: Any) -> dict[tuple[int, int], Layout]:
    kw = {"dtype": None, "max_model_len": 8192, "utilization": 0.9, **kw}
    return {(x.tp, x.pp): x for x in plan(read_spec(config), GPUS[gpu], per_node, nodes, **kw)}


def run_plan(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "worker", "plan", *args], capture_output=True,
                          text=True, timeout=60, check=False, cwd=REPO)


def test_qwen_72b_on_two_a100_80gb() -> None:
    spec = read_spec(QWEN)
    assert 144e9 < spec.weights_bytes() < 146.5e9  # ~145 GB of bf16 weights
    by = layouts(QWEN)
    assert not by[(1, 1)].fits and "> 85.9 GB x 0.9" in by[(1, 1)].reason
    assert by[(2, 1)].fits and by[(1, 2)].fits
    tp2, pp2 = by[(2, 1)].decode_tok_s_single, by[(1, 2)].decode_tok_s_single
    assert 27 < tp2 < 29  # roofline: 2 x 2,039 GB/s over ~145 GB
    assert pp2 == pytest.approx(tp2 / 2, rel=0.01)  # one stage at a time
    # Measured on 2 x A100 SXM, one request at a time: TP=2 18.7, PP=2 10.7 tok/s, that is 67%
    # and 76% of these rooflines.
    assert 18.7 / tp2 == pytest.approx(0.67, abs=0.01)
    assert 10.7 / pp2 == pytest.approx(0.76, abs=0.01)


@pytest.mark.parametrize(
    ("config", "params_b"),
    [
        ("Llama-3.1-70B-Instruct.json", 70.6),
        ("Llama-3.1-8B-Instruct.json", 8.03),
        ("Mixtral-8x7B-v0.1.json", 46.7),  # all 8 experts count in the weights
        ("Qwen2.5-72B-Instruct.json", 72.7),
        ("SmolLM2-135M-Instruct.json", 0.1345),
    ],
)
def test_parameters_from_the_config_shapes(config: str, params_b: float) -> None:
    assert read_spec(CONFIGS / config).params() / 1e9 == pytest.approx(params_b, rel=0.005)


def test_kv_bytes_per_token_and_per_rank() -> None:
    demo = read_spec(DEMO)
    assert demo.kv_bytes_per_token("float32") == 2 * 30 * 3 * 64 * 4  # 46,080
    # TP=3: one KV head per rank; TP=6 would replicate (but 6 does not divide 9 heads).
    assert demo.kv_bytes_per_token("float32", tp=3) == 2 * 30 * 1 * 64 * 4
    llama = read_spec(CONFIGS / "Llama-3.1-70B-Instruct.json")
    assert llama.kv_bytes_per_token(tp=8) == 2 * 80 * 1 * 128 * 2
    assert llama.kv_bytes_per_token(tp=16) == 2 * 80 * 1 * 128 * 2  # replicated, not halved


def test_divisibility_rules() -> None:
    by = layouts(DEMO, per_node=4, dtype="float32", kv_cache_gb=1.0, max_model_len=2048)
    assert by[(3, 1)].fits
    assert not by[(2, 1)].fits and by[(2, 1)].reason == "TP=2 does not divide 9 attention heads"
    llama = layouts(CONFIGS / "Llama-3.1-70B-Instruct.json", gpu="H100", per_node=16)
    assert llama[(16, 1)].fits  # 8 KV heads replicated across 16 ranks
    assert llama[(3, 1)].reason.startswith("TP=3 does not divide 64 attention heads")


def test_training_example_doctest() -> None:
    assert doctest.testmod(worker.layout).failed == 0


def test_ranking_by_goal() -> None:
    args = [str(CONFIGS / "Llama-3.1-8B-Instruct.json"), "--gpu", "L4", "--gpus-per-node", "4",
            "--nodes", "2", "--json"]
    latency = json.loads(run_plan(*args, "--goal", "latency").stdout)["layouts"][0]
    fewest = json.loads(run_plan(*args, "--goal", "fewest-gpus").stdout)["layouts"][0]
    assert latency["fits"] and fewest["fits"]
    assert latency["tp"] == 4  # the widest TP group reads the weights fastest
    assert fewest["tp"] * fewest["pp"] == 1  # 16 GB of weights fit one 24 GB L4


def test_json_has_every_layout_with_its_fields() -> None:
    done = run_plan(str(QWEN), "--gpu", "A100-80GB", "--gpus-per-node", "8", "--nodes", "2",
                    "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert {"weights_bytes", "kv_bytes_per_token", "layouts"} <= set(out)
    fields = {"tp", "pp", "dp", "fits", "reason", "gpu_mem_bytes", "kv_tokens", "max_seqs",
              "decode_tok_s_single"}
    assert all(fields <= set(x) for x in out["layouts"])
    # One entry per layout considered: TP 1..8 in a node, PP up to the TP groups of 2 nodes.
    assert len(out["layouts"]) == sum(2 * (8 // tp) for tp in range(1, 9))
    assert any(not x["fits"] for x in out["layouts"])


def test_helm_values_validate_against_the_chart_schema() -> None:
    done = run_plan(str(QWEN), "--gpu", "A100-80GB", "--gpus-per-node", "4", "--nodes", "2",
                    "--goal", "fewest-gpus", "--helm-values")
    assert done.returncode == 0, done.stderr
    values = yaml.safe_load(done.stdout)
    (pool,) = values["models"]
    assert pool["tensorParallelSize"] * pool["pipelineParallelSize"] == 2
    schema = json.loads((REPO / "deploy/helm/llmserve/values.schema.json").read_text())
    jsonschema.validate(values, schema)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nowhere/config.json", "--gpu", "L4"], "worker plan: error: cannot read"),
        ([str(QWEN)], "give --gpu, or --gpu-mem-gb with --gpu-bw-gbs"),
        ([str(QWEN), "--gpu", "B300"], "invalid choice: 'B300'"),
        ([str(QWEN), "--gpu", "L4", "--nodes", "0"], "--nodes must be at least 1"),
        ([str(QWEN), "--gpu", "L4", "--dtype", "fp5"], "unknown dtype 'fp5'"),
        ([str(QWEN), "--gpu", "L4", "--gpus-per-node", "2", "--helm-values"], "no layout fits"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    done = run_plan(*args)
    assert done.returncode == 2
    assert message in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
