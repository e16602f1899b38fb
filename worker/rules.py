"""The layout rules every part applies: the planner, the worker's pre-flight and the chart.

One module, so that a layout the planner calls "fits" is one the worker starts and the chart
renders. The chart's values.schema.json is generated from these constants and functions
(deploy/helm/values_schema.py imports this module), so this file uses the standard library only.

The rules:
- Tensor parallel stays inside a node (it needs the intra-node interconnect); pipeline stages
  are what crosses nodes. A replica of TP x PP GPUs runs as a group of `nnodes` pods, one per
  node, each running whole pipeline stages: `nnodes` divides PP, and each pod holds
  TP x PP / nnodes GPUs. One pod (nnodes = 1) runs all its stages inside one node (vLLM's mp
  executor, no Ray); more run as a LeaderWorkerSet group of at most MAX_GROUP_NODES pods.
- Pool names are DNS labels of at most POOL_NAME_MAX characters. The chart derives every
  resource name from them (hashing long ones), so the only limit left is the label value
  (`llmserve.io/pool`): 63.
- A pool runs one of vLLM's runners: `generate` (chat, completions, responses) or `pooling`
  (embeddings, score, rerank, classify, /pooling). `convert` adapts a model to pooling (a causal
  LM served as an embedding model: `convert: embed`), so it needs the pooling runner; vLLM's
  `auto` picks both from the architecture. A pooling pool is a pool of its own: its name says so
  and it serves its model under a name of its own.
- A model directory in the chart's layout, ROOT/<model>/<revision>/, names the model by its
  parent directory when its own name is a revision (main, or a commit hash).
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

POOL_NAME_MAX = 63
# The engines' API port (the worker's WORKER_PORT): where the gateway finds them by default, and
# the chart's workerDefaults.port when unset.
ENGINE_PORT = 8000
POOL_NAME_PATTERN = rf"^[a-z]([-a-z0-9]{{0,{POOL_NAME_MAX - 2}}}[a-z0-9])?$"
# A model or revision: one directory of the model volume (ROOT/<model>/<revision>/).
PATH_PART_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
# Pods in one LeaderWorkerSet group: 16 nodes of 8 GPUs hold a 128-GPU replica.
MAX_GROUP_NODES = 16
# vLLM's --dtype values the worker passes on; "auto" takes the checkpoint's.
DTYPES = ("auto", "float32", "float", "bfloat16", "float16", "half")
# Half precision gave wrong greedy answers on the CPU with the demo model, so the CPU takes these.
CPU_DTYPES = ("auto", "float32", "float")
# vLLM's accepted --max-lora-rank values (vllm.config.lora.MaxLoRARanks): the worker's setting
# and the chart's lora.maxLoraRank take these.
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# vLLM's --runner values a pool takes ("draft" is a speculative decoder's, never a pool's).
RUNNERS = ("auto", "generate", "pooling")
# vLLM's --convert values: how a model is adapted to pooling; "auto" decides from the architecture
# (a *ForCausalLM under --runner pooling becomes an embedding model).
CONVERTS = ("auto", "none", "embed", "classify")
# The conversions that make a pooling model of a generative one.
POOLING_CONVERTS = ("embed", "classify")
# Directory names that are revisions, not models: a branch or a commit hash.
_REVISION = re.compile(r"^(main|[0-9a-f]{7,40})$")


def pp_multiple(nnodes: int) -> int:
    """PP must be a multiple of this for a group of `nnodes` pods: each node runs whole stages."""
    return nnodes


def group_problem(tp: int, pp: int, nnodes: int, *, pp_name: str = "PP",
                  nodes_name: str = "nodes") -> str | None:
    """Why TP x PP cannot run as a group of `nnodes` pods, or None. Names as the caller's user
    knows them (WORKER_PIPELINE_PARALLEL_SIZE, pipelineParallelSize ...)."""
    del tp  # TP never decides: a pod holds whole TP groups whatever nnodes is
    if pp % pp_multiple(nnodes):
        return (f"{pp_name}={pp} must be a multiple of {nodes_name}={nnodes} (each node runs "
                "whole pipeline stages; tensor parallel never crosses nodes)")
    return None


def pod_gpus(tp: int, pp: int, nnodes: int) -> int:
    """GPUs (engine ranks) in each pod of a group."""
    return tp * pp // nnodes


@dataclass(frozen=True)
class Placement:
    """How one replica of TP x PP sits on a cluster, and how many replicas the cluster holds."""

    nnodes: int  # pods per replica, one per node
    gpus_per_pod: int
    replicas: int


def place(tp: int, pp: int, gpus_per_node: int, nodes: int) -> Placement | str:
    """The fewest pods per replica that obey the rules (PP inside a node where it fits), with
    the data-parallel replicas the cluster holds; or why no placement exists."""
    if tp > gpus_per_node:
        return (f"TP={tp} exceeds the {gpus_per_node} GPUs of a node (tensor parallel stays "
                "inside a node)")
    for n in range(1, min(pp, nodes, MAX_GROUP_NODES) + 1):
        if group_problem(tp, pp, n) is None and pod_gpus(tp, pp, n) <= gpus_per_node:
            per_pod = pod_gpus(tp, pp, n)
            # Each node holds gpus_per_node // per_pod pods; a group's pods sit on distinct
            # nodes, which round-robin filling always allows when n <= nodes.
            return Placement(n, per_pod, nodes * (gpus_per_node // per_pod) // n)
    # Not placed: one pod is too big for a node (n = PP always fits, as TP fits), so some
    # group size would do, but it is larger than the cluster or the chart's groups.
    need = next(n for n in range(2, pp + 1)
                if pp % n == 0 and pod_gpus(tp, pp, n) <= gpus_per_node)
    limit = (f"the chart's groups hold at most {MAX_GROUP_NODES}" if need > MAX_GROUP_NODES
             else f"the cluster has {nodes}")
    return (f"TP={tp} x PP={pp} needs {tp * pp} GPUs in one pod (a node has {gpus_per_node}) "
            f"or a group of {need} nodes (nodes divide PP, each running whole stages); {limit}")


def runner_problem(runner: str, convert: str, *, runner_name: str = "runner",
                   convert_name: str = "convert") -> str | None:
    """Why this runner and conversion contradict each other, or None. Names as the caller's user
    knows them (WORKER_RUNNER, runner ...)."""
    if runner == "generate" and convert in POOLING_CONVERTS:
        return (f"{convert_name}={convert} makes a pooling model; it needs {runner_name}=pooling "
                f"(or auto), not {runner_name}=generate")
    return None


def is_pooling(runner: str, convert: str) -> bool:
    """A pool of pooling endpoints (embeddings, score, rerank, classify), as far as its settings
    say: the pooling runner, or a pooling conversion (which vLLM's auto runner follows)."""
    return runner == "pooling" or (runner == "auto" and convert in POOLING_CONVERTS)


def pooling_tag(runner: str, convert: str) -> str | None:
    """What a pooling pool pools, for its name and served model name (`embed`, `classify`, or
    `pooling` when vLLM decides); None for a generating pool."""
    if not is_pooling(runner, convert):
        return None
    return convert if convert in POOLING_CONVERTS else "pooling"


def runner_args(runner: str, convert: str) -> list[str]:
    """vLLM's flags for a runner and conversion: nothing for vLLM's own defaults (auto)."""
    out = [] if runner == "auto" else ["--runner", runner]
    return out + ([] if convert == "auto" else ["--convert", convert])


def slug(text: str) -> str:
    """Lower-case letters, digits and single hyphens."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def pool_name(model: str, tp: int, pp: int, *, pooling: str | None = None) -> str:
    """The pool name for a model and layout: `qwen2-5-72b-instruct-tp1pp2`; a pooling pool says
    what it pools (`pooling`: the conversion, or "pooling"): `smollm2-135m-instruct-embed-tp1`.
    A name over POOL_NAME_MAX keeps its start and gets a hash of the whole, so two long names stay
    apart."""
    suffix = (f"-{pooling}" if pooling else "") + f"-tp{tp}" + (f"pp{pp}" if pp > 1 else "")
    base = slug(model) or "model"
    if not base[0].isalpha():
        base = "m-" + base
    room = POOL_NAME_MAX - len(suffix)
    if len(base) > room:
        digest = hashlib.sha256(base.encode()).hexdigest()[:6]
        base = base[: room - 7].rstrip("-") + "-" + digest
    return base + suffix


def path_part_problem(what: str, value: str) -> str | None:
    """Why `value` cannot be a model or revision directory of the chart's volume, or None."""
    if re.match(PATH_PART_PATTERN, value):
        return None
    return (f"{what} {value!r} is not a directory name the chart takes: letters, digits, '.', "
            "'_' and '-', starting with a letter or digit, at most 63 characters")


def model_and_revision(path: Path) -> tuple[str, str]:
    """(model, revision) of a model directory or its config.json.

    A directory named like a revision (main, or a commit hash) is ROOT/<model>/<revision>/, the
    chart's and model_store's layout; any other directory is the model, at revision "main". A
    config file not named config.json names the model by its stem
    (tests/worker/configs/Qwen2.5-72B-Instruct.json)."""
    if path.suffix == ".json" and path.name != "config.json":
        return path.stem, "main"
    # Absolute and normalised ("." and ".." resolved), without following links.
    directory = Path(os.path.abspath(path.parent if path.name == "config.json" else path))
    if _REVISION.match(directory.name) and directory.parent.name:
        return directory.parent.name, directory.name
    return directory.name, "main"
