"""The gateway's block hashes are the engine's: checked against vLLM's own functions (imported
from the installed vllm package, in this test only; the gateway never imports vLLM)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest

from gateway.routing.kv_hash import BlockHasher, external


@pytest.fixture(scope="module")
def vllm_kv() -> Iterator[tuple[ModuleType, ModuleType]]:
    # Imported here, not at module level: only the xdist worker running these pays vLLM's import.
    kv = pytest.importorskip("vllm.v1.core.kv_cache_utils")
    hashing = pytest.importorskip("vllm.utils.hashing")
    yield kv, hashing


def engine_hashes(kv: ModuleType, fn: Any, tokens: list[int], block_size: int,
                  extra: tuple[Any, ...] | None) -> list[int]:
    """What the engine computes and publishes: chained hash_block_tokens, then the external
    int form of each (maybe_convert_block_hash with its default: ints)."""
    parent = None
    out = []
    for i in range(0, len(tokens) - block_size + 1, block_size):
        parent = kv.hash_block_tokens(fn, parent, tokens[i:i + block_size], extra)
        out.append(kv.maybe_convert_block_hash(parent))
    return out


@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor"])
@pytest.mark.parametrize("lora", [None, ("lora", "sql-adapter", "/models/sql-adapter")])
def test_block_hashes_equal_the_engines(vllm_kv: tuple[ModuleType, ModuleType], algo: str,
                                        lora: tuple[str, str, str] | None,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    kv, hashing = vllm_kv
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    fn = hashing.get_hash_fn_by_name(algo)
    kv.init_none_hash(fn)
    rng = random.Random(7)
    tokens = [rng.randrange(49152) for _ in range(128 * 5 + 77)]  # 5 full blocks and a tail
    extra = (lora,) if lora else None
    want = engine_hashes(kv, fn, tokens, 128, extra)
    got = BlockHasher(algo).hashes(tokens, 128, 100, extra)  # type: ignore[arg-type]
    assert len(want) == 5 and got == want
    assert BlockHasher(algo).hashes(tokens, 128, 2, extra) == want[:2]  # type: ignore[arg-type]
    # The LoRA key changes every hash: an adapter's blocks never match the base model's.
    if lora:
        assert set(got).isdisjoint(BlockHasher(algo).hashes(tokens, 128, 100))  # type: ignore[arg-type]


def test_an_engines_hash_seed_is_followed(vllm_kv: tuple[ModuleType, ModuleType],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    kv, hashing = vllm_kv
    monkeypatch.setenv("PYTHONHASHSEED", "1234")
    kv.init_none_hash(hashing.sha256)
    tokens = list(range(300))
    want = engine_hashes(kv, hashing.sha256, tokens, 16, None)
    assert BlockHasher("sha256", "1234").hashes(tokens, 16, 100) == want
    assert BlockHasher("sha256").hashes(tokens, 16, 100) != want
    monkeypatch.delenv("PYTHONHASHSEED")
    kv.init_none_hash(hashing.sha256)


def test_external_form_is_the_low_64_bits() -> None:
    digest = bytes(range(32))
    assert external(digest) == int.from_bytes(bytes(range(24, 32)), "big")
