"""A matrix of models and the planner's feasible layouts for them, shared by the fast-tier
property test (tests/worker/test_plan_chart.py) and the Helm render of the same
(tests/deploy/test_plan_renders.py)."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

from worker.layout import read_spec
from worker.plan import GPUS, Layout, build_parser, plan
from worker.preflight import preflight
from worker.rules import pod_gpus
from worker.settings import WorkerSettings, load_settings

CONFIGS = Path(__file__).parent / "configs"
COMMIT = "0a1b2c3d4e5f60718293a4b5c6d7e8f901234567"


MODELS = ("dense GQA", "dense GQA, small", "odd heads", "MoE, Mixtral",
          "MoE, Qwen3 in a revision directory", "MoE and latent attention, FP8",
          "revision directory", "long name", "digit first, dots and underscores",
          "multi-head, no KV-head key", "multimodal text_config")


def model_matrix(root: Path) -> dict[str, Path]:
    """Each case: a config.json or a model directory, named as users lay them out."""

    def directory(relative: str, config: str | dict[str, Any]) -> Path:
        target = root / relative
        target.mkdir(parents=True)
        if isinstance(config, str):
            shutil.copy(CONFIGS / config, target / "config.json")
        else:
            (target / "config.json").write_text(json.dumps(config))
        return target

    return {
        "dense GQA": CONFIGS / "Qwen2.5-72B-Instruct.json",
        "dense GQA, small": CONFIGS / "Llama-3.1-8B-Instruct.json",
        "odd heads": CONFIGS / "SmolLM2-135M-Instruct.json",
        "MoE, Mixtral": CONFIGS / "Mixtral-8x7B-v0.1.json",
        "MoE, Qwen3 in a revision directory": directory(f"Qwen3-30B-A3B/{COMMIT}",
                                                        "Qwen3-30B-A3B.json"),
        "MoE and latent attention, FP8": CONFIGS / "DeepSeek-V3.json",
        "revision directory": directory("Llama-3.1-8B-Instruct/main", "Llama-3.1-8B-Instruct.json"),
        # 60 characters: with -tpNppM the pool name is cut and hashed.
        "long name": directory("Meta-Llama-3.1-70B-Instruct-Extended-Context-Long-Name-v2.0",
                               "Llama-3.1-70B-Instruct.json"),
        "digit first, dots and underscores": directory("01_ai.Yi-1.5-9B",
                                                       "Llama-3.1-8B-Instruct.json"),
        "multi-head, no KV-head key": directory("gpt-style/main", {
            "num_attention_heads": 16, "hidden_size": 2048, "num_hidden_layers": 24,
            "intermediate_size": 8192, "vocab_size": 50304, "max_position_embeddings": 2048}),
        "multimodal text_config": directory("vl-model", {"text_config": {
            "num_attention_heads": 28, "num_key_value_heads": 4, "hidden_size": 3584,
            "num_hidden_layers": 28, "intermediate_size": 18944, "vocab_size": 152064,
            "max_position_embeddings": 32768}}),
    }


def feasible(path: Path, gpu: str, per_node: int, nodes: int, dtype: str | None,
             max_len: int, runner: str = "auto",
             convert: str = "auto") -> tuple[list[Layout], argparse.Namespace]:
    """The planner's fitting layouts, and the parsed arguments --helm-values would see."""
    args = build_parser().parse_args([str(path), "--gpu", gpu, "--gpus-per-node", str(per_node),
                                      "--nodes", str(nodes), "--runner", runner,
                                      "--convert", convert]
                                     + (["--dtype", dtype] if dtype else []))
    spec = read_spec(path)
    args.max_model_len = min(max_len, spec.max_len)
    layouts = plan(spec, GPUS[gpu], per_node, nodes, dtype=dtype,
                   max_model_len=args.max_model_len, utilization=args.gpu_memory_utilization)
    return [x for x in layouts if x.fits], args


def worker_preflight(path: Path, settings: WorkerSettings, gpus: int) -> None:
    """What the worker checks before it starts vLLM (worker/preflight.py), with `gpus` in the
    pod (as the device plugin says, CUDA_VISIBLE_DEVICES) and the model's config at `path`;
    raises SettingsError."""
    model = path.parent if path.name == "config.json" else path
    visible = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, range(gpus)))}
    preflight(settings.model_copy(update={"model_path": model}), visible)


def worker_accepts(path: Path, pool: dict[str, Any]) -> None:
    """The worker pre-flight of every pod of the pool's group, with the chart's GPU count."""
    nodes = pool.get("multiNode", {}).get("nodes", 1)
    tp, pp = pool["tensorParallelSize"], pool["pipelineParallelSize"]
    for rank in range(nodes):
        settings = load_settings(
            model_path=path, tensor_parallel_size=tp, pipeline_parallel_size=pp, nnodes=nodes,
            node_rank=rank, master_addr="leader" if nodes > 1 else None,
            max_model_len=pool["maxModelLen"],
            gpu_memory_utilization=pool["gpuMemoryUtilization"],
            runner=pool.get("runner", "auto"), convert=pool.get("convert", "auto"),
        )
        worker_preflight(path, settings, pod_gpus(tp, pp, nodes))

