"""LoRA adapters in the store: a PEFT directory (``adapter_config.json`` + safetensors) that names
the base model it was trained on.

An adapter is pushed, pulled and verified like a model (same manifest, lease, staging and
marker); what is added is its base. `push` reads it from ``adapter_config.json``
(``base_model_name_or_path``) or takes ``--base-model`` when the config has none, and writes it
into the manifest; `pull --base-model NAME` refuses an adapter whose manifest names another base
before a byte is fetched, and the completion marker carries the base on, so the worker checks it
again before vLLM loads the adapter.

Bases are compared by their last path segment: PEFT writes whatever the base was loaded from (a
hub id such as ``HuggingFaceTB/SmolLM2-135M-Instruct`` or a local directory), and the platform
names a model by its directory (``ROOT/<model>/<revision>/``), so ``org/Model`` and
``/models/Model`` are the same base and ``Model-v2`` is another one.

Standard library only: the worker (and the chart's init container) import it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from model_store.errors import StoreError, UsageError

ADAPTER_CONFIG = "adapter_config.json"
# An adapter's name where it is served: what clients send as `model`, and a metrics label value
# (the worker's WORKER_LORA_ADAPTERS and the gateway's admin API both take these).
ADAPTER_NAME = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
# vLLM serves LoRA adapters only (other PEFT methods: prefix tuning, IA3, ... are not LoRA).
LORA_TYPE = "LORA"


@dataclass(frozen=True)
class AdapterInfo:
    """What the store records about an adapter: its base model and its LoRA rank."""

    base_model: str
    rank: int

    def to_json(self) -> dict[str, Any]:
        return {"base_model": self.base_model, "rank": self.rank}

    @classmethod
    def from_json(cls, doc: Any, where: str) -> AdapterInfo:
        try:
            base, rank = str(doc["base_model"]), int(doc["rank"])
        except (KeyError, TypeError, ValueError):
            raise StoreError(f"{where}: malformed adapter entry {doc!r}") from None
        if not base or rank < 1:
            raise StoreError(f"{where}: malformed adapter entry {doc!r}")
        return cls(base, rank)


def base_key(name: str) -> str:
    """The part of a model reference that names the model: its last path segment."""
    return PurePosixPath(name.rstrip("/")).name or name


def same_base(a: str, b: str) -> bool:
    return base_key(a) == base_key(b)


def read_adapter_config(directory: Path) -> dict[str, Any] | None:
    """The directory's adapter_config.json, or None when it has none (a model, not an adapter)."""
    path = directory / ADAPTER_CONFIG
    try:
        raw = path.read_bytes()  # json.loads decodes it: bad UTF-8 is a ValueError below
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StoreError(f"cannot read {path}: {exc.strerror}") from None
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise UsageError(f"{path} is not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise UsageError(f"{path} is not a JSON object")
    return doc


def adapter_info(directory: Path, base_model: str | None = None) -> AdapterInfo | None:
    """What `directory` is as an adapter (None: not an adapter). `base_model` (the --base-model
    flag) names the base when the config does not; when both do, they must agree."""
    config = read_adapter_config(directory)
    where = directory / ADAPTER_CONFIG
    if config is None:
        if base_model is not None:
            raise UsageError(
                f"--base-model is for adapters, and {directory} has no {ADAPTER_CONFIG}"
            )
        return None
    peft_type = str(config.get("peft_type") or LORA_TYPE).upper()
    if peft_type != LORA_TYPE:
        raise UsageError(f"{where}: peft_type {peft_type!r} is not a LoRA adapter")
    rank = config.get("r")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise UsageError(f"{where}: the LoRA rank `r` must be a positive integer, not {rank!r}")
    named = config.get("base_model_name_or_path")
    named = named.strip() if isinstance(named, str) else ""
    if named and base_model is not None and not same_base(named, base_model):
        raise UsageError(
            f"{where} names base model {named!r}, not {base_model!r}: refusing an adapter "
            "for the wrong base"
        )
    base = base_model or named
    if not base:
        raise UsageError(
            f"{where} names no base model (base_model_name_or_path); give --base-model"
        )
    return AdapterInfo(base, rank)


def check_base(what: str, adapter: AdapterInfo | None, expected: str | None) -> None:
    """Refuse (UsageError) when `expected` is given and `what` is not an adapter of it."""
    if expected is None:
        return
    if adapter is None:
        raise UsageError(f"{what} is a model, not an adapter (--base-model {expected})")
    if not same_base(adapter.base_model, expected):
        raise UsageError(
            f"{what} is an adapter of {adapter.base_model!r}, not of {expected!r}: refusing "
            "an adapter for the wrong base"
        )
