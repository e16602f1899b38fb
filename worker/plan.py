"""`python -m worker plan`: which TP x PP x DP layouts fit a model on a cluster, and how fast.

    python -m worker plan MODEL_DIR_OR_CONFIG --gpu A100-80GB --gpus-per-node 8 --nodes 2 \\
        [--dtype bfloat16] [--max-model-len N] [--gpu-memory-utilization 0.9] \\
        [--goal latency|throughput|fewest-gpus] [--json | --helm-values]

Tensor parallel stays inside a node, pipeline stages take whole TP groups, data-parallel replicas
take the rest. For every layout considered, feasible or not: memory per GPU, KV-cache tokens,
concurrent sequences at `--max-model-len`, and a memory-bandwidth roofline for decode (every
decode step reads all the weights: TP reads them from its GPUs at once, PP one stage after the
other). Rooflines are upper bounds: measured decode falls short of them (the README's Qwen2.5-72B
example on 2 x A100-80GB gives the measured figures beside the rooflines).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NoReturn

from worker.layout import (
    RULE_OF_THUMB,
    LayoutError,
    ModelSpec,
    dtype_bytes,
    read_spec,
    sharding_problems,
)

GB = 1e9


@dataclass(frozen=True)
class Gpu:
    name: str
    mem_gb: float  # usable memory, decimal GB, as nvidia-smi reports the total (MiB x 2^20)
    bw_gbs: float  # memory bandwidth, GB/s
    source: str


def _mib(n: int) -> float:
    return n * 2**20 / 1e9


# Memory: the total nvidia-smi reports (the "80GB" A100 has 81,920 MiB = 85.9 GB, and vLLM's
# budget is gpu_memory_utilization x that); bandwidth: the vendor's datasheet.
GPUS = {g.name: g for g in (
    Gpu("A10G", _mib(23028), 600, "NVIDIA A10 datasheet: 24 GB GDDR6, 600 GB/s"),
    Gpu("L4", _mib(23034), 300, "NVIDIA L4 datasheet: 24 GB GDDR6, 300 GB/s"),
    Gpu("L40S", _mib(46068), 864, "NVIDIA L40S datasheet: 48 GB GDDR6, 864 GB/s"),
    Gpu("A100-40GB", _mib(40960), 1555, "NVIDIA A100 datasheet: 40 GB HBM2, 1,555 GB/s (SXM4)"),
    Gpu("A100-80GB", _mib(81920), 2039, "NVIDIA A100 datasheet: 80 GB HBM2e, 2,039 GB/s (SXM4)"),
    Gpu("H100", _mib(81559), 3350, "NVIDIA H100 datasheet: 80 GB HBM3, 3.35 TB/s (SXM5)"),
    Gpu("H200", _mib(143771), 4800, "NVIDIA H200 datasheet: 141 GB HBM3e, 4.8 TB/s (SXM)"),
)}
# CUDA context, activations and graphs: kept off the KV cache on every GPU.
RUNTIME_OVERHEAD_GB = 2.0


@dataclass(frozen=True)
class Layout:
    tp: int
    pp: int
    dp: int
    gpus: int  # per replica: tp x pp
    nodes: int  # per replica
    fits: bool
    reason: str
    gpu_mem_bytes: int  # weights + runtime overhead per GPU
    kv_tokens: int  # per replica
    max_seqs: int  # per replica, at max_model_len
    decode_tok_s_single: float
    decode_tok_s_aggregate: float  # all replicas at max_seqs, roofline


def plan(spec: ModelSpec, gpu: Gpu, gpus_per_node: int, nodes: int, *, dtype: str | None,
         max_model_len: int, utilization: float, kv_cache_gb: float | None = None) -> list[Layout]:
    """Every (TP, PP) with TP within a node; DP with the rest."""
    weights = spec.weights_bytes(dtype)
    budget = gpu.mem_gb * GB * utilization
    out = []
    for tp in range(1, gpus_per_node + 1):
        groups = nodes * (gpus_per_node // tp)  # TP groups the cluster holds
        for pp in range(1, groups + 1):
            problems = sharding_problems(spec.num_attention_heads, spec.num_key_value_heads,
                                         spec.num_hidden_layers, tp, pp)
            per_gpu = weights / (tp * pp)
            used = per_gpu + RUNTIME_OVERHEAD_GB * GB
            kv_budget = kv_cache_gb * 2**30 if kv_cache_gb is not None else budget - used
            per_token = spec.kv_bytes_per_token(dtype, tp, pp)
            kv_tokens = max(0, int(kv_budget // per_token)) if kv_budget > 0 else 0
            max_seqs = kv_tokens // max_model_len
            if not problems and kv_cache_gb is None and used > budget:
                problems.append(
                    f"weights need {per_gpu / GB:.1f} GB per GPU (+{RUNTIME_OVERHEAD_GB:.0f} GB "
                    f"runtime) > {gpu.mem_gb:.1f} GB x {utilization:g}"
                )
            if not problems and max_seqs < 1:
                problems.append(
                    f"KV cache holds {kv_tokens} tokens per replica < max-model-len "
                    f"{max_model_len}"
                )
            dp = groups // pp
            bw = gpu.bw_gbs * GB
            single = tp * bw / weights
            ctx = max_model_len / 2  # a sequence at half its length, on average
            aggregate = dp * max_seqs * tp * pp * bw / (weights + max_seqs * ctx *
                                                         spec.kv_bytes_per_token(dtype))
            out.append(Layout(tp, pp, dp, tp * pp, math.ceil(tp * pp / gpus_per_node),
                              not problems, "; ".join(problems) or "fits", int(used), kv_tokens,
                              max_seqs, round(single, 2), round(aggregate, 1)))
    return out


def rank(layouts: list[Layout], goal: str) -> list[Layout]:
    def key(x: Layout) -> tuple[float, ...]:
        if goal == "latency":
            return (-x.decode_tok_s_single, x.gpus)
        if goal == "throughput":
            return (-x.decode_tok_s_aggregate, x.gpus)
        return (x.gpus, -x.decode_tok_s_single)  # fewest-gpus

    return sorted((x for x in layouts if x.fits), key=key) + [x for x in layouts if not x.fits]


def helm_pool(spec: ModelSpec, best: Layout, model: str, args: argparse.Namespace) -> dict[str, Any]:
    """One entry of the chart's `models` list for this layout."""
    if best.pp > 1 and best.nodes < 2:
        raise LayoutError(
            f"TP={best.tp} x PP={best.pp} fits in one node, but the chart runs pipeline stages "
            "across nodes; choose a layout with PP=1, or plan for more nodes"
        )
    name = "".join(c if c.isalnum() else "-" for c in model.lower()).strip("-")[:20]
    pool: dict[str, Any] = {
        "name": f"{name}-tp{best.tp}" + (f"pp{best.pp}" if best.pp > 1 else ""),
        "model": model,
        "revision": "main",
        "source": {"s3": f"s3://models/{model}/main"},
        "tensorParallelSize": best.tp,
        "pipelineParallelSize": best.pp,
        "replicas": best.dp,
        "maxModelLen": args.max_model_len,
        "gpuMemoryUtilization": args.gpu_memory_utilization,
    }
    if args.dtype:
        pool["dtype"] = args.dtype
    if best.pp > 1:
        pool["multiNode"] = {"nodes": best.nodes}
    return pool


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"worker plan: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m worker plan", description=__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", type=Path, metavar="MODEL_DIR_OR_CONFIG",
                   help="a model directory (config.json, safetensors for real tensor sizes) or "
                        "a config.json")
    p.add_argument("--gpu", choices=sorted(GPUS), help="GPU type (memory and bandwidth)")
    p.add_argument("--gpu-mem-gb", type=float, help="GPU memory, GB (instead of --gpu)")
    p.add_argument("--gpu-bw-gbs", type=float, help="GPU memory bandwidth, GB/s (with --gpu-mem-gb)")
    p.add_argument("--gpus-per-node", type=int, default=8, help="GPUs in one node (default 8)")
    p.add_argument("--nodes", type=int, default=1, help="nodes (default 1)")
    p.add_argument("--dtype", default=None,
                   help="weights and KV dtype (bfloat16, float16, float32, fp8, int8, int4); "
                        "default: the checkpoint's")
    p.add_argument("--max-model-len", type=int, default=8192,
                   help="context length each sequence may reach (default 8192)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                   help="share of GPU memory vLLM may use (default 0.9)")
    p.add_argument("--kv-cache-gib", type=float, default=None,
                   help="KV cache per GPU/rank, GiB, as vLLM-CPU's VLLM_CPU_KVCACHE_SPACE fixes it "
                        "(default: what the GPU memory leaves)")
    p.add_argument("--goal", choices=("latency", "throughput", "fewest-gpus"), default="latency",
                   help="how to rank the layouts that fit (default latency)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="machine-readable output")
    out.add_argument("--helm-values", action="store_true",
                     help="the best layout as a `models:` pool for the chart's values.yaml")
    return p


def _table(spec: ModelSpec, layouts: list[Layout], gpu: Gpu, args: argparse.Namespace) -> str:
    params = spec.params()
    weights = spec.weights_bytes(args.dtype)
    dt = args.dtype or spec.config_dtype
    real = spec.files_bytes is not None and args.dtype in (None, spec.config_dtype)
    origin = "safetensors headers" if real else f"config shapes x {dt}"
    thumb = params * dtype_bytes(dt) * RULE_OF_THUMB / GB
    head = ("| TP | PP | DP | GPUs/replica | GB/GPU | KV tokens/replica | seqs@len "
            "| decode tok/s (1 stream) | decode tok/s (all, saturated) | |")
    lines = [
        (f"{spec.source}: {params / 1e9:.1f} B parameters; weights {weights / GB:.1f} GB "
         f"({origin}); rule of thumb params x bytes x {RULE_OF_THUMB}: {thumb:.1f} GB"),
        (f"KV cache: {spec.kv_bytes_per_token(args.dtype) / 1e3:.1f} KB per token (2 x "
         f"{spec.num_hidden_layers} layers x {spec.num_key_value_heads} KV heads x "
         f"{spec.head_dim} x {dtype_bytes(dt):g} B)"),
        (f"GPU {gpu.name}: {gpu.mem_gb:.1f} GB, {gpu.bw_gbs:g} GB/s ({gpu.source}); "
         f"{args.gpus_per_node} per node x {args.nodes} nodes; goal {args.goal}"),
        "",
        head,
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for x in layouts:
        lines.append(
            f"| {x.tp} | {x.pp} | {x.dp} | {x.gpus} | {x.gpu_mem_bytes / GB:.1f} | "
            f"{x.kv_tokens:,} | {x.max_seqs:,} | {x.decode_tok_s_single:.1f} | "
            f"{x.decode_tok_s_aggregate:,.0f} | {x.reason} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.gpu:
        gpu = GPUS[args.gpu]
    elif args.gpu_mem_gb and args.gpu_bw_gbs:
        gpu = Gpu("custom", args.gpu_mem_gb, args.gpu_bw_gbs, "given on the command line")
    else:
        parser.error("give --gpu, or --gpu-mem-gb with --gpu-bw-gbs")
    for flag, value in (("--gpus-per-node", args.gpus_per_node), ("--nodes", args.nodes),
                        ("--max-model-len", args.max_model_len)):
        if value < 1:
            parser.error(f"{flag} must be at least 1 (got {value})")
    if not 0 < args.gpu_memory_utilization <= 1:
        parser.error(f"--gpu-memory-utilization must be in (0, 1] (got {args.gpu_memory_utilization})")
    try:
        spec = read_spec(args.model)
        layouts = rank(plan(spec, gpu, args.gpus_per_node, args.nodes, dtype=args.dtype,
                            max_model_len=args.max_model_len,
                            utilization=args.gpu_memory_utilization,
                            kv_cache_gb=args.kv_cache_gib), args.goal)
        if args.json:
            print(json.dumps({
                "model": str(spec.source), "params": spec.params(),
                "weights_bytes": spec.weights_bytes(args.dtype),
                "rule_of_thumb_bytes": int(spec.params() * dtype_bytes(args.dtype or
                                                                       spec.config_dtype)
                                           * RULE_OF_THUMB),
                "kv_bytes_per_token": spec.kv_bytes_per_token(args.dtype),
                "gpu": asdict(gpu), "goal": args.goal,
                "layouts": [asdict(x) for x in layouts],
            }, indent=2))
        elif args.helm_values:
            if not layouts or not layouts[0].fits:
                raise LayoutError("no layout fits; see the table without --helm-values")
            model = spec.source.parent.name if spec.source.name == "config.json" else \
                spec.source.stem
            import yaml

            print(yaml.safe_dump({"models": [helm_pool(spec, layouts[0], model, args)]},
                                 sort_keys=False), end="")
        else:
            print(_table(spec, layouts, gpu, args))
    except LayoutError as exc:
        print(f"worker plan: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `| head`: the reader has what it wanted
        sys.stdout = open("/dev/null", "w")  # noqa: SIM115 - stdout's own close would fail again
    return 0
