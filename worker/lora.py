"""A pool's LoRA adapters: what vLLM is told about them, and the checks before it loads them.

Each adapter is a complete directory on the model volume (pulled by `llmserve-model-store pull
--base-model`, which writes its base and rank into the completion marker). Before vLLM starts,
the launcher waits for every adapter's marker as for the model's, then checks here that each
adapter was made for this model and derives `--max-lora-rank` from the adapters' ranks: vLLM
takes only the ranks in `LORA_RANKS`, refuses to load an adapter above its limit, and sizes its
LoRA buffers by the limit, so the limit is the smallest allowed rank that holds them all.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from model_store.adapter import AdapterInfo, adapter_info, same_base
from model_store.errors import StoreError
from model_store.marker import read_marker
from worker.rules import LORA_RANKS, model_and_revision
from worker.settings import SettingsError, WorkerSettings

# Without adapters to size it, vLLM's own default.
DEFAULT_RANK = 16


@dataclass(frozen=True)
class Adapter:
    name: str
    path: Path
    info: AdapterInfo


def rank_limit(ranks: list[int]) -> int:
    """The smallest rank vLLM accepts that holds every one of `ranks`."""
    top = max(ranks, default=DEFAULT_RANK)
    for allowed in LORA_RANKS:
        if allowed >= top:
            return allowed
    raise SettingsError(
        f"a LoRA rank of {top} exceeds vLLM's largest --max-lora-rank ({LORA_RANKS[-1]})"
    )


def read_adapter(name: str, path: Path) -> Adapter:
    """The adapter at `path`, from its marker (a pull through the store records its base and
    rank), else from its adapter_config.json."""
    where = f"WORKER_LORA_ADAPTERS: {name}={path}"
    marker = read_marker(path)
    try:
        info = (marker.adapter if marker is not None else None) or adapter_info(path)
    except StoreError as exc:
        raise SettingsError(f"{where}: {exc}") from None
    if info is None:
        raise SettingsError(f"{where} is not a LoRA adapter (no adapter_config.json)")
    return Adapter(name, path, info)


def check_adapters(settings: WorkerSettings) -> list[Adapter]:
    """Every declared adapter, checked against the model; SettingsError (one line per problem)
    when one was made for another base or its rank exceeds WORKER_MAX_LORA_RANK."""
    names = {settings.model_name, model_and_revision(settings.model_path)[0]}
    adapters = [read_adapter(n, p) for n, p in sorted(settings.lora_adapters.items())]
    problems = []
    for a in adapters:
        if not any(same_base(a.info.base_model, n) for n in names):
            problems.append(
                f"WORKER_LORA_ADAPTERS: {a.name}={a.path} is an adapter of "
                f"{a.info.base_model!r}, not of this model ({' or '.join(sorted(names))})"
            )
        if settings.max_lora_rank is not None and a.info.rank > settings.max_lora_rank:
            problems.append(
                f"WORKER_MAX_LORA_RANK={settings.max_lora_rank} is below the rank "
                f"{a.info.rank} of adapter {a.name} ({a.path})"
            )
    if problems:
        raise SettingsError("; ".join(problems))
    return adapters


def with_rank(settings: WorkerSettings, adapters: list[Adapter]) -> WorkerSettings:
    """`settings` with WORKER_MAX_LORA_RANK derived from the adapters when it was left unset."""
    if not settings.lora_enabled or settings.max_lora_rank is not None:
        return settings
    return settings.model_copy(
        update={"max_lora_rank": rank_limit([a.info.rank for a in adapters])}
    )
