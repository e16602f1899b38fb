"""`llmserve-worker plan` (`python -m worker plan`): which TP x PP x DP layouts fit a model on a cluster, and how fast.

    python -m worker plan MODEL_DIR_OR_CONFIG --gpu A100-80GB --gpus-per-node 8 --nodes 2 \\
        [--dtype bfloat16] [--max-model-len N] [--gpu-memory-utilization 0.9] \\
        [--tp N] [--pp N] [--goal latency|throughput|fewest-gpus] [--json | --helm-values]

A layout fits when vLLM can shard the model that way, the weights and a sequence's KV cache fit
each GPU, and the chart can place it (worker/rules.py, the rules the worker and the chart
apply): tensor parallel inside a node, pipeline stages in one pod when a node holds them,
otherwise split evenly over a group of nodes; data-parallel replicas take the rest.

For every layout considered, feasible or not: memory per GPU, KV-cache tokens, concurrent
sequences at `--max-model-len`, and a decode roofline. One stream: every step reads the weights
(of a mixture of experts, only the experts its token is routed to); TP reads them from its GPUs
at once, PP one stage after the other. Saturated: all sequences that fit, the lower of the
bandwidth bound (weights once per step, per pipeline micro-batch, plus each sequence's KV
cache) and the compute bound (2 FLOP per active parameter plus attention, at COMPUTE_EFFICIENCY
of the GPU's dense bf16 peak); the table says which binds. Tensor parallel is not free: every
layer ends its attention and its MLP with an all-reduce of the batch's activations (hidden x
sequences x dtype) over the TP group, on the step's critical path, so each step also pays
2 x layers all-reduces (a ring: 2(TP-1) steps of the link's latency, and 2(TP-1)/TP of the
message over its bandwidth); the `comm` column is their share of a single-stream step
(docs/planner.md: the method, its sources, where TP stops paying).
Rooflines are upper bounds: measured
decode falls short of them (the README's Qwen2.5-72B example on 2 x A100-80GB gives the measured
figures beside the rooflines).

`--helm-values` prints the best layout as a pool of the chart's `models:` list, with its served
model name and a start-up probe sized from the weights each pod loads.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NoReturn

from model_store import cli_error
from worker.layout import (
    RULE_OF_THUMB,
    LayoutError,
    ModelSpec,
    dtype_bytes,
    read_spec,
    spec_sharding_problems,
)
from worker.rules import (
    CONVERTS,
    DTYPES,
    RUNNERS,
    model_and_revision,
    path_part_problem,
    place,
    pod_gpus,
    pool_name,
    pooling_tag,
    runner_problem,
)

PROG = "llmserve-worker plan"
GB = 1e9


# The GPU-to-GPU link of a tensor-parallel group, for the all-reduce each layer ends with:
# bandwidth per direction per GPU (the datasheet's bidirectional figure halved), GB/s, and the
# latency of one step of a ring over it, microseconds. NCCL's own cost model for a small ring
# all-reduce (src/graph/tuning.cc, the LL protocol): ALLREDUCE_BASE_US plus 2(n-1) steps of
# 0.47 us over NVLink, 1.0 us over PCIe. docs/planner.md compares it with measurements.
ALLREDUCE_BASE_US = 3.6
PCIE4 = ("PCIe Gen4 x16", 32.0, 1.0)
NVLINK3 = ("NVLink 3, 600 GB/s", 300.0, 0.47)
NVLINK4 = ("NVLink 4, 900 GB/s", 450.0, 0.47)


@dataclass(frozen=True)
class Gpu:
    name: str
    mem_gb: float  # usable memory, decimal GB, as nvidia-smi reports the total (MiB x 2^20)
    bw_gbs: float  # memory bandwidth, GB/s
    tflops: float  # dense bf16 tensor TFLOP/s (the datasheet's figure without sparsity)
    source: str
    link: str = PCIE4[0]  # what joins the GPUs of a TP group
    link_gbs: float = PCIE4[1]  # per direction, GB/s
    hop_us: float = PCIE4[2]  # one step of a ring all-reduce over that link

    def allreduce_s(self, tp: int, message_bytes: float) -> float:
        """Seconds for one ring all-reduce of `message_bytes` over `tp` GPUs: 2(tp-1) steps,
        each GPU sending and receiving 2(tp-1)/tp of the message over its link. Zero at TP=1."""
        if tp == 1:
            return 0.0
        steps = 2 * (tp - 1)
        return ((ALLREDUCE_BASE_US + steps * self.hop_us) * 1e-6
                + steps / tp * message_bytes / (self.link_gbs * GB))


def _mib(n: int) -> float:
    return n * 2**20 / 1e9


# Memory: the total nvidia-smi reports (the "80GB" A100 has 81,920 MiB = 85.9 GB, and vLLM's
# budget is gpu_memory_utilization x that); bandwidth and dense bf16 TFLOP/s: the vendor's
# datasheet (which quotes bf16 "with sparsity", twice the dense figure, for L4, H100 and H200).
GPUS = {g.name: g for g in (
    Gpu("A10G", _mib(23028), 600, 125,
        "NVIDIA A10 datasheet: 24 GB GDDR6, 600 GB/s, 125 bf16 TFLOP/s, PCIe Gen4", *PCIE4),
    Gpu("L4", _mib(23034), 300, 121,
        "NVIDIA L4 datasheet: 24 GB GDDR6, 300 GB/s, 121 bf16 TFLOP/s, PCIe Gen4", *PCIE4),
    Gpu("L40S", _mib(46068), 864, 362,
        "NVIDIA L40S datasheet: 48 GB GDDR6, 864 GB/s, 362 bf16 TFLOP/s, PCIe Gen4", *PCIE4),
    Gpu("A100-40GB", _mib(40960), 1555, 312,
        "NVIDIA A100 datasheet: 40 GB HBM2, 1,555 GB/s (SXM4), 312 bf16 TFLOP/s, NVLink 600 GB/s",
        *NVLINK3),
    Gpu("A100-80GB", _mib(81920), 2039, 312,
        "NVIDIA A100 datasheet: 80 GB HBM2e, 2,039 GB/s (SXM4), 312 bf16 TFLOP/s, "
        "NVLink 600 GB/s", *NVLINK3),
    Gpu("H100", _mib(81559), 3350, 989,
        "NVIDIA H100 datasheet: 80 GB HBM3, 3.35 TB/s (SXM5), 989 bf16 TFLOP/s, NVLink 900 GB/s",
        *NVLINK4),
    Gpu("H200", _mib(143771), 4800, 989,
        "NVIDIA H200 datasheet: 141 GB HBM3e, 4.8 TB/s (SXM), 989 bf16 TFLOP/s, NVLink 900 GB/s",
        *NVLINK4),
)}
# CUDA context, activations and graphs: kept off the KV cache on every GPU.
RUNTIME_OVERHEAD_GB = 2.0
# Large bf16 matrix products sustain about 80% of the datasheet's dense peak (about 790 of the
# H200's 989 TFLOP/s); the compute bound uses that, not the peak.
COMPUTE_EFFICIENCY = 0.8
# The start-up probe: weights a pod loads at --load-gbs, plus what an engine does besides
# loading (torch.compile, CUDA-graph capture, NCCL set-up; the compile cache is per pod).
STARTUP_OVERHEAD_S = 600
PROBE_PERIOD_S = 10
DEFAULT_MAX_MODEL_LEN = 8192
# --dtype values the planner sizes that vLLM applies as on-the-fly quantisation, not --dtype.
QUANTIZE_ARGS = {"fp8": ["--quantization", "fp8", "--kv-cache-dtype", "fp8"]}


@dataclass(frozen=True)
class Layout:
    tp: int
    pp: int
    dp: int
    gpus: int  # per replica: tp x pp
    nodes: int  # per replica: pods, one per node
    fits: bool
    reason: str
    gpu_mem_bytes: int  # weights + runtime overhead on the busiest GPU
    kv_tokens: int  # per replica
    max_seqs: int  # per replica, at max_model_len
    decode_tok_s_single: float
    decode_tok_s_aggregate: float  # all replicas at max_seqs: the lower bound of the two below
    bandwidth_tok_s: float  # all replicas, memory-bandwidth bound
    compute_tok_s: float  # all replicas, compute bound
    bound: str  # which one binds the aggregate: "bandwidth" or "compute"
    comm_share: float  # of a single-stream decode step, the TP all-reduces' share (0 at TP=1)


def plan(spec: ModelSpec, gpu: Gpu, gpus_per_node: int, nodes: int, *, dtype: str | None,
         max_model_len: int, utilization: float, kv_cache_gb: float | None = None) -> list[Layout]:
    """Every (TP, PP) with TP within a node and TP x PP within the cluster."""
    budget = gpu.mem_gb * GB * utilization
    bw, flops = gpu.bw_gbs * GB, gpu.tflops * 1e12 * COMPUTE_EFFICIENCY
    ctx = max_model_len / 2  # a sequence at half its length, on average
    out = []
    for tp in range(1, gpus_per_node + 1):
        for pp in range(1, gpus_per_node * nodes // tp + 1):
            problems = spec_sharding_problems(spec, tp, pp)
            placement = place(tp, pp, gpus_per_node, nodes)
            if isinstance(placement, str):
                problems.append(placement)
            per_gpu = spec.gpu_weight_bytes(tp, pp, dtype)
            used = per_gpu + RUNTIME_OVERHEAD_GB * GB
            kv_budget = kv_cache_gb * 2**30 if kv_cache_gb is not None else budget - used
            per_token = spec.kv_bytes_per_token(dtype, tp, pp)
            kv_tokens = max(0, int(kv_budget // per_token)) if kv_budget > 0 else 0
            max_seqs = kv_tokens // max_model_len
            # A fixed KV cache (vLLM-CPU's) takes its room beside the weights.
            fixed_kv = kv_budget if kv_cache_gb is not None else 0
            if not problems and used + fixed_kv > budget:
                kv_note = f", +{kv_cache_gb:g} GiB KV cache" if kv_cache_gb is not None else ""
                problems.append(
                    f"weights need {per_gpu / GB:.1f} GB per GPU (+{RUNTIME_OVERHEAD_GB:.0f} GB "
                    f"runtime{kv_note}) > {gpu.mem_gb:.1f} GB x {utilization:g}"
                )
            if not problems and max_seqs < 1:
                problems.append(
                    f"KV cache holds {kv_tokens} tokens per replica < max-model-len "
                    f"{max_model_len}"
                )
            dp = 0 if isinstance(placement, str) else placement.replicas
            pods = 0 if isinstance(placement, str) else placement.nnodes
            work = max(spec.bytes_read_per_step(1, dtype) / (tp * bw),
                       spec.flops_per_token(ctx) / (tp * flops))
            comm = allreduce_seconds(spec, gpu, tp, 1, dtype)
            single = 1 / (work + comm)
            by_bw, by_flops = (dp * r for r in saturated(spec, gpu, tp, pp, max_seqs, ctx, dtype))
            out.append(Layout(
                tp, pp, dp, tp * pp, pods, not problems, "; ".join(problems) or "fits",
                int(used), kv_tokens, max_seqs, round(single, 2),
                round(min(by_bw, by_flops), 1), round(by_bw, 1), round(by_flops, 1),
                ("compute" if by_flops < by_bw else "bandwidth") if max_seqs else "",
                round(comm / (work + comm), 3),
            ))
    return out


def activation_bytes(spec: ModelSpec, dtype: str | None) -> float:
    """Bytes per element of the activations the TP all-reduce sums: the checkpoint's dtype, or
    --dtype when it names a float type (fp8 and int quantise weights, not activations)."""
    if dtype in DTYPES:
        return dtype_bytes(dtype)
    return dtype_bytes(spec.config_dtype)


def allreduce_seconds(spec: ModelSpec, gpu: Gpu, tp: int, tokens: int,
                      dtype: str | None) -> float:
    """The TP all-reduces of one decode step of `tokens` sequences through the whole model:
    two per layer (after attention's output projection and after the MLP's down projection),
    each of hidden x tokens activations."""
    message = spec.hidden_size * tokens * activation_bytes(spec, dtype)
    return 2 * spec.num_hidden_layers * gpu.allreduce_s(tp, message)


def saturated(spec: ModelSpec, gpu: Gpu, tp: int, pp: int, seqs: int, ctx: float,
              dtype: str | None) -> tuple[float, float]:
    """Decode tok/s of one replica with `seqs` sequences at `ctx` tokens of KV each:
    (bandwidth bound, compute bound).

    Pipeline parallel runs min(PP, seqs) micro-batches of different sequences at once (vLLM
    schedules one batch per stage), each through every stage: the weights are read once per
    micro-batch, and the stages work in parallel only when each has one. Each TP rank reads
    its share of the KV cache (all of it where the KV heads are replicated). Each micro-batch's
    step also waits for its TP all-reduces (allreduce_seconds), whichever bound binds."""
    if seqs < 1:
        return 0.0, 0.0
    bw, flops = gpu.bw_gbs * GB, gpu.tflops * 1e12 * COMPUTE_EFFICIENCY
    batches = min(pp, seqs)
    per_batch = seqs / batches
    kv_read = per_batch * ctx * spec.kv_bytes_per_token(dtype, tp, 1) * tp
    comm = allreduce_seconds(spec, gpu, tp, math.ceil(per_batch), dtype)
    # Seconds for one micro-batch to pass every stage; `batches` of them are in flight.
    by_bw = (spec.bytes_read_per_step(math.ceil(per_batch), dtype) + kv_read) / (tp * bw) + comm
    by_flops = per_batch * spec.flops_per_token(ctx) / (tp * flops) + comm
    return seqs / by_bw, seqs / by_flops if by_flops > 0 else math.inf


def rank(layouts: list[Layout], goal: str) -> list[Layout]:
    def key(x: Layout) -> tuple[float, ...]:
        if goal == "latency":
            return (-x.decode_tok_s_single, x.gpus)
        if goal == "throughput":
            return (-x.decode_tok_s_aggregate, x.gpus)
        return (x.gpus, -x.decode_tok_s_single)  # fewest-gpus

    return sorted((x for x in layouts if x.fits), key=key) + [x for x in layouts if not x.fits]


def startup_seconds(spec: ModelSpec, layout: Layout, dtype: str | None, load_gbs: float) -> float:
    """Seconds before the engine answers /health: the weights its busiest pod loads (its
    pipeline stages, every TP shard) at `load_gbs`, plus STARTUP_OVERHEAD_S. A pod reads the
    checkpoint as it is on the volume, whatever `dtype` the engine then casts or quantises it
    to (fp8 is quantised on the fly, after a bf16 checkpoint was read): sized from the
    checkpoint's bytes."""
    del dtype
    stages = spec.stage_bytes(layout.pp)
    per_pod = layout.pp // layout.nodes
    heaviest = max(sum(stages[i:i + per_pod]) for i in range(0, layout.pp, per_pod))
    return heaviest / (load_gbs * GB) + STARTUP_OVERHEAD_S


def helm_pool(spec: ModelSpec, layout: Layout, model: str, revision: str, *,
              dtype: str | None, max_model_len: int, utilization: float,
              load_gbs: float, runner: str = "auto", convert: str = "auto") -> dict[str, Any]:
    """One entry of the chart's `models` list for this layout. A pooling pool (runner, convert:
    worker/rules.py) is named and served apart from the model's generating pool."""
    problem = runner_problem(runner, convert, runner_name="--runner", convert_name="--convert")
    if problem:
        raise LayoutError(problem)
    tag = pooling_tag(runner, convert)
    if dtype is not None and dtype not in DTYPES and dtype not in QUANTIZE_ARGS:
        raise LayoutError(
            f"--dtype {dtype} sizes a checkpoint quantised ahead of time, which vLLM reads from "
            "the checkpoint itself: plan that checkpoint's own config.json without --dtype"
        )
    for what, value in (("model", model), ("revision", revision)):
        problem = path_part_problem(what, value)
        if problem:
            raise LayoutError(problem)
    startup = startup_seconds(spec, layout, dtype, load_gbs)
    pool: dict[str, Any] = {
        "name": pool_name(model, layout.tp, layout.pp, pooling=tag),
        "model": model,
        "revision": revision,
        "servedModelName": f"{model}-{tag}" if tag else model,
        "source": {"s3": f"s3://models/{model}/{revision}"},
        "tensorParallelSize": layout.tp,
        "pipelineParallelSize": layout.pp,
        "replicas": layout.dp,
        "maxModelLen": max_model_len,
        "gpuMemoryUtilization": utilization,
        "startupProbe": {"periodSeconds": PROBE_PERIOD_S,
                         "failureThreshold": math.ceil(startup / PROBE_PERIOD_S)},
    }
    for key, value in (("runner", runner), ("convert", convert)):
        if value != "auto":
            pool[key] = value
    if dtype in DTYPES:
        pool["dtype"] = dtype
    elif dtype in QUANTIZE_ARGS:
        pool["extraArgs"] = QUANTIZE_ARGS[dtype]
    if layout.nodes > 1:
        pool["multiNode"] = {"nodes": layout.nodes}
    return pool


def helm_values(spec: ModelSpec, layout: Layout, args: argparse.Namespace) -> str:
    """The pool as YAML, after a comment that says what was planned and how the probe was sized."""
    import yaml

    model, revision = model_and_revision(args.model)
    pool = helm_pool(spec, layout, model, revision, dtype=args.dtype,
                     max_model_len=args.max_model_len, utilization=args.gpu_memory_utilization,
                     load_gbs=args.load_gbs, runner=args.runner, convert=args.convert)
    pods = (f"one pod of {layout.gpus} GPU(s)" if layout.nodes == 1 else
            f"{layout.nodes} pods (one per node) of {pod_gpus(layout.tp, layout.pp, layout.nodes)}"
            " GPU(s)")
    probe = pool["startupProbe"]
    head = [
        (f"# {PROG}: TP={layout.tp} x PP={layout.pp}, {layout.dp} replica(s), "
         f"each {pods}; {layout.gpu_mem_bytes / GB:.1f} GB per GPU before the KV cache."),
        (f"# Start-up probe: {probe['periodSeconds']} s x {probe['failureThreshold']} covers "
         f"loading the weights at {args.load_gbs:g} GB/s (--load-gbs) plus "
         f"{STARTUP_OVERHEAD_S} s of engine start-up."),
        ("# A pool of the chart's `models:` list: helm install ... -f THIS_FILE "
         "--set image.registry=REGISTRY"),
    ]
    body = yaml.safe_dump({"models": [pool]}, sort_keys=False)
    return "\n".join(head) + "\n" + body


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        cli_error.fail(self.prog, f"{message} (see {self.prog} --help)")


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be above 0 (got {text})")
    return value


def _dtype(text: str) -> str | None:
    """--dtype: "auto", the worker's and the chart's default, is the checkpoint's (None)."""
    return None if text == "auto" else text


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description=__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", type=Path, metavar="MODEL_DIR_OR_CONFIG",
                   help="a model directory (config.json, safetensors for real tensor sizes) or "
                        "a config.json; ROOT/<model>/<revision>/ names the model <model>")
    p.add_argument("--gpu", choices=sorted(GPUS), help="GPU type (memory, bandwidth, TFLOP/s); required unless --gpu-mem-gb is given")
    p.add_argument("--gpu-mem-gb", type=_positive, help="instead of --gpu, a GPU of these figures: its memory, GB")
    p.add_argument("--gpu-bw-gbs", type=_positive,
                   help="its memory bandwidth, GB/s (required with --gpu-mem-gb)")
    p.add_argument("--gpu-tflops", type=_positive,
                   help="its dense bf16 TFLOP/s (default: no compute bound)")
    p.add_argument("--gpu-link-gbs", type=_positive,
                   help=f"its GPU-to-GPU bandwidth per direction, GB/s, for tensor parallel's "
                        f"all-reduces (default {PCIE4[1]:g}: {PCIE4[0]})")
    p.add_argument("--gpu-hop-us", type=_positive,
                   help=f"the latency of one step of a ring all-reduce between its GPUs, "
                        f"microseconds (default {PCIE4[2]:g}: {PCIE4[0]})")
    p.add_argument("--gpus-per-node", type=int, default=8, help="GPUs in one node (default 8)")
    p.add_argument("--nodes", type=int, default=1, help="nodes (default 1)")
    p.add_argument("--dtype", default=None, type=_dtype,
                   help="weights and KV dtype (bfloat16, float16, float32, fp8, int8, int4); "
                        "default (auto, as for the worker and the chart): the checkpoint's")
    p.add_argument("--max-model-len", type=int, default=None,
                   help=f"context length each sequence may reach (default {DEFAULT_MAX_MODEL_LEN}, "
                        "or the model's own maximum when smaller)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                   help="share of GPU memory vLLM may use (default 0.9)")
    p.add_argument("--kv-cache-gib", type=_positive, default=None,
                   help="KV cache per GPU/rank, GiB, as vLLM-CPU's VLLM_CPU_KVCACHE_SPACE fixes it "
                        "(default: what the GPU memory leaves)")
    p.add_argument("--tp", type=int, default=None, help="only layouts with this tensor parallel (default: every size)")
    p.add_argument("--pp", type=int, default=None, help="only layouts with this pipeline parallel (default: every size)")
    p.add_argument("--goal", choices=("latency", "throughput", "fewest-gpus"), default="latency",
                   help="how to rank the layouts that fit (default latency)")
    p.add_argument("--load-gbs", type=_positive, default=0.25,
                   help="GB/s a pod reads its weights from the model volume, for --helm-values' "
                        "start-up probe (default 0.25: a network file share; local NVMe: 2+)")
    p.add_argument("--runner", choices=RUNNERS, default="auto",
                   help="vLLM's runner for --helm-values' pool: pooling serves embeddings, score, "
                        "rerank and classify in a pool of its own (default auto: the model's)")
    p.add_argument("--convert", choices=CONVERTS, default="auto",
                   help="vLLM's conversion for --helm-values' pool: embed or classify serve a "
                        "causal LM as a pooling model (default auto)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="machine-readable output (default: a table)")
    out.add_argument("--helm-values", action="store_true",
                     help="the best layout as a `models:` pool for the chart's values.yaml "
                          "(default: a table)")
    return p


def _table(spec: ModelSpec, layouts: list[Layout], gpu: Gpu, args: argparse.Namespace) -> str:
    params = spec.params()
    weights = spec.weights_bytes(args.dtype)
    dt = args.dtype or spec.config_dtype
    real = spec.files_bytes is not None and args.dtype in (None, spec.config_dtype)
    origin = "safetensors headers" if real else f"config shapes x {args.dtype or spec.weight_dtype}"
    thumb = params * dtype_bytes(args.dtype or spec.weight_dtype) * RULE_OF_THUMB / GB
    experts = ""
    if spec.moe is not None:
        experts = (f" ({spec.active_params() / 1e9:.1f} B active per token: {spec.moe.active} of "
                   f"{spec.moe.experts} experts)")
    kv = (f"{spec.num_hidden_layers} layers x ({spec.mla.kv_lora_rank} + "
          f"{spec.mla.qk_rope_head_dim}) latent" if spec.mla is not None else
          f"2 x {spec.num_hidden_layers} layers x {spec.num_key_value_heads} KV heads x "
          f"{spec.head_dim}")
    head = ("| TP | PP | DP | GPUs/replica | pods/replica | GB/GPU | KV tokens/replica | seqs@len "
            "| decode tok/s (1 stream) | comm | decode tok/s (all, saturated) | bound | |")
    lines = [
        (f"{spec.source}: {params / 1e9:.1f} B parameters{experts}; weights {weights / GB:.1f} GB "
         f"({origin}); rule of thumb params x bytes x {RULE_OF_THUMB}: {thumb:.1f} GB"),
        (f"KV cache: {spec.kv_bytes_per_token(args.dtype) / 1e3:.1f} KB per token ({kv} x "
         f"{dtype_bytes(dt):g} B); max-model-len {args.max_model_len:,} (model's maximum "
         f"{spec.max_len:,}: {spec.max_len_key})"),
        (f"GPU {gpu.name}: {gpu.mem_gb:.1f} GB, {gpu.bw_gbs:g} GB/s, {gpu.tflops:g} bf16 TFLOP/s "
         f"({gpu.source}); {args.gpus_per_node} per node x {args.nodes} nodes; goal {args.goal}"),
        (f"TP all-reduce: 2 per layer, each {ALLREDUCE_BASE_US:g} us + 2(TP-1) x {gpu.hop_us:g} us "
         f"+ 2(TP-1)/TP of the message at {gpu.link_gbs:g} GB/s ({gpu.link}); comm: its share "
         "of a one-stream step"),
        "",
        head,
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for x in layouts:
        lines.append(
            f"| {x.tp} | {x.pp} | {x.dp} | {x.gpus} | {x.nodes} | {x.gpu_mem_bytes / GB:.1f} | "
            f"{x.kv_tokens:,} | {x.max_seqs:,} | {x.decode_tok_s_single:.1f} | "
            f"{x.comm_share:.0%} | {x.decode_tok_s_aggregate:,.0f} | {x.bound if x.fits else ''} | {x.reason} |"
        )
    return "\n".join(lines)


def _gpu(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Gpu:
    custom = [f for f, v in (("--gpu-mem-gb", args.gpu_mem_gb), ("--gpu-bw-gbs", args.gpu_bw_gbs),
                             ("--gpu-tflops", args.gpu_tflops),
                             ("--gpu-link-gbs", args.gpu_link_gbs),
                             ("--gpu-hop-us", args.gpu_hop_us)) if v is not None]
    if args.gpu and custom:
        parser.error(f"--gpu {args.gpu} or {', '.join(custom)}, not both: the figures describe "
                     "a GPU that is not in --gpu's list")
    if args.gpu:
        return GPUS[args.gpu]
    if args.gpu_mem_gb and args.gpu_bw_gbs:
        link = ("given on the command line" if args.gpu_link_gbs or args.gpu_hop_us
                else PCIE4[0])
        return Gpu("custom", args.gpu_mem_gb, args.gpu_bw_gbs, args.gpu_tflops or math.inf,
                   "given on the command line", link, args.gpu_link_gbs or PCIE4[1],
                   args.gpu_hop_us or PCIE4[2])
    parser.error("give --gpu, or --gpu-mem-gb with --gpu-bw-gbs")


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    gpu = _gpu(args, parser)
    if args.helm_values and args.kv_cache_gib is not None:
        parser.error("--kv-cache-gib sizes vLLM-CPU's fixed KV cache, but --helm-values prints a "
                     "GPU pool, whose KV cache is what --gpu-memory-utilization leaves: plan it "
                     "without --kv-cache-gib")
    for flag, value in (("--gpus-per-node", args.gpus_per_node), ("--nodes", args.nodes),
                        ("--max-model-len", args.max_model_len), ("--tp", args.tp),
                        ("--pp", args.pp)):
        if value is not None and value < 1:
            parser.error(f"{flag} must be at least 1 (got {value})")
    if not 0 < args.gpu_memory_utilization <= 1:
        parser.error(f"--gpu-memory-utilization must be in (0, 1] (got {args.gpu_memory_utilization})")
    try:
        spec = read_spec(args.model)
        if args.max_model_len is None:
            args.max_model_len = min(DEFAULT_MAX_MODEL_LEN, spec.max_len)
        elif args.max_model_len > spec.max_len:
            raise LayoutError(
                f"--max-model-len {args.max_model_len} exceeds the model's maximum "
                f"{spec.max_len} ({spec.max_len_key} in {spec.source}), which vLLM refuses"
            )
        layouts = rank([x for x in plan(spec, gpu, args.gpus_per_node, args.nodes,
                                        dtype=args.dtype, max_model_len=args.max_model_len,
                                        utilization=args.gpu_memory_utilization,
                                        kv_cache_gb=args.kv_cache_gib)
                        if args.tp in (None, x.tp) and args.pp in (None, x.pp)], args.goal)
        if args.json:
            print(json.dumps({
                "model": str(spec.source), "params": spec.params(),
                "active_params": spec.active_params(),
                "weights_bytes": spec.weights_bytes(args.dtype),
                "rule_of_thumb_bytes": int(spec.params() * dtype_bytes(args.dtype or
                                                                       spec.config_dtype)
                                           * RULE_OF_THUMB),
                "kv_bytes_per_token": spec.kv_bytes_per_token(args.dtype),
                "max_model_len": args.max_model_len, "model_max_len": spec.max_len,
                "gpu": {**asdict(gpu), "tflops": gpu.tflops if math.isfinite(gpu.tflops)
                        else None},
                "compute_efficiency": COMPUTE_EFFICIENCY, "goal": args.goal,
                "layouts": [{k: v if not isinstance(v, float) or math.isfinite(v) else None
                             for k, v in asdict(x).items()} for x in layouts],
            }, indent=2))
        elif args.helm_values:
            if not layouts or not layouts[0].fits:
                raise LayoutError("no layout fits; see the table without --helm-values")
            print(helm_values(spec, layouts[0], args), end="")
        else:
            print(_table(spec, layouts, gpu, args))
    except LayoutError as exc:
        cli_error.error_line(PROG, str(exc))
        return cli_error.EXIT_USAGE
    except BrokenPipeError:  # `| head`: the reader has what it wanted
        sys.stdout = open("/dev/null", "w")  # noqa: SIM115 - stdout's own close would fail again
    return 0
